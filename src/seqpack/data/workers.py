"""Record preparation in chunks, in this process or in worker processes (``num_proc``).

A chunk is a run of consecutive raw records of one input; :func:`prepare_chunk` normalises, renders,
tokenizes and applies the over-length policy to each record and returns one outcome per record, in
order. ``seqpack.data.prepare`` replays the outcomes in input order, so its samples, report entries and
errors do not depend on how records were chunked nor on the number of processes.

Workers are started with the ``spawn`` context (no fork of a process whose tokenizer thread pool may
already run); each loads the tokenizer once (pickled by the parent) and returns plain picklable
outcomes. An exception raised for a record travels back as the exception object itself (type,
message and attributes kept) and is raised by the parent at that record's place in the input order.
Workers do not run the caller's ``__main__`` module (a script needs no ``__main__`` guard).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import pickle
import sys
import types
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from seqpack.accounting import SampleRecord
from seqpack.data.chat_template import TemplateMarkers, encode_texts, render_conversation
from seqpack.data.formats import normalize_record
from seqpack.data.length_policy import apply_overlength
from seqpack.data.media_root import MediaRoot
from seqpack.data.records import DataFormatError, RawRecord

__all__ = ["ChunkSettings", "PreparePool", "prepare_chunk"]


@dataclass(frozen=True)
class ChunkSettings:
    """The per-record settings of one ``prepare`` call (everything but the tokenizer)."""

    markers: TemplateMarkers
    chat_template_kwargs: dict[str, Any] | None
    format: str | None
    train_on: str
    seq_length: int
    overlength: str
    keep_untrainable: bool
    media: MediaRoot = MediaRoot()  # where image references may point


#: One outcome per record: ``("ok", samples, entries)`` (the record's samples and over-length entries),
#: ``("bad", exc, entry)`` (normalising/rendering raised ``exc``; ``entry`` is its ``"skipped"`` report
#: entry when ``exc`` is a ``DataFormatError``, else ``None``: the caller skips or raises), or
#: ``("late", exc)`` (tokenizing or the over-length step raised ``exc``: raised when the record's
#: tokenizer batch would have been flushed).
Outcome = tuple


def prepare_chunk(tokenizer: Any, settings: ChunkSettings, records: Sequence[tuple[RawRecord, str]]) -> list[Outcome]:
    """Prepare ``records`` (``(raw record, sample id)`` pairs) with one batched tokenizer call.

    Returns:
        one :data:`Outcome` per record, in order. Exceptions are returned, never raised.
    """
    out: list[Any] = [None] * len(records)
    good: list[tuple[int, Any, str, str, list]] = []
    for k, (raw, sid) in enumerate(records):
        try:
            conv = normalize_record(raw, settings.format, settings.media)
            text, spans = render_conversation(conv, tokenizer, settings.markers, settings.chat_template_kwargs)
        except Exception as e:  # noqa: BLE001 - returned and raised by the caller in input order
            entry = SampleRecord(sid, raw.source, raw.index, "skipped", e.reason, str(e)) if isinstance(
                e, DataFormatError) else None
            out[k] = ("bad", e, entry)
            continue
        good.append((k, conv, sid, text, spans))
    if not good:
        return out
    try:
        encoded = encode_texts(tokenizer, [g[3] for g in good], [g[4] for g in good], settings.train_on)
    except Exception as e:  # noqa: BLE001
        out[good[0][0]] = ("late", e)
        for k, *_ in good[1:]:
            out[k] = ("ok", [], [])
        return out
    for (k, conv, sid, _, _), (ids, tr) in zip(good, encoded):
        media = {"images": list(conv.images)} if conv.images else None
        meta: dict[str, Any] = {"format": conv.format}
        if conv.id is not None:
            meta["record_id"] = conv.id
        try:
            samples, entries = apply_overlength(
                ids, tr, seq_length=settings.seq_length, overlength=settings.overlength, sample_id=sid,
                source=conv.source, index=conv.index, media=media, meta=meta,
                keep_untrainable=settings.keep_untrainable,
            )
        except Exception as e:  # noqa: BLE001
            out[k] = ("late", e)
            continue
        out[k] = ("ok", samples, entries)
    return out


_WORKER_TOKENIZER: Any = None


def _init_worker(tokenizer_bytes: bytes, threads: int) -> None:
    global _WORKER_TOKENIZER
    # the tokenizer's batch encoding uses a thread pool of its own (Rust rayon, sized at first use):
    # share the cores among the workers instead of running num_proc x cores threads
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    _WORKER_TOKENIZER = pickle.loads(tokenizer_bytes)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling; else a ``RuntimeError`` with the same type name and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _worker_chunk(settings: ChunkSettings, records: Sequence[tuple[RawRecord, str]]) -> list[Outcome]:
    outcomes = prepare_chunk(_WORKER_TOKENIZER, settings, records)
    return [(o[0], _picklable(o[1]), *o[2:]) if o[0] != "ok" else o for o in outcomes]


def _threads_per_worker(num_proc: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // num_proc)


class PreparePool:
    """``num_proc`` worker processes holding one tokenizer, or this process when ``num_proc == 1``.

    Use as a context manager (workers start on the first chunk and stop on exit). One pool serves any
    number of ``seqpack.data.prepare`` calls with the same tokenizer (pass it as ``workers=``).

    Args:
        num_proc: number of worker processes (>= 1; 1 = prepare in this process).
        tokenizer: the loaded fast tokenizer (must be picklable when ``num_proc > 1``).

    Raises:
        ValueError: ``num_proc`` is not an integer >= 1.
    """

    #: records per chunk sent to a worker (the in-process path uses ``prepare``'s ``batch_size``)
    chunk_records = 256

    def __init__(self, num_proc: int, tokenizer: Any) -> None:
        if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
            raise ValueError(f"num_proc must be an integer >= 1, got {num_proc!r}")
        self.num_proc = num_proc
        self.tokenizer = tokenizer
        self._pool: Any = None

    def __enter__(self) -> "PreparePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (if started)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def _start(self) -> Any:
        if self._pool is None:
            ctx = mp.get_context("spawn")
            # spawn re-runs the caller's __main__ in every worker unless it is hidden: a script without an
            # ``if __name__ == "__main__"`` guard would start the job again in each worker. The workers
            # need only seqpack and the tokenizer's classes, so they start from a bare __main__.
            main = sys.modules.get("__main__")
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                self._pool = ctx.Pool(
                    self.num_proc, initializer=_init_worker, initargs=(pickle.dumps(self.tokenizer), _threads_per_worker(self.num_proc))
                )
            finally:
                if main is not None:
                    sys.modules["__main__"] = main
        return self._pool

    def map_chunks(
        self, settings: ChunkSettings, chunks: Iterable[Sequence[tuple[RawRecord, str]]]
    ) -> Iterator[list[Outcome]]:
        """Yield the outcomes of every chunk, in chunk order (at most ``2 * num_proc`` chunks in flight;
        an input of one chunk is prepared in this process)."""
        if self.num_proc == 1:
            for chunk in chunks:
                yield prepare_chunk(self.tokenizer, settings, chunk)
            return
        it = iter(chunks)
        first = next(it, None)
        if first is None:
            return
        second = next(it, None)
        if second is None and self._pool is None:  # one chunk: not worth starting workers
            yield prepare_chunk(self.tokenizer, settings, first)
            return
        pool = self._start()
        pending: deque = deque()
        for chunk in itertools.chain([first], [] if second is None else [second], it):
            pending.append(pool.apply_async(_worker_chunk, (settings, list(chunk))))
            if len(pending) >= 2 * self.num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
