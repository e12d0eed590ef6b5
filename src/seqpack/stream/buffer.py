"""The carry-over buffer of one shard and its savable state (numpy only, no torch).

A :class:`CarryOverBuffer` is everything one (rank, worker) iteration of the packer holds: the
source cursor, the buffered samples (source keys, lengths, wait counters), the packs chosen but not
yet emitted, the RNG and the counters. :meth:`CarryOverBuffer.plan_round` is one round of the
streaming algorithm (pack the whole buffer, carry under-filled packs over, queue the rest);
:meth:`CarryOverBuffer.to_state` / :meth:`CarryOverBuffer.from_state` save and restore it as keys
and counters, never sample tensors. The rules of a round are in ``docs/notes/stream.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack.padding import round_up
from seqpack.stream.hooks import LOG_FIRST, RunAlgorithm, first_names, logger, sample_name, unfit_text
from seqpack.stream.settings import PackerSettings

__all__ = ["STATE_VERSION", "CarryOverBuffer", "epoch_order", "new_stats", "packer_rng"]

#: version of the saved state layout (:meth:`CarryOverBuffer.to_state`)
STATE_VERSION = 1

#: saved int64 arrays (key in the state -> attribute of the buffer)
_ARRAYS = {"buffer_keys": "buf_keys", "buffer_lens": "buf_lens", "buffer_age": "buf_age"}


def new_stats() -> dict[str, Any]:
    """Fresh counters of one epoch (``StreamingPacker.stats`` lists their meaning)."""
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


def packer_rng(seed: int, epoch: int, rank: int, worker_id: int) -> np.random.Generator:
    """The one RNG of a shard: PCG64 seeded from ``(seed, epoch, rank, worker_id)``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, rank, worker_id])))


def epoch_order(seed: int, epoch: int, n: int, shuffle: bool) -> np.ndarray:
    """Epoch order of a map-style source of ``n`` items: a permutation seeded from ``(seed, epoch)``
    (identical on every rank), or ``arange(n)`` without ``shuffle``."""
    if shuffle:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch]))).permutation(n)
    return np.arange(n, dtype=np.int64)


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


def _int64(a: Any) -> np.ndarray:
    """A private int64 copy of a saved array (numpy array, CPU tensor or list)."""
    return np.asarray(a, dtype=np.int64).copy()


