"""Data-parallel work balance for packed rows: even tokens AND even attention cost per DP rank per step.

With packing every micro-batch row holds about the same number of tokens, but attention cost is
``sum(len_i**2)`` over the row's segments: a row holding one 8k document costs ~8x a row holding
eight 1k documents. In synchronous data parallelism the step time is the *slowest* rank's time, so
ranks must receive packs of similar cost in the same step.

Method (:func:`balance_packs`), numpy only:

1. **Step formation by sorted bands.** Packs are sorted by attention cost (ties by tokens) and cut
   into consecutive groups of ``dp_size * micro_batches`` packs; each group is one optimizer step.
   Packs of similar cost share a step. This is the "sortish"/``group_by_length`` idea (HF
   ``LengthGroupedSampler``) applied to packs. A second formation first groups packs by token
   deficit (capacity minus tokens, in classes of ``token_tolerance``) so that under-filled packs
   share steps; ``formation="auto"`` builds both and keeps the one whose worst step is better.
2. **Within a step: vector LPT with a cardinality cap.** Packs in decreasing cost order go to the
   rank (with fewer than ``micro_batches`` packs) that minimises the larger of its normalised token
   and cost loads: Graham's longest-processing-time rule (1969) in its multi-dimensional
   ("vector scheduling") form; the cap keeps exactly ``micro_batches`` packs per rank.
3. **Refinement.** Sweeps over neighbouring steps (in cost order) try every single-pack swap
   between the two and keep one when it lowers the worse step's score (a 2-opt style local search
   that fixes the tail, e.g. an under-filled pack among full ones).
   Then repair phases (cost alone, tokens alone, both): the currently worst step swaps one pack
   with the best partner slot among nearby steps and a random sample of the rest (min-max local
   search, never raising the plan's worst token or cost figure), until every step is on target, no
   swap helps, or the phase's repair budget is spent.
4. **Order.** Steps are shuffled with a seeded RNG so training sees no length curriculum; inside a
   rank, micro-batches keep descending cost.
5. **Remainder.** When the pack count is not a multiple of ``dp_size * micro_batches`` the last step
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
        """Number of optimizer steps in the schedule."""
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
    refine_passes: int = 2,
    max_repairs: int = 200,
    token_tolerance: float = 1e-3,
    cost_tolerance: float = 0.05,
    formation: str = "auto",
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
        refine_passes: sweeps of pairwise swaps between neighbouring steps (in cost order) that
            lower the worse step's score ``max(token_spread / token_tolerance,
            (cost_max/mean - 1) / cost_tolerance)``; 0 disables.
        max_repairs: budget of repairs per phase (3 phases): the worst step (by that score) swaps one pack with
            the best partner slot among the 64 nearest steps (cost order) and 128 random ones, as long
            as the worst score drops; 0 disables.
        token_tolerance, cost_tolerance: the scales of that score (targets: 0.1% token spread,
            attention-cost max/mean 1.05).
        formation: ``"cost"`` (sort by cost), ``"deficit"`` (group packs by token deficit in classes
            of ``token_tolerance * mean tokens``, then by cost: keeps under-filled packs together) or
            ``"auto"`` (build both, keep the plan whose worst step scores lower; twice the work).

    Returns:
        :class:`BalancePlan`; every pack appears exactly once; at most one filler per rank.

    Raises:
        ValueError: bad sizes, negative values, or a pack over ``token_cap`` (names the pack).
    """
    tokens, cost = _check_inputs(tokens, cost, dp_size, micro_batches, token_cap)
    if formation not in ("auto", "cost", "deficit"):
        raise ValueError(f"formation must be 'auto', 'cost' or 'deficit', got {formation!r}")
    p = tokens.shape[0]
    dp, mb = int(dp_size), int(micro_batches)
    kw = dict(refine_passes=refine_passes, max_repairs=max_repairs, tt=token_tolerance, ct=cost_tolerance,
              seed=seed)
    candidates = []
    if formation in ("auto", "cost"):
        candidates.append(("cost", _form_steps(np.lexsort((-tokens, -cost)), tokens, cost, dp, mb, **kw)))
    if formation in ("auto", "deficit") and p:
        width = max(1, int(token_tolerance * max(float(tokens.mean()), 1.0)))
        deficit_class = (int(tokens.max()) - tokens) // width
        candidates.append(("deficit", _form_steps(np.lexsort((-tokens, -cost, deficit_class)), tokens, cost, dp, mb,
                                                  **kw)))
    if not candidates:  # no packs
        candidates.append(("cost", _form_steps(np.zeros(0, np.int64), tokens, cost, dp, mb, **kw)))

    def worst(steps):
        full = [s for s in steps if s.shape[1] == mb and not np.any(s == FILLER)] or steps
        tl = np.stack([tokens[s].sum(1) for s in full]).astype(np.float64)
        cl = np.stack([cost[s].sum(1) for s in full])
        tp, cp = _parts(tl, cl, token_tolerance, cost_tolerance)
        return max(float(tp.max()), float(cp.max()))

    name, steps = min(candidates, key=lambda c: worst(c[1])) if p else candidates[0]
    fillers = int(sum(int(np.sum(s == FILLER)) for s in steps))
    for grid in steps:  # inside a rank: micro-batches in descending cost, fillers last
        key = np.where(grid == FILLER, -np.inf, cost[np.where(grid == FILLER, 0, grid)])
        grid[...] = np.take_along_axis(grid, np.argsort(-key, axis=1, kind="stable"), axis=1)
    if shuffle_steps and len(steps) > 1:
        rng = np.random.default_rng(seed)
        # keep a partial (filler) step last so every other step has the full shape
        last_partial = steps[-1].shape[1] != mb or bool(np.any(steps[-1] == FILLER))
        body = steps[:-1] if last_partial else steps
        perm = rng.permutation(len(body))
        steps = [body[k] for k in perm] + ([steps[-1]] if last_partial else [])
    return BalancePlan(steps=steps, dp_size=dp, micro_batches=mb, num_fillers=fillers,
                       method=f"{name}-sorted steps + vector LPT with cardinality cap (Graham 1969) + min-max repair")


