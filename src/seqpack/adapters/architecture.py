"""Whether a transformers model runs a packed row exactly, decided from its config (no transformers import).

:func:`check_packed_support` is the one check every HF path calls (``seqpack.hf.packed_forward``,
``seqpack.hf.hf_inputs``, ``format="hf"`` collators given ``config=``); setup-time validation
(:mod:`seqpack.config.rules`) calls :func:`check_model_type` for the transformers model types a registry
family names. A model is refused when some layer cannot keep packed segments apart:

- **state-carrying layers** (Mamba/Mamba2 scans, gated delta nets and other linear attention, short
  convolutions, RG-LRU, RWKV, mLSTM): the state runs from one segment into the next. transformers 5.x
  hands these layers no segment boundaries on the torch path (``torch_chunk_gated_delta_rule`` and
  ``causal_conv1d_fn`` swallow ``cu_seqlens`` / ``seq_idx`` in ``**kwargs``; the Mamba ``torch_forward``
  and ``slow_forward`` take none), and a 4-D mask gives them no padding mask either
  (``masking_utils.create_recurrent_attention_mask`` returns None for it). The layers are read from
  ``config.layer_types`` when the config has it (LFM2 with only ``full_attention`` layers packs), else
  from the model type (:data:`STATE_MODEL_TYPES`).
- **ALiBi built from a 2-D mask** (Bloom; Falcon with ``alibi=True``): ``build_alibi_tensor`` unpacks
  ``attention_mask.shape`` as ``(batch, seq)``, so a 4-D block mask raises inside the model, and a 2-D
  mask over a packed row lets segments attend to each other.
- **a mask of its own** (CPM-Ant, :data:`OWN_MASK_MODEL_TYPES`): the model ignores ``attention_mask``.
- **MoE router statistics** (``output_router_logits=True``) through ``model(**batch)`` when the model was
  not prepared with ``seqpack.hf.prepare_model``: transformers' ``load_balancing_loss_func`` reads the
  4-D mask as a padding mask (crash) or, with flash-attn inputs, counts padding slots.

What to do instead is in every message: padded batches (``seqpack.collate.PaddedCollator``), or
``packing="none"``.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = [
    "PackingUnsupportedError",
    "STATE_LAYER_KINDS",
    "STATE_LAYER_TYPES",
    "STATE_MODEL_TYPES",
    "ALIBI_FROM_2D_MASK",
    "OWN_MASK_MODEL_TYPES",
    "check_packed_support",
    "check_model_type",
    "model_type_problem",
    "packed_support_problem",
    "extra_hf_inputs",
    "mark_router_prepared",
    "router_prepared",
]

_INSTEAD = ("train this model on padded batches (seqpack.collate.PaddedCollator, one sample per row with a 2-D "
            "attention_mask) or set packing='none'")


class PackingUnsupportedError(ValueError):
    """A model that cannot run packed rows exactly. Attributes: ``model_type``, ``layer_kind`` (what
    breaks, e.g. ``"mamba2"``, ``"alibi"``, ``"moe_router"``) and ``reason``; the message also says
    what to do instead."""

    def __init__(self, model_type: str, layer_kind: str, reason: str, instead: str = _INSTEAD):
        self.model_type, self.layer_kind, self.reason = model_type, layer_kind, reason
        super().__init__(f"seqpack cannot pack model_type {model_type!r} exactly: {reason}. Instead, {instead}.")


#: State-carrying layer kinds -> what they are (the kind keys match the registry's ``attention_kinds``).
STATE_LAYER_KINDS: dict[str, str] = {
    "gated_delta_net": "gated delta-rule linear attention with a causal conv1d (recurrent state)",
    "linear_attention": "linear attention (recurrent state)",
    "mamba": "Mamba selective-scan SSM with a causal conv1d (recurrent state)",
    "mamba2": "Mamba2 SSM with a causal conv1d (recurrent state)",
    "short_conv": "gated short convolution (a causal conv1d over the previous tokens)",
    "rg_lru": "RG-LRU recurrent block with a causal conv1d (recurrent state)",
    "rwkv": "RWKV time mixing (recurrent state)",
    "mlstm": "mLSTM block (recurrent state)",
}

#: ``config.layer_types`` values of layers that carry a state along the sequence (transformers'
#: ``masking_utils.LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING`` gives them ``create_recurrent_attention_mask``,
#: the hybrid ones run such a mixer beside attention). ``None``: the model type's kind applies.
STATE_LAYER_TYPES: dict[str, str | None] = {
    "linear_attention": None, "conv": "short_conv", "hybrid": None, "hybrid_sliding": None,
    "mamba": "mamba", "recurrent": "rg_lru",
}

#: transformers model types whose layers can carry a state (transformers 5.24, every ``*ForCausalLM``
#: whose modeling file keeps a conv / recurrent / SSM state) -> the kind of those layers.
STATE_MODEL_TYPES: dict[str, str] = {
    **dict.fromkeys(("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "olmo_hybrid",
                     "qwen4_exp", "qwen4_exp_text"), "gated_delta_net"),
    **dict.fromkeys(("kimi_linear", "bailing_hybrid", "lara_mini", "minimax"), "linear_attention"),
    **dict.fromkeys(("mamba", "falcon_mamba", "jamba", "zamba"), "mamba"),
    **dict.fromkeys(("mamba2", "bamba", "nemotron_h", "granitemoehybrid", "zamba2", "falcon_h1"), "mamba2"),
    **dict.fromkeys(("lfm2", "lfm2_moe", "lfm3", "lfm3_vl", "lfm2_vl", "inkling_text", "inkling2_text",
                     "inkling2_loop_text", "zaya"), "short_conv"),
    "recurrent_gemma": "rg_lru",
    "rwkv": "rwkv",
    "xlstm": "mlstm",
}

#: model types whose ALiBi bias is built from a 2-D ``attention_mask`` (value: the config flag that turns
#: ALiBi on, or None when it is always on).
ALIBI_FROM_2D_MASK: dict[str, str | None] = {"bloom": None, "falcon": "alibi"}

#: model types that build their attention mask from inputs of their own and ignore ``attention_mask``
OWN_MASK_MODEL_TYPES: dict[str, str] = {
    "cpmant": "CPM-Ant builds its attention mask from its own span/context/length inputs "
              "(CpmAntModel._prepare_attention_mask) and ignores attention_mask",
}

#: model types whose attention (or position scheme) does not follow the supplied 4-D mask / per-segment
#: ``position_ids`` -> (layer kind, why); measured by the architecture matrix (tests/models).
OTHER_UNSUPPORTED: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("axk2", "deepseek_v32", "dots3_note_text", "glm_moe_dsa", "hy_v4"), (
        "indexed_attention",
        "its indexed sparse attention (DeepSeek Sparse Attention) picks each query's top-k keys with a lightning "
        "indexer over the whole row, outside the attention mask, so a query of one packed segment selects keys "
        "of the others")),
    "moshi": ("sliding_window",
              "it builds its sliding-window mask inside the model from sliding_window (no layer_types), so the "
              "window of a supplied 4-D mask is not applied the way the model applies it alone"),
    "openai-gpt": ("mask_2d_only", "its attention takes only a 2-D attention_mask (a 4-D block mask raises), and a "
                                   "2-D mask over a packed row lets segments attend to each other"),
    "xlnet": ("two_stream_attention", "its two-stream relative attention builds its own masks (perm_mask, "
                                      "target_mapping) and rejects a 4-D block mask"),
    "trocr": ("absolute_positions", "its learned positions come from the input length, not from position_ids, so "
                                    "positions keep counting across packed segments"),
}

_PREPARED: dict[int, Any] = {}  # id(config) -> weakref to the config of a model prepare_model hooked


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except (TypeError, ValueError):
            pass
    return config


def _state_problem(model_type: str, layer_types: Iterable[str] | None) -> PackingUnsupportedError | None:
    kind = STATE_MODEL_TYPES.get(model_type)
    if layer_types is not None:
        layer_types = list(layer_types)
        idx = [i for i, t in enumerate(layer_types) if t in STATE_LAYER_TYPES]
        if not idx:
            return None
        kind = STATE_LAYER_TYPES[layer_types[idx[0]]] or kind or "linear_attention"
        where = f"layers {idx[:8]}{'...' if len(idx) > 8 else ''} of layer_types ({layer_types[idx[0]]!r})"
    elif kind is None:
        return None
    else:
        where = "its layers"
    return PackingUnsupportedError(
        model_type, kind,
        f"{where} are {kind} layers ({STATE_LAYER_KINDS[kind]}) that carry a state from one token to the next, "
        "so each packed segment would start from the state left by the previous one; transformers' "
        "implementation takes no per-segment boundaries on this path (the torch kernels ignore cu_seqlens / "
        "seq_idx)")


def _alibi_problem(model_type: str, cfg: Any) -> PackingUnsupportedError | None:
    if model_type not in ALIBI_FROM_2D_MASK:
        return None
    flag = ALIBI_FROM_2D_MASK[model_type]
    if flag is not None and cfg is not None and not getattr(cfg, flag, False):
        return None
    on = "" if flag is None else f" ({flag}=True)"
    return PackingUnsupportedError(
        model_type, "alibi",
        f"its ALiBi bias{on} is built from a 2-D attention_mask (build_alibi_tensor), so transformers raises on "
        "the 4-D block-diagonal mask a packed row needs, and a 2-D mask over a packed row lets segments attend "
        "to each other")


def _own_mask_problem(model_type: str) -> PackingUnsupportedError | None:
    why = OWN_MASK_MODEL_TYPES.get(model_type)
    if why is not None:
        return PackingUnsupportedError(
            model_type, "own_mask", f"{why}, so the block-diagonal mask of a packed row never reaches its attention")
    other = OTHER_UNSUPPORTED.get(model_type)
    return None if other is None else PackingUnsupportedError(model_type, *other)


def packed_support_problem(config: Any, *, router_hook: bool = True,
                           output_router_logits: bool | None = None) -> PackingUnsupportedError | None:
    """The reason ``config``'s model cannot run packed rows exactly, or None (module docstring).

    Args:
        config: a transformers ``PretrainedConfig`` (composite configs are read through their decoder's
            text config); read with ``getattr`` only.
        router_hook: also refuse ``output_router_logits=True`` on a model that ``seqpack.hf.prepare_model``
            has not prepared (``packed_forward`` prepares the model itself and passes False).
        output_router_logits: the call's own ``output_router_logits`` (None: the config's).

    Returns:
        a :class:`PackingUnsupportedError` (not raised), or None.
    """
    cfg = _text_config(config)
    model_type = str(getattr(cfg, "model_type", None) or getattr(config, "model_type", ""))
    lt = getattr(cfg, "layer_types", None)
    found = (_state_problem(model_type, lt if isinstance(lt, (list, tuple)) else None)
             or _alibi_problem(model_type, cfg) or _own_mask_problem(model_type))
    wants = getattr(cfg, "output_router_logits", False) if output_router_logits is None else output_router_logits
    if found is None and router_hook and wants and not router_prepared(config):
        found = PackingUnsupportedError(
            model_type, "moe_router",
            "output_router_logits=True, and transformers' load_balancing_loss_func reads attention_mask as a 2-D "
            "padding mask: the 4-D block mask of a packed row crashes it, flash-attn inputs make it count the "
            "padding slots",
            "call seqpack.hf.prepare_model(model) once before Trainer(...) / model(**batch) (the router loss then "
            "counts real tokens only), or set config.output_router_logits=False")
    return found


def check_packed_support(config: Any, *, router_hook: bool = True, output_router_logits: bool | None = None) -> None:
    """Raise :class:`PackingUnsupportedError` when ``config``'s model cannot run packed rows exactly.

    See :func:`packed_support_problem` for the arguments; the message names the model type, the layer
    kind and what to do instead.
    """
    found = packed_support_problem(config, router_hook=router_hook, output_router_logits=output_router_logits)
    if found is not None:
        raise found


def model_type_problem(model_type: str) -> PackingUnsupportedError | None:
    """Setup-time form of :func:`packed_support_problem` for a transformers ``model_type`` without a config:
    the types whose released models carry state-carrying layers (:data:`STATE_MODEL_TYPES`) or always
    build ALiBi from a 2-D mask (Bloom; Falcon only with ``alibi=True``, so not here). None when it packs."""
    if ALIBI_FROM_2D_MASK.get(model_type, "") is None:
        return _alibi_problem(model_type, None)
    return _state_problem(model_type, None) or _own_mask_problem(model_type)


def check_model_type(model_type: str) -> None:
    """Raise :func:`model_type_problem`'s :class:`PackingUnsupportedError` for ``model_type``, if any."""
    found = model_type_problem(model_type)
    if found is not None:
        raise found