class CarryOverBuffer:
    """Live state of one shard's iteration (everything that ``state_dict`` saves, plus the items)."""

    __slots__ = (
        "buf_age",
        "buf_keys",
        "buf_lens",
        "cursor",
        "epoch",
        "exhausted",
        "finished",
        "items",
        "pend_keys",
        "pend_offsets",
        "pend_pos",
        "rng",
        "stats",
    )

    def __init__(self, epoch: int = 0, rng: np.random.Generator | None = None) -> None:
        self.epoch = epoch
        self.cursor = 0  # shard positions consumed from the source this epoch
        self.exhausted = False
        self.finished = False
        self.buf_keys = _empty()
        self.buf_lens = _empty()
        self.buf_age = _empty()
        self.pend_keys = _empty()  # packs chosen but not yet emitted, concatenated
        self.pend_offsets = np.zeros(1, np.int64)
        self.pend_pos = 0  # next pending pack to emit
        self.rng = rng
        self.stats: dict[str, Any] = new_stats()
        self.items: dict[int, Any] = {}  # key -> item (not saved)

    # ------------------------------------------------------------------------------ state
    def live_stats(self) -> dict[str, Any]:
        """Counters including the packs of the current round emitted so far."""
        st = dict(self.stats)
        st["packs_emitted"] += self.pend_pos
        st["samples_packed"] += int(self.pend_offsets[self.pend_pos])
        return st

    def to_state(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """The savable state: ints/bools/dicts and int64 numpy arrays (pending packs not yet emitted
        only), with the settings ``fingerprint`` under ``"config"``."""
        pos = self.pend_pos
        st = self.live_stats()
        return {
            "version": STATE_VERSION,
            "config": fingerprint,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "exhausted": self.exhausted,
            "finished": self.finished,
            **{k: getattr(self, a) for k, a in _ARRAYS.items()},
            "pending_keys": self.pend_keys[self.pend_offsets[pos]:],
            "pending_offsets": self.pend_offsets[pos:] - self.pend_offsets[pos],
            "rng": self.rng.bit_generator.state if self.rng is not None else None,
            "stats": {
                **{k: v for k, v in st.items() if not isinstance(v, list)},
                "overlength_dropped": np.asarray(st["overlength_dropped"], np.int64),
                "dropped_last": np.asarray(st["dropped_last"], np.int64),
            },
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CarryOverBuffer:
        """Rebuild a buffer from :meth:`to_state` output (arrays may be int64 CPU tensors); items are
        fetched again by the packer."""
        run = cls(int(state["epoch"]))
        run.cursor = int(state["cursor"])
        run.exhausted = bool(state["exhausted"])
        run.finished = bool(state["finished"])
        for k, a in _ARRAYS.items():
            setattr(run, a, _int64(state[k]))
        run.pend_keys = _int64(state["pending_keys"])
        run.pend_offsets = _int64(state["pending_offsets"])
        if state["rng"] is not None:
            run.rng = np.random.Generator(np.random.PCG64())
            run.rng.bit_generator.state = state["rng"]
        st = dict(state["stats"])
        st["overlength_dropped"] = _int64(st["overlength_dropped"]).tolist()
        st["dropped_last"] = _int64(st["dropped_last"]).tolist()
        run.stats = st
        return run

    # ------------------------------------------------------------------------------ intake
    def clear_pending(self) -> None:
        self.pend_keys, self.pend_offsets, self.pend_pos = _empty(), np.zeros(1, np.int64), 0

    def add(self, ks: np.ndarray, lens: np.ndarray) -> None:
        """Append newly read samples (source keys, lengths) with wait counter 0."""
        self.buf_keys = np.concatenate([self.buf_keys, ks])
        self.buf_lens = np.concatenate([self.buf_lens, lens])
        self.buf_age = np.concatenate([self.buf_age, np.zeros(len(ks), np.int64)])

    def screen(self, s: PackerSettings, ks, lens, items):
        """Drop (``overlength="drop"``) or refuse (``"error"``) samples that cannot fit a row.

        Returns:
            (kept keys, kept lengths, kept positions in the input).

        Raises:
            ValueError: under ``overlength="error"``, naming the source key and sample id.
        """
        padded = round_up(lens, s.pad_to_multiple_of)
        bad = np.flatnonzero((padded > s.seq_length) | (lens <= 0))
        if not len(bad):
            return ks, lens, range(len(ks))
        for i in bad:
            item = items[i] if items is not None else None
            msg = unfit_text(sample_name(item, int(ks[i])), int(lens[i]), int(padded[i]), s.seq_length)
            if s.overlength == "error":
                raise ValueError(
                    msg + "; truncate/drop it when preparing the data (overlength='truncate'|'drop' in "
                    "seqpack.data.prepare) or pass overlength='drop' to StreamingPacker"
                )
            logger.debug("StreamingPacker: dropping %s (overlength='drop')", msg)
            self.stats["overlength_dropped"].append(int(ks[i]))
        # aggregated: the first drop of an epoch is announced once; log_end gives the count and the
        # first keys; the full list is in stats["overlength_dropped"]
        if s.overlength == "drop" and len(self.stats["overlength_dropped"]) == len(bad):
            logger.warning(
                "StreamingPacker (rank %d): dropping over-length samples (overlength='drop', capacity %d), "
                "first: %s; further drops are not logged one by one: see .stats['overlength_dropped'] and the "
                "summary at the end of the epoch", s.rank, s.seq_length,
                first_names(bad, lambda i: items[i] if items is not None else None, lens, padded, ks),
            )
        keep = np.ones(len(ks), bool)
        keep[bad] = False
        return ks[keep], lens[keep], np.flatnonzero(keep)

    # ------------------------------------------------------------------------------ one round
    def plan_round(self, s: PackerSettings, run_algorithm: RunAlgorithm, final: bool) -> None:
        """Pack the whole buffer, carry under-filled packs over, queue the others as pending packs.

        Packs with load below ``carry_fill * seq_length`` whose samples waited fewer than
        ``max_wait`` rounds stay in the buffer (least-filled first, at most ``carry_fraction`` of
        ``packing_buffer_size`` samples); nothing is carried in the ``final`` round, where
        ``drop_last`` may drop the least-filled partial pack. Emission order is shuffled with the
        buffer's RNG when ``shuffle``.

        Raises:
            RuntimeError: the algorithm's bins do not cover the buffer exactly once, or overfill a pack.
        """
        C = s.seq_length
        st = self.stats
        st["rounds"] += 1
        seed = int(self.rng.integers(0, 2**31 - 1))
        bins = run_algorithm(self.buf_lens, C, seed, s.pad_to_multiple_of)
        nb = len(bins)
        sizes = np.fromiter((len(b) for b in bins), dtype=np.int64, count=nb)
        flat = np.concatenate(bins) if nb else _empty()
        n = len(self.buf_keys)
        if len(flat) != n or (len(flat) and np.bincount(flat, minlength=n).max() != 1):
            raise RuntimeError(
                f"packing algorithm {s.algorithm!r} returned bins that do not cover the buffer exactly once"
            )
        starts = np.zeros(nb, np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        padded = round_up(self.buf_lens, s.pad_to_multiple_of)
        loads = np.add.reduceat(padded[flat], starts) if nb else _empty()
        if (loads > C).any():
            raise RuntimeError(f"packing algorithm {s.algorithm!r} overfilled a pack (load {loads.max()} > {C})")
        carry = np.zeros(nb, bool)
        if not final and s.carry_fill > 0 and s.max_wait > 0:
            max_age = np.maximum.reduceat(self.buf_age[flat], starts)
            cand = np.flatnonzero((loads < s.carry_fill * C) & (max_age < s.max_wait))
            if len(cand):
                cand = cand[np.argsort(loads[cand], kind="stable")]
                limit = int(s.carry_fraction * s.packing_buffer_size)
                ok = np.cumsum(sizes[cand]) <= limit
                carry[cand[ok]] = True
        emit = np.flatnonzero(~carry)
        dropped_keys = _empty()
        if final and s.drop_last and len(emit):
            last = emit[np.argmin(loads[emit])]
            if loads[last] < C:
                dropped_keys = self.buf_keys[bins[last]]
                emit = emit[emit != last]
        if s.shuffle and len(emit) > 1:
            emit = emit[self.rng.permutation(len(emit))]
        # pending packs (keys) in emission order
        pidx = [bins[i] for i in emit]
        self.pend_keys = self.buf_keys[np.concatenate(pidx)] if pidx else _empty()
        self.pend_offsets = np.zeros(len(pidx) + 1, np.int64)
        if pidx:
            np.cumsum(sizes[emit], out=self.pend_offsets[1:])
            st["tokens_packed"] += int(self.buf_lens[np.concatenate(pidx)].sum())
        self.pend_pos = 0
        if len(dropped_keys):
            st["dropped_last"].extend(int(k) for k in dropped_keys)
            for k in dropped_keys.tolist():
                self.items.pop(k, None)
        # carried samples stay in the buffer, one round older
        cidx = flat[np.repeat(carry, sizes)]
        if len(cidx):
            cidx = np.sort(cidx)
            st["carried"] += len(cidx)
            self.buf_keys, self.buf_lens = self.buf_keys[cidx], self.buf_lens[cidx]
            self.buf_age = self.buf_age[cidx] + 1
            st["max_wait"] = max(st["max_wait"], int(self.buf_age.max()))
        else:
            self.buf_keys, self.buf_lens, self.buf_age = (_empty(),) * 3
        if final:
            self.finished = not len(self.buf_keys)

    def log_end(self, rank: int) -> None:
        """Warn about the epoch's drops (``drop_last`` pack, over-length samples), in aggregate."""
        st = self.stats
        if st["dropped_last"]:
            logger.warning(
                "StreamingPacker (rank %d): drop_last=True dropped the last partial pack of epoch %d: %d samples "
                "(source keys %s)", rank, self.epoch, len(st["dropped_last"]), st["dropped_last"][:20],
            )
        if st["overlength_dropped"]:
            n = len(st["overlength_dropped"])
            logger.warning(
                "StreamingPacker (rank %d): %d over-length sample(s) dropped in epoch %d (source keys %s%s; "
                "all in .stats['overlength_dropped'])",
                rank, n, self.epoch, st["overlength_dropped"][:LOG_FIRST], ", ..." if n > LOG_FIRST else "",
            )
