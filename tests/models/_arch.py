"""The architecture matrix: every causal LM transformers ships, built tiny, run packed and alone.

Discovery: every entry of ``transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``
(model type -> class name) of the installed transformers; nothing is hand-picked. Each entry ends in one
of three outcomes (:func:`run_model_type`):

- ``exact``: built offline from a tiny config (:func:`tiny_config`, the default config shrunk by
  generic rules), and the logits and every parameter gradient of each packed path equal transformers'
  own per-sample forward (each sample alone, ``model(input_ids=..., labels=...)``) within
  :data:`ATOL` + :data:`RTOL` * |reference| (fp32, CPU, default attention implementation);
- ``refused``: ``seqpack.adapters.architecture.check_packed_support(config)`` refuses the config
  (``PackingUnsupportedError``; its message is the recorded reason);
- ``skipped``: not a decoder-only causal LM that builds offline from its config alone (reason recorded:
  encoder-decoder, bidirectional encoder, multimodal wrapper, build/forward error of the plain model);
- ``mismatch``: any other outcome (a packed path differs, or raises) -- the matrix test fails on it.

The packed paths (:data:`PATHS`), all on the same samples and one model build:

- ``hf``: ``InBatchPackingCollator(format="hf")`` output into ``model(**batch)`` (as ``transformers.Trainer``
  calls the model; HF computes the loss from ``shift_labels``);
- ``forward``: ``InBatchPackingCollator()`` (THD) into ``seqpack.hf.packed_forward``;
- ``offline``: ``seqpack.pack_dataset`` -> ``seqpack.load_packed`` -> ``PackedCollator`` ->
  ``packed_forward``, segments padded to a multiple of :data:`PAD_MULTIPLE`;
- ``stream``: ``seqpack.stream.StreamingPacker`` rows -> ``PackedCollator`` -> ``packed_forward``.

Samples: :data:`CHATS` packed by ``pack_dataset`` with the embedded Qwen3 tokenizer and chat template
(assistant-only labels); the per-sample reference and the other paths use the same samples
(``seqpack.data.prepare``), token ids taken modulo the tiny vocabulary :data:`VOCAB` (the offline rows
likewise), which keeps lengths, label masks and boundaries. Windows and chunks are :data:`WINDOW`
tokens, shorter than every sample.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 512
WINDOW = 4
HIDDEN = 32
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 8
INTERMEDIATE = 64
MOE_INTERMEDIATE = 16
EXPERTS = 4
TOP_K = 2
MAX_LAYERS = 4
PAD_MULTIPLE = 8
SEQ_LENGTH = 256
ATOL = 1e-5
RTOL = 1e-5
PATHS = ("hf", "forward", "offline", "stream")

#: Three short chats (one multi-turn); with the Qwen3 chat template they tokenize to ~15-40 tokens.
CHATS = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]},
    {"messages": [{"role": "user", "content": "Name a colour"}, {"role": "assistant", "content": "Blue, like the sky"}]},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]},
]

#: Model types that mismatch today and that seqpack neither makes exact nor refuses yet: each is an
#: expected failure with the layer it breaks on, shown as ``mismatch`` in README's table; one that
#: stops mismatching (made exact or refused) fails until it is removed here.
OPEN: dict[str, str] = {}

# --------------------------------------------------------------------------------------------- configs

_HIDDEN_KEYS = {"hidden_size", "n_embd", "d_model", "dim", "embed_dim", "emb_dim", "n_embed", "embedding_size",
                "word_embed_proj_dim", "attention_hidden_size", "embedding_dim", "input_embedding_size",
                "output_embedding_size", "lru_width", "backbone_hidden_size"}
_FFN_KEYS = {"intermediate_size", "ffn_dim", "n_inner", "d_ff", "dff", "decoder_ffn_dim", "encoder_ffn_dim",
             "feed_forward_size", "ffn_hidden_size", "intermediate_size_mlp", "dense_intermediate_size", "dim_ff",
             "d_inner"}
_MOE_FFN_KEYS = {"moe_intermediate_size", "shared_intermediate_size", "shared_expert_intermediate_size",
                 "expert_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                 "shared_experts_intermediate_size"}
_LAYER_KEYS = {"num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"}
_HEAD_KEYS = {"num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads", "attention_heads",
              "swa_num_attention_heads"}
_KV_KEYS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads", "num_query_groups", "swa_num_key_value_heads"}
_HEAD_DIM_KEYS = {"head_dim", "dim_head", "d_head", "attention_head_size", "attention_head_dim", "kv_channels",
                  "swa_head_dim", "rotary_dim", "v_head_dim", "linear_key_head_dim",
                  "linear_value_head_dim", "index_head_dim", "linear_head_dim", "mamba_d_head", "mamba_head_dim"}
_EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
_TOPK_KEYS = {"num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token"}
_ONE_KEYS = {"n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "n_group", "topk_group",
             "num_expert_group", "first_k_dense_replace", "num_dense_layers", "num_nextn_predict_layers"}
_WINDOW_KEYS = {"sliding_window", "attention_chunk_size", "sliding_window_size", "attention_window_size",
                "local_attention_window_len", "window_size"}
_POS_KEYS = {"max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_target_positions"}
_SMALL_DIM_KEYS = {"kv_lora_rank": 16, "q_lora_rank": 16, "qk_head_dim": 2 * HEAD_DIM, "qk_rope_head_dim": HEAD_DIM,
                   "qk_nope_head_dim": HEAD_DIM, "linear_num_key_heads": 2,
                   "linear_num_value_heads": 4, "index_n_heads": 2, "mamba_d_state": 8, "state_size": 8,
                   "ssm_state_size": 8, "mamba_n_heads": 4, "mamba_num_heads": 4, "linear_num_heads": 4,
                   "index_topk": 4, "laurel_rank": 4}
_ZERO_SUFFIXES = ("dropout", "pdrop", "dropout_prob", "dropout_p", "layerdrop", "jitter_noise")

#: Per-model overrides: only where a default cannot be shrunk by the generic rules (applied last).
OVERRIDES: dict[str, dict[str, Any]] = {
    # block_types is a repeating pattern (recurrent, recurrent, attention), not one entry per layer
    "recurrent_gemma": {"block_types": ["recurrent", "attention"], "num_hidden_layers": 2},
    # the last num_kv_shared_layers layers reuse the KV of earlier ones: keep one sharer per kind
    "gemma3n_text": {"num_kv_shared_layers": 2},
    # its sliding-window layers check head_dim == qk_nope_head_dim + qk_rope_head_dim
    **dict.fromkeys(("dots3_note_text", "dots3_note"), {"head_dim": 2 * HEAD_DIM}),
    # one sliding layer, an indexer layer and an indexed layer reading the indexer's K/V (the default's pattern
    # repeats every 5 layers); head_dim a multiple of 16 (its NVFP4 K/V rounding); a token budget and pool below
    # the samples so that the top-k selection runs
    "kolibri1_1": {"num_hidden_layers": 3, "layer_types": ["sliding_attention", "indexed_attention", "indexed_attention"],
                   "kv_source_layers": [0, 1, 1], "index_layers": [1], "mlp_only_layers": [0], "head_dim": 2 * HEAD_DIM,
                   "index_num_heads": 2, "index_topk": 3, "index_pool_size": 8, "index_compression": 2,
                   "index_num_local_tokens": 2, "index_num_sink_tokens": 1},
}


def _per_layer_lists(d: dict, n_layers: int) -> list[str]:
    return [k for k, v in d.items() if isinstance(v, list) and len(v) == n_layers and n_layers > 1
            and all(isinstance(x, (str, int, float, bool)) or x is None for x in v)
            and not (any(t in k for t in _INDEX_LIST) and v == list(range(n_layers)))]


_INDEX_LIST = ("idx", "indices", "layers", "layer_ids")


def _layer_index_lists(d: dict, n_layers: int, per_layer: list[str]) -> list[str]:
    """Keys holding layer indices (``full_attn_idxs``, ``mlp_only_layers``, ``attn_layer_indices``, ...)."""
    return [k for k, v in d.items() if k not in per_layer and isinstance(v, list) and v
            and any(t in k for t in _INDEX_LIST)
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n_layers for x in v)]


def _per_layer_dict(d: dict) -> dict[int, Any] | None:
    """``per_layer_config`` (layer index as a string -> overrides of that layer) keyed by int, or None."""
    v = d.get("per_layer_config")
    if not isinstance(v, dict) or not v or not all(str(k).isdigit() for k in v):
        return None
    return {int(k): x for k, x in v.items()}


def _shrink(d: dict, *, top: bool) -> dict:
    """The changed keys of one (sub-)config dict (see module docstring)."""
    out: dict[str, Any] = {}
    n_layers = next((d[k] for k in _LAYER_KEYS if isinstance(d.get(k), int)), None)
    heads = next((d[k] for k in _HEAD_KEYS if isinstance(d.get(k), int)), None)
    for k, v in d.items():
        if isinstance(v, dict) and k.endswith("_config") and v:
            out[k] = {**v, **_shrink(v, top=False)}
            continue
        if isinstance(v, bool):
            continue
        if k in _FFN_KEYS | _MOE_FFN_KEYS and isinstance(v, list) and all(isinstance(x, int) for x in v):
            out[k] = [INTERMEDIATE if k in _FFN_KEYS else MOE_INTERMEDIATE] * len(v)  # per-layer sizes
            continue
        if isinstance(v, float) and any(k.endswith(s) for s in _ZERO_SUFFIXES) and v > 0:
            out[k] = 0.0
        if not isinstance(v, int):
            continue
        if k in _HIDDEN_KEYS:
            out[k] = HIDDEN
        elif k in _FFN_KEYS:
            out[k] = INTERMEDIATE
        elif k in _MOE_FFN_KEYS:
            out[k] = MOE_INTERMEDIATE
        elif k in _HEAD_KEYS:
            out[k] = HEADS
        elif k in _KV_KEYS:
            out[k] = HEADS if heads is not None and v >= heads else KV_HEADS
        elif k in _HEAD_DIM_KEYS:
            out[k] = HEAD_DIM
        elif k in _EXPERT_KEYS:
            out[k] = EXPERTS
        elif k in _TOPK_KEYS:
            out[k] = min(v, TOP_K)
        elif k in _ONE_KEYS:
            out[k] = min(v, 1)
        elif k in _WINDOW_KEYS and v > WINDOW:
            out[k] = WINDOW
        elif k in _POS_KEYS and v > SEQ_LENGTH:
            out[k] = SEQ_LENGTH
        elif k in _SMALL_DIM_KEYS:
            out[k] = min(v, _SMALL_DIM_KEYS[k])
        elif "vocab_size" in k and v > VOCAB:
            out[k] = VOCAB
        elif k == "hidden_size_per_layer_input" and v > HEAD_DIM:
            out[k] = HEAD_DIM
    # per-layer lists: keep the first layer of every distinct combination of layer kinds
    if n_layers:
        lists = _per_layer_lists(d, n_layers)
        per_layer = _per_layer_dict(d)
        index_lists = _layer_index_lists(d, n_layers, lists)
        if lists or per_layer or index_lists:
            seen, keep = set(), []
            for i in range(n_layers):
                combo = tuple(str(d[k][i]) for k in lists) + (str((per_layer or {}).get(i)),) \
                    + tuple(i in d[k] for k in index_lists)
                if combo not in seen:
                    seen.add(combo)
                    keep.append(i)
            keep = keep[:MAX_LAYERS]
            if len(keep) < 2 and n_layers >= 2:
                keep = [0, 1]
            for k in lists:
                out[k] = [d[k][i] for i in keep]
            for k in index_lists:
                out[k] = [j for j, i in enumerate(keep) if i in d[k]]
            if per_layer:
                width = len(next(iter(d["per_layer_config"])))
                out["per_layer_config"] = {str(j).zfill(width): {**per_layer[i], **_shrink(per_layer[i], top=False)}
                                           for j, i in enumerate(keep) if i in per_layer}
            new_layers = len(keep)
        else:
            new_layers = min(n_layers, 2)
        for k in _LAYER_KEYS:
            if isinstance(d.get(k), int):
                out[k] = new_layers
    # periodic layer kinds (Jamba's attn_layer_period/offset, expert_layer_period/offset): one of each in 2 layers
    for k, v in d.items():
        if k.endswith("_layer_period") and isinstance(v, int) and v > 2 and f"{k[:-7]}_offset" in d:
            out[k], out[f"{k[:-7]}_offset"] = 2, 1
    # Mamba mixers: heads * head dim must equal expand * hidden size
    expand = d.get("mamba_expand", d.get("expand"))
    if isinstance(expand, int) and any(k.startswith("mamba") for k in d) or d.get("model_type") == "mamba2":
        inner = int(expand or 2) * HIDDEN
        for k in ("mamba_n_heads", "mamba_num_heads") + (("num_heads",) if d.get("model_type") == "mamba2" else ()):
            if k in d:
                out[k] = inner // HEAD_DIM
        if "mamba_d_ssm" in d:
            out["mamba_d_ssm"] = inner
    if top or "vocab_size" in d:
        vocab = VOCAB
        for i, k in enumerate(("pad_token_id", "bos_token_id", "eos_token_id")):
            v = d.get(k)
            if isinstance(v, int) and v >= vocab:
                out[k] = i
            elif isinstance(v, list) and any(isinstance(x, int) and x >= vocab for x in v):
                out[k] = [i]
        for k, v in d.items():
            if k.endswith("token_id") and k not in out and isinstance(v, int) and v >= vocab:
                out[k] = vocab - 1 - (abs(hash(k)) % 16)
    return out


def tiny_config(model_type: str):
    """The default config of ``model_type`` shrunk to a tiny one (module docstring).

    Returns a ``PretrainedConfig`` with fp32 weights and the default attention implementation.
    Raises whatever the config class raises for values it rejects.
    """
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    changes = _shrink(default.to_dict(), top=True)
    for k, v in OVERRIDES.get(model_type, {}).items():
        changes[k] = v
    changes.pop("model_type", None)
    cfg = type(default)(**changes)
    return cfg


# --------------------------------------------------------------------------------------------- outcome


@dataclass
class Outcome:
    """What the matrix found for one model type (one line of the support table)."""

    model_type: str
    architecture: str
    status: str  # "exact" | "refused" | "skipped" | "mismatch"
    reason: str = ""
    layer_kinds: list[str] = field(default_factory=list)
    kinds_lost: list[str] = field(default_factory=list)  # layer kinds of the default the tiny config lacks
    paths: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> {"ok", "logits", "grads", "error"}
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def causal_lm_types() -> list[tuple[str, str]]:
    """``(model_type, class name)`` of every causal LM transformers registers, sorted by model type."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())


