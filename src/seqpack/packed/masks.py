"""The attention inputs of a packed row, for every attention backend (torch imported lazily).

One rule (``packed-batch-spec.md``): query ``q`` may attend key ``k`` iff both lie in the same segment
(``seq_idx``) and ``q >= k`` (causal), and ``k`` is not a padding slot -- except that a padding query
always sees itself, so no softmax row is empty (an all-masked row gives NaN under SDPA). A layer with a
sliding window ``W`` also needs ``q - k < W``; a chunked layer (chunk ``C``) needs ``q`` and ``k`` in the
same chunk of their segment, ``(q - start) // C == (k - start) // C`` with ``start`` the segment's first
slot. Both are measured in the segment's own slot offsets, exactly as transformers' mask functions
measure them for a sample run alone (``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - W``;
``chunked_overlay``: equal ``idx // C``). Real tokens therefore see exactly what they would see if their
sample ran alone; padding rows carry finite garbage that no loss reads.

:func:`attention_inputs` is the one entry point (by ``attn_implementation``, the names transformers
uses); the functions it calls are public for references and tests.
"""

from __future__ import annotations

from typing import Any

from seqpack._torch import torch_hint

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "attention_inputs",
    "segment_rule",
    "segment_starts",
    "block_causal_mask",
    "dense_block_causal_mask",
    "additive_mask",
    "flex_block_mask",
    "flash_attn_kwargs",
    "SegmentCausalMaskMod",
]

#: ``attn_implementation`` values (transformers' names) :func:`attention_inputs` builds inputs for.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")


def _torch():
    """``torch``, imported on first use (this module is light); a missing torch names this module and the fix."""
    with torch_hint("seqpack.packed.masks"):
        import torch
    return torch


def _row(x, name):
    torch = _torch()

    if x is None:
        raise ValueError(f"{name} is required")
    x = torch.as_tensor(x)
    if x.dim() == 2:
        if x.shape[0] != 1:
            raise ValueError(f"{name} must be one row [T] or [1, T], got {tuple(x.shape)}")
        x = x[0]
    if x.dim() != 1:
        raise ValueError(f"{name} must be one row [T] or [1, T], got {tuple(x.shape)}")
    return x


def _check_sizes(sliding_window, chunk_size) -> None:
    for name, v in (("sliding_window", sliding_window), ("chunk_size", chunk_size)):
        if v is not None and (isinstance(v, bool) or int(v) != v or int(v) < 1):
            raise ValueError(f"{name} must be a positive number of tokens or None, got {v!r}")
    if sliding_window is not None and chunk_size is not None:
        raise ValueError("a layer has a sliding window or chunks, not both (got sliding_window and chunk_size)")


def segment_starts(seq_idx):
    """First slot of each slot's segment: int64 ``[T]`` (``seq_idx`` ``[T]`` is non-decreasing in a THD row).

    ``arange(T) - segment_starts(seq_idx)`` is every slot's offset inside its own segment (its slot
    index if the sample ran alone).
    """
    torch = _torch()

    s = _row(seq_idx, "seq_idx")
    return torch.searchsorted(s.contiguous(), s.contiguous(), right=False)


