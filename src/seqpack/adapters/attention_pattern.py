"""Which tokens each layer of a transformers model attends to, read from its config (no transformers import).

:func:`attention_pattern` decides as transformers 5.x does (``masking_utils.create_masks_for_generate``
and the ``causal_mask_mapping`` dicts of the ``modeling_*.py`` files): a config with ``layer_types`` gets
one mask per layer type (``LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING``: ``full_attention`` causal,
``sliding_attention`` a window of ``config.sliding_window``, ``chunked_attention`` chunks of
``config.attention_chunk_size``); otherwise every layer slides when ``config.sliding_window`` is set
(Mistral, Mixtral, Phi-3, Starcoder2; Qwen3-MoE with ``use_sliding_window``, whose modeling file slides
every layer whatever ``max_window_layers`` says), is chunked when ``attention_chunk_size`` is set, and
is plain causal otherwise. ``use_sliding_window=False`` means no window (Qwen configs keep a
``sliding_window`` value then). Where ``layer_types`` exists, ``max_window_layers`` and
``sliding_window_pattern`` are already folded into it by the config class.

Refused: layer types whose keys and values are pooled along the whole row (DeepSeek-V4's
``compressed_sparse_attention`` / ``heavily_compressed_attention``: their compressors run across packed
segments, so no mask makes them exact) and any attention layer type not listed here.

Window semantics (transformers' ``sliding_window_overlay``): key ``k`` is visible to query ``q`` iff
``q - W < k <= q``, i.e. a window of ``W`` tokens including the query itself. Chunks
(``chunked_overlay``): ``q // C == k // C``, counted from the sample's first token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .architecture import PackingUnsupportedError

__all__ = ["LayerAttention", "AttentionPattern", "attention_pattern", "slot_position_limit", "text_config"]

#: transformers layer types -> (kind, config field holding the size); ``hybrid`` types expand to two keys
#: as in ``masking_utils.LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING``.
_LAYER_TYPES: dict[str, tuple[str, str | None]] = {
    "full_attention": ("full", None),
    "indexed_attention": ("full", None),
    "minimax_m3_sparse": ("full", None),
    "sliding_attention": ("sliding", "sliding_window"),
    "chunked_attention": ("chunked", "attention_chunk_size"),
    "linear_attention": ("none", None),
    "conv": ("none", None),
}
#: attention layer types no mask makes exact, with the reason.
_REFUSED = {
    "compressed_sparse_attention": "its key/value compressor pools tokens along the whole row, across packed segments",
    "heavily_compressed_attention": "its key/value compressor pools tokens along the whole row, across packed segments",
}
_HYBRID = {"hybrid": {"full_attention": "full_attention", "linear_attention": "linear_attention"},
           # transformers builds a plain causal mask under the "sliding_attention" key of a hybrid_sliding layer
           "hybrid_sliding": {"sliding_attention": "full_attention", "linear_attention": "linear_attention"}}


@dataclass(frozen=True)
class LayerAttention:
    """What one mask key covers.

    Attributes:
        kind: ``"full"`` (causal), ``"sliding"`` (window of ``size`` tokens, the query included),
            ``"chunked"`` (chunks of ``size`` tokens from the sample's start) or ``"none"`` (a layer that
            reads no attention mask: linear attention, convolutions, MLP blocks; transformers hands it
            ``None`` whenever the mask is 4-D).
        size: the window / chunk length in tokens (None for ``full`` and ``none``).
    """

    kind: str
    size: int | None = None

    def mask_kwargs(self) -> dict[str, int | None]:
        """``sliding_window=`` / ``chunk_size=`` for :func:`seqpack.packed.masks.attention_inputs`."""
        return {"sliding_window": self.size if self.kind == "sliding" else None,
                "chunk_size": self.size if self.kind == "chunked" else None}


@dataclass(frozen=True)
class AttentionPattern:
    """The attention pattern of a model.

    Attributes:
        model_type: ``config.model_type`` (for messages).
        layers: one :class:`LayerAttention` per decoder layer, in order.
        masks: the masks the model looks up, by transformers' key (``"full_attention"``,
            ``"sliding_attention"``, ...), each key once.
        keyed: True when the config has ``layer_types``, so the model can read ``attention_mask`` as a dict
            keyed by layer type (transformers' ``causal_mask_mapping``); False: it takes one mask for every
            layer (layers of different kinds then cannot be given their own masks).
    """

    model_type: str
    layers: tuple[LayerAttention, ...]
    masks: Mapping[str, LayerAttention]
    keyed: bool

    @property
    def attention_kinds(self) -> set[LayerAttention]:
        """The distinct masks the attention layers need (``none`` layers left out)."""
        return {m for m in self.masks.values() if m.kind != "none"}


def text_config(config: Any) -> Any:
    """The decoder's text config of a composite (vision-language) config, else ``config`` itself
    (``get_text_config(decoder=True)`` when the config has it, as ``create_masks_for_generate`` does)."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except TypeError:
            return get()
    return config


def _size(cfg: Any, field: str, layer_type: str, model_type: str) -> int:
    v = getattr(cfg, field, None)
    if v is None or isinstance(v, bool) or int(v) < 1:
        raise ValueError(f"model_type {model_type!r}: layer type {layer_type!r} needs config.{field}, which is {v!r}")
    return int(v)


def attention_pattern(config: Any) -> AttentionPattern:
    """The attention pattern of the model ``config`` describes (module docstring for the rules).

    Args:
        config: a transformers ``PretrainedConfig`` (or any object with the same attributes; composite
            configs are read through their text config). Read with ``getattr`` only.

    Returns:
        :class:`AttentionPattern`.

    Raises:
        ValueError: a bidirectional config (``is_causal=False``: seqpack's masks are causal); a layer type
            seqpack does not know how to mask (naming it and the model type); a sliding / chunked layer whose
            size field is missing.
    """
    cfg = text_config(config)
    model_type = str(getattr(cfg, "model_type", None) or getattr(config, "model_type", "?"))
    if getattr(cfg, "is_causal", True) is False:
        raise ValueError(f"model_type {model_type!r} is configured bidirectional (is_causal=False); seqpack's "
                         "packed masks are causal")
    layer_types = getattr(cfg, "layer_types", None)
    n = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    if layer_types:
        return _from_layer_types(cfg, list(layer_types), model_type)
    window = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is False or window in (0, False):
        window = None
    kind = ("sliding_attention" if window is not None
            else "chunked_attention" if getattr(cfg, "attention_chunk_size", None) is not None else "full_attention")
    pat = _from_layer_types(cfg, [kind] * max(n, 1), model_type)
    return AttentionPattern(model_type, pat.layers, pat.masks, keyed=False)


def _from_layer_types(cfg: Any, layer_types: list[str], model_type: str) -> AttentionPattern:
    def one(t: str) -> LayerAttention:
        if t in _REFUSED:
            raise PackingUnsupportedError(
                model_type, t, f"its layers of type {t!r}: {_REFUSED[t]}, so packed segments would see each other "
                "whatever the mask")
        if t not in _LAYER_TYPES:
            if "attention" in t:
                raise ValueError(
                    f"model_type {model_type!r} has layers of type {t!r}, an attention pattern seqpack does not know "
                    "how to mask per packed segment (it knows full, sliding and chunked attention); train this model "
                    "on padded batches (seqpack.collate.PaddedCollator)")
            return LayerAttention("none")
        kind, field = _LAYER_TYPES[t]
        return LayerAttention(kind, _size(cfg, field, t, model_type) if field else None)

    layers, masks = [], {}
    for t in layer_types:
        keys = _HYBRID.get(t, {t: t})
        for key, as_type in keys.items():
            masks.setdefault(key, one(as_type))
        layers.append(one(t) if t not in _HYBRID else masks[next(iter(keys))])
    return AttentionPattern(model_type, tuple(layers), masks, keyed=True)


def slot_position_limit(config: Any) -> tuple[int, str] | None:
    """The packed-row length from which the model reads a token's slot index in the row as its position.

    Llama-4's attention temperature tuning (``attn_temperature_tuning``, NoPE layers) scales queries by
    ``log1p(floor((i + 1) / floor_scale))`` with ``i`` the slot index in the row (``arange(T)``), not the
    token's position in its sample. All scales are 1 while ``T < floor_scale``, so shorter rows are exact.

    Returns:
        ``(limit, reason)``: rows of ``limit`` slots or more with more than one segment are inexact; None
        when the model reads no slot index.
    """
    cfg = text_config(config)
    nope = getattr(cfg, "no_rope_layers", None)
    if getattr(cfg, "attn_temperature_tuning", False) and nope and any(not int(x) for x in nope):
        fs = int(getattr(cfg, "floor_scale", 8192))
        return fs, (f"its attention temperature tuning (attn_temperature_tuning=True, floor_scale={fs}) scales the "
                    "queries of NoPE layers by each token's slot index in the row instead of its position in the "
                    "sample")
    return None