def _skip_reason(model_type: str, arch: str, cfg) -> str | None:
    """Why a mapping entry is not a decoder-only causal LM that builds from its config alone, else None."""
    if getattr(cfg, "is_encoder_decoder", False):
        return "encoder-decoder model (its *ForCausalLM is the decoder half)"
    if arch.endswith("ForConditionalGeneration"):
        return f"multimodal wrapper {arch} (needs pixel/audio inputs; text towers run as their own types)"
    d = cfg.to_dict()
    if d.get("is_decoder") is False and d.get("add_cross_attention") is not None:
        return "bidirectional encoder as loaded (is_decoder=False; BERT family)"
    if d.get("causal") is False:
        return "bidirectional as loaded (causal=False: a masked LM)"
    if getattr(cfg, "auto_map", None):
        return "needs remote code (auto_map)"
    return None


def _kinds_lost(model_type: str, cfg) -> list[str]:
    """Layer kinds of the default config missing from the tiny one, and a window/chunk the tiny config did
    not shrink below the samples (the shrinking must keep what the matrix is about)."""
    from transformers import AutoConfig

    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        default = layer_kinds(AutoConfig.for_model(model_type))
    tiny = layer_kinds(cfg)
    lost = [k for k in default if "=" not in k and k not in tiny]
    lost += [k for k in tiny if "=" in k and int(k.split("=")[1]) > WINDOW]
    return lost


