"""End-to-end proof that CP slicing is exact: a tiny transformer, single process vs CP ranks (gloo).

:func:`run_cp_equivalence` spawns ``world_size`` CPU processes (torch.multiprocessing, gloo on
127.0.0.1). Each rank takes its zigzag slice of one packed row (several documents, alignment
padding, tail padding), runs a 2-layer fp32 transformer with :func:`cp_attention_reference`, and
the summed loss and all-reduced parameter gradients are compared with the single-process result
on the full row. It also runs the boundary-blind variant (case B02) to show that the comparison
can fail.
"""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile

import numpy as np

from seqpack._torch import torch_hint

with torch_hint("seqpack.parallel.reference (the CP equivalence reference)"):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

from seqpack.packed import build_packed_sequence
from seqpack.padding import compute_pad_multiple
from seqpack.parallel.attention import block_causal_mask, cp_attention_reference, dense_attention
from seqpack.parallel.cp import gather_from_cp, slice_for_cp
from seqpack.sample import Sample, shift_labels

__all__ = ["TinyTransformer", "make_demo_row", "packed_loss_sum", "run_cp_equivalence"]


class TinyTransformer(nn.Module):
    """Pre-norm decoder (RoPE from ``position_ids``, MHA, GELU MLP), fp32, for reference checks.

    ``forward(input_ids [t], position_ids [t], attend)`` returns logits ``[t, vocab]``;
    ``attend(q, k, v)`` with ``q, k, v: [H, t, Dh]`` is the attention path (dense with a mask, or CP).
    """

    def __init__(self, vocab: int = 64, d_model: int = 32, n_heads: int = 2, n_layers: int = 2):
        super().__init__()
        self.h, self.dh = n_heads, d_model // n_heads
        self.emb = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            nn.ModuleDict(dict(n1=nn.LayerNorm(d_model), qkv=nn.Linear(d_model, 3 * d_model),
                               o=nn.Linear(d_model, d_model), n2=nn.LayerNorm(d_model),
                               up=nn.Linear(d_model, 4 * d_model), down=nn.Linear(4 * d_model, d_model)))
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.dh // 2
        freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
        ang = pos.to(torch.float32).view(-1, 1) * freqs.view(1, -1)  # [t, half]
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attend) -> torch.Tensor:
        x = self.emb(input_ids)  # [t, d]
        t = x.shape[0]
        for layer in self.layers:
            qkv = layer["qkv"](layer["n1"](x)).view(t, 3, self.h, self.dh).permute(1, 2, 0, 3)  # [3,H,t,Dh]
            q, k, v = self._rope(qkv[0], position_ids), self._rope(qkv[1], position_ids), qkv[2]
            a = attend(q, k, v).permute(1, 0, 2).reshape(t, self.h * self.dh)
            x = x + layer["o"](a)
            x = x + layer["down"](F.gelu(layer["up"](layer["n2"](x))))
        return self.head(self.norm(x))