def _form_steps(order, tokens, cost, dp, mb, *, refine_passes, max_repairs, tt, ct, seed) -> list[np.ndarray]:
    """Cut ``order`` into steps, assign each step's packs to ranks (vector LPT), then refine/repair."""
    p = tokens.shape[0]
    steps: list[np.ndarray] = []
    pos = 0
    for m in _step_shape(p, dp, mb):
        take = min(dp * m, p - pos)
        members = order[pos:pos + take]
        members = members[np.argsort(-cost[members], kind="stable")]  # LPT: decreasing cost
        pos += take
        grid = np.full((dp, m), FILLER, dtype=np.int64)
        counts = np.zeros(dp, dtype=np.int64)
        t_load = np.zeros(dp)
        c_load = np.zeros(dp)
        t_ref = max(float(tokens[members].sum()) / dp, 1.0)
        c_ref = max(float(cost[members].sum()) / dp, 1e-12)
        for i in members:
            score = np.maximum((t_load + tokens[i]) / t_ref, (c_load + cost[i]) / c_ref)
            score[counts >= m] = np.inf
            r = int(np.argmin(score))
            grid[r, counts[r]] = i
            counts[r] += 1
            t_load[r] += tokens[i]
            c_load[r] += cost[i]
        steps.append(grid)
    if refine_passes > 0:
        _refine(steps, tokens, cost, mb, refine_passes, tt, ct)
    if max_repairs > 0:
        # lexicographic phases: cost alone, tokens alone, then both (each Pareto-monotone)
        for wt, wc in ((0.0, 1.0), (1.0, 0.0), (1.0, 1.0)):
            _repair_worst(steps, tokens, cost, mb, max_repairs, tt, ct, seed=seed, wt=wt, wc=wc)
    return steps


