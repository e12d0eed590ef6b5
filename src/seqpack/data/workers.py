"""Record preparation in chunks, in this process or in worker processes (``num_proc``).

A chunk is a run of consecutive raw records of one input; :func:`prepare_chunk` normalises, renders,
tokenizes and applies the over-length policy to each record and returns one outcome per record, in
order. ``seqpack.data.prepare`` replays the outcomes in input order, so its samples, report entries and
errors do not depend on how records were chunked nor on the number of processes.

Worker processes (:mod:`seqpack.data.procs`: spawned, no ``__main__`` guard needed, a dead worker raises
``WorkerDiedError`` instead of hanging) each load the tokenizer once and return plain picklable
outcomes. An exception raised for a record travels back as the exception object itself (type,
message and attributes kept) and is raised by the parent at that record's place in the input order.
"""

from __future__ import annotations

import itertools
import pickle
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from seqpack.accounting import SampleRecord
from seqpack.data.chat_template import TemplateMarkers, encode_texts, render_conversation
from seqpack.data.formats import normalize_record
from seqpack.data.length_policy import apply_overlength
from seqpack.data.media_root import MediaRoot
from seqpack.data.procs import WorkerDiedError, WorkerProcesses, available_cores
from seqpack.data.records import DataFormatError, RawRecord

__all__ = ["AUTO_MIN_CORES", "AUTO_MIN_RECORDS", "AUTO_MIN_SECONDS", "ChunkSettings", "PreparePool", "WorkerDiedError", "prepare_chunk"]


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
    rendered = _render_chunk(tokenizer, settings, records)
    return _finish_chunk(settings, rendered, _encode_chunk(tokenizer, settings, rendered))


def prepare_chunks_overlapped(tokenizer: Any, settings: ChunkSettings,
                              chunks: Iterable[Sequence[tuple[RawRecord, str]]]) -> Iterator[list[Outcome]]:
    """:func:`prepare_chunk` of every chunk, in order, with chunk ``k``'s batched tokenizer call running in a
    thread while chunk ``k + 1`` is read and rendered here (the fast tokenizer's batch encoding releases the
    GIL and runs in its own thread pool). Same outcomes as :func:`prepare_chunk` chunk by chunk; an error of
    reading the chunks is raised after the outcomes of the chunks read before it are yielded."""
    it = iter(chunks)
    prev: tuple | None = None  # (rendered chunk, future of its encoding)
    error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="seqpack-encode") as ex:
        while True:
            try:
                chunk = next(it)
            except StopIteration:
                break
            except BaseException as e:  # noqa: BLE001 - raised below, after the chunks read before it
                error = e
                break
            rendered = _render_chunk(tokenizer, settings, chunk)
            fut = ex.submit(_encode_chunk, tokenizer, settings, rendered)
            if prev is not None:
                yield _finish_chunk(settings, prev[0], prev[1].result())
            prev = (rendered, fut)
        if prev is not None:
            yield _finish_chunk(settings, prev[0], prev[1].result())
    if error is not None:
        raise error


def _render_chunk(tokenizer: Any, settings: ChunkSettings, records: Sequence[tuple[RawRecord, str]]) -> tuple:
    """Normalise and render ``records``: ``(out, good)``, ``out`` one slot per record (the ``"bad"`` outcomes
    filled in), ``good`` the ``(slot, conversation, sample id, text, spans)`` of the rendered ones."""
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
    return out, good


def _encode_chunk(tokenizer: Any, settings: ChunkSettings, rendered: tuple) -> tuple:
    """``("ok", encode_texts(...))`` of the rendered texts of a chunk, or ``("error", exc)`` (never raises)."""
    good = rendered[1]
    if not good:
        return "ok", []
    try:
        return "ok", encode_texts(tokenizer, [g[3] for g in good], [g[4] for g in good], settings.train_on)
    except Exception as e:  # noqa: BLE001
        return "error", e


def _finish_chunk(settings: ChunkSettings, rendered: tuple, encoded: tuple) -> list[Outcome]:
    """The outcomes of a chunk from its rendering and :func:`_encode_chunk` result (over-length policy applied)."""
    out, good = rendered
    if not good:
        return out
    if encoded[0] == "error":
        out[good[0][0]] = ("late", encoded[1])
        for k, *_ in good[1:]:
            out[k] = ("ok", [], [])
        return out
    for (k, conv, sid, _, _), (ids, tr) in zip(good, encoded[1]):
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


def _init_worker(tokenizer_bytes: bytes) -> Any:
    return pickle.loads(tokenizer_bytes)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling; else a ``RuntimeError`` with the same type name and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _worker_chunk(tokenizer: Any, settings: ChunkSettings, records: Sequence[tuple[RawRecord, str]]) -> list[Outcome]:
    outcomes = prepare_chunk(tokenizer, settings, records)
    return [(o[0], _picklable(o[1]), *o[2:]) if o[0] != "ok" else o for o in outcomes]


#: ``num_proc=None`` starts worker processes only once this many records (over all ``prepare`` calls of one
#: pool) were prepared in this process and that took :data:`AUTO_MIN_SECONDS`: a worker costs about 4 CPU-s
#: to start (spawn, importing transformers and seqpack, loading the tokenizer), and this process already
#: encodes on every core (the tokenizer's thread pool), so workers pay off only for inputs of many seconds.
AUTO_MIN_RECORDS = 2048
#: see :data:`AUTO_MIN_RECORDS` (wall seconds of in-process preparation)
AUTO_MIN_SECONDS = 5.0
#: ``num_proc=None`` on fewer cores than this prepares in this process only: measured on 2 cores
#: (2026-12-02, ``seqpack bench prepare --num-proc``), 2 workers used ~1.7x the CPU per record of this
#: process, whose tokenizer already encodes on both cores.
AUTO_MIN_CORES = 4


