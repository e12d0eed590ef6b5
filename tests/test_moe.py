"""seqpack.moe: router statistics that exclude padding; packed row == samples one by one on a tiny Qwen3-MoE."""

from __future__ import annotations

import pytest
import torch
from _models import random_samples

from seqpack.collate import InBatchPackingCollator, PaddedCollator
from seqpack.hf import packed_forward
from seqpack.moe import load_balancing_loss, router_token_counts

E, K, V = 8, 2, 256


def _moe_model(kind="qwen3_moe"):
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=64, num_experts_per_tok=K, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    if kind == "mixtral":
        cfg = MixtralConfig(intermediate_size=32, num_local_experts=E, **common)
    else:
        cfg = Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=E, decoder_sparse_step=1,
                             mlp_only_layers=[], head_dim=16, **common)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()


def _samples(lengths, seed=0):
    return random_samples(lengths, vocab=V, seed=seed)


def test_router_token_counts_excludes_padding():
    topk = torch.tensor([[0, 1], [2, 3], [0, 3], [1, 2]])
    pad = torch.tensor([False, True, False, True])
    assert router_token_counts(topk, pad, 4, 2).tolist() == [2, 1, 0, 1]
    assert router_token_counts(topk, None, 4, 2).tolist() == [2, 2, 2, 2]
    logits = torch.tensor([[5.0, 4, 0, 0], [0, 0, 5, 4], [5, 0, 0, 4], [0, 5, 4, 0]])
    assert router_token_counts(logits, pad.reshape(1, 4), 4, 2).tolist() == [2, 1, 0, 1]
    two_layers = router_token_counts((logits, logits.flip(-1)), pad, 4, 2)
    assert two_layers.shape == (2, 4) and two_layers[0].tolist() == [2, 1, 0, 1]
    with pytest.raises(ValueError, match="padding_mask has 3 slots but the router saw 4"):
        router_token_counts(topk, pad[:3], 4, 2)


def test_load_balancing_loss_matches_hf_with_attention_mask():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    torch.manual_seed(0)
    B, T = 2, 6
    layers = tuple(torch.randn(B * T, E) for _ in range(3))
    att = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    ours = load_balancing_loss(layers, att == 0, E, K)
    ref = load_balancing_loss_func(layers, E, K, att)
    assert abs(ours.item() - ref.item()) <= 1e-6
    # and padding matters: counting it changes the loss
    assert abs(load_balancing_loss(layers, None, E, K).item() - ours.item()) > 1e-4


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_packed_router_stats_equal_one_by_one(kind):
    model = _moe_model(kind)
    samples = _samples((7, 12, 5, 9))
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, seq_length=48,
                                   force_to_pad_to_seq_len=True)(samples)
    assert int(batch["padding_mask"].sum()) == 48 - 33  # alignment + tail padding in the row
    with torch.no_grad():
        packed = packed_forward(model, batch, compute_loss=False, output_router_logits=True).router_logits
        alone = [model(torch.as_tensor(s.input_ids[None]).long(), output_router_logits=True).router_logits
                 for s in samples]
        padded_batch = PaddedCollator(pad_token_id=0)(samples)
        padded_out = model(**padded_batch, output_router_logits=True)
        padded = padded_out.router_logits
        packed_out = packed_forward(model, batch, output_router_logits=True)  # loss = CE + coef * aux
    assert len(packed) == 2 and packed[0].shape == (48, E)
    got = router_token_counts(packed, batch["padding_mask"], E, K)
    ref = sum(router_token_counts(a, None, E, K) for a in alone)
    assert torch.equal(got, ref)
    assert got.sum().item() == 2 * 33 * K
    # counting the padding slots would change them
    assert not torch.equal(router_token_counts(packed, None, E, K), ref)
    # aux loss: packed row (padding excluded) == concatenated single-sample routers == HF padded batch
    lb_packed = load_balancing_loss(packed, batch["padding_mask"], E, K)
    cat = tuple(torch.cat([a[layer] for a in alone]) for layer in range(2))
    lb_alone = load_balancing_loss(cat, None, E, K)
    lb_padded = load_balancing_loss(padded, padded_batch["attention_mask"] == 0, E, K)
    assert abs(lb_packed.item() - lb_alone.item()) <= 1e-6
    assert abs(lb_packed.item() - lb_padded.item()) <= 1e-6
    assert abs(packed_out.aux_loss.item() - padded_out.aux_loss.item()) <= 1e-6
    assert abs(packed_out.loss.item() - padded_out.loss.item()) <= 1e-5


