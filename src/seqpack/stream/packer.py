"""The streaming packer: a torch ``IterableDataset`` shell around the carry-over buffer.

torch is imported here (this module is one of the torch layers, see ``architecture.md``); the
hooks, the settings and the buffer below it are numpy only. How a round works, determinism,
sharding and resume: ``docs/notes/stream.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from seqpack._torch import torch_hint

with torch_hint("seqpack.stream.StreamingPacker"):
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

from seqpack.stream.buffer import STATE_VERSION, CarryOverBuffer, epoch_order, new_stats, packer_rng
from seqpack.stream.hooks import pack_selected_samples, resolve_stream_algorithm, sample_length
from seqpack.stream.settings import STREAM_DEFAULT_ALGORITHM, PackerSettings, check_same_settings
from seqpack.stream.source import check_one_shot, iterable_reader, map_reader

__all__ = ["StreamingPacker"]


def _is_map_style(source: Any) -> bool:
    if isinstance(source, torch.utils.data.IterableDataset):
        return False
    return hasattr(source, "__len__") and hasattr(source, "__getitem__")


def _to_tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64).copy())


def _dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill a missing rank / world size from ``torch.distributed`` when initialised, else 0 / 1."""
    if rank is None or world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank() if rank is None else rank
            world_size = torch.distributed.get_world_size() if world_size is None else world_size
        else:
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    return rank, world_size


class _Setting:
    """A read-only packer attribute that reads ``packer.settings.<field>``."""

    def __init__(self, field: str | None = None) -> None:
        self.field = field

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = self.field or name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj.settings, self.field)


