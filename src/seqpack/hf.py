"""Run any HF causal LM on a packed THD row so segments never attend to each other.

What transformers 5.x does with packed ``position_ids`` alone (``transformers/masking_utils.py``,
``_preprocess_mask_arguments``): it infers segments from position restarts **only when**
``attention_mask is None`` **and** ``cache is None``. Both conditions fail in ordinary training:

- HF ``Trainer`` / most collators pass a 2-D all-ones ``attention_mask`` -> plain causal mask over the
  whole row (case B01);
- the model's default config has ``use_cache=True``, so ``Qwen3Model.forward`` (and Llama, Mixtral,
  Qwen3-MoE, ...) creates a ``DynamicCache`` even in train mode unless gradient checkpointing is on
  -> inference is skipped and segments cross-attend silently (measured on a random-init Qwen3 in
  ``tests/test_hf.py::test_B01_position_ids_alone_leak_with_default_config``).

So seqpack never relies on inference. :func:`packed_forward` (and ``format="hf"`` of the
collators, for ``Trainer``) passes the boundaries explicitly, by attention implementation:

=====================  =================================================================
``sdpa``               4-D bool ``attention_mask`` ``[1, 1, T, T]`` (True = attend)
``eager``              4-D additive float mask (0 / ``finfo.min``) in the model's dtype
``flex_attention``     FlexAttention ``BlockMask`` (forward only on CPU)
``flash_attention_2``  ``cu_seq_lens_q/k`` (physical boundaries) + ``max_length_q/k``, no mask
=====================  =================================================================

A 4-D mask is used by ``masking_utils`` exactly as given (early exit), whatever the cache or config.

Image rows (Qwen2-VL style VLMs): HF computes M-RoPE (``get_rope_index``) only when ``position_ids`` is
``None``; a ``[1, T]`` packed ``position_ids`` makes it rotate image tokens with text positions. So
image rows get ``position_ids`` ``[3, 1, T]``: each segment's M-RoPE table, restarting per segment
(``seqpack.packed.mrope.packed_mrope_position_ids``), and an image row without ``pixel_values`` is refused.
"""

from __future__ import annotations

from typing import Any, Mapping

from seqpack._torch import torch_hint

with torch_hint("seqpack.hf (packed_forward and the HF model helpers)"):
    import torch

from seqpack.adapters import to_hf_inputs
from seqpack.adapters.architecture import PackingUnsupportedError, check_packed_support
from seqpack.collate import PackedCollator
from seqpack.loss import packed_cross_entropy
from seqpack.moe import prepare_model, router_loss_settings
from seqpack.packed.masks import ATTN_IMPLEMENTATIONS
from seqpack.packed.mrope import mrope_model_config

__all__ = ["PackedAttentionError", "PackingUnsupportedError", "packed_forward", "check_hf_inputs",
           "install_packing_guard", "hf_inputs", "prepare_model", "check_packed_support"]


class PackedAttentionError(ValueError):
    """Inputs that would let packed segments attend to each other (message says what to do)."""


_FIX = (
    "Use seqpack.hf.packed_forward(model, batch) with a seqpack THD batch, or a seqpack collator with "
    "format='hf', config=model.config, which pass an explicit 4-D block-diagonal mask (sdpa/eager; "
    "with the model's sliding windows and chunks), a BlockMask (flex) or cu_seq_lens_q/k (flash_attention_2)."
)


def _has_restarts(position_ids, mask2d=None) -> bool:
    """Positions restart inside a row (packing). With a 2-D padding mask only real slots count, so
    generate()'s left padding (positions ``[1, 1, 0, 1, 2]`` under mask ``[0, 0, 1, 1, 1]``) is not packing."""
    p = torch.as_tensor(position_ids)
    mrope = p.dim() == 3  # M-RoPE [3 or 4, B, T]: axis 0 (temporal / text) never decreases inside one sample
    if mrope:
        p = p[0]
    if p.dim() == 1:
        p = p.unsqueeze(0)
    if p.shape[-1] < 2:
        return False

    def restarts(d):
        # image tokens hold the temporal position (diff 0) and the text after an image jumps ahead,
        # so for M-RoPE only a decrease marks a new sample
        return bool((d < 0).any()) if mrope else bool((d != 1).any())

    if mask2d is None:
        return restarts(torch.diff(p, dim=-1))
    m = torch.as_tensor(mask2d).to(torch.bool)
    p = p.expand(m.shape[0], -1) if p.shape[0] != m.shape[0] else p
    for row, keep in zip(p, m):
        r = row[keep]
        if r.numel() > 1 and restarts(torch.diff(r)):
            return True
    return False