class PreparePool:
    """``num_proc`` worker processes holding one tokenizer, or this process.

    Use as a context manager (workers start when there is enough work, stop on exit or :meth:`close`).
    One pool serves any number of ``seqpack.data.prepare`` calls with the same tokenizer (pass it as
    ``workers=``). Whatever the number of processes, the outcomes are the same, in input order.

    Args:
        num_proc: number of worker processes: an integer >= 1 (1 = prepare in this process; > 1 = that
            many processes, started once an input has more than one chunk), or ``None`` = the cores
            available (:func:`~seqpack.data.procs.available_cores`; this process alone on fewer than
            :data:`AUTO_MIN_CORES`); records are prepared in this process until :data:`AUTO_MIN_RECORDS`
            records and :data:`AUTO_MIN_SECONDS` seconds are reached, the rest in the workers (small inputs
            never start them).
        tokenizer: the loaded fast tokenizer (must be picklable when worker processes start).

    Raises:
        ValueError: ``num_proc`` is neither ``None`` nor an integer >= 1.
        WorkerDiedError: (from :meth:`map_chunks`) a worker process died or could not start.
    """

    #: records per chunk sent to a worker (the in-process path uses ``prepare``'s ``batch_size``)
    chunk_records = 256

    def __init__(self, num_proc: int | None, tokenizer: Any) -> None:
        if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
            raise ValueError(f"num_proc must be None (the cores available) or an integer >= 1, got {num_proc!r}")
        self.auto = num_proc is None
        cores = available_cores()
        self.num_proc = (cores if cores >= AUTO_MIN_CORES else 1) if num_proc is None else num_proc
        self.min_records = AUTO_MIN_RECORDS if self.auto else 0
        self.min_seconds = AUTO_MIN_SECONDS if self.auto else 0.0
        self.tokenizer = tokenizer
        self.records_seen = 0
        self.in_process_s = 0.0
        self._procs: WorkerProcesses | None = None

    @property
    def started(self) -> bool:
        """Whether worker processes are running."""
        return self._procs is not None

    def __enter__(self) -> "PreparePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(kill=exc[0] is not None)

    def close(self, kill: bool = True) -> None:
        """Stop the workers (if started)."""
        if self._procs is not None:
            procs, self._procs = self._procs, None
            procs.close(kill=kill)

    def _start(self) -> WorkerProcesses:
        if self._procs is None:
            # the tokenizer's batch encoding runs a thread pool of its own (Rust rayon, sized at first use):
            # the workers share the cores instead of running num_proc x cores threads
            threads = str(max(1, available_cores() // self.num_proc))
            self._procs = WorkerProcesses(self.num_proc, _init_worker, (pickle.dumps(self.tokenizer),), _worker_chunk,
                                          env={"RAYON_NUM_THREADS": threads})
        return self._procs

    def _counted(self, chunks: Iterable[Sequence[tuple[RawRecord, str]]]) -> Iterator[Sequence[tuple[RawRecord, str]]]:
        for chunk in chunks:
            self.records_seen += len(chunk)
            yield chunk

    def map_chunks(
        self, settings: ChunkSettings, chunks: Iterable[Sequence[tuple[RawRecord, str]]]
    ) -> Iterator[list[Outcome]]:
        """Yield the outcomes of every chunk, in chunk order (at most ``2 * num_proc`` chunks in flight).

        Chunks are prepared in this process when ``num_proc == 1`` (one chunk's tokenizer call overlapping the
        next one's rendering: :func:`prepare_chunks_overlapped`) or until the start rule of the class docstring
        is met (an input of one chunk never starts workers); the outcomes are the same."""
        if self.num_proc == 1:
            yield from prepare_chunks_overlapped(self.tokenizer, settings, self._counted(chunks))
            return
        it = iter(chunks)
        held: list = []  # chunks read before the workers start
        if self._procs is None and self.auto:
            for chunk in it:  # in this process until the start rule is met
                t0 = time.perf_counter()
                out = prepare_chunk(self.tokenizer, settings, chunk)
                self.in_process_s += time.perf_counter() - t0
                self.records_seen += len(chunk)
                yield out
                if self.records_seen >= self.min_records and self.in_process_s >= self.min_seconds:
                    break
            else:
                return
        elif self._procs is None:
            for chunk in it:
                held.append(chunk)
                self.records_seen += len(chunk)
                if len(held) >= 2:
                    break
            else:  # one chunk: not worth starting workers
                for chunk in held:
                    yield prepare_chunk(self.tokenizer, settings, chunk)
                return
        procs = self._start()
        pending: deque = deque()

        def in_flight() -> str:
            first, last = pending[0][1], pending[-1][1]
            return f"records {first[0][1]} to {last[-1][1]}" if first and last else "records"

        for chunk in itertools.chain(held, self._counted(it)):
            chunk = list(chunk)
            pending.append((procs.submit(settings, chunk), chunk))
            if len(pending) >= 2 * self.num_proc:
                yield procs.result(pending[0][0], in_flight)
                pending.popleft()
        while pending:
            yield procs.result(pending[0][0], in_flight)
            pending.popleft()
