"""Pack and balance samples jointly: :func:`balance_samples` (a whole data set over many steps) and
:func:`balance_batch` (one global batch). Method: docs/notes/balance.md and the docstrings below.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from seqpack.algorithms import DEFAULT_ALGORITHM, pack_lengths
from seqpack.padding import check_seq_length, round_up
from seqpack.parallel.balance.cost import pack_costs, pack_sums
from seqpack.parallel.balance.bands import band_then_level
from seqpack.parallel.balance.leveling import level, pack_then_level
from seqpack.parallel.balance.packs import balance_packs, check_formation
from seqpack.parallel.balance.schedule import FILLER, BalancePlan, SampleBalancePlan, check_count, sort_ranks_by_cost


def _check_sample_args(lengths, capacity, dp_size, micro_batches, pad_to_multiple_of):
    """The lengths rounded up to ``pad_to_multiple_of`` (int64 [n]), after checking every argument.

    Raises ValueError / TypeError naming the bad argument, or the first sample outside [1, capacity]."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {lengths.shape}")
    if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"lengths must be integers (token counts), got dtype {lengths.dtype}")
    check_count("dp_size", dp_size)
    if micro_batches is not None:
        check_count("micro_batches", micro_batches)
    check_count("capacity", capacity)
    check_count("pad_to_multiple_of", pad_to_multiple_of)
    check_seq_length(capacity, pad_to_multiple_of, {"pad_to_multiple_of": pad_to_multiple_of}, name="capacity")
    padded = round_up(lengths.astype(np.int64), int(pad_to_multiple_of)) if lengths.size else np.zeros(0, np.int64)
    bad = np.flatnonzero((padded < 1) | (padded > capacity))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"sample {i} has length {int(lengths[i])} (padded {int(padded[i])}), outside [1, capacity={capacity}] "
            f"({bad.size} samples); truncate/split over-long samples before balancing (prepare overlength=...)")
    return padded


def _initial_packs(padded, capacity, pad, algorithm, seed):
    if padded.size == 0:
        return []
    plan = pack_lengths(padded, int(capacity), algorithm if algorithm is not None else DEFAULT_ALGORITHM,
                        seed=seed, pad_to_multiple_of=int(pad), shuffle_packs=False)
    return [np.asarray(b, dtype=np.int64) for b in plan.bins]


def _finish(bins, grids, padded, dp, mb, capacity, pad, extra, method):
    cost = pack_sums(bins, padded.astype(np.float64) ** 2)
    fillers = 0
    for g in grids:
        sort_ranks_by_cost(g, cost)
        fillers += int(np.sum(g == FILLER))
    sched = BalancePlan(steps=grids, dp_size=dp, micro_batches=mb, num_fillers=fillers, method=method)
    return SampleBalancePlan(bins=bins, schedule=sched, lengths=padded, capacity=int(capacity),
                             pad_to_multiple_of=int(pad), extra_packs=int(extra), method=method)


#: Inputs up to this many samples also try the local-search starts when the band schedule misses a goal.
SEARCH_MAX_SAMPLES = 4096
#: ``stop_score`` (None) of the band schedule's leveled steps and of the local-search starts.
BAND_STOP_SCORE, SEARCH_STOP_SCORE = 0.9, 0.5
#: Inputs up to this many samples try every local-search start of step 5 (each costs milliseconds there).
ALL_STARTS_MAX_SAMPLES = 256

_SAMPLE_METHOD = ("pack_lengths + cost-sorted steps + vector LPT (Graham 1969) over packs, sample-level leveling "
                  "(length-matched swaps between packs, moves/swaps between a step's ranks)")


