"""seqpack.hf: HF causal LMs on packed rows, as loaded (default config, train mode, Trainer-style call).

Tiny random-init Qwen3 (vocab 256, hidden 64, 2 layers), token ids drawn at random in the vocab.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _models import random_samples

from seqpack.adapters import gather_real
from seqpack.collate import InBatchPackingCollator, PackedCollator, to_hf_inputs
from seqpack.sample import Sample
from seqpack.hf import PackedAttentionError, check_hf_inputs, install_packing_guard, packed_forward
from seqpack.loss import packed_cross_entropy

V = 256


def _model(impl="sdpa"):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).train()


def _samples(lengths=(3, 2, 11, 6), seed=0):
    return random_samples(lengths, vocab=V, seed=seed)


def _alone(model, s):
    return model(torch.as_tensor(s.input_ids[None], dtype=torch.long)).logits[0]


def test_B01_position_ids_alone_leak_with_default_config():
    """What transformers 5.x does: with the default config (use_cache=True) in train mode a DynamicCache
    exists, so masking_utils skips packed-sequence inference and doc B attends to doc A. With an
    all-ones 2-D mask it also leaks (B01). packed_forward does not."""
    model = _model("sdpa")
    a, b = _samples((3, 2))
    row = torch.as_tensor(np.concatenate([a.input_ids, b.input_ids])[None], dtype=torch.long)
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    with torch.no_grad():
        ref_b = _alone(model, b)
        leak_pos_only = model(row, position_ids=pos).logits[0, 3:]
        leak_ones = model(row, position_ids=pos, attention_mask=torch.ones_like(row)).logits[0, 3:]
        batch = InBatchPackingCollator(pad_token_id=0)([a, b])
        ours = packed_forward(model, batch).logits[0, 3:]
    assert (leak_pos_only - ref_b).abs().max() > 1e-3
    assert (leak_ones - ref_b).abs().max() > 1e-3
    assert (ours - ref_b).abs().max() <= 1e-5
    # the explicit mask: query 3 (first of B) sees only key 3, query 4 sees keys {3, 4}
    mask = to_hf_inputs(batch, config=model.config)["attention_mask"][0, 0]
    assert mask[3].nonzero().flatten().tolist() == [3]
    assert mask[4].nonzero().flatten().tolist() == [3, 4]
    assert batch["cu_seqlens"].tolist() == [0, 3, 5]


def test_B01_refused_with_instructions():
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    with pytest.raises(PackedAttentionError, match="2-D attention_mask.*B01.*packed_forward"):
        check_hf_inputs({"input_ids": torch.zeros(1, 5, dtype=torch.long), "position_ids": pos,
                         "attention_mask": torch.ones(1, 5)})
    with pytest.raises(PackedAttentionError, match="use_cache=True"):
        check_hf_inputs({"position_ids": pos})
    with pytest.raises(PackedAttentionError, match="cu_seq_lens_q"):
        check_hf_inputs({"position_ids": pos, "attention_mask": torch.ones(1, 1, 5, 5, dtype=torch.bool)},
                        attn_implementation="flash_attention_2")
    # accepted: explicit 4-D mask, flash kwargs, unpacked positions with a 2-D mask
    check_hf_inputs({"position_ids": pos, "attention_mask": torch.ones(1, 1, 5, 5, dtype=torch.bool)})
    check_hf_inputs({"position_ids": pos, "cu_seq_lens_q": torch.tensor([0, 3, 5], dtype=torch.int32)})
    check_hf_inputs({"position_ids": torch.arange(5)[None], "attention_mask": torch.ones(1, 5)})
    check_hf_inputs({"position_ids": pos, "use_cache": False})
    # generate()'s left padding is not packing
    check_hf_inputs({"position_ids": torch.tensor([[1, 1, 0, 1, 2]]), "attention_mask": torch.tensor([[0, 0, 1, 1, 1]])})

    model = _model("sdpa")
    batch = InBatchPackingCollator(pad_token_id=0)(_samples((3, 2)))
    bad = dict(batch, attention_mask=torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(PackedAttentionError, match="B01"):
        packed_forward(model, bad)
    handle = install_packing_guard(model)
    try:
        with pytest.raises(PackedAttentionError, match="B01"):
            model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                  attention_mask=torch.ones(1, 5, dtype=torch.long))
        model(**to_hf_inputs(batch, config=model.config))  # the seqpack form passes the guard
    finally:
        handle.remove()


@pytest.mark.parametrize("impl", ["sdpa", "eager", "flex_attention"])
def test_packed_forward_matches_alone(impl):
    model = _model(impl)
    samples = _samples((7, 2, 13, 5))
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, seq_length=64,
                                   force_to_pad_to_seq_len=True)(samples)
    with torch.no_grad():
        ref = torch.cat([_alone(model, s) for s in samples])
        got = gather_real(packed_forward(model, batch).logits, batch["padding_mask"])
        model.eval()
        got_eval = gather_real(packed_forward(model, batch).logits, batch["padding_mask"])
    assert (got - ref).abs().max() <= 1e-5
    assert (got_eval - ref).abs().max() <= 1e-5


def test_trainer_format_loss_and_grads_match_packed_forward():
    """format='hf' output fed as model(**batch) (how Trainer calls it) == packed_forward + seqpack.loss."""
    model = _model("eager")
    samples = _samples((9, 4, 6))
    thd = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    hf = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, format="hf",
                                config=model.config)(samples)
    assert set(hf) == {"input_ids", "position_ids", "labels", "shift_labels", "attention_mask"}
    assert hf["attention_mask"].dtype == torch.float32 and hf["attention_mask"].dim() == 4
    out = model(**hf)
    out.loss.backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    o2 = packed_forward(model, thd, compute_loss=False)
    ls, n = packed_cross_entropy(o2.logits, thd["labels"])
    (ls / n).backward()
    assert abs(out.loss.item() - (ls / n).item()) <= 1e-6
    assert max((g1[k] - p.grad).abs().max().item() for k, p in model.named_parameters()) <= 1e-6


def test_final_target_kept_via_shift_labels():
    """B12-style explicit final target at a segment's last physical slot: HF labels cannot hold it,
    shift_labels does, and the HF loss still counts it."""
    ids = np.array([5, 6, 7], dtype=np.int64)
    s = Sample(ids, np.array([6, 7, 9]), sample_id="trunc")  # final target 9 stored
    t = Sample(np.array([3, 4]), np.array([4, -100]), sample_id="t")
    batch = InBatchPackingCollator(pad_token_id=0)([s, t])
    model = _model("sdpa")
    hf = to_hf_inputs(batch, config=model.config)
    assert hf["shift_labels"][0].tolist() == [6, 7, 9, 4, -100]
    assert hf["labels"][0].tolist() == [-100, 6, 7, -100, 4]
    with torch.no_grad():
        out = model(**hf)
        ls, n = packed_cross_entropy(out.logits, batch["labels"])
    assert int(n) == 4 and abs(out.loss.item() - (ls / n).item()) <= 1e-6


def test_flash_attention_kwargs_code_path():
    samples = _samples((5, 3))
    from transformers import Qwen3Config

    hf = PackedCollator(format="hf", config=Qwen3Config(), attn_implementation="flash_attention_2")(
        [InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)])
    assert "attention_mask" not in hf
    assert hf["cu_seq_lens_q"].dtype == torch.int32 and hf["cu_seq_lens_q"].tolist() == [0, 8, 12]
    assert hf["max_length_q"] == 8 and isinstance(hf["max_length_k"], int)
    check_hf_inputs(hf, attn_implementation="flash_attention_2")
    if not torch.cuda.is_available():
        pytest.skip("flash_attention_2 forward needs CUDA and flash-attn")
    pytest.importorskip("flash_attn")
    from transformers import AutoModelForCausalLM

    model = _model("sdpa")
    fmodel = AutoModelForCausalLM.from_config(model.config, attn_implementation="flash_attention_2",
                                              torch_dtype=torch.bfloat16).cuda()
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    with torch.no_grad():
        got = gather_real(packed_forward(fmodel, batch).logits.float().cpu(), batch["padding_mask"])
        ref = torch.cat([fmodel(torch.as_tensor(s.input_ids[None]).long().cuda()).logits[0].float().cpu()
                         for s in samples])
    assert (got - ref).abs().max() <= 5e-2


def test_trainer_packed_equals_padded_training(tmp_path):
    """HF Trainer with gradient accumulation: packed (format='hf') and right-padded batches of the
    same samples give the same parameters after two optimizer steps (global token normalisation via
    num_items_in_batch, B28 inside Trainer)."""
    from transformers import Trainer, TrainingArguments

    from seqpack.collate import PaddedCollator

    samples = _samples((9, 4, 6, 12, 3, 7, 5, 8), seed=3)
    finals = {}
    for name, coll in {
        "packed": InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, format="hf",
                                         config=_model("sdpa").config),
        "padded": PaddedCollator(pad_token_id=0),
    }.items():
        model = _model("sdpa")
        args = TrainingArguments(str(tmp_path / name), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                 max_steps=2, optim="sgd", learning_rate=0.5, report_to=[], seed=0,
                                 lr_scheduler_type="constant", save_strategy="no")
        Trainer(model=model, args=args, train_dataset=samples, data_collator=coll).train()
        finals[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    start = dict(_model("sdpa").named_parameters())
    moved = max((finals["packed"][n] - start[n]).abs().max().item() for n in start)
    assert moved > 1e-3
    worst = max((finals["packed"][n] - finals["padded"][n]).abs().max().item() for n in start)
    assert worst <= 1e-5, worst
