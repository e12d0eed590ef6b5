"""The stages of the offline job, shared by both engines: open the tokenizer, **prepare** (per input
file: the seam the engines map over), **plan** (``pack_lengths``), build rows, **write**.

Each stage takes the :class:`~seqpack.pipeline.job.PackJob`; the local engine runs them top to bottom
(:mod:`seqpack.pipeline.local`), the Ray engine maps :func:`prepare` over input files on workers and
builds rows there (:mod:`seqpack.pipeline.ray`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

import seqpack.algorithms as algorithms
import seqpack.data as data
import seqpack.packed as packed
from seqpack.data.media.expand import apply_length_policy
from seqpack.data.prepare import UNLIMITED, display_names, rename_source
from seqpack.accounting import PrepareReport
from seqpack.data.sources import InMemoryRecords
from seqpack.data.tokenizer import load_tokenizer, tokenizer_fingerprint
from seqpack.io.metadata import is_packed_dataset
from seqpack.io.report_file import rejected_report_path, write_rejected_report
from seqpack.io.writer import PackedWriter
from seqpack.pipeline.job import NothingToPackError, PackJob, resolve_image_processor
from seqpack.pipeline.nothing_left import empty_input_text, nothing_left_fixes

__all__ = [
    "JobTokenizer",
    "Prepared",
    "PrepareTotals",
    "Progress",
    "build_row",
    "build_rows",
    "check_plan_places_all",
    "check_prepared",
    "input_names",
    "open_tokenizer",
    "plan",
    "prepare",
    "timings",
    "write",
]


class Progress:
    """Adapt ``progress`` (a ``rich.progress.Progress``, a ``callback(stage, done, total)`` or None)
    to one bar per stage: ``prepare`` (reading + tokenizing, reported by ``seqpack.data.prepare``),
    ``media``, ``plan`` and ``write``."""

    _LABELS = {"prepare": "reading + tokenizing records", "media": "expanding images", "plan": "planning packs",
               "write": "building + writing packs"}

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        p = self.progress
        if p is None:
            return
        if not hasattr(p, "add_task"):
            p(stage, done, total)
            return
        if stage not in self.tasks:
            self.tasks[stage] = p.add_task(self._LABELS.get(stage, stage), total=total)
        p.update(self.tasks[stage], completed=done, total=total)


@dataclass(frozen=True)
class JobTokenizer:
    """The loaded tokenizer and the facts recorded about it: ``name`` (as given), the sha256 of its
    files and of its chat template (``seqpack.data.tokenizer_fingerprint``), and the pad token id
    used for alignment padding (``pad_token_id``, else ``eos_token_id``, else 0)."""

    tokenizer: Any
    name: str | None
    files_sha256: str | None
    chat_template_sha256: str | None
    pad_token_id: int


def open_tokenizer(job: PackJob) -> JobTokenizer:
    """Load ``job.tokenizer`` (a name/path through ``load_tokenizer``, or the object as given).

    Raises:
        TokenizerError: the tokenizer cannot be loaded or has no chat template.
    """
    if isinstance(job.tokenizer, (str, os.PathLike)):
        tok, name = load_tokenizer(job.tokenizer), str(job.tokenizer)
    else:
        tok, name = job.tokenizer, getattr(job.tokenizer, "name_or_path", None)
    fp = tokenizer_fingerprint(tok)
    pad = next((v for v in (getattr(tok, a, None) for a in ("pad_token_id", "eos_token_id")) if isinstance(v, int)), 0)
    return JobTokenizer(tok, name, fp.get("files_sha256"), fp.get("chat_template_sha256"), pad)


def input_names(job: PackJob) -> list[str]:
    """The sample-id prefix of every input of the job (``seqpack.data.prepare.display_names``)."""
    return display_names(list(job.inputs))


@dataclass
class Prepared:
    """The prepare stage's result for some inputs.

    Attributes:
        samples: the final ``Sample`` s (over-length policy applied, images expanded to references).
        report: records read, totals and the read/tokenize entries (skipped records...).
        policy_entries: the over-length / image entries (dropped, truncated, split, bad media).
        stats: ``{"images", "image_tokens", "samples_with_images"}``.
        sources: ``str(Sample.source)`` of every sample (to name inputs that hold no record).
        image_processor: the processor used for image samples (``None`` when there were none).
    """

    samples: list
    report: PrepareReport
    policy_entries: list
    stats: dict[str, int]
    sources: set[str] = field(default_factory=set)
    image_processor: Any = None


def prepare(
    job: PackJob, tok: JobTokenizer, items: Sequence[Any], names: Sequence[str] | None = None, *,
    image_processor: Any = None, progress: Callable[[str, int, int | None], None] | None = None,
    text_check: Callable[[list], None] | None = None, workers: Any = None,
    sink: Callable[[list], None] | None = None,
) -> Prepared:
    """Read, normalise and tokenize ``items`` without a length limit (an image sample's length is only
    known after its placeholders are expanded), then apply the job's over-length policy and expand
    images (``seqpack.data.media.apply_length_policy``).

    Args:
        items: one input file (the per-file seam both engines map over), or several inputs at once.
        names: the whole job's display names of ``items`` (:func:`input_names`), so sample ids equal
            those of one ``prepare`` call on every input; ``None`` keeps ``prepare``'s own names.
        image_processor: the processor for image samples (``None``: the job's, else built on demand).
        text_check: called with the tokenized samples before the length step (may raise).
        workers: a ``seqpack.data.workers.PreparePool`` for ``tok.tokenizer`` that renders and
            tokenizes the records (``None``: this process); the result is the same either way.
        sink: called with the final samples batch by batch, in input order, as they are made (the
            returned ``Prepared.samples`` is then empty): memory holds one batch, not the whole input.
            ``None``: the samples are kept and returned in ``Prepared.samples``. Either way the same body
            runs: ``text_check`` and the length step batch by batch, in input order; the first error of
            either is raised after reading (so a bad record later in the input is still raised first).

    Raises:
        DataFormatError / TokenizerError / OverlengthError / ValueError: as ``seqpack.data.prepare`` and
            ``apply_length_policy`` (bad records, bad images, ``overlength="error"``).
    """
    one = items[0] if len(items) == 1 and isinstance(items[0], InMemoryRecords) else list(items)
    kept: list = []
    res = _prepare_batches(job, tok, one, items, names, image_processor, progress, text_check, workers,
                           sink if sink is not None else kept.extend)
    res.samples = kept
    return res


def _read_settings(job: PackJob, progress: Any, workers: Any) -> dict[str, Any]:
    """The job's keywords of ``seqpack.data.prepare``: records read and tokenized
    whole (``seq_length=UNLIMITED``; the length policy comes after), images resolved in the media root."""
    return dict(seq_length=UNLIMITED, overlength="error", on_error=job.on_error, train_on=job.train_on,
                format=job.format, progress=progress, workers=workers, keep_image_placeholders=True,
                media_dir=job.media_dir, allow_any_media_path=job.allow_any_media_path)


def _policy_settings(job: PackJob) -> dict[str, Any]:
    """The job's keywords of ``apply_length_policy``."""
    return dict(seq_length=job.seq_length, overlength=job.overlength, on_error=job.on_error,
                media_root=job.media_root)


def _prepare_batches(job: PackJob, tok: JobTokenizer, one: Any, items: Sequence[Any], names: Sequence[str] | None,
                     image_processor: Any, progress: Any, text_check: Any, workers: Any,
                     sink: Callable[[list], None]) -> Prepared:
    """:func:`prepare`'s body: ``text_check`` and the length policy applied batch by batch, samples handed to
    ``sink``; ``Prepared.samples`` is left empty."""
    rename = (display_names(list(items))[0], names[0]) if names is not None and len(items) == 1 else None
    box: dict[str, Any] = {"proc": image_processor if image_processor is not None else job.image_processor,
                           "error": None, "done": 0}
    policy: list = []
    stats = {"images": 0, "image_tokens": 0, "samples_with_images": 0}
    totals = [0, 0, 0]  # samples, tokens, trainable tokens after the length step
    sources: set[str] = set()

    def media_progress(stage: str, done: int, total: int | None) -> None:
        progress(stage, box["done"] + done, None)

    def on_batch(batch: list) -> None:
        if box["error"] is not None:
            return
        try:
            if rename is not None:
                rename_source(batch, *rename)
            if text_check is not None:
                text_check(batch)
            if box["proc"] is None and any((s.media or {}).get("images") for s in batch):
                box["proc"] = resolve_image_processor(None)
            out, rep, st = apply_length_policy(
                batch, PrepareReport(), tok.tokenizer, image_processor=box["proc"],
                progress=media_progress if progress is not None else None, **_policy_settings(job))
        except Exception as e:  # noqa: BLE001 - raised after reading, where prepare without a sink raises it
            box["error"] = e
            return
        box["done"] += len(batch)
        policy.extend(rep.entries)
        for key in stats:
            stats[key] += int(st.get(key, 0))
        totals[0] += rep.samples_out
        totals[1] += rep.tokens
        totals[2] += rep.trainable_tokens
        sources.update(str(s.source) for s in out)
        sink(out)

    _, rep = data.prepare(one, tok.tokenizer, sink=on_batch, **_read_settings(job, progress, workers))
    if box["error"] is not None:
        raise box["error"]
    if rename is not None:
        rename_source(rep.entries, *rename)
    rep.samples_out, rep.tokens, rep.trainable_tokens = totals
    return Prepared([], rep, policy, stats, sources, box["proc"])


@dataclass
class PrepareTotals:
    """The prepare results of a whole job, added input by input (:meth:`add`); :meth:`finish` gives the
    job's report: every read/tokenize entry (all inputs, in order) before the over-length/image entries."""

    report: PrepareReport = field(default_factory=PrepareReport)
    policy_entries: list = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=lambda: {"images": 0, "image_tokens": 0, "samples_with_images": 0})
    sources: set[str] = field(default_factory=set)

    def add(self, p: Prepared) -> None:
        """Add one prepare result (its samples are not kept)."""
        self.report.merge(p.report)
        self.policy_entries.extend(p.policy_entries)
        for key in self.stats:
            self.stats[key] += int(p.stats.get(key, 0))
        self.sources |= p.sources

    def finish(self) -> PrepareReport:
        """The job's :class:`~seqpack.accounting.PrepareReport` (call once)."""
        self.report.entries.extend(self.policy_entries)
        self.policy_entries = []
        return self.report