def layer_kinds(cfg) -> list[str]:
    """The distinct layer kinds a config declares (``layer_types`` and its relatives), for the table."""
    kinds: list[str] = []
    try:
        text = cfg.get_text_config()
    except (AttributeError, ValueError):  # no or several text configs
        text = cfg
    for key in ("layer_types", "mlp_layer_types", "layers_block_type", "block_types", "attention_types"):
        v = getattr(text, key, None)
        if isinstance(v, (list, tuple)):
            for x in v:
                x = str(x)
                if x not in kinds:
                    kinds.append(x)
    for key in ("sliding_window", "attention_chunk_size"):
        v = getattr(text, key, None)
        if isinstance(v, int) and f"{key}={v}" not in kinds and v:
            kinds.append(f"{key}={v}")
    return kinds


# --------------------------------------------------------------------------------------------- samples


def make_samples(tmp: Path):
    """``(samples, rows)``: the chats prepared (``seqpack.data.prepare``) and packed offline
    (``pack_dataset`` -> ``load_packed``), token ids still in the Qwen3 vocabulary."""
    from seqpack import load_packed, pack_dataset
    from seqpack.data import prepare

    src = tmp / "chats.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    samples, report = prepare(str(src), "qwen3", seq_length=SEQ_LENGTH)
    assert len(samples) == len(CHATS), report
    out = tmp / "packed"
    pack_dataset([str(src)], out, tokenizer="qwen3", seq_length=SEQ_LENGTH, pad_to_multiple_of=PAD_MULTIPLE,
                 overwrite=True)
    ds = load_packed(out, expect={"capacity": SEQ_LENGTH, "pad_to_multiple_of": PAD_MULTIPLE})
    rows = [ds[i] for i in range(len(ds))]
    return samples, rows