def check_hf_inputs(inputs: Mapping[str, Any], *, attn_implementation: str | None = None) -> None:
    """Refuse HF forward kwargs under which packed segments would cross-attend.

    Refused (``PackedAttentionError``):

    - ``position_ids`` restart inside a row (packed) next to a 2-D ``attention_mask`` (case B01:
      transformers then builds a plain causal mask over the whole row);
    - packed ``position_ids`` with no mask and no ``cu_seq_lens_q`` (boundaries left to HF's
      inference, which is off whenever a cache exists, e.g. default ``use_cache=True``), unless the
      call explicitly sets ``use_cache=False`` and passes no cache.
    - a flash implementation given a 4-D mask but no ``cu_seq_lens_q`` (flash ignores 4-D masks).

    Args:
        inputs: the keyword arguments of ``model.forward``.
        attn_implementation: ``model.config._attn_implementation`` when known.
    """
    pos = inputs.get("position_ids")
    mask = inputs.get("attention_mask")
    mask2d = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
    if pos is None or not _has_restarts(pos, mask2d):
        return
    has_cu = inputs.get("cu_seq_lens_q") is not None
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        raise PackedAttentionError(
            f"packed position_ids (restarting inside a row) together with a 2-D attention_mask of shape "
            f"{tuple(mask.shape)}: transformers ignores the restarts then and every token attends to earlier "
            f"packed samples (B01). Drop the 2-D mask. {_FIX}"
        )
    if attn_implementation and attn_implementation.startswith("flash") and not has_cu:
        raise PackedAttentionError(
            f"attn_implementation={attn_implementation!r} with packed position_ids but no cu_seq_lens_q: "
            f"pass the varlen boundaries. {_FIX}"
        )
    if mask is None and not has_cu:
        if inputs.get("use_cache") is False and inputs.get("cache") is None and inputs.get("past_key_values") is None:
            return
        raise PackedAttentionError(
            "packed position_ids with attention_mask=None and no cu_seq_lens_q: transformers infers the "
            "segments only when no cache exists, but the default config (use_cache=True) creates one in train "
            f"mode, so segments cross-attend. {_FIX}"
        )


def _guard_hook(module, args, kwargs):
    check_hf_inputs(kwargs, attn_implementation=getattr(module.config, "_attn_implementation", None))
    mask = kwargs.get("attention_mask")
    if (isinstance(mask, torch.Tensor) and mask.dim() == 4) or isinstance(mask, Mapping) \
            or kwargs.get("cu_seq_lens_q") is not None:  # a packed batch: the architecture must take it
        check_packed_support(module.config, output_router_logits=kwargs.get("output_router_logits"))
    return None


def install_packing_guard(model: torch.nn.Module):
    """Make ``model`` refuse inputs that would cross-attend (see :func:`check_hf_inputs`), and packed
    inputs (a 4-D or per-layer mask, ``cu_seq_lens_q``) for an architecture that cannot take them or for
    router statistics on a model :func:`prepare_model` did not prepare
    (:func:`seqpack.adapters.architecture.check_packed_support`, ``PackingUnsupportedError``).

    Registers a forward pre-hook (``with_kwargs=True``) on ``model``; returns the hook handle
    (``handle.remove()`` undoes it). Useful around third-party trainers and collators.
    """
    return model.register_forward_pre_hook(_guard_hook, with_kwargs=True)


def _model_device_dtype(model) -> tuple[torch.device, torch.dtype]:
    for p in model.parameters():
        return p.device, (p.dtype if p.is_floating_point() else torch.float32)
    return torch.device("cpu"), torch.float32


def _image_config(model) -> tuple[int | None, int | None]:
    """``(image_token_id, spatial_merge_size)`` of a model that takes seqpack's M-RoPE tables
    (``seqpack.packed.mrope.mrope_model_config``), else ``(None, None)`` (text models; other VLMs, whose
    image rows :func:`_refuse_image_row_without_pixels` refuses)."""
    try:
        return mrope_model_config(model.config)
    except ValueError:
        return None, None


def _as_mapping(batch: Any) -> Mapping[str, Any]:
    """A ``PackedSequence`` (or any non-mapping row) -> the canonical batch, via the collator's path
    (``PackedCollator()([row])``: media concatenated, M-RoPE table carried)."""
    if isinstance(batch, Mapping):
        return batch
    return PackedCollator()([batch])


