"""Round trips through the formats other frameworks read (seqpack.interop), and case B12 on export."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqpack.sample import Sample, shift_labels
from seqpack.interop import (
    export_megatron_bridge,
    from_hf_dataset,
    from_torchtune,
    read_megatron_bridge,
    to_bridge_row,
    to_hf_dataset,
    to_torchtune,
)
from seqpack.packed import build_packed_sequence

PAD = 7
EOS = 999_999  # Bridge's eos_id in the layout tests: no token of theirs is EOS


def make_sample(sid: str, ids, trainable, final_target=None) -> Sample:
    ids = np.asarray(ids, dtype=np.int32)
    return Sample(ids, shift_labels(ids, np.asarray(trainable, bool), final_target), sid)


def assert_same_pack(a, b):
    for f in ("input_ids", "labels", "position_ids", "cu_seqlens", "cu_seqlens_padded", "padding_mask", "seq_idx"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    assert list(a.sample_ids) == list(b.sample_ids)
    assert a.max_seqlen == b.max_seqlen


@st.composite
def packs(draw, max_segments=5):
    m = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.integers(1, max_segments))
    samples = []
    for i in range(n):
        L = draw(st.integers(1, 20))
        ids = draw(st.lists(st.integers(0, 50_000), min_size=L, max_size=L))
        tr = draw(st.lists(st.booleans(), min_size=L, max_size=L))
        ft = draw(st.one_of(st.none(), st.integers(0, 50_000)))
        samples.append(make_sample(f"f.jsonl:{i}", ids, tr, ft))
    total = sum(-(-s.length // m) * m for s in samples)
    extra = draw(st.integers(0, 3)) * m
    pad_max = draw(st.booleans())
    seq_length = total + extra
    pack = build_packed_sequence(
        samples, pad_to_multiple_of=m, pad_token_id=PAD, seq_length=seq_length, pad_to_max_length=pad_max
    )
    pack.validate(capacity=seq_length, multiple=m)
    return pack, m, seq_length


def _unrepresentable_final_target(pack) -> bool:
    cup = np.asarray(pack.cu_seqlens_padded)
    return bool(np.any(np.asarray(pack.labels)[cup[1:] - 1] != -100))


# ------------------------------------------------------------------------------ Megatron-Bridge


@settings(deadline=None, max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(packs())
def test_bridge_row_roundtrip_property(pm):
    from seqpack.interop import from_bridge_row

    pack, m, _ = pm
    row = to_bridge_row(pack, pad_token_id=PAD, pad_to_multiple_of=m)
    rt = row["runtime_lens"]
    # runtime length = stored length - 1 for every segment, and divisible by the multiple (B12)
    stored = np.diff(np.append(row["seq_start_id"], len(row["input_ids"])))
    np.testing.assert_array_equal(stored - 1, rt)
    assert np.all(rt % m == 0)
    # Bridge's runtime view equals seqpack's row, segment by segment
    b = np.append(row["seq_start_id"], len(row["input_ids"]))
    cup = np.asarray(pack.cu_seqlens_padded)
    for i in range(len(rt)):
        tokens = row["input_ids"][b[i] : b[i + 1] - 1]
        labels = np.where(row["loss_mask"][b[i] : b[i + 1] - 1] > 0, row["input_ids"][b[i] + 1 : b[i + 1]], -100)
        L = int(pack.seq_lens[i])  # padding slots may differ: slot L holds the final target id (B12)
        np.testing.assert_array_equal(tokens[:L], pack.input_ids[cup[i] : cup[i] + L])
        np.testing.assert_array_equal(labels, pack.labels[cup[i] : cup[i] + rt[i]])
    back = from_bridge_row(
        row["input_ids"], row["loss_mask"], row["seq_start_id"], seq_lens=row["seq_lens"],
        total_length=row["total_length"], sample_ids=row["sample_ids"], pad_token_id=row["pad_token_id"],
    )
    assert_same_pack(back, pack)


def test_B12_a_runtime_length_divisible_stored_keeps_plus_one(tmp_path):
    """(a) pad_seq_to_mult 8, stored item of 17 ids: runtime 16 is divisible, stored stays 17 (not 25)."""
    s = make_sample("a:0", np.arange(100, 116), [False] * 4 + [True] * 12)
    pack = build_packed_sequence([s], pad_to_multiple_of=8, pad_token_id=PAD, seq_length=32)
    res = export_megatron_bridge([pack], tmp_path / "bridge", pack_size=32, pad_to_multiple_of=8, pad_token_id=PAD, eos_token_id=EOS)
    t = pq.read_table(res.files[0])
    ids = t.column("input_ids")[0].as_py()
    assert len(ids) == 17  # the buggy path rounded 17 up to 24 and stored 25
    assert t.column("seq_start_id")[0].as_py() == [0]
    runtime = len(ids) - 1
    assert runtime == 16 and runtime % 8 == 0
    meta = json.loads(res.metadata_path.read_text())
    assert isinstance(meta, list) and meta[0]["dataset_max_seqlen"] == 16 and meta[0]["pack_size"] == 32


def test_B12_b_long_context_cap_and_final_target(tmp_path):
    """(b) pad 16, max_seq_length 150000: runtime cap 150000 (not 149984), stored budget 150001, and the
    final shifted label (the first dropped token kept by truncation) is not lost."""
    L = 150_000
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 150_000, L).astype(np.int32)
    s = make_sample("long:0", ids, np.ones(L, bool), final_target=424242)
    assert s.labels[-1] == 424242
    pack = build_packed_sequence([s], pad_to_multiple_of=16, pad_token_id=PAD, seq_length=L)
    res = export_megatron_bridge([pack], tmp_path / "b", pack_size=L, pad_to_multiple_of=16, pad_token_id=PAD, eos_token_id=EOS)
    t = pq.read_table(res.files[0])
    stored = np.asarray(t.column("input_ids")[0].as_py())
    lm = np.asarray(t.column("loss_mask")[0].as_py())
    assert stored.shape[0] == L + 1  # stored budget 150001
    assert (stored.shape[0] - 1) % 16 == 0 and stored.shape[0] - 1 == L  # runtime cap 150000
    assert stored[-1] == 424242 and lm[L - 1] == 1  # last runtime label = final target, trained
    assert res.metadata["dataset_max_seqlen"] == L and res.metadata["packing_efficiency"] == 100.0
    back = next(read_megatron_bridge(res.files[0]))
    assert back.labels[-1] == 424242
    assert_same_pack(back, pack)


def test_bridge_export_dir_roundtrip_and_metadata(tmp_path):
    rng = np.random.default_rng(1)
    pks = []
    for k in range(5):
        ss = [make_sample(f"x:{k}-{i}", rng.integers(0, 1000, L), rng.random(L) > 0.3) for i, L in enumerate([5, 9, 3])]
        pks.append(build_packed_sequence(ss, pad_to_multiple_of=4, pad_token_id=PAD, seq_length=32))
    res = export_megatron_bridge(pks, tmp_path / "out", pack_size=32, pad_to_multiple_of=4, pad_token_id=PAD, eos_token_id=EOS, rows_per_file=2)
    assert [f.name for f in res.files] == ["shard_00000.idx.parquet", "shard_00001.idx.parquet", "shard_00002.idx.parquet"]
    # runtime lengths: 8 + 12 + 4 = 24 per pack
    assert res.metadata == {
        "dataset_max_seqlen": 12, "max_samples_per_bin": 3, "packing_factor": 3.0,
        "packing_efficiency": 75.0, "pack_size": 32, "min_packed_seqlen": 24,
    }
    back = list(read_megatron_bridge(tmp_path / "out"))
    assert len(back) == 5
    for a, b in zip(back, pks):
        assert_same_pack(a, b)
    with pytest.raises(FileExistsError):
        export_megatron_bridge(pks, tmp_path / "out", pack_size=32, pad_token_id=PAD, eos_token_id=EOS)
    kw = dict(pack_size=32, pad_to_multiple_of=4, pad_token_id=PAD, eos_token_id=EOS, overwrite=True)
    # overwrite replaces an earlier export's files (fewer files now: the old third shard is gone)
    res = export_megatron_bridge(pks[:2], tmp_path / "out", rows_per_file=2, **kw)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["packing_metadata.json", "shard_00000.idx.parquet"]
    assert len(list(read_megatron_bridge(tmp_path / "out"))) == 2
    # ... but never a user's file: refused, named, nothing changed
    (tmp_path / "out" / "NOTES.md").write_text("mine")
    with pytest.raises(FileExistsError, match=r"did not write \(NOTES\.md\)"):
        export_megatron_bridge(pks, tmp_path / "out", **kw)
    assert (tmp_path / "out" / "NOTES.md").read_text() == "mine"
    assert len(list(read_megatron_bridge(tmp_path / "out" / "shard_00000.idx.parquet"))) == 2
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        export_megatron_bridge(pks, tmp_path / "f" / "out", **kw)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_bridge_import_foreign_file_without_extra_columns(tmp_path):
    """A file with only Bridge's three columns: runtime segments count as fully real."""
    import pyarrow as pa

    # two stored segments: [10 11 12 13] (runtime 3) and [20 21 22] (runtime 2)
    t = pa.table({
        "input_ids": pa.array([[10, 11, 12, 13, 20, 21, 22]], pa.list_(pa.int32())),
        "loss_mask": pa.array([[0, 1, 1, 0, 1, 0, 0]], pa.list_(pa.uint8())),
        "seq_start_id": pa.array([[0, 4]], pa.list_(pa.int32())),
    })
    pq.write_table(t, tmp_path / "x.idx.parquet")
    (p,) = list(read_megatron_bridge(tmp_path / "x.idx.parquet"))
    np.testing.assert_array_equal(p.input_ids, [10, 11, 12, 20, 21])
    np.testing.assert_array_equal(p.labels, [-100, 12, 13, 21, -100])
    np.testing.assert_array_equal(p.cu_seqlens, [0, 3, 5])
    np.testing.assert_array_equal(p.position_ids, [0, 1, 2, 0, 1])
    assert p.sample_ids == ["x.idx.parquet:0#seg0", "x.idx.parquet:0#seg1"]
    p.validate()