def _input_label(item: Any) -> str:
    return os.fspath(item) if isinstance(item, (str, os.PathLike)) else f"<{type(item).__name__}>"


def _empty_inputs(items: Sequence[Any], sources: set[str], entries: Sequence[Any]) -> list[str]:
    """Inputs (files) that produced neither a sample nor a report entry: they hold no record."""
    seen = set(sources) | {str(e.source) for e in entries}
    out = []
    for it in items:
        if isinstance(it, (str, os.PathLike)):
            name = os.fspath(it)
            if name not in seen and str(Path(name)) not in seen and Path(name).name not in seen:
                out.append(name)
    return out


def check_prepared(
    job: PackJob, report: PrepareReport, sources: set[str], num_samples: int, stats: dict[str, int],
    say: Callable[[str], None],
) -> None:
    """Log what was prepared (and each input holding no record); raise when nothing is left to pack.

    When records were read but none is usable, every one of them is first listed with its reason in
    ``<output>.report.jsonl`` beside the output folder (:func:`seqpack.io.report_file.write_rejected_report`);
    the output folder itself, and any dataset already in it, is not touched.

    Raises:
        NothingToPackError: no sample left; names the inputs, the counts by status and reason, the
            report file, the fix.
    """
    say(f"prepared {num_samples} samples from {report.records_read} records"
        + (f" ({stats['images']} images, {stats['image_tokens']} image tokens)" if stats.get("images") else ""))
    empty = _empty_inputs(job.inputs, sources, report.entries)
    for name in empty:
        say(f"input {empty_input_text(name)}")
    if num_samples:
        return
    names = ", ".join(_input_label(i) for i in job.inputs)
    if report.records_read == 0:
        what = "; ".join(map(empty_input_text, empty)) if len(empty) == len(job.inputs) else (
            f"0 records read from {names} (empty file(s), dataset(s) or JSON array(s))")
        raise NothingToPackError(
            f"no record to pack: {what}. "
            "Fix: check that the path points to the data file you meant (JSON array of records, JSONL "
            "with one record per line, or Parquet) and that it is not empty"
        )
    listed = write_rejected_report(job.output, report.entries)
    by_reason = report.by_reason()
    raise NothingToPackError(
        f"no sample left to pack: {report.records_read} record(s) read from {names}, none usable "
        f"(by status and reason: {by_reason}; each record with its reason in {listed}). Fix: "
        + "; ".join(nothing_left_fixes(job, report))
        + (f"; empty input(s): {', '.join(empty)}" if empty else "")
        + (f"; the dataset already at {job.output} was left as it was" if is_packed_dataset(job.output) else "")
    )


