"""Sliding-window and chunked models train packed exactly as each sample alone (transformers' own forward).

Tiny random-init configs (fp32, CPU, train mode) whose windows / chunks are smaller than the samples:
Mistral, Qwen2 (``use_sliding_window`` + ``max_window_layers``), Gemma-2, Gemma-3 text (mixed
``layer_types``), Cohere2, gpt-oss, Phi-3, Llama-4 text (``attention_chunk_size``). Each through
:func:`seqpack.hf.packed_forward` on an in-batch row with alignment padding, and through the Trainer path
``model(**PackedCollator(format="hf", config=model.config)(offline rows))``; logits and every gradient
within 1e-5 of running each sample alone. FlexAttention: forward only (no backward on CPU).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _models import random_samples

from seqpack.adapters import gather_real
from seqpack.collate import InBatchPackingCollator, PackedCollator
from seqpack.hf import packed_forward
from seqpack.loss import packed_cross_entropy
from seqpack.packed import build_packed_sequence
from seqpack.packed.masks import attention_inputs

V = 128
TOL = 1e-5
W = 5  # window / chunk: smaller than every sample below
LENGTHS = (9, 13, 7, 11)


def _config(name):
    import transformers as T

    common = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, tie_word_embeddings=False)
    two = ["sliding_attention", "full_attention"]
    return {
        "mistral": lambda: T.MistralConfig(sliding_window=W, **common),
        "qwen2": lambda: T.Qwen2Config(use_sliding_window=True, sliding_window=W, max_window_layers=1, **common),
        "gemma2": lambda: T.Gemma2Config(sliding_window=W, head_dim=8, **common),
        "gemma3_text": lambda: T.Gemma3TextConfig(sliding_window=W, head_dim=8, layer_types=two, **common),
        "cohere2": lambda: T.Cohere2Config(sliding_window=W, layer_types=two, **common),
        "gpt_oss": lambda: T.GptOssConfig(sliding_window=W, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                          **common),
        "phi3": lambda: T.Phi3Config(sliding_window=W, **common),
        "llama4_text": lambda: T.Llama4TextConfig(attention_chunk_size=W, head_dim=8, intermediate_size_mlp=64,
                                                  num_local_experts=2, no_rope_layers=[1, 0], **common),
    }[name]()


NAMES = ["mistral", "qwen2", "gemma2", "gemma3_text", "cohere2", "gpt_oss", "phi3", "llama4_text"]
EAGER_ONLY = {"gemma2", "gpt_oss"}  # transformers refuses sdpa for these


def _model(name, impl):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(_config(name), attn_implementation=impl).train()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _alone(model, samples):
    """Each sample alone: logits, grads of the token-mean CE over all samples, and that loss."""
    model.zero_grad(set_to_none=True)
    logits, sums, count = [], [], 0
    for s in samples:
        out = model(torch.as_tensor(s.input_ids[None]))
        ls, n = packed_cross_entropy(out.logits[0], torch.as_tensor(s.labels))
        logits.append(out.logits[0].detach())
        sums.append(ls)
        count += int(n)
    loss = torch.stack(sums).sum() / count
    loss.backward()
    return torch.cat(logits), _grads(model), loss.item()


def _close(model, logits, pad, ref, loss=None):
    got = gather_real(logits.detach(), pad)
    assert got.shape == ref[0].shape
    assert (got - ref[0]).abs().max().item() <= TOL
    if loss is not None:
        assert abs(loss - ref[2]) <= TOL
        g = _grads(model)
        assert g.keys() == ref[1].keys()
        assert max((g[k] - ref[1][k]).abs().max().item() for k in g) <= TOL


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", NAMES)
def test_windowed_packed_equals_each_sample_alone(name, impl):
    if impl == "sdpa" and name in EAGER_ONLY:
        pytest.skip(f"transformers has no sdpa attention for {name}")
    torch.set_num_threads(1)
    model = _model(name, impl)
    samples = random_samples(LENGTHS, vocab=V, seed=7)
    ref = _alone(model, samples)

    # packed_forward on an in-batch row (alignment padding inside segments)
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    assert bool(batch["padding_mask"].any())
    model.zero_grad(set_to_none=True)
    out = packed_forward(model, batch, compute_loss=False)
    ls, n = packed_cross_entropy(out.logits, batch["labels"])
    (ls / n).backward()
    _close(model, out.logits, batch["padding_mask"], ref, (ls / n).item())

    # the Trainer path: offline rows (one padded to a fixed length) -> format="hf" -> model(**batch)
    rows = [build_packed_sequence(samples[:2], pad_to_multiple_of=8, pad_token_id=0),
            build_packed_sequence(samples[2:], pad_to_multiple_of=8, pad_token_id=0, seq_length=48,
                                  pad_to_max_length=True)]
    hf = PackedCollator(format="hf", config=model.config)(rows)
    thd = PackedCollator()(rows)
    model.zero_grad(set_to_none=True)
    out = model(**hf)
    out.loss.backward()
    _close(model, out.logits, thd["padding_mask"], ref, out.loss.item())


def test_window_and_chunk_matter_and_are_not_off_by_one():
    """The tests above would fail with the window-blind mask, or a window / chunk one token off."""
    torch.set_num_threads(1)
    samples = random_samples(LENGTHS, vocab=V, seed=7)
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    args = (batch["seq_idx"], batch["padding_mask"], batch["cu_seqlens_padded"], batch["max_seqlen"], "sdpa")
    for name, key in (("mistral", "sliding_window"), ("llama4_text", "chunk_size")):
        model = _model(name, "sdpa")
        with torch.no_grad():
            ref = _alone_logits(model, samples)
            inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
            for size in (None, W - 1, W + 1):
                mask = attention_inputs(*args, **({key: size} if size else {}))["attention_mask"]
                if name == "llama4_text":  # only the chunked layers take the changed mask
                    full = attention_inputs(*args)["attention_mask"]
                    mask = {"chunked_attention": mask, "full_attention": full}
                got = gather_real(model(**inputs, attention_mask=mask).logits, batch["padding_mask"])
                assert (got - ref).abs().max().item() > 1e-3, (name, size)


def _alone_logits(model, samples):
    return torch.cat([model(torch.as_tensor(s.input_ids[None])).logits[0] for s in samples])


@pytest.mark.parametrize("name", ["mistral", "gemma3_text", "llama4_text"])
def test_flex_attention_forward(name, monkeypatch):
    """One BlockMask (Mistral) and dicts of BlockMasks (sliding + full, chunked + full), forward only.

    transformers wraps flex_attention (and its own per-sample BlockMasks) in torch.compile, which costs
    minutes per shape on CPU: the packed run calls flex_attention uncompiled (same maths, unfused) and the
    per-sample reference is the same weights under eager attention."""
    import transformers.integrations.flex_attention as hf_flex
    from torch.nn.attention.flex_attention import flex_attention

    torch.set_num_threads(1)
    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention",
                        lambda q, k, v, training=False, **kw: flex_attention(q, k, v, **kw))
    model = _model(name, "flex_attention")
    ref_model = _model(name, "eager")
    samples = random_samples(LENGTHS, vocab=V, seed=7)
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _alone_logits(ref_model, samples)
        got = gather_real(packed_forward(model, batch, compute_loss=False).logits, batch["padding_mask"])
    assert (got - ref).abs().max().item() <= TOL


def test_llama4_temperature_tuning_rows_refused_from_floor_scale():
    """Llama-4 NoPE layers scale queries by the slot index in the row: exact below floor_scale, refused from it."""
    import transformers as T

    cfg = T.Llama4TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, attention_chunk_size=W, head_dim=8,
                             intermediate_size_mlp=64, num_local_experts=2, no_rope_layers=[1, 0], floor_scale=16)
    samples = random_samples((9, 13), vocab=V, seed=7)
    with pytest.raises(ValueError, match="22 slots with 2 segments is not exact: its attention temperature tuning"):
        InBatchPackingCollator(pad_token_id=0, format="hf", config=cfg, attn_implementation="sdpa")(samples)
    # the refusal is needed: this row really differs from the samples alone
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    batch = InBatchPackingCollator(pad_token_id=0)(samples)
    short = InBatchPackingCollator(pad_token_id=0, format="hf", config=model.config)(samples[:1])
    with torch.no_grad():
        ref = _alone_logits(model, samples)
        args = (batch["seq_idx"], batch["padding_mask"], batch["cu_seqlens_padded"], batch["max_seqlen"], "sdpa")
        mask = {"chunked_attention": attention_inputs(*args, chunk_size=W)["attention_mask"],
                "full_attention": attention_inputs(*args)["attention_mask"]}
        got = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask).logits
        assert (got[0] - ref).abs().max().item() > 1e-5
        # one segment: slot index == position, exact
        one = model(**{k: v for k, v in short.items() if k not in ("labels", "shift_labels")}).logits[0]
        assert (one - ref[:9]).abs().max().item() <= TOL
