"""What a balance plan is: steps x DP ranks x micro-batches of pack ids, and the helpers on such grids.

A step is an int64 grid ``[dp_size, m]`` of pack ids; :data:`FILLER` (``-1``) marks an empty slot.
:class:`BalancePlan` schedules fixed packs, :class:`SampleBalancePlan` also owns the packs (sample
indices) it schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqpack.parallel.balance.cost import pack_costs, step_figures

#: Pack id of an empty micro-batch slot in a step grid.
FILLER = -1


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
        if not self.steps:
            return np.zeros((0, self.dp_size))
        return step_loads(self.steps, values)

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
        spread, ratio = step_figures(tk, cs)
        cmean = cs.mean(axis=1)
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


@dataclass
class SampleBalancePlan:
    """Schedule of *samples*: steps x DP ranks x micro-batches, each micro-batch one pack <= capacity.

    Attributes:
        bins: the packs, int64 arrays of sample indices (into the ``lengths`` given), none empty.
        schedule: :class:`BalancePlan` over ``bins`` (pack ids; ``-1`` = empty filler micro-batch).
        lengths: int64 [n] lengths used for capacity and balance (rounded up to ``pad_to_multiple_of``).
        capacity: token cap of every micro-batch (pack).
        pad_to_multiple_of: segment pad multiple the lengths were rounded to.
        extra_packs: packs added to make every step's pack count a multiple of ``dp_size``
            (``<= dp_size - 1``, i.e. at most one per rank), counted before leveling.
        method: short description of the method used.
    """

    bins: list[np.ndarray]
    schedule: BalancePlan
    lengths: np.ndarray
    capacity: int
    pad_to_multiple_of: int
    extra_packs: int
    method: str

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks (the schedule's width)."""
        return self.schedule.dp_size

    @property
    def micro_batches(self) -> int:
        """Micro-batches (packs) per rank per optimizer step."""
        return self.schedule.micro_batches

    @property
    def num_steps(self) -> int:
        """Number of optimizer steps in the schedule."""
        return self.schedule.num_steps

    @property
    def num_fillers(self) -> int:
        """Empty micro-batches (a rank has nothing to run in that slot) over the whole schedule."""
        return self.schedule.num_fillers

    def step(self, k: int) -> list[list[np.ndarray]]:
        """Step ``k`` as ``[rank][micro_batch] -> int64 sample indices`` (an empty array = filler)."""
        grid = self.schedule.steps[k]
        empty = np.zeros(0, dtype=np.int64)
        return [[self.bins[int(b)] if b != FILLER else empty for b in row] for row in grid]

    def steps(self) -> list[list[list[np.ndarray]]]:
        """All steps: ``[step][rank][micro_batch] -> int64 sample indices``."""
        return [self.step(k) for k in range(self.num_steps)]

    def rank_schedule(self, rank: int) -> list[list[np.ndarray]]:
        """For ``rank``: per step, its micro-batches' sample indices (fillers omitted)."""
        return [[self.bins[int(b)] for b in s[rank] if b != FILLER] for s in self.schedule.steps]

    def pack_tokens_and_cost(self) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens int64 [P], cost float64 [P])`` of ``bins`` on the (padded) lengths."""
        return pack_costs(self.bins, self.lengths)

    def stats(self) -> dict[str, float]:
        """Imbalance figures; same definitions as :meth:`BalancePlan.stats`, on the (padded) lengths.

        "Full" steps are those with ``micro_batches`` micro-batches per rank (judged even when one of
        their micro-batches is an empty filler), except the last step when it is the remainder
        (fewer micro-batches, or filler slots): that one is reported apart under ``last_*`` keys.
        ``token_spread`` of a step = ``(max - min) / mean`` of its ranks' tokens;
        ``cost max/mean`` = largest rank attention cost (sum of len**2) / mean rank cost.
        """
        tokens, cost = self.pack_tokens_and_cost()
        sch = self.schedule
        tl, cl = sch.loads(tokens), sch.loads(cost)
        full = np.array([s.shape[1] == sch.micro_batches for s in sch.steps], dtype=bool)
        if len(sch.steps) > 1 and np.any(sch.steps[-1] == FILLER):
            full[-1] = False  # the remainder step (kept last) with empty filler slots
        out: dict[str, float] = {"steps": float(sch.num_steps), "fillers": float(sch.num_fillers),
                                 "extra_packs": float(self.extra_packs), "packs": float(len(self.bins))}

        sel = full if full.any() else ~full
        sp, ra = step_figures(tl[sel], cl[sel])
        cm, cx = np.maximum(cl[sel].mean(axis=1), 1e-12), cl[sel].max(axis=1)
        out.update(token_spread_max=float(sp.max()) if sp.size else 0.0,
                   token_spread_mean=float(sp.mean()) if sp.size else 0.0,
                   cost_max_over_mean_worst=float(ra.max()) if ra.size else 1.0,
                   cost_max_over_mean_mean=float(ra.mean()) if ra.size else 1.0,
                   cost_time_efficiency=float(cm.sum() / max(cx.sum(), 1e-12)),
                   full_steps=float(sel.sum()))
        if full.any() and not full.all():
            sp2, ra2 = step_figures(tl[~full], cl[~full])
            out.update(last_token_spread=float(sp2.max()), last_cost_max_over_mean=float(ra2.max()))
        out["over_cap"] = float(int(np.sum(tokens > self.capacity)))
        out["max_pack_tokens"] = float(tokens.max()) if tokens.size else 0.0
        return out


def check_count(name: str, value) -> None:
    """Raise ValueError unless ``value`` (a size such as ``dp_size``) is an integer >= 1; names ``name``."""
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def step_shape(p: int, dp: int, mb: int) -> list[int]:
    """Micro-batches per rank of each step, for ``p`` packs over ``dp`` ranks and ``mb`` micro-batches.

    Full steps hold ``dp * mb`` packs (``mb`` per rank); a remainder step holds ``ceil(rest / dp)`` per
    rank (its missing slots become :data:`FILLER`). Returns a list of ints, one per step.
    """
    g = dp * mb
    full, rest = divmod(p, g)
    shape = [mb] * full
    if rest:
        shape.append(-(-rest // dp))
    return shape


def step_loads(grids: list[np.ndarray], values: np.ndarray) -> np.ndarray:
    """Per step and rank, ``values`` (float64 [P], by pack id) summed over the rank's micro-batches; a
    :data:`FILLER` slot adds 0. ``grids``: int64 ``[dp, m_s]`` per step. Returns float64 ``[steps, dp]``."""
    dp = grids[0].shape[0] if grids else 0
    out = np.zeros((len(grids), dp))
    v = np.append(np.asarray(values, dtype=np.float64), 0.0)  # index -1 (FILLER) reads the appended 0
    by_width: dict[int, list[int]] = {}
    for k, g in enumerate(grids):
        by_width.setdefault(g.shape[1], []).append(k)
    for ks in by_width.values():
        out[ks] = v[np.stack([grids[k] for k in ks])].sum(axis=2)
    return out


def is_full(grid: np.ndarray, mb: int) -> bool:
    """A full step: ``mb`` micro-batches per rank and no filler slot."""
    return grid.shape[1] == mb and not np.any(grid == FILLER)


def order_steps(steps: list[np.ndarray], mb: int, seed: int, shuffle: bool) -> list[np.ndarray]:
    """Full steps (in a seeded random order when ``shuffle``), then the partial (remainder) step(s)."""
    full = [g for g in steps if is_full(g, mb)]
    rest = [g for g in steps if not is_full(g, mb)]
    if shuffle and len(full) > 1:
        perm = np.random.default_rng(seed).permutation(len(full))
        full = [full[k] for k in perm]
    return full + rest


def sort_ranks_by_cost(grid: np.ndarray, cost: np.ndarray) -> None:
    """In place: inside each rank (row), micro-batches by descending pack cost, fillers last."""
    if grid.shape[1] <= 1:
        return
    key = np.where(grid == FILLER, -np.inf, cost[np.where(grid == FILLER, 0, grid)] if cost.size else 0.0)
    grid[...] = np.take_along_axis(grid, np.argsort(-key, axis=1, kind="stable"), axis=1)


def members_by_owner(owner: np.ndarray, count: int) -> list[np.ndarray]:
    """Positions grouped by ``owner`` (int64 [n] in [0, count)): ``count`` int64 arrays, ascending."""
    by = np.argsort(owner, kind="stable").astype(np.int64)
    ends = np.cumsum(np.bincount(owner, minlength=count))
    return [by[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]).tolist(), ends.tolist())]


def renumber_packs(pack_of: np.ndarray, num_packs: int, grids: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Drop the packs that moves left empty and renumber the rest, in the bins and the step grids.

    Args:
        pack_of: int64 [n], the pack of each sample (in ``[0, num_packs)``).
        num_packs: the pack count before renumbering.
        grids: per step, int64 [dp, micro_batches] pack ids (:data:`FILLER` for an empty slot).

    Returns:
        ``(bins, grids)``: the non-empty packs' sample indices (ascending) in old-id order, and the grids
        with new ids; a slot whose pack became empty turns into :data:`FILLER`.
    """
    new_id = np.full(num_packs, FILLER, dtype=np.int64)
    bins: list[np.ndarray] = []
    for k, members in enumerate(members_by_owner(pack_of, num_packs)):
        if members.size:
            new_id[k] = len(bins)
            bins.append(members)
    return bins, [np.where(g == FILLER, FILLER, new_id[np.where(g == FILLER, 0, g)]) for g in grids]
