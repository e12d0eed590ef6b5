"""The cost model of DP balance: attention cost per pack, the step score, and a bound no schedule beats.

A rank's attention cost is ``sum(len**2)`` over the segments of its micro-batches (padded lengths model
the kernel work on ``cu_seqlens_padded``). A step is scored by two parts, each 1.0 on target: token
spread ``(max - min) / mean`` of its ranks over ``token_tolerance``, and ``(cost max/mean - 1)`` over
``cost_tolerance``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seqpack.padding import round_up


def attention_cost(segment_lengths: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
    """Attention-cost estimate per pack: ``sum(len**2)`` over its segments (float64 [P], tokens^2).

    Args:
        segment_lengths: per pack, the lengths of its segments (use padded lengths to model the kernel
            work on ``cu_seqlens_padded``). A 1-D array is taken as one segment per pack.
    """
    if isinstance(segment_lengths, np.ndarray) and segment_lengths.ndim == 1:
        return segment_lengths.astype(np.float64) ** 2
    return np.array([float(np.sum(np.asarray(s, dtype=np.float64) ** 2)) for s in segment_lengths], dtype=np.float64)


def pack_costs(bins: Sequence[np.ndarray], lengths, pad_to_multiple_of: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and attention cost of every pack of a :class:`~seqpack.algorithms.PackingPlan`.

    Args:
        bins: ``plan.bins`` (indices into ``lengths``).
        lengths: int [n] sample lengths (tokens).
        pad_to_multiple_of: segment pad multiple; the cost uses padded lengths (kernel work), the
            token count real lengths.

    Returns:
        ``(tokens int64 [P], cost float64 [P])``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    padded = round_up(lengths, pad_to_multiple_of).astype(np.float64)
    return pack_sums(bins, lengths).astype(np.int64), pack_sums(bins, padded ** 2)


def pack_sums(bins: Sequence[np.ndarray], values: np.ndarray) -> np.ndarray:
    """``values`` summed over each pack of ``bins`` (float64 [P]; an empty pack sums to 0)."""
    if not len(bins):
        return np.zeros(0, dtype=np.float64)
    sizes = np.fromiter((len(b) for b in bins), dtype=np.int64, count=len(bins))
    idx = np.concatenate([np.asarray(b, dtype=np.int64) for b in bins])
    owner = np.repeat(np.arange(len(bins)), sizes)
    return np.bincount(owner, weights=np.asarray(values, dtype=np.float64)[idx], minlength=len(bins))


def step_figures(tl: np.ndarray, cl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, from per-rank token loads ``tl`` and cost loads ``cl`` (float64 ``[..., dp]``): the token
    spread ``(max - min) / mean`` and the cost ``max / mean`` (float64 ``[...]``; means floored at 1e-12)."""
    tm = np.maximum(tl.mean(axis=-1), 1e-12)
    cm = np.maximum(cl.mean(axis=-1), 1e-12)
    return (tl.max(axis=-1) - tl.min(axis=-1)) / tm, cl.max(axis=-1) / cm


def score_parts(tl: np.ndarray, cl: np.ndarray, tt: float, ct: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (token spread / tt, (cost max/mean - 1) / ct) from per-rank loads ``[..., dp]``: 1.0 = on target."""
    spread, ratio = step_figures(tl, cl)
    return spread / tt, (ratio - 1.0) / ct


def cost_ratio_lower_bound(lengths, capacity: int, dp_size: int, micro_batches: int = 1) -> float:
    """A lower bound on the worst step's attention-cost max/mean that ANY schedule can reach.

    The rank holding the longest sample ``L1`` costs at least ``L1**2``; the other ``dp_size - 1``
    ranks of that step hold disjoint samples of at most ``micro_batches * capacity`` tokens each, so
    their total cost is at most the fractional-knapsack bound ``sum(x**2)`` over the longest remaining
    samples filling ``(dp_size - 1) * micro_batches * capacity`` tokens. Hence
    ``max/mean >= dp * L1**2 / (L1**2 + that bound)`` for *the step that holds the longest sample*.
    That step may be the remainder step with filler slots, which
    ``SampleBalancePlan.stats()["cost_max_over_mean_worst"]`` (worst *full* step) leaves out, so a
    value above 1.05 proves the 1.05 goal unreachable only when the longest sample must sit in a full
    step (no remainder step); e.g. one 3.6k-token conversation among mostly short ones. Counterexample
    to the stronger reading: ``[19,1,3,8,1,7,2,6,6,6,3,6,8,3,7,6,3]``, capacity 32, dp 2, 1 micro-batch:
    bound 1.2053, while ``balance_samples`` puts the 19 in the remainder step and reaches 1.016 on
    the worst full step (2.0 on the remainder step, which the bound does cover).

    Args:
        lengths: int [n] sample lengths (tokens; use padded lengths to model kernel work).
        capacity: tokens per micro-batch.
        dp_size, micro_batches: schedule shape.

    Returns:
        float >= 0 (values <= 1 mean the bound says nothing).
    """
    s = np.sort(np.asarray(lengths, dtype=np.float64))[::-1]
    if s.size == 0:
        return 1.0
    l1 = s[0]
    rest = s[1:]
    budget = float((dp_size - 1) * micro_batches * capacity)
    cum = np.cumsum(rest)
    k = int(np.searchsorted(cum, budget, side="right"))
    other = float(np.sum(rest[:k] ** 2))
    if k < rest.size:
        left = budget - (float(cum[k - 1]) if k else 0.0)
        other += max(left, 0.0) * rest[k]
    return float(dp_size * l1 ** 2 / (l1 ** 2 + other))
