"""seqpack.io: atomic Parquet writer, memory-mapped reader, metadata checks, expect= staleness (B23)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from seqpack.sample import IGNORE_INDEX, Sample, shift_labels

from seqpack.accounting import SampleRecord
from seqpack.io import (
    COLUMNS,
    FORMAT_VERSION,
    PackedDatasetError,
    PackedMetadata,
    PackedWriter,
    StalePackedDatasetError,
    compute_fingerprint,
    describe_input,
    load_packed,
    write_packed,
)
from seqpack.packed import build_packed_sequence

PAD = 0


def _sample(sid: str, n: int, start: int, train_from: int = 1) -> Sample:
    ids = np.arange(start, start + n, dtype=np.int32)
    trainable = np.zeros(n, bool)
    trainable[train_from:] = True
    return Sample(ids, shift_labels(ids, trainable), sample_id=sid, source="hand", index=start)


def _rows(groups, m=1, cap=16):
    """Build rows from lists of (sid, length) with a trivial hand-made plan (one group = one pack)."""
    rows, tok = [], 1
    for g in groups:
        ss = []
        for sid, n in g:
            ss.append(_sample(sid, n, tok))
            tok += n
        rows.append(build_packed_sequence(ss, pad_to_multiple_of=m, pad_token_id=PAD, seq_length=cap))
    return rows


GROUPS = [[("a", 5), ("b", 3)], [("c", 7)], [("d", 2), ("e", 2), ("f", 9)], [("g", 16)], [("h", 1)]]


def _meta(**kw) -> PackedMetadata:
    d = dict(seq_length=16, pad_to_multiple_of=1, context_parallel_size=1, effective_pad_multiple=1,
             algorithm="first_fit_decreasing", tokenizer_hash="abc", pad_token_id=PAD)
    d.update(kw)
    return PackedMetadata(**d)


@pytest.fixture()
def written(tmp_path):
    rows = _rows(GROUPS)
    out = tmp_path / "ds"
    meta = write_packed(rows, out, _meta(), rows_per_shard=2,
                        report_entries=[SampleRecord("z", "f.json", 3, "dropped", "overlength", "too long", 40, 0)])
    return out, rows, meta


def test_roundtrip_every_column_and_derived_field(written):
    out, rows, meta = written
    assert meta.num_packs == 5 and [s.num_rows for s in meta.shards] == [2, 2, 1]
    ds = load_packed(out)
    assert len(ds) == 5 and ds.metadata.seq_length == 16
    for i, row in enumerate(rows):
        got = ds[i]
        for f in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded",
                  "seq_lens", "padding_mask", "seq_idx"):
            np.testing.assert_array_equal(getattr(got, f), getattr(row, f), err_msg=f)
        assert got.sample_ids == row.sample_ids
        assert got.max_seqlen == row.max_seqlen
        got.validate(capacity=16)
    assert ds[-1].sample_ids == ["h"]
    assert ds[2].sample_ids == ["d", "e", "f"]
    np.testing.assert_array_equal(ds.column("num_tokens"), [8, 7, 13, 16, 1])
    np.testing.assert_array_equal(ds.segment_lengths(), [5, 3, 7, 2, 2, 9, 16, 1])
    assert [r["sample_id"] for r in ds.report()] == ["z"]
    assert ds.report()[0]["reason"] == "overlength"


def test_stored_schema_is_int32_lists(written):
    out, _, meta = written
    schema = pq.read_schema(out / meta.shards[0].file)
    assert tuple(schema.names) == COLUMNS
    for name in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded"):
        assert str(schema.field(name).type) == "list<element: int32>"
    md = json.loads((out / "metadata.json").read_text())
    assert md["format_version"] == FORMAT_VERSION and md["capacity"] == 16 and md["num_packs"] == 5


def test_index_errors(written):
    ds = load_packed(written[0])
    with pytest.raises(IndexError, match="out of range"):
        ds[5]
    with pytest.raises(IndexError):
        ds[-6]
    with pytest.raises(TypeError):
        ds["0"]


def test_memory_map_and_in_memory_agree_and_cache_is_mapped(written):
    out = written[0]
    a, b = load_packed(out), load_packed(out, memory_map=False)
    for i in range(len(a)):
        np.testing.assert_array_equal(a[i].input_ids, b[i].input_ids)
    assert sorted(p.suffix for p in (out / ".cache").iterdir()) == [".arrow"] * 3
    # the rows are views of the mapped file, not copies
    assert not a.columns(0)["input_ids"].flags.owndata


def test_pickle_for_dataloader_workers(written, tmp_path):
    ds = load_packed(written[0], cache_dir=tmp_path / "cache")
    _ = ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert all(s is None for s in clone._shards)  # maps reopened lazily in the worker
    np.testing.assert_array_equal(clone[3].input_ids, ds[3].input_ids)
    assert len(list(clone)) == 5


def test_works_as_torch_map_style_dataset(written):
    torch = pytest.importorskip("torch")
    ds = load_packed(written[0])
    dl = torch.utils.data.DataLoader(ds, batch_size=2, shuffle=False, collate_fn=list)
    batches = list(dl)
    assert [len(b) for b in batches] == [2, 2, 1]
    assert batches[1][0].to_torch()["input_ids"].dtype == torch.int64


# ---------------------------------------------------------------- atomicity / overwrite


def test_interrupted_write_leaves_no_complete_dataset(tmp_path):
    out = tmp_path / "ds"

    def rows():
        yield from _rows(GROUPS[:2])
        raise KeyboardInterrupt  # the user pressed Ctrl-C mid-write

    with pytest.raises(KeyboardInterrupt):
        write_packed(rows(), out, _meta(), rows_per_shard=1)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # temp dir cleaned up


def test_killed_write_leaves_only_hidden_temp_dir(tmp_path):
    out = tmp_path / "ds"
    w = PackedWriter(out, rows_per_shard=1)
    w.write_all(_rows(GROUPS[:3]))  # shards on disk, then the process "dies": no finalize
    assert not out.exists()
    leftovers = sorted(tmp_path.iterdir())  # and the output's lock file, which the kernel unlocks at death
    assert len(leftovers) == 2 and leftovers[0].name == ".ds.lock" and leftovers[1].name.startswith(".ds.tmp-")
    leftovers = leftovers[1:]
    assert not (leftovers[0] / "metadata.json").exists()
    with pytest.raises(PackedDatasetError, match="does not exist"):
        load_packed(out)
    w.abort()


def test_missing_metadata_means_incomplete(written):
    out = written[0]
    (out / "metadata.json").unlink()
    with pytest.raises(PackedDatasetError, match="metadata.json is missing"):
        load_packed(out)


def test_metadata_json_or_data_of_the_wrong_kind_is_named_as_such(written):
    import shutil

    out, _, meta = written
    (out / "metadata.json").unlink()
    (out / "metadata.json").mkdir()
    with pytest.raises(PackedDatasetError) as ei:
        load_packed(out)
    assert str(ei.value).startswith(f"{out} is not a complete seqpack packed dataset: metadata.json is a directory, "
                                    "not a file (a finished `seqpack pack` always writes it last). Fix: check the path")
    (out / "metadata.json").rmdir()
    (out / "metadata.json").write_text(json.dumps(meta.to_dict()))
    assert len(load_packed(out)) == 5
    shutil.rmtree(out / "data")
    (out / "data").write_text("x")
    with pytest.raises(PackedDatasetError) as ei:
        load_packed(out)
    assert str(ei.value) == (f"{out}: data is a file, not the shard folder (shard {meta.shards[0].file} listed in "
                             "metadata.json is in it); re-pack the data")
    (out / "data").unlink()
    (out / "data").mkdir()
    for s in meta.shards:
        (out / s.file).mkdir()
    with pytest.raises(PackedDatasetError) as ei:
        load_packed(out)
    assert str(ei.value) == (f"{out}: shard {meta.shards[0].file} listed in metadata.json is a directory, not a "
                             "file; re-pack the data")


def test_refuses_overwrite_without_flag_and_replaces_with_it(written):
    out, rows, _ = written
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_packed(rows[:1], out, _meta())
    assert len(load_packed(out)) == 5
    write_packed(rows[:1], out, _meta(), overwrite=True)
    ds = load_packed(out)
    assert len(ds) == 1 and ds[0].sample_ids == ["a", "b"]
    assert [p.name for p in out.parent.iterdir()] == ["ds"]  # no temp/old dirs left


def test_failed_overwrite_keeps_the_old_dataset(written):
    out = written[0]

    def bad_rows():
        yield _rows(GROUPS[:1])[0]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_packed(bad_rows(), out, _meta(), overwrite=True)
    assert len(load_packed(out)) == 5


def test_never_deletes_a_foreign_directory(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not a seqpack packed dataset"):
        write_packed(_rows(GROUPS[:1]), out, _meta(), overwrite=True)
    assert (out / "notes.txt").read_text() == "precious"
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        write_packed(_rows(GROUPS[:1]), f, _meta(), overwrite=True)


def test_empty_existing_directory_is_used(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    write_packed(_rows(GROUPS[:1]), out, _meta())
    assert len(load_packed(out)) == 1


# ---------------------------------------------------------------- load-time checks


def test_missing_or_altered_shard_is_detected(written):
    out, _, meta = written
    shard = out / meta.shards[1].file
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    with pytest.raises(PackedDatasetError, match="modified or truncated"):
        load_packed(out)
    shard.unlink()
    with pytest.raises(PackedDatasetError, match="shard-00001.parquet listed in metadata.json is missing"):
        load_packed(out)


def test_row_count_mismatch_is_detected(written):
    out = written[0]
    md = json.loads((out / "metadata.json").read_text())
    md["num_packs"] = 6
    (out / "metadata.json").write_text(json.dumps(md))
    with pytest.raises(PackedDatasetError, match="num_packs=6"):
        load_packed(out)
    md["num_packs"] = 5
    md["shards"][0]["num_rows"] = 3
    (out / "metadata.json").write_text(json.dumps(md))
    with pytest.raises(PackedDatasetError, match="has 2 rows, metadata.json says 3"):
        load_packed(out)


def test_unknown_format_version_is_refused(written):
    out = written[0]
    md = json.loads((out / "metadata.json").read_text())
    md["format_version"] = FORMAT_VERSION + 1
    (out / "metadata.json").write_text(json.dumps(md))
    with pytest.raises(PackedDatasetError, match="format_version"):
        load_packed(out)
    del md["format_version"]
    (out / "metadata.json").write_text(json.dumps(md))
    with pytest.raises(PackedDatasetError, match="not a seqpack packed dataset"):
        load_packed(out)


def test_B23_stale_dataset_packed_for_cp1_refused_for_cp2(tmp_path):
    rows = _rows(GROUPS[:2])
    out = tmp_path / "cp1"
    write_packed(rows, out, _meta())
    with pytest.raises(StalePackedDatasetError) as ei:
        load_packed(out, expect={"context_parallel_size": 2, "capacity": 16})
    msg = str(ei.value)
    assert "context_parallel_size: stored 1, expected 2" in msg and "capacity" not in ei.value.diffs
    # every differing key is named, not just the first
    with pytest.raises(StalePackedDatasetError) as ei:
        load_packed(out, expect={"context_parallel_size": 2, "pad_to_multiple_of": 8, "tokenizer_hash": "zzz",
                                 "seq_length": 16})
    assert set(ei.value.diffs) == {"context_parallel_size", "pad_to_multiple_of", "tokenizer_hash"}
    assert ei.value.diffs["pad_to_multiple_of"] == (1, 8)
    # matching expectations (and the capacity alias) pass
    ds = load_packed(out, expect={"capacity": 16, "context_parallel_size": 1, "tokenizer_hash": "abc"})
    assert len(ds) == 2
    with pytest.raises(ValueError, match="unknown key"):
        load_packed(out, expect={"cp": 2})


def test_B23_cp2_rows_roundtrip_with_multiple_4(tmp_path):
    # cp=2 -> multiple 4: real lengths [5,3,7] padded [8,4,8] (the B23 trigger), capacity 24
    ss = [_sample("x", 5, 1), _sample("y", 3, 10), _sample("z", 7, 20)]
    row = build_packed_sequence(ss, pad_to_multiple_of=4, pad_token_id=PAD, seq_length=24)
    out = tmp_path / "cp2"
    write_packed([row], out, _meta(seq_length=24, context_parallel_size=2, effective_pad_multiple=4))
    got = load_packed(out, expect={"context_parallel_size": 2, "effective_pad_multiple": 4})[0]
    assert got.cu_seqlens.tolist() == [0, 5, 8, 15]
    assert got.cu_seqlens_padded.tolist() == [0, 8, 12, 20]
    got.validate(capacity=24, context_parallel_size=2)
    assert (got.labels[got.padding_mask] == IGNORE_INDEX).all()


def test_row_contract_errors(tmp_path):
    row = _rows(GROUPS[:1])[0]
    row.sample_ids = ["only-one"]
    with pytest.raises(ValueError, match="2 segments but 1 sample_ids"):
        write_packed([row], tmp_path / "x", _meta())
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------- fingerprints


def test_fingerprint_depends_on_content_and_settings_not_location(tmp_path):
    a = tmp_path / "one" / "data.jsonl"
    b = tmp_path / "two" / "data.jsonl"
    for p in (a, b):
        p.parent.mkdir()
        p.write_text('{"messages": []}\n')
    s = {"seq_length": 4096, "context_parallel_size": 1}
    fa, fb = (compute_fingerprint([describe_input(p)], s) for p in (a, b))
    assert fa == fb and len(fa) == 64
    assert compute_fingerprint([describe_input(a)], {**s, "context_parallel_size": 2}) != fa
    b.write_text('{"messages": [1]}\n')
    assert compute_fingerprint([describe_input(b)], s) != fa
    d = describe_input(tmp_path / "one")
    assert d["bytes"] == a.stat().st_size and d["sha256"]


def test_read_only_dataset_dir_falls_back_to_temp_cache(written, monkeypatch, tmp_path):
    import tempfile

    from seqpack.io.cache import ShardCache

    out = written[0]
    real_build = ShardCache._build

    def build(self, name, ident, cache):
        if out in cache.parents:
            raise PermissionError(f"read-only: {cache}")
        return real_build(self, name, ident, cache)

    monkeypatch.setattr(ShardCache, "_build", build)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    ds = load_packed(out)
    assert ds[4].sample_ids == ["h"] and ds[0].sample_ids == ["a", "b"]
    assert not (out / ".cache").exists()
    assert len(list((tmp_path / "tmp" / f"seqpack-arrow-cache-{os.getuid()}").rglob("*.arrow"))) == 2  # opened lazily: shards 2 and 0


def test_sigkill_mid_write_never_leaves_a_complete_looking_dataset(tmp_path):
    import signal
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "ds"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_io import _rows, _meta, GROUPS
        from seqpack.io import write_packed
        def rows():
            for k, r in enumerate(_rows(GROUPS)):
                if k == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
                yield r
        write_packed(rows(), {str(out)!r}, _meta(), rows_per_shard=1)
        """
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**__import__("os").environ, "PYTHONPATH": src}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not out.exists()
    leftovers = sorted(tmp_path.iterdir())  # the temp dir and the lock file the kernel unlocked at death
    assert [p.name for p in leftovers][0] == ".ds.lock" and len(leftovers) == 2
    leftovers = leftovers[1:]
    assert leftovers[0].name.startswith(".ds.tmp-")
    assert len(list((leftovers[0] / "data").iterdir())) == 3 and not (leftovers[0] / "metadata.json").exists()
    with pytest.raises(PackedDatasetError):
        load_packed(out)
    # the next run cleans the dead writer's temp dir and publishes normally
    write_packed(_rows(GROUPS[:1]), out, _meta())
    assert [p.name for p in tmp_path.iterdir()] == ["ds"] and len(load_packed(out)) == 1


def test_shard_closes_early_on_token_budget(tmp_path, monkeypatch):
    import seqpack.io.writer as wr

    monkeypatch.setattr(wr, "_MAX_SHARD_TOKENS", 20)  # rows of 8, 7, 13, 16, 1 tokens
    meta = write_packed(_rows(GROUPS), tmp_path / "ds", _meta(), rows_per_shard=100)
    assert [s.num_rows for s in meta.shards] == [3, 2]
    assert [load_packed(tmp_path / "ds")[i].sample_ids[0] for i in (0, 3, 4)] == ["a", "g", "h"]
