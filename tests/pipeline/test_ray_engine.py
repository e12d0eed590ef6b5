"""The Ray Data engine: same packs as the local engine (global planning), every sample exactly once
with the efficiency loss reported (per-shard planning), errors from workers, and the missing-Ray hint.

One local Ray runtime (2 CPUs, small object store) per module; skipped when Ray is not installed.
"""

from __future__ import annotations

import builtins
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from seqpack.sample import Sample
from seqpack.packed import build_packed_sequence
from seqpack.pipeline import PackConfigError, pack_dataset, sample_data_path


@pytest.fixture(scope="module")
def ray_runtime():
    ray = pytest.importorskip("ray")
    from seqpack.pipeline.ray import start_ray

    owned = not ray.is_initialized()
    if owned:
        start_ray(num_cpus=2, object_store_memory=200 * 1024**2)
    yield ray
    if owned:
        ray.shutdown()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    """The embedded chats split into 3 JSONL shards; two share the file name ``part.jsonl`` (so sample
    ids carry the shortest distinguishing path suffix), and one holds a malformed line."""
    root = tmp_path_factory.mktemp("shards")
    lines = sample_data_path().read_text(encoding="utf-8").splitlines()
    (root / "a").mkdir()
    (root / "b").mkdir()
    paths = [root / "a" / "part.jsonl", root / "b" / "part.jsonl", root / "c.jsonl"]
    paths[0].write_text("\n".join(lines[:14]) + "\n", encoding="utf-8")
    paths[1].write_text("\n".join(lines[14:27]) + "\n{not json\n", encoding="utf-8")
    paths[2].write_text("\n".join(lines[27:]) + "\n", encoding="utf-8")
    return paths


SETTINGS = dict(seq_length=512, pad_to_multiple_of=8, overlength="truncate", on_error="skip", seed=3)


def _packs(res):
    ds = res.load()
    return [ds[i] for i in range(len(ds))]


def test_ray_global_planning_equals_local_engine(ray_runtime, shards, tmp_path):
    from seqpack.pipeline import pack_dataset_ray

    local = pack_dataset(shards, tmp_path / "local", **SETTINGS)
    ray_res = pack_dataset_ray(shards, tmp_path / "ray", num_cpus=2, planning="global", packs_per_task=3, **SETTINGS)
    a, b = _packs(local), _packs(ray_res)
    assert len(a) == len(b) == local.metadata.num_packs > 3
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.input_ids, y.input_ids)
        np.testing.assert_array_equal(x.labels, y.labels)
        np.testing.assert_array_equal(x.cu_seqlens_padded, y.cu_seqlens_padded)
        assert x.sample_ids == y.sample_ids
    # same accounting and metadata (the Ray run only adds extra["engine"])
    lm, rm = local.metadata, ray_res.metadata
    assert rm.counts == lm.counts and rm.counts["skipped"] == {"malformed_json": 1}
    for key in ("fingerprint", "packing_efficiency", "lower_bound", "max_samples_per_bin", "min_packed_seqlen",
                "dataset_max_seqlen", "effective_pad_multiple"):
        assert getattr(rm, key) == getattr(lm, key), key
    assert rm.extra["engine"] == {"name": "ray", "planning": "global", "workers": 2, "input_shards": 3}
    # metadata.json is the local engine's except the engine section (inputs, shards, fingerprint, counts...)
    lj = json.loads((tmp_path / "local" / "metadata.json").read_text())
    rj = json.loads((tmp_path / "ray" / "metadata.json").read_text())
    assert rj["extra"].pop("engine")["name"] == "ray" and "engine" not in lj["extra"]
    for d in (lj, rj):
        d.pop("timings_s", None)
    assert rj == lj
    assert [e.sample_id for e in ray_res.report.entries] == [e.sample_id for e in local.report.entries]
    # duplicate file names: ids use the shortest distinguishing path suffix, as the local engine names them
    assert any(sid.startswith("a/part.jsonl:") for p in b for sid in p.sample_ids)
    assert any(sid.startswith("b/part.jsonl:") for p in b for sid in p.sample_ids)
    assert ray_res.load().report() == local.load().report()


def test_ray_per_shard_planning_packs_each_sample_once_and_reports_loss(ray_runtime, shards, tmp_path):
    from seqpack.pipeline import pack_dataset_ray

    local = pack_dataset(shards, tmp_path / "local", **SETTINGS)
    res = pack_dataset_ray(shards, tmp_path / "ray", num_cpus=2, planning="per_shard", **SETTINGS)
    packs = _packs(res)
    ids = [sid for p in packs for sid in p.sample_ids]
    local_ids = [sid for p in _packs(local) for sid in p.sample_ids]
    assert Counter(ids) == Counter(local_ids) and len(ids) == len(set(ids))  # every sample exactly once
    for p in packs:  # packs never mix shards
        assert len({sid.rsplit(":", 1)[0] for sid in p.sample_ids}) == 1
        p.validate(capacity=512, multiple=8)
    info = res.metadata.extra["engine"]
    tokens = res.metadata.counts["tokens"]
    assert info["per_shard_num_packs"] == res.metadata.num_packs == len(packs)
    assert info["global_num_packs"] == local.metadata.num_packs
    assert info["per_shard_num_packs"] >= info["global_num_packs"]
    assert info["per_shard_packing_efficiency"] == pytest.approx(tokens / (len(packs) * 512), abs=1e-6)
    assert info["efficiency_loss"] == pytest.approx(
        info["global_packing_efficiency"] - info["per_shard_packing_efficiency"], abs=1e-6
    )
    assert info["efficiency_loss"] >= 0
    assert res.metadata.fingerprint != local.metadata.fingerprint  # different packs, different fingerprint
    meta = json.loads((tmp_path / "ray" / "metadata.json").read_text())
    assert meta["extra"]["engine"]["planning"] == "per_shard"
    assert meta["extra"]["fingerprint_extra"] == {"planning": "per_shard"}


