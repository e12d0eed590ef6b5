"""Crafted rows: boundary arrays and token ids from a file are checked before use; the only errors are
PackedDatasetError (naming the shard and row) and PackedSequenceError (naming the invariant)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack import load_packed, pack_dataset
from seqpack.io import PackedDatasetError
from seqpack.io.fingerprint import metadata_digest, sha256_file
from seqpack.packed import PackedSequence
from seqpack.packed.invariants import PackedSequenceError, stored_row_problem


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "packed"
    pack_dataset(output=str(out), seq_length=256, progress=None)
    return out


def _craft(packed, tmp_path, column, value):
    ds = tmp_path / "craft"
    shutil.copytree(packed, ds)
    meta = json.loads((ds / "metadata.json").read_text())
    shard = ds / meta["shards"][0]["file"]
    table = pq.read_table(shard)
    col = table.column(column).to_pylist()
    col[0] = value
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(col, table.schema.field(column).type))
    pq.write_table(table, shard)
    _reseal(ds, meta, shard)
    return ds


def _reseal(ds, meta, shard):
    """Record the crafted shard's size and sha256 and the new metadata_sha256, as someone who recomputes
    every hash would (so ``verify=True`` passes)."""
    meta["shards"][0]["num_bytes"], meta["shards"][0]["sha256"] = shard.stat().st_size, sha256_file(shard)
    meta["metadata_sha256"] = metadata_digest(meta)
    (ds / "metadata.json").write_text(json.dumps(meta))


def test_inspect_verify_checks_every_row_even_when_the_hashes_were_recomputed(packed, tmp_path):
    """A label on a segment's last token (a target that would cross into the next sample) passes the
    read-time checks (boundaries, token ranges) and all hashes, but not the invariants: ``seqpack inspect
    --verify`` names the pack; the untouched dataset passes."""
    from typer.testing import CliRunner

    from seqpack.cli import app

    good = CliRunner().invoke(app, ["inspect", str(packed), "--verify", "--no-plot"])
    n = len(load_packed(packed))
    assert good.exit_code == 0 and f"and the invariants of {n} pack(s)" in " ".join(good.output.split())
    row = load_packed(packed)[0]
    last = np.asarray(row.cu_seqlens[1:]) - 1
    free = [int(t) for t in last if row.labels[t] == -100]
    assert free, "the embedded sample's segments end without a target"
    labels = row.labels.copy()
    labels[free[0]] = 7
    ds = _craft(packed, tmp_path, "labels", labels.tolist())
    load_packed(ds, verify=True)[0]  # hashes and read-time checks pass: only the invariants catch it
    res = CliRunner().invoke(app, ["inspect", str(ds), "--verify", "--no-plot"])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert ("pack 0 (row 0 of shard data/shard-00000.parquet) is not a valid packed row: packed-batch-spec "
            "invariant 7 violated: labels[") in text, text


@pytest.mark.parametrize("column,value,says", [
    ("cu_seqlens", [], "cu_seqlens has 0 entries"),
    ("cu_seqlens_padded", [5, 3], "does not start at 0 and increase"),
    ("cu_seqlens_padded", [0, 99999], "cu_seqlens_padded[-1]=99999"),
    ("final_target_segments", [7], "final_target_segments [7]"),
])
def test_crafted_boundaries_are_one_error_naming_shard_and_row(packed, tmp_path, column, value, says):
    ds = load_packed(_craft(packed, tmp_path, column, value))
    with pytest.raises(PackedDatasetError) as e:
        ds[0]
    assert says in str(e.value) and "row 0 of shard data/shard-00000.parquet" in str(e.value)


@pytest.mark.parametrize("column,first,says", [
    ("input_ids", -3, "input_ids[0]=-3 is negative"),
    ("labels", -7, "labels[0]=-7 is negative and not the ignore index -100"),
])
def test_negative_token_ids_are_never_served(packed, tmp_path, column, first, says):
    """A crafted negative id (invariant 11) is refused when the row is read, not handed to the embedding."""
    stored = load_packed(packed).columns(0)[column].tolist()
    ds = load_packed(_craft(packed, tmp_path, column, [first] + stored[1:]))
    with pytest.raises(PackedDatasetError) as e:
        ds[0]
    assert says in str(e.value) and "row 0 of shard data/shard-00000.parquet" in str(e.value)


def test_media_column_that_is_not_json_names_shard_and_row(packed, tmp_path):
    ds = load_packed(_craft(packed, tmp_path, "media", '{"not": "a list"'))
    with pytest.raises(PackedDatasetError, match=r"row 0 of shard data/shard-00000.parquet\) has a media column "
                                                 r"that is not JSON"):
        ds[0]


def test_token_ids_are_checked_against_the_vocabulary(packed, tmp_path):
    ds = load_packed(packed)
    row = ds[0]
    row.validate(vocab_size=151_936)
    with pytest.raises(PackedSequenceError, match=r"invariant 11 .*input_ids\[\d+\]=\d+ is outside the vocabulary"):
        row.validate(vocab_size=int(row.input_ids.max()))
    with pytest.raises(PackedSequenceError, match=r"invariant 11 .*labels\[1\]=-7 is negative"):
        PackedSequence.from_boundaries(row.input_ids, np.r_[row.labels[:1], -7, row.labels[2:]], row.cu_seqlens,
                                       row.cu_seqlens_padded, sample_ids=row.sample_ids).validate()
    for wrong in (0, -5, True, 1.5, "151936"):
        with pytest.raises(ValueError, match="vocab_size must be a positive integer"):
            row.validate(vocab_size=wrong)


_ints = st.lists(st.integers(-3, 40), max_size=6)


@settings(max_examples=300, deadline=None)
@given(cu=_ints, cup=_ints, n_ids=st.integers(0, 40), n_sid=st.integers(0, 6), ft=st.lists(st.integers(-2, 6), max_size=3))
def test_random_boundaries_never_raise_anything_else(cu, cup, n_ids, n_sid, ft):
    problem = stored_row_problem(cu, cup, n_ids, n_ids, n_sid, ft)
    if problem is not None:
        assert isinstance(problem, str)
        return
    ids = np.arange(n_ids) % 7
    has_ft = np.zeros(len(cu) - 1, bool)
    has_ft[np.asarray(ft, np.int64)] = True
    try:
        row = PackedSequence.from_boundaries(ids, ids.copy(), np.array(cu), np.array(cup),
                                             sample_ids=[str(i) for i in range(n_sid)], has_final_target=has_ft)
        row.validate()
    except (PackedSequenceError, ValueError) as e:  # from_boundaries' own refusals are ValueErrors with a message
        assert str(e)
