"""Losses over packed rows: per-token cross entropy, global token normalisation, sequence mean,
and a chunked cross entropy that never materialises ``[T, V]`` logits.

Normalisation (case B28). A micro-batch returns ``(loss_sum, num_loss_tokens)``; the trainer
divides the **sum over all micro-batches and data-parallel ranks** by the **global** token count
(torchtune PR #1875, verl PR #5641). Dividing each micro-batch by its own count and averaging
(``0.5*10/10 + 0.5*4/2 = 1.5``) depends on how packing split the data; the global form gives
``14/12 = 1.1667`` under any packing. Sequence-mean mode averages per *segment* (grouped by
``seq_idx`` / boundaries, never per row), then over the global segment count.

Labels everywhere are our **shifted** labels (``labels[t]`` = target of the logit at ``t``,
-100 = none); no shift happens here.
"""

from __future__ import annotations

from typing import Any, Sequence

from seqpack._torch import torch_hint

with torch_hint("seqpack.loss (the packed cross entropy)"):
    import torch
    import torch.nn.functional as F

from seqpack.sample import IGNORE_INDEX

__all__ = [
    "packed_cross_entropy",
    "per_token_cross_entropy",
    "global_token_count",
    "token_mean",
    "sequence_losses",
    "sequence_mean",
    "chunked_cross_entropy",
    "ChunkedLinearCrossEntropy",
]


def per_token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross entropy of every slot, fp32, 0 where ``labels == -100``.

    Args:
        logits: float ``[..., T, V]`` (any batch dims; upcast to fp32 inside).
        labels: int ``[..., T]`` shifted labels.

    Returns:
        float32 ``labels.shape`` (nats).
    """
    v = logits.shape[-1]
    lab = labels.reshape(-1).to(logits.device).long()
    out = F.cross_entropy(logits.reshape(-1, v).float(), lab, ignore_index=IGNORE_INDEX, reduction="none")
    return out.reshape(labels.shape)


def packed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross entropy and loss-token count for a packed micro-batch.

    Args:
        logits: float ``[..., T, V]``.
        labels: int ``[..., T]`` shifted labels (-100 = ignored; padding and every segment's last
            real slot are -100, so nothing crosses a boundary, B03).

    Returns:
        ``(loss_sum, num_loss_tokens)``: fp32 scalar (nats) and int64 scalar. Divide the sums of
        all micro-batches by :func:`global_token_count` (B28).
    """
    lab = labels.to(logits.device).long()
    v = logits.shape[-1]
    loss_sum = F.cross_entropy(logits.reshape(-1, v).float(), lab.reshape(-1), ignore_index=IGNORE_INDEX,
                               reduction="sum")
    return loss_sum, (lab != IGNORE_INDEX).sum()


def global_token_count(local_count, group: Any = None) -> torch.Tensor:
    """Sum loss-token counts over micro-batches and (if ``torch.distributed`` is initialised) DP ranks.

    Args:
        local_count: int, tensor, or a sequence of them (this rank's micro-batches of one step; an
            empty sequence counts 0 and still takes part in the all-reduce).
        group: process group for the all-reduce (default world); ignored when not distributed.

    Returns:
        int64 scalar tensor, identical on every rank.
    """
    if isinstance(local_count, (list, tuple)):
        # an empty list (a DP rank with no micro-batches this step) counts 0 but still joins the all-reduce
        total = (torch.stack([torch.as_tensor(c, dtype=torch.int64).reshape(()).cpu() for c in local_count]).sum()
                 if len(local_count) else torch.zeros((), dtype=torch.int64))
    else:
        total = torch.as_tensor(local_count, dtype=torch.int64).reshape(()).clone()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def token_mean(loss_sums: Sequence[torch.Tensor] | torch.Tensor, global_count) -> torch.Tensor:
    """Token-mean loss: ``sum(loss_sums) / global_count`` (0 if the count is 0).

    Under data parallelism each rank calls this with its own sums and the *global* count
    (:func:`global_token_count`); the sum over ranks is then the global token mean. DDP averages
    gradients (divides by ``W``), so multiply by ``W`` before ``backward`` (as torchtune does).

    Args:
        loss_sums: fp32 scalar or a list of them (this rank's micro-batches), nats.
        global_count: int or int64 scalar, loss tokens over all micro-batches and ranks.

    Returns:
        fp32 scalar; ``0.0`` (no graph) for an empty list (a DP rank with no micro-batches).
    """
    if isinstance(loss_sums, (list, tuple)) and len(loss_sums) == 0:
        return torch.zeros((), dtype=torch.float32)
    s = torch.stack(list(loss_sums)).sum() if isinstance(loss_sums, (list, tuple)) else loss_sums
    c = torch.as_tensor(global_count, device=s.device)
    return s / c.clamp(min=1).to(s.dtype)