def _refuse_image_row_without_pixels(model, batch: Mapping[str, Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse an image row the model cannot run exactly: video inputs (the tables cover images only), a
    model whose positions are not seqpack's M-RoPE tables (``mrope_model_config``), flash attention (its
    varlen kwargs collide with the vision tower's), no ``pixel_values`` (placeholders embedded as text), or
    pixels of another patch size than the vision tower's."""
    video = [k for k in ("pixel_values_videos", "video_grid_thw")
             if batch.get(k) is not None or kwargs.get(k) is not None]
    if video:
        raise ValueError(
            f"packed_forward got video inputs ({', '.join(video)}): seqpack's M-RoPE tables cover images only "
            "(Qwen2.5-VL spaces video frames by second_per_grid_ts * tokens_per_second, Qwen3-VL by timestamp "
            "tokens), so video tokens would get text positions. Train video samples unpacked")
    cfg = model.config
    tok = getattr(cfg, "image_token_id", None)
    pixels = batch.get("pixel_values") if batch.get("pixel_values") is not None else kwargs.get("pixel_values")
    reason = None
    if pixels is not None:
        reason = "it carries pixel_values"
    elif batch.get("image_grid_thw") is not None:
        reason = "it carries image_grid_thw"
    elif batch.get("mrope_position_ids") is not None:
        reason = "it carries M-RoPE positions (mrope_position_ids) of image segments"
    elif tok is not None and bool((torch.as_tensor(batch["input_ids"]) == int(tok)).any()):
        reason = f"its input_ids contain the image token {int(tok)}"
    if reason is None:
        return
    try:
        mrope_model_config(cfg)
    except ValueError as e:
        raise ValueError(f"packed_forward got an image row ({reason}) for this model: {e}") from None
    impl = str(getattr(cfg, "_attn_implementation", None) or "")
    if impl.startswith("flash"):
        raise ValueError(
            f"packed_forward got an image row ({reason}) for attn_implementation={impl!r}: transformers hands the "
            "decoder's varlen arguments (cu_seq_lens_q/k) to the vision tower as well, whose flash attention "
            "passes its own per-image cu_seqlens (TypeError: multiple values for 'cu_seq_lens_q'). Load the "
            "model with attn_implementation='sdpa' or 'eager' for image rows")
    if pixels is None and kwargs.get("inputs_embeds") is None:
        raise ValueError(
            f"packed_forward got an image row without pixel_values ({reason}); running it would embed the "
            "<|image_pad|> placeholders as text. Offline packs store image paths, not pixels: open the data with "
            "seqpack.io.load_packed(path, load_media=True) (or give the samples media['pixel_values']) and "
            "collate with seqpack.collate.PackedCollator / InBatchPackingCollator.")
    vc = cfg.vision_config
    want = int(vc.in_channels) * int(vc.temporal_patch_size) * int(vc.patch_size) ** 2
    if pixels is not None and int(pixels.shape[-1]) != want:
        raise ValueError(
            f"pixel_values have {int(pixels.shape[-1])} values per patch but the vision tower of model_type "
            f"{cfg.model_type!r} takes {want} (in_channels {vc.in_channels} x temporal_patch_size "
            f"{vc.temporal_patch_size} x patch_size {vc.patch_size}^2): build the image processor with the "
            "model's own preprocessor_config.json (seqpack.data.media.load_image_processor(path); Qwen3-VL "
            "uses patch_size 16, Qwen2-VL / Qwen2.5-VL 14)")


def hf_inputs(model, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The forward kwargs :func:`packed_forward` passes (see ``seqpack.adapters.to_hf_inputs``), on the model's device.

    The masks follow ``model.config`` (its ``attn_implementation`` and attention pattern: sliding-window
    and chunked layers get their own masks). ``batch`` may also be a ``PackedSequence`` (converted with
    ``PackedCollator()([row])``). Image rows get M-RoPE ``position_ids`` ``[3, 1, T]`` (computed from
    ``image_grid_thw`` and the config's ``image_token_id`` / ``vision_config.spatial_merge_size`` when the
    batch has no table).

    Raises:
        ValueError: an attention implementation or pattern seqpack cannot mask exactly (the reason named).
    """
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"packed_forward supports attn_implementation in {ATTN_IMPLEMENTATIONS}; model has {impl!r}")
    batch = _as_mapping(batch)
    device, dtype = _model_device_dtype(model)
    tok, merge = _image_config(model)
    return to_hf_inputs(batch, config=model.config, mask_dtype=dtype, device=device, image_token_id=tok,
                        spatial_merge_size=merge)


def packed_forward(model, batch: Mapping[str, Any], *, compute_loss: bool = True, **kwargs):
    """Run an HF causal LM on one packed THD row; segments stay independent and positions restart.

    Works with the model as loaded (default config, train or eval mode), for ``attn_implementation``
    ``sdpa``, ``eager``, ``flex_attention`` (forward only on CPU) and ``flash_attention_2/3`` (GPU).

    Args:
        model: a ``transformers`` causal LM (``AutoModelForCausalLM``) or a Qwen2-VL-style VLM
            (``Qwen2VLForConditionalGeneration``).
        batch: canonical THD batch (``format="thd"`` output of a seqpack collator,
            ``PackedSequence.to_torch()``) or a ``PackedSequence`` (converted exactly as
            ``PackedCollator()([row])`` does); must carry ``cu_seqlens`` and ``cu_seqlens_padded``.
            A batch carrying a 2-D ``attention_mask`` is refused (B01). Image rows must carry
            ``pixel_values`` + ``image_grid_thw`` (collators, ``load_packed(..., load_media=True)``);
            they run with M-RoPE ``position_ids`` ``[3, 1, T]`` restarting per segment.
        compute_loss: ``outputs.loss`` = token-mean cross entropy (fp32, nats) over this row's loss
            tokens, ``sum / max(n, 1)`` as :func:`seqpack.loss.packed_cross_entropy` (a row without
            loss tokens gives 0 and zero gradients, never NaN); ``num_items_in_batch=`` in kwargs
            replaces ``n``. For global token normalisation across micro-batches use
            ``seqpack.loss`` on ``outputs.logits``.
        **kwargs: forwarded to ``model(...)``. With ``output_router_logits=True`` (or the config's) on
            an MoE model, the model is prepared with :func:`prepare_model` (once) and runs its own
            forward; ``aux_loss`` is its ``load_balancing_loss_func`` over real tokens (what transformers
            gives the same samples as a padded batch) and ``loss`` adds ``router_aux_loss_coef * aux_loss``
            as the model's forward does.

    Returns:
        the model output; ``logits`` is ``[1, T, V]`` (values at padding slots are meaningless).

    Raises:
        PackingUnsupportedError: the architecture cannot run packed rows exactly (state-carrying layers,
            ALiBi from a 2-D mask; :func:`seqpack.adapters.architecture.check_packed_support`).
        PackedAttentionError: the batch has a 2-D ``attention_mask``.
        KeyError: the batch lacks boundary arrays.
        ValueError: an image row without ``pixel_values`` (fix: ``load_packed(..., load_media=True)``), or
            one this model cannot run exactly: a model type outside
            ``seqpack.packed.mrope.MROPE_MODEL_TYPES``, video inputs, flash attention, pixels of another
            patch size than the vision tower's (each named in the message).
    """
    batch = _as_mapping(batch)
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        raise PackedAttentionError(
            "packed_forward got a batch with a 2-D attention_mask; boundaries come from cu_seqlens/"
            f"cu_seqlens_padded, and a 2-D mask next to packed positions cross-attends (B01). {_FIX}"
        )
    _refuse_image_row_without_pixels(model, batch, kwargs)
    kwargs.setdefault("use_cache", False)
    want_router = kwargs.get("output_router_logits")
    if want_router is None:
        want_router = bool(getattr(model.config, "output_router_logits", False))
    if want_router or getattr(model.config, "output_router_logits", False):
        prepare_model(model)  # hf_inputs then carries padding_mask, which the router hook pops
    inputs = hf_inputs(model, batch)
    # the loss is ours, not HF's ForCausalLMLoss: its mean over 0 targets is NaN (0/0)
    inputs.pop("labels", None)
    shift = inputs.pop("shift_labels", None)
    num_items = kwargs.pop("num_items_in_batch", None)
    out = model(**inputs, **kwargs)
    if shift is not None and compute_loss:
        ls, n = packed_cross_entropy(out.logits, shift)
        denom = torch.as_tensor(num_items if num_items is not None else n, device=ls.device)
        out.loss = ls / denom.clamp(min=1).to(ls.dtype)
        if want_router and getattr(out, "aux_loss", None) is not None:
            out.loss = out.loss + router_loss_settings(model)[3] * out.aux_loss.to(out.loss.device)
    return out
