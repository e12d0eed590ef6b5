"""Every validate() rule, both ways: a config that triggers it, and the nearest valid config passing."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.algorithms import pack_lengths
from seqpack.config import RULES, ConfigValidationError, PackingConfig
from seqpack.padding import compute_pad_multiple

# Loss settings every fine-tuning config below uses unless a case is about them.
BASE = dict(calculate_per_token_loss=True, average_in_collective=False)


def cfg(**kw) -> PackingConfig:
    return PackingConfig(**{**BASE, **kw})


# (rule id, config that breaks it, nearest valid config, keys the violation must name)
CASES = [
    ("offline_micro_batch", dict(packing="offline", micro_batch_size=2), dict(packing="offline", micro_batch_size=1),
     {"packing", "micro_batch_size"}),
    ("in_batch_micro_batch", dict(packing="in_batch", micro_batch_size=1), dict(packing="in_batch", micro_batch_size=2),
     {"packing", "micro_batch_size"}),
    ("packing_modes_exclusive", dict(packing="in_batch", micro_batch_size=2, packed_dataset_path="/data/packed"),
     dict(packing="offline", packed_dataset_path="/data/packed"), {"packing", "packed_dataset_path"}),
    ("global_batch_divisible", dict(global_batch_size=10, data_parallel_size=4),
     dict(global_batch_size=12, data_parallel_size=4), {"global_batch_size", "micro_batch_size", "data_parallel_size"}),
    ("seq_length_divisible", dict(seq_length=150, context_parallel_size=2),
     dict(seq_length=152, context_parallel_size=2), {"seq_length", "context_parallel_size"}),
    ("seq_length_divisible", dict(seq_length=4100, context_parallel_size=2, tensor_model_parallel_size=4,
                                  sequence_parallel=True),
     dict(seq_length=4104, context_parallel_size=2, tensor_model_parallel_size=4, sequence_parallel=True),
     {"seq_length", "tensor_model_parallel_size", "sequence_parallel"}),
    ("planner_pad_multiple_mismatch", dict(planner_pad_multiple=2, pad_to_multiple_of=4, tensor_model_parallel_size=2,
                                           sequence_parallel=True),
     dict(planner_pad_multiple=4, pad_to_multiple_of=4, tensor_model_parallel_size=2, sequence_parallel=True),
     {"planner_pad_multiple", "pad_to_multiple_of"}),
    ("fp8_alignment", dict(fp8="hybrid"), dict(fp8="hybrid", pad_to_multiple_of=16), {"fp8", "pad_to_multiple_of"}),
    ("fp8_alignment", dict(fp8="hybrid", pad_to_max_length=True, seq_length=4100),
     dict(fp8="hybrid", pad_to_max_length=True, seq_length=4096), {"fp8", "seq_length"}),
    ("cp_loss_settings", dict(context_parallel_size=2, calculate_per_token_loss=False, average_in_collective=True),
     dict(context_parallel_size=2), {"context_parallel_size", "calculate_per_token_loss", "average_in_collective"}),
    ("cp_thd_one_row", dict(packing="in_batch", micro_batch_size=2, context_parallel_size=2),
     dict(packing="in_batch", micro_batch_size=2, context_parallel_size=2, flatten_micro_batch=True),
     {"context_parallel_size", "micro_batch_size", "flatten_micro_batch"}),
    ("cp_attention_boundaries", dict(context_parallel_size=2, attention_backend="sdpa"),
     dict(context_parallel_size=2, attention_backend="te"), {"context_parallel_size", "attention_backend", "packing"}),
    ("attention_boundaries", dict(attention_backend="local"), dict(attention_backend="flash"),
     {"attention_backend", "packing"}),
    ("linear_attention_kernels", dict(model_family="nemotron_h"),
     dict(model_family="nemotron_h", linear_attention_varlen=True), {"model_family", "linear_attention_varlen"}),
    ("pad_cu_seqlens_requirements", dict(pad_cu_seqlens=True, packed_metadata_path="/d/metadata.json"),
     dict(pad_cu_seqlens=True, pad_to_max_length=True, packed_metadata_path="/d/metadata.json"),
     {"pad_cu_seqlens", "pad_to_max_length"}),
    ("pad_cu_seqlens_requirements", dict(pad_cu_seqlens=True, pad_to_max_length=True),
     dict(pad_cu_seqlens=True, pad_to_max_length=True, packed_dataset_path="/d"),
     {"pad_cu_seqlens", "packed_metadata_path"}),
    ("cuda_graphs_static_shapes", dict(cuda_graphs=True, pad_cu_seqlens=True, packed_metadata_path="/d/m.json"),
     dict(cuda_graphs=True, pad_to_max_length=True, pad_cu_seqlens=True, packed_metadata_path="/d/m.json"),
     {"cuda_graphs", "pad_to_max_length"}),
    ("cuda_graphs_static_shapes", dict(cuda_graphs=True, pad_to_max_length=True),
     dict(cuda_graphs=True, pad_to_max_length=True, pad_cu_seqlens=True, packed_metadata_path="/d/m.json"),
     {"cuda_graphs", "pad_cu_seqlens"}),
    ("pp_ep_fixed_shapes", dict(pipeline_model_parallel_size=2),
     dict(pipeline_model_parallel_size=2, pad_to_max_length=True), {"pipeline_model_parallel_size", "pad_to_max_length"}),
    ("pp_ep_fixed_shapes", dict(expert_model_parallel_size=4),
     dict(expert_model_parallel_size=4, pad_to_max_length=True), {"expert_model_parallel_size", "pad_to_max_length"}),
    ("streaming_loss", dict(packing="streaming", calculate_per_token_loss=False), dict(packing="streaming"),
     {"packing", "calculate_per_token_loss"}),
    ("streaming_dynamic_batching", dict(packing="streaming", dynamic_batching=True),
     dict(packing="none", dynamic_batching=True), {"packing", "dynamic_batching"}),
    ("streaming_mtp", dict(packing="streaming", mtp_num_layers=1, model_family="deepseek_v3"),
     dict(packing="streaming", mtp_num_layers=1, model_family="deepseek_v3", mtp_ready_packing=True),
     {"packing", "mtp_num_layers"}),
    ("multimodal_mtp", dict(packing="streaming", mtp_num_layers=1, mtp_ready_packing=True, multimodal=True),
     dict(packing="streaming", mtp_num_layers=1, mtp_ready_packing=True, multimodal=False),
     {"mtp_num_layers", "multimodal", "mtp_ready_packing", "packing"}),
    ("multimodal_mtp", dict(model_family="qwen3_5_vl", packing="in_batch", micro_batch_size=2,
                            linear_attention_varlen=True, mtp_num_layers=1),
     dict(model_family="qwen3_5_vl", packing="in_batch", micro_batch_size=2, linear_attention_varlen=True),
     {"mtp_num_layers", "model_family"}),
    ("mtp_family_support", dict(model_family="llama3", mtp_num_layers=1),
     dict(model_family="deepseek_v3", mtp_num_layers=1), {"model_family", "mtp_num_layers"}),
    ("moe_padding_mask", dict(moe_router_enable_expert_bias=True, pad_to_multiple_of=8),
     dict(moe_router_enable_expert_bias=True, pad_to_multiple_of=8, produce_padding_mask=True),
     {"moe_router_enable_expert_bias", "produce_padding_mask"}),
    ("moe_padding_mask", dict(moe_aux_loss_coeff=1e-3, packing="in_batch", micro_batch_size=4),
     dict(moe_aux_loss_coeff=1e-3, packing="in_batch", micro_batch_size=4, produce_padding_mask=True),
     {"moe_aux_loss_coeff", "produce_padding_mask"}),
    ("unknown_model_family", dict(model_family="gpt5"), dict(model_family="Qwen3"), {"model_family"}),
    ("family_packing_opt_out", dict(model_family="qwen3_next"), dict(model_family="qwen3_next", packing="none"),
     {"model_family", "packing"}),
    ("family_packing_opt_out", dict(model_family="glm4_5", packing="streaming"),
     dict(model_family="glm4_5", packing="none"), {"model_family", "packing"}),
    ("family_packing_opt_out", dict(model_family="qwen3_5_vl", linear_attention_varlen=True),
     dict(model_family="qwen3_5_vl", linear_attention_varlen=True, packing="in_batch", micro_batch_size=2),
     {"model_family", "packing"}),
]


@pytest.mark.parametrize("rule,bad,good,keys", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_triggers_and_nearest_valid_passes(rule, bad, good, keys):
    found = [v for v in cfg(**bad).violations() if v.rule == rule]
    assert found, f"{rule} did not trigger for {bad}"
    named = set().union(*(v.keys for v in found))
    assert keys <= named, f"{rule} names {named}, expected at least {keys}"
    for v in found:
        assert v.problem and v.fix
    assert cfg(**good).violations() == []


def test_every_rule_has_a_case():
    assert {r.id for r in RULES} == {c[0] for c in CASES}


def test_default_config_is_valid():
    assert PackingConfig().violations() == []
    assert PackingConfig().validate() is not None


def test_B23_capacity_150_with_cp2_rejected_at_validation():
    with pytest.raises(ConfigValidationError) as ei:
        cfg(seq_length=150, context_parallel_size=2).validate()
    v = next(v for v in ei.value.violations if v.rule == "seq_length_divisible")
    assert v.case == "B23"
    assert "150" in v.problem and "4" in v.problem
    assert "148 or 152" in v.fix


def test_B24_planner_multiple_differs_from_builder_rejected():
    c = cfg(planner_pad_multiple=2, pad_to_multiple_of=4)
    with pytest.raises(ConfigValidationError) as ei:
        c.validate()
    assert ei.value.rules == ["planner_pad_multiple_mismatch"]
    assert ei.value.violations[0].case == "B24"
    assert "effective_pad_multiple=4" in ei.value.violations[0].fix


def test_B02_cp_with_packing_and_batch_ring_attention_rejected():
    with pytest.raises(ConfigValidationError) as ei:
        cfg(context_parallel_size=2, attention_backend="flex").validate()
    assert ei.value.rules == ["cp_attention_boundaries"]
    # no packing (one document per row): nothing can leak across documents
    assert cfg(context_parallel_size=2, attention_backend="flex", packing="none").violations() == []
    # a declared boundary-aware CP path (e.g. varlen ring attention) is accepted
    assert cfg(context_parallel_size=2, attention_backend="sdpa", attention_varlen=True).violations() == []


def test_B01_packing_with_boundaryless_attention_rejected():
    with pytest.raises(ConfigValidationError) as ei:
        cfg(attention_backend="sdpa", attention_varlen=False).validate()
    assert ei.value.rules == ["attention_boundaries"]
    assert ei.value.violations[0].case == "B01"


def test_cp_pretraining_does_not_need_finetuning_loss_settings():
    c = PackingConfig(context_parallel_size=2, finetuning=False)
    assert c.violations() == []


def test_streaming_mtp_names_both_keys_and_mtp_ready_path():
    with pytest.raises(ConfigValidationError) as ei:
        cfg(packing="streaming", mtp_num_layers=2).validate()
    v = ei.value.violations[0]
    assert v.rule == "streaming_mtp"
    assert v.keys[:2] == ("packing", "mtp_num_layers")
    assert "mtp_ready_packing: true" in v.fix


def test_multimodal_mtp_message_explains_reembedding():
    with pytest.raises(ConfigValidationError) as ei:
        cfg(model_family="qwen3_5_vl", packing="in_batch", micro_batch_size=2, linear_attention_varlen=True,
            mtp_num_layers=1, mtp_ready_packing=True).validate()
    v = ei.value.violations[0]
    assert v.rule == "multimodal_mtp"
    assert "re-embed" in v.problem and "media features" in v.problem


def test_family_opt_out_cites_source():
    v = cfg(model_family="qwen3_next").violations()[0]
    assert v.rule == "family_packing_opt_out"
    assert "Megatron-Bridge" in v.problem and "qwen3_next.py" in v.problem
    assert v.fix == "set packing to one of: none"


def test_moe_without_padding_needs_no_mask():
    # offline, multiple 1, micro_batch_size 1: rows are exactly the padded segments, no pad slots
    assert cfg(moe_router_enable_expert_bias=True, moe_aux_loss_coeff=0.01).violations() == []


def test_validate_lists_every_violation_in_one_error():
    c = PackingConfig(seq_length=150, context_parallel_size=2, packing="streaming", micro_batch_size=2,
                      dynamic_batching=True, cuda_graphs=True, model_family="llama3", mtp_num_layers=1)
    with pytest.raises(ConfigValidationError) as ei:
        c.validate(source="job.yaml")
    rules = ei.value.rules
    for r in ("seq_length_divisible", "cp_loss_settings", "cp_thd_one_row", "cuda_graphs_static_shapes",
              "streaming_loss", "streaming_dynamic_batching", "streaming_mtp", "mtp_family_support"):
        assert r in rules
    msg = str(ei.value)
    assert msg.startswith(f"{len(rules)} problems in the packing config in job.yaml:")
    assert "fix:" in msg and "keys: seq_length" in msg


def test_effective_pad_multiple_comes_only_from_compute_pad_multiple(monkeypatch):
    import seqpack.config.model as m

    calls = []

    def fake(*args):
        calls.append(args)
        return 7

    monkeypatch.setattr(m, "compute_pad_multiple", fake)
    c = PackingConfig(pad_to_multiple_of=3, context_parallel_size=2, tensor_model_parallel_size=4,
                      sequence_parallel=True)
    assert c.effective_pad_multiple == 7
    assert calls == [(3, 2, 4, True)]


@pytest.mark.parametrize("mult,cp,tp,sp", [(1, 1, 1, False), (1, 2, 1, False), (3, 2, 1, False),
                                           (1, 2, 4, True), (16, 4, 2, True), (1, 1, 8, True)])
def test_effective_pad_multiple_values(mult, cp, tp, sp):
    c = PackingConfig(pad_to_multiple_of=mult, context_parallel_size=cp, tensor_model_parallel_size=tp,
                      sequence_parallel=sp)
    assert c.effective_pad_multiple == compute_pad_multiple(mult, cp, tp, sp)


def test_validate_is_fast():
    c = cfg(model_family="qwen3_5_vl", packing="in_batch", micro_batch_size=2, linear_attention_varlen=True,
            context_parallel_size=2, flatten_micro_batch=True, seq_length=4096)
    c.violations()  # registry parsed once per process
    t0 = time.perf_counter()
    for _ in range(100):
        c.violations()
    assert time.perf_counter() - t0 < 1.0  # 100 validations; measured ~10 ms


@settings(deadline=None, max_examples=100)
@given(
    # half the draws are multiples of 96 (= lcm of every multiple and 2*cp below), so valid packed and CP
    # configs reach the planner branch often (a plain 1..5000 draw made ~5 % of examples valid)
    seq_length=st.one_of(st.integers(1, 5000), st.integers(1, 52).map(lambda k: 96 * k)),
    mult=st.sampled_from([1, 2, 3, 4, 8, 16]),
    cp=st.sampled_from([1, 2, 3, 4]),
    tp=st.sampled_from([1, 2, 4]),
    sp=st.booleans(),
    packing=st.sampled_from(["offline", "in_batch", "streaming", "none"]),
    mbs=st.integers(1, 4),
    flatten=st.booleans(),
    per_token=st.booleans(),
)
def test_any_valid_config_plans_and_pads_consistently(seq_length, mult, cp, tp, sp, packing, mbs, flatten, per_token):
    """Whatever passes validate() can be handed to the planner with the one pad multiple (B23/B24)."""
    c = PackingConfig(seq_length=seq_length, pad_to_multiple_of=mult, context_parallel_size=cp,
                      tensor_model_parallel_size=tp, sequence_parallel=sp, packing=packing, micro_batch_size=mbs,
                      flatten_micro_batch=flatten, calculate_per_token_loss=per_token,
                      average_in_collective=not per_token)
    found = c.violations()
    assert found == c.violations()  # deterministic
    if found:
        with pytest.raises(ConfigValidationError):
            c.validate()
        return
    eff = c.effective_pad_multiple
    if packing != "none" or cp > 1:
        assert seq_length % eff == 0 and seq_length % (2 * cp if cp > 1 else 1) == 0
    if packing == "offline":
        assert mbs == 1
    if packing == "in_batch":
        assert mbs > 1
    if cp > 1:
        assert per_token
    if packing != "none":
        plan = pack_lengths(np.ones(3, dtype=np.int64), seq_length, pad_to_multiple_of=eff)
        assert int(plan.bin_loads.max()) <= seq_length
