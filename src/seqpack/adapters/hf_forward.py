"""The keyword arguments of a transformers (HF) causal LM's ``forward`` for one packed THD row.

``model(**to_hf_inputs(batch, model.config._attn_implementation))`` runs the row with segments kept
apart: ``input_ids``, ``position_ids`` (restarting per segment; image rows: the M-RoPE table
``[3, 1, T]``), ``labels`` (unshifted, -100 at every segment start), ``shift_labels`` (seqpack's
shifted labels, which HF's ``ForCausalLMLoss`` uses as given) and the attention inputs of
:func:`seqpack.packed.masks.attention_inputs` for the model's ``attn_implementation``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from seqpack.packed.masks import ATTN_IMPLEMENTATIONS, attention_inputs
from seqpack.packed.mrope import mrope_from_image_tokens, mrope_model_config
from seqpack.sample import unshift_labels

from .batch import as_batch

__all__ = ["MEDIA_KEYS", "to_hf_inputs"]

#: Vision inputs that travel with a batch as they are (segment order).
MEDIA_KEYS = ("pixel_values", "image_grid_thw")


def to_hf_inputs(batch: Mapping[str, Any], attn_implementation: str, *, mask_dtype=None,
                 device=None, image_token_id: int | None = None,
                 spatial_merge_size: int | None = None) -> dict[str, Any]:
    """Turn a canonical THD batch into the exact keyword arguments of an HF causal LM's ``forward``.

    Args:
        batch: canonical batch dict (``format="thd"`` output, ``PackedSequence.to_torch()``,
            or ``seqpack.adapters.as_batch(...)``); one row.
        attn_implementation: ``model.config._attn_implementation`` (one of
            :data:`seqpack.packed.masks.ATTN_IMPLEMENTATIONS`).
        mask_dtype: dtype of the additive mask for ``eager`` (default float32).
        device: build masks on this device (default: where ``input_ids`` is).
        image_token_id, spatial_merge_size: the model's ``<|image_pad|>`` id and vision merge size
            (``config.image_token_id``, ``config.vision_config.spatial_merge_size``); only used to
            compute M-RoPE positions for a batch with ``image_grid_thw`` but no
            ``mrope_position_ids`` (``seqpack.hf.packed_forward`` passes them from the config).

    Returns:
        dict with ``input_ids, position_ids, labels (HF unshifted), shift_labels`` ``[1, T]`` and the
        attention inputs (module docstring). An explicit final target on a segment's last physical
        slot has no unshifted slot: it stays in ``shift_labels`` only. Image rows (the batch carries
        ``mrope_position_ids`` int64 ``[3, T]``, or ``image_grid_thw``) get ``position_ids`` of shape
        ``[3, 1, T]``: Qwen2-VL M-RoPE positions restarting per segment. A ``[1, T]``
        ``position_ids`` would make HF Qwen2-VL skip its own ``get_rope_index`` and rotate image
        tokens with text positions.

    Raises:
        ValueError: unknown ``attn_implementation``; a batch with ``image_grid_thw`` but neither
            ``mrope_position_ids`` nor ``image_token_id``/``spatial_merge_size`` to compute them.
    """
    import torch

    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"format='hf' needs attn_implementation in {ATTN_IMPLEMENTATIONS} (the mask kind depends on it), got "
            f"{attn_implementation!r}; pass attn_implementation=model.config._attn_implementation"
        )
    b = as_batch(batch)
    dev = device if device is not None else b["input_ids"].device
    out: dict[str, Any] = {
        "input_ids": b["input_ids"].to(dev),
        "position_ids": b["position_ids"].to(dev),
    }
    mrope = _batch_mrope(batch, b, image_token_id, spatial_merge_size)
    if mrope is not None:
        out["position_ids"] = mrope[:, None, :].to(dev)  # [3, 1, T], Qwen2-VL's (axes, batch, T)
    if "labels" in b:
        lab = b["labels"]
        out["labels"] = unshift_labels(lab, b["cu_seqlens_padded"], final_target="drop").to(dev)
        out["shift_labels"] = lab.to(dev)
    out.update(attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"],
                                attn_implementation, mask_dtype=mask_dtype, device=dev))
    for k in MEDIA_KEYS:  # VLM inputs travel as they are (segment order)
        if batch.get(k) is not None:
            out[k] = batch[k].to(dev) if isinstance(batch[k], torch.Tensor) else batch[k]
    return out


def _batch_mrope(batch: Mapping[str, Any], b: Mapping[str, Any], image_token_id, merge, config: Any = None):
    """M-RoPE table int64 ``[3, T]`` of a one-row batch, or None for a text row. With the model's ``config``,
    an image row for a model that does not take these tables is refused
    (:func:`seqpack.packed.mrope.mrope_model_config`, which also supplies the image token id and merge size)."""
    import torch

    m = batch.get("mrope_position_ids")
    grid = batch.get("image_grid_thw")
    if config is not None and (m is not None or (grid is not None and len(grid))):
        tok, mrg = mrope_model_config(config)  # raises for a model whose positions are not these tables
        image_token_id = tok if image_token_id is None else image_token_id
        merge = mrg if not merge else merge
    T = int(b["input_ids"].shape[-1])
    if m is not None:
        m = torch.as_tensor(m).to(torch.int64)
        if m.dim() == 3:
            m = m.reshape(m.shape[0], -1)
        if m.shape != (3, T):
            raise ValueError(f"mrope_position_ids has shape {tuple(m.shape)}, expected (3, {T}) (one THD row)")
        return m
    if grid is None or len(grid) == 0:
        return None
    if image_token_id is None or not merge:
        raise ValueError(
            "the batch has image_grid_thw but no mrope_position_ids, so image tokens would get text positions; "
            "build samples with seqpack.data.media.prepare_multimodal / open packs with seqpack.io.load_packed "
            "(both store mrope_position_ids), or pass image_token_id= and spatial_merge_size= "
            "(seqpack.hf.packed_forward takes them from the model config)")
    table = mrope_from_image_tokens(
        b["input_ids"][0].detach().cpu().numpy(), b["cu_seqlens"].cpu().numpy(), b["cu_seqlens_padded"].cpu().numpy(),
        np.asarray(torch.as_tensor(grid).cpu().numpy(), np.int64), image_token_id=int(image_token_id),
        merge_size=int(merge))
    return None if table is None else torch.from_numpy(table)
