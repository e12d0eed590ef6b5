"""Boundary arrays of a packed row and the per-slot fields they imply (numpy; torch only at the edges).

``cu_seqlens`` int32 ``[N+1]`` holds logical (real-token) boundaries, ``cu_seqlens_padded`` int32 ``[N+1]``
physical ones (last == ``T``). Every per-slot field (positions, padding mask, segment index) is derived
from them here, never from token values (``packed-batch-spec.md``, invariant 10).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["trim_cu_seqlens", "segment_fields", "real_boundaries", "concat_boundaries"]


def segment_fields(cu_seqlens_padded, real_lens) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-slot fields implied by the boundaries (the one implementation).

    Args:
        cu_seqlens_padded: int [n+1] physical segment starts, ``[-1]`` = row length T.
        real_lens: int [n] real tokens per segment (``<=`` its padded length; 0 = all padding).

    Returns:
        ``(position_ids int64 [T], padding_mask bool [T] (True = pad), seq_idx int32 [T])``:
        positions restart at 0 on every segment start and keep counting through its padding.
    """
    cup = np.asarray(cu_seqlens_padded, dtype=np.int64)
    seg_len = np.diff(cup)
    t = int(cup[-1])
    position_ids = np.arange(t, dtype=np.int64) - np.repeat(cup[:-1], seg_len)
    padding_mask = position_ids >= np.repeat(np.asarray(real_lens, dtype=np.int64), seg_len)
    seq_idx = np.repeat(np.arange(seg_len.shape[0], dtype=np.int32), seg_len)
    return position_ids, padding_mask, seq_idx


def trim_cu_seqlens(cu_seqlens, num_segments: int | None = None):
    """Drop static-shape padding from a boundary array (case B19: fixed-width boundary arrays).

    Handles the two fixed-width encodings seen in the field: ``-1`` sentinels
    (``[0, 5, 8, -1, -1]``, Megatron-Bridge packed Parquet) and repeated-last padding
    (``[0, 5, 8, 8, 8]``, this spec's CUDA-graph mode). An unpadded array is returned unchanged
    (``[0, 5, 8]`` stays ``[0, 5, 8]``; never an empty array, unlike an ``argmin`` fallback).

    Args:
        cu_seqlens: 1-D integer array (numpy or torch), starting at 0.
        num_segments: the true segment count ``N`` when it is carried as metadata (preferred: the
            valid count is then taken from it, not re-derived); ``None`` derives it.

    Returns:
        Contiguous 1-D int32 array of ``N + 1`` entries starting at 0 (a torch tensor when the
        input is a torch tensor, on the same device).

    Raises:
        ValueError: not 1-D, empty, not starting at 0, or ``num_segments`` out of range.
    """
    is_torch = type(cu_seqlens).__module__.startswith("torch")
    arr = cu_seqlens.detach().cpu().numpy() if is_torch else np.asarray(cu_seqlens)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"cu_seqlens must be a non-empty 1-D array, got shape {arr.shape}")
    if int(arr[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {arr[:4].tolist()}...")
    if num_segments is not None:
        n = int(num_segments)
        if n < 0 or n + 1 > arr.shape[0]:
            raise ValueError(f"num_segments={n} does not fit a boundary array of {arr.shape[0]} entries")
        end = n + 1
    else:
        neg = np.flatnonzero(arr < 0)
        end = int(neg[0]) if neg.size else arr.shape[0]
        # repeated-last padding: keep the first occurrence of the final value
        last = arr[end - 1]
        while end > 1 and arr[end - 2] == last:
            end -= 1
    out = np.ascontiguousarray(arr[:end], dtype=np.int32)
    if is_torch:
        import torch

        return torch.from_numpy(out).to(cu_seqlens.device)
    return out


def real_boundaries(pack: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """``(cu_seqlens, cu_seqlens_padded, N)`` of a row, int64, trimmed to its true segment count.

    Args:
        pack: a ``PackedSequence`` or any object with ``cu_seqlens``, ``cu_seqlens_padded`` and
            optionally ``num_segments`` (when > 0 it gives ``N`` of static-padded arrays).
    """
    cu = np.asarray(pack.cu_seqlens, dtype=np.int64)
    cup = np.asarray(pack.cu_seqlens_padded, dtype=np.int64)
    n = int(getattr(pack, "num_segments", 0) or (len(cu) - 1))
    return cu[: n + 1], cup[: n + 1], n


def concat_boundaries(rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries of rows laid end to end (one THD row of ``sum T_i`` slots).

    Row ``i``'s physical boundaries are offset by the widths of the rows before it and its logical ones by
    their real-token counts, so segment ``s`` keeps real length ``cu[s+1] - cu[s]`` at slot offset
    ``cup[s]`` (Transformer Engine THD-with-padding semantics).

    Args:
        rows: ``(cu_seqlens, cu_seqlens_padded)`` per row, int ``[N_i + 1]``, trimmed, starting at 0.

    Returns:
        ``(cu_seqlens, cu_seqlens_padded)`` int64 ``[sum N_i + 1]``.
    """
    cu_parts, cup_parts = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    log_off = off = 0
    for cu, cup in rows:
        cu = np.asarray(cu, np.int64)
        cup = np.asarray(cup, np.int64)
        cu_parts.append(cu[1:] + log_off)
        cup_parts.append(cup[1:] + off)
        log_off += int(cu[-1])
        off += int(cup[-1])
    return np.concatenate(cu_parts), np.concatenate(cup_parts)