def segment_rule(q, k, q_seg, k_seg, q_off, k_off, *, sliding_window=None, chunk_size=None):
    """The mask rule on broadcastable tensors (True = attend); used by the dense masks and by FlexAttention.

    Args:
        q, k: slot numbers of queries / keys (any broadcastable int tensors; only ``q - k`` matters).
        q_seg, k_seg: their segment indices.
        q_off, k_off: their offsets inside their own segment (``slot - segment start``); read only
            for ``chunk_size``.
        sliding_window: ``W``: also require ``q - k < W`` (transformers' ``kv_idx > q_idx - W``).
        chunk_size: ``C``: also require ``q_off // C == k_off // C`` (chunks start at each segment's
            first slot, as for the sample alone).

    Padding keys are not handled here (see :func:`dense_block_causal_mask`).
    """
    allowed = (q_seg == k_seg) & (k <= q)
    if sliding_window is not None:
        allowed = allowed & (q - k < int(sliding_window))
    if chunk_size is not None:
        allowed = allowed & (q_off // int(chunk_size) == k_off // int(chunk_size))
    return allowed


def block_causal_mask(q_slots, k_slots, q_seq_idx, k_seq_idx, *, respect_segments: bool = True,
                      sliding_window: int | None = None, chunk_size: int | None = None,
                      q_offsets=None, k_offsets=None):
    """Boolean attention mask in global slot coordinates, True = attend (torch tensors).

    Args:
        q_slots: int [tq] global slot number of each query (``arange(T)`` without context parallelism,
            the CP index array with it).
        k_slots: int [tk] global slot number of each key.
        q_seq_idx, k_seq_idx: int [tq] / [tk] segment index of each query / key.
        respect_segments: False gives the plain causal mask over the whole row (the boundary-blind
            behaviour of case B02, ring attention across segments; only for demonstrating the fault).
        sliding_window, chunk_size: the layer's window / chunk in tokens (:func:`segment_rule`).
        q_offsets, k_offsets: int [tq] / [tk] offsets inside the own segment; required with ``chunk_size``.

    Returns:
        bool [tq, tk].

    Raises:
        ValueError: a non-positive window or chunk, both at once, or ``chunk_size`` without offsets.
    """
    _check_sizes(sliding_window, chunk_size)
    q, k = q_slots.view(-1, 1), k_slots.view(1, -1)
    if not respect_segments:
        return k <= q
    if chunk_size is not None and (q_offsets is None or k_offsets is None):
        raise ValueError("chunk_size needs q_offsets and k_offsets (slot offsets inside each segment)")
    qo = q_offsets.view(-1, 1) if q_offsets is not None else None
    ko = k_offsets.view(1, -1) if k_offsets is not None else None
    return segment_rule(q, k, q_seq_idx.view(-1, 1), k_seq_idx.view(1, -1), qo, ko,
                        sliding_window=sliding_window, chunk_size=chunk_size)


def dense_block_causal_mask(seq_idx, padding_mask=None, *, sliding_window: int | None = None,
                            chunk_size: int | None = None):
    """Dense bool block-diagonal causal mask (True = attend).

    Args:
        seq_idx: int ``[T]`` or ``[1, T]``: segment index of every slot (padding -> its segment).
        padding_mask: optional bool ``[T]``/``[1, T]``, True = padding; padding keys are excluded
            (a padding query still sees itself).
        sliding_window, chunk_size: the layer's window / chunk in tokens (module docstring); None = full.

    Returns:
        bool tensor ``[T, T]``; ``mask[q, k]`` True iff ``seq_idx[q] == seq_idx[k]`` and ``q >= k``
        and (``k`` is real or ``q == k``), and, with a window, ``q - k < sliding_window``, with chunks,
        both in the same chunk of their segment. Memory is ``T*T`` bytes: for references and short rows.

    Raises:
        ValueError: a field that is not one row; a non-positive window or chunk.
    """
    torch = _torch()

    s = _row(seq_idx, "seq_idx")
    T = s.shape[0]
    idx = torch.arange(T, device=s.device)
    off = idx - segment_starts(s) if chunk_size is not None else None
    mask = block_causal_mask(idx, idx, s, s, sliding_window=sliding_window, chunk_size=chunk_size,
                             q_offsets=off, k_offsets=off)
    if padding_mask is not None:
        pad = _row(padding_mask, "padding_mask").to(torch.bool)
        mask &= (~pad)[None, :] | torch.eye(T, dtype=torch.bool, device=s.device)
    return mask


def additive_mask(allowed, dtype=None):
    """Additive float mask from a bool one (HF ``eager``): 0 where allowed, ``torch.finfo(dtype).min`` elsewhere.

    Eager attention computes ``softmax(QK^T * scale + mask)``; a bool mask would be *added* as 0/1 and
    block nothing.

    Args:
        allowed: bool tensor (True = attend), any shape.
        dtype: floating dtype (default float32; use the model's compute dtype).
    """
    torch = _torch()

    dtype = dtype or torch.float32
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


class SegmentCausalMaskMod:
    """Picklable FlexAttention ``mask_mod`` (a top-level class, so a ``BlockMask`` built in a
    ``DataLoader`` worker crosses the process boundary): :func:`segment_rule` plus padding keys
    excluded, a query always sees itself.

    Args:
        seq_idx: int ``[T]`` segment index per slot.
        padding_mask: bool ``[T]``, True = padding.
        sliding_window, chunk_size: the layer's window / chunk in tokens; None = full causal.
    """

    def __init__(self, seq_idx, padding_mask, sliding_window: int | None = None, chunk_size: int | None = None):
        torch = _torch()

        _check_sizes(sliding_window, chunk_size)
        self.seq_idx = seq_idx
        self.padding_mask = padding_mask
        self.sliding_window = sliding_window
        self.chunk_size = chunk_size
        self.offsets = torch.arange(seq_idx.shape[0], device=seq_idx.device) - segment_starts(seq_idx)

    def __call__(self, b, h, q, kv):
        rule = segment_rule(q, kv, self.seq_idx[q], self.seq_idx[kv], self.offsets[q], self.offsets[kv],
                            sliding_window=self.sliding_window, chunk_size=self.chunk_size)
        return rule & ((~self.padding_mask[kv]) | (q == kv))


def flex_block_mask(seq_idx, padding_mask, *, device=None, block_size: int = 128,
                    sliding_window: int | None = None, chunk_size: int | None = None):
    """FlexAttention ``BlockMask`` ``[1, 1, T, T]`` of one row: the rule of :func:`dense_block_causal_mask`
    without materialising ``[T, T]`` (FlexAttention has no backward on CPU).

    Args:
        seq_idx: int ``[T]`` or ``[1, T]``; padding_mask: bool ``[T]`` or ``[1, T]`` (True = padding).
        device: where the mask is built (default: the tensors' device).
        block_size: FlexAttention block size (tokens).
        sliding_window, chunk_size: the layer's window / chunk in tokens; None = full causal.
    """
    _torch()
    from torch.nn.attention.flex_attention import create_block_mask

    seq, pad = _row(seq_idx, "seq_idx"), _row(padding_mask, "padding_mask")
    if device is not None:
        seq, pad = seq.to(device), pad.to(device)
    T = seq.shape[0]
    mod = SegmentCausalMaskMod(seq, pad.to(bool), sliding_window, chunk_size)
    return create_block_mask(mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device=str(seq.device), BLOCK_SIZE=block_size)


def flash_attn_kwargs(cu_seqlens_padded, max_seqlen: int) -> dict[str, Any]:
    """flash-attention varlen kwargs (transformers' ``FlashAttentionKwargs`` names) of one row.

    Uses the **physical** boundaries: flash-attn's varlen API takes a contiguous token stream, so
    interior alignment padding must belong to a segment; it sits after that segment's real tokens, so
    causality keeps it invisible to them. (Megatron / Transformer Engine take both arrays instead, see
    :func:`seqpack.adapters.to_megatron`.)

    Returns:
        ``{"cu_seq_lens_q": int32 [N+1], "cu_seq_lens_k": int32 [N+1], "max_length_q": int,
        "max_length_k": int}``; pass ``position_ids`` alongside and no ``attention_mask``.
    """
    torch = _torch()

    cu = torch.as_tensor(cu_seqlens_padded).to(torch.int32).contiguous()
    m = int(max_seqlen)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": m, "max_length_k": m}


def attention_inputs(seq_idx, padding_mask, cu_seqlens_padded, max_seqlen: int, attn_implementation: str, *,
                     mask_dtype=None, device=None, sliding_window: int | None = None,
                     chunk_size: int | None = None) -> dict[str, Any]:
    """The attention keyword arguments of one packed row for ``attn_implementation``, for one layer kind.

    ============================  ==============================================================
    ``sdpa``                      ``attention_mask``: 4-D bool ``[1, 1, T, T]`` (True = attend)
    ``eager``                     ``attention_mask``: 4-D additive ``mask_dtype`` (0 / ``finfo.min``)
    ``flex_attention``            ``attention_mask``: a FlexAttention ``BlockMask``
    ``flash_attention_2`` / ``3``  :func:`flash_attn_kwargs` (``cu_seq_lens_q/k``, ``max_length_q/k``)
    ============================  ==============================================================

    A 4-D mask costs ``T*T`` bytes (bool) or ``4*T*T`` (fp32): prefer flash-attn for long rows.
    The masks follow the module rule, with the layer's ``sliding_window`` or ``chunk_size``. flash-attn
    gets no mask: a transformers attention layer with a window passes it to the varlen kernel itself
    (``window_size=(W-1, W-1)``, causal, inside each ``cu_seq_lens`` sequence: ``q - k < W``, the same
    rule), so the boundaries are all it needs; it has no chunked attention.

    Args:
        seq_idx, padding_mask: ``[T]`` or ``[1, T]`` tensors of the row.
        cu_seqlens_padded: int ``[N+1]`` physical boundaries; max_seqlen: longest padded segment.
        attn_implementation: one of :data:`ATTN_IMPLEMENTATIONS`.
        mask_dtype: dtype of the ``eager`` mask (default float32).
        device: build on this device (default: where ``seq_idx`` is).
        sliding_window: the layer's window ``W`` in tokens (key ``k`` visible to ``q`` iff ``q - k < W``).
        chunk_size: the layer's chunk length ``C`` in tokens (chunks start at every segment's first slot).

    Raises:
        ValueError: unknown ``attn_implementation``; a non-positive window or chunk; ``chunk_size`` under
            flash-attn with a segment longer than one chunk (flash-attn cannot restrict attention to chunks).
    """
    torch = _torch()

    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, got {attn_implementation!r}")
    _check_sizes(sliding_window, chunk_size)
    seq = torch.as_tensor(seq_idx)
    dev = device if device is not None else seq.device
    if attn_implementation.startswith("flash_attention"):
        if chunk_size is not None and int(max_seqlen) > int(chunk_size):
            raise ValueError(
                f"{attn_implementation} cannot restrict attention to chunks of {int(chunk_size)} tokens, and this row "
                f"has a segment of {int(max_seqlen)} slots; load the model with attn_implementation='sdpa', 'eager' "
                f"or 'flex_attention', or keep every sample within {int(chunk_size)} tokens")
        return {k: (v.to(dev) if isinstance(v, torch.Tensor) else v)
                for k, v in flash_attn_kwargs(cu_seqlens_padded, max_seqlen).items()}
    pad = torch.as_tensor(padding_mask).to(dev)
    if attn_implementation == "flex_attention":
        return {"attention_mask": flex_block_mask(seq.to(dev), pad, sliding_window=sliding_window,
                                                  chunk_size=chunk_size)}
    allowed = dense_block_causal_mask(seq.to(dev), pad, sliding_window=sliding_window,
                                      chunk_size=chunk_size)[None, None]
    if attn_implementation == "eager":
        return {"attention_mask": additive_mask(allowed, mask_dtype)}
    return {"attention_mask": allowed}
