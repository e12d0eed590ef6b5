"""The packing plan and its checks: :class:`PackingPlan`, the lower bounds L1 / L2, input validation.

Pure numpy; imports nothing of seqpack. :func:`seqpack.algorithms.pack_lengths` builds the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from seqpack.algorithms.core import PackingAlgorithm

__all__ = ["MAX_CAPACITY_UNITS", "PackingPlan", "lower_bound_l1", "lower_bound_l2", "lower_bound_l2_counts",
           "check_plan"]

#: Largest ``capacity // pad_to_multiple_of`` accepted: the kernels index tables by length
#: (counting sort, best-fit buckets), O(capacity) memory: 2**24 units is ~300 MB.
MAX_CAPACITY_UNITS = 1 << 24


@dataclass
class PackingPlan:
    """Result of :func:`pack_lengths`.

    Attributes:
        bins: one ``np.ndarray[int64]`` per pack: indices into the input ``lengths``, ascending
            within a pack; packs in output order (shuffled with the seed unless
            ``shuffle_packs=False``). :func:`pack_lengths` keeps the packs as flat arrays and
            builds this list on first access (a list of views, ~0.1-0.2 us per pack);
            :meth:`flat_bins` and :meth:`bin_ids` read the flat arrays directly.
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

    def __post_init__(self) -> None:
        if isinstance(self.bins, _FlatPacks):  # built lazily by __getattr__
            self.__dict__["_flat"] = self.__dict__.pop("bins")

    def __getattr__(self, name: str):
        flat = self.__dict__.get("_flat") if name == "bins" else None
        if flat is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        items, off, perm = flat
        bins = [items[off[b]:off[b + 1]] for b in perm.tolist()]
        self.__dict__["bins"] = bins
        return bins

    def flat_bins(self) -> tuple[np.ndarray, np.ndarray]:
        """``(items int64[n], offsets int64[num_bins + 1])``: pack ``j`` (position in ``bins``) is
        ``items[offsets[j]:offsets[j + 1]]``, the same indices as ``bins[j]``."""
        flat = self.__dict__.get("_flat")
        if flat is None or "bins" in self.__dict__:
            sizes = np.fromiter((len(b) for b in self.bins), np.int64, len(self.bins))
            offsets = np.zeros(sizes.size + 1, np.int64)
            np.cumsum(sizes, out=offsets[1:])
            items = np.concatenate(self.bins) if self.bins else np.zeros(0, np.int64)
            return items.astype(np.int64, copy=False), offsets
        items, off, perm = flat
        sizes = (off[1:] - off[:-1])[perm]
        offsets = np.zeros(perm.size + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if perm.size and np.array_equal(perm, np.arange(perm.size)):
            return items, offsets
        starts = off[:-1][perm]
        gather = np.repeat(starts - offsets[:-1], sizes) + np.arange(items.size, dtype=np.int64)
        return items[gather], offsets

    @property
    def load_spread(self) -> int:
        """max - min padded pack load (tokens); 0 for <= 1 pack."""
        if self.num_bins == 0:
            return 0
        return int(self.bin_loads.max() - self.bin_loads.min())

    def bin_ids(self, n: int | None = None) -> np.ndarray:
        """``int64[n]``: the pack (position in ``bins``) of each input index (-1 if unpacked)."""
        items, offsets = self.flat_bins()
        n = items.size if n is None else n
        out = np.full(n, -1, np.int64)
        out[items] = np.repeat(np.arange(offsets.size - 1, dtype=np.int64), np.diff(offsets))
        return out


class _FlatPacks(tuple):
    """``(items, offsets, perm)``: packs as CSR arrays in kernel order, ``perm`` the output order;
    passed as ``PackingPlan.bins`` to have the list built on first access."""


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
    return lower_bound_l2_counts(np.bincount(arr, minlength=capacity + 1), capacity)


def lower_bound_l2_counts(cnt: np.ndarray, capacity: int) -> int:
    """:func:`lower_bound_l2` from a length histogram: ``cnt[v]`` = number of lengths equal to ``v``,
    int array of shape ``[capacity + 1]`` (``cnt[0]`` ignored). O(capacity)."""
    C = capacity
    cnt = np.asarray(cnt, np.int64).copy()
    cnt[0] = 0
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
    if raw.size and raw.min() >= 1 and padded.max() <= capacity:
        return  # two reductions instead of four array passes when every length is in range
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
