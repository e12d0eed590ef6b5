"""Bin packing of sequence lengths into fixed-capacity packs (imports only the ground floor, ``seqpack.padding``).

Entry point: :func:`pack_lengths` -> :class:`PackingPlan`. Algorithms: :class:`PackingAlgorithm`.
All kernels are numba-compiled (``seqpack.algorithms._kernels``) and run in O(n log n) or
O(n log capacity) for any integer capacity (no power-of-two assumption, case B13).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from seqpack.algorithms import _kernels as K
from seqpack.padding import check_seq_length

__all__ = [
    "DEFAULT_ALGORITHM",
    "PackingAlgorithm",
    "PackingPlan",
    "lower_bound_l1",
    "lower_bound_l2",
    "pack_lengths",
    "check_plan",
    "resolve_algorithm",
    "MAX_CAPACITY_UNITS",
]


class PackingAlgorithm(str, Enum):
    """Packing algorithms (all deterministic for a given ``seed``).

    Each entry: what it optimises; time complexity (n samples, C = capacity in pad-multiple
    units); where it comes from. Exact rules in the implementing ``_pack_<member>`` functions.

    * ``concatenative``: keeps input order (next fit); O(n); NeMo-RL / Megatron-Bridge
      "concatenative".
    * ``first_fit_decreasing``: pack count (FFD <= 11/9 OPT + 6/9); O(n log n); Johnson 1973,
      TRL / NeMo-RL FFD.
    * ``first_fit_shuffle``: random pack content; O(n log n); NeMo / Megatron-Bridge
      ``first_fit_shuffle``.
    * ``best_fit_decreasing``: pack count, tight packs; O(n log C); Johnson 1973 BFD, TRL ``bfd``.
    * ``modified_first_fit_decreasing``: pack count (71/60 OPT); O(n log n); Johnson & Garey
      1985, bound by Yue & Zhang 1995; NeMo-RL MFFD.
    * ``greedy_knapsack``: fills one pack at a time; O(n log C); LLaMA-Factory
      ``greedy_knapsack``.
    * ``balanced_greedy_knapsack``: equal pack loads (LPT with lazily opened packs); O(n log n);
      Energon / NeMo-RL balanced greedy knapsack, Graham 1969 LPT.
    * ``randomized_best_fit``: partly random pack content at ~BFD pack count; O(n log C); this
      library (samples above C/16 by best fit in seeded random order, then the short ones largest
      first, then leveling). Short samples still follow length order: padding each pack's samples
      as one batch costs 1.59x the real tokens on the alpaca demo at C = 2048, against 2.33x for
      random batches (``first_fit_shuffle``: 2.35x) and 1.13x for ``balanced_best_fit``.
    * ``balanced_best_fit`` (default): pack count, then equal loads; O(n log C); this library
      (BFD + "sand" leveling, FFD/MFFD/Minimum-Bin-Slack portfolio when BFD is above L2).

    Measured on 1M lognormal SFT lengths at C = 4096 (``benchmarks/bench_algorithms.py``):
    the default reaches L1 + 2 packs with a 20-token load spread in ~0.15 s on one core.
    """

    concatenative = "concatenative"
    first_fit_decreasing = "first_fit_decreasing"
    first_fit_shuffle = "first_fit_shuffle"
    best_fit_decreasing = "best_fit_decreasing"
    modified_first_fit_decreasing = "modified_first_fit_decreasing"
    greedy_knapsack = "greedy_knapsack"
    balanced_greedy_knapsack = "balanced_greedy_knapsack"
    randomized_best_fit = "randomized_best_fit"
    balanced_best_fit = "balanced_best_fit"


DEFAULT_ALGORITHM = PackingAlgorithm.balanced_best_fit

#: Largest ``capacity // pad_to_multiple_of`` accepted: the kernels index tables by length
#: (counting sort, best-fit buckets), O(capacity) memory: 2**24 units is ~300 MB.
MAX_CAPACITY_UNITS = 1 << 24


@dataclass
class PackingPlan:
    """Result of :func:`pack_lengths`.

    Attributes:
        bins: one ``np.ndarray[int64]`` per pack: indices into the input ``lengths``, ascending
            within a pack; packs in output order (shuffled with the seed unless
            ``shuffle_packs=False``).
        num_bins: number of packs.
        lower_bound: L1 = ``ceil(sum(padded lengths) / capacity)``.
        utilization: real (unpadded) tokens / (``num_bins * capacity``); 0.0 for an empty plan.
        bin_loads: ``np.ndarray[int64]`` of padded tokens per pack, aligned with ``bins``.
        algorithm: the :class:`PackingAlgorithm` used.
        capacity: tokens per pack.
        pad_to_multiple_of: the multiple every length was rounded up to.
        detail: free-form diagnostics (e.g. ``winner``, the portfolio member that won: ``"bfd"``,
            ``"mffd"``, ``"ffd"`` or ``"mbs"`` = minimum bin slack).
    """

    bins: list
    num_bins: int
    lower_bound: int
    utilization: float
    bin_loads: np.ndarray
    algorithm: PackingAlgorithm
    capacity: int
    pad_to_multiple_of: int = 1
    detail: dict = field(default_factory=dict)

    @property
    def load_spread(self) -> int:
        """max - min padded pack load (tokens); 0 for <= 1 pack."""
        if self.num_bins == 0:
            return 0
        return int(self.bin_loads.max() - self.bin_loads.min())

    def bin_ids(self, n: int | None = None) -> np.ndarray:
        """``int64[n]``: the pack (position in ``bins``) of each input index."""
        n = sum(len(b) for b in self.bins) if n is None else n
        out = np.full(n, -1, np.int64)
        for j, b in enumerate(self.bins):
            out[b] = j
        return out


# ---------------------------------------------------------------------------------------------
# validation and bounds
# ---------------------------------------------------------------------------------------------
_OVERLENGTH_HINT = (
    "Over-length samples must be handled upstream: seqpack.data.prepare(..., "
    "overlength='truncate'|'drop'|'split'|'error') before packing."
)


def _as_int(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


def _validate_lengths(lengths) -> np.ndarray:
    if isinstance(lengths, (set, frozenset, dict, str, bytes)):
        raise TypeError(
            f"lengths must be an ordered 1-D sequence of integer token counts (list, tuple, numpy array, "
            f"generator ...), got {type(lengths).__name__}; plan indices refer to positions, so a "
            f"{type(lengths).__name__} has none"
        )
    arr = np.asarray(lengths)
    if arr.ndim == 0 and arr.dtype == object and hasattr(lengths, "__iter__"):
        # a generator / iterator / other iterable: numpy wraps it as a 0-d object array
        arr = np.asarray(list(lengths))
    if arr.ndim != 1:
        what = (f"a single value {lengths!r}" if arr.ndim == 0
                else f"an array of shape {arr.shape}")
        raise ValueError(
            f"lengths must be a 1-D sequence of integer token counts (list, numpy array or any iterable of "
            f"ints), got {what}"
        )
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"lengths must have an integer dtype (token counts), got dtype {arr.dtype}; "
            "convert with np.asarray(lengths, dtype=np.int64) if the values are whole numbers"
        )
    if arr.dtype == np.uint64 and arr.max() > np.iinfo(np.int64).max:
        bad = np.flatnonzero(arr > np.iinfo(np.int64).max)[:5]
        raise ValueError(f"lengths too large at indices {bad.tolist()}: {arr[bad].tolist()}")
    return arr.astype(np.int64, copy=False)


def _round_up(arr: np.ndarray, multiple: int) -> np.ndarray:
    # same semantics as seqpack.padding.round_up (not imported: algorithms is the bottom layer)
    return -(-arr // multiple) * multiple


def lower_bound_l1(lengths, capacity: int) -> int:
    """L1 = ``ceil(sum(lengths) / capacity)``: no packing can use fewer packs.

    Args:
        lengths: 1-D integer array-like of (already padded) lengths, tokens.
        capacity: tokens per pack, >= 1.
    Returns:
        int >= 0.
    """
    capacity = _as_int("capacity", capacity)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    arr = _validate_lengths(lengths)
    return int(-(-int(arr.sum()) // capacity))


def lower_bound_l2(lengths, capacity: int) -> int:
    """Martello & Toth (1990) bound L2 >= L1, exact for integer lengths in [1, capacity].

    For every k in [0, C/2]: items > C-k each need their own pack (J1); items in (C/2, C-k]
    also (J2) and leave ``|J2|*C - sum(J2)`` room that only items in [k, C/2] (J3) can use;
    ``L(k) = |J1| + |J2| + max(0, ceil((sum(J3) - (|J2|*C - sum(J2))) / C))`` and
    ``L2 = max_k L(k)``. O(n + C) with prefix sums over values.

    Args:
        lengths: 1-D integer array-like of (already padded) lengths in [1, capacity], tokens.
        capacity: tokens per pack, >= 1.
    Returns:
        int >= 0.
    Raises:
        ValueError: a length outside [1, capacity].
    """
    capacity = _as_int("capacity", capacity)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    arr = _validate_lengths(lengths)
    if arr.size == 0:
        return 0
    _check_range(arr, arr, capacity, 1)
    C = capacity
    cnt = np.bincount(arr, minlength=C + 1).astype(np.int64)
    pc = np.cumsum(cnt)  # items <= v
    ps = np.cumsum(cnt * np.arange(C + 1, dtype=np.int64))  # sum of items <= v
    half = C // 2  # items > C/2  <=>  v > half
    k = np.arange(0, half + 1, dtype=np.int64)
    n_all, s_all = pc[C], ps[C]
    # J1: v > C-k
    j1 = n_all - pc[C - k]
    # J2: half < v <= C-k
    j2n = pc[C - k] - pc[half]
    j2s = ps[C - k] - ps[half]
    # J3: k <= v <= half
    km1 = np.maximum(k - 1, 0)
    j3s = ps[half] - np.where(k > 0, ps[km1], 0)
    room = j2n * C - j2s
    extra = np.maximum(0, -(-(j3s - room) // C))
    lk = j1 + j2n + extra
    l1 = -(-int(s_all) // C)
    return int(max(l1, int(lk.max())))


def _check_range(padded: np.ndarray, raw: np.ndarray, capacity: int, multiple: int) -> None:
    bad = np.flatnonzero((raw < 1) | (padded > capacity))
    if bad.size:
        first = bad[:5]
        vals = raw[first].tolist()
        more = f" (and {bad.size - first.size} more)" if bad.size > first.size else ""
        pad = f" after rounding up to pad_to_multiple_of={multiple}" if multiple > 1 else ""
        raise ValueError(
            f"lengths must be in [1, capacity={capacity}]{pad}; offending indices {first.tolist()} "
            f"with lengths {vals}{more}. {_OVERLENGTH_HINT}"
        )


def check_plan(plan: PackingPlan, lengths) -> None:
    """Assert the packing invariants: every index in exactly one pack, no pack over capacity,
    ``bin_loads`` equal to the padded sums. Raises AssertionError naming the violation."""
    arr = _round_up(_validate_lengths(lengths), plan.pad_to_multiple_of)
    n = arr.size
    seen = np.zeros(n, np.int64)
    assert len(plan.bins) == plan.num_bins == len(plan.bin_loads)
    for j, b in enumerate(plan.bins):
        assert b.dtype == np.int64, b.dtype
        np.add.at(seen, b, 1)
        load = int(arr[b].sum())
        assert load == plan.bin_loads[j], (j, load, plan.bin_loads[j])
        assert load <= plan.capacity, f"pack {j} load {load} > capacity {plan.capacity}"
        assert len(b) > 0, f"pack {j} is empty"
    bad = np.flatnonzero(seen != 1)
    assert bad.size == 0, f"indices not packed exactly once: {bad[:10].tolist()}"


# ---------------------------------------------------------------------------------------------
# algorithm implementations (sizes in pad-multiple units, capacity `cap` in the same units)
# ---------------------------------------------------------------------------------------------
_EMPTY = np.zeros(0, np.int64)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, stream])


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


#: Portfolio policy of ``balanced_best_fit``: the portfolio runs when BFD is above L2 and either
#: the input is small (<= PORTFOLIO_ALWAYS_ITEMS) or BFD is more than PORTFOLIO_GAP * L2 packs
#: above L2 (on 1M SFT lengths BFD lands at L1 + 2, where the portfolio would only cost time).
PORTFOLIO_ALWAYS_ITEMS = 200_000
PORTFOLIO_GAP = 1e-4
#: Minimum-bin-slack member: search steps per pack, and when it runs (few items, or few distinct sizes).
MIN_SLACK_BUDGET = 2000
MIN_SLACK_MAX_ITEMS = 200_000
MIN_SLACK_MAX_DISTINCT = 256


def _n_distinct(sizes, cap) -> int:
    return int(np.count_nonzero(np.bincount(sizes, minlength=cap + 1)))


def _pack_balanced_best_fit(sizes, cap, seed, detail=None):
    """Default. Best fit decreasing, then "sand" leveling, with a portfolio guard.

    1. BFD (see ``best_fit_decreasing``): on SFT-like length mixes this already reaches
       L1 (or L1 + a handful) packs, with all packs full except a few at the tail.
    2. If that is above the Martello–Toth bound L2 (and the input has <= 200k items or BFD is
       more than 0.01% above L2), also run MFFD, FFD and Minimum Bin Slack (Gupta & Ho 1999,
       bounded DFS; only for <= 200k items or <= 256 distinct lengths) and keep the fewest packs
       (BFD wins ties), so on small inputs the default never uses more packs than FFD.
    3. Leveling: with F = min(max_load - C/200, floor(mean load)), every pack below F receives,
       largest first, short samples ("sand") taken from packs that stay >= F; where sand runs
       out, it swaps one of its samples for a slightly longer one from such a pack (chains of
       swaps). The pack count and the maximum load never change. On SFT mixes this brings the
       load spread (max - min) to <= 0.5% of C (20 tokens at C = 4096).
    Optimises: pack count first, then equal loads. O(n log C) (+ the portfolio when step 1 is
    not provably optimal)."""
    bin_of, nb = K.best_fit(sizes, K.desc_order(sizes, cap), cap)
    winner = "bfd"
    l2 = None
    l1 = -(-int(sizes.sum()) // cap)
    if nb > l1:
        l2 = lower_bound_l2(sizes, cap)
        if nb > l2 and (sizes.size <= PORTFOLIO_ALWAYS_ITEMS or nb - l2 > PORTFOLIO_GAP * l2):
            cands = [("mffd", lambda: K.mffd(sizes, cap)),
                     ("ffd", lambda: K.first_fit(sizes, K.desc_order(sizes, cap), cap, _EMPTY))]
            if sizes.size <= MIN_SLACK_MAX_ITEMS or _n_distinct(sizes, cap) <= MIN_SLACK_MAX_DISTINCT:
                # "mbs" (minimum bin slack, not micro-batch size): the label reported in detail["winner"]
                cands.append(("mbs", lambda: K.min_slack(sizes, cap, MIN_SLACK_BUDGET)))
            for name, fn in cands:
                b2, n2 = fn()
                if n2 < nb:
                    bin_of, nb, winner = b2, n2, name
                if nb <= l2:
                    break
    moved = K.level(sizes, bin_of, nb, cap, _level_tol(cap))
    if detail is not None:
        detail.update(winner=winner, leveled_moves=int(moved), lower_bound_l2_units=l2)
    return bin_of, nb


_IMPL = {
    PackingAlgorithm.concatenative: _pack_concatenative,
    PackingAlgorithm.first_fit_decreasing: _pack_first_fit_decreasing,
    PackingAlgorithm.first_fit_shuffle: _pack_first_fit_shuffle,
    PackingAlgorithm.best_fit_decreasing: _pack_best_fit_decreasing,
    PackingAlgorithm.modified_first_fit_decreasing: _pack_modified_first_fit_decreasing,
    PackingAlgorithm.greedy_knapsack: _pack_greedy_knapsack,
    PackingAlgorithm.balanced_greedy_knapsack: _pack_balanced_greedy_knapsack,
    PackingAlgorithm.randomized_best_fit: _pack_randomized_best_fit,
    PackingAlgorithm.balanced_best_fit: _pack_balanced_best_fit,
}


def resolve_algorithm(algorithm: PackingAlgorithm | str | None, *, error: type[Exception] = ValueError) -> PackingAlgorithm:
    """The one resolver of algorithm names: enum, name or ``None`` -> :class:`PackingAlgorithm`.

    Names are matched case-insensitively with ``-`` read as ``_`` (``"first-fit-decreasing"`` is
    ``first_fit_decreasing``); ``None`` is :data:`DEFAULT_ALGORITHM`.

    Args:
        algorithm: a :class:`PackingAlgorithm`, its name, or ``None``.
        error: the exception class raised for an unknown name (a ``ValueError`` subclass of the
            calling layer, e.g. ``PackConfigError``).

    Raises:
        error: unknown name; the message suggests the closest name and lists every valid one.

    Example:
        >>> resolve_algorithm("First-Fit-Decreasing")
        <PackingAlgorithm.first_fit_decreasing: 'first_fit_decreasing'>
    """
    if algorithm is None:
        return DEFAULT_ALGORITHM
    if isinstance(algorithm, PackingAlgorithm):
        return algorithm
    try:
        return PackingAlgorithm(str(algorithm).lower().replace("-", "_"))
    except ValueError:
        names = [a.value for a in PackingAlgorithm]
        close = difflib.get_close_matches(str(algorithm), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise error(f"unknown packing algorithm {algorithm!r}{hint}; choose one of: {', '.join(names)}") from None


def pack_lengths(
    lengths,
    capacity: int,
    algorithm: PackingAlgorithm | str = DEFAULT_ALGORITHM,
    *,
    seed: int = 0,
    pad_to_multiple_of: int = 1,
    shuffle_packs: bool = True,
) -> PackingPlan:
    """Pack sample lengths into packs of at most ``capacity`` tokens.

    Args:
        lengths: 1-D list/array of integer token counts (any int dtype), each in [1, capacity], or
            any ordered iterable of ints (a generator is consumed once); sets/dicts are refused.
        capacity: tokens per pack (the packed row length, ``seq_length``), any integer >= 1.
        algorithm: a :class:`PackingAlgorithm` or its name; default :data:`DEFAULT_ALGORITHM`
            (``balanced_best_fit``).
        seed: seeds the randomized algorithms and the pack-order shuffle; same seed, same plan.
        pad_to_multiple_of: every length is first rounded up to this multiple
            (``seqpack.padding.round_up`` semantics, ``-(-x // m) * m``); pass the value of
            ``seqpack.padding.compute_pad_multiple(...)``. ``capacity`` must be divisible by it.
        shuffle_packs: shuffle the order of the packs with ``seed`` (default). Length-sorted
            algorithms otherwise emit the packs holding the longest samples first, which users
            report hurts the training loss curve. ``False`` keeps the algorithm's pack order.

    Returns:
        :class:`PackingPlan`; packs hold input indices (int64, ascending within a pack), loads
        are padded token counts. Empty input gives an empty plan.

    Raises:
        TypeError: non-integer ``lengths`` dtype, unordered ``lengths`` (set, dict), or non-integer
            ``capacity``/``pad_to_multiple_of``.
        ValueError: ``lengths`` not 1-D (a scalar, a 2-D array); a length < 1 or > capacity (names the first offending
            indices and values; the over-length policy lives upstream in ``seqpack.data``,
            ``overlength=truncate|drop|split|error``); ``capacity`` < 1; ``pad_to_multiple_of`` < 1;
            ``capacity % pad_to_multiple_of != 0``; ``capacity // pad_to_multiple_of`` above
            :data:`MAX_CAPACITY_UNITS`; unknown algorithm name.
    """
    capacity = _as_int("capacity", capacity)
    multiple = _as_int("pad_to_multiple_of", pad_to_multiple_of)
    seed = _as_int("seed", seed)
    algo = resolve_algorithm(algorithm)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if multiple < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {multiple}")
    check_seq_length(capacity, multiple, {"pad_to_multiple_of": multiple}, name="capacity")
    if capacity // multiple > MAX_CAPACITY_UNITS:
        raise ValueError(
            f"capacity={capacity} / pad_to_multiple_of={multiple} = {capacity // multiple} units "
            f"exceeds the supported {MAX_CAPACITY_UNITS} (the kernels keep O(capacity) tables); "
            "use a larger pad_to_multiple_of"
        )
    raw = _validate_lengths(lengths)
    if raw.size == 0:
        return PackingPlan([], 0, 0, 0.0, np.zeros(0, np.int64), algo, capacity, multiple)
    padded = _round_up(raw, multiple) if multiple > 1 else raw
    _check_range(padded, raw, capacity, multiple)
    units = padded // multiple if multiple > 1 else padded
    units = np.ascontiguousarray(units, dtype=np.int64)
    cap = capacity // multiple
    detail: dict = {}
    if algo is PackingAlgorithm.balanced_best_fit:
        bin_of, nb = _pack_balanced_best_fit(units, cap, seed, detail)
    else:
        bin_of, nb = _IMPL[algo](units, cap, seed)
    nb = int(nb)
    off, items = K.csr_by_bin(bin_of, nb)
    if nb and np.any(off[1:] == off[:-1]):  # drop packs a kernel left empty (none should)
        keep = np.flatnonzero(off[1:] > off[:-1])
        bin_of = np.searchsorted(keep, bin_of).astype(np.int64)
        nb = int(keep.size)
        off, items = K.csr_by_bin(bin_of, nb)
    loads = K.loads_of(padded, bin_of, nb)
    if shuffle_packs and nb > 1:
        perm = _rng(seed, 2).permutation(nb)
    else:
        perm = np.arange(nb)
    bins = [items[off[b]:off[b + 1]] for b in perm.tolist()]
    total_pad = int(padded.sum())
    return PackingPlan(
        bins=bins,
        num_bins=nb,
        lower_bound=-(-total_pad // capacity),
        utilization=float(raw.sum()) / (nb * capacity),
        bin_loads=loads[perm],
        algorithm=algo,
        capacity=capacity,
        pad_to_multiple_of=multiple,
        detail=detail,
    )