def check_plan_places_all(plan: Any, num_samples: int, what: str) -> None:
    """Raise ``RuntimeError`` (a planner bug, never a user error) unless ``plan.bins`` place every index
    ``0 .. num_samples-1`` exactly once; ``what`` names the algorithm/planning mode in the message."""
    order = np.concatenate(plan.bins) if plan.bins else np.zeros(0, np.int64)
    if order.shape[0] != num_samples or not np.array_equal(np.sort(order), np.arange(num_samples)):
        raise RuntimeError(
            f"packing plan ({what}) does not place every sample exactly once "
            f"({order.shape[0]} placements for {num_samples} samples)"
        )


def plan(job: PackJob, lengths: np.ndarray, progress: Callable[[str, int, int | None], None] | None = None) -> Any:
    """Plan the packs of int64 ``lengths`` ``[n]`` (``seqpack.algorithms.pack_lengths`` with the job's
    algorithm, seed and pad multiple: the same multiple as the row builder, case B24) and check that
    every sample is placed exactly once. Returns the :class:`~seqpack.algorithms.PackingPlan`."""
    if progress is not None:
        progress("plan", 0, 1)
    p = algorithms.pack_lengths(lengths, job.seq_length, job.algorithm, seed=job.seed, pad_to_multiple_of=job.pad_multiple)
    if progress is not None:
        progress("plan", 1, 1)
    check_plan_places_all(p, len(lengths), job.algorithm.value)
    return p


