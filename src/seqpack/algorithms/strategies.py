"""The packing strategies behind each :class:`~seqpack.algorithms.PackingAlgorithm` (numba kernels in ``_kernels``).

Every function takes ``sizes`` (int64 lengths in pad-multiple units), ``cap`` (capacity in the same units)
and ``seed``, and returns ``(bin_of, num_bins)``: the pack of each item and the pack count.
:func:`seqpack.algorithms.pack_lengths` validates the input and maps the enum to these functions.
"""

from __future__ import annotations

import numpy as np

from seqpack.algorithms import _kernels as K
from seqpack.algorithms import _kernels_pairs as KP
from seqpack.algorithms.plan import lower_bound_l2, lower_bound_l2_counts

# ---------------------------------------------------------------------------------------------
# algorithm implementations (sizes in pad-multiple units, capacity `cap` in the same units)
# ---------------------------------------------------------------------------------------------
_EMPTY = np.zeros(0, np.int64)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, stream])


def pack_order(seed: int, n: int, loads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The seeded output order of the packs of an ``n``-item plan, ``loads`` int64[nb] their loads:
    ``(perm int64[nb], loads[perm])``, ``perm`` a uniformly random permutation. Up to
    PORTFOLIO_ALWAYS_ITEMS items numpy's ``Generator.permutation``; above, a bucketed shuffle
    (``_kernels.shuffle_buckets``) that stays in cache (millions of packs)."""
    rng = _rng(seed, 2)
    nb = loads.size
    if n <= PORTFOLIO_ALWAYS_ITEMS:
        perm = rng.permutation(nb)
        return perm, loads[perm]
    return K.shuffle_buckets(rng.integers(0, 256, nb, dtype=np.uint8),
                             rng.integers(0, 1 << 32, nb, dtype=np.uint32),
                             np.ascontiguousarray(loads, dtype=np.int64))


def _pack_concatenative(sizes, cap, seed):
    """Next fit in input order: open a new pack when the next sample does not fit. Keeps the
    dataset order; wastes the tail of every pack. O(n). (NeMo-RL/Megatron-Bridge "concatenative".)"""
    return K.next_fit(sizes, np.arange(sizes.size, dtype=np.int64), cap)


def _pack_first_fit_decreasing(sizes, cap, seed):
    """First fit decreasing (Johnson 1973): samples by length descending (stable counting sort),
    each into the first open pack with room. FFD <= 11/9 OPT + 6/9 (Dósa 2007). O(n log n) via a
    max tree over packs."""
    return K.first_fit(sizes, K.desc_order(sizes, cap), cap, _EMPTY)


def _pack_first_fit_shuffle(sizes, cap, seed):
    """First fit over a seeded random permutation (NeMo / Megatron-Bridge ``first_fit_shuffle``):
    pack content is random, at the price of more packs than FFD. O(n log n)."""
    order = _rng(seed, 1).permutation(sizes.size).astype(np.int64)
    return K.first_fit(sizes, order, cap, _EMPTY)


def _pack_best_fit_decreasing(sizes, cap, seed):
    """Best fit decreasing (Johnson 1973; TRL ``bfd``): samples by length descending, each into
    the pack whose remaining room is the smallest that fits (ties: the pack that reached that
    room most recently). O(n log C) via a bit tree over remaining room 0..C, correct for any C
    (B13)."""
    return K.best_fit(sizes, K.desc_order(sizes, cap), cap)


def _pack_modified_first_fit_decreasing(sizes, cap, seed):
    """Modified first fit decreasing (Johnson & Garey 1985, worst case 71/60 OPT + 1, tight bound
    by Yue & Zhang 1995; NeMo-RL ``modified_first_fit_decreasing``): large items (> C/2) first get
    their own pack, then the best medium (C/3..C/2] item, then pairs of small (C/6..C/3] items,
    then first fit decreasing for the rest. O(n log n)."""
    return K.mffd(sizes, cap)


def _pack_greedy_knapsack(sizes, cap, seed):
    """LLaMA-Factory ``greedy_knapsack``: fill one pack at a time with the largest remaining
    sample that still fits, close it when nothing fits. The same lengths per pack as
    LLaMA-Factory's bisect-and-pop version (ties among equal lengths go to the lower index), in
    O(n log C) instead of O(n^2)."""
    return K.greedy_knapsack(sizes, cap)


#: Packs opened up front by balanced_greedy_knapsack, as a multiple of L1 (at least 1 is opened).
#: Chosen by measurement on 200,000 lognormal SFT lengths (median 250, sigma 1, C = 4096;
#: L1 = 19,929), packs / utilization / load spread:
#:   0.0 (open lazily)  19,929 / 1.0000 /     8      <- default
#:   0.5                19,936 / 0.9996 /    11
#:   0.9                19,955 / 0.9987 /    13
#:   1.0                20,032 / 0.9948 /    39
#:   1.25               24,912 / 0.7999 /   877
#:   2.6                51,816 / 0.3846 / 2,680      (the utilization collapse reported upstream)
#: Opening more packs than needed spreads the long samples thinly and every pack ends ~1/factor
#: full; opening lazily lets each new pack absorb the following samples until it is as full as
#: the others.
BALANCED_GREEDY_BIN_FACTOR = 0.0


def _pack_balanced_greedy_knapsack(sizes, cap, seed, factor: float = BALANCED_GREEDY_BIN_FACTOR):
    """Balanced greedy knapsack (Energon / NeMo-RL style; LPT of Graham 1969 with a capacity):
    open ``k = max(1, ceil(factor * L1))`` packs, then place samples by length descending, each
    into the currently least-loaded pack if it fits there; a sample that does not fit there fits
    nowhere and opens a new pack (which, being the least loaded, takes the next samples).
    Optimises equal pack loads. O(n log k). ``factor`` defaults to
    :data:`BALANCED_GREEDY_BIN_FACTOR` = 0.0 (open lazily), picked by measurement (table at the
    constant): factor 1.0 costs 0.5% extra packs and 2.6 collapses utilization to 0.385."""
    total = int(sizes.sum())
    k0 = max(1, int(np.ceil(factor * (-(-total // cap))))) if sizes.size else 0
    return K.balanced_greedy(sizes, K.desc_order(sizes, cap), cap, k0)


#: Randomized best fit: samples with length <= cap // RANDOMIZED_SAND_DIVISOR are "sand",
#: packed last (largest first) to fill the gaps left by the randomly ordered rest.
RANDOMIZED_SAND_DIVISOR = 16


def _pack_randomized_best_fit(sizes, cap, seed):
    """Randomized best fit (this library): samples longer than C/16 are packed by best fit in a
    seeded random order (so long samples are not grouped with each other and pack content does
    not follow length order); the remaining short samples ("sand") are then added largest first
    by best fit, which closes the gaps; finally sand leveling as in ``balanced_best_fit``.
    O(n log C)."""
    rng = _rng(seed, 1)
    thr = max(1, cap // RANDOMIZED_SAND_DIVISOR)
    big = np.flatnonzero(sizes > thr)
    big = big[rng.permutation(big.size)]
    small = np.flatnonzero(sizes <= thr)
    small = small[np.argsort(-sizes[small], kind="stable")]
    order = np.concatenate([big, small]).astype(np.int64)
    bin_of, nb = K.best_fit(sizes, order, cap)
    K.level(sizes, bin_of, nb, cap, _level_tol(cap))
    return bin_of, nb


def _level_tol(cap: int) -> int:
    # target load spread for the leveling pass: 0.5% of capacity (the benchmark target is 1%)
    return max(1, cap // 200)


#: Portfolio policy of ``balanced_best_fit``: when BFD is above L2, MFFD / FFD / minimum bin slack
#: also run on inputs of <= PORTFOLIO_ALWAYS_ITEMS items; above that only minimum bin slack, and
#: only for <= MIN_SLACK_MAX_DISTINCT distinct lengths (where it is linear in n).
PORTFOLIO_ALWAYS_ITEMS = 200_000
#: Minimum-bin-slack member: search steps per pack, and the distinct-length limit for large inputs.
MIN_SLACK_BUDGET = 2000
MIN_SLACK_MAX_DISTINCT = 256
#: Exact-fill member (large inputs): smaller sizes tried per step when a step would leave a rest room that
#: cannot be closed. Measured on 1M lognormal exp(N(6.2, 0.5)) lengths, C = 4096 (L2 = 136,405): BFD +364
#: packs; tries 8: +75, 32: +58, 256: +44 (time 19 -> 24 ns per item).
EXACT_FILL_TRIES = 64


def _pack_balanced_best_fit(sizes, cap, seed, detail=None):
    """Default: the fewest packs of a small portfolio on the size histogram, then "sand" leveling.

    Returns ``(bin_of, nb, csr)``: ``csr`` is ``(offsets, items, loads)`` (loads in units) when the
    packs come as size-grouped slots (large inputs), else ``None`` and ``bin_of`` holds the packs.

    Inputs of > PORTFOLIO_ALWAYS_ITEMS items:

    1. Exact fill (``_kernels.grouped_exact_fill``, O(n + C)): greedy knapsack on the histogram with
       a look-ahead that avoids rest rooms no remaining sizes can close. Measured at 1M lengths it
       reaches L2 or L2 + 0.03 % where BFD is up to L2 + 0.27 % (lognormal exp(N(6.2, 0.5)), C = 4096).
    2. Only when that is above L1 and above the Martello-Toth bound L2: BFD (the packs of
       ``best_fit_decreasing``, one size group at a time, ``_kernels.grouped_best_fit``, O(n + C)),
       kept when it needs fewer packs, so the default never uses more packs than BFD (its pack count
       comes first from the size histogram, ``_kernels.grouped_best_fit_count``, O(C) steps, and the
       packs are built only when they win); then, for
       <= MIN_SLACK_MAX_DISTINCT distinct lengths, Minimum Bin Slack (Gupta & Ho 1999, bounded DFS,
       linear in n for few distinct lengths).

    Inputs of <= PORTFOLIO_ALWAYS_ITEMS items (their plans are kept as they were): BFD first; when
    above L2, MFFD, FFD and Minimum Bin Slack (the fewest packs win, BFD wins ties), so the default
    never uses more packs than FFD there.

    Pairing (large inputs, when the loads spread more than C/100 and either the packs average
    <= 2.5 samples, before leveling, or after leveling the least-loaded pack holds <= 2 samples):
    the one- and two-sample packs are re-paired, their longer samples ascending with the shorter
    ones descending (``_kernels_pairs.pair_slots``; pack count unchanged, the spread never grows),
    then leveled (again). Measured at 1M lengths: spread 2,050 -> 7 tokens (uniform), 113 -> 2
    (half C/2 + e, half C/3 - e). On mostly two-sample packs pairing first leaves leveling little
    to do (1M uniform lengths: 177 -> 79 ns per item, against level, pair, level again).

    Leveling: with F = min(max_load - C/200, floor(mean load)), every pack below F receives,
    largest first, short samples ("sand") taken from packs that stay >= F; where sand runs out,
    it swaps one of its samples for a slightly longer one from such a pack (chains of swaps). The
    pack count never changes and the maximum load never rises. Size-grouped slots are leveled by
    ``_kernels.level_slots`` (linear: its swap phase has a budget of 8 n + C look-ups), item-level
    plans by ``_kernels.level``.
    Optimises: pack count first, then equal loads. ``detail["winner"]`` names the member whose
    packs were kept (``"fill"``, ``"bfd"``, ``"mffd"``, ``"ffd"`` or ``"mbs"``)."""
    n = sizes.size
    cnt, start = K.size_groups(sizes, cap)
    if n > PORTFOLIO_ALWAYS_ITEMS:
        return _balanced_large(sizes, cap, cnt, start, detail)
    slot, nb, room = K.grouped_best_fit(cnt, start, cap, n)
    bin_of = None
    winner = "bfd"
    l2 = None
    l1 = -(-int(sizes.sum()) // cap)
    if nb > l1:
        l2 = lower_bound_l2(sizes, cap)
        if nb > l2:
            cands = [("mffd", lambda: K.mffd(sizes, cap)),
                     ("ffd", lambda: K.first_fit(sizes, K.desc_order(sizes, cap), cap, _EMPTY)),
                     # "mbs" (minimum bin slack, not micro-batch size): the label reported in detail["winner"]
                     ("mbs", lambda: K.min_slack(sizes, cap, MIN_SLACK_BUDGET))]
            for name, fn in cands:
                b2, n2 = fn()
                if n2 < nb:
                    bin_of, nb, winner = b2, n2, name
                if nb <= l2:
                    break
    if bin_of is None:
        bin_of = K.slots_to_bins(sizes, start, slot)
    moved = K.level(sizes, bin_of, nb, cap, _level_tol(cap))
    if detail is not None:
        detail.update(winner=winner, leveled_moves=int(moved), lower_bound_l2_units=l2)
    return bin_of, nb, None


def _balanced_large(sizes, cap, cnt, start, detail):
    """``_pack_balanced_best_fit`` above PORTFOLIO_ALWAYS_ITEMS items (steps in its docstring)."""
    n = sizes.size
    total = int(cnt @ np.arange(cap + 1, dtype=np.int64))  # the sum of the sizes, from the histogram
    l2 = lower_bound_l2_counts(cnt, cap)
    target = min(cap, -(-total // l2))  # the mean load at L2 packs
    slot, nb, loads = K.grouped_exact_fill(cnt, start, cap, n, EXACT_FILL_TRIES, target)
    winner = "fill"
    bin_of = None
    if nb > -(-total // cap):
        if nb > l2 and K.grouped_best_fit_count(cnt, cap) < nb:  # BFD's pack count first, from the histogram
            slot, nb, room2 = K.grouped_best_fit(cnt, start, cap, n)
            loads, winner = cap - room2, "bfd"
        if nb > l2 and int(np.count_nonzero(cnt)) <= MIN_SLACK_MAX_DISTINCT:
            b2, n2 = K.min_slack(sizes, cap, MIN_SLACK_BUDGET)
            if n2 < nb:
                bin_of, nb, winner = b2, n2, "mbs"
    if bin_of is None:
        moved = 0
        if 2 * n <= 5 * nb and int(loads.max() - loads.min()) > max(1, cap // 100):
            KP.pair_slots(cnt, start, slot, loads)  # mostly 1-2 item packs: pairing first leaves leveling little
        moved += K.level_slots(cnt, start, slot, loads, cap, _level_tol(cap))
        if (int(loads.max() - loads.min()) > max(1, cap // 100)
                and np.count_nonzero(slot == int(np.argmin(loads))) <= 2):
            KP.pair_slots(cnt, start, slot, loads)
            moved += K.level_slots(cnt, start, slot, loads, cap, _level_tol(cap))
        off, items = K.slots_to_csr(sizes, start, slot, nb)
        csr = (off, items, loads)
    else:
        moved = K.level(sizes, bin_of, nb, cap, _level_tol(cap))
        csr = None
    if detail is not None:
        detail.update(winner=winner, leveled_moves=int(moved), lower_bound_l2_units=l2)
    return bin_of, nb, csr