def packed_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies over ``labels != -100`` (labels shifted per segment)."""
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


def make_demo_row(multiple: int, seed: int = 0, lengths=(13, 7, 22, 5, 9), seq_length: int = 80, vocab: int = 64):
    """A packed row of several documents with alignment and tail padding (prompt tokens masked)."""

    rng = np.random.default_rng(seed)
    samples = []
    for i, L in enumerate(lengths):
        ids = rng.integers(1, vocab, size=L)
        trainable = np.arange(L) >= L // 3  # first third is "prompt"
        samples.append(Sample(ids, shift_labels(ids, trainable), f"doc{i}"))
    return build_packed_sequence(samples, pad_to_multiple_of=multiple, pad_token_id=0, seq_length=seq_length,
                                 pad_to_max_length=True).validate(capacity=seq_length, multiple=multiple)


def _reference(model, row):
    t = row["input_ids"].shape[0]
    slots = torch.arange(t)
    mask = block_causal_mask(slots, slots, row["seq_idx"], row["seq_idx"])
    logits = model(row["input_ids"], row["position_ids"], lambda q, k, v: dense_attention(q, k, v, mask))
    n_loss = int(row["loss_mask"].sum())
    loss = packed_loss_sum(logits, row["labels"]) / n_loss
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), logits.detach(), grads


def _cp_step(model, row, world, rank, respect_segments=True):
    local = slice_for_cp(row, world, rank)
    seg = local["seq_idx"]
    idx = local["cp_indices"]

    def attend(q, k, v):
        return cp_attention_reference(q, k, v, cp_indices=idx, seq_idx=seg, respect_segments=respect_segments)

    logits = model(local["input_ids"], local["position_ids"], attend)
    n_loss = local["loss_mask"].sum().to(torch.float64)
    dist.all_reduce(n_loss)  # global token normalisation: every rank divides by the row's count
    loss_local = packed_loss_sum(logits, local["labels"]) / n_loss.to(torch.float32)
    model.zero_grad()
    loss_local.backward()
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad.detach().clone()
        dist.all_reduce(g)
        grads[n] = g
    loss = loss_local.detach().clone()
    dist.all_reduce(loss)
    return loss, logits.detach(), grads


def _worker(rank: int, world: int, port: int, out_path: str, seed: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mult = compute_pad_multiple(context_parallel_size=world)
        row = make_demo_row(mult, seed=seed).to_torch()
        torch.manual_seed(seed)
        model = TinyTransformer()
        loss_ref, logits_ref, grads_ref = _reference(model, row)
        loss_cp, logits_cp, grads_cp = _cp_step(model, row, world, rank)
        parts = [torch.empty_like(logits_cp) for _ in range(world)]
        dist.all_gather(parts, logits_cp)
        logits_full = gather_from_cp(parts, row["cu_seqlens_padded"])
        loss_blind, logits_blind, _ = _cp_step(model, row, world, rank, respect_segments=False)
        parts = [torch.empty_like(logits_blind) for _ in range(world)]
        dist.all_gather(parts, logits_blind)
        blind_full = gather_from_cp(parts, row["cu_seqlens_padded"])
        real = ~row["padding_mask"]
        if rank == 0:
            res = {
                "world_size": world,
                "num_segments": int(row["num_segments"]),
                "loss_ref": float(loss_ref),
                "loss_cp": float(loss_cp),
                "loss_abs_diff": abs(float(loss_ref) - float(loss_cp)),
                "max_grad_abs_diff": max(float((grads_ref[n] - grads_cp[n]).abs().max()) for n in grads_ref),
                "max_grad_abs": max(float(g.abs().max()) for g in grads_ref.values()),
                "max_logit_abs_diff": float((logits_full - logits_ref).abs().max()),
                "loss_boundary_blind": float(loss_blind),
                "max_logit_abs_diff_boundary_blind": float((blind_full - logits_ref)[real].abs().max()),
            }
            with open(out_path, "w") as f:
                json.dump(res, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cp_equivalence(world_size: int, seed: int = 0) -> dict:
    """Spawn ``world_size`` gloo processes and compare CP against single-process training math.

    Returns:
        dict with ``loss_ref``, ``loss_cp``, ``loss_abs_diff``, ``max_grad_abs_diff``,
        ``max_logit_abs_diff`` (global logits reassembled with ``gather_from_cp``) and
        ``loss_boundary_blind`` / ``max_logit_abs_diff_boundary_blind`` (the same CP run with a mask
        that ignores segments, case B02; real tokens only).
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        mp.spawn(_worker, args=(world_size, _free_port(), out, seed), nprocs=world_size, join=True)
        with open(out) as f:
            return json.load(f)


if __name__ == "__main__":  # python -m seqpack.parallel.reference
    for w in (2, 4):
        r = run_cp_equivalence(w)
        print(json.dumps(r))
        assert math.isfinite(r["loss_cp"])