def balance_samples(
    lengths,
    capacity: int,
    dp_size: int,
    micro_batches: int = 1,
    *,
    pad_to_multiple_of: int = 1,
    algorithm=None,
    seed: int = 0,
    shuffle_steps: bool = True,
    token_tolerance: float = 1e-3,
    cost_tolerance: float = 0.05,
    stop_score: float | None = None,
    max_iter: int = 40,
    cross_iters: int | None = None,
    sand_fractions: Sequence[float] | None = None,
    formation: str = "cost",
    prefer: str = "goals",
) -> SampleBalancePlan:
    """Pack samples AND schedule them over steps x DP ranks x micro-batches with even work per step.

    Balancing whole pre-built packs (:func:`~seqpack.parallel.balance.balance_packs`) cannot even out a
    step whose packs differ by a few tokens (at 8 ranks x 1 micro-batch of 4096 tokens, 0.1 % is 4
    tokens); this works on samples. Method (numpy + numba, linear in the samples after packing):

    1. **Pack.** :func:`seqpack.algorithms.pack_lengths` (default: balanced best fit) gives ``P``
       packs; ``P`` is rounded up to a multiple of ``dp_size`` with extra packs (at most one per rank).
    2. **Band schedule** (:mod:`~seqpack.parallel.balance.bands`): the extra packs pool their room with
       the lowest-cost packs (re-packed by LPT into even loads); every pack is brought within a few
       tokens of the capacity (pool: of the pool's mean) by length-matched sample swaps between packs
       (a length index finds a sample ``d`` tokens longer in a pack with room to give); packs in
       decreasing attention cost are cut into steps of ``dp_size * micro_batches`` and dealt to ranks
       by vector LPT (Graham 1969). One-sample packs that cannot be evened share steps with packs of
       their load; a swap with no partner that has room goes through a middle pack (two hops). Steps
       above the token goal trade whole packs of near cost with other steps (when that lowers both
       steps' token excess and raises no cost max/mean above its own or the plan's worst), then get new windows
       and swaps; then each pack outside a still-off step's window trades places with a near-cost pack
       of an on-target step when both reach their new window by swaps (undone otherwise). Steps still
       off target (token spread above ``token_tolerance`` or cost max/mean
       above ``1 + cost_tolerance``) are then leveled sample by sample (step 3, 4 on those steps only);
       a step still above the token goal last gets ejection chains
       (:mod:`~seqpack.parallel.balance.chains`: each rank outside a window is brought in by up to three
       sample swaps or moves, changing sample counts, through packs of other steps that stay within
       their limits).
    3. **Level samples inside a step** (local search, best improvement): move one sample to
       another rank's pack, swap two samples between ranks, or exchange one sample for two between
       the most and least loaded ranks -- never filling a pack above ``capacity``. The step key is
       lexicographic: token spread down to 0.9 x ``token_tolerance`` first, then cost max/mean down
       to ``1 + stop_score * cost_tolerance``, then tokens further, then summed squared deviations.
    4. **Cross-step repair** (min-max local search): the worst step swaps one sample with a sample
       of another full step whose length differs by at most the step's spread (<= 64 tokens); the
       partner must stay within max(its old figures, 0.9 x target), re-leveled if needed, else the
       swap is undone.
    5. **Small inputs** (at most :data:`SEARCH_MAX_SAMPLES` samples): when the band schedule misses a
       goal, the "pool" local-search start is tried too and the better plan kept: packs within
       ``stop_score * token_tolerance`` of the capacity apart, the rest re-packed evenly, formed by
       :func:`~seqpack.parallel.balance.balance_packs` and leveled (3, 4); likewise the "sand" starts
       of ``sand_fractions`` (the shortest samples, that fraction of the tokens, lifted out and poured
       back where a step's ranks are lowest; ``0.0`` = the packs as packed), by default "as packed"
       with several micro-batches only. (With one micro-batch, "as packed", no extra packs and steps
       grouped by token deficit cost 0.4-1.1 CPU-s each at 2,000 samples and were not picked on the
       measured inputs, or only for a lower cost at a higher token spread.) Up to
       :data:`ALL_STARTS_MAX_SAMPLES` samples every start is tried: also no extra packs, steps grouped
       by token deficit, "pool" with 10 % of the full packs and sand 0.1.

    Token spread of a step is ``(max - min) / mean`` of its ranks' tokens; attention cost of a rank
    is ``sum(len**2)`` over the segments of its micro-batches (padded lengths: the kernel work on
    ``cu_seqlens_padded``). Karmarkar-Karp's largest differencing method (1982) balances sums more
    tightly but ignores the per-micro-batch cap; here every micro-batch is a pack <= ``capacity``.

    Limits (measured by ``seqpack bench balance``, docs/notes/balance.md): with one micro-batch per rank,
    a step holding one-document packs near the capacity (e.g. 4086 and 4087 tokens at 4096) needs its
    other packs brought to that load; when their only movable samples are already among the shortest
    lengths present, no swap or pack trade reaches it (lognormal lengths at capacity 4096, dp 8: 0.098 %
    worst-step token spread at 10k and 100k samples on the benchmark's seed, up to 0.32 % on other seeds;
    with four micro-batches every measured seed is within 0.1 %); the cost goal can be provably out of
    reach (:func:`cost_ratio_lower_bound`).

    Args:
        lengths: int [n] sample lengths in tokens, each in [1, capacity] after padding.
        capacity: tokens per micro-batch (packed row length).
        dp_size: DP world size.
        micro_batches: micro-batches (packs) per rank per step (gradient accumulation).
        pad_to_multiple_of: segment pad multiple (capacity must be divisible by it); lengths are
            rounded up to it for the cap and for both balance measures.
        algorithm: :class:`seqpack.algorithms.PackingAlgorithm` for step 1 (None = default).
        seed: seed for packing, the step order and the repair's random choices.
        shuffle_steps: shuffle steps (the remainder step stays last).
        token_tolerance, cost_tolerance: scales of the step score (targets: 0.1 %, 1.05).
        stop_score: leveling of a step stops once its score is at or below this (1.0 = on target); None =
            :data:`BAND_STOP_SCORE` for the steps the band schedule levels (those off target; lower costs
            time, e.g. 0.5 doubles it on some inputs, for figures measured equal) and
            :data:`SEARCH_STOP_SCORE` for the local-search starts (step 5).
        max_iter: best-improvement iterations per step and leveling call (steps 3, 4).
        cross_iters: budget of cross-step repairs (None = ``4 * steps leveled + 200``: the band
            schedule levels its off-target steps only, the local-search starts all steps; 0 disables).
        sand_fractions: token fractions tried for the "sand" starts (None = ``(0.0,)`` with
            ``micro_batches > 1``, else none; ``0.0`` = the packs as packed); used only on small inputs
            whose band schedule misses a goal (step 5).
        formation: ``"cost"`` (bands in decreasing cost), ``"deficit"`` (by token-deficit class first) or
            ``"auto"`` (both, the better kept) for the band schedule and the local-search starts.
        prefer: how the best candidate is chosen: ``"goals"`` (default) = fewest goals missed
            (token spread <= ``token_tolerance``, cost max/mean <= 1 + ``cost_tolerance`` on the worst
            full step), then least summed excess; ``"excess"`` = least summed excess
            ``max(spread/tt, 1) + max((cost-1)/ct, 1)`` first (can keep a lower attention cost where
            meeting the token goal would raise it).

    Returns:
        :class:`SampleBalancePlan`; every sample in exactly one micro-batch; no micro-batch above
        ``capacity``; every step has a multiple of ``dp_size`` micro-batches, the last step
        ``ceil(rest / dp_size)`` per rank; empty micro-batches (fillers) only where there are fewer
        samples than slots.

    Raises:
        ValueError / TypeError: bad sizes, non-integer lengths, a sample outside [1, capacity]
        (names the sample index).
    """
    padded = _check_sample_args(lengths, capacity, dp_size, micro_batches, pad_to_multiple_of)
    if prefer not in ("goals", "excess"):
        raise ValueError(f"prefer must be 'goals' or 'excess', got {prefer!r}")
    check_formation(formation)
    dp, mb, pad = int(dp_size), int(micro_batches), int(pad_to_multiple_of)
    bins = _initial_packs(padded, capacity, pad, algorithm, seed)
    p = len(bins)
    p_ext = -(-p // dp) * dp
    tiny = padded.size <= ALL_STARTS_MAX_SAMPLES  # every start costs milliseconds: try them all
    if sand_fractions is None:  # "as packed" with several micro-batches (where it wins; slow with one)
        sand_fractions = (0.0, 0.1) if tiny else (0.0,) if mb > 1 else ()
    # None: the band schedule; then (small inputs only) the "pool" start (sand value -1: full packs apart, the
    # rest re-packed evenly; -2: also 10 % of the full packs, tiny inputs) and the "sand" starts asked for
    sand_fractions = tuple(float(f) for f in sand_fractions)
    search = [(True, -1.0, formation)] + [(True, -2.0, formation)] * tiny + [(True, f, formation) for f in sand_fractions]
    if tiny:  # no extra packs; steps grouped by token deficit (equal-length long samples together)
        search += [(False, 0.0, "auto")] * (p_ext > p) + [(False, 0.0, "deficit")]
    variants = [(True, None, formation)]
    last = [] if 0.0 in sand_fractions else [(True, 0.0, formation)]  # when no other start fits
    best = None
    while variants:
        with_extra, frac, form = variants.pop(0)
        if frac is None and padded.size <= SEARCH_MAX_SAMPLES:  # small inputs: the local-search starts next
            variants, search = variants + search, []
        extra = p_ext - p if with_extra else 0
        if frac is None:
            got = band_then_level(bins, padded, capacity, pad, dp, mb, seed, shuffle_steps, token_tolerance,
                                  cost_tolerance, BAND_STOP_SCORE if stop_score is None else stop_score, max_iter,
                                  cross_iters, form)
            what = "band schedule: loads evened by length-matched swaps, packs in cost bands"
        else:
            got = pack_then_level(bins + [np.zeros(0, dtype=np.int64)] * extra, padded, capacity, pad, dp, mb, frac,
                                  seed, shuffle_steps, token_tolerance, cost_tolerance,
                                  SEARCH_STOP_SCORE if stop_score is None else stop_score, max_iter,
                                  cross_iters, form)
            what = (f"sand {frac:g} of tokens re-poured" if frac > 0 else "as packed") if frac >= 0 else \
                "full packs apart, the others re-packed evenly (LPT)" + (" with 10% of the full ones" if frac < -1.5
                                                                         else "")
        if got is None:
            if best is None and not variants:  # nothing fitted yet: the other starts, last the packs as packed
                variants, search, last = (search or last), [], (last if search else [])
            continue
        new_bins, new_grids = got
        plan = _finish(new_bins, new_grids, padded, dp, mb, capacity, pad, extra,
                       _SAMPLE_METHOD + f" ({form} formation, {what}, {extra} extra packs)")
        st = plan.stats()
        tp = st["token_spread_max"] / token_tolerance
        cp = (st["cost_max_over_mean_worst"] - 1.0) / cost_tolerance
        # "goals": fewest goals missed first; "excess": least summed excess over the targets (the
        # figure closer to step time when a goal is out of reach); then the worse part, the mean spread
        missed = int(tp > 1.0) + int(cp > 1.0)
        excess = max(tp, 1.0) + max(cp, 1.0)
        key = ((missed, excess) if prefer == "goals" else (excess, missed)) + (max(tp, cp), st["token_spread_mean"])
        if best is None or key < best[0]:
            best = (key, plan)
        if key[0] == 0:  # both goals met: stop trying variants
            break
    return best[1]


def balance_batch(
    lengths,
    capacity: int,
    dp_size: int,
    micro_batches: int | None = None,
    *,
    pad_to_multiple_of: int = 1,
    algorithm=None,
    seed: int = 0,
    token_tolerance: float = 1e-3,
    cost_tolerance: float = 0.05,
    stop_score: float = 0.5,
    max_iter: int = 500,
) -> SampleBalancePlan:
    """In-batch packing: split ONE global batch of samples over DP ranks and micro-batches.

    The batch is packed with :func:`seqpack.algorithms.pack_lengths`, packs are dealt to ranks by
    vector LPT (Graham 1969), then samples are moved/swapped between ranks (as in
    :func:`balance_samples` step 3) to even tokens and attention cost. Use it when the data loader
    yields a global batch of samples per optimizer step.

    Args:
        lengths: int [n] the batch's sample lengths (tokens).
        capacity: tokens per micro-batch.
        dp_size: DP world size.
        micro_batches: micro-batches per rank; None = the fewest that hold the batch
            (``ceil(packs / dp_size)``).
        pad_to_multiple_of, algorithm, seed, token_tolerance, cost_tolerance, stop_score, max_iter:
            as in :func:`balance_samples`.

    Returns:
        :class:`SampleBalancePlan` with one step; ``plan.step(0)[rank][m]`` = sample indices.

    Raises:
        ValueError: the batch needs more than ``dp_size * micro_batches`` packs (says how many
            micro-batches would fit it), plus the checks of :func:`balance_samples`.
    """
    padded = _check_sample_args(lengths, capacity, dp_size, micro_batches, pad_to_multiple_of)
    dp, pad = int(dp_size), int(pad_to_multiple_of)
    bins = _initial_packs(padded, capacity, pad, algorithm, seed)
    p = len(bins)
    need = max(1, -(-p // dp))
    mb = need if micro_batches is None else int(micro_batches)
    if p > dp * mb:
        raise ValueError(
            f"the batch of {padded.size} samples ({int(padded.sum())} tokens) needs {p} packs of capacity {capacity}, "
            f"more than dp_size*micro_batches = {dp}*{mb}; set micro_batches >= {need} or send a smaller batch")
    extra = dp * mb - p
    bins = bins + [np.zeros(0, dtype=np.int64)] * extra
    tokens, cost = pack_costs(bins, padded)
    sched = balance_packs(tokens, cost, dp, mb, token_cap=int(capacity), seed=seed, shuffle_steps=False,
                          token_tolerance=token_tolerance, cost_tolerance=cost_tolerance, formation="cost")
    grids = [g.copy() for g in sched.steps]
    new_bins, new_grids = level(bins, grids, padded, capacity, pad, dp, mb, token_tolerance, cost_tolerance,
                                stop_score, max_iter, 0, seed)
    return _finish(new_bins, new_grids, padded, dp, mb, capacity, pad, extra,
                   "in-batch: pack_lengths + vector LPT (Graham 1969) + sample-level local search")
