"""PackedWriter writes a shard row group by row group: the bytes equal one ``pyarrow.parquet.write_table``
of all the shard's rows with the same ``row_group_size`` (the layout of a whole-shard write)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.io import SCHEMA, PackedMetadata, write_packed
from seqpack.io.writer import _row_arrays
from seqpack.packed import build_packed_sequence
from seqpack.sample import Sample, shift_labels


def _row(k: int):
    ss = []
    for j, n in enumerate((3 + k % 5, 1 + k % 3)):
        ids = np.arange(1 + k, 1 + k + n, dtype=np.int32)
        ss.append(Sample(ids, shift_labels(ids, np.arange(n) > 0), sample_id=f"r{k}:{j}", source="hand", index=k))
    return build_packed_sequence(ss, pad_to_multiple_of=1, pad_token_id=0, seq_length=16)


def test_shard_bytes_equal_a_whole_shard_write(tmp_path):
    rows = [_row(k) for k in range(15)]  # shards of 6, 6, 3 rows; row groups of 4, 2 / 4, 2 / 3
    meta = PackedMetadata(seq_length=16, pad_to_multiple_of=1, context_parallel_size=1, effective_pad_multiple=1,
                          algorithm="first_fit_decreasing", tokenizer_hash="abc", pad_token_id=0)
    meta = write_packed(rows, tmp_path / "ds", meta, rows_per_shard=6, row_group_size=4)
    assert [s.num_rows for s in meta.shards] == [6, 6, 3]
    for k, shard in enumerate(meta.shards):
        path = tmp_path / "ds" / shard.file
        assert [pq.ParquetFile(path).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(path).num_row_groups)] \
            == [[4, 2], [4, 2], [3]][k]
        cols = [_row_arrays(r) for r in rows[6 * k: 6 * k + shard.num_rows]]
        whole = pa.Table.from_pylist([{c: (v.tolist() if hasattr(v, "tolist") else v) for c, v in d.items()} for d in cols],
                                     schema=SCHEMA)
        pq.write_table(whole, tmp_path / f"whole-{k}.parquet", row_group_size=4, compression="zstd")
        assert path.read_bytes() == (tmp_path / f"whole-{k}.parquet").read_bytes()
