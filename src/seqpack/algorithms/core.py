"""Bin packing of sequence lengths into fixed-capacity packs (imports only the ground floor, ``seqpack.padding``).

Entry point: :func:`pack_lengths` -> :class:`PackingPlan`. Algorithms: :class:`PackingAlgorithm`.
All kernels are numba-compiled (``seqpack.algorithms._kernels``) and run in O(n + capacity),
O(n log n) or O(n log capacity) for any integer capacity (no power-of-two assumption, case B13).
"""

from __future__ import annotations

import difflib
from enum import Enum

import numpy as np

from seqpack.algorithms import _kernels as K
from seqpack.algorithms import strategies as S
from seqpack.algorithms.plan import (
    MAX_CAPACITY_UNITS,
    PackingPlan,
    _FlatPacks,
    _as_int,
    _check_range,
    _round_up,
    _validate_lengths,
    check_plan,
    lower_bound_l1,
    lower_bound_l2,
)
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
    * ``balanced_best_fit`` (default): pack count, then equal loads; O(n + C); this library
      (the packs of BFD computed per length group + "sand" leveling; an FFD/MFFD/Minimum-Bin-Slack
      portfolio when BFD is above L2 on small inputs or few distinct lengths). Measured figures:
      ``seqpack bench algorithms`` and docs/measured.md.
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


_IMPL = {
    PackingAlgorithm.concatenative: S._pack_concatenative,
    PackingAlgorithm.first_fit_decreasing: S._pack_first_fit_decreasing,
    PackingAlgorithm.first_fit_shuffle: S._pack_first_fit_shuffle,
    PackingAlgorithm.best_fit_decreasing: S._pack_best_fit_decreasing,
    PackingAlgorithm.modified_first_fit_decreasing: S._pack_modified_first_fit_decreasing,
    PackingAlgorithm.greedy_knapsack: S._pack_greedy_knapsack,
    PackingAlgorithm.balanced_greedy_knapsack: S._pack_balanced_greedy_knapsack,
    PackingAlgorithm.randomized_best_fit: S._pack_randomized_best_fit,
    PackingAlgorithm.balanced_best_fit: lambda sizes, cap, seed: S._pack_balanced_best_fit(sizes, cap, seed)[:2],
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
    csr = None
    if algo is PackingAlgorithm.balanced_best_fit:
        bin_of, nb, csr = S._pack_balanced_best_fit(units, cap, seed, detail)
    else:
        bin_of, nb = _IMPL[algo](units, cap, seed)
    nb = int(nb)
    if csr is not None:  # packs as CSR already (loads in units)
        off, items, loads = csr
        loads = loads * multiple if multiple > 1 else loads
    else:
        off, items, loads = K.csr_and_loads(bin_of, nb, padded)
    if nb and np.any(off[1:] == off[:-1]):  # drop packs a kernel left empty (none should)
        if bin_of is None:
            bin_of = np.empty(items.size, np.int64)
            bin_of[items] = np.repeat(np.arange(nb, dtype=np.int64), np.diff(off))
        keep = np.flatnonzero(off[1:] > off[:-1])
        bin_of = np.searchsorted(keep, bin_of).astype(np.int64)
        nb = int(keep.size)
        off, items, loads = K.csr_and_loads(bin_of, nb, padded)
    if shuffle_packs and nb > 1:
        perm, loads = S.pack_order(seed, raw.size, loads)
    else:
        perm = np.arange(nb)
    bins = _FlatPacks((items, off, perm))
    total_pad = int(padded.sum())
    total_raw = total_pad if padded is raw else int(raw.sum())
    return PackingPlan(
        bins=bins,
        num_bins=nb,
        lower_bound=-(-total_pad // capacity),
        utilization=float(total_raw) / (nb * capacity),
        bin_loads=loads,
        algorithm=algo,
        capacity=capacity,
        pad_to_multiple_of=multiple,
        detail=detail,
    )