def _mod_sample(s):
    from seqpack.sample import Sample

    lab = np.where(s.labels >= 0, s.labels % VOCAB, s.labels)
    return Sample(np.asarray(s.input_ids) % VOCAB, lab, sample_id=s.sample_id)


def _mod_row(r):
    from dataclasses import replace

    lab = np.where(r.labels >= 0, r.labels % VOCAB, r.labels)
    return replace(r, input_ids=np.asarray(r.input_ids) % VOCAB, labels=lab)


# --------------------------------------------------------------------------------------------- running


def _grads(model) -> dict[str, Any]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def reference(model, samples):
    """Each sample alone through transformers' own forward and loss: ``model(input_ids=..., labels=...)``.

    Returns ``(logits by sample id, grads, loss)``: the loss is the token mean over all samples
    (``sum_i loss_i * n_i / N``, HF's per-sample mean times its token count), grads are its gradients.
    """
    import torch

    from seqpack.sample import unshift_labels

    model.zero_grad(set_to_none=True)
    counts = [int((np.asarray(s.labels) >= 0).sum()) for s in samples]
    total = sum(counts)
    logits, loss_sum = {}, 0.0
    for s, n in zip(samples, counts):
        ids = torch.as_tensor(np.asarray(s.input_ids)[None], dtype=torch.long)
        lab = unshift_labels(torch.as_tensor(np.asarray(s.labels)[None], dtype=torch.long),
                             torch.tensor([0, ids.shape[1]], dtype=torch.int32), final_target="drop")
        out = model(input_ids=ids, labels=lab)
        (out.loss * (n / total)).backward()
        loss_sum += out.loss.item() * n / total
        logits[s.sample_id] = out.logits[0].detach().float()
    return logits, _grads(model), loss_sum


