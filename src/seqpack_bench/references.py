"""Existing packers that seqpack is compared with, run on the same lengths in the same process.

- **TRL** (``trl.data_utils.pack_dataset``, installed from PyPI, ``trl`` 1.16): strategies ``"bfd"``
  (best-fit decreasing, keeps sample boundaries) and ``"wrapped"`` (concatenate and cut every
  ``seq_length`` tokens; breaks samples, so its pack count is the L1 bound by construction). TRL works
  on a ``datasets.Dataset``: the lengths become an Arrow ``large_list<int32>`` column of dummy token
  ids, as in a tokenized SFT set.
- **LLaMA-Factory** ``greedy_knapsack`` (``llamafactory`` 0.9.5 from PyPI, installed with
  ``--no-deps``): the function of ``llamafactory/data/processor/processor_utils.py`` is run as
  installed, with the length-to-index mapping of its ``PackedSupervisedDatasetProcessor``
  (``length2indexes[length].pop()``). ``llamafactory`` pins its own torch/transformers/peft/trl/gradio
  versions and importing ``llamafactory.data`` loads its whole data stack, so the one file is loaded
  by path from the installed distribution (:func:`load_installed_file`; that file only imports
  ``bisect``, ``abc``, ``dataclasses`` and ``typing`` at run time). It is pure Python: it sorts the
  lengths ascending, then fills one pack at a time by repeatedly taking the largest length that still
  fits (``bisect``, ``list.pop``), and opens the next pack when nothing fits; ``list.pop`` makes it
  O(n^2) in the worst case, but on SFT length mixes most pops take items near the end of the list,
  so it runs in 3 to 5 s for 1,000,000 lengths (measured: 2.97 s and, on a busier run, 5.1 s).
- :func:`llamafactory_greedy_knapsack`, a *reference re-implementation* of the same algorithm (named
  ``llamafactory_greedy_knapsack (reference)``), used only when ``llamafactory`` is not installed;
  a test checks that it gives exactly the installed function's packs.
- **Megatron-Bridge** ``create_packing_strategy`` (``megatron-bridge`` 0.3.1 from PyPI, installed with
  ``--no-deps``; NeMo 2's ``nemo/utils/sequence_packing_utils.py`` is the same code):
  ``first_fit_decreasing`` and ``first_fit_shuffle`` (Bridge's default) on the length histogram, as
  Bridge's offline packed-SFT preparation calls them. ``packing_utils.py`` is loaded by path from the
  installed distribution (it needs only ``numpy`` and ``tqdm``). Its first fit scans every open pack
  and re-sums its items for every sample: O(n * packs * items per pack), about 2.4 s at 20,000
  lengths and about a minute at 100,000, so the benchmark caps it (``max_bridge_n``).

- **seqpacker** 0.1.3 (Rust, PyPI; a benchmark peer, never a dependency): every strategy of
  ``seqpacker.Packer(capacity, strategy=..., seed=...)`` through its public ``pack_flat`` (flat item
  ids plus ``np.split`` bin boundaries, its fastest output). It is imported lazily
  (:func:`seqpacker_module`) and installed by ``bash ../shared/tools/install-seqpacker.sh`` (it publishes
  no manylinux wheel). Every result is checked before it is counted (:func:`check_flat_bins`: each
  index packed exactly once, no bin over capacity); one that fails is refused (:class:`PeerResultError`).

Install the two PyPI baselines (CI does; the benchmark records a skip when one is missing)::

    pip install --no-deps llamafactory==0.9.5 megatron-bridge==0.3.1
"""

from __future__ import annotations

import bisect
import importlib.metadata
import importlib.util
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np

__all__ = [
    "BASELINE_INSTALL",
    "ReferenceUnavailable",
    "load_installed_file",
    "llamafactory_installed",
    "llamafactory_installed_greedy_knapsack",
    "llamafactory_greedy_knapsack",
    "megatron_bridge_installed",
    "megatron_bridge_packing",
    "SEQPACKER_INSTALL",
    "SEQPACKER_STRATEGIES",
    "PeerResultError",
    "seqpacker_module",
    "seqpacker_pack",
    "check_flat_bins",
    "trl_available",
    "trl_lengths_dataset",
    "trl_pack",
    "loads_from_trl",
]

