"""The Arrow cache serves a shard's rows only for the shard file it was built from; an open dataset never
serves another dataset's rows after the folder was replaced; damaged caches repair themselves; a
``.cache`` or ``metadata.json`` symlink out of the dataset is not followed."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings

import numpy as np
import pyarrow as pa
import pytest

from seqpack import load_packed, pack_dataset
from seqpack.io import PackedDatasetError

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    base = tmp_path_factory.mktemp("packs")
    pack_dataset(output=str(base / "a"), seq_length=256, pad_to_multiple_of=8, progress=None)
    pack_dataset(output=str(base / "b"), seq_length=512, pad_to_multiple_of=8, progress=None)
    return base


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Point the private temp cache (``seqpack-arrow-cache-<uid>``) at a fresh folder."""
    t = tmp_path / "tmp"
    t.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


def _copy(packs, name, dst):
    shutil.copytree(packs / name, dst)
    return dst


def _rows(ds):
    return [np.asarray(ds[i].input_ids).copy() for i in range(len(ds))]


def _claim(victim, impostor):
    """Make ``impostor``'s metadata.json claim ``victim``'s fingerprint and shard sha256s (the keys the
    cache file names are made of); sizes and row counts stay true to the impostor's own shards."""
    v = json.loads((victim / "metadata.json").read_text())
    d = json.loads((impostor / "metadata.json").read_text())
    d["fingerprint"] = v["fingerprint"]
    for s, vs in zip(d["shards"], v["shards"]):
        assert s["file"] == vs["file"]  # same shard names: the same cache file names
        s["sha256"] = vs["sha256"]
    (impostor / "metadata.json").write_text(json.dumps(d))


def test_a_shared_cache_folder_serves_each_dataset_its_own_rows(packs, tmp_path):
    a, b = _copy(packs, "a", tmp_path / "a"), _copy(packs, "b", tmp_path / "b")
    _claim(a, b)
    want_a, want_b = _rows(load_packed(a, memory_map=False)), _rows(load_packed(b, memory_map=False))
    assert not np.array_equal(want_a[0], want_b[0])
    shared = tmp_path / "shared"
    for _ in range(2):  # alternate: each load finds the other's cache file under its own name
        for ds, want in ((b, want_b), (a, want_a)):
            got = load_packed(ds, cache_dir=shared)
            assert all(np.array_equal(g, w) for g, w in zip(_rows(got), want))
    assert len(list(shared.glob("*.arrow"))) == len(json.loads((a / "metadata.json").read_text())["shards"])


@pytest.mark.skipif(ROOT, reason="root may write anywhere: chmod does not make a folder read-only")
def test_read_only_datasets_with_claimed_keys_do_not_poison_each_other(packs, tmp_path, private_tmp):
    a, b = _copy(packs, "a", tmp_path / "a"), _copy(packs, "b", tmp_path / "b")
    _claim(a, b)
    want_a = _rows(load_packed(a, memory_map=False))
    for d in (a, b):
        for sub in (d / "data", d):
            sub.chmod(0o555)
    try:
        _ = load_packed(b)[0]
        assert all(np.array_equal(g, w) for g, w in zip(_rows(load_packed(a)), want_a))
        assert not (a / ".cache").exists() and list(private_tmp.rglob("*.arrow"))
    finally:
        for d in (a, b):
            for sub in (d, d / "data"):
                sub.chmod(0o755)


def test_unwritable_datasets_share_the_private_cache_safely(packs, tmp_path, private_tmp, monkeypatch):
    """As above without chmod (runs as root too): writes into either dataset fail, and both datasets
    are forced into one private cache folder, so B's cache file is found under A's cache name."""
    from seqpack.io.cache import ShardCache

    a, b = _copy(packs, "a", tmp_path / "a"), _copy(packs, "b", tmp_path / "b")
    _claim(a, b)
    want_a, want_b = _rows(load_packed(a, memory_map=False)), _rows(load_packed(b, memory_map=False))
    real_build = ShardCache._build

    def build(self, name, ident, cache):
        if a in cache.parents or b in cache.parents:
            raise PermissionError(f"read-only: {cache}")
        return real_build(self, name, ident, cache)

    monkeypatch.setattr(ShardCache, "_build", build)
    monkeypatch.setattr(ShardCache, "_private", lambda self: private_tmp / "one")
    for ds, want in ((b, want_b), (a, want_a), (b, want_b)):
        assert all(np.array_equal(g, w) for g, w in zip(_rows(load_packed(ds)), want))
    assert not (a / ".cache").exists() and not (b / ".cache").exists()
    n_shards = len(json.loads((a / "metadata.json").read_text())["shards"])
    assert len(list((private_tmp / "one").glob("*.arrow"))) == n_shards  # one name each: the same files reused