def _segments(batch):
    """Sample id -> slice of real slots in a THD batch."""
    cu = batch["cu_seqlens"].tolist()
    cup = batch["cu_seqlens_padded"].tolist()
    ids = batch["sample_ids"]
    return {sid: slice(cup[i], cup[i] + (cu[i + 1] - cu[i])) for i, sid in enumerate(ids)}


def _diff(got, ref) -> tuple[float, float]:
    """(max |got - ref|, max |got - ref| / (ATOL + RTOL * |ref|)); the pair is within tolerance iff
    the second number is <= 1."""
    d = (got - ref).abs()
    return float(d.max()), float((d / (ATOL + RTOL * ref.abs())).max())


def compare(model, ref, logits, seg_of, loss) -> dict[str, Any]:
    """Backward ``loss`` and compare logits (per sample id) and every gradient with the reference."""
    ref_logits, ref_grads, ref_loss = ref
    loss.backward()
    lmax, lratio = 0.0, 0.0
    for sid, r in ref_logits.items():
        g = logits[0, seg_of[sid]].detach().float()
        if g.shape != r.shape:
            raise AssertionError(f"sample {sid}: logits {tuple(g.shape)} vs reference {tuple(r.shape)}")
        a, b = _diff(g, r)
        lmax, lratio = max(lmax, a), max(lratio, b)
    grads = _grads(model)
    missing = sorted(set(ref_grads) ^ set(grads))
    gmax, gratio, worst = 0.0, 0.0, ""
    for k in ref_grads.keys() & grads.keys():
        a, b = _diff(grads[k], ref_grads[k])
        if b > gratio:
            worst = k
        gmax, gratio = max(gmax, a), max(gratio, b)
    ok = lratio <= 1 and gratio <= 1 and not missing and abs(loss.item() - ref_loss) <= ATOL + RTOL * abs(ref_loss)
    res = {"ok": ok, "logits": lmax, "grads": gmax, "loss": abs(loss.item() - ref_loss)}
    if missing:
        res["error"] = f"gradients present on one side only: {missing[:3]}"
    elif gratio > 1:
        res["worst_grad"] = worst
    return res


