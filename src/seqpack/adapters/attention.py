"""Attention-side views of a packed THD batch: varlen kwargs, dense / additive masks, FlexAttention.

Thin batch-taking forms of :mod:`seqpack.packed.masks` (the one mask builder and its rule: same segment,
causal, padding keys excluded, a padding query sees itself; optionally a layer's sliding window or
chunks). For a whole transformers model, whose layers may differ, use
:func:`seqpack.adapters.hf_forward.model_attention_inputs` with its config.
"""

from __future__ import annotations

from typing import Any

from seqpack.packed import masks
from seqpack.packed.masks import SegmentCausalMaskMod, dense_block_causal_mask

from .batch import as_batch

__all__ = [
    "flash_attn_kwargs",
    "dense_block_causal_mask",
    "sdpa_mask",
    "additive_mask",
    "flex_block_mask",
    "SegmentCausalMaskMod",
]


def flash_attn_kwargs(batch: Any) -> dict[str, Any]:
    """HF flash-attention varlen kwargs for one packed row (``flash_attention_2/3`` in transformers).

    Args:
        batch: canonical batch dict or ``PackedSequence`` (see ``seqpack.adapters.batch``).

    Returns:
        ``{"cu_seq_lens_q": int32 [N+1], "cu_seq_lens_k": int32 [N+1], "max_length_q": int,
        "max_length_k": int}`` from the **physical** boundaries (:func:`seqpack.packed.masks.flash_attn_kwargs`);
        pass ``position_ids`` alongside and no ``attention_mask``.
    """
    b = as_batch(batch)
    return masks.flash_attn_kwargs(b["cu_seqlens_padded"], b["max_seqlen"])


def _inputs(batch: Any, impl: str, **kw) -> dict[str, Any]:
    b = as_batch(batch)
    return masks.attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"],
                                  impl, **kw)


def sdpa_mask(batch: Any, *, sliding_window: int | None = None, chunk_size: int | None = None):
    """4-D bool mask ``[1, 1, T, T]`` (True = attend) for ``torch.nn.functional.scaled_dot_product_attention``
    and HF ``attn_implementation="sdpa"`` (a 4-D mask is used as given by ``transformers.masking_utils``).

    Args:
        batch: canonical batch dict or ``PackedSequence``.
        sliding_window, chunk_size: a layer's window / chunk in tokens (:mod:`seqpack.packed.masks`).
    """
    return _inputs(batch, "sdpa", sliding_window=sliding_window, chunk_size=chunk_size)["attention_mask"]


def additive_mask(batch: Any, dtype=None, *, sliding_window: int | None = None, chunk_size: int | None = None):
    """4-D additive float mask ``[1, 1, T, T]`` for HF ``attn_implementation="eager"``: 0 where allowed,
    ``torch.finfo(dtype).min`` elsewhere (HF's own convention).

    Args:
        batch: canonical batch dict or ``PackedSequence``.
        dtype: floating dtype of the mask (default float32; use the model's compute dtype).
        sliding_window, chunk_size: a layer's window / chunk in tokens (:mod:`seqpack.packed.masks`).
    """
    return _inputs(batch, "eager", mask_dtype=dtype, sliding_window=sliding_window,
                   chunk_size=chunk_size)["attention_mask"]


def flex_block_mask(batch: Any, device=None, block_size: int = 128, *, sliding_window: int | None = None,
                    chunk_size: int | None = None):
    """FlexAttention ``BlockMask`` ``[1, 1, T, T]`` for one packed row (``torch.nn.attention.flex_attention``).

    Pass it as ``attention_mask`` to an HF model loaded with ``attn_implementation="flex_attention"``
    (a ``BlockMask`` is used as given). FlexAttention has no backward on CPU.

    Args:
        batch: canonical batch dict or ``PackedSequence``.
        device: where the mask is built (default: the tensors' device).
        block_size: FlexAttention block size (tokens).
        sliding_window, chunk_size: a layer's window / chunk in tokens (:mod:`seqpack.packed.masks`).
    """
    b = as_batch(batch)
    return masks.flex_block_mask(b["seq_idx"], b["padding_mask"], device=device, block_size=block_size,
                                 sliding_window=sliding_window, chunk_size=chunk_size)