LLAMAFACTORY_NAME = "llamafactory_greedy_knapsack (reference)"
BASELINE_INSTALL = "pip install --no-deps llamafactory==0.9.5 megatron-bridge==0.3.1"
_LLAMAFACTORY_FILE = ("llamafactory", "llamafactory/data/processor/processor_utils.py")
_BRIDGE_FILE = ("megatron-bridge", "megatron/bridge/data/datasets/packing_utils.py")
BRIDGE_ALGORITHMS = ("first_fit_decreasing", "first_fit_shuffle")
_loaded: dict[tuple[str, str], ModuleType] = {}
SEQPACKER_INSTALL = "bash ../shared/tools/install-seqpacker.sh"
#: seqpacker 0.1.3's strategy names (``seqpacker.Packer.strategies()``), in its order; ``hk``
#: (Harmonic-K) is O(n * open packs): 0.5 s at 200,000 lengths, 20 s at 1,000,000.
SEQPACKER_STRATEGIES = ("nf", "ff", "bf", "wf", "ffd", "bfd", "ffs", "mffd", "obfd", "obfdp", "hk")


class ReferenceUnavailable(RuntimeError):
    """An installed baseline (a PyPI distribution or one of its files) is missing."""


def load_installed_file(distribution: str, relpath: str) -> ModuleType:
    """Load one ``.py`` file of an installed distribution as a standalone module (cached).

    The file is executed by path (``importlib.util.spec_from_file_location``), so its package's
    ``__init__`` modules are *not* run: this is how a single algorithm file of a framework with heavy,
    conflicting pins (LLaMA-Factory, Megatron-Bridge) is run as published, without its stack.
    The file's own top-level imports must be importable.

    Args:
        distribution: the PyPI distribution name (``"llamafactory"``, ``"megatron-bridge"``).
        relpath: the file's path inside site-packages, as listed in the distribution's ``RECORD``.

    Returns:
        the executed module; ``module.__version__`` is set to the distribution's version.

    Raises:
        ReferenceUnavailable: the distribution is not installed or does not ship ``relpath``
            (the message gives the install command).
    """
    key = (distribution, relpath)
    if key in _loaded:
        return _loaded[key]
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ReferenceUnavailable(f"{distribution} is not installed; install the baselines with: "
                                   f"{BASELINE_INSTALL}") from None
    path = Path(str(dist.locate_file(relpath)))
    if not path.is_file():
        raise ReferenceUnavailable(f"{distribution} {dist.version} has no {relpath}; install the pinned "
                                   f"version: {BASELINE_INSTALL}")
    name = "seqpack_baseline_" + distribution.replace("-", "_") + "_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    module.__version__ = dist.version
    _loaded[key] = module
    return module


def _available(distribution: str, relpath: str) -> str | None:
    try:
        return load_installed_file(distribution, relpath).__version__
    except Exception:  # noqa: BLE001 - missing, or its imports fail: not available
        return None


def llamafactory_installed() -> str | None:
    """The installed ``llamafactory`` version when its ``greedy_knapsack`` file loads, else ``None``."""
    return _available(*_LLAMAFACTORY_FILE)


def megatron_bridge_installed() -> str | None:
    """The installed ``megatron-bridge`` version when its ``packing_utils`` file loads, else ``None``."""
    return _available(*_BRIDGE_FILE)


def _check_lengths(lengths: Sequence[int], capacity: int) -> list[int]:
    lens = [int(x) for x in lengths]
    if lens and max(lens) > capacity:
        raise ValueError(f"length {max(lens)} > capacity {capacity}; truncate before packing")
    if lens and min(lens) < 1:
        raise ValueError(f"length {min(lens)} < 1; every sample has at least one token")
    return lens


def _lengths_to_indices(lengths: list[int], packs_of_lengths: list[list[int]]) -> list[list[int]]:
    """LLaMA-Factory's mapping back from packed lengths to sample indices (``length2indexes[n].pop()``)."""
    length2indexes: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(lengths):
        length2indexes[n].append(i)
    return [[length2indexes[n].pop() for n in pack] for pack in packs_of_lengths]


