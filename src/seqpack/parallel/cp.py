"""Context-parallel (CP) slicing of packed THD rows: per-segment zigzag, as Transformer Engine expects.

Every segment of a packed row (by its *padded* boundaries ``cu_seqlens_padded``) is cut into
``2*CP`` equal chunks; CP rank ``r`` holds chunks ``r`` and ``2*CP-1-r`` of every segment, in
segment order. This is the load-balanced THD layout of Transformer Engine's context-parallel
attention (``get_batch_on_this_cp_rank`` / ``thd_get_partitioned_indices`` in TE and Megatron-Core):
each rank gets the same number of tokens and, per segment, one "early" and one "late" chunk, so the
causal attention work is balanced. Splitting the whole row as if it were one sequence is wrong
for packed rows (case B21).

The index array returned by :func:`cp_partition_indices` is *global* (slot numbers in the
pre-CP row); the same array slices every per-token field (case B22), so per-token tables (RoPE
frequencies, multi-axis positions) are looked up at global offsets. Boundary arrays and
``max_seqlen`` stay global: TE takes the global ``cu_seqlens``/``cu_seqlens_padded`` and works out
each rank's share itself.

Works with numpy arrays and torch tensors (torch imported lazily).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from seqpack.packed import PackedSequence, trim_cu_seqlens
from seqpack.padding import check_positive_int, check_seq_length, compute_pad_multiple
from seqpack.sample import TOKEN_FIELDS

__all__ = [
    "CPConfigError",
    "PER_TOKEN_FIELDS",
    "check_divisibility",
    "cp_partition_indices",
    "cp_local_cu_seqlens_padded",
    "slice_for_cp",
    "gather_from_cp",
    "validate_cp_attention",
    "CP_BOUNDARY_AWARE_BACKENDS",
    "CP_BOUNDARY_BLIND_BACKENDS",
]

#: Per-token fields of a packed row (sliced by CP with one index array): :data:`seqpack.sample.TOKEN_FIELDS`.
PER_TOKEN_FIELDS = TOKEN_FIELDS


class CPConfigError(ValueError):
    """A context-parallel configuration that would silently corrupt training (names the config keys)."""


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _to_numpy_int(x) -> np.ndarray:
    if _is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def check_divisibility(
    seq_length: int,
    multiple: int,
    *,
    pad_to_multiple_of: int | None = None,
    context_parallel_size: int | None = None,
    tensor_model_parallel_size: int | None = None,
    sequence_parallel: bool | None = None,
) -> None:
    """Reject a capacity that is not a multiple of the pad multiple, before any data is touched (case B23).

    Args:
        seq_length: pack capacity in tokens.
        multiple: the pad multiple from :func:`seqpack.padding.compute_pad_multiple`.
        pad_to_multiple_of, context_parallel_size, tensor_model_parallel_size, sequence_parallel:
            the settings ``multiple`` came from (only used to name them in the error).

    Raises:
        CPConfigError: ``seq_length % multiple != 0``; the message names ``seq_length``, the keys
            behind the multiple, and the two nearest valid capacities.
    """
    check_positive_int(multiple, "pad multiple", error=CPConfigError)
    check_positive_int(seq_length, error=CPConfigError)
    check_seq_length(
        seq_length, multiple,
        {"pad_to_multiple_of": pad_to_multiple_of, "context_parallel_size": context_parallel_size,
         "tensor_model_parallel_size": tensor_model_parallel_size, "sequence_parallel": sequence_parallel},
        error=CPConfigError,
    )


def cp_partition_indices(cu_seqlens_padded, cp_size: int, cp_rank: int) -> np.ndarray:
    """Global slot indices held by one CP rank (per-segment zigzag).

    Args:
        cu_seqlens_padded: int [N+1] physical boundaries of the (pre-CP) row (numpy or torch; a
            static-padded array with ``-1`` sentinels or repeated last values is trimmed first).
        cp_size: CP world size >= 1.
        cp_rank: this rank, ``0 <= cp_rank < cp_size``.

    Returns:
        ``np.ndarray[int64]`` of length ``T / cp_size``: for every segment ``i`` with chunk size
        ``c_i = padded_len_i / (2*cp_size)``, the slots of chunk ``cp_rank`` then of chunk
        ``2*cp_size-1-cp_rank``, segments in order (``arange(T)`` when ``cp_size == 1``).
        Example (case B21): two segments of 8, CP=2 ->
        rank 0 ``[0,1,6,7,8,9,14,15]``, rank 1 ``[2,3,4,5,10,11,12,13]``.

    Raises:
        ValueError: bad sizes; a padded segment length not divisible by ``2*cp_size`` (names the
            segment and the fix: build rows with ``pad_to_multiple_of=compute_pad_multiple(...)``).
    """
    if int(cp_size) != cp_size or cp_size < 1:
        raise ValueError(f"context_parallel_size must be an integer >= 1, got {cp_size!r}")
    if not (0 <= cp_rank < cp_size):
        raise ValueError(f"cp_rank={cp_rank} out of range for context_parallel_size={cp_size}")
    cup = trim_cu_seqlens(_to_numpy_int(cu_seqlens_padded)).astype(np.int64)
    lens = np.diff(cup)
    if np.any(lens < 0):
        raise ValueError(f"cu_seqlens_padded must be non-decreasing, got {cup.tolist()[:16]}")
    if cp_size == 1:  # no CP: the identity (no 2-chunk split needed, as in TE / Megatron-Core)
        return np.arange(int(cup[-1]), dtype=np.int64)
    k = 2 * int(cp_size)
    bad = np.flatnonzero(lens % k)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"segment {i} has padded length {int(lens[i])} (cu_seqlens_padded[{i}:{i + 2}]="
            f"{cup[i:i + 2].tolist()}), not divisible by 2*context_parallel_size={k}; build the rows with "
            f"pad_to_multiple_of=seqpack.padding.compute_pad_multiple(context_parallel_size={cp_size}, ...) "
            f"(= {compute_pad_multiple(context_parallel_size=cp_size)}) and re-pack"
        )
    c = lens // k
    per_seg = 2 * c
    total = int(per_seg.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    out_start = np.concatenate([[0], np.cumsum(per_seg)[:-1]])
    seg_start_rep = np.repeat(cup[:-1], per_seg)
    c_rep = np.repeat(c, per_seg)
    kk = np.arange(total, dtype=np.int64) - np.repeat(out_start, per_seg)
    r = int(cp_rank)
    idx = seg_start_rep + np.where(kk < c_rep, r * c_rep + kk, (k - 1 - r) * c_rep + (kk - c_rep))
    return idx.astype(np.int64)


def cp_local_cu_seqlens_padded(cu_seqlens_padded, cp_size: int) -> np.ndarray:
    """Rank-local physical boundaries of a CP slice: ``cu_seqlens_padded // cp_size`` (int32 [N+1]).

    Every rank holds ``padded_len_i / cp_size`` slots of segment ``i`` (two chunks), contiguous and in
    segment order, so the local boundaries are the global ones divided by CP. Transformer Engine
    derives these itself from the global arrays (pass it the global ones); this helper is for kernels
    that take rank-local varlen boundaries (e.g. a per-rank flash-attn varlen call over the local
    queries). Same for every rank.

    Raises:
        ValueError: as :func:`cp_partition_indices` (a segment not divisible by ``2*cp_size``).
    """
    cup = trim_cu_seqlens(_to_numpy_int(cu_seqlens_padded)).astype(np.int64)
    cp_partition_indices(cup, cp_size, 0)  # validates divisibility with a readable error
    return np.ascontiguousarray(cup // int(cp_size), dtype=np.int32)


def _take(x, idx: np.ndarray, axis: int):
    if _is_torch(x):
        import torch

        return torch.index_select(x, axis, torch.as_tensor(idx, dtype=torch.long, device=x.device))
    return np.take(np.asarray(x), idx, axis=axis)


def _token_axis(shape, t: int) -> int | None:
    """Axis that holds the token dimension: last axis if it has length T, else axis 0, else None."""
    if len(shape) == 0:
        return None
    if shape[-1] == t:
        return len(shape) - 1
    if shape[0] == t:
        return 0
    return None


def slice_for_cp(packed, cp_size: int, cp_rank: int):
    """Slice a packed row for one CP rank (zigzag per segment; boundaries stay global).

    Args:
        packed: a :class:`PackedSequence` (numpy) or a mapping of arrays / tensors such as
            ``PackedSequence.to_torch()`` or a collated ``[1, T]`` batch. In a mapping every array
            whose last axis (else first axis) has length ``T = len(input_ids)`` is a per-token field;
            ``cu_seqlens*``, ``seq_lens``, ``max_seqlen`` and scalars are copied unchanged.
        cp_size: CP world size.
        cp_rank: this rank.

    Returns:
        Same kind as the input. For a PackedSequence: per-token fields (``input_ids, labels,
        loss_mask, position_ids, padding_mask, seq_idx`` and per-token tables in ``extra``) of length
        ``T / cp_size``; ``cu_seqlens``, ``cu_seqlens_padded``, ``seq_lens``, ``max_seqlen`` global;
        ``extra['cp_indices']`` (int64 global slots), ``extra['cp_rank']`` and
        ``extra['context_parallel_size']`` added. (The result is a rank-local view: ``validate()``
        applies to the global row, not to it.) For a mapping: a new dict with the same keys plus
        ``cp_indices``.

    Raises:
        ValueError: as :func:`cp_partition_indices`.
    """
    if isinstance(packed, PackedSequence):
        idx = cp_partition_indices(packed.cu_seqlens_padded, cp_size, cp_rank)
        t = packed.length
        tables = packed.per_token_extra_keys()
        extra = dict(packed.extra)
        for key in tables:
            val = extra[key]
            extra[key] = _take(val, idx, _token_axis(tuple(val.shape), t))
        extra.update(cp_indices=idx, cp_rank=int(cp_rank), context_parallel_size=int(cp_size))
        fields = {f: _take(getattr(packed, f), idx, 0) for f in PER_TOKEN_FIELDS}
        return replace(packed, extra=extra, **fields)
    if not isinstance(packed, Mapping):
        raise TypeError(f"slice_for_cp takes a PackedSequence or a mapping of arrays, got {type(packed).__name__}")
    if "cu_seqlens_padded" not in packed or "input_ids" not in packed:
        raise ValueError("slice_for_cp: the mapping needs 'input_ids' and 'cu_seqlens_padded'")
    t = int(packed["input_ids"].shape[-1])
    cup = packed["cu_seqlens_padded"]
    if len(getattr(cup, "shape", ())) > 1:
        raise ValueError(
            "slice_for_cp slices one row: flatten a [B, T] batch into one THD row with offset boundaries "
            f"first (got cu_seqlens_padded of shape {tuple(cup.shape)})"
        )
    idx = cp_partition_indices(cup, cp_size, cp_rank)
    out: dict[str, Any] = {}
    global_keys = {"cu_seqlens", "cu_seqlens_padded", "seq_lens", "max_seqlen", "num_segments"}
    for key, val in packed.items():
        shape = tuple(getattr(val, "shape", ()))
        ax = None if key in global_keys else _token_axis(shape, t)
        out[key] = val if ax is None else _take(val, idx, ax)
    out["cp_indices"] = idx
    return out


def gather_from_cp(slices: Sequence[Any], cu_seqlens_padded=None, *, axis: int = 0):
    """Invert :func:`slice_for_cp`: put the per-rank slices back in global slot order.

    Args:
        slices: one entry per CP rank, in rank order; either arrays / tensors (the token axis is
            ``axis``; each of length ``T / CP`` there) or PackedSequence views from
            :func:`slice_for_cp` (then every per-token field is gathered and a full PackedSequence
            returned).
        cu_seqlens_padded: global physical boundaries (optional for PackedSequence views).
        axis: token axis of array slices.

    Returns:
        The global array / tensor of length ``T`` along ``axis`` (torch: differentiable, built with
        ``cat`` + ``index_select``), or the global PackedSequence.

    Raises:
        ValueError: empty list, or slice lengths that do not match the boundaries.
    """
    if len(slices) == 0:
        raise ValueError("gather_from_cp: empty list of slices")
    cp = len(slices)
    if isinstance(slices[0], PackedSequence):
        first = slices[0]
        cup = first.cu_seqlens_padded if cu_seqlens_padded is None else cu_seqlens_padded
        fields = {f: gather_from_cp([getattr(s, f) for s in slices], cup) for f in PER_TOKEN_FIELDS}
        extra = {k: v for k, v in first.extra.items() if k not in ("cp_indices", "cp_rank", "context_parallel_size")}
        t_local = first.input_ids.shape[0]
        for key in list(extra):
            val = extra[key]
            if key in first.per_token_extra_keys():
                ax = _token_axis(tuple(val.shape), t_local)
                extra[key] = gather_from_cp([s.extra[key] for s in slices], cup, axis=ax)
        return replace(first, extra=extra, **fields)
    if cu_seqlens_padded is None:
        raise ValueError("gather_from_cp needs cu_seqlens_padded for array slices")
    perm = np.concatenate([cp_partition_indices(cu_seqlens_padded, cp, r) for r in range(cp)])
    t = perm.shape[0]
    sizes = [int(s.shape[axis]) for s in slices]
    if sum(sizes) != t:
        raise ValueError(f"slices hold {sizes} tokens along axis {axis}; the boundaries need {t} in all")
    inv = np.empty(t, dtype=np.int64)
    inv[perm] = np.arange(t, dtype=np.int64)
    if _is_torch(slices[0]):
        import torch

        cat = torch.cat(list(slices), dim=axis)
        return torch.index_select(cat, axis, torch.as_tensor(inv, device=cat.device))
    return np.take(np.concatenate([np.asarray(s) for s in slices], axis=axis), inv, axis=axis)


# --------------------------------------------------------------------------- attention path check (B02)
#: Attention paths that take segment boundaries under CP (name -> how they get them).
CP_BOUNDARY_AWARE_BACKENDS = {
    "te": "Transformer Engine DotProductAttention, qkv_format='thd', cu_seqlens_q/kv(+_padded); "
          "cp_comm_type p2p or a2a",
    "transformer_engine": "alias of 'te'",
    "megatron": "Megatron-Core with PackedSeqParams(qkv_format='thd') -> Transformer Engine",
    "flash": "flash-attn varlen kernels with a varlen ring / all-gather CP (ring-flash-attention *_varlen_func)",
    "ring_flash_attn_varlen": "zhuzilin/ring-flash-attention *_varlen_func with cu_seqlens",
    "llama3_flash_attn_varlen": "ring-flash-attention llama3_flash_attn_varlen_func (all-gather K/V) with cu_seqlens",
    "reference": "seqpack.parallel.attention.cp_attention_reference (CPU/gloo, block-diagonal mask from seq_idx)",
}
#: Attention paths that drop segment boundaries under CP (multi-document rows are refused).
CP_BOUNDARY_BLIND_BACKENDS = {
    "ring_flash_attn": "batch ring attention: no cu_seqlens input, position_ids/cu_seqlens discarded (axolotl #3608)",
    "zigzag_ring_flash_attn": "batch zigzag ring attention: no cu_seqlens input",
    "stripe_flash_attn": "batch stripe ring attention: no cu_seqlens input",
    "torch_context_parallel": "torch.distributed.tensor.experimental.context_parallel with SDPA: causal only, "
                              "no document mask",
    "sdpa": "SDPA under CP: plain causal over the whole row",
    "flash_attention_2": "non-varlen flash attention under CP: plain causal over the whole row",
    "eager": "eager attention under CP: no boundary-aware CP path",
    "flex": "FlexAttention BlockMask: no boundary-aware CP path",
    "local": "Megatron-Core local DotProductAttention: asserts packed_seq_params is None",
}
_TE_THD_CP_COMM = {"p2p", "a2a"}


def validate_cp_attention(
    attention_backend: str,
    context_parallel_size: int,
    num_segments: int | None = None,
    *,
    cp_comm_type: str | None = None,
) -> None:
    """Refuse a CP setup whose attention path cannot take segment boundaries (case B02).

    For ``seqpack.config`` to call at setup time. With CP > 1 and rows that may hold more than one
    segment, the attention path must receive per-segment boundaries; a batch-style ring attention
    silently rotates K/V across documents (axolotl issue #3608: step-0 loss 1.83x the CP=1 loss).

    Args:
        attention_backend: a key of :data:`CP_BOUNDARY_AWARE_BACKENDS` or
            :data:`CP_BOUNDARY_BLIND_BACKENDS` (case-insensitive; includes the names of
            ``seqpack.config.AttentionBackend``: te, flash, sdpa, eager, flex, local).
        context_parallel_size: CP size; 1 accepts every backend.
        num_segments: the most segments a packed row may hold (``max_samples_per_bin``); ``None``
            = unknown, treated as multi-document; 1 = single-document rows (any CP backend is exact).
        cp_comm_type: Transformer Engine ``cp_comm_type`` when the backend is TE; THD (packed) input
            is supported with ``p2p`` and ``a2a`` only (TE's CP test matrix skips THD with
            ``all_gather`` and ``a2a+p2p``).

    Raises:
        CPConfigError: (not a warning) naming ``attention_backend``, ``context_parallel_size`` and the
            fix; also for unknown backend names under CP (listing the known ones).
    """
    if int(context_parallel_size) != context_parallel_size or context_parallel_size < 1:
        raise CPConfigError(f"context_parallel_size must be an integer >= 1, got {context_parallel_size!r}")
    if context_parallel_size == 1:
        return
    name = str(attention_backend).lower()
    multi_doc = num_segments is None or num_segments > 1
    aware = ", ".join(sorted(CP_BOUNDARY_AWARE_BACKENDS))
    if name in CP_BOUNDARY_BLIND_BACKENDS:
        if not multi_doc:
            return
        raise CPConfigError(
            f"attention_backend={attention_backend!r} with context_parallel_size={context_parallel_size} and "
            f"packed rows of {'unknown number of' if num_segments is None else num_segments} segments would attend "
            f"across document boundaries ({CP_BOUNDARY_BLIND_BACKENDS[name]}). Use a boundary-aware CP path "
            f"({aware}), or set context_parallel_size=1, or pack one sample per row"
        )
    if name not in CP_BOUNDARY_AWARE_BACKENDS:
        raise CPConfigError(
            f"attention_backend={attention_backend!r} is not known to take segment boundaries under "
            f"context_parallel_size={context_parallel_size}; known boundary-aware paths: {aware}"
        )
    if name in ("te", "transformer_engine", "megatron") and cp_comm_type is not None and multi_doc:
        if cp_comm_type not in _TE_THD_CP_COMM:
            raise CPConfigError(
                f"cp_comm_type={cp_comm_type!r} does not support packed THD input in Transformer Engine "
                f"(attention_backend={attention_backend!r}, context_parallel_size={context_parallel_size}); "
                f"use cp_comm_type='p2p' or 'a2a'"
            )
