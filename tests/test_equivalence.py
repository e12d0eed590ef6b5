"""Done-when of issue #3: a packed batch trains exactly like its samples run one by one.

Real samples: the first records of ``../shared/data/llama-factory/alpaca_en_demo.json`` tokenised with
the Qwen3 chat template (``seqpack.data.prepare``, assistant-only labels, truncated at 96 tokens so
some samples keep an explicit final target, B12). The tiny random-init models use a 512-token
vocabulary: real Qwen3 token ids are mapped ``id % 512`` (labels likewise), which keeps every
sample's structure (lengths, label masks) and the test fast.

Models (fp32, CPU, train mode, default config otherwise): Qwen3, Llama, Qwen3-MoE; attention
``sdpa`` and ``eager``. Checks: per-token logits and every parameter gradient within 1e-5 (max abs)
of running each sample alone; the token-mean loss equals padded-batch training (HF ``Trainer``-style
``model(**batch)`` on right-padded rows) of the same samples.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from seqpack.adapters import gather_real
from seqpack.collate import InBatchPackingCollator, PackedCollator, PaddedCollator, to_hf_inputs
from seqpack.sample import Sample
from seqpack.hf import packed_forward
from seqpack.loss import packed_cross_entropy

VOCAB = 512
TOL = 1e-5


def _configs():
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  pad_token_id=0, tie_word_embeddings=False)
    return {
        "qwen3": Qwen3Config(head_dim=16, **common),
        "llama": LlamaConfig(**common),
        "qwen3_moe": Qwen3MoeConfig(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                    decoder_sparse_step=1, mlp_only_layers=[], **common),
    }


@pytest.fixture(scope="module")
def real_samples(shared_data, tmp_path_factory):
    src = shared_data / "llama-factory" / "alpaca_en_demo.json"
    records = json.loads(src.read_text())[:6]
    path = tmp_path_factory.mktemp("alpaca") / "alpaca_head.json"
    path.write_text(json.dumps(records))
    from seqpack.data import prepare

    samples, report = prepare(str(path), "qwen3", seq_length=96)
    assert report.records_read == 6 and len(samples) >= 4
    out = []
    for s in samples[:5]:
        lab = np.where(s.labels >= 0, s.labels % VOCAB, -100)
        out.append(Sample(s.input_ids % VOCAB, lab, sample_id=s.sample_id))
    return out


def _model(name, impl):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1234)
    return AutoModelForCausalLM.from_config(_configs()[name], attn_implementation=impl).train()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _reference(model, samples):
    """Each sample alone (plain model call, no mask): logits and grads of sum-CE / total tokens."""
    model.zero_grad(set_to_none=True)
    logits, sums, count = [], [], 0
    for s in samples:
        out = model(torch.as_tensor(s.input_ids[None], dtype=torch.long))
        ls, n = packed_cross_entropy(out.logits[0], torch.as_tensor(s.labels, dtype=torch.long))
        logits.append(out.logits[0].detach())
        sums.append(ls)
        count += int(n)
    loss = torch.stack(sums).sum() / count
    loss.backward()
    return torch.cat(logits), _grads(model), loss.detach(), count


def _check_packed(model, batch, ref_logits, ref_grads, ref_loss, ref_count):
    model.zero_grad(set_to_none=True)
    out = packed_forward(model, batch, compute_loss=False)
    ls, n = packed_cross_entropy(out.logits, batch["labels"])
    assert int(n) == ref_count
    (ls / n).backward()
    got = gather_real(out.logits.detach(), batch["padding_mask"])
    assert got.shape == ref_logits.shape
    assert (got - ref_logits).abs().max().item() <= TOL
    grads = _grads(model)
    assert grads.keys() == ref_grads.keys()
    worst = max((grads[k] - ref_grads[k]).abs().max().item() for k in grads)
    assert worst <= TOL, worst
    assert abs((ls / n).item() - ref_loss.item()) <= TOL
    return (ls / n).detach()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["qwen3", "llama", "qwen3_moe"])
def test_packed_equals_one_by_one(real_samples, name, impl):
    model = _model(name, impl)
    ref_logits, ref_grads, ref_loss, ref_count = _reference(model, real_samples)

    # in-batch packing: all samples in one row, alignment padding to 16
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=16)(real_samples)
    assert int(batch["num_segments"]) == len(real_samples) >= 3
    assert bool(batch["padding_mask"].any())  # alignment padding really present
    packed_loss = _check_packed(model, batch, ref_logits, ref_grads, ref_loss, ref_count)

    # offline packs (multiple 8) flattened by PackedCollator with offset boundaries
    from seqpack.packed import build_packed_sequence

    rows = [build_packed_sequence(real_samples[:3], pad_to_multiple_of=8, pad_token_id=0),
            build_packed_sequence(real_samples[3:], pad_to_multiple_of=8, pad_token_id=0, seq_length=256,
                                  pad_to_max_length=True)]
    batch2 = PackedCollator()(rows)
    _check_packed(model, batch2, ref_logits, ref_grads, ref_loss, ref_count)

    # token-mean loss equals padded-batch training of the same samples (HF model(**batch) path)
    with torch.no_grad():
        padded = PaddedCollator(pad_token_id=0, pad_to_multiple_of=8)(real_samples)
        padded_loss = model(**padded).loss
        hf_loss = model(**to_hf_inputs(batch, config=model.config)).loss  # Trainer-format of the packed batch
    assert abs(padded_loss.item() - packed_loss.item()) <= TOL
    assert abs(hf_loss.item() - packed_loss.item()) <= TOL
