"""Setup-time rules for :class:`~seqpack.config.PackingConfig`.

Each rule is a small function ``(cfg, ctx) -> list[Violation]`` (``ctx``: values derived once from
``cfg``) registered in :data:`RULES` with a stable id, the public failure case it prevents
(``public-failures.md``) and one line of text. :func:`run_rules` runs them all (pure Python,
microseconds; the registry is parsed once per process) so :meth:`PackingConfig.validate` reports
every problem in one error.

Model-specific facts (families' opt-outs, which attention backends take boundaries under CP, which
mixers need varlen kernels) come from the registry data (:mod:`seqpack.config.registry`) and, for
transformers model types, :func:`seqpack.adapters.architecture.model_type_problem`; never from branches
on family names here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from seqpack.adapters.architecture import model_type_problem
from seqpack.config.errors import Violation
from seqpack.config.registry import ModelFamily, Registry, load_registry
from seqpack.padding import seq_length_problem

__all__ = ["RULES", "Rule", "run_rules"]

#: FP8 GEMMs need token counts divisible by 16 (Megatron-Bridge: lcm(divisible_by, 16), qwen3_vl_step.py)
FP8_TOKEN_MULTIPLE = 16

MTP_MULTIMODAL_REASON = (
    "the MTP layers re-embed the (rolled) token ids, so at image/video placeholder positions they "
    "would use the placeholder token's embedding instead of the projected media features the main "
    "model saw; the MTP targets are therefore trained on corrupted inputs"
)


@dataclass(frozen=True)
class _Ctx:
    reg: Registry
    packing: str
    packs: bool  # more than one sample may share a row
    eff: int  # effective_pad_multiple
    family: ModelFamily | None
    multimodal: bool


@dataclass(frozen=True)
class Rule:
    """A registered rule: ``id`` (stable), ``case`` (public failure id or None), ``summary``, ``check``."""

    id: str
    case: str | None
    summary: str
    check: Callable[[Any, _Ctx], list[Violation]]


RULES: list[Rule] = []


def _rule(id: str, summary: str, case: str | None = None):
    def deco(fn):
        RULES.append(Rule(id, case, summary, fn))
        return fn

    return deco


def _v(rule: str, keys, problem: str, fix: str, case: str | None = None) -> Violation:
    return Violation(rule, tuple(keys), problem, fix, case)


def _pad_keys(cfg) -> list[str]:
    keys = ["pad_to_multiple_of", "context_parallel_size"]
    if cfg.sequence_parallel and cfg.tensor_model_parallel_size > 1:
        keys += ["tensor_model_parallel_size", "sequence_parallel"]
    return keys


# ----------------------------------------------------------------------------- model family
@_rule("unknown_model_family", "model_family must be a registry key or alias")
def _unknown_family(cfg, ctx):
    if cfg.model_family is None or ctx.family is not None:
        return []
    known = f"use one of: {', '.join(ctx.reg.names())} (or remove model_family)"
    if ctx.packs and (found := model_type_problem(cfg.model_family)):  # a transformers model_type: say why
        return [_v("unknown_model_family", ["model_family", "packing"], str(found), f"packing: none, or {known}")]
    return [_v("unknown_model_family", ["model_family"], f"unknown model family {cfg.model_family!r}", known)]


@_rule("family_packing_opt_out", "the model family must support the packing mode (registry opt-outs)")
def _family_opt_out(cfg, ctx):
    if (fam := ctx.family) is None or fam.supports(ctx.packing):
        return []
    why = f": {o.reason} [source: {o.source}]" if (o := fam.opt_out_for(ctx.packing)) else ""
    return [_v("family_packing_opt_out", ["model_family", "packing"],
               f"{fam.name} does not support packing={ctx.packing!r}{why}",
               f"set packing to one of: {', '.join(fam.packing_modes)}")]


@_rule("linear_attention_kernels", "gated-delta-net / Mamba2 families need boundary-aware kernels to pack")
def _linear_attention(cfg, ctx):
    if (fam := ctx.family) is None or not ctx.packs or not fam.supports(ctx.packing) or cfg.linear_attention_varlen:
        return []
    if not (kinds := [k for k in fam.attention_kinds if ctx.reg.attention_kinds[k].needs_varlen_kernel]):
        return []
    notes = "; ".join(f"{k}: {ctx.reg.attention_kinds[k].note}" for k in kinds)
    state = "false" if cfg.linear_attention_varlen is False else "not confirmed"
    hf = "".join(f" transformers: {e}" for e in map(model_type_problem, fam.model_types) if e is not None)
    return [_v("linear_attention_kernels", ["model_family", "linear_attention_varlen", "packing"],
               f"{fam.name} has {', '.join(kinds)} layers whose recurrent state would leak from one packed segment "
               f"into the next unless the kernels take segment boundaries (linear_attention_varlen is {state}). "
               f"{notes}.{hf}", "set linear_attention_varlen: true once your kernels take cu_seqlens/seq_idx "
               "(transformers' do not: pad instead, seqpack.collate.PaddedCollator), or use packing: none")]


# ----------------------------------------------------------------------------- packing mode / batch
@_rule("offline_micro_batch", "offline packing requires micro_batch_size == 1")
def _offline_mbs(cfg, ctx):
    if ctx.packing != "offline" or cfg.micro_batch_size == 1:
        return []
    return [_v("offline_micro_batch", ["packing", "micro_batch_size"],
               f"offline packing stores one packed row per micro-batch, but micro_batch_size="
               f"{cfg.micro_batch_size}",
               "set micro_batch_size: 1 (raise seq_length or global_batch_size for more tokens per step), "
               "or use packing: in_batch to pack several samples of a micro-batch at load time")]


@_rule("in_batch_micro_batch", "in-batch packing requires micro_batch_size > 1")
def _in_batch_mbs(cfg, ctx):
    if ctx.packing != "in_batch" or cfg.micro_batch_size > 1:
        return []
    return [_v("in_batch_micro_batch", ["packing", "micro_batch_size"],
               "in-batch packing packs the samples of one micro-batch, but micro_batch_size=1 leaves "
               "nothing to pack",
               "set micro_batch_size >= 2, or use packing: offline (with micro_batch_size: 1)")]


@_rule("packing_modes_exclusive", "offline packed data and in-batch/streaming/no packing are mutually exclusive")
def _exclusive(cfg, ctx):
    if cfg.packed_dataset_path is None or ctx.packing == "offline":
        return []
    return [_v("packing_modes_exclusive", ["packing", "packed_dataset_path"],
               f"packed_dataset_path points at offline-packed rows but packing={ctx.packing!r}; the rows would "
               "be packed (or padded) a second time",
               "use packing: offline with packed_dataset_path, or remove packed_dataset_path")]


@_rule("global_batch_divisible", "global_batch_size must be a multiple of micro_batch_size x data_parallel_size")
def _gbs(cfg, ctx):
    if cfg.global_batch_size is None:
        return []
    dp = cfg.data_parallel_size or 1
    unit = cfg.micro_batch_size * dp
    if cfg.global_batch_size % unit == 0:
        return []
    keys = ["global_batch_size", "micro_batch_size"] + (["data_parallel_size"] if cfg.data_parallel_size else [])
    lo = max(unit, cfg.global_batch_size // unit * unit)
    return [_v("global_batch_divisible", keys,
               f"global_batch_size={cfg.global_batch_size} is not a multiple of micro_batch_size x "
               f"data_parallel_size = {unit}",
               f"use global_batch_size {lo} or {lo + unit}")]


# ----------------------------------------------------------------------------- pad multiple
@_rule("seq_length_divisible", "seq_length must be divisible by the effective pad multiple", case="B23")
def _seq_len(cfg, ctx):
    if not (ctx.packs or cfg.context_parallel_size > 1):
        return []
    keys = _pad_keys(cfg)
    found = seq_length_problem(cfg.seq_length, ctx.eff, {k: getattr(cfg, k) for k in keys})
    if found is None:
        return []
    return [_v("seq_length_divisible", ["seq_length", *keys], *found, case="B23")]


@_rule("planner_pad_multiple_mismatch", "an explicit planner pad multiple must equal the builder's", case="B24")
def _planner(cfg, ctx):
    if cfg.planner_pad_multiple is None or cfg.planner_pad_multiple == ctx.eff:
        return []
    return [_v("planner_pad_multiple_mismatch", ["planner_pad_multiple", *_pad_keys(cfg)],
               f"the bin planner would round lengths to {cfg.planner_pad_multiple} but the row builder pads "
               f"segments to {ctx.eff}; packs planned to fit can overflow seq_length after padding",
               f"remove planner_pad_multiple (both sides then use effective_pad_multiple={ctx.eff}) "
               f"or set it to {ctx.eff}", case="B24")]


@_rule("fp8_alignment", "FP8 needs packed rows whose token count is a multiple of 16")
def _fp8(cfg, ctx):
    if cfg.fp8 is None or not ctx.packs:
        return []
    if cfg.pad_to_max_length:
        if cfg.seq_length % FP8_TOKEN_MULTIPLE == 0:
            return []
        return [_v("fp8_alignment", ["fp8", "seq_length", "pad_to_max_length"],
                   f"fp8={cfg.fp8!r} with rows padded to seq_length={cfg.seq_length}, which is not a multiple "
                   f"of {FP8_TOKEN_MULTIPLE}",
                   f"use a seq_length divisible by {math.lcm(FP8_TOKEN_MULTIPLE, ctx.eff)}")]
    if ctx.eff % FP8_TOKEN_MULTIPLE == 0:
        return []
    want = math.lcm(cfg.pad_to_multiple_of, FP8_TOKEN_MULTIPLE)
    return [_v("fp8_alignment", ["fp8", "pad_to_multiple_of", "pad_to_max_length"],
               f"fp8={cfg.fp8!r} but packed rows are only padded to multiples of {ctx.eff}; FP8 GEMMs need the "
               f"token count divisible by {FP8_TOKEN_MULTIPLE}",
               f"set pad_to_multiple_of: {want} (Megatron-Bridge pads to lcm(divisible_by, 16) for FP8), "
               "or pad_to_max_length: true with a seq_length divisible by 16")]


# ----------------------------------------------------------------------------- context parallelism
@_rule("cp_loss_settings", "fine-tuning with CP > 1 needs per-token loss and summed collectives")
def _cp_loss(cfg, ctx):
    if cfg.context_parallel_size <= 1 or not cfg.finetuning:
        return []
    bad = [k for k, wrong in (("calculate_per_token_loss", not cfg.calculate_per_token_loss),
                              ("average_in_collective", cfg.average_in_collective)) if wrong]
    if not bad:
        return []
    return [_v("cp_loss_settings", ["context_parallel_size", *bad],
               f"context_parallel_size={cfg.context_parallel_size} splits every sequence over ranks that hold "
               "different numbers of loss tokens; averaging per rank (or in the collective) weights tokens "
               "unequally (Megatron-Bridge rejects this for fine-tuning)",
               "set calculate_per_token_loss: true and average_in_collective: false")]


@_rule("cp_thd_one_row", "THD slicing with CP needs one row per micro-batch (or flattening)")
def _cp_rows(cfg, ctx):
    if (cfg.context_parallel_size <= 1 or ctx.packing not in ("in_batch", "streaming")
            or cfg.micro_batch_size == 1 or cfg.flatten_micro_batch):
        return []
    return [_v("cp_thd_one_row", ["context_parallel_size", "micro_batch_size", "flatten_micro_batch"],
               f"context-parallel THD slicing partitions one packed row by its boundaries, but a micro-batch "
               f"holds {cfg.micro_batch_size} rows",
               "set flatten_micro_batch: true (one [1, B*T] row with offset boundaries), or micro_batch_size: 1")]


def _takes_boundaries(cfg, ctx, under_cp: bool) -> bool:
    if cfg.attention_varlen is not None:
        return cfg.attention_varlen
    b = ctx.reg.attention_backends.get(cfg.attention_backend.value)  # never None: a test syncs enum and registry
    return b is not None and (b.cp_varlen if under_cp else b.varlen)


@_rule("cp_attention_boundaries", "CP with multi-document rows needs a boundary-aware CP attention", case="B02")
def _cp_attn(cfg, ctx):
    if cfg.context_parallel_size <= 1 or not ctx.packs or _takes_boundaries(cfg, ctx, True):
        return []
    b = ctx.reg.attention_backends.get(cfg.attention_backend.value)
    why = f" ({b.note})" if b is not None and cfg.attention_varlen is None else ""
    ok = [k for k, v in ctx.reg.attention_backends.items() if v.cp_varlen]
    return [_v("cp_attention_boundaries", ["context_parallel_size", "attention_backend", "packing"],
               f"attention_backend={cfg.attention_backend.value!r} cannot take segment boundaries under context "
               f"parallelism{why}; K/V would be exchanged across document boundaries inside a packed row",
               f"use attention_backend: {' or '.join(ok)}, or context_parallel_size: 1, or packing: none",
               case="B02")]


@_rule("attention_boundaries", "packed rows need an attention path that takes segment boundaries", case="B01")
def _attn(cfg, ctx):
    if cfg.context_parallel_size > 1 or not ctx.packs or _takes_boundaries(cfg, ctx, False):
        return []
    ok = [k for k, v in ctx.reg.attention_backends.items() if v.varlen]
    return [_v("attention_boundaries", ["attention_backend", "attention_varlen", "packing"],
               f"attention_backend={cfg.attention_backend.value!r} (attention_varlen={cfg.attention_varlen}) "
               "does not take segment boundaries; tokens of later documents would attend to earlier ones",
               f"use attention_backend: {' or '.join(ok)}, or packing: none", case="B01")]


# ----------------------------------------------------------------------------- static shapes
@_rule("pad_cu_seqlens_requirements", "pad_cu_seqlens requires pad_to_max_length and packed metadata")
def _pad_cu(cfg, ctx):
    if not cfg.pad_cu_seqlens:
        return []
    out = []
    if not cfg.pad_to_max_length:
        out.append(_v("pad_cu_seqlens_requirements", ["pad_cu_seqlens", "pad_to_max_length"],
                      "pad_cu_seqlens pads the boundary arrays to a fixed length, which only gives static "
                      "shapes when every row is also padded to seq_length",
                      "set pad_to_max_length: true (or pad_cu_seqlens: false)"))
    if cfg.packed_metadata_path is None and cfg.packed_dataset_path is None:
        out.append(_v("pad_cu_seqlens_requirements",
                      ["pad_cu_seqlens", "packed_metadata_path", "packed_dataset_path"],
                      "pad_cu_seqlens needs the packed dataset's metadata (max segments per row) to size the "
                      "boundary arrays (Megatron-Bridge asserts the metadata file in data/datasets/sft.py)",
                      "set packed_metadata_path (or packed_dataset_path, whose metadata.json is used)"))
    return out


@_rule("cuda_graphs_static_shapes", "CUDA graphs require pad_to_max_length (and padded cu_seqlens when packing)")
def _cuda_graphs(cfg, ctx):
    if not cfg.cuda_graphs:
        return []
    out = []
    if not cfg.pad_to_max_length:
        out.append(_v("cuda_graphs_static_shapes", ["cuda_graphs", "pad_to_max_length"],
                      "CUDA graphs replay fixed tensor shapes, but rows are not padded to seq_length",
                      "set pad_to_max_length: true"))
    if ctx.packs and not cfg.pad_cu_seqlens:
        out.append(_v("cuda_graphs_static_shapes", ["cuda_graphs", "pad_cu_seqlens", "packing"],
                      "with packing the number of segments (cu_seqlens length) changes from row to row, which a "
                      "captured graph cannot follow",
                      "set pad_cu_seqlens: true (with packed_metadata_path)"))
    return out


@_rule("pp_ep_fixed_shapes", "pipeline or expert parallelism > 1 requires fixed shapes")
def _pp_ep(cfg, ctx):
    if cfg.pad_to_max_length or (cfg.pipeline_model_parallel_size <= 1 and cfg.expert_model_parallel_size <= 1):
        return []
    keys = [k for k in ("pipeline_model_parallel_size", "expert_model_parallel_size") if getattr(cfg, k) > 1]
    return [_v("pp_ep_fixed_shapes", [*keys, "pad_to_max_length"],
               f"{' and '.join(f'{k}={getattr(cfg, k)}' for k in keys)} exchange activations in buffers sized "
               "once per micro-batch shape; variable row lengths break them (Megatron-Bridge pads to seq_length "
               "when pp>1 or ep>1)",
               "set pad_to_max_length: true")]


# ----------------------------------------------------------------------------- streaming
@_rule("streaming_loss", "streaming packing requires per-token loss", case="B28")
def _stream_loss(cfg, ctx):
    if ctx.packing != "streaming" or cfg.calculate_per_token_loss:
        return []
    return [_v("streaming_loss", ["packing", "calculate_per_token_loss"],
               "streamed packs hold a varying number of loss tokens; per-row/per-sample averaging weights "
               "tokens by how the stream happened to pack them",
               "set calculate_per_token_loss: true (divide by the global loss-token count; fuse_loss: true for "
               "the fused per-token cross-entropy)", case="B28")]


@_rule("streaming_dynamic_batching", "streaming packing and dynamic batching are mutually exclusive")
def _stream_dyn(cfg, ctx):
    if ctx.packing != "streaming" or not cfg.dynamic_batching:
        return []
    return [_v("streaming_dynamic_batching", ["packing", "dynamic_batching"],
               "the streaming packer already fills each row to seq_length; dynamic (token-budget) batching would "
               "regroup its output and break its resumable state",
               "set dynamic_batching: false (or use packing: none with dynamic batching)")]


@_rule("streaming_mtp", "streaming packing with MTP needs the MTP-ready path (text models)")
def _stream_mtp(cfg, ctx):
    # multimodal models: explained by multimodal_mtp
    if ctx.packing != "streaming" or cfg.mtp_num_layers == 0 or cfg.mtp_ready_packing or ctx.multimodal:
        return []
    return [_v("streaming_mtp", ["packing", "mtp_num_layers", "mtp_ready_packing"],
               f"mtp_num_layers={cfg.mtp_num_layers} rolls input_ids/labels by one token per MTP layer; over a "
               "streamed packed row the roll would cross document boundaries",
               "set mtp_ready_packing: true (seqpack.mtp.roll_packed rolls inside each segment), "
               "or mtp_num_layers: 0, or packing: offline")]


@_rule("multimodal_mtp", "multi-token prediction is rejected for multimodal models with packing")
def _mm_mtp(cfg, ctx):
    if cfg.mtp_num_layers == 0 or not ctx.multimodal or not (ctx.packs or cfg.mtp_ready_packing):
        return []
    keys = ["mtp_num_layers", "model_family" if cfg.multimodal is None else "multimodal",
            *(["packing"] if ctx.packs else []), *(["mtp_ready_packing"] if cfg.mtp_ready_packing else [])]
    return [_v("multimodal_mtp", keys, f"MTP with a multimodal model: {MTP_MULTIMODAL_REASON}",
               "set mtp_num_layers: 0 for this vision-language model")]


@_rule("mtp_family_support", "mtp_num_layers > 0 needs a family with MTP layers")
def _mtp_family(cfg, ctx):
    fam = ctx.family
    if cfg.mtp_num_layers == 0 or fam is None or fam.mtp:
        return []
    return [_v("mtp_family_support", ["model_family", "mtp_num_layers"],
               f"{fam.name} has no multi-token-prediction layers but mtp_num_layers={cfg.mtp_num_layers}",
               "set mtp_num_layers: 0")]


# ----------------------------------------------------------------------------- MoE
def _has_padding(cfg, ctx) -> bool:
    stacked = cfg.micro_batch_size > 1 and not (ctx.packing == "in_batch" and cfg.flatten_micro_batch)
    return cfg.pad_to_max_length or ctx.eff > 1 or stacked


@_rule("moe_padding_mask", "MoE load balancing with padding requires the padding mask")
def _moe(cfg, ctx):
    uses_stats = cfg.moe_router_enable_expert_bias or cfg.moe_aux_loss_coeff > 0
    if not uses_stats or cfg.produce_padding_mask or not _has_padding(cfg, ctx):
        return []
    keys = [k for k, on in (("moe_router_enable_expert_bias", cfg.moe_router_enable_expert_bias),
                            ("moe_aux_loss_coeff", cfg.moe_aux_loss_coeff > 0)) if on]
    return [_v("moe_padding_mask", [*keys, "produce_padding_mask"],
               f"rows contain padding (effective_pad_multiple={ctx.eff}, pad_to_max_length="
               f"{cfg.pad_to_max_length}, micro_batch_size={cfg.micro_batch_size}); without a padding mask the "
               "router counts pad tokens in its load-balancing statistics (expert bias / aux loss)",
               "set produce_padding_mask: true (padding_mask, True = pad, goes to the MoE router)")]


def run_rules(cfg: Any) -> list[Violation]:
    """Run every rule in :data:`RULES` order on ``cfg`` (a :class:`~seqpack.config.PackingConfig`: its
    fields and its ``effective_pad_multiple``, ``family`` and ``is_multimodal``) and return all violations."""
    packing = cfg.packing.value
    ctx = _Ctx(reg=load_registry(), packing=packing, packs=packing != "none", eff=cfg.effective_pad_multiple,
               family=cfg.family, multimodal=cfg.is_multimodal)
    out: list[Violation] = []
    for r in RULES:
        out.extend(r.check(cfg, ctx))
    return out