def test_bridge_import_rejects_malformed_rows(tmp_path):
    from seqpack.interop import from_bridge_row

    with pytest.raises(ValueError, match="seq_start_id must start with 0"):
        from_bridge_row([1, 2, 3], [0, 0, 0], [1], where="f.parquet:3")
    with pytest.raises(ValueError, match="f.parquet:3: segment 1 has stored length 1"):
        from_bridge_row([1, 2, 3], [0, 0, 0], [0, 2], where="f.parquet:3")
    with pytest.raises(ValueError, match="loss_mask has 2 entries"):
        from_bridge_row([1, 2, 3], [0, 0], [0])


def test_bridge_export_rejects_label_that_is_not_next_token():
    s = Sample(np.array([1, 2, 3], np.int32), np.array([5, 3, -100], np.int32), "bad:0")
    pack = build_packed_sequence([s], pad_token_id=PAD)
    with pytest.raises(ValueError, match=r"sample 'bad:0': label 5 at segment slot 0 is not the next token 2"):
        to_bridge_row(pack, pad_token_id=PAD)


# ------------------------------------------------------------------------------ torchtune


@settings(deadline=None, max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(packs())
def test_torchtune_roundtrip_property(pm):
    pack, m, _ = pm
    if _unrepresentable_final_target(pack):
        with pytest.raises(ValueError, match="cannot be stored with unshifted labels"):
            to_torchtune(pack)
        return
    tt = to_torchtune(pack)
    T = pack.input_ids.shape[0]
    assert int(tt["seq_lens"].sum()) == T
    np.testing.assert_array_equal(tt["input_pos"], pack.position_ids)
    # torchtune's recipe shift over the whole row (labels[1:] + ignore) gives seqpack's labels exactly
    recipe = np.append(tt["labels"][1:], -100)
    np.testing.assert_array_equal(recipe, pack.labels)
    back = from_torchtune(tt, real_seq_lens=pack.seq_lens, sample_ids=pack.sample_ids)
    assert_same_pack(back, pack)


def test_torchtune_final_target_policies():
    s = make_sample("t:0", [1, 2, 3], [False, True, True], final_target=99)
    tight = build_packed_sequence([s], pad_to_multiple_of=1, pad_token_id=PAD)
    with pytest.raises(ValueError, match=r"sample 't:0'.*final_target='drop'"):
        to_torchtune(tight)
    dropped = to_torchtune(tight, final_target="drop")
    np.testing.assert_array_equal(dropped["labels"], [-100, 2, 3])
    # with a padding slot after the last real token the final target survives
    roomy = build_packed_sequence([s], pad_to_multiple_of=4, pad_token_id=PAD)
    tt = to_torchtune(roomy, as_torch=True)
    assert tt["labels"].tolist() == [-100, 2, 3, 99]
    back = from_torchtune(tt, real_seq_lens=[3], sample_ids=["t:0"])
    assert back.labels.tolist() == [2, 3, 99, -100]
    assert_same_pack(back, roomy)


def test_torchtune_native_trailing_padding_entry():
    # torchtune PackedDataset with max_seq_len 6: samples of 3 and 2 tokens, one pad slot as its own entry
    sample = {
        "tokens": np.array([5, 6, 7, 8, 9, 0]),
        "labels": np.array([-100, 6, 7, -100, 9, -100]),
        "input_pos": np.array([0, 1, 2, 0, 1, 2]),
        "seq_lens": np.array([3, 2, 1]),
    }
    p = from_torchtune(sample, trailing_padding=True, real_seq_lens=[3, 2])
    np.testing.assert_array_equal(p.cu_seqlens, [0, 3, 5])
    np.testing.assert_array_equal(p.cu_seqlens_padded, [0, 3, 6])
    np.testing.assert_array_equal(p.labels, [6, 7, -100, 9, -100, -100])
    np.testing.assert_array_equal(p.position_ids, sample["input_pos"])
    with pytest.raises(ValueError, match="must be >= 1 and sum to len"):
        from_torchtune({**sample, "seq_lens": np.array([3, 2])})


# ------------------------------------------------------------------------------ HF datasets


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(packs(max_segments=3), min_size=1, max_size=4))
def test_hf_dataset_roundtrip_property(pms):
    pks = [p for p, _, _ in pms]
    lost = any(_unrepresentable_final_target(p) for p in pks)
    if lost:
        with pytest.raises(ValueError, match="last physical slot"):
            to_hf_dataset(pks)
    ds = to_hf_dataset(pks, final_target="drop", batch_rows=2)
    assert len(ds) == len(pks)
    for row, p in zip(ds, pks):
        np.testing.assert_array_equal(row["labels"], p.hf_unshifted_labels())
        np.testing.assert_array_equal(row["shift_labels"], p.labels)
        np.testing.assert_array_equal(row["seq_lengths"], np.diff(p.cu_seqlens_padded))
    for a, b in zip(from_hf_dataset(ds), pks):  # shift_labels: exact, final targets included
        assert_same_pack(a, b)
    if not lost:  # an HF dataset with unshifted labels only
        for a, b in zip(from_hf_dataset(ds.remove_columns(["shift_labels"])), pks):
            assert_same_pack(a, b)


