"""The attention inputs of a packed row, for every attention backend (torch imported lazily).

One rule (``packed-batch-spec.md``): query ``q`` may attend key ``k`` iff both lie in the same segment
(``seq_idx``) and ``q >= k`` (causal), and ``k`` is not a padding slot -- except that a padding query
always sees itself, so no softmax row is empty (an all-masked row gives NaN under SDPA). Real tokens
therefore see exactly what they would see if their sample ran alone; padding rows carry finite garbage
that no loss reads.

:func:`attention_inputs` is the one entry point (by ``attn_implementation``, the names transformers
uses); the functions it calls are public for references and tests.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "attention_inputs",
    "block_causal_mask",
    "dense_block_causal_mask",
    "additive_mask",
    "flex_block_mask",
    "flash_attn_kwargs",
    "SegmentCausalMaskMod",
]

#: ``attn_implementation`` values (transformers' names) :func:`attention_inputs` builds inputs for.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")


def _row(x, name):
    import torch

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


def block_causal_mask(q_slots, k_slots, q_seq_idx, k_seq_idx, *, respect_segments: bool = True):
    """Boolean attention mask in global slot coordinates, True = attend (torch tensors).

    Args:
        q_slots: int [tq] global slot number of each query (``arange(T)`` without context parallelism,
            the CP index array with it).
        k_slots: int [tk] global slot number of each key.
        q_seq_idx, k_seq_idx: int [tq] / [tk] segment index of each query / key.
        respect_segments: False gives the plain causal mask over the whole row (the boundary-blind
            behaviour of case B02, ring attention across segments; only for demonstrating the fault).

    Returns:
        bool [tq, tk].
    """
    causal = k_slots.view(1, -1) <= q_slots.view(-1, 1)
    if not respect_segments:
        return causal
    return causal & (q_seq_idx.view(-1, 1) == k_seq_idx.view(1, -1))


def dense_block_causal_mask(seq_idx, padding_mask=None):
    """Dense bool block-diagonal causal mask (True = attend).

    Args:
        seq_idx: int ``[T]`` or ``[1, T]``: segment index of every slot (padding -> its segment).
        padding_mask: optional bool ``[T]``/``[1, T]``, True = padding; padding keys are excluded
            (a padding query still sees itself).

    Returns:
        bool tensor ``[T, T]``; ``mask[q, k]`` True iff ``seq_idx[q] == seq_idx[k]`` and ``q >= k``
        and (``k`` is real or ``q == k``). Memory is ``T*T`` bytes: for references and short rows.

    Raises:
        ValueError: a field that is not one row.
    """
    import torch

    s = _row(seq_idx, "seq_idx")
    T = s.shape[0]
    idx = torch.arange(T, device=s.device)
    mask = block_causal_mask(idx, idx, s, s)
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
    import torch

    dtype = dtype or torch.float32
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


class SegmentCausalMaskMod:
    """Picklable FlexAttention ``mask_mod`` (a top-level class, so a ``BlockMask`` built in a
    ``DataLoader`` worker crosses the process boundary): same segment, causal, padding keys
    excluded, a query always sees itself.

    Args:
        seq_idx: int ``[T]`` segment index per slot.
        padding_mask: bool ``[T]``, True = padding.
    """

    def __init__(self, seq_idx, padding_mask):
        self.seq_idx = seq_idx
        self.padding_mask = padding_mask

    def __call__(self, b, h, q, kv):
        return (self.seq_idx[q] == self.seq_idx[kv]) & (q >= kv) & ((~self.padding_mask[kv]) | (q == kv))


def flex_block_mask(seq_idx, padding_mask, *, device=None, block_size: int = 128):
    """FlexAttention ``BlockMask`` ``[1, 1, T, T]`` of one row: the rule of :func:`dense_block_causal_mask`
    without materialising ``[T, T]`` (FlexAttention has no backward on CPU).

    Args:
        seq_idx: int ``[T]`` or ``[1, T]``; padding_mask: bool ``[T]`` or ``[1, T]`` (True = padding).
        device: where the mask is built (default: the tensors' device).
        block_size: FlexAttention block size (tokens).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    seq, pad = _row(seq_idx, "seq_idx"), _row(padding_mask, "padding_mask")
    if device is not None:
        seq, pad = seq.to(device), pad.to(device)
    T = seq.shape[0]
    return create_block_mask(SegmentCausalMaskMod(seq, pad), B=None, H=None, Q_LEN=T, KV_LEN=T,
                             device=str(seq.device), BLOCK_SIZE=block_size)


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
    import torch

    cu = torch.as_tensor(cu_seqlens_padded).to(torch.int32).contiguous()
    m = int(max_seqlen)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": m, "max_length_k": m}


def attention_inputs(seq_idx, padding_mask, cu_seqlens_padded, max_seqlen: int, attn_implementation: str, *,
                     mask_dtype=None, device=None) -> dict[str, Any]:
    """The attention keyword arguments of one packed row for ``attn_implementation``.

    ============================  ==============================================================
    ``sdpa``                      ``attention_mask``: 4-D bool ``[1, 1, T, T]`` (True = attend)
    ``eager``                     ``attention_mask``: 4-D additive ``mask_dtype`` (0 / ``finfo.min``)
    ``flex_attention``            ``attention_mask``: a FlexAttention ``BlockMask``
    ``flash_attention_2`` / ``3``  :func:`flash_attn_kwargs` (``cu_seq_lens_q/k``, ``max_length_q/k``)
    ============================  ==============================================================

    A 4-D mask costs ``T*T`` bytes (bool) or ``4*T*T`` (fp32): prefer flash-attn for long rows.

    Args:
        seq_idx, padding_mask: ``[T]`` or ``[1, T]`` tensors of the row.
        cu_seqlens_padded: int ``[N+1]`` physical boundaries; max_seqlen: longest padded segment.
        attn_implementation: one of :data:`ATTN_IMPLEMENTATIONS`.
        mask_dtype: dtype of the ``eager`` mask (default float32).
        device: build on this device (default: where ``seq_idx`` is).

    Raises:
        ValueError: unknown ``attn_implementation``.
    """
    import torch

    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, got {attn_implementation!r}")
    seq = torch.as_tensor(seq_idx)
    dev = device if device is not None else seq.device
    if attn_implementation.startswith("flash_attention"):
        return {k: (v.to(dev) if isinstance(v, torch.Tensor) else v)
                for k, v in flash_attn_kwargs(cu_seqlens_padded, max_seqlen).items()}
    pad = torch.as_tensor(padding_mask).to(dev)
    if attn_implementation == "flex_attention":
        return {"attention_mask": flex_block_mask(seq.to(dev), pad)}
    allowed = dense_block_causal_mask(seq.to(dev), pad)[None, None]
    if attn_implementation == "eager":
        return {"attention_mask": additive_mask(allowed, mask_dtype)}
    return {"attention_mask": allowed}