# ----------------------------------------------------------------------------- transformers MoE models
#: tiny configs of the MoE families, as AutoConfig.for_model(model_type, **kwargs); GraniteMoE scales its
#: logits (logits_scaling), which a copy of the head would drop
TINY_MOE = {
    "qwen3_moe": dict(num_experts=E, moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[], head_dim=16),
    "mixtral": dict(num_local_experts=E),
    "qwen2_moe": dict(num_experts=E, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                      decoder_sparse_step=1, mlp_only_layers=[]),
    "olmoe": dict(num_experts=E),
    "granitemoe": dict(num_local_experts=E, logits_scaling=4.0),
}


def _tiny_moe(model_type, **over):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, vocab_size=V, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               num_experts_per_tok=K, router_aux_loss_coef=0.5, **{**TINY_MOE[model_type], **over})
    return AutoModelForCausalLM.from_config(cfg).train()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _max_diff(a, b):
    assert a.keys() == b.keys() and a
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _hf_batch(model, samples, **coll):
    """The format='hf' batch the collator builds for the model (config=model.config)."""
    return InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, format="hf", config=model.config,
                                  **coll)(samples)


@pytest.mark.parametrize("model_type", list(TINY_MOE))
def test_trainer_path_router_loss_equals_padded_batch(model_type):
    """model(**format='hf' batch) as Trainer calls it, on a prepared model: no crash, aux_loss equal to
    transformers' own load_balancing_loss_func on the padded batch (padding excluded), loss and every
    gradient equal to the padded batch's (fp32, 1e-5)."""
    import copy
    import sys

    from seqpack.hf import prepare_model

    model = _tiny_moe(model_type)
    ref_model = copy.deepcopy(model)  # never prepared: transformers' own path
    samples = _samples((7, 12, 5, 9), seed=1)
    padded = PaddedCollator(pad_token_id=0)(samples)
    ref = ref_model(**padded, output_router_logits=True)
    ref.loss.backward()
    lbl = sys.modules[type(ref_model).__module__].load_balancing_loss_func
    hf_aux = lbl(ref.router_logits, E, K, padded["attention_mask"])
    assert abs(ref.aux_loss.item() - hf_aux.item()) <= 1e-7
    assert abs(lbl(ref.router_logits, E, K, None).item() - hf_aux.item()) > 1e-4  # padding would count

    prepare_model(model)
    batch = _hf_batch(model, samples, seq_length=48, force_to_pad_to_seq_len=True)
    assert batch["attention_mask"].dim() == 4 and int(batch["padding_mask"].sum()) == 48 - 33
    out = model(**batch, output_router_logits=True)
    out.loss.backward()
    assert abs(out.aux_loss.item() - hf_aux.item()) <= 1e-6
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5
    assert _max_diff(_grads(model), _grads(ref_model)) <= 1e-5
    # same on the model's own seqpack-free input: a prepared model on a padded batch is transformers' run
    again = model(**padded, output_router_logits=True)
    assert abs(again.aux_loss.item() - hf_aux.item()) <= 1e-6


