"""The offline format keeps which segments carry an explicit final target (B12), so a label that
crosses into the next segment (B03) is still caught after a write/read round trip."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seqpack.sample import IGNORE_INDEX, Sample, shift_labels
from seqpack.io import PackedMetadata, load_packed, write_packed
from seqpack.packed import PackedSequenceError, build_packed_sequence


def _meta() -> PackedMetadata:
    return PackedMetadata(seq_length=16, pad_to_multiple_of=1, context_parallel_size=1, effective_pad_multiple=1,
                          algorithm="first_fit_decreasing", tokenizer_hash="abc", pad_token_id=0)


def _row():
    a_ids = np.array([11, 12, 13], np.int32)
    # A was truncated: its last slot predicts the first dropped token (99), an explicit final target (B12)
    a = Sample(a_ids, shift_labels(a_ids, np.ones(3, bool), final_target=99), sample_id="a")
    b_ids = np.array([21, 22], np.int32)
    b = Sample(b_ids, shift_labels(b_ids, np.ones(2, bool)), sample_id="b")
    return build_packed_sequence([a, b], pad_token_id=0, seq_length=16)


def test_B12_final_target_survives_round_trip(tmp_path):
    row = _row()
    write_packed([row], tmp_path / "ds", _meta())
    back = load_packed(tmp_path / "ds")[0]
    assert back.extra["has_final_target"].tolist() == [True, False]
    assert back.labels.tolist()[:5] == [12, 13, 99, 22, IGNORE_INDEX]
    back.validate(capacity=16)
    stored = pq.read_table(next((tmp_path / "ds" / "data").glob("*.parquet")))
    assert stored.column("final_target_segments").to_pylist() == [[0]]


def test_B03_crossing_label_on_disk_is_caught_after_read(tmp_path):
    """A row whose last label of B (no final target) was edited to a real token is refused on read-back."""
    row = _row()
    write_packed([row], tmp_path / "ds", _meta())
    shard = next((tmp_path / "ds" / "data").glob("*.parquet"))
    t = pq.read_table(shard)
    labels = t.column("labels").to_pylist()
    labels[0][4] = 5  # B's last real slot now "predicts" a token: a label crossing the boundary
    t = t.set_column(t.column_names.index("labels"), "labels", pa.array(labels, pa.list_(pa.int32())))
    pq.write_table(t, shard)
    # keep the dataset self-consistent (as a buggy writer would have produced it)
    meta_path = tmp_path / "ds" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for sh in meta["shards"]:
        sh["num_bytes"] = shard.stat().st_size
        if "sha256" in sh:
            sh["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))
    back = load_packed(tmp_path / "ds")[0]
    assert back.extra["has_final_target"].tolist() == [True, False]
    with pytest.raises(PackedSequenceError, match="7"):
        back.validate(capacity=16)