def _parts(tl: np.ndarray, cl: np.ndarray, tt: float, ct: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (token spread / tt, (cost max/mean - 1) / ct) from per-rank loads ``[..., dp]``."""
    tm = np.maximum(tl.mean(axis=-1), 1e-12)
    cm = np.maximum(cl.mean(axis=-1), 1e-12)
    return (tl.max(axis=-1) - tl.min(axis=-1)) / tm / tt, (cl.max(axis=-1) / cm - 1.0) / ct


def _refine(steps, tokens, cost, mb, passes, tt, ct, window=2) -> None:
    """Pairwise swaps between nearby full steps (in place), vectorised over all swap pairs.

    A swap is kept when it lowers the pair's score ``max(token part, cost part)`` without pushing
    either part of either step above ``max(its old pair value, 1)`` (1 = on target), so fixing one
    metric never spoils the other beyond its target.
    """
    full = [k for k, s in enumerate(steps) if s.shape[1] == mb and not np.any(s == FILLER)]
    for _ in range(passes):
        improved = 0
        pairs = [(full[x], full[x + d]) for d in range(1, window + 1) for x in range(len(full) - d)]
        for a, b in pairs:
            A, B = steps[a], steps[b]
            tla, cla = tokens[A].sum(1).astype(np.float64), cost[A].sum(1)
            tlb, clb = tokens[B].sum(1).astype(np.float64), cost[B].sum(1)
            tpa, cpa = _parts(tla, cla, tt, ct)
            tpb, cpb = _parts(tlb, clb, tt, ct)
            cur = max(tpa, cpa, tpb, cpb)
            if cur <= 1.0:
                continue
            t_lim, c_lim = max(tpa, tpb, 1.0), max(cpa, cpb, 1.0)
            dp = A.shape[0]
            fa, fb = A.reshape(-1), B.reshape(-1)  # flat slot f belongs to rank f // mb
            ea = np.eye(dp)[np.arange(fa.size) // mb]
            eb = np.eye(dp)[np.arange(fb.size) // mb]
            dt = tokens[fb][None, :].astype(np.float64) - tokens[fa][:, None]  # [na, nb]: B's pack in, A's out
            dc = cost[fb][None, :] - cost[fa][:, None]
            t1, c1 = _parts(tla + dt[:, :, None] * ea[:, None, :], cla + dc[:, :, None] * ea[:, None, :], tt, ct)
            t2, c2 = _parts(tlb - dt[:, :, None] * eb[None, :, :], clb - dc[:, :, None] * eb[None, :, :], tt, ct)
            tnew, cnew = np.maximum(t1, t2), np.maximum(c1, c2)
            sc = np.maximum(tnew, cnew)
            sc[(tnew > t_lim + 1e-12) | (cnew > c_lim + 1e-12)] = np.inf
            i, j = np.unravel_index(int(np.argmin(sc)), sc.shape)
            if sc[i, j] < cur - 1e-9:
                A.reshape(-1)[i], B.reshape(-1)[j] = fb[j], fa[i]
                improved += 1
        if not improved:
            break


def _excl(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For loads ``[..., dp]``: max and min over the *other* ranks, for every rank (top-2 trick)."""
    dp = x.shape[-1]
    if dp == 1:
        return np.full_like(x, -np.inf), np.full_like(x, np.inf)
    srt = np.sort(x, axis=-1)
    top1, top2 = srt[..., -1:], srt[..., -2:-1]
    low1, low2 = srt[..., :1], srt[..., 1:2]
    amax = np.argmax(x, axis=-1)[..., None] == np.arange(dp)
    amin = np.argmin(x, axis=-1)[..., None] == np.arange(dp)
    return np.where(amax, top2, top1), np.where(amin, low2, low1)


def _repair_worst(steps, tokens, cost, mb, budget, tt, ct, neighbours=64, samples=128, seed=0,
                  wt: float = 1.0, wc: float = 1.0) -> None:
    """Min-max repair: the worst full step swaps one pack with the best slot of any other full step.

    Kept swaps lower the worst step's score, leave the partner below that score, and never raise the
    plan's worst token part or worst cost part (Pareto-monotone); a step no swap can help is skipped.
    Partners: the ``neighbours`` nearest steps in cost order and ``samples`` random ones (bounded
    work per repair: ``O(dp*mb * (2*neighbours+samples) * dp*mb)``).
    """
    full = [k for k, s in enumerate(steps) if s.shape[1] == mb and not np.any(s == FILLER)]
    if len(full) < 2:
        return
    grid = np.stack([steps[k] for k in full])  # [S, dp, mb]
    S, dp, _ = grid.shape
    na = dp * mb
    tok = tokens.astype(np.float64)
    rank_of = np.arange(na) // mb
    tl = tok[grid].sum(-1)  # [S, dp]
    cl = cost[grid].sum(-1)
    stuck = np.zeros(S, dtype=bool)
    rng = np.random.default_rng(seed)
    for _ in range(budget):
        tp, cp = _parts(tl, cl, tt, ct)
        sc = np.where(stuck, -np.inf, np.maximum(wt * tp, wc * cp))
        a = int(np.argmax(sc))
        cur = float(sc[a])
        if cur <= 1.0:
            break
        t_lim, c_lim = max(float(tp.max()), 1.0), max(float(cp.max()), 1.0)  # global worsts never grow
        fa = grid[a].reshape(-1)
        # partner candidates: the steps nearest in cost order plus a seeded random sample (bounded work)
        if S <= 2 * neighbours + samples:
            cand = np.arange(S)
        else:
            near = np.arange(max(0, a - neighbours), min(S, a + neighbours + 1))
            cand = np.unique(np.concatenate([near, rng.choice(S, samples, replace=False)]))
        cand = cand[cand != a]
        if cand.size == 0:
            break
        flat = grid.reshape(S, na)[cand]  # [C, na]
        tlc, clc = tl[cand], cl[cand]
        dt = tok[flat][None, :, :] - tok[fa][:, None, None]  # [na(i in A), C, na(j in B)]
        dc = cost[flat][None, :, :] - cost[fa][:, None, None]
        ra, rb = rank_of, rank_of
        # step A after the swap: rank ra[i] gains dt
        tmx, tmn = _excl(tl[a])
        cmx, _ = _excl(cl[a])
        va = tl[a][ra][:, None, None] + dt
        ua = cl[a][ra][:, None, None] + dc
        ta_new = (np.maximum(tmx[ra][:, None, None], va) - np.minimum(tmn[ra][:, None, None], va)) / (
            np.maximum((tl[a].sum() + dt) / dp, 1e-12)) / tt
        ca_new = (np.maximum(cmx[ra][:, None, None], ua) / np.maximum((cl[a].sum() + dc) / dp, 1e-12) - 1.0) / ct
        # step B after the swap: rank rb[j] loses dt
        bmx, bmn = _excl(tlc)  # [C, dp]
        bcmx, _ = _excl(clc)
        vb = tlc[:, rb][None, :, :] - dt
        ub = clc[:, rb][None, :, :] - dc
        tb_new = (np.maximum(bmx[:, rb][None], vb) - np.minimum(bmn[:, rb][None], vb)) / (
            np.maximum((tlc.sum(-1)[None, :, None] - dt) / dp, 1e-12)) / tt
        cb_new = (np.maximum(bcmx[:, rb][None], ub) / np.maximum((clc.sum(-1)[None, :, None] - dc) / dp, 1e-12)
                  - 1.0) / ct
        new = np.maximum(wt * ta_new, wc * ca_new)  # the worst step's new score
        bad = (ta_new > t_lim + 1e-12) | (tb_new > t_lim + 1e-12) | (ca_new > c_lim + 1e-12) | (cb_new > c_lim + 1e-12)
        new = np.where(bad | (np.maximum(wt * tb_new, wc * cb_new) >= cur), np.inf, new)
        i, bc, j = np.unravel_index(int(np.argmin(new)), new.shape)
        if not new[i, bc, j] < cur - 1e-9:
            stuck[a] = True
            continue
        b = int(cand[bc])
        pa, pb = int(fa[i]), int(flat[bc, j])
        grid[a].reshape(-1)[i], grid[b].reshape(-1)[j] = pb, pa
        for k in (a, b):
            tl[k] = tok[grid[k]].sum(-1)
            cl[k] = cost[grid[k]].sum(-1)
    for n, k in enumerate(full):
        steps[k][...] = grid[n]


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
