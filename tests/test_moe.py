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
