"""Files from outside are validated, never trusted: metadata.json schema and fingerprint, shard paths
confined to the dataset folder, the Arrow cache rebuilt under verify=True and kept private to the user."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pyarrow as pa
import pytest

from seqpack import load_packed, pack_dataset
from seqpack.io import PackedDatasetError
from seqpack.io.fingerprint import FINGERPRINT_SETTINGS, recompute_fingerprint
from seqpack.io.cache import private_cache_root


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "packed"
    pack_dataset(output=str(out), seq_length=256, pad_to_multiple_of=8, progress=None)
    return out


def _copy(packed, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(packed, dst)
    return dst


def _edit(ds, **changes):
    p = ds / "metadata.json"
    d = json.loads(p.read_text())
    for k, v in changes.items():
        if "." in k:
            a, i, b = k.split(".")
            d[a][int(i)][b] = v
        else:
            d[k] = v
    p.write_text(json.dumps(d))


def test_the_written_fingerprint_is_recomputable(packed):
    meta = load_packed(packed, verify=True).metadata
    assert recompute_fingerprint(meta) == meta.fingerprint
    assert set(FINGERPRINT_SETTINGS) <= set(meta.to_dict())


@pytest.mark.parametrize("key,value", [("seq_length", 512), ("pad_to_multiple_of", 16),
                                       ("context_parallel_size", 2), ("seed", 7), ("pad_token_id", 5)])
def test_edited_settings_fail_verify(packed, tmp_path, key, value):
    ds = _copy(packed, tmp_path)
    changes = {key: value}
    if key == "seq_length":
        changes["capacity"] = value
    if key in ("pad_to_multiple_of", "context_parallel_size"):  # keep the edit schema-valid
        from seqpack.padding import compute_pad_multiple

        d = json.loads((ds / "metadata.json").read_text())
        d[key] = value
        changes["effective_pad_multiple"] = compute_pad_multiple(d["pad_to_multiple_of"], d["context_parallel_size"])
    _edit(ds, **changes)
    load_packed(ds)  # schema-valid: opens without verification
    with pytest.raises(PackedDatasetError, match="do not match its fingerprint"):
        load_packed(ds, verify=True)


def _edit_nested(ds, path, value):
    p = ds / "metadata.json"
    d = json.loads(p.read_text())
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    p.write_text(json.dumps(d, indent=2))


def _get(ds, path):
    node = json.loads((ds / "metadata.json").read_text())
    for k in path:
        node = node.get(k) if isinstance(node, dict) else None
    return node


def test_the_written_digests_are_recomputable(packed):
    from seqpack.io.fingerprint import metadata_digest, sha256_file

    meta = load_packed(packed, verify=True).metadata
    written = json.loads((packed / "metadata.json").read_text())
    assert meta.metadata_sha256 == metadata_digest(meta) == metadata_digest(written)
    assert meta.report_sha256 == sha256_file(packed / "report.jsonl")


@pytest.mark.parametrize("path,value", [
    (("counts", "samples_packed"), 1), (("counts", "dropped"), {"too_long": 3}), (("columns",), ["input_ids"]),
    (("seqpack_version",), "0.0.1"), (("packing_efficiency",), 0.999), (("lower_bound",), 0),
    (("extra", "note"), "edited"), (("hand_added_key",), 1), (("created_at",), "2020-01-01T00:00:00Z"),
    (("inputs",), []),
])
def test_edited_informational_keys_fail_verify(packed, tmp_path, path, value):
    ds = _copy(packed, tmp_path)
    assert _get(ds, path) != value  # a real edit, schema-valid: only the digest can tell
    _edit_nested(ds, path, value)
    load_packed(ds)  # schema-valid: opens without verification
    with pytest.raises(PackedDatasetError, match="edited after packing") as e:
        load_packed(ds, verify=True)
    assert "Re-pack" in str(e.value)


def test_only_the_engine_section_is_outside_the_digest(packed, tmp_path):
    ds = _copy(packed, tmp_path)
    _edit_nested(ds, ("extra", "engine"), {"name": "ray", "workers": 2})
    assert load_packed(ds, verify=True).metadata.extra["engine"]["name"] == "ray"


def test_an_edited_or_missing_report_fails_verify(packed, tmp_path):
    ds = _copy(packed, tmp_path)
    with open(ds / "report.jsonl", "a", encoding="utf-8") as f:
        f.write('{"sample_id": "x", "action": "dropped", "reason": "invented"}\n')
    with pytest.raises(PackedDatasetError, match="report.jsonl was edited after packing"):
        load_packed(ds, verify=True)
    (ds / "report.jsonl").unlink()
    with pytest.raises(PackedDatasetError, match="report.jsonl is missing"):
        load_packed(ds, verify=True)


def test_a_file_added_to_data_fails_verify(packed, tmp_path):
    import shutil

    ds = _copy(packed, tmp_path)
    assert load_packed(ds, verify=True).metadata.shards[0].file == "data/shard-00000.parquet"
    shutil.copy(ds / "data" / "shard-00000.parquet", ds / "data" / "shard-00099.parquet")
    with pytest.raises(PackedDatasetError) as ei:
        load_packed(ds, verify=True)
    assert str(ei.value) == (f"{ds}: data/shard-00099.parquet in data/ is not a shard metadata.json lists (added "
                             "after packing). Remove it, or re-pack the data")
    assert len(load_packed(ds)) == len(load_packed(packed))  # without verify the listed shards are served


def test_a_dataset_without_the_digests_is_not_called_verified(packed, tmp_path):
    ds = _copy(packed, tmp_path)
    p = ds / "metadata.json"
    d = json.loads(p.read_text())
    del d["metadata_sha256"], d["report_sha256"]  # as an older seqpack wrote it
    p.write_text(json.dumps(d))
    assert load_packed(ds).metadata.num_packs == d["num_packs"]  # an older dataset still reads
    with pytest.raises(PackedDatasetError, match="no metadata_sha256.*older seqpack.*re-pack"):
        load_packed(ds, verify=True)
    d["metadata_sha256"] = json.loads((packed / "metadata.json").read_text())["metadata_sha256"]
    p.write_text(json.dumps(d))  # a removed report_sha256 is an edit like any other
    with pytest.raises(PackedDatasetError, match="edited after packing"):
        load_packed(ds, verify=True)


@pytest.mark.parametrize("key,value,named", [
    ("seq_length", "4096", "seq_length"),
    ("seq_length", 0, "seq_length"),
    ("seq_length", True, "seq_length"),
    ("num_packs", -1, "num_packs"),
    ("effective_pad_multiple", 3, "effective_pad_multiple=3"),
    ("shards.0.file", "../../etc/passwd.parquet", "shards.0.file"),
    ("shards.0.file", "/abs/shard.parquet", "shards.0.file"),
    ("shards.0.sha256", "../../../../tmp/evil", "shards.0.sha256"),
    ("shards.0.num_rows", "many", "shards.0.num_rows"),
    ("fingerprint", "../x", "fingerprint"),
    ("shards", {"file": "x"}, "shards"),
])
def test_malformed_metadata_is_one_error_naming_the_key(packed, tmp_path, key, value, named):
    ds = _copy(packed, tmp_path)
    _edit(ds, **{key: value})
    with pytest.raises(PackedDatasetError) as e:
        load_packed(ds)
    assert named in str(e.value) and "metadata.json is not valid" in str(e.value)


@pytest.mark.parametrize("text", ["{" * 100000, '{"format_version": 1, "seq_length": ' + "9" * 5000 + "}",
                                  "\udcff"])
def test_unparseable_metadata_is_a_packed_dataset_error(packed, tmp_path, text):
    ds = _copy(packed, tmp_path)
    (ds / "metadata.json").write_text(text, encoding="utf-8", errors="surrogateescape")
    with pytest.raises(PackedDatasetError, match="not valid JSON"):
        load_packed(ds)


def test_a_shard_symlinked_outside_the_folder_is_refused(packed, tmp_path):
    ds = _copy(packed, tmp_path)
    shard = next((ds / "data").glob("*.parquet"))
    outside = tmp_path / "outside.parquet"
    shard.rename(outside)
    shard.symlink_to(outside)
    with pytest.raises(PackedDatasetError, match="outside the dataset folder"):
        load_packed(ds)


def test_verify_never_serves_a_cache_built_before_the_check(packed, tmp_path):
    ds = _copy(packed, tmp_path)
    first = load_packed(ds)
    want = np.asarray(first[0].input_ids).copy()
    cache = next((ds / ".cache").glob("*.arrow"))
    # plant a cache with other tokens (a stale or tampered cache of the same name)
    with pa.OSFile(str(cache), "rb") as f:
        table = pa.ipc.open_file(f).read_all()
    ids = table.column("input_ids").combine_chunks()
    bad = pa.ListArray.from_arrays(ids.offsets, pa.array(np.zeros(len(ids.values), np.int32)))
    table = table.set_column(table.schema.get_field_index("input_ids"), "input_ids", bad)
    planted = cache.with_name("planted")
    with pa.OSFile(str(planted), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    os.replace(planted, cache)  # a new file: the first dataset's memory map keeps the old one
    assert not np.array_equal(np.asarray(load_packed(ds)[0].input_ids), want)  # without verify: the cache
    assert np.array_equal(np.asarray(load_packed(ds, verify=True)[0].input_ids), want)
    assert np.array_equal(np.asarray(load_packed(ds)[0].input_ids), want)  # and the cache is repaired


def test_the_temp_cache_is_private_to_the_user(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    root = private_cache_root()
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    root.chmod(0o777)
    with pytest.raises(PackedDatasetError, match="not private to this user"):
        private_cache_root()
    root.rmdir()
    (tmp_path / "elsewhere").mkdir()
    root.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PackedDatasetError, match="not private"):
        private_cache_root()


@pytest.mark.parametrize("line,problem", [
    ("{not json", "not JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("[1, 2]", "it is an array, not a JSON object"),
    ('{"status": "dropped", "reason": "overlength"}', "it has no 'sample_id'"),
    ('{"sample_id": "a:1", "status": "dropped", "reason": "overlength", "index": "3"}',
     "its 'index' is \"3\", not an integer or null"),
    ('{"sample_id": "a:1", "status": "dropped", "reason": "overlength", "tokens_before": true}',
     "its 'tokens_before' is true, not an integer or null"),
])
def test_a_damaged_report_line_names_the_file_line_and_fix(packed, tmp_path, line, problem):
    ds = _copy(packed, tmp_path)
    report = ds / "report.jsonl"
    good = load_packed(ds).report()
    with open(report, "a", encoding="utf-8") as f:
        f.write("\n" + line + "\n")  # a blank line is skipped, not counted as an entry
    n = len(report.read_text(encoding="utf-8").splitlines())
    with pytest.raises(PackedDatasetError) as ei:
        load_packed(ds).report()
    assert str(ei.value) == (f"{report} line {n}: {problem}. report.jsonl was edited or damaged after packing; "
                             f"re-pack, or check it with `seqpack inspect {ds} --verify`")
    report.write_text("".join(json.dumps(e) + "\n" for e in good), encoding="utf-8")
    assert load_packed(ds).report() == good  # the packer's own lines read back as written


def test_a_report_line_that_is_not_utf8_is_named(packed, tmp_path):
    ds = _copy(packed, tmp_path)
    report = ds / "report.jsonl"
    n = len(report.read_bytes().splitlines()) + 1
    with open(report, "ab") as f:
        f.write(b'{"sample_id": "a\xff", "status": "dropped", "reason": "overlength"}\n')
    with pytest.raises(PackedDatasetError) as ei:
        load_packed(ds).report()
    assert str(ei.value).startswith(f"{report} line {n}: not valid UTF-8 (byte 0xff at byte column 17). ")


def test_every_report_field_has_a_known_json_type():
    from dataclasses import fields

    from seqpack.accounting import SampleRecord
    from seqpack.io.report_file import _FIELD_TYPES

    assert {str(f.type) for f in fields(SampleRecord)} <= set(_FIELD_TYPES)  # a new field type needs its entry
