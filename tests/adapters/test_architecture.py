"""seqpack.adapters.architecture: models whose layers cannot keep packed segments apart are refused by name,
and the refusal is needed (run anyway, their packed logits differ from each sample run alone)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from _models import random_samples

from seqpack.adapters import gather_real
from seqpack.adapters.hf_forward import model_attention_inputs
from seqpack.adapters.architecture import (STATE_LAYER_KINDS, STATE_MODEL_TYPES, PackingUnsupportedError,
                                           check_model_type, check_packed_support, packed_support_problem)
from seqpack.collate import InBatchPackingCollator, PackedCollator
from seqpack.hf import hf_inputs, packed_forward

transformers = pytest.importorskip("transformers")
V = 128
_SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
_MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=16)
#: model_type -> (extra tiny-config kwargs, the layer kind the refusal names)
STATE_MODELS = {
    "qwen3_next": (dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                        linear_value_head_dim=16), "gated_delta_net"),
    "lfm2": (dict(layer_types=["conv", "full_attention", "conv", "full_attention"]), "short_conv"),
    "falcon_h1": (dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_d_ssm=64, mamba_n_groups=1,
                       mamba_chunk_size=16), "mamba2"),
    "nemotron_h": (dict(mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=1, chunk_size=16,
                        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        moe_shared_expert_intermediate_size=32), "mamba2"),
    "bamba": (_MAMBA2, "mamba2"),
    "granitemoehybrid": (dict(**_MAMBA2, num_local_experts=4, num_experts_per_tok=2), "mamba2"),
    "jamba": (dict(num_experts=4, num_experts_per_tok=2, mamba_d_state=8), "mamba"),
    "mamba": (dict(state_size=8), "mamba"),
    "mamba2": (dict(num_heads=8, head_dim=16, state_size=8, n_groups=1, chunk_size=16), "mamba2"),
    "recurrent_gemma": (dict(lru_width=64, attention_window_size=64), "rg_lru"),
}


#: pure SSMs: no attention layer, so the packed row runs without attention inputs (their torch path reads a
#: mask as a 2-D padding mask)
NO_ATTENTION = {"mamba", "mamba2"}


def batch_row(samples):
    """One PackedSequence of ``samples`` (the offline / streaming row)."""
    from seqpack.packed.build import build_packed_sequence

    return build_packed_sequence(samples, pad_to_multiple_of=4, pad_token_id=0)


def _tiny(model_type, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    base = AutoConfig.for_model(model_type)
    small = {k: v for k, v in _SMALL.items() if hasattr(base, k)}
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **{**small, **kw})
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("model_type", list(STATE_MODELS))
def test_state_carrying_models_are_refused_and_would_leak(model_type):
    extra, kind = STATE_MODELS[model_type]
    model = _tiny(model_type, **extra, initializer_range=0.2)  # larger weights: the leak shows in the logits
    samples = random_samples((9, 7), vocab=V, seed=0)
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    hf_coll = InBatchPackingCollator(pad_token_id=0, format="hf", config=model.config)
    for call in (lambda: packed_forward(model, batch), lambda: hf_inputs(model, batch),
                 lambda: check_packed_support(model.config), lambda: hf_coll(samples),
                 lambda: PackedCollator(format="hf", config=model.config)([batch_row(samples)])):
        with pytest.raises(PackingUnsupportedError) as e:
            call()
        assert (e.value.model_type, e.value.layer_kind) == (model_type, kind)
        msg = str(e.value)
        assert f"model_type {model_type!r}" in msg and kind in msg and "carry a state" in msg
        assert "seqpack.collate.PaddedCollator" in msg and "packing='none'" in msg
    # the refusal is needed: run anyway (the attention inputs alone), the second segment starts from the
    # first one's state
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if model_type not in NO_ATTENTION:
        inputs.update(model_attention_inputs(batch, model.config))
    with torch.no_grad():
        got = gather_real(model(**inputs, use_cache=False).logits, batch["padding_mask"])
        alone = torch.cat([model(torch.as_tensor(s.input_ids[None]).long(), use_cache=False).logits[0]
                           for s in samples])
    torch.testing.assert_close(got[:9], alone[:9], atol=1e-5, rtol=1e-5)  # the first segment has nothing before it
    assert (got[9:] - alone[9:]).abs().max().item() > 1e-4  # ten times the exactness tolerance


def test_layer_types_decide_lfm2_without_conv_layers_packs_exactly():
    model = _tiny("lfm2", layer_types=["full_attention"] * 4)
    assert packed_support_problem(model.config) is None
    samples = random_samples((9, 7), vocab=V, seed=0)
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    with torch.no_grad():
        got = gather_real(packed_forward(model, batch).logits, batch["padding_mask"])
        alone = torch.cat([model(torch.as_tensor(s.input_ids[None]).long()).logits[0] for s in samples])
    assert (got - alone).abs().max().item() <= 1e-5


def test_bloom_refused_by_name():
    """Bloom builds ALiBi from a 2-D mask: transformers raises on the 4-D block mask; refused first."""
    model = _tiny("bloom", n_embed=64, n_layer=2, n_head=4)
    samples = random_samples((6, 5), vocab=V, seed=0)
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    with pytest.raises(PackingUnsupportedError, match="ALiBi bias is built from a 2-D attention_mask") as e:
        packed_forward(model, batch)
    assert (e.value.model_type, e.value.layer_kind) == ("bloom", "alibi")
    with pytest.raises(ValueError):  # what transformers does with the 4-D mask
        model(input_ids=batch["input_ids"], attention_mask=model_attention_inputs(batch, model.config)["attention_mask"])
    from transformers import AutoConfig

    assert packed_support_problem(AutoConfig.for_model("falcon")) is None  # rotary by default
    assert packed_support_problem(AutoConfig.for_model("falcon", alibi=True)).layer_kind == "alibi"


def test_cpmant_refused_its_mask_is_its_own():
    """CPM-Ant ignores attention_mask (it builds its mask from span/context): run anyway, segments leak."""
    model = _tiny("cpmant", hidden_size=64, dim_ff=64, num_hidden_layers=2, num_attention_heads=4, dim_head=16,
                  vocab_size=V, prompt_length=4)
    samples = random_samples((9, 7), vocab=V, seed=0)
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    with pytest.raises(PackingUnsupportedError, match="ignores attention_mask") as e:
        packed_forward(model, batch)
    assert (e.value.model_type, e.value.layer_kind) == ("cpmant", "own_mask")
    mask = model_attention_inputs(batch, model.config)["attention_mask"]
    with torch.no_grad():
        got = gather_real(model(input_ids=batch["input_ids"], attention_mask=mask).logits, batch["padding_mask"])
        alone = torch.cat([model(torch.as_tensor(s.input_ids[None]).long()).logits[0] for s in samples])
    assert (got[9:] - alone[9:]).abs().max().item() > 1e-4


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "mistral", "gemma2", "qwen3_moe", "gpt2"])
def test_attention_models_are_not_refused(model_type):
    from transformers import AutoConfig

    assert packed_support_problem(AutoConfig.for_model(model_type)) is None
    check_model_type(model_type)


def test_every_state_keeping_causal_lm_is_refused():
    """Audit of the installed transformers: every *ForCausalLM whose modeling file keeps a conv / recurrent /
    SSM state is refused from its default config, and the kinds are known."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    root = Path(transformers.__file__).parent / "models"
    marker = re.compile(r"conv_state|ssm_state|recurrent_state|get_recurrent_state|wkv|mlstm|rg_lru")
    seen = []
    for mt in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            cfg = AutoConfig.for_model(mt)
        except Exception:  # configs that do not build with defaults (e.g. need a sub-config)
            continue
        module = type(cfg).__module__.split(".")[-2]
        src = root / module / f"modeling_{module}.py"
        if not src.exists() or not marker.search(src.read_text()):
            continue
        if mt == "lfm2":  # the default LFM2 config has attention layers only (tested above)
            cfg = AutoConfig.for_model("lfm2", layer_types=["conv", "full_attention"], num_hidden_layers=2)
        found = packed_support_problem(cfg)
        assert found is not None, f"{mt}: keeps a recurrent state but is not refused"
        assert found.layer_kind in STATE_LAYER_KINDS
        seen.append(mt)
    assert {"qwen3_next", "falcon_h1", "nemotron_h", "mamba", "rwkv", "xlstm"} <= set(seen)
    assert set(seen) <= set(STATE_MODEL_TYPES)