def test_hf_dataset_columns_and_errors():
    s = make_sample("h:0", [1, 2, 3, 4], [False, True, True, True])
    pack = build_packed_sequence([s, make_sample("h:1", [5, 6], [False, True])], pad_to_multiple_of=4, pad_token_id=PAD)
    ds = to_hf_dataset([pack])
    assert ds.column_names == ["input_ids", "labels", "shift_labels", "position_ids", "seq_lengths", "cu_seqlens",
                               "cu_seqlens_padded", "sample_ids"]
    r = ds[0]
    assert r["cu_seqlens"] == [0, 4, 6] and r["cu_seqlens_padded"] == [0, 4, 8] and r["seq_lengths"] == [4, 4]
    assert r["position_ids"] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert r["shift_labels"] == [2, 3, 4, -100, 6, -100, -100, -100]
    assert r["labels"] == [-100, 2, 3, 4, -100, 6, -100, -100]
    with pytest.raises(KeyError, match="cu_seqlens_padded"):
        from_hf_dataset(ds.remove_columns(["cu_seqlens_padded"]))
    with pytest.raises(KeyError, match="labels or shift_labels"):
        from_hf_dataset(ds.remove_columns(["labels", "shift_labels"]))
    edited = ds.map(lambda r: {"labels": [-100] * len(r["labels"])})
    with pytest.raises(ValueError, match="labels is not shift_labels unshifted"):
        from_hf_dataset(edited)
    with pytest.raises(ValueError, match="seq_lengths"):
        from_hf_dataset(ds.map(lambda r: {"seq_lengths": [8]}))
    with pytest.raises(ValueError, match="final_target"):
        to_hf_dataset([pack], final_target="keep")
    with pytest.raises(ValueError, match="media"):  # pixels have no column: never dropped silently
        to_hf_dataset([dataclasses.replace(pack, media=[{"image_grid_thw": np.ones((1, 3))}, None])])
    with pytest.raises(ValueError, match="do not restart"):  # TRL would rebuild other positions
        to_hf_dataset([dataclasses.replace(pack, position_ids=np.arange(pack.length))])


