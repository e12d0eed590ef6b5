"""Attention-side views of a packed THD row: varlen kwargs, dense/additive masks, FlexAttention.

Every mask here follows one rule (``packed-batch-spec.md``): query ``q`` may attend key ``k`` iff
both lie in the same segment (``seq_idx``) and ``q >= k`` (causal), and ``k`` is not a padding slot
-- except that a padding query always sees itself, so no softmax row is empty (an all-masked row
gives NaN under SDPA). Real tokens therefore see exactly what they would see if their sample ran
alone; padding rows carry finite garbage that no loss reads.
"""

from __future__ import annotations

from typing import Any

from ._batch import as_batch

__all__ = [
    "flash_attn_kwargs",
    "dense_block_causal_mask",
    "sdpa_mask",
    "additive_mask",
    "flex_block_mask",
    "SegmentCausalMaskMod",
]


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


def flash_attn_kwargs(batch: Any) -> dict[str, Any]:
    """HF flash-attention varlen kwargs for one packed row (``flash_attention_2/3`` in transformers).

    Uses the **physical** boundaries (``cu_seqlens_padded``): flash-attn's varlen API takes a
    contiguous token stream, so interior alignment padding must belong to a segment; it sits after
    that segment's real tokens, so causality keeps it invisible to them. (Megatron/TE instead take
    both arrays, see :func:`seqpack.adapters.to_megatron`.)

    Args:
        batch: canonical batch dict or ``PackedSequence`` (see ``seqpack.adapters._batch``).

    Returns:
        ``{"cu_seq_lens_q": int32 [N+1], "cu_seq_lens_k": int32 [N+1], "max_length_q": int,
        "max_length_k": int}`` -- the names of ``transformers.modeling_flash_attention_utils``
        (``FlashAttentionKwargs``); pass ``position_ids`` alongside and no ``attention_mask``.
    """
    b = as_batch(batch)
    cu = b["cu_seqlens_padded"].contiguous()
    m = int(b["max_seqlen"])
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": m, "max_length_k": m}


def dense_block_causal_mask(seq_idx, padding_mask=None):
    """Dense bool block-diagonal causal mask for a CPU reference (True = attend).

    Args:
        seq_idx: int ``[T]`` or ``[1, T]``: segment index of every slot (padding -> its segment).
        padding_mask: optional bool ``[T]``/``[1, T]``, True = padding; padding keys are excluded
            (a padding query still sees itself).

    Returns:
        bool tensor ``[T, T]``; ``mask[q, k]`` True iff ``seq_idx[q] == seq_idx[k]`` and ``q >= k``
        and (``k`` is real or ``q == k``). Memory is ``T*T`` bytes: for references and short rows.
    """
    import torch

    from seqpack.parallel.attention import block_causal_mask

    s = _row(seq_idx, "seq_idx")
    T = s.shape[0]
    idx = torch.arange(T, device=s.device)
    mask = block_causal_mask(idx, idx, s, s)
    if padding_mask is not None:
        pad = _row(padding_mask, "padding_mask").to(torch.bool)
        mask &= (~pad)[None, :] | torch.eye(T, dtype=torch.bool, device=s.device)
    return mask


def sdpa_mask(batch: Any):
    """4-D bool mask ``[1, 1, T, T]`` (True = attend) for ``torch.nn.functional.scaled_dot_product_attention``
    and HF ``attn_implementation="sdpa"`` (a 4-D mask is used as given by ``transformers.masking_utils``).

    Args:
        batch: canonical batch dict or ``PackedSequence``.
    """
    b = as_batch(batch)
    return dense_block_causal_mask(b["seq_idx"], b["padding_mask"])[None, None]


def additive_mask(batch: Any, dtype=None):
    """4-D additive float mask ``[1, 1, T, T]`` for HF ``attn_implementation="eager"``.

    Eager attention computes ``softmax(QK^T * scale + mask)``, so allowed entries are 0 and blocked
    entries ``torch.finfo(dtype).min`` (HF's own convention). A bool mask would be *added* as 0/1
    and block nothing.

    Args:
        batch: canonical batch dict or ``PackedSequence``.
        dtype: floating dtype of the mask (default float32; use the model's compute dtype).
    """
    import torch

    dtype = dtype or torch.float32
    allowed = sdpa_mask(batch)
    out = torch.zeros(allowed.shape, dtype=dtype)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


def flex_block_mask(batch: Any, device=None, block_size: int = 128):
    """FlexAttention ``BlockMask`` for one packed row (``torch.nn.attention.flex_attention``).

    ``mask_mod(b, h, q, kv) = seq_idx[q] == seq_idx[kv] and q >= kv and (not pad[kv] or q == kv)``,
    i.e. the same rule as :func:`dense_block_causal_mask` without materialising ``[T, T]``.
    Pass it as ``attention_mask`` to an HF model loaded with ``attn_implementation="flex_attention"``
    (a ``BlockMask`` is used as given). FlexAttention has no backward on CPU.

    Args:
        batch: canonical batch dict or ``PackedSequence``.
        device: where the mask is built (default: the tensors' device).
        block_size: FlexAttention block size (tokens).

    Returns:
        ``torch.nn.attention.flex_attention.BlockMask`` of shape ``[1, 1, T, T]``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    b = as_batch(batch)
    seq = b["seq_idx"][0]
    pad = b["padding_mask"][0]
    if device is not None:
        seq, pad = seq.to(device), pad.to(device)
    T = seq.shape[0]
    return create_block_mask(SegmentCausalMaskMod(seq, pad), B=None, H=None, Q_LEN=T, KV_LEN=T,
                             device=str(seq.device), BLOCK_SIZE=block_size)


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
