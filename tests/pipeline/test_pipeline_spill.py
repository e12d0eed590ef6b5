"""pack_dataset's default file-by-file spill path: byte-identical output to the in-memory path, no
Sample kept alive between prepare and writing, spill folder removed (issue #8: bounded memory)."""

from __future__ import annotations

import gc
import json
import shutil
import weakref
from pathlib import Path

import pytest

import seqpack.packed as packed
from seqpack.io.spill import SampleSpill
from seqpack.pipeline import pack_dataset
from seqpack.pipeline.local import _pack_in_memory


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_identical(a, b) -> None:
    """Every file byte for byte; metadata.json except its creation time."""
    fa, fb = _files(a.output), _files(b.output)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        if name == "metadata.json":
            ma, mb = json.loads(fa[name]), json.loads(fb[name])
            ma.pop("created_at"), mb.pop("created_at")
            assert ma == mb
        else:
            assert fa[name] == fb[name], name
    assert [vars(e) for e in a.report.entries] == [vars(e) for e in b.report.entries]
    assert (a.report.records_read, a.report.samples_out, a.report.tokens, a.report.trainable_tokens) == (
        b.report.records_read, b.report.samples_out, b.report.tokens, b.report.trainable_tokens)
    assert [x.tolist() for x in a.plan.bins] == [x.tolist() for x in b.plan.bins]


def _no_spill_left(parent: Path) -> None:
    assert not [p.name for p in parent.iterdir() if ".spill-" in p.name]


def test_embedded_data_same_bytes_as_in_memory(tmp_path, qwen3_tokenizer):
    kw = dict(tokenizer=qwen3_tokenizer, seq_length=1024, seed=5, pad_to_multiple_of=8, rows_per_shard=3)
    a = pack_dataset(None, tmp_path / "spill", **kw)
    b = _pack_in_memory(None, tmp_path / "mem", **kw)
    assert a.metadata.num_packs >= 3  # several shards compared
    _assert_identical(a, b)
    _no_spill_left(tmp_path)


def test_real_files_same_bytes_as_in_memory(shared_data, tmp_path, qwen3_tokenizer):
    """Several files (one with images, one with an 11.5k-token outlier, two sharing a file name, a bad
    record skipped): ids, report order (read errors of every file before the length-policy entries),
    media and packs equal the in-memory path's."""
    lf = shared_data / "llama-factory"
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    shutil.copy(lf / "identity.json", tmp_path / "a" / "x.json")
    lines = (shared_data / "fastchat" / "dummy_conversation.json").read_text()
    recs = json.loads(lines)[:40]
    bad = [json.dumps(r) for r in recs[:20]] + ['{"conversations": 3}'] + [json.dumps(r) for r in recs[20:]]
    (tmp_path / "b" / "x.jsonl").write_text("\n".join(bad) + "\n")
    (tmp_path / "b" / "x.json").write_text(json.dumps([*recs[:5], {"conversations": 3}]))
    # the glaive outlier (a length-policy entry) comes before the bad records (read entries)
    inputs = [lf / "mllm_demo.json", tmp_path / "a" / "x.json", lf / "glaive_toolcall_en_demo.json",
              tmp_path / "b" / "x.jsonl", tmp_path / "b" / "x.json"]
    kw = dict(tokenizer=qwen3_tokenizer, seq_length=2048, overlength="split", on_error="skip", seed=1)
    out = tmp_path / "out"
    a = pack_dataset(inputs, out / "spill", **kw)
    b = _pack_in_memory(inputs, out / "mem", **kw)
    _assert_identical(a, b)
    ids = [sid for row in a.load() for sid in row.sample_ids]
    assert any(s.startswith("a/x.json:") for s in ids) and any(s.startswith("b/x.json:") for s in ids)
    assert [(e.sample_id, e.status, e.reason) for e in a.report.entries] == [
        ("x.jsonl:20", "skipped", "bad_content_type"),
        ("b/x.json:5", "skipped", "bad_content_type"),  # renamed like the in-memory path's ids
        ("glaive_toolcall_en_demo.json:243", "split", "overlength"),
    ]
    assert a.metadata.media is not None and a.metadata.counts["images"] > 0
    _no_spill_left(out)


def test_no_sample_kept_alive_while_writing(tmp_path, qwen3_tokenizer, monkeypatch):
    """The spill path drops every prepared Sample before building rows: memory holds lengths + metadata."""
    appended: list[weakref.ref] = []
    real_append, real_build = SampleSpill.append, packed.build_packed_sequence
    alive_at_write: list[int] = []

    def spy_append(self, sample):
        appended.append(weakref.ref(sample))
        return real_append(self, sample)

    def spy_build(samples, **kw):
        if not alive_at_write:
            gc.collect()
            alive_at_write.append(sum(r() is not None for r in appended))
        return real_build(samples, **kw)

    monkeypatch.setattr(SampleSpill, "append", spy_append)
    monkeypatch.setattr(packed, "build_packed_sequence", spy_build)
    res = pack_dataset(None, tmp_path / "out", tokenizer=qwen3_tokenizer, seq_length=1024)
    assert len(appended) == res.metadata.counts["samples_packed"] == 46
    assert alive_at_write == [0]


def test_spill_removed_on_error(tmp_path, qwen3_tokenizer, monkeypatch):
    def boom(samples, **kw):
        raise RuntimeError("build failed")

    monkeypatch.setattr(packed, "build_packed_sequence", boom)
    with pytest.raises(RuntimeError, match="build failed"):
        pack_dataset(None, tmp_path / "out", tokenizer=qwen3_tokenizer, seq_length=1024)
    assert not (tmp_path / "out").exists()
    _no_spill_left(tmp_path)


def test_in_memory_records_use_the_in_memory_path(tmp_path, qwen3_tokenizer, monkeypatch):
    def never(*a, **kw):  # pragma: no cover - must not be reached
        raise AssertionError("in-memory records went to the spill")

    monkeypatch.setattr(SampleSpill, "__init__", never)
    recs = [{"messages": [{"role": "user", "content": f"hi {k}"}, {"role": "assistant", "content": "hello " * k}]}
            for k in range(1, 6)]
    res = pack_dataset(recs, tmp_path / "out", tokenizer=qwen3_tokenizer, seq_length=256)
    assert res.metadata.counts["samples_packed"] == 5