class StreamingPacker(IterableDataset):
    """Buffered producer-side packer: a torch ``IterableDataset`` of packs.

    It reads samples from any iterable or map-style dataset, keeps a buffer of
    ``packing_buffer_size`` samples, chooses packs with any
    :class:`~seqpack.algorithms.PackingAlgorithm` (or a callable), carries under-filled packs over
    into the next round and yields one pack at a time: a :class:`~seqpack.packed.PackedSequence`
    (default), the list of samples, or the array of source keys. Rounds, determinism, sharding and
    exact resume: ``docs/notes/stream.md``. One pack per step (``batch_size=None``)::

        packer = StreamingPacker(samples, 4096, packing_buffer_size=1000, pad_to_multiple_of=8,
                                 pad_token_id=tok.pad_token_id, seed=0)
        loader = torchdata.stateful_dataloader.StatefulDataLoader(packer, batch_size=None, num_workers=2)
        for epoch in range(epochs):
            packer.set_epoch(epoch)
            for row in loader:              # PackedSequence; row.to_torch() for tensors
                torch.save(loader.state_dict(), "loader.pt")   # keys + RNG only, ~100 KB per worker

    Args:
        source: map-style dataset (``__len__`` + ``__getitem__``; a numpy array of lengths works)
            or any iterable of samples. Items are :class:`~seqpack.sample.Sample` objects, or
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
            every ``S``-th item (``docs/notes/stream.md``). ``False``: the source already yields only this
            (rank, worker)'s part, as a Hugging Face ``datasets.IterableDataset`` does inside
            DataLoader workers and after ``split_dataset_by_node``; keys are then
            ``local_position * S + shard``. Leaving it ``True`` for such a source would drop data,
            so that combination is refused for HF iterable datasets.

    Attributes:
        settings: the validated :class:`~seqpack.stream.settings.PackerSettings`; the arguments above
            are also read-only attributes of the packer (``capacity`` is ``settings.seq_length``,
            ``algorithm_name`` is ``settings.algorithm``).
        stats: counters of the current/last iteration of this process (``samples_read``,
            ``samples_packed``, ``packs_emitted``, ``tokens_packed``, ``rounds``, ``carried``,
            ``max_wait`` (rounds), ``overlength_dropped`` and ``dropped_last`` (source keys)).

    Raises:
        ValueError: bad settings (named), over-length sample under ``overlength="error"`` (names the
            source key and sample id), or a state saved under other settings.
    """

    capacity = _Setting("seq_length")
    algorithm_name = _Setting("algorithm")
    packing_buffer_size = _Setting()
    pad_to_multiple_of = _Setting()
    pad_token_id = _Setting()
    pad_to_max_length = _Setting()
    seed = _Setting()
    shuffle = _Setting()
    rank = _Setting()
    world_size = _Setting()
    drop_last = _Setting()
    overlength = _Setting()
    output = _Setting()
    carry_fill = _Setting()
    carry_fraction = _Setting()
    max_wait = _Setting()
    shard_source = _Setting()

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
        rank, world_size = _dist_rank_world(rank, world_size)
        algorithm = STREAM_DEFAULT_ALGORITHM if algorithm is None else algorithm
        name, self._run_algorithm = resolve_stream_algorithm(algorithm)
        self.settings = PackerSettings(
            seq_length=capacity, algorithm=name, rank=rank, world_size=world_size,
            packing_buffer_size=packing_buffer_size, pad_to_multiple_of=pad_to_multiple_of,
            pad_token_id=pad_token_id, pad_to_max_length=pad_to_max_length, seed=seed, shuffle=shuffle,
            drop_last=drop_last, overlength=overlength, output=output, carry_fill=carry_fill,
            carry_fraction=carry_fraction, max_wait=max_wait, shard_source=shard_source,
        )
        if not _is_map_style(source) and not isinstance(source, Iterable):
            raise TypeError(f"source of type {type(source).__name__} is neither a dataset nor iterable")
        self.source = source
        self.length_fn = length_fn or sample_length
        self.map_style = _is_map_style(source)
        self._numeric_source = isinstance(source, np.ndarray) and source.ndim == 1 and source.dtype.kind in "iu"
        self.epoch = 0
        self._epoch_chosen = False  # set_epoch() was called: the caller's epoch wins over a loaded state's
        self._live: CarryOverBuffer | None = None
        self._pending_state: dict[str, Any] | None = None
        self._one_shot_read = False  # a one-shot iterator source was read (check_one_shot)

    # -------------------------------------------------------------------------------- epochs
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (reshuffles a map-style source and reseeds the packer's RNG).

        Called before or after :meth:`load_state_dict` (a ``StatefulDataLoader`` loads the dataset's
        state only when its next iterator starts), the epoch set here is the one the next ``iter()``
        runs: a loaded state of that epoch resumes exactly; a state saved at the end of an earlier epoch
        is complete and the new epoch starts from its beginning.
        """
        self.epoch = int(epoch)
        self._epoch_chosen = True
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
        return self.settings.fingerprint(worker_id=wid, num_workers=nw,
                                         source_len=len(self.source) if self.map_style else None)

    def _rng(self, epoch: int) -> np.random.Generator:
        return packer_rng(self.seed, epoch, self.rank, self._worker()[0])

    def _shard_keys(self, epoch: int) -> np.ndarray | None:
        """Map-style: this shard's keys in epoch order; iterable: None."""
        if not self.map_style:
            return None
        order = epoch_order(self.seed, epoch, len(self.source), self.shuffle)
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
            run = CarryOverBuffer(self.epoch)
        state = run.to_state(self._config())
        state["stats"] = {k: _to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in state["stats"].items()}
        return {k: _to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}

    @property
    def stats(self) -> dict[str, Any]:
        """Counters of the current (or last) iteration in this process (class docstring)."""
        return self._live.live_stats() if self._live is not None else new_stats()

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
        check_same_settings(state["config"], self._config())
        self._pending_state = state
        if not self._epoch_chosen:
            self.epoch = int(state["epoch"])
        self._live = None

    # -------------------------------------------------------------------------------- reading
    def _make_reader(self, run: CarryOverBuffer, keys: np.ndarray | None):
        """Return (read, fetch) for this shard, positioned at ``run.cursor`` (:mod:`seqpack.stream.source`);
        ``fetch(key) -> item`` for map-style sources, ``None`` for iterables."""
        need_items = self.output != "indices"
        if keys is not None:
            src = self.source
            read = map_reader(src, keys, run, length_fn=self.length_fn, numeric=self._numeric_source,
                              need_items=need_items)
            return read, (lambda k: src[int(k)])
        shard, nshards = self._shard()
        if isinstance(self.source, Iterator):  # one-shot: exhausted after one pass
            check_one_shot(self.source, run.cursor, self._one_shot_read)
            self._one_shot_read = True
        if self.shard_source:
            self._check_not_self_sharding()
            it = itertools.islice(iter(self.source), shard, None, nshards)
        else:
            it = iter(self.source)
        return iterable_reader(it, run, shard=shard, nshards=nshards, length_fn=self.length_fn,
                               need_items=need_items), None

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
        if state is not None and int(state["epoch"]) != self.epoch:
            if not state["finished"]:
                self._pending_state = state
                left = len(state["buffer_keys"]) + len(state["pending_keys"])
                raise ValueError(
                    f"the loaded StreamingPacker state stops inside epoch {int(state['epoch'])} ({left} samples in "
                    f"the buffer and chosen packs, plus what is not read yet), but set_epoch({self.epoch}) was "
                    f"called; iterating epoch {self.epoch} would skip them. Call set_epoch({int(state['epoch'])}) "
                    "to finish that epoch first")
            state = None  # the saved epoch is complete: this epoch starts from its beginning
        if state is not None:
            check_same_settings(state["config"], self._config())  # again: inside a worker the shard may differ
            run = CarryOverBuffer.from_state(state)
        else:
            run = CarryOverBuffer(self.epoch, self._rng(self.epoch))
        if run.rng is None:  # state taken before the first iteration
            run.rng = self._rng(run.epoch)
        self._live = run
        keys = self._shard_keys(run.epoch)
        read, fetch = self._make_reader(run, keys)
        if fetch is not None and self.output != "indices":
            for k in itertools.chain(run.buf_keys.tolist(), run.pend_keys.tolist()):
                run.items[k] = fetch(k)
        return self._generate(run, read)

    def _emit(self, run: CarryOverBuffer, ks: np.ndarray):
        items = [run.items.pop(int(k)) for k in ks]
        if self.output == "samples":
            return items
        s = self.settings
        return pack_selected_samples(
            items,
            pad_token_id=s.pad_token_id,
            pad_to_multiple_of=s.pad_to_multiple_of,
            seq_length=s.seq_length if s.pad_to_max_length else None,
            pad_to_max_length=s.pad_to_max_length,
        )

    def _generate(self, run: CarryOverBuffer, read):
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
            run.clear_pending()
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
                    ks, lens, kept = run.screen(self.settings, ks, lens, items)
                    if need_items and items is not None:
                        run.items.update(zip(ks.tolist(), (items[i] for i in kept)))
                    run.add(ks, lens)
            if len(run.buf_keys) == 0:
                run.finished = True
                run.clear_pending()
                break
            # 3. pack the buffer, 4. choose what to carry
            run.plan_round(self.settings, self._run_algorithm, final=run.exhausted)
        run.log_end(self.rank)