def run_paths(model, samples, rows) -> dict[str, dict[str, Any]]:
    """Every packed path of :data:`PATHS` against the per-sample reference (module docstring)."""

    from seqpack.collate import InBatchPackingCollator, PackedCollator
    from seqpack.hf import packed_forward
    from seqpack.stream import StreamingPacker

    samples = [_mod_sample(s) for s in samples]
    rows = [_mod_row(r) for r in rows]
    ref = reference(model, samples)  # errors here are the plain model's (skipped by the caller)
    results: dict[str, dict[str, Any]] = {}

    def attempt(name, fn):
        model.zero_grad(set_to_none=True)
        try:
            results[name] = fn()
        except Exception as e:  # recorded, the test fails on it
            results[name] = {"ok": False, "error": _msg(e, 600)}

    def hf_path():
        thd = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=PAD_MULTIPLE)(samples)
        batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=PAD_MULTIPLE, format="hf",
                                       config=model.config)(samples)
        out = model(**batch)
        return compare(model, ref, out.logits, _segments(thd), out.loss)

    def forward_path():
        thd = InBatchPackingCollator(pad_token_id=0)(samples)
        out = packed_forward(model, thd)
        return compare(model, ref, out.logits, _segments(thd), out.loss)

    def rows_path(rs):
        batch = PackedCollator()(rs)
        out = packed_forward(model, batch)
        return compare(model, ref, out.logits, _segments(batch), out.loss)

    def stream_path():
        packer = StreamingPacker(samples, SEQ_LENGTH // 4, packing_buffer_size=len(samples), pad_to_multiple_of=4,
                                 pad_token_id=0, seed=0)
        rs = list(packer)
        return rows_path(rs)

    attempt("hf", hf_path)
    attempt("forward", forward_path)
    attempt("offline", lambda: rows_path(rows))
    attempt("stream", stream_path)
    return results


def _refusal(cfg) -> str | None:
    """The message of ``check_packed_support(cfg)`` when it refuses, None when it accepts (or when the
    installed seqpack has no such check)."""
    try:
        from seqpack.adapters.architecture import PackingUnsupportedError, check_packed_support
    except ImportError:
        return None
    try:
        check_packed_support(cfg)
    except PackingUnsupportedError as e:
        return str(e)
    return None


def _refused_paths(cfg, samples) -> dict[str, dict[str, Any]]:
    """For a refused config: does the first packed call refuse too? ``{"forward": {"ok": bool, "error"}}``
    when the model builds (``ok`` = ``packed_forward`` raised ``PackingUnsupportedError``), else ``{}``."""
    import torch
    from transformers import AutoModelForCausalLM

    from seqpack.adapters.architecture import PackingUnsupportedError
    from seqpack.collate import InBatchPackingCollator
    from seqpack.hf import packed_forward

    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg).float().train()
    except Exception:
        return {}
    thd = InBatchPackingCollator(pad_token_id=0)([_mod_sample(s) for s in samples])
    try:
        packed_forward(model, thd)
    except PackingUnsupportedError as e:
        return {"forward": {"ok": True, "error": str(e).splitlines()[0][:200]}}
    except Exception as e:
        return {"forward": {"ok": False, "error": f"{type(e).__name__} instead of PackingUnsupportedError: {e}"[:300]}}
    return {"forward": {"ok": False, "error": "packed_forward ran a refused model without raising"}}