def sequence_losses(per_token_loss: torch.Tensor, labels: torch.Tensor, seq_idx: torch.Tensor,
                    num_segments: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment mean losses of one packed row, grouped by ``seq_idx`` (not by row, B28).

    Args:
        per_token_loss: float ``[T]`` or ``[1, T]`` (from :func:`per_token_cross_entropy`).
        labels: int ``[T]`` / ``[1, T]`` shifted labels.
        seq_idx: int ``[T]`` / ``[1, T]`` segment index of each slot.
        num_segments: N (default ``seq_idx.max() + 1``).

    Returns:
        ``(segment_means [N'], segment_counts [N'])`` over the N' segments that have >= 1 loss
        token (segments without targets, e.g. an in-batch tail segment, are skipped).
    """
    loss = per_token_loss.reshape(-1)
    lab = labels.reshape(-1).to(loss.device)
    seg = seq_idx.reshape(-1).to(loss.device).long()
    n = int(num_segments) if num_segments is not None else int(seg.max()) + 1
    w = (lab != IGNORE_INDEX).to(loss.dtype)
    sums = torch.zeros(n, dtype=loss.dtype, device=loss.device).index_add(0, seg, loss * w)
    counts = torch.zeros(n, dtype=loss.dtype, device=loss.device).index_add(0, seg, w)
    keep = counts > 0
    return sums[keep] / counts[keep], counts[keep].long()


def sequence_mean(segment_means: Sequence[torch.Tensor] | torch.Tensor, group: Any = None) -> torch.Tensor:
    """Mean over all segments of a step: ``sum(segment means) / global segment count``.

    Args:
        segment_means: the first output of :func:`sequence_losses` for each micro-batch (list) or
            one tensor.
        group: DP process group for the all-reduce of the segment count (when distributed).

    Returns:
        fp32 scalar: this rank's segment-mean sum over the *global* segment count, so the sum over
        DP ranks (what gradient all-reduce adds up) is the global sequence mean; single process:
        the mean itself. B28: segments with means 1.0 and 2.0 give 1.5 however they were packed.
        An empty list (or no segments anywhere) gives 0.0; the segment count is still all-reduced.
    """
    if isinstance(segment_means, (list, tuple)):
        t = (torch.cat([m.reshape(-1) for m in segment_means]) if len(segment_means)
             else torch.zeros(0, dtype=torch.float32))  # a DP rank with no micro-batches: sum 0, count 0
    else:
        t = segment_means.reshape(-1)
    n = global_token_count(t.numel(), group=group)
    return t.sum() / n.clamp(min=1).to(t.dtype)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``sum CE(hidden @ weight.T, labels)`` computed ``chunk_size`` tokens at a time.

    Forward keeps only per-chunk ``[C, V]`` fp32 logits; backward recomputes each chunk's logits
    and accumulates ``d hidden`` and ``d weight`` (a custom autograd Function, like Liger-Kernel's
    fused linear cross entropy but in plain torch). Peak extra memory ~ ``C * V * 4`` bytes * 2
    instead of ``T * V * 4`` * 3 for the naive path.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_size: int):
        T = hidden.shape[0]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for s in range(0, T, chunk_size):
            h = hidden[s : s + chunk_size]
            y = labels[s : s + chunk_size]
            if not bool((y != IGNORE_INDEX).any()):
                continue
            logits = (h @ weight.t()).float()
            total += F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum")
            del logits
        ctx.save_for_backward(hidden, weight, labels)
        ctx.chunk_size = chunk_size
        return total

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, labels = ctx.saved_tensors
        C = ctx.chunk_size
        gh = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        g = grad_out.float()
        for s in range(0, hidden.shape[0], C):
            y = labels[s : s + C]
            valid = y != IGNORE_INDEX
            if not bool(valid.any()):
                continue
            h = hidden[s : s + C]
            p = torch.softmax((h @ weight.t()).float(), dim=-1)  # [C, V] fp32
            yy = y.clamp(min=0)
            p[torch.arange(p.shape[0], device=p.device), yy] -= 1.0
            p *= (valid.to(p.dtype) * g).unsqueeze(1)
            if gh is not None:
                gh[s : s + C] = (p @ weight.float()).to(hidden.dtype)
            if gw is not None:
                gw += p.t() @ h.float()
            del p
        return gh, (gw.to(weight.dtype) if gw is not None else None), None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                          chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed cross entropy from final hidden states and the LM-head weight, chunked over tokens.

    A 151,936-token vocabulary at ``T = 8192`` would need a 5 GB fp32 ``[T, V]`` logits tensor
    (plus as much again for its gradient); here at most ``chunk_size x V`` is live at once, and
    backward recomputes each chunk (``ChunkedLinearCrossEntropy``). No bias and no logit soft-capping.

    Args:
        hidden: float ``[..., T, H]`` final hidden states (after the final norm), e.g.
            ``model.model(...).last_hidden_state``.
        weight: float ``[V, H]``, e.g. ``model.lm_head.weight``.
        labels: int ``[..., T]`` shifted labels.
        chunk_size: tokens per chunk (>= 1).

    Returns:
        ``(loss_sum, num_loss_tokens)`` like :func:`packed_cross_entropy`.

    Raises:
        ValueError: ``chunk_size < 1`` or mismatched shapes.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1).to(h.device).long()
    if y.shape[0] != h.shape[0]:
        raise ValueError(f"{h.shape[0]} hidden states for {y.shape[0]} labels")
    if weight.shape[-1] != h.shape[-1]:
        raise ValueError(f"weight {tuple(weight.shape)} does not match hidden size {h.shape[-1]}")
    return ChunkedLinearCrossEntropy.apply(h, weight, y, int(chunk_size)), (y != IGNORE_INDEX).sum()
