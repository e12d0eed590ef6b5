"""The keyword arguments of a transformers (HF) causal LM's ``forward`` for one packed THD row.

``model(**to_hf_inputs(batch, config=model.config))`` runs the row with segments kept apart:
``input_ids``, ``position_ids`` (restarting per segment; image rows: the M-RoPE table ``[3, 1, T]``),
``labels`` (unshifted, -100 at every segment start), ``shift_labels`` (seqpack's shifted labels, which
HF's ``ForCausalLMLoss`` uses as given) and the attention inputs of
:func:`seqpack.packed.masks.attention_inputs` for the model's ``attn_implementation`` and its attention
pattern (:func:`seqpack.adapters.attention_pattern.attention_pattern`: sliding windows, chunks).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from seqpack._torch import torch_hint
from seqpack.packed.masks import ATTN_IMPLEMENTATIONS, attention_inputs
from seqpack.packed.mrope import mrope_from_image_tokens, mrope_model_config
from seqpack.sample import unshift_labels

from .architecture import extra_hf_inputs
from .attention_pattern import LayerAttention, attention_pattern, slot_position_limit
from .batch import as_batch

__all__ = ["MEDIA_KEYS", "to_hf_inputs", "model_attention_inputs", "resolve_attn_implementation"]

#: Vision inputs that travel with a batch as they are (segment order).
MEDIA_KEYS = ("pixel_values", "image_grid_thw")


def resolve_attn_implementation(config: Any, attn_implementation: str | None, *, what: str = "format='hf'") -> str:
    """The attention implementation the HF inputs are built for: ``attn_implementation`` or the config's.

    Args:
        config: the model's config (``model.config``); required, because the masks follow the model's
            attention pattern (sliding windows, chunks) as well as its implementation.
        attn_implementation: an explicit name (one of :data:`~seqpack.packed.masks.ATTN_IMPLEMENTATIONS`),
            or None for ``config._attn_implementation``.
        what: the caller's name, for messages.

    Raises:
        ValueError: no config; no known implementation; an explicit name that differs from the config's
            (an ``eager`` mask given to an ``sdpa`` model, or the reverse, would be applied wrongly).
    """
    if config is None:
        raise ValueError(
            f"{what} needs config=model.config: the packed masks follow the model's attention pattern (sliding "
            "windows, chunked layers) as well as its attn_implementation, so they cannot be built from the "
            "implementation name alone")
    own = getattr(config, "_attn_implementation", None)
    if attn_implementation is not None and own in ATTN_IMPLEMENTATIONS and attn_implementation != own:
        raise ValueError(f"{what}: attn_implementation={attn_implementation!r} but config._attn_implementation is "
                         f"{own!r}; the masks must be built for the implementation the model runs (drop "
                         "attn_implementation= to use the config's)")
    impl = attn_implementation if attn_implementation is not None else own
    if impl not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"{what} needs attn_implementation in {ATTN_IMPLEMENTATIONS} (the mask kind depends on it), "
                         f"got {impl!r}; load the model with one of them or pass attn_implementation=")
    return impl


def model_attention_inputs(batch: Mapping[str, Any], config: Any, attn_implementation: str | None = None, *,
                           mask_dtype=None, device=None) -> dict[str, Any]:
    """The attention keyword arguments of one packed row for the model ``config`` describes.

    Every attention layer gets the mask of :func:`seqpack.packed.masks.attention_inputs` for its own kind
    (:func:`~seqpack.adapters.attention_pattern.attention_pattern`). When all attention layers share one
    kind, ``attention_mask`` is one 4-D mask / ``BlockMask`` (transformers uses a 4-D mask as given for
    every layer). Otherwise it is a dict keyed by transformers' layer type (``{"full_attention": m,
    "sliding_attention": m2, ...}``, ``None`` for layers that read no attention mask), which the
    ``modeling_*.py`` files take as their ``causal_mask_mapping``. flash-attn: ``cu_seq_lens_q/k``
    and ``max_length_q/k`` only (the layers pass their own window to the kernel); a chunked model also gets
    a dict of ``None`` masks, so transformers does not refuse a row longer than one chunk whose segments
    each fit in one.

    Args:
        batch: canonical one-row batch (``seq_idx``, ``padding_mask``, ``cu_seqlens_padded``, ``max_seqlen``;
            :func:`seqpack.adapters.as_batch` fills them).
        config: ``model.config``; attn_implementation: as :func:`resolve_attn_implementation`.
        mask_dtype: dtype of the eager additive masks (default float32); device: where masks are built.

    Raises:
        ValueError: as :func:`resolve_attn_implementation` and
            :func:`~seqpack.adapters.attention_pattern.attention_pattern`; chunked layers under flash-attn
            with a segment longer than a chunk; a row of several segments at least as long as
            :func:`~seqpack.adapters.attention_pattern.slot_position_limit` (Llama-4 temperature tuning).
    """
    impl = resolve_attn_implementation(config, attn_implementation)
    pattern = attention_pattern(config)
    b = as_batch(batch)
    kinds = pattern.attention_kinds
    limit = slot_position_limit(config)
    T, n = int(b["input_ids"].shape[-1]), int((b["cu_seqlens"].diff() > 0).sum())  # segments with real tokens
    if limit is not None and T >= limit[0] and n > 1:
        raise ValueError(f"model_type {pattern.model_type!r}: a packed row of {T} slots with {n} segments is not exact: "
                         f"{limit[1]}; pack rows shorter than {limit[0]} slots (seq_length < {limit[0]}) or "
                         "set attn_temperature_tuning=False where the checkpoint allows")

    def build(layer):
        return attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"], impl,
                                mask_dtype=mask_dtype, device=device, **layer.mask_kwargs())

    if impl.startswith("flash_attention"):
        out: dict[str, Any] = {}
        for layer in kinds or {LayerAttention("full")}:
            out = build(layer)  # the same varlen kwargs for every kind; chunks longer than a segment are refused
        if pattern.keyed and any(k.kind == "chunked" for k in kinds):
            out["attention_mask"] = {key: None for key in pattern.masks}
        return out
    if len(kinds) <= 1:
        return build(next(iter(kinds)) if kinds else LayerAttention("full"))
    made = {layer: build(layer)["attention_mask"] for layer in kinds}
    return {"attention_mask": {key: (made[m] if m.kind != "none" else None) for key, m in pattern.masks.items()}}


def to_hf_inputs(batch: Mapping[str, Any], attn_implementation: str | None = None, *, config: Any = None,
                 mask_dtype=None, device=None, image_token_id: int | None = None,
                 spatial_merge_size: int | None = None) -> dict[str, Any]:
    """Turn a canonical THD batch into the exact keyword arguments of an HF causal LM's ``forward``.

    Args:
        batch: canonical batch dict (``format="thd"`` output, ``PackedSequence.to_torch()``,
            or ``seqpack.adapters.as_batch(...)``); one row.
        attn_implementation: optional; default ``config._attn_implementation`` (one of
            :data:`seqpack.packed.masks.ATTN_IMPLEMENTATIONS`); must agree with the config's when both are set.
        config: the model's config (``model.config``), required: the masks follow its attention pattern
            (:func:`model_attention_inputs`: sliding windows, chunked layers, a dict of masks per layer type).
        mask_dtype: dtype of the additive mask for ``eager`` (default float32).
        device: build masks on this device (default: where ``input_ids`` is).
        image_token_id, spatial_merge_size: the model's ``<|image_pad|>`` id and vision merge size
            (``config.image_token_id``, ``config.vision_config.spatial_merge_size``); only used to
            compute M-RoPE positions for a batch with ``image_grid_thw`` but no
            ``mrope_position_ids`` (``seqpack.hf.packed_forward`` passes them from the config).

    Returns:
        dict with ``input_ids, position_ids, labels (HF unshifted), shift_labels`` ``[1, T]`` and the
        attention inputs (:func:`model_attention_inputs`). An explicit final target on a segment's last
        physical slot has no unshifted slot: it stays in ``shift_labels`` only. Image rows (the batch
        carries ``mrope_position_ids`` int64 ``[3, T]``, or ``image_grid_thw``) get ``position_ids`` of
        shape ``[3, 1, T]``: Qwen2-VL M-RoPE positions restarting per segment. A ``[1, T]``
        ``position_ids`` would make HF Qwen2-VL skip its own ``get_rope_index`` and rotate image
        tokens with text positions.

    Raises:
        ValueError: no ``config``; unknown or mismatching ``attn_implementation``; an attention pattern
            seqpack cannot mask exactly (:func:`model_attention_inputs`); a batch with ``image_grid_thw``
            but neither ``mrope_position_ids`` nor ``image_token_id``/``spatial_merge_size`` to compute them.
    """
    with torch_hint("seqpack.adapters.hf_forward.to_hf_inputs()"):
        import torch

    resolve_attn_implementation(config, attn_implementation, what="to_hf_inputs")
    b = as_batch(batch)
    dev = device if device is not None else b["input_ids"].device
    extra = extra_hf_inputs(config, b["padding_mask"].to(dev))  # refuses what cannot pack (architecture)
    out: dict[str, Any] = {
        "input_ids": b["input_ids"].to(dev),
        "position_ids": b["position_ids"].to(dev),
    }
    mrope = _batch_mrope(batch, b, image_token_id, spatial_merge_size, config)
    if mrope is not None:
        out["position_ids"] = mrope[:, None, :].to(dev)  # [3, 1, T], Qwen2-VL's (axes, batch, T)
    if "labels" in b:
        lab = b["labels"]
        out["labels"] = unshift_labels(lab, b["cu_seqlens_padded"], final_target="drop").to(dev)
        out["shift_labels"] = lab.to(dev)
    out.update(model_attention_inputs(b, config, attn_implementation, mask_dtype=mask_dtype, device=dev))
    out.update(extra)
    for k in MEDIA_KEYS:  # VLM inputs travel as they are (segment order)
        if batch.get(k) is not None:
            out[k] = batch[k].to(dev) if isinstance(batch[k], torch.Tensor) else batch[k]
    return out


def _batch_mrope(batch: Mapping[str, Any], b: Mapping[str, Any], image_token_id, merge, config: Any = None):
    """M-RoPE table int64 ``[3, T]`` of a one-row batch, or None for a text row. With the model's ``config``,
    an image row for a model that does not take these tables is refused
    (:func:`seqpack.packed.mrope.mrope_model_config`, which also supplies the image token id and merge size)."""
    with torch_hint("seqpack.adapters.hf_forward"):
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