def llamafactory_installed_greedy_knapsack(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """LLaMA-Factory's own ``greedy_knapsack`` (installed ``llamafactory``), as its packed SFT processor runs it.

    Args:
        lengths: sample lengths in tokens (each in ``[1, capacity]``).
        capacity: tokens per pack (LLaMA-Factory ``cutoff_len``).

    Returns:
        packs as lists of indices into ``lengths`` (every index exactly once), in LLaMA-Factory's
        order and with its ``length2indexes[length].pop()`` index choice among equal lengths.

    Raises:
        ReferenceUnavailable: ``llamafactory`` is not installed.
        ValueError: a length outside ``[1, capacity]`` (LLaMA-Factory drops those before packing).
    """
    mod = load_installed_file(*_LLAMAFACTORY_FILE)
    lens = _check_lengths(lengths, capacity)
    return _lengths_to_indices(lens, mod.greedy_knapsack(list(lens), capacity))


def megatron_bridge_packing(lengths: Sequence[int], capacity: int, algorithm: str = "first_fit_shuffle",
                            *, seed: int = 0) -> np.ndarray:
    """Megatron-Bridge's ``create_packing_strategy`` (installed ``megatron-bridge``) on these lengths.

    Bridge builds a histogram of lengths (its ``create_hist`` counts ``len(input_ids) - 1``, the
    runtime length, case B12; here ``lengths`` are taken as those runtime lengths) and packs the
    expanded list with ``first_fit_decreasing`` or ``first_fit_shuffle`` (Bridge's default,
    which shuffles with NumPy's global RNG: seeded here with ``np.random.seed(seed)``, and the
    previous global state restored afterwards).

    Args:
        lengths: sample lengths in tokens (each in ``[1, capacity]``).
        capacity: tokens per pack (Bridge ``pack_size``).
        algorithm: ``"first_fit_decreasing"`` or ``"first_fit_shuffle"``.
        seed: seed of the shuffle.

    Returns:
        int64 ``[num_packs]``: the token load of every pack. Bridge's assignments hold lengths, not
        sample indices (its ``fill_packing_strategy`` maps them back per length bucket).

    Raises:
        ReferenceUnavailable: ``megatron-bridge`` is not installed.
        ValueError: unknown ``algorithm``, or a length outside ``[1, capacity]``.
    """
    if algorithm not in BRIDGE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {BRIDGE_ALGORITHMS}, got {algorithm!r}")
    mod = load_installed_file(*_BRIDGE_FILE)
    lens = _check_lengths(lengths, capacity)
    histogram = np.bincount(np.asarray(lens, dtype=np.int64), minlength=capacity + 1).tolist()
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        assignments, _meta = mod.create_packing_strategy(histogram, capacity, algorithm)
    finally:
        np.random.set_state(state)
    return np.array([sum(b) for b in assignments], dtype=np.int64)


def llamafactory_greedy_knapsack(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """LLaMA-Factory's greedy knapsack packing (reference re-implementation, see module docstring).

    Used when ``llamafactory`` is not installed; :func:`llamafactory_installed_greedy_knapsack` runs
    the published function itself.

    Args:
        lengths: sample lengths in tokens (each in ``[1, capacity]``).
        capacity: tokens per pack (LLaMA-Factory ``cutoff_len``).

    Returns:
        packs as lists of indices into ``lengths`` (every index exactly once).

    Raises:
        ValueError: a length outside ``[1, capacity]`` (LLaMA-Factory drops those before packing).
    """
    lens = _check_lengths(lengths, capacity)
    numbers = sorted(lens)  # ascending, for the binary search
    knapsacks: list[list[int]] = []
    while numbers:
        current: list[int] = []
        remaining = capacity
        while True:
            j = bisect.bisect(numbers, remaining)  # largest number <= remaining sits at j - 1
            if j == 0:
                break
            remaining -= numbers[j - 1]
            current.append(numbers.pop(j - 1))
        knapsacks.append(current)
    return _lengths_to_indices(lens, knapsacks)


class PeerResultError(ValueError):
    """A peer packer's result is not a packing of the input (an index lost or repeated, a bin over capacity).

    Attributes:
        program: the peer's name; fault: what is wrong, with the rule it breaks.
    """

    def __init__(self, program: str, fault: str) -> None:
        super().__init__(f"{program}: result refused: {fault}")
        self.program, self.fault = program, fault


def seqpacker_module() -> ModuleType | None:
    """The ``seqpacker`` module when ``import seqpacker`` works, else ``None`` (imported here, lazily)."""
    try:
        import seqpacker
    except Exception:  # noqa: BLE001 - missing, or its Rust extension fails to load: not available
        return None
    return seqpacker


def seqpacker_pack(mod: ModuleType, lengths: np.ndarray, capacity: int, strategy: str,
                   *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``mod.Packer(capacity, strategy=strategy, seed=seed).pack_flat(lengths)``: seqpacker's public API.

    Returns:
        ``(items, offsets)``: int64 ``[n]`` item ids in pack order and int64 ``[packs - 1]`` boundaries
        (``np.split(items, offsets)`` gives the packs), unchecked (see :func:`check_flat_bins`).

    Raises:
        ValueError: seqpacker refuses the strategy or a length.
    """
    return mod.Packer(capacity, strategy=strategy, seed=seed).pack_flat(lengths)


def check_flat_bins(items: Any, offsets: Any, lengths: np.ndarray, capacity: int, *, program: str) -> np.ndarray:
    """Check a flat packing (``np.split(items, offsets)`` are the packs) and return its pack loads.

    Args:
        items: item ids (indices into ``lengths``) in pack order.
        offsets: increasing pack boundaries into ``items`` (``packs - 1`` of them).
        lengths: int ``[n]`` tokens per item.
        capacity: tokens per pack.
        program: the peer's name, quoted in the error.

    Returns:
        int64 ``[packs]``: tokens per pack.

    Raises:
        PeerResultError: an index outside ``[0, n)``, an index packed zero or several times, an empty or
            misplaced boundary, or a pack over ``capacity`` (the message names ``program`` and the fault).
    """
    lengths = np.asarray(lengths, np.int64)
    items, offsets = np.asarray(items, np.int64).ravel(), np.asarray(offsets, np.int64).ravel()
    n = lengths.shape[0]

    def refuse(fault: str) -> PeerResultError:
        return PeerResultError(program, f"{fault} (every index must be packed exactly once, no pack over "
                                        f"capacity {capacity})")

    if items.size and (items.min() < 0 or items.max() >= n):
        raise refuse(f"index {int(items.min() if items.min() < 0 else items.max())} is outside [0, {n})")
    counts = np.bincount(items, minlength=n)
    bad = np.flatnonzero(counts != 1)
    if bad.size:
        raise refuse(f"index {int(bad[0])} packed {int(counts[bad[0]])} times ({bad.size:,} indices wrong)")
    bounds = np.concatenate(([0], offsets, [items.size]))
    if np.any(np.diff(bounds) <= 0):
        raise refuse("an empty pack or a misplaced boundary in offsets")
    csum = np.concatenate(([0], np.cumsum(lengths[items])))
    loads = csum[bounds[1:]] - csum[bounds[:-1]]
    if loads.max() > capacity:
        j = int(np.argmax(loads))
        raise refuse(f"pack {j} holds {int(loads[j])} tokens > capacity {capacity}")
    return loads


def trl_available() -> bool:
    """True when ``trl.data_utils.pack_dataset`` and ``datasets`` import."""
    try:
        import datasets  # noqa: F401
        from trl.data_utils import pack_dataset  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


def trl_lengths_dataset(lengths: np.ndarray) -> Any:
    """A ``datasets.Dataset`` with one ``input_ids`` row of dummy int32 ids per length.

    Memory: ``4 * sum(lengths)`` bytes (about 1.6 GB for 1,000,000 lognormal SFT lengths).
    """
    import pyarrow as pa
    from datasets import Dataset

    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.zeros(lengths.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.zeros(int(offsets[-1]), np.int32))
    col = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    return Dataset(pa.table({"input_ids": col}))


def trl_pack(ds: Any, capacity: int, strategy: str) -> Any:
    """``trl.data_utils.pack_dataset(ds, capacity, strategy=strategy)`` with progress bars off."""
    import datasets
    from trl.data_utils import pack_dataset

    datasets.disable_progress_bars()
    return pack_dataset(ds, capacity, strategy=strategy)


def loads_from_trl(packed: Any) -> np.ndarray:
    """Token load of every pack of a TRL-packed dataset (int64 ``[num_packs]``)."""
    import pyarrow.compute as pc

    col = packed.data.table.column("input_ids")
    return np.asarray(pc.list_value_length(col).to_numpy(zero_copy_only=False), dtype=np.int64)