def extra_hf_inputs(config: Any, padding_mask: Any) -> dict[str, Any]:
    """What a ``format="hf"`` batch built for ``config``'s model needs beside the attention inputs, after
    :func:`check_packed_support` (``to_hf_inputs(config=...)`` and the collators given ``config=`` call it).

    Args:
        config: the model's config (``model.config``).
        padding_mask: bool ``[1, T]``, True = pad (the batch's ``padding_mask``).

    Returns:
        ``{"padding_mask": padding_mask}`` when ``seqpack.hf.prepare_model`` hooked the model (its hook pops
        the key before the model runs and counts router statistics over real tokens only), else ``{}``.

    Raises:
        PackingUnsupportedError: as :func:`check_packed_support`.
    """
    check_packed_support(config)
    return {"padding_mask": padding_mask} if router_prepared(config) else {}


def mark_router_prepared(config: Any) -> None:
    """Record that the model owning ``config`` has seqpack's router hooks (``seqpack.hf.prepare_model``)."""
    import weakref

    try:
        _PREPARED[id(config)] = weakref.ref(config)
    except TypeError:  # not weak-referenceable: keep it alive
        _PREPARED[id(config)] = lambda c=config: c


def router_prepared(config: Any) -> bool:
    """Whether :func:`mark_router_prepared` saw ``config`` (the same object)."""
    ref = _PREPARED.get(id(config))
    return ref is not None and ref() is config