# ------------------------------------------------------------------------------ real packed data


def test_real_packed_dataset_roundtrips_all_formats(shared_data, tmp_path):
    from seqpack import pipeline  # a core module: an import error must fail, not skip
    src = shared_data / "llama-factory" / "alpaca_en_demo.json"
    res = pipeline.pack_dataset([src], tmp_path / "packed", seq_length=1024, pad_to_multiple_of=8)
    ds = res.load()
    pks = [ds[i] for i in range(len(ds))]
    assert len(pks) == res.metadata.num_packs > 1
    # Megatron-Bridge: defaults (pack size, multiple, pad id) come from metadata.json
    out = export_megatron_bridge(tmp_path / "packed", tmp_path / "bridge")
    assert out.metadata["pack_size"] == 1024 and out.metadata["max_samples_per_bin"] == res.metadata.max_samples_per_bin
    assert out.num_segments == res.metadata.counts["samples_packed"]
    back = list(read_megatron_bridge(tmp_path / "bridge"))
    for a, b in zip(back, pks):
        assert_same_pack(a, b)
    # torchtune and HF datasets (truncated samples keep a final target: drop only where no slot exists)
    for p in pks:
        tt = to_torchtune(p, final_target="drop")
        q = from_torchtune(tt, real_seq_lens=p.seq_lens, sample_ids=p.sample_ids)
        np.testing.assert_array_equal(q.input_ids, p.input_ids)
        if not _unrepresentable_final_target(p):
            assert_same_pack(q, p)
    hf = from_hf_dataset(to_hf_dataset(pks, final_target="drop"))
    for a, b in zip(hf, pks):
        assert_same_pack(a, b)
