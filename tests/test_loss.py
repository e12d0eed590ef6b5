"""seqpack.loss: per-token CE, global token normalisation (B28), sequence mean, chunked CE, gloo all-reduce."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqpack.collate import InBatchPackingCollator
from seqpack.sample import Sample
from seqpack.loss import (
    chunked_cross_entropy,
    global_token_count,
    packed_cross_entropy,
    per_token_cross_entropy,
    sequence_losses,
    sequence_mean,
    token_mean,
)

IGN = -100


def _logits_with_ce(targets, ce_per_token, vocab=8):
    """Logits whose CE at each slot equals the given value (uniform over others)."""
    rows = []
    for y, ce in zip(targets, ce_per_token):
        # p(y) = exp(-ce); spread the rest uniformly over vocab-1 tokens
        p = math.exp(-ce)
        probs = torch.full((vocab,), (1 - p) / (vocab - 1), dtype=torch.float64)
        probs[y] = p
        rows.append(probs.log())
    return torch.stack(rows)


def _b28_samples():
    """Sample 1: 10 loss tokens with CE 1.0 each (sum 10); sample 2: 2 loss tokens, CE 2.0 (sum 4)."""
    s1 = Sample(np.arange(11) % 8, np.r_[np.arange(1, 11) % 8, IGN], sample_id="mb1")
    s2 = Sample(np.array([1, 2, 3]), np.array([2, 3, IGN]), sample_id="mb2")
    return s1, s2


def _logits_for(batch, ce_of_segment):
    lab = batch["labels"][0]
    seg = batch["seq_idx"][0]
    ces = [ce_of_segment[int(s)] for s in seg]
    return _logits_with_ce([max(int(y), 0) for y in lab], ces)[None]


def test_B28_token_mean_is_global_not_per_microbatch():
    s1, s2 = _b28_samples()
    ces = {0: 1.0, 1: 2.0}
    coll = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)
    # two micro-batches
    sums, counts, seg_means = [], [], []
    for i, s in enumerate((s1, s2)):
        b = coll([s])
        ls, n = packed_cross_entropy(_logits_for(b, {0: ces[i]}), b["labels"])
        sums.append(ls)
        counts.append(n)
        seg_means.append(sequence_losses(per_token_cross_entropy(_logits_for(b, {0: ces[i]}), b["labels"]),
                                         b["labels"], b["seq_idx"])[0])
    assert [float(s) for s in sums] == pytest.approx([10.0, 4.0]) and [int(c) for c in counts] == [10, 2]
    two = token_mean(sums, global_token_count(counts))
    buggy = 0.5 * (sums[0] / counts[0]) + 0.5 * (sums[1] / counts[1])
    assert float(two) == pytest.approx(14 / 12, abs=1e-6)
    assert float(buggy) == pytest.approx(1.5)
    # one packed micro-batch holding both
    b = coll([s1, s2])
    logits = _logits_for(b, ces)
    ls, n = packed_cross_entropy(logits, b["labels"])
    assert float(token_mean(ls, global_token_count(n))) == pytest.approx(14 / 12, abs=1e-6)
    # sequence mean: per segment (not per row), 1.5 under any packing
    means, cnt = sequence_losses(per_token_cross_entropy(logits, b["labels"]), b["labels"], b["seq_idx"])
    assert means.tolist() == pytest.approx([1.0, 2.0]) and cnt.tolist() == [10, 2]
    assert float(sequence_mean(means)) == pytest.approx(1.5)
    assert float(sequence_mean(seg_means)) == pytest.approx(1.5)


def test_sequence_mean_skips_tail_segment():
    s1, s2 = _b28_samples()
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, seq_length=32,
                               force_to_pad_to_seq_len=True)([s1, s2])
    assert b["num_segments"] == 3  # tail segment
    logits = _logits_for(b, {0: 1.0, 1: 2.0, 2: 0.5})
    means, _ = sequence_losses(per_token_cross_entropy(logits, b["labels"]), b["labels"], b["seq_idx"],
                               b["num_segments"])
    assert means.tolist() == pytest.approx([1.0, 2.0])


def test_per_token_matches_torch():
    torch.manual_seed(0)
    logits = torch.randn(1, 12, 30)
    labels = torch.randint(0, 30, (1, 12))
    labels[0, [0, 5, 11]] = IGN
    pt = per_token_cross_entropy(logits, labels)
    assert pt.shape == (1, 12) and (pt[0, [0, 5, 11]] == 0).all()
    ls, n = packed_cross_entropy(logits, labels)
    assert int(n) == 9
    assert torch.allclose(ls / n, F.cross_entropy(logits[0], labels[0], ignore_index=IGN), atol=1e-6)
    assert torch.allclose(pt.sum(), ls, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_equals_naive_values_and_grads(chunk):
    torch.manual_seed(0)
    T, H, V = 50, 16, 97
    h = torch.randn(T, H, requires_grad=True)
    w = torch.randn(V, H, requires_grad=True)
    y = torch.randint(0, V, (T,))
    y[::4] = IGN
    y[10:20] = IGN  # a whole chunk without targets (skipped)
    ref, nref = packed_cross_entropy(h @ w.t(), y)
    ref.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    got, n = chunked_cross_entropy(h, w, y, chunk_size=chunk)
    (got * 1.0).backward()
    assert int(n) == int(nref)
    assert abs(got.item() - ref.item()) <= 1e-4
    assert (h.grad - gh).abs().max() <= 1e-5 and (w.grad - gw).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_cross_entropy(h, w, y, chunk_size=0)


def test_chunked_on_model_hidden_states():
    """chunked CE from last_hidden_state + lm_head.weight equals the model's logits path."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    ids = torch.randint(0, 300, (1, 20))
    labels = torch.cat([ids[:, 1:], torch.tensor([[IGN]])], 1)
    hidden = model.model(ids, use_cache=False).last_hidden_state
    a, _ = chunked_cross_entropy(hidden, model.lm_head.weight, labels, chunk_size=8)
    b, _ = packed_cross_entropy(model.lm_head(hidden), labels)
    assert abs(a.item() - b.item()) <= 1e-4


def _gloo_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # rank 0 holds B28's micro-batch 1, rank 1 micro-batch 2
        loss_sum = torch.tensor([10.0, 4.0][rank])
        count = torch.tensor([10, 2][rank])
        g = global_token_count(count)
        local = token_mean(loss_sum, g)
        total = local.clone()
        dist.all_reduce(total)  # what DDP's gradient sum sees (before its 1/W)
        seg = sequence_mean(torch.tensor([[1.0], [2.0]][rank]))  # this rank's share
        dist.all_reduce(seg)
        torch.save({"count": int(g), "total": float(total), "seq": float(seg)}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
def test_B28_gloo_two_ranks_match_single_process(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_gloo_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    res = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    single = token_mean(torch.tensor(14.0), global_token_count([10, 2]))
    for r in res:
        assert r["count"] == 12
        assert r["total"] == pytest.approx(float(single)) == pytest.approx(14 / 12)
        assert r["seq"] == pytest.approx(1.5)