def build_row(job: PackJob, samples: Sequence[Any], pad_token_id: int) -> Any:
    """One offline THD row (:func:`seqpack.packed.build_packed_sequence` with the job's pad multiple, no
    tail padding), checked against every invariant when ``job.validate``.

    Raises:
        ValueError / PackedSequenceError: from the builder or the validator (names the sample ids).
    """
    row = packed.build_packed_sequence(
        samples, pad_to_multiple_of=job.pad_multiple, pad_token_id=pad_token_id, seq_length=job.seq_length
    )
    if job.validate:
        row.validate(capacity=job.seq_length, context_parallel_size=job.context_parallel_size, multiple=job.pad_multiple)
    return row


def build_rows(
    job: PackJob, bins: Sequence[np.ndarray], get_sample: Callable[[int], Any], pad_token_id: int,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> Iterator[Any]:
    """Yield the row of every pack of ``bins`` in order (samples fetched with ``get_sample(i)``)."""
    total = len(bins)
    if progress is not None:
        progress("write", 0, total)
    for k, b in enumerate(bins, 1):
        row = build_row(job, [get_sample(int(i)) for i in b], pad_token_id)
        if progress is not None and (k % 64 == 0 or k == total):
            progress("write", k, total)
        yield row


def write(job: PackJob, rows: Iterator[Any], metadata: Any, entries: Sequence[Any]) -> Any:
    """Write ``rows`` and publish the dataset atomically (``seqpack.io.PackedWriter``: shards,
    ``report.jsonl`` from ``entries``, then ``metadata.json``); returns the final metadata. An earlier
    run's ``<output>.report.jsonl`` (written when it packed nothing) is removed once this one is published."""
    with PackedWriter(job.output, overwrite=job.overwrite, rows_per_shard=job.rows_per_shard) as w:
        w.write_all(rows)
        meta = w.finalize(metadata, entries)
    rejected_report_path(job.output).unlink(missing_ok=True)  # an earlier run's, now out of date
    return meta


def timings(t0: float, t_prep: float, t_plan: float, t_end: float) -> dict[str, float]:
    """Wall seconds per stage (``prepare``, ``plan``, ``write``, ``total``), rounded to ms."""
    return {
        "prepare": round(t_prep - t0, 3),
        "plan": round(t_plan - t_prep, 3),
        "write": round(t_end - t_plan, 3),
        "total": round(t_end - t0, 3),
    }
