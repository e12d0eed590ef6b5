"""Reference attention for packed rows, single-process and context-parallel (CPU, torch.distributed).

This is a *correctness reference*, not a fast kernel: it materialises the ``[tq, tk]`` mask. It
shows what a boundary-aware CP attention must compute for a packed THD row: each CP rank holds
its zigzag slice (see :mod:`seqpack.parallel.cp`), all-gathers K and V, and applies the
block-diagonal causal mask in **global** coordinates: query slot ``i`` attends key slot ``j`` iff
both lie in the same segment (``seq_idx``) and ``j <= i``. Masks are derived from the boundary
metadata (``seq_idx`` / global slot numbers), never from token values or a "mask is None" guess
(cases B01, B02).
"""

from __future__ import annotations

import math

from seqpack._torch import torch_hint

with torch_hint("seqpack.parallel.attention (the CP attention reference)"):
    import torch
    import torch.distributed as dist

from seqpack.packed.masks import block_causal_mask  # the one mask rule (re-exported)

__all__ = [
    "block_causal_mask",
    "dense_attention",
    "all_gather_tokens",
    "cp_attention_reference",
]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scale: float | None = None) -> torch.Tensor:
    """Softmax attention with an explicit boolean mask (True = attend), fp32-friendly reference.

    Args:
        q: [..., tq, D]; k, v: [..., tk, D]; mask: bool [tq, tk] (every query row must attend to at
            least one key; true for block-causal masks, which always include the diagonal).
        scale: softmax scale, default ``1/sqrt(D)``.

    Returns:
        [..., tq, D].
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class _AllGatherTokens(torch.autograd.Function):
    """Differentiable all-gather along a token dim (backward: all-reduce the grad, keep own chunk).

    Written with ``all_gather`` + ``all_reduce`` only so it runs on gloo (CPU) as well as NCCL.
    """

    @staticmethod
    def forward(ctx, x, dim, group):
        world = dist.get_world_size(group)
        ctx.dim, ctx.group, ctx.size = dim, group, x.shape[dim]
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        own = grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size)
        return own.contiguous(), None, None


def all_gather_tokens(x: torch.Tensor, dim: int = 0, group=None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order (differentiable).

    All ranks must pass tensors of equal shape (true for CP slices: each rank holds ``T / CP`` slots).
    """
    return _AllGatherTokens.apply(x, dim, group)


def _all_gather_nograd(x: torch.Tensor, group=None) -> torch.Tensor:
    world = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def cp_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cp_indices,
                           seq_idx: torch.Tensor, group=None, respect_segments: bool = True,
                           scale: float | None = None) -> torch.Tensor:
    """Context-parallel attention for a packed row: all-gather K/V, block-diagonal causal mask.

    Every rank of ``group`` (the CP group, size CP) calls this with its own zigzag slice.

    Args:
        q, k, v: [H, t_local, D] this rank's queries / keys / values (``t_local = T / CP``).
        cp_indices: int [t_local] global slot numbers of this rank's tokens
            (``slice_for_cp(...)['cp_indices']`` / ``cp_partition_indices``).
        seq_idx: int [t_local] segment index of this rank's tokens (the sliced ``seq_idx``).
        group: the CP process group (default: the world).
        respect_segments: False reproduces the boundary-blind ring attention of case B02.
        scale: softmax scale, default ``1/sqrt(D)``.

    Returns:
        [H, t_local, D] attention output for this rank's queries.
    """
    slots = torch.as_tensor(cp_indices, dtype=torch.long, device=q.device)
    seg = seq_idx.to(device=q.device, dtype=torch.long)
    k_all = all_gather_tokens(k, dim=-2, group=group)
    v_all = all_gather_tokens(v, dim=-2, group=group)
    k_slots = _all_gather_nograd(slots, group)
    k_seg = _all_gather_nograd(seg, group)
    mask = block_causal_mask(slots, k_slots, seg, k_seg, respect_segments=respect_segments)
    return dense_attention(q, k_all, v_all, mask, scale)
