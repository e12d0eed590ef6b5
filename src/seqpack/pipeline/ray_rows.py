"""The Arrow layout the Ray engine moves rows in: sample rows, built pack rows and one summary row per
shard share one schema; the driver reads built packs back in pack order (:func:`iter_pack_rows`)."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from seqpack.packed import PackedSequence

__all__ = ["KIND_ROW", "KIND_SHARD", "iter_pack_rows", "list_column", "pack_rows", "rows_table"]

KIND_ROW = 0  # a sample row (global planning) or a built pack row (per-shard planning)
KIND_SHARD = 1  # one summary row per shard: its prepare result (no samples), lengths, per-shard plan


def list_column(arrs: list[np.ndarray], pa: Any, value_type: Any) -> Any:
    """A ``large_list<value_type>`` Arrow column of the 1-D arrays ``arrs``."""
    lengths = np.fromiter((len(a) for a in arrs), dtype=np.int64, count=len(arrs))
    offsets = np.zeros(len(arrs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    dt = np.dtype(value_type.to_pandas_dtype())
    values = np.concatenate(arrs).astype(dt, copy=False) if arrs else np.zeros(0, dt)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, value_type))


def rows_table(pa: Any, kind: int, shard: int, local: np.ndarray, cols: dict[str, Any], summary: bytes | None = None):
    """One Arrow table with a fixed schema (sample rows, pack rows and shard rows share it)."""
    n = len(local)
    return pa.table(
        {
            "kind": pa.array(np.full(n, kind, np.int8)),
            "shard": pa.array(np.full(n, shard, np.int32)),
            "local": pa.array(np.asarray(local, np.int64)),
            "input_ids": cols.get("input_ids", pa.nulls(n, pa.large_list(pa.int32()))),
            "labels": cols.get("labels", pa.nulls(n, pa.large_list(pa.int32()))),
            "cu_seqlens": cols.get("cu_seqlens", pa.nulls(n, pa.large_list(pa.int32()))),
            "cu_seqlens_padded": cols.get("cu_seqlens_padded", pa.nulls(n, pa.large_list(pa.int32()))),
            "sample_ids": cols.get("sample_ids", pa.nulls(n, pa.large_list(pa.string()))),
            "summary": pa.array([summary] * n, pa.large_binary()),
        }
    )


def pack_rows(pa: Any, shard: int, local: np.ndarray, packs: list):
    """Built ``PackedSequence`` rows as one Arrow table (row ``i`` has global id ``first_pack[shard] + local[i]``)."""
    cols = {
        "input_ids": list_column([p.input_ids for p in packs], pa, pa.int32()),
        "labels": list_column([p.labels for p in packs], pa, pa.int32()),
        "cu_seqlens": list_column([p.cu_seqlens for p in packs], pa, pa.int32()),
        "cu_seqlens_padded": list_column([p.cu_seqlens_padded for p in packs], pa, pa.int32()),
        "sample_ids": pa.array([list(p.sample_ids) for p in packs], pa.large_list(pa.string())),
    }
    return rows_table(pa, KIND_ROW, shard, local, cols)


def iter_pack_rows(ds: Any, first_pack: np.ndarray, num_packs: int) -> Iterator[Any]:
    """Yield the built packs of ``ds`` as ``PackedSequence`` rows in global pack order.

    A row's global pack id is ``first_pack[shard] + local``. Ray Data may deliver blocks out of order;
    rows that arrive early wait in a small reorder buffer (blocks are produced in nearly sorted order,
    so the buffer stays small), and no distributed sort is needed.

    Raises:
        RuntimeError: a pack is missing or duplicated (never silently dropped).
    """
    pending: dict[int, Any] = {}
    nxt = 0
    for b in ds.iter_batches(batch_format="pyarrow", batch_size=64):
        gid = first_pack[b.column("shard").to_numpy()] + b.column("local").to_numpy()
        cols = {c: b.column(c) for c in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded", "sample_ids")}
        for i in range(b.num_rows):
            g = int(gid[i])
            if g in pending or g < nxt:
                raise RuntimeError(f"ray engine: pack {g} was built twice")
            pending[g] = PackedSequence.from_boundaries(
                cols["input_ids"][i].values.to_numpy(zero_copy_only=False),
                cols["labels"][i].values.to_numpy(zero_copy_only=False),
                cols["cu_seqlens"][i].values.to_numpy(zero_copy_only=False),
                cols["cu_seqlens_padded"][i].values.to_numpy(zero_copy_only=False),
                sample_ids=cols["sample_ids"][i].as_py(),
            )
            while nxt in pending:
                yield pending.pop(nxt)
                nxt += 1
    if nxt != num_packs or pending:
        raise RuntimeError(f"ray engine: {nxt} of {num_packs} packs arrived in order; missing pack {nxt}")