def run_model_type(model_type: str, arch: str, samples, rows) -> Outcome:
    """Build one model type tiny and run it through every path (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    o = Outcome(model_type, arch, "skipped")
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            cfg = tiny_config(model_type)
    except Exception as e:
        o.reason = f"{_default_validates(model_type)}: {_msg(e, 200)}"
        return _done(o, t0)
    o.layer_kinds = layer_kinds(cfg)
    o.kinds_lost = _kinds_lost(model_type, cfg)
    skip = _skip_reason(model_type, arch, cfg)
    if skip:
        o.reason = skip
        return _done(o, t0)
    refused = _refusal(cfg)
    if refused:
        o.status, o.reason = "refused", refused
        o.paths = _refused_paths(cfg, samples)
        return _done(o, t0)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg).float().train()
            # the plain model must run a sample alone; otherwise it is no candidate for the matrix
            model(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6]]))
    except Exception as e:
        o.reason = f"{_default_builds(model_type)}: {_msg(e, 200)}"
        return _done(o, t0)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            reference(model, [_mod_sample(s) for s in samples])
        except Exception as e:
            o.reason = f"transformers' own per-sample forward fails: {_msg(e, 200)}"
            return _done(o, t0)
        o.paths = run_paths(model, samples, rows)
    bad = [p for p, r in o.paths.items() if not r["ok"]]
    refusals = {r.get("error", "") for r in o.paths.values()}
    if len(bad) == len(o.paths) and all(e.startswith("PackingUnsupportedError: ") for e in refusals):
        # refused at the first packed call on every path (a check beyond the config-level one)
        o.status, o.reason = "refused", sorted(refusals)[0].split(": ", 1)[1]
        o.paths = {"forward": {"ok": True, "error": o.reason}}
        return _done(o, t0)
    o.status = "mismatch" if bad else "exact"
    if bad:
        o.reason = "; ".join(f"{p}: {o.paths[p].get('error') or _fmt(o.paths[p])}" for p in bad)
    return _done(o, t0)


def _default_validates(model_type: str) -> str:
    """Whether transformers' own default config of ``model_type`` validates, to tell a default that is
    invalid in the installed transformers from a tiny config the shrinking broke."""
    from transformers import AutoConfig

    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            AutoConfig.for_model(model_type)
    except Exception:
        return "the default config itself does not validate"
    return "the tiny config does not validate"


def _default_builds(model_type: str) -> str:
    """Whether the unshrunk default config builds a model (on the meta device: no memory, no weights), to
    tell a transformers default that does not build from a tiny config the shrinking broke."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), torch.device("meta"):
            warnings.simplefilter("ignore")
            AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type))
    except Exception as e:
        return f"the default config does not build a model ({_msg(e, 120)})"
    return "the tiny config does not build/run"


def _msg(e: BaseException, n: int) -> str:
    """``"Type: first line of the message"`` cut at ``n`` characters."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:n] if lines else ''}"


def _fmt(r: dict) -> str:
    return f"logits {r['logits']:.1e}, grads {r['grads']:.1e}"


def _done(o: Outcome, t0: float) -> Outcome:
    o.seconds = round(time.perf_counter() - t0, 3)
    return o


def run_matrix(tmp: Path, types: list[tuple[str, str]] | None = None, log=None) -> list[Outcome]:
    """Every model type of :func:`causal_lm_types` (or ``types``) through :func:`run_model_type`."""

    samples, rows = make_samples(tmp)
    out = []
    for mt, arch in types or causal_lm_types():
        o = run_model_type(mt, arch, samples, rows)
        if log:
            log(o)
        out.append(o)
    return out


if __name__ == "__main__":  # python tests/models/_arch.py [model_type ...] -> prints one line per type
    import sys
    import tempfile

    import torch

    torch.set_num_threads(1)
    want = sys.argv[1:]
    types = [t for t in causal_lm_types() if not want or t[0] in want]

    def log(o):
        extra = " ".join(f"{p}={'ok' if r['ok'] else 'X'}" for p, r in o.paths.items())
        print(f"{o.model_type:28s} {o.status:8s} {o.seconds:6.2f}s {extra} {o.reason[:250]}", flush=True)

    with tempfile.TemporaryDirectory() as d:
        res = run_matrix(Path(d), types, log)
    Path("/tmp/matrix_result.json").write_text(json.dumps([o.to_json() for o in res], indent=1))