@pytest.mark.parametrize("model_type", list(TINY_MOE))
def test_packed_forward_uses_the_models_own_head(model_type):
    """packed_forward with router outputs: logits equal each sample run alone (GraniteMoE's logits_scaling
    included), aux_loss equal to transformers' padded-batch value, loss = CE + coef * aux."""
    model = _tiny_moe(model_type)
    samples = _samples((6, 11, 4), seed=2)
    padded = PaddedCollator(pad_token_id=0)(samples)
    with torch.no_grad():
        ref = model(**padded, output_router_logits=True)  # before packed_forward prepares the model
        alone = torch.cat([model(torch.as_tensor(s.input_ids[None]).long()).logits[0] for s in samples])
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8)(samples)
    out = packed_forward(model, batch, output_router_logits=True)
    from seqpack.adapters import gather_real

    got = gather_real(out.logits, batch["padding_mask"])
    assert (got - alone).abs().max().item() <= 1e-5
    assert abs(out.aux_loss.item() - ref.aux_loss.item()) <= 1e-6
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5


def test_trainer_two_steps_moe_packed_equals_padded(tmp_path):
    """A real transformers.Trainer, two optimizer steps with gradient accumulation, Qwen3-MoE with
    output_router_logits=True in its config: packed (prepared model) == padded batches (unprepared)."""
    from transformers import Trainer, TrainingArguments

    from seqpack.hf import prepare_model

    samples = _samples((9, 4, 6, 12, 3, 7, 5, 8), seed=3)
    finals = {}
    for name in ("packed", "padded"):
        model = _tiny_moe("qwen3_moe", output_router_logits=True)
        if name == "packed":
            prepare_model(model)  # once, before Trainer(...)
            coll = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, format="hf", config=model.config)
        else:
            coll = PaddedCollator(pad_token_id=0)
        args = TrainingArguments(str(tmp_path / name), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                 max_steps=2, optim="sgd", learning_rate=0.5, report_to=[], seed=0,
                                 lr_scheduler_type="constant", save_strategy="no")
        Trainer(model=model, args=args, train_dataset=samples, data_collator=coll).train()
        finals[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    start = dict(_tiny_moe("qwen3_moe").named_parameters())
    assert max((finals["packed"][n] - start[n]).abs().max().item() for n in start) > 1e-3
    assert _max_diff(finals["packed"], finals["padded"]) <= 1e-5


def test_router_statistics_refused_without_prepare_model():
    """Unprepared: the config check refuses by name (no crash inside transformers); prepared: a packed batch
    that lost its padding_mask is refused instead of counting padding."""
    from seqpack.adapters.architecture import PackingUnsupportedError, check_packed_support
    from seqpack.hf import prepare_model

    model = _tiny_moe("mixtral", output_router_logits=True)
    with pytest.raises(PackingUnsupportedError, match="prepare_model") as e:
        check_packed_support(model.config)
    assert e.value.model_type == "mixtral" and e.value.layer_kind == "moe_router"
    samples = _samples((5, 6))
    with pytest.raises(PackingUnsupportedError, match="prepare_model"):
        _hf_batch(model, samples)  # the collator refuses at the first call
    model.config.output_router_logits = False
    hf = _hf_batch(model, samples)  # built without router statistics, then asked for them
    model.config.output_router_logits = True
    assert "padding_mask" not in hf
    with pytest.raises(Exception, match="shape|size|view"):  # what transformers does with the 4-D mask
        model(**hf)
    from seqpack.hf import install_packing_guard

    handle = install_packing_guard(model)  # the guard refuses by name instead
    with pytest.raises(PackingUnsupportedError, match="prepare_model"):
        model(**hf)
    model.config.output_router_logits = False
    with pytest.raises(PackingUnsupportedError, match="prepare_model"):
        model(**hf, output_router_logits=True)
    assert model(**hf).loss is not None  # no router statistics asked: runs
    handle.remove()
    model.config.output_router_logits = True
    prepare_model(model)
    check_packed_support(model.config)
    with pytest.raises(PackingUnsupportedError, match="carries no padding_mask"):
        model(**hf)
    with pytest.raises(PackingUnsupportedError, match="no load_balancing_loss_func"):
        from test_hf import _model

        prepare_model(_model())
