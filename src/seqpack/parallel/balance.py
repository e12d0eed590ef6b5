"""Data-parallel work balance for packed rows: even tokens AND even attention cost per DP rank per step.

With packing every micro-batch row holds about the same number of tokens, but attention cost is
``sum(len_i**2)`` over the row's segments: a row holding one 8k document costs ~8x a row holding
eight 1k documents. In synchronous data parallelism the step time is the *slowest* rank's time, so
ranks must receive packs of similar cost in the same step.

Method (:func:`balance_packs`), numpy only:

1. **Step formation by sorted bands.** Packs are sorted by attention cost (ties by tokens) and cut
   into consecutive groups of ``dp_size * micro_batches`` packs; each group is one optimizer step.
   Packs of similar cost (and, from a near-perfect packer, near-equal token counts) share a step.
   This is the "sortish"/``group_by_length`` idea (HF ``LengthGroupedSampler``) applied to packs.
2. **Within a step: vector LPT with a cardinality cap.** Packs in decreasing cost order go to the
   rank (with fewer than ``micro_batches`` packs) that minimises the larger of its normalised token
   and cost loads: Graham's longest-processing-time rule (1969) in its multi-dimensional
   ("vector scheduling") form; the cap keeps exactly ``micro_batches`` packs per rank.
3. **Order.** Steps are shuffled with a seeded RNG so training sees no length curriculum; inside a
   rank, micro-batches keep descending cost.
4. **Remainder.** When the pack count is not a multiple of ``dp_size * micro_batches`` the last step
   has ``ceil(rest / dp_size)`` micro-batches per rank and at most ``dp_size - 1`` empty filler
   slots (``-1``), i.e. at most one filler per rank; every pack is scheduled exactly once.

A micro-batch is one packed row, so no micro-batch exceeds the token cap as long as no pack does;
a pack over ``token_cap`` is refused with its index.

Trade-off (stated, not hidden): steps are homogeneous in document length (all-long or all-short
packs), as with length-grouped sampling; shuffling the steps removes the ordering bias but not the
within-step homogeneity. :func:`round_robin_plan` is the unbalanced baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["BalancePlan", "attention_cost", "pack_costs", "balance_packs", "round_robin_plan"]

FILLER = -1


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
    from seqpack.padding import round_up

    lengths = np.asarray(lengths, dtype=np.int64)
    padded = round_up(lengths, pad_to_multiple_of).astype(np.float64)
    tokens = np.array([int(lengths[b].sum()) for b in bins], dtype=np.int64)
    cost = np.array([float(np.sum(padded[b] ** 2)) for b in bins], dtype=np.float64)
    return tokens, cost


@dataclass
class BalancePlan:
    """Schedule of packs over steps, DP ranks and micro-batches.

    Attributes:
        steps: list of int64 arrays ``[dp_size, m_s]`` (pack indices; ``-1`` = empty filler slot);
            ``m_s == micro_batches`` except possibly for the last step.
        dp_size: DP world size.
        micro_batches: micro-batches (packs) per rank per full step.
        num_fillers: filler slots in all (<= dp_size - 1).
        method: short description of the method used.
    """

    steps: list[np.ndarray]
    dp_size: int
    micro_batches: int
    num_fillers: int
    method: str

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def rank_schedule(self, rank: int) -> list[list[int]]:
        """Pack indices for ``rank``: one list per step (fillers omitted)."""
        return [[int(i) for i in s[rank] if i != FILLER] for s in self.steps]

    def loads(self, values) -> np.ndarray:
        """Per-step, per-rank sums of ``values`` (indexed by pack): float64 ``[num_steps, dp_size]``."""
        v = np.asarray(values, dtype=np.float64)
        out = np.zeros((len(self.steps), self.dp_size))
        for k, s in enumerate(self.steps):
            vals = np.where(s == FILLER, 0.0, v[np.where(s == FILLER, 0, s)])
            out[k] = vals.sum(axis=1)
        return out

    def stats(self, tokens, cost, token_cap: int | None = None) -> dict[str, float]:
        """Imbalance figures over full steps (the step holding fillers, if any, is reported apart).

        Returns:
            ``token_spread_max`` / ``token_spread_mean``: ``(max-min)/mean`` of rank tokens per step
            (worst / mean over steps); ``cost_max_over_mean_worst`` / ``cost_max_over_mean_mean``;
            ``cost_time_efficiency``: ``sum(mean)/sum(max)`` of cost (1.0 = no rank waits);
            ``over_cap``: micro-batches over ``token_cap``; ``steps``, ``fillers``.
        """
        tok = self.loads(tokens)
        cst = self.loads(cost)
        full = np.array([not np.any(s == FILLER) and s.shape[1] == self.micro_batches for s in self.steps])
        if not full.any():
            full[:] = True
        tk, cs = tok[full], cst[full]
        tmean = tk.mean(axis=1)
        spread = (tk.max(axis=1) - tk.min(axis=1)) / np.maximum(tmean, 1e-12)
        cmean = cs.mean(axis=1)
        ratio = cs.max(axis=1) / np.maximum(cmean, 1e-12)
        over = 0
        if token_cap is not None:
            t = np.asarray(tokens)
            over = int(sum(int(np.sum(t[s[s != FILLER]] > token_cap)) for s in self.steps))
        return {
            "steps": float(len(self.steps)),
            "fillers": float(self.num_fillers),
            "token_spread_max": float(spread.max()),
            "token_spread_mean": float(spread.mean()),
            "cost_max_over_mean_worst": float(ratio.max()),
            "cost_max_over_mean_mean": float(ratio.mean()),
            "cost_time_efficiency": float(cmean.sum() / cs.max(axis=1).sum()),
            "over_cap": float(over),
        }


def _check_inputs(tokens, cost, dp_size, micro_batches, token_cap):
    tokens = np.asarray(tokens, dtype=np.int64)
    cost = np.asarray(cost, dtype=np.float64)
    if tokens.ndim != 1 or cost.shape != tokens.shape:
        raise ValueError(f"tokens and cost must be 1-D of equal length, got {tokens.shape} and {cost.shape}")
    if int(dp_size) != dp_size or dp_size < 1:
        raise ValueError(f"dp_size must be an integer >= 1, got {dp_size!r}")
    if int(micro_batches) != micro_batches or micro_batches < 1:
        raise ValueError(f"micro_batches must be an integer >= 1, got {micro_batches!r}")
    if np.any(tokens < 0) or np.any(cost < 0):
        raise ValueError("tokens and cost must be >= 0")
    if token_cap is not None:
        over = np.flatnonzero(tokens > token_cap)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"pack {i} holds {int(tokens[i])} tokens, over token_cap={token_cap} ({over.size} packs over); "
                f"a micro-batch is one pack, so re-pack with capacity <= token_cap"
            )
    return tokens, cost


def _step_shape(p: int, dp: int, mb: int) -> list[int]:
    """Micro-batches per rank of each step."""
    g = dp * mb
    full, rest = divmod(p, g)
    shape = [mb] * full
    if rest:
        shape.append(-(-rest // dp))
    return shape


def balance_packs(
    tokens,
    cost,
    dp_size: int,
    micro_batches: int = 1,
    *,
    token_cap: int | None = None,
    seed: int = 0,
    shuffle_steps: bool = True,
) -> BalancePlan:
    """Assign packs to steps, DP ranks and micro-batches with even tokens and attention cost.

    Args:
        tokens: int [P] real tokens of each pack.
        cost: float [P] attention-cost estimate of each pack (:func:`attention_cost` /
            :func:`pack_costs`: ``sum(len**2)`` over its segments).
        dp_size: DP world size.
        micro_batches: packs (micro-batches) per rank per step (gradient accumulation steps).
        token_cap: refuse any pack above this many tokens (usually the pack capacity).
        seed: RNG seed for the step order.
        shuffle_steps: shuffle steps (True) or keep them in descending-cost order.

    Returns:
        :class:`BalancePlan`; every pack appears exactly once; at most one filler per rank.

    Raises:
        ValueError: bad sizes, negative values, or a pack over ``token_cap`` (names the pack).
    """
    tokens, cost = _check_inputs(tokens, cost, dp_size, micro_batches, token_cap)
    p = tokens.shape[0]
    dp, mb = int(dp_size), int(micro_batches)
    order = np.lexsort((-tokens, -cost))  # cost desc, then tokens desc
    steps: list[np.ndarray] = []
    pos = 0
    fillers = 0
    for m in _step_shape(p, dp, mb):
        take = min(dp * m, p - pos)
        members = order[pos:pos + take]
        pos += take
        grid = np.full((dp, m), FILLER, dtype=np.int64)
        counts = np.zeros(dp, dtype=np.int64)
        t_load = np.zeros(dp)
        c_load = np.zeros(dp)
        t_ref = max(float(tokens[members].sum()) / dp, 1.0)
        c_ref = max(float(cost[members].sum()) / dp, 1e-12)
        for i in members:  # already in descending cost order
            score = np.maximum((t_load + tokens[i]) / t_ref, (c_load + cost[i]) / c_ref)
            score[counts >= m] = np.inf
            r = int(np.argmin(score))
            grid[r, counts[r]] = i
            counts[r] += 1
            t_load[r] += tokens[i]
            c_load[r] += cost[i]
        fillers += int(np.sum(grid == FILLER))
        steps.append(grid)
    if shuffle_steps and len(steps) > 1:
        rng = np.random.default_rng(seed)
        # keep a partial (filler) step last so every other step has the full shape
        last_partial = steps[-1].shape[1] != mb or bool(np.any(steps[-1] == FILLER))
        body = steps[:-1] if last_partial else steps
        perm = rng.permutation(len(body))
        steps = [body[k] for k in perm] + ([steps[-1]] if last_partial else [])
    return BalancePlan(steps=steps, dp_size=dp, micro_batches=mb, num_fillers=fillers,
                       method="cost-sorted steps + vector LPT with cardinality cap (Graham 1969)")


def round_robin_plan(num_packs: int, dp_size: int, micro_batches: int = 1) -> BalancePlan:
    """Baseline: packs in their given order; step ``s`` takes the next ``dp*mb`` packs, dealt round-robin."""
    dp, mb = int(dp_size), int(micro_batches)
    steps = []
    pos = 0
    fillers = 0
    for m in _step_shape(int(num_packs), dp, mb):
        grid = np.full((dp, m), FILLER, dtype=np.int64)
        for j in range(dp * m):
            if pos < num_packs:
                grid[j % dp, j // dp] = pos
                pos += 1
        fillers += int(np.sum(grid == FILLER))
        steps.append(grid)
    return BalancePlan(steps=steps, dp_size=dp, micro_batches=mb, num_fillers=fillers, method="round-robin")
