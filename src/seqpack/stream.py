"""Streaming (producer-side) packing with exact resume.

:class:`StreamingPacker` is a torch ``IterableDataset`` that reads samples from any iterable or
map-style dataset, keeps a buffer of ``packing_buffer_size`` samples, chooses packs with any
:class:`~seqpack.algorithms.PackingAlgorithm` (or a callable) and yields one pack at a time: a
:class:`~seqpack.packed.PackedSequence` (default), the list of samples, or the array of source keys.

Usage (one pack per step; ``batch_size=None`` because the packer already yields whole rows)::

    from torchdata.stateful_dataloader import StatefulDataLoader
    from seqpack.stream import StreamingPacker

    packer = StreamingPacker(samples, 4096, packing_buffer_size=1000, pad_to_multiple_of=8,
                             pad_token_id=tok.pad_token_id, seed=0)   # rank/world_size from torch.distributed
    loader = StatefulDataLoader(packer, batch_size=None, num_workers=2)
    for epoch in range(epochs):
        packer.set_epoch(epoch)
        for row in loader:              # PackedSequence; row.to_torch() for tensors
            ...
            torch.save(loader.state_dict(), "loader.pt")   # keys + RNG only, ~100 KB per worker
    # later, in a new process: loader.load_state_dict(torch.load("loader.pt")) and iterate on

How a round works (one "round" = one call of the packing algorithm):

1. the buffer is refilled to ``packing_buffer_size`` samples from this shard of the source;
2. the algorithm packs the whole buffer (lengths rounded up to ``pad_to_multiple_of``);
3. under-filled packs (load < ``carry_fill`` x capacity) are *carried over*: their samples stay in
   the buffer and meet the next round's new samples, which is what closes most of the gap between
   windowed and offline packing. At most ``carry_fraction`` of the buffer is carried, and a sample
   that has already waited ``max_wait`` rounds is never carried again (bounded latency);
4. the other packs are emitted (in random order when ``shuffle=True``).

At the end of the stream the buffer is drained completely (no assertion): every remaining sample
is packed and the last partial pack is emitted, unless ``drop_last=True``; then its samples are
counted in ``stats["dropped_last"]`` (with their keys) and logged.

Determinism and state. All randomness comes from one ``numpy.random.Generator`` (PCG64) seeded from
``(seed, epoch, rank, worker_id)`` and held in the packer's state; the epoch permutation of a
map-style source is seeded from ``(seed, epoch)`` (identical on every rank). Nothing reads a global
RNG. :meth:`StreamingPacker.state_dict` holds source keys (positions), lengths, wait counters, the
packs chosen but not yet emitted, the RNG state and counters, never sample tensors; restoring it
(also through torchdata's ``StatefulDataLoader``, which calls these methods inside each worker)
yields exactly the packs the uninterrupted run would have emitted. A state saved under other
settings (buffer size, algorithm, capacity, pad multiple, world size, rank, workers, seed, ...) is
refused with a ``ValueError`` naming every key that differs.

Sharding. With ``S = world_size * num_workers`` shards, shard ``rank * num_workers + worker_id``
reads epoch positions ``shard, shard + S, shard + 2S, ...`` so that every sample is packed by
exactly one (rank, worker). Map-style sources (``__len__`` + ``__getitem__``) are permuted per epoch
(``shuffle=True``) and restored by index; plain iterables are read in order and, on restore, replayed
up to the saved position (keys only are stored, so items still waiting in the buffer are collected
again during the replay). Every shard of a plain iterable reads the whole stream and skips the other
shards' items; for large sources prefer a map-style source, or a source that already yields only its
own part (``shard_source=False``, e.g. a Hugging Face ``IterableDataset`` in DataLoader workers).

Megatron-Energon hooks. :func:`select_samples_to_pack` and :func:`pack_selected_samples` are plain
functions, so an Energon ``TaskEncoder`` (which owns the buffer there, ``packing_buffer_size``) can
delegate to them::

    from megatron.energon import DefaultTaskEncoder
    from seqpack.stream import pack_selected_samples, select_samples_to_pack

    class PackingTaskEncoder(DefaultTaskEncoder):
        def __init__(self, capacity: int, pad_token_id: int, pad_to_multiple_of: int = 1):
            super().__init__()
            self.capacity, self.pad_token_id, self.mult = capacity, pad_token_id, pad_to_multiple_of

        def select_samples_to_pack(self, samples):
            return select_samples_to_pack(samples, capacity=self.capacity, pad_to_multiple_of=self.mult)

        def pack_selected_samples(self, samples):
            return pack_selected_samples(samples, pad_token_id=self.pad_token_id, pad_to_multiple_of=self.mult)

torch is imported here (this module is one of the torch layers, see ``architecture.md``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from seqpack.algorithms import pack_lengths, resolve_algorithm
from seqpack.padding import check_seq_length, round_up

__all__ = [
    "StreamingPacker",
    "select_samples_to_pack",
    "pack_selected_samples",
    "sample_length",
    "STATE_VERSION",
    "STREAM_DEFAULT_ALGORITHM",
]

logger = logging.getLogger(__name__)

STATE_VERSION = 1
#: The packer's default algorithm. Best-fit decreasing leaves the slack of a round in its last few
#: packs, which carry-over can then refill; "balanced" algorithms spread the slack over every pack,
#: so nothing falls under ``carry_fill`` and carry-over cannot help (measured in bench_stream.py).
STREAM_DEFAULT_ALGORITHM = "best_fit_decreasing"
OUTPUTS = ("packed", "samples", "indices")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def sample_length(item: Any) -> int:
    """Packing cost (tokens) of one item before pad rounding.

    Accepts an ``int`` (length-only items), a :class:`~seqpack.data.sample.Sample` (``.length``), an
    object or dict with ``input_ids`` or ``length``, or anything with ``len()``.

    Raises:
        TypeError: when no length can be derived (names the item's type).
    """
    if isinstance(item, (int, np.integer)):
        return int(item)
    length = getattr(item, "length", None)
    if length is not None and not callable(length):
        return int(length)
    ids = getattr(item, "input_ids", None)
    if ids is not None:
        return int(len(ids))
    if isinstance(item, dict):
        if "length" in item:
            return int(item["length"])
        if "input_ids" in item:
            return int(len(item["input_ids"]))
    try:
        return int(len(item))
    except TypeError:
        raise TypeError(
            f"cannot derive a packing length from an item of type {type(item).__name__}; pass "
            "length_fn=... (tokens per item) to the packer"
        ) from None


#: how many dropped samples a warning names (the rest are counted; full lists are in ``stats``)
_LOG_FIRST = 5


def _first_names(bad, item_of, lens, padded, keys=None) -> str:
    """``name (length L)`` of the first :data:`_LOG_FIRST` positions in ``bad``, then ``... and N more``."""
    shown = [
        f"{_sample_name(item_of(int(i)), int(keys[i]) if keys is not None else int(i))} length {int(lens[i])}"
        + (f" (padded {int(padded[i])})" if padded[i] != lens[i] else "")
        for i in bad[:_LOG_FIRST]
    ]
    more = len(bad) - len(shown)
    return "; ".join(shown) + (f"; ... and {more} more" if more > 0 else "")


def _sample_name(item: Any, key: int) -> str:
    sid = getattr(item, "sample_id", None)
    if sid is None and isinstance(item, dict):
        sid = item.get("sample_id")
    return f"source key {key}" + (f" (sample_id {sid!r})" if sid is not None else "")


def _resolve_algorithm(algorithm: Any) -> tuple[str, Callable[..., list[np.ndarray]]]:
    """Return (name used in the state fingerprint, function lengths,capacity,seed,mult -> bins)."""
    if callable(algorithm) and not isinstance(algorithm, str) and not hasattr(algorithm, "value"):
        name = getattr(algorithm, "__qualname__", None) or type(algorithm).__name__
        mod = getattr(algorithm, "__module__", "")

        def run_callable(lengths, capacity, seed, mult):
            return [np.asarray(b, dtype=np.int64) for b in algorithm(lengths, capacity, seed)]

        return f"callable:{mod}.{name}", run_callable

    algo = resolve_algorithm(algorithm)

    def run_pack_lengths(lengths, capacity, seed, mult):
        plan = pack_lengths(
            lengths, capacity, algo, seed=seed, pad_to_multiple_of=mult, shuffle_packs=False
        )
        return plan.bins

    return str(getattr(algo, "value", algo)), run_pack_lengths


def _is_map_style(source: Any) -> bool:
    if isinstance(source, torch.utils.data.IterableDataset):
        return False
    return hasattr(source, "__len__") and hasattr(source, "__getitem__")


def _to_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64).copy())


def _to_numpy(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.numpy().astype(np.int64, copy=True)
    return np.asarray(t, dtype=np.int64).copy()


# ----------------------------------------------------------------------------------------------
# Energon-style hooks
# ----------------------------------------------------------------------------------------------


def select_samples_to_pack(
    samples: Sequence[Any],
    *,
    capacity: int,
    algorithm: Any = None,
    pad_to_multiple_of: int = 1,
    seed: int = 0,
    length_fn: Callable[[Any], int] | None = None,
    overlength: str = "error",
) -> list[list[Any]]:
    """Group a buffer of samples into packs (Megatron-Energon's ``select_samples_to_pack`` hook).

    Args:
        samples: the buffer (any items; lengths from ``length_fn`` or :func:`sample_length`).
        capacity: tokens per pack (divisible by ``pad_to_multiple_of``).
        algorithm: a :class:`~seqpack.algorithms.PackingAlgorithm` (or its value), ``None`` for the
            default, or a callable ``(lengths int64[n], capacity, seed) -> list[index arrays]``.
        pad_to_multiple_of: each length is rounded up to this multiple before packing (the one
            multiple from :func:`seqpack.padding.compute_pad_multiple`).
        seed: seeds the algorithm; the result is a pure function of the inputs (Energon restores
            its own buffer and expects deterministic selection).
        length_fn: item -> tokens.
        overlength: ``"error"`` raises for an item longer than ``capacity`` (after rounding);
            ``"drop"`` leaves it out; one warning per call gives the count and names the first five
            (each drop is logged at DEBUG level).

    Returns:
        list of packs, each a list of the original items; every item appears in exactly one pack
        (or is dropped and logged under ``overlength="drop"``).

    Raises:
        ValueError: over-length item under ``overlength="error"``, bad capacity/multiple.
    """
    if overlength not in ("error", "drop"):
        raise ValueError(f"overlength must be 'error' or 'drop', got {overlength!r}")
    _check_capacity(capacity, pad_to_multiple_of)
    lf = length_fn or sample_length
    lens = np.fromiter((lf(s) for s in samples), dtype=np.int64, count=len(samples))
    padded = round_up(lens, pad_to_multiple_of) if len(lens) else lens
    bad = np.flatnonzero((padded > capacity) | (lens <= 0))
    keep = np.ones(len(samples), dtype=bool)
    for i in bad:
        msg = (
            f"{_sample_name(samples[i], int(i))} has length {int(lens[i])} (padded {int(padded[i])}), "
            f"which does not fit capacity {capacity}"
        )
        if overlength == "error":
            raise ValueError(msg + "; truncate or drop it when preparing the data, or pass overlength='drop'")
        logger.debug("select_samples_to_pack: dropping %s", msg)
        keep[i] = False
    if len(bad) and overlength == "drop":  # one line per call, not one per sample
        logger.warning(
            "select_samples_to_pack: dropped %d over-length sample(s) of %d (capacity %d, overlength='drop'): %s",
            len(bad), len(samples), capacity, _first_names(bad, lambda i: samples[i], lens, padded),
        )
    idx = np.flatnonzero(keep)
    if len(idx) == 0:
        return []
    _, run = _resolve_algorithm(algorithm)
    bins = run(lens[idx], capacity, int(seed), pad_to_multiple_of)
    return [[samples[int(idx[j])] for j in b] for b in bins]


def pack_selected_samples(
    samples: Sequence[Any],
    *,
    pad_token_id: int,
    pad_to_multiple_of: int = 1,
    seq_length: int | None = None,
    pad_to_max_length: bool = False,
):
    """Build one packed row from a selected group (Megatron-Energon's ``pack_selected_samples``).

    Thin wrapper over :func:`seqpack.packed.build_packed_sequence` (which fills
    ``PackedSequence.media`` with each segment's ``Sample.media``, in segment order) that, for
    image-text segments from :mod:`seqpack.data.media`, adds
    ``extra["mrope_position_ids"]`` (int64 ``[3, T]``, M-RoPE positions restarting per segment).

    Args:
        samples: :class:`~seqpack.data.sample.Sample` objects, in pack order.
        pad_token_id: id written into alignment/tail padding.
        pad_to_multiple_of: per-segment physical length multiple.
        seq_length: row width ``T`` when ``pad_to_max_length`` (else the padded total).
        pad_to_max_length: pad the row to ``seq_length`` (static shapes).

    Returns:
        :class:`~seqpack.packed.PackedSequence`.
    """
    from seqpack.packed import build_packed_sequence

    packed = build_packed_sequence(
        list(samples),
        pad_to_multiple_of=pad_to_multiple_of,
        pad_token_id=pad_token_id,
        seq_length=seq_length,
        pad_to_max_length=pad_to_max_length,
    )
    if packed.media is not None:
        from seqpack.data.media import packed_mrope_position_ids

        mrope = packed_mrope_position_ids(packed.media, packed.cu_seqlens, packed.cu_seqlens_padded)
        if mrope is not None:
            packed.extra["mrope_position_ids"] = mrope
    return packed


def _check_capacity(capacity: int, mult: int) -> None:
    if int(capacity) != capacity or capacity < 1:
        raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
    if int(mult) != mult or mult < 1:
        raise ValueError(f"pad_to_multiple_of must be an integer >= 1, got {mult!r}")
    check_seq_length(capacity, mult, {"pad_to_multiple_of": mult}, name="capacity")


# ----------------------------------------------------------------------------------------------
# the packer
# ----------------------------------------------------------------------------------------------


class _Run:
    """Live state of one shard's iteration (everything that ``state_dict`` saves)."""

    __slots__ = (
        "epoch", "cursor", "exhausted", "finished", "buf_keys", "buf_lens", "buf_age",
        "pend_keys", "pend_offsets", "pend_pos", "rng", "stats", "items",
    )

    def __init__(self) -> None:
        self.epoch = 0
        self.cursor = 0  # shard positions consumed from the source this epoch
        self.exhausted = False
        self.finished = False
        self.buf_keys = np.zeros(0, np.int64)
        self.buf_lens = np.zeros(0, np.int64)
        self.buf_age = np.zeros(0, np.int64)
        self.pend_keys = np.zeros(0, np.int64)  # packs chosen but not yet emitted, concatenated
        self.pend_offsets = np.zeros(1, np.int64)
        self.pend_pos = 0  # next pending pack to emit
        self.rng: np.random.Generator | None = None
        self.stats: dict[str, Any] = _new_stats()
        self.items: dict[int, Any] = {}  # key -> item (not saved)


def _new_stats() -> dict[str, Any]:
    return {
        "samples_read": 0,
        "samples_packed": 0,
        "packs_emitted": 0,
        "tokens_packed": 0,
        "rounds": 0,
        "carried": 0,
        "max_wait": 0,
        "overlength_dropped": [],  # source keys
        "dropped_last": [],  # source keys of the dropped last partial pack
    }


class StreamingPacker(IterableDataset):
    """Buffered producer-side packer: a torch ``IterableDataset`` of packs (module docstring).

    Args:
        source: map-style dataset (``__len__`` + ``__getitem__``; a numpy array of lengths works)
            or any iterable of samples. Items are :class:`~seqpack.data.sample.Sample` objects, or
            anything ``length_fn`` understands (ints for length-only runs).
        capacity: tokens per pack (``seq_length`` of the packed rows), divisible by
            ``pad_to_multiple_of``.
        packing_buffer_size: samples the buffer holds when the algorithm runs (>= 1).
        algorithm: :class:`~seqpack.algorithms.PackingAlgorithm` (or value), ``None`` =
            :data:`STREAM_DEFAULT_ALGORITHM` (best-fit decreasing), or a callable
            ``(lengths int64[n], capacity, seed) -> list[int arrays]``.
        pad_to_multiple_of: per-segment pad multiple (from ``compute_pad_multiple``).
        pad_token_id: id for padding slots (``output="packed"``).
        pad_to_max_length: pad each row to ``capacity`` (static shapes).
        seed, shuffle: epoch permutation of map-style sources, pack order, algorithm seeds.
        rank, world_size: data-parallel position; ``None`` reads ``torch.distributed`` when
            initialised, else 0 / 1.
        drop_last: drop the least-filled final pack of the epoch when it is not full (counted).
        overlength: ``"error"`` (default) or ``"drop"`` for samples longer than ``capacity``. Drops
            are logged in aggregate: one warning at the first drop of an epoch, one summary (count +
            first five source keys) at its end, each drop at DEBUG level; every dropped source key is
            in ``stats["overlength_dropped"]``.
        output: ``"packed"`` (PackedSequence), ``"samples"`` (list of items) or ``"indices"``
            (int64 array of source keys).
        carry_fill: packs with load below ``carry_fill * capacity`` may be carried over (0 = never).
        carry_fraction: at most this fraction of the buffer is carried into the next round.
        max_wait: a sample is carried at most this many rounds (bounded latency: it leaves the
            packer within ``max_wait + 1`` rounds, i.e. before about ``(max_wait + 1) *
            packing_buffer_size`` further source samples have been read).
        length_fn: item -> tokens (default :func:`sample_length`).
        shard_source: iterable sources only. ``True``: the packer reads the whole source and keeps
            every ``S``-th item (module docstring). ``False``: the source already yields only this
            (rank, worker)'s part, as a Hugging Face ``datasets.IterableDataset`` does inside
            DataLoader workers and after ``split_dataset_by_node``; keys are then
            ``local_position * S + shard``. Leaving it ``True`` for such a source would drop data,
            so that combination is refused for HF iterable datasets.

    Attributes:
        stats: counters of the current/last iteration of this process (``samples_read``,
            ``samples_packed``, ``packs_emitted``, ``tokens_packed``, ``rounds``, ``carried``,
            ``max_wait`` (rounds), ``overlength_dropped`` and ``dropped_last`` (source keys)).

    Raises:
        ValueError: bad settings (named), over-length sample under ``overlength="error"`` (names the
            source key and sample id), or a state saved under other settings.
    """

    def __init__(
        self,
        source: Any,
        capacity: int,
        *,
        packing_buffer_size: int = 1000,
        algorithm: Any = None,
        pad_to_multiple_of: int = 1,
        pad_token_id: int = 0,
        pad_to_max_length: bool = False,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        overlength: str = "error",
        output: str = "packed",
        carry_fill: float = 0.999,
        carry_fraction: float = 0.3,
        max_wait: int = 8,
        length_fn: Callable[[Any], int] | None = None,
        shard_source: bool = True,
    ) -> None:
        super().__init__()
        _check_capacity(capacity, pad_to_multiple_of)
        if int(packing_buffer_size) != packing_buffer_size or packing_buffer_size < 1:
            raise ValueError(f"packing_buffer_size must be an integer >= 1, got {packing_buffer_size!r}")
        if overlength not in ("error", "drop"):
            raise ValueError(f"overlength must be 'error' or 'drop', got {overlength!r}")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if not 0.0 <= carry_fill <= 1.0:
            raise ValueError(f"carry_fill must be in [0, 1], got {carry_fill!r}")
        if not 0.0 <= carry_fraction < 1.0:
            raise ValueError(f"carry_fraction must be in [0, 1), got {carry_fraction!r}")
        if int(max_wait) != max_wait or max_wait < 0:
            raise ValueError(f"max_wait must be an integer >= 0, got {max_wait!r}")
        if rank is None or world_size is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                rank = torch.distributed.get_rank() if rank is None else rank
                world_size = torch.distributed.get_world_size() if world_size is None else world_size
            else:
                rank = 0 if rank is None else rank
                world_size = 1 if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if not _is_map_style(source) and not isinstance(source, Iterable):
            raise TypeError(f"source of type {type(source).__name__} is neither a dataset nor iterable")

        self.source = source
        self.capacity = int(capacity)
        self.packing_buffer_size = int(packing_buffer_size)
        self.algorithm_name, self._run_algorithm = _resolve_algorithm(
            STREAM_DEFAULT_ALGORITHM if algorithm is None else algorithm
        )
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        self.pad_token_id = int(pad_token_id)
        self.pad_to_max_length = bool(pad_to_max_length)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.overlength = overlength
        self.output = output
        self.carry_fill = float(carry_fill)
        self.carry_fraction = float(carry_fraction)
        self.max_wait = int(max_wait)
        self.length_fn = length_fn or sample_length
        self.shard_source = bool(shard_source)
        self.map_style = _is_map_style(source)
        self._numeric_source = isinstance(source, np.ndarray) and source.ndim == 1 and source.dtype.kind in "iu"
        self.epoch = 0
        self._live: _Run | None = None
        self._pending_state: dict[str, Any] | None = None

    # -------------------------------------------------------------------------------- epochs
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (reshuffles a map-style source and reseeds the packer's RNG)."""
        self.epoch = int(epoch)
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(int(epoch))

    # -------------------------------------------------------------------------------- sharding
    def _worker(self) -> tuple[int, int]:
        info = get_worker_info()
        if info is None:
            return 0, 1
        return int(info.id), int(info.num_workers)

    def _shard(self) -> tuple[int, int]:
        wid, nw = self._worker()
        return self.rank * nw + wid, self.world_size * nw

    def _config(self) -> dict[str, Any]:
        wid, nw = self._worker()
        cfg = {
            "capacity": self.capacity,
            "packing_buffer_size": self.packing_buffer_size,
            "algorithm": self.algorithm_name,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "rank": self.rank,
            "num_workers": nw,
            "worker_id": wid,
            "drop_last": self.drop_last,
            "overlength": self.overlength,
            "carry_fill": self.carry_fill,
            "carry_fraction": self.carry_fraction,
            "max_wait": self.max_wait,
            "source_kind": "map" if self.map_style else "iterable",
            "shard_source": self.shard_source,
        }
        if self.map_style:
            cfg["source_len"] = len(self.source)
        return cfg

    def _rng(self, epoch: int) -> np.random.Generator:
        wid, _ = self._worker()
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch, self.rank, wid])))

    def _shard_keys(self, epoch: int) -> np.ndarray | None:
        """Map-style: this shard's keys in epoch order; iterable: None."""
        if not self.map_style:
            return None
        n = len(self.source)
        if self.shuffle:
            order = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch]))).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        shard, nshards = self._shard()
        return order[shard::nshards].astype(np.int64, copy=False)

    # -------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Resume state of this process's shard (keys, not tensors); safe to ``torch.save``.

        Returns a dict of ints/bools/strings/dicts and int64 ``torch.Tensor``s: the settings
        fingerprint (``"config"``), ``epoch``, source ``cursor``, the buffer (``buffer_keys``,
        ``buffer_lens``, ``buffer_age``), the packs chosen but not yet emitted (``pending_keys`` +
        ``pending_offsets``), the RNG state and the counters. Taken before iterating, it describes
        the start of ``self.epoch``.
        """
        run = self._live
        if run is None:
            if self._pending_state is not None:
                return self._pending_state
            run = _Run()
            run.epoch = self.epoch
        rng_state = run.rng.bit_generator.state if run.rng is not None else None
        pos = run.pend_pos
        offs = run.pend_offsets[pos:] - run.pend_offsets[pos]
        st = self._live_stats(run)
        return {
            "version": STATE_VERSION,
            "config": self._config(),
            "epoch": run.epoch,
            "cursor": run.cursor,
            "exhausted": run.exhausted,
            "finished": run.finished,
            "buffer_keys": _to_tensor(run.buf_keys),
            "buffer_lens": _to_tensor(run.buf_lens),
            "buffer_age": _to_tensor(run.buf_age),
            "pending_keys": _to_tensor(run.pend_keys[run.pend_offsets[pos] :]),
            "pending_offsets": _to_tensor(offs),
            "rng": rng_state,
            "stats": {
                **{k: v for k, v in st.items() if not isinstance(v, list)},
                "overlength_dropped": _to_tensor(np.asarray(st["overlength_dropped"], np.int64)),
                "dropped_last": _to_tensor(np.asarray(st["dropped_last"], np.int64)),
            },
        }

    @staticmethod
    def _live_stats(run: _Run) -> dict[str, Any]:
        """Counters including the packs of the current round emitted so far."""
        st = dict(run.stats)
        st["packs_emitted"] += run.pend_pos
        st["samples_packed"] += int(run.pend_offsets[run.pend_pos])
        return st

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the current (or last) iteration in this process (class docstring)."""
        return self._live_stats(self._live) if self._live is not None else _new_stats()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict`; the next ``iter()`` continues exactly there.

        Raises:
            ValueError: the state's version or settings differ from this packer's; the message
                names every differing key with both values.
        """
        if not isinstance(state, dict) or "config" not in state:
            raise ValueError("not a StreamingPacker state (missing 'config'); pass packer.state_dict() output")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r} is not supported (expected {STATE_VERSION})")
        self._check_config(state)
        self._pending_state = state
        self.epoch = int(state["epoch"])
        self._live = None

    def _check_config(self, state: dict[str, Any]) -> None:
        mine, theirs = self._config(), state["config"]
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if diff:
            detail = ", ".join(f"{k}: saved {theirs.get(k)!r} vs now {mine.get(k)!r}" for k in diff)
            raise ValueError(
                f"cannot resume: the state was saved under different settings ({detail}); restore with the "
                "same settings or start a fresh run (with DataLoader workers, restore through torchdata's "
                "StatefulDataLoader, which hands every worker its own state)"
            )

    def _run_from_state(self, state: dict[str, Any]) -> _Run:
        run = _Run()
        run.epoch = int(state["epoch"])
        run.cursor = int(state["cursor"])
        run.exhausted = bool(state["exhausted"])
        run.finished = bool(state["finished"])
        run.buf_keys = _to_numpy(state["buffer_keys"])
        run.buf_lens = _to_numpy(state["buffer_lens"])
        run.buf_age = _to_numpy(state["buffer_age"])
        run.pend_keys = _to_numpy(state["pending_keys"])
        run.pend_offsets = _to_numpy(state["pending_offsets"])
        run.pend_pos = 0
        if state["rng"] is not None:
            run.rng = np.random.Generator(np.random.PCG64())
            run.rng.bit_generator.state = state["rng"]
        st = dict(state["stats"])
        st["overlength_dropped"] = _to_numpy(st["overlength_dropped"]).tolist()
        st["dropped_last"] = _to_numpy(st["dropped_last"]).tolist()
        run.stats = st
        return run

    # -------------------------------------------------------------------------------- reading
    def _make_reader(self, run: _Run, keys: np.ndarray | None):
        """Return read(n) -> (keys int64[k], lens int64[k], items list|None), positioned at run.cursor."""
        lf = self.length_fn
        if keys is not None:
            src = self.source

            def read(n: int):
                ks = keys[run.cursor : run.cursor + n]
                run.cursor += len(ks)
                if self._numeric_source:
                    lens = src[ks].astype(np.int64)
                    items = None if self.output == "indices" else [src[int(k)] for k in ks]
                else:
                    items = [src[int(k)] for k in ks]
                    lens = np.fromiter((lf(x) for x in items), dtype=np.int64, count=len(items))
                return ks, lens, items

            return read, (lambda k: src[int(k)])

        shard, nshards = self._shard()
        if self.shard_source:
            self._check_not_self_sharding()
            it = itertools.islice(iter(self.source), shard, None, nshards)
        else:
            it = iter(self.source)
        # replay (plain iterables): skip to the cursor, collecting items still waiting in the state
        wanted = set(run.buf_keys.tolist()) | set(run.pend_keys.tolist()) if self.output != "indices" else set()
        found: dict[int, Any] = {}
        for k in range(run.cursor):
            try:
                x = next(it)
            except StopIteration:
                raise ValueError(
                    f"cannot resume: the source ended after {k} items of this shard, but the state was saved at "
                    f"{run.cursor}; the source changed since the state was saved"
                ) from None
            pos = shard + k * nshards
            if pos in wanted:
                found[pos] = x
        if len(found) != len(wanted):
            raise ValueError("cannot resume: items waiting in the saved buffer were not found in the source replay")
        run.items.update(found)

        def read(n: int):
            chunk = list(itertools.islice(it, n))
            start = run.cursor
            run.cursor += len(chunk)
            ks = shard + nshards * np.arange(start, start + len(chunk), dtype=np.int64)
            if chunk and isinstance(chunk[0], (int, np.integer)) and lf is sample_length:
                lens = np.fromiter(chunk, dtype=np.int64, count=len(chunk))
            else:
                lens = np.fromiter((lf(x) for x in chunk), dtype=np.int64, count=len(chunk))
            return ks, lens, chunk

        return read, None

    def _check_not_self_sharding(self) -> None:
        src = self.source
        if type(src).__name__ != "IterableDataset" or not type(src).__module__.startswith("datasets"):
            return
        _, nw = self._worker()
        if nw > 1 or getattr(src, "_distributed", None) is not None:
            raise ValueError(
                "the source is a Hugging Face datasets.IterableDataset, which already yields only this "
                "DataLoader worker's (and, after split_dataset_by_node, this rank's) shards; sharding it again "
                "would skip samples. Pass shard_source=False to StreamingPacker"
            )

    # -------------------------------------------------------------------------------- iteration
    def __iter__(self):
        state, self._pending_state = self._pending_state, None
        if state is not None:
            self._check_config(state)  # again: inside a worker the shard may differ from load time
            run = self._run_from_state(state)
        else:
            run = _Run()
            run.epoch = self.epoch
            run.rng = self._rng(run.epoch)
        if run.rng is None:  # state taken before the first iteration
            run.rng = self._rng(run.epoch)
        self._live = run
        keys = self._shard_keys(run.epoch)
        read, fetch = self._make_reader(run, keys)
        if fetch is not None and self.output != "indices":
            for k in itertools.chain(run.buf_keys.tolist(), run.pend_keys.tolist()):
                run.items[k] = fetch(k)
        return self._generate(run, read)

    def _emit(self, run: _Run, ks: np.ndarray):
        items = [run.items.pop(int(k)) for k in ks]
        if self.output == "samples":
            return items
        return pack_selected_samples(
            items,
            pad_token_id=self.pad_token_id,
            pad_to_multiple_of=self.pad_to_multiple_of,
            seq_length=self.capacity if self.pad_to_max_length else None,
            pad_to_max_length=self.pad_to_max_length,
        )

    def _generate(self, run: _Run, read):
        B = self.packing_buffer_size
        st = run.stats
        need_items = self.output != "indices"
        while True:
            # 1. emit packs chosen in the last round (state is updated before each yield)
            n_pend = len(run.pend_offsets) - 1
            if run.pend_pos < n_pend:
                pk, offs = run.pend_keys, run.pend_offsets.tolist()
                if need_items:
                    for j in range(run.pend_pos, n_pend):
                        run.pend_pos = j + 1
                        yield self._emit(run, pk[offs[j] : offs[j + 1]])
                else:  # hot path (length-only runs): no per-pack work besides the yield
                    for j in range(run.pend_pos, n_pend):
                        run.pend_pos = j + 1
                        yield pk[offs[j] : offs[j + 1]]
            st["packs_emitted"] += n_pend
            st["samples_packed"] += len(run.pend_keys)
            run.pend_keys, run.pend_offsets, run.pend_pos = np.zeros(0, np.int64), np.zeros(1, np.int64), 0
            if run.finished:
                break
            # 2. refill the buffer
            if not run.exhausted and len(run.buf_keys) < B:
                n = B - len(run.buf_keys)
                ks, lens, items = read(n)
                if len(ks) < n:
                    run.exhausted = True
                st["samples_read"] += len(ks)
                if len(ks):
                    ks, lens, kept = self._screen(run, ks, lens, items)
                    if need_items and items is not None:
                        run.items.update(zip(ks.tolist(), (items[i] for i in kept)))
                    run.buf_keys = np.concatenate([run.buf_keys, ks])
                    run.buf_lens = np.concatenate([run.buf_lens, lens])
                    run.buf_age = np.concatenate([run.buf_age, np.zeros(len(ks), np.int64)])
            if len(run.buf_keys) == 0:
                run.finished = True
                run.pend_keys, run.pend_offsets, run.pend_pos = np.zeros(0, np.int64), np.zeros(1, np.int64), 0
                break
            # 3. pack the buffer, 4. choose what to carry
            self._plan_round(run, final=run.exhausted)
        self._log_end(run)

    def _screen(self, run: _Run, ks, lens, items):
        padded = round_up(lens, self.pad_to_multiple_of)
        bad = np.flatnonzero((padded > self.capacity) | (lens <= 0))
        if len(bad):
            for i in bad:
                item = items[i] if items is not None else None
                msg = (
                    f"{_sample_name(item, int(ks[i]))} has length {int(lens[i])} (padded {int(padded[i])}), "
                    f"which does not fit capacity {self.capacity}"
                )
                if self.overlength == "error":
                    raise ValueError(
                        msg + "; truncate/drop it when preparing the data (overlength='truncate'|'drop' in "
                        "seqpack.data.prepare) or pass overlength='drop' to StreamingPacker"
                    )
                logger.debug("StreamingPacker: dropping %s (overlength='drop')", msg)
                run.stats["overlength_dropped"].append(int(ks[i]))
            # aggregated: the first drop of an epoch is announced once; _log_end gives the count and the
            # first keys; the full list is in stats["overlength_dropped"]
            if self.overlength == "drop" and len(run.stats["overlength_dropped"]) == len(bad):
                logger.warning(
                    "StreamingPacker (rank %d): dropping over-length samples (overlength='drop', capacity %d), "
                    "first: %s; further drops are not logged one by one: see .stats['overlength_dropped'] and the "
                    "summary at the end of the epoch", self.rank, self.capacity,
                    _first_names(bad, lambda i: items[i] if items is not None else None, lens, padded, ks),
                )
            keep = np.ones(len(ks), bool)
            keep[bad] = False
            return ks[keep], lens[keep], np.flatnonzero(keep)
        return ks, lens, range(len(ks))

    def _plan_round(self, run: _Run, final: bool) -> None:
        C = self.capacity
        st = run.stats
        st["rounds"] += 1
        seed = int(run.rng.integers(0, 2**31 - 1))
        bins = self._run_algorithm(run.buf_lens, C, seed, self.pad_to_multiple_of)
        nb = len(bins)
        sizes = np.fromiter((len(b) for b in bins), dtype=np.int64, count=nb)
        flat = np.concatenate(bins) if nb else np.zeros(0, np.int64)
        if len(flat) != len(run.buf_keys) or (len(flat) and np.bincount(flat, minlength=len(run.buf_keys)).max() != 1):
            raise RuntimeError(
                f"packing algorithm {self.algorithm_name!r} returned bins that do not cover the buffer exactly once"
            )
        starts = np.zeros(nb, np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        padded = round_up(run.buf_lens, self.pad_to_multiple_of)
        loads = np.add.reduceat(padded[flat], starts) if nb else np.zeros(0, np.int64)
        if (loads > C).any():
            raise RuntimeError(f"packing algorithm {self.algorithm_name!r} overfilled a pack (load {loads.max()} > {C})")
        carry = np.zeros(nb, bool)
        if not final and self.carry_fill > 0 and self.max_wait > 0:
            max_age = np.maximum.reduceat(run.buf_age[flat], starts)
            cand = np.flatnonzero((loads < self.carry_fill * C) & (max_age < self.max_wait))
            if len(cand):
                cand = cand[np.argsort(loads[cand], kind="stable")]
                limit = int(self.carry_fraction * self.packing_buffer_size)
                ok = np.cumsum(sizes[cand]) <= limit
                carry[cand[ok]] = True
        emit = np.flatnonzero(~carry)
        dropped_keys = np.zeros(0, np.int64)
        if final and self.drop_last and len(emit):
            last = emit[np.argmin(loads[emit])]
            if loads[last] < C:
                dropped_keys = run.buf_keys[bins[last]]
                emit = emit[emit != last]
        if self.shuffle and len(emit) > 1:
            emit = emit[run.rng.permutation(len(emit))]
        # pending packs (keys) in emission order
        pidx = [bins[i] for i in emit]
        run.pend_keys = run.buf_keys[np.concatenate(pidx)] if pidx else np.zeros(0, np.int64)
        run.pend_offsets = np.zeros(len(pidx) + 1, np.int64)
        if pidx:
            np.cumsum(sizes[emit], out=run.pend_offsets[1:])
            st["tokens_packed"] += int(run.buf_lens[np.concatenate(pidx)].sum())
        run.pend_pos = 0
        if len(dropped_keys):
            st["dropped_last"].extend(int(k) for k in dropped_keys)
            for k in dropped_keys.tolist():
                run.items.pop(k, None)
        # carried samples stay in the buffer, one round older
        cidx = flat[np.repeat(carry, sizes)]
        if len(cidx):
            cidx = np.sort(cidx)
            st["carried"] += len(cidx)
            run.buf_keys, run.buf_lens, run.buf_age = run.buf_keys[cidx], run.buf_lens[cidx], run.buf_age[cidx] + 1
            st["max_wait"] = max(st["max_wait"], int(run.buf_age.max()))
        else:
            run.buf_keys, run.buf_lens, run.buf_age = (np.zeros(0, np.int64),) * 3
        if final:
            run.finished = not len(run.buf_keys)

    def _log_end(self, run: _Run) -> None:
        st = run.stats
        if st["dropped_last"]:
            logger.warning(
                "StreamingPacker (rank %d): drop_last=True dropped the last partial pack of epoch %d: %d samples "
                "(source keys %s)", self.rank, run.epoch, len(st["dropped_last"]), st["dropped_last"][:20],
            )
        if st["overlength_dropped"]:
            n = len(st["overlength_dropped"])
            logger.warning(
                "StreamingPacker (rank %d): %d over-length sample(s) dropped in epoch %d (source keys %s%s; "
                "all in .stats['overlength_dropped'])",
                self.rank, n, run.epoch, st["overlength_dropped"][:_LOG_FIRST], ", ..." if n > _LOG_FIRST else "",
            )

