"""Views of a packed THD row for the frameworks that consume it (``packed-batch-spec.md``, Conversions).

- :func:`to_megatron` -- Megatron-Core ``PackedSeqParams`` (megatron-core's own class when installed) + ``[1, T]`` tensors.
- :func:`flash_attn_kwargs` -- HF / flash-attn varlen kwargs (``cu_seq_lens_q/k``, ``max_length_q/k``).
- :func:`flex_block_mask` -- FlexAttention ``BlockMask`` (same segment, causal, padding excluded).
- :func:`dense_block_causal_mask`, :func:`sdpa_mask`, :func:`additive_mask` -- dense masks.
- :func:`hf_unshifted_labels`, :func:`shifted_from_hf_labels`, :func:`from_hf_flattening` -- label conventions.
- :func:`real_token_indices`, :func:`segments_from_doc_ids`, :func:`gather_real`, :func:`scatter_real`.
- :func:`as_batch` -- the canonical batch dict from a ``PackedSequence`` or a dict.
- :func:`to_hf_inputs` -- the keyword arguments of a transformers causal LM's ``forward``.
"""

from .attention import additive_mask, dense_block_causal_mask, flash_attn_kwargs, flex_block_mask, sdpa_mask
from .batch import as_batch
from .hf_forward import MEDIA_KEYS, to_hf_inputs
from .labels import from_hf_flattening, hf_unshifted_labels, shifted_from_hf_labels
from .megatron import PackedSeqParamsLike, to_megatron
from .tokens import gather_real, real_token_indices, scatter_real, segments_from_doc_ids

__all__ = [
    "as_batch",
    "to_hf_inputs",
    "MEDIA_KEYS",
    "to_megatron",
    "PackedSeqParamsLike",
    "flash_attn_kwargs",
    "flex_block_mask",
    "dense_block_causal_mask",
    "sdpa_mask",
    "additive_mask",
    "hf_unshifted_labels",
    "shifted_from_hf_labels",
    "from_hf_flattening",
    "real_token_indices",
    "segments_from_doc_ids",
    "gather_real",
    "scatter_real",
]