def test_ray_worker_error_names_file_and_line(ray_runtime, shards, tmp_path):
    from seqpack.data import DataFormatError
    from seqpack.pipeline import pack_dataset_ray

    with pytest.raises(DataFormatError) as ei:
        pack_dataset_ray(shards, tmp_path / "out", num_cpus=2, **{**SETTINGS, "on_error": "raise"})
    assert str(shards[1]) in str(ei.value) and "malformed JSON" in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_ray_nothing_to_pack_gives_the_local_engines_error(ray_runtime, shards, tmp_path):
    """Every record dropped (seq_length 8, overlength drop): the same NothingToPackError text as the local
    engine (inputs, counts by reason, fix), and nothing written."""
    from seqpack.pipeline import pack_dataset_ray
    from seqpack.pipeline import NothingToPackError

    settings = {**SETTINGS, "seq_length": 8, "overlength": "drop"}
    with pytest.raises(NothingToPackError) as local:
        pack_dataset(shards[2:], tmp_path / "local", **settings)
    with pytest.raises(NothingToPackError) as ray_err:
        pack_dataset_ray(shards[2:], tmp_path / "ray", num_cpus=2, **settings)
    assert str(ray_err.value).replace("ray.report", "local.report") == str(local.value)
    assert str(shards[2]) in str(ray_err.value) and "'overlength'" in str(ray_err.value)
    assert not (tmp_path / "ray").exists() and not (tmp_path / "local").exists()


def test_ray_refuses_image_records_at_tokenize_time(ray_runtime, tmp_path):
    """Image-text records need the local engine (placeholder expansion); the Ray engine says so before writing."""
    from PIL import Image

    from seqpack.pipeline import pack_dataset_ray

    Image.new("RGB", (28, 28), "red").save(tmp_path / "a.png")
    rec = {"messages": [{"role": "user", "content": "<image>What colour?"},
                        {"role": "assistant", "content": "Red."}], "images": [str(tmp_path / "a.png")]}
    (tmp_path / "img.jsonl").write_text(json.dumps(rec) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"local engine only"):
        pack_dataset_ray([str(tmp_path / "img.jsonl")], tmp_path / "o", seq_length=512)
    assert not (tmp_path / "o").exists()


def test_ray_settings_checked_before_starting_ray(tmp_path):
    from seqpack.pipeline import pack_dataset_ray

    with pytest.raises(PackConfigError, match="planning"):
        pack_dataset_ray(None, tmp_path / "o", planning="sharded")
    with pytest.raises(PackConfigError, match="seq_length=100 is not divisible"):
        pack_dataset_ray(None, tmp_path / "o", seq_length=100, context_parallel_size=2, pad_to_multiple_of=16)


def test_ray_refuses_local_engine_settings_before_starting_ray(tmp_path):
    from seqpack.pipeline import pack_dataset_ray

    for bad in ({"num_proc": 2}, {"image_processor": {}}, {"seq_lenght": 1024}):
        with pytest.raises(TypeError, match=f"pack_dataset_ray\\(\\) does not take {next(iter(bad))}:"):
            pack_dataset_ray(None, tmp_path / "o", **bad)
    assert not (tmp_path / "o").exists()


def test_ray_missing_says_how_to_install(monkeypatch, tmp_path):
    from seqpack.pipeline import ray as ray_engine

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r'pip install "seqpack\[ray\]"'):
        ray_engine.pack_dataset_ray(None, tmp_path / "o", seq_length=1024)
    assert not (tmp_path / "o").exists()


def test_get_engine_names():
    from seqpack.pipeline import get_engine

    assert get_engine("local") is pack_dataset
    with pytest.raises(ValueError, match="^engine='spark' is not an engine; choose one of: local, ray"):
        get_engine("spark")


class _FakeDS:
    """Duck-typed Ray dataset: ``iter_batches`` yields the given pyarrow tables in the given order."""

    def __init__(self, tables):
        self.tables = tables

    def iter_batches(self, **_kw):
        yield from self.tables


def _pack_table(gids):
    import pyarrow as pa

    from seqpack.pipeline.ray_rows import pack_rows

    packs = [build_packed_sequence([Sample(np.array([g + 1, g + 2], np.int32), np.array([g + 2, -100], np.int32),
                                           f"s:{g}")], pad_token_id=0) for g in gids]
    return pack_rows(pa, 0, np.asarray(gids), packs)


def test_reorder_buffer_yields_packs_in_order_and_refuses_gaps():
    pytest.importorskip("pyarrow")
    from seqpack.pipeline.ray_rows import iter_pack_rows

    ds = _FakeDS([_pack_table([2, 3]), _pack_table([0]), _pack_table([1, 4])])
    rows = list(iter_pack_rows(ds, np.zeros(1, np.int64), 5))
    assert [r.sample_ids[0] for r in rows] == [f"s:{g}" for g in range(5)]
    np.testing.assert_array_equal(rows[3].input_ids, [4, 5])
    with pytest.raises(RuntimeError, match="missing pack 1"):
        list(iter_pack_rows(_FakeDS([_pack_table([0, 2])]), np.zeros(1, np.int64), 3))
    with pytest.raises(RuntimeError, match="pack 0 was built twice"):
        list(iter_pack_rows(_FakeDS([_pack_table([0]), _pack_table([0])]), np.zeros(1, np.int64), 1))