def test_a_cache_file_of_another_shard_is_rebuilt(packs, tmp_path, private_tmp):
    a, b = _copy(packs, "a", tmp_path / "a"), _copy(packs, "b", tmp_path / "b")
    _claim(a, b)
    _ = load_packed(b)[0]
    want_a = _rows(load_packed(a, memory_map=False))
    (a / ".cache").mkdir()
    for f in (b / ".cache").glob("*.arrow"):  # B's caches planted under the names A's metadata gives
        shutil.copy(f, a / ".cache" / f.name)
    assert all(np.array_equal(g, w) for g, w in zip(_rows(load_packed(a)), want_a))


@pytest.mark.parametrize("memory_map", [True, False])
def test_an_open_dataset_refuses_to_serve_a_replacement(packs, tmp_path, memory_map):
    x = _copy(packs, "a", tmp_path / "x")
    ds = load_packed(x, memory_map=memory_map)
    n = len(ds)
    pack_dataset(output=str(x), seq_length=1024, pad_to_multiple_of=8, progress=None, overwrite=True)
    with pytest.raises(PackedDatasetError, match="replaced .* since it was opened.*reopen it"):
        ds[0]
    with pytest.raises(PackedDatasetError, match="not the file checked"):
        ds.column("num_tokens")
    fresh = load_packed(x)
    assert len(fresh) != n and fresh.metadata.seq_length == 1024 and len(fresh[0].input_ids) <= 1024


def test_a_swapped_shard_file_is_refused_on_first_access(packs, tmp_path):
    x = _copy(packs, "a", tmp_path / "x")
    ds = load_packed(x)
    shard = x / ds.metadata.shards[0].file
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data)  # same bytes, another file: not what load_packed checked
    with pytest.raises(PackedDatasetError, match="not the file checked when the dataset was opened"):
        ds[0]
    assert np.asarray(load_packed(x)[0].input_ids).size  # reopened: fine


def test_a_cache_symlink_is_not_followed(packs, tmp_path, private_tmp):
    x = _copy(packs, "a", tmp_path / "x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (x / ".cache").symlink_to(outside)
    want = _rows(load_packed(x, memory_map=False))
    ds = load_packed(x)
    with pytest.warns(UserWarning, match=r"\.cache is a symlink; not following it"):
        got = _rows(ds)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert list(outside.iterdir()) == []
    assert ds.cache_dir is not None and private_tmp in ds.cache_dir.parents
    assert len(list(ds.cache_dir.glob("*.arrow"))) == len(ds.metadata.shards)


def _damage_truncate(cache):
    cache.write_bytes(cache.read_bytes()[:10])


def _damage_drop_column(cache):
    with pa.OSFile(str(cache), "rb") as f:
        table = pa.ipc.open_file(f).read_all()
    table = table.drop_columns(["sample_ids"])  # keeps the schema metadata (the source identity)
    tmp = cache.with_name("planted")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    os.replace(tmp, cache)


@pytest.mark.parametrize("damage,why", [(_damage_truncate, "ArrowInvalid"),
                                        (_damage_drop_column, "missing columns \\['sample_ids'\\]")])
def test_a_damaged_cache_is_rebuilt_with_a_warning(packs, tmp_path, damage, why):
    x = _copy(packs, "a", tmp_path / "x")
    want = _rows(load_packed(x, memory_map=False))
    _ = _rows(load_packed(x))
    cache = sorted((x / ".cache").glob("*.arrow"))[0]
    damage(cache)
    with pytest.warns(UserWarning, match=f"Arrow cache .*{cache.name} of shard .* is damaged .*{why}.*rebuilding"):
        got = _rows(load_packed(x))
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # repaired: no warning the next time
        assert all(np.array_equal(g, w) for g, w in zip(_rows(load_packed(x)), want))


def test_a_same_size_garbage_shard_is_a_packed_dataset_error(packs, tmp_path):
    x = _copy(packs, "a", tmp_path / "x")
    name = json.loads((x / "metadata.json").read_text())["shards"][0]["file"]
    shard = x / name
    shard.write_bytes(np.random.default_rng(0).bytes(shard.stat().st_size))
    for memory_map in (True, False):
        with pytest.raises(PackedDatasetError, match=f"shard {name} is not a readable Parquet file.*re-pack"):
            load_packed(x, memory_map=memory_map)


def test_a_metadata_symlink_out_of_the_folder_is_refused(packs, tmp_path):
    x = _copy(packs, "a", tmp_path / "x")
    meta = x / "metadata.json"
    outside = tmp_path / "elsewhere.json"
    meta.rename(outside)
    meta.symlink_to(outside)
    with pytest.raises(PackedDatasetError, match="symlink to .*elsewhere.json, outside the dataset folder.*copy the file in"):
        load_packed(x)
    meta.unlink()
    inside = x / "meta-copy.json"
    shutil.copy(outside, inside)
    meta.symlink_to(inside.name)  # a link inside the folder is fine
    assert len(load_packed(x)) > 0
