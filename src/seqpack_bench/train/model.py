"""The models of the reference loop: tiny random-init configs built in code, or a local model folder."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from seqpack.sample import Sample
from seqpack_bench.train.checks import _check_model
from seqpack_bench.train.config import TINY_MODELS, TrainConfig, _namer


def tiny_config(family: str = "qwen3", *, vocab_size: int, hidden_size: int = 256, num_layers: int = 2,
                intermediate_size: int = 768, num_heads: int = 4, num_kv_heads: int = 2,
                max_position_embeddings: int = 32768, attn_implementation: str = "sdpa"):
    """A small random-init ``Qwen3Config`` / ``LlamaConfig`` built in code (no download).

    ``head_dim = hidden_size // num_heads``; dropout 0; untied embeddings; ``use_cache=False``.

    Raises:
        ValueError: unknown family, or ``hidden_size`` not divisible by ``num_heads``, or
            ``num_heads`` not divisible by ``num_kv_heads``.
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must divide by num_heads ({num_heads}) and num_heads by "
                         f"num_kv_heads ({num_kv_heads})")
    common = dict(vocab_size=int(vocab_size), hidden_size=hidden_size, num_hidden_layers=num_layers,
                  intermediate_size=intermediate_size, num_attention_heads=num_heads,
                  num_key_value_heads=num_kv_heads, head_dim=hidden_size // num_heads,
                  max_position_embeddings=max_position_embeddings, attention_dropout=0.0,
                  tie_word_embeddings=False, use_cache=False)
    if family == "qwen3":
        from transformers import Qwen3Config

        cfg = Qwen3Config(**common)
    elif family == "llama":
        from transformers import LlamaConfig

        cfg = LlamaConfig(**common)
    else:
        raise ValueError(f"unknown tiny model family {family!r}; use 'qwen3' or 'llama'")
    cfg._attn_implementation = attn_implementation
    return cfg


def build_model(cfg: TrainConfig, vocab_size: int | None):
    """Random-init tiny model (``tiny-*``) or ``from_pretrained(cfg.model)``, on ``cfg.device``/``cfg.dtype``.

    Raises:
        FileNotFoundError: ``cfg.model`` is neither a tiny name nor an existing folder.
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    if cfg.model in TINY_MODELS:
        conf = tiny_config(cfg.model.split("-", 1)[1], vocab_size=vocab_size, hidden_size=cfg.hidden_size,
                           num_layers=cfg.num_layers, intermediate_size=cfg.intermediate_size,
                           num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                           attn_implementation=cfg.attn_implementation)
        model = AutoModelForCausalLM.from_config(conf, attn_implementation=cfg.attn_implementation)
    else:
        _check_model(cfg, _namer(None))
        model = AutoModelForCausalLM.from_pretrained(cfg.model, attn_implementation=cfg.attn_implementation)
    model.config.use_cache = False
    return model.to(device=cfg.device, dtype=dtype).train()


def compact_vocabulary(samples: Sequence[Any], pad_token_id: int) -> tuple[list[Any], int, int]:
    """Remap token ids to ``0..V-1`` over the ids used by ``samples`` (plus the pad id).

    Returns:
        ``(new samples, V, new pad id)``; labels keep -100, other labels are remapped like ids.
    """
    used = np.unique(np.concatenate([np.asarray(s.input_ids, np.int64) for s in samples]
                                    + [np.asarray(s.labels, np.int64)[np.asarray(s.labels) >= 0] for s in samples]
                                    + [np.array([pad_token_id], np.int64)]))
    lut = np.full(int(used.max()) + 1, -1, np.int64)
    lut[used] = np.arange(used.shape[0])
    out = []
    for s in samples:
        lab = np.asarray(s.labels, np.int64)
        new_lab = np.where(lab >= 0, lut[np.maximum(lab, 0)], -100).astype(np.int32)
        out.append(Sample(input_ids=lut[np.asarray(s.input_ids, np.int64)].astype(np.int32), labels=new_lab,
                          sample_id=s.sample_id, source=s.source, index=s.index, media=s.media, meta=dict(s.meta)))
    return out, int(used.shape[0]), int(lut[pad_token_id])
