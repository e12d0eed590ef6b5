"""The local engine: :func:`pack_dataset` builds a :class:`~seqpack.pipeline.job.PackJob` and runs the
stages (:mod:`seqpack.pipeline.stages`) top to bottom in one process (records are rendered and
tokenized in ``num_proc`` worker processes, :class:`seqpack.data.workers.PreparePool`).

Memory: input files are prepared one at a time and their samples spilled to disk batch by batch as
they are made (:class:`seqpack.io.spill.SampleSpill`); planning uses the int64 length array and rows are rebuilt pack
by pack from the spill. In-memory inputs keep the samples in memory (same output, byte for byte).
"""

from __future__ import annotations

import os
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from seqpack.data.prepare import RecordCounts
from seqpack.data.workers import PreparePool
from seqpack.io.fingerprint import describe_input
from seqpack.io.metadata import PackedMetadata
from seqpack.io.reader import load_packed
from seqpack.io.output_dir import temp_name
from seqpack.io.output_lock import lock_output
from seqpack.io.spill import SampleSpill
from seqpack.pipeline import stages
from seqpack.pipeline.job import PackJob
from seqpack.pipeline.metadata import build_metadata, media_metadata

__all__ = ["PackResult", "pack_dataset"]


@dataclass
class PackResult:
    """What :func:`pack_dataset` produced.

    Attributes:
        output: the dataset directory.
        metadata: the written :class:`~seqpack.io.PackedMetadata` (counts, efficiency, fingerprint...).
        report: the :class:`~seqpack.accounting.PrepareReport` (every dropped/truncated record).
        plan: the :class:`~seqpack.algorithms.PackingPlan`.
        timings_s: wall seconds per stage (``prepare``, ``plan``, ``write``, ``total``).
    """

    output: Path
    metadata: PackedMetadata
    report: Any
    plan: Any
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def num_packs(self) -> int:
        """Number of packs (rows) written, from the metadata."""
        return self.metadata.num_packs

    def load(self, expect: dict | None = None):
        """Open the written dataset (:func:`seqpack.io.load_packed`)."""
        return load_packed(self.output, expect=expect)


def pack_dataset(
    inputs: Any = None,
    output: str | os.PathLike = "packed",
    *,
    tokenizer: Any = "qwen3",
    seq_length: int = 4096,
    algorithm: Any = None,
    pad_to_multiple_of: int = 1,
    context_parallel_size: int = 1,
    overlength: str = "truncate",
    on_error: str = "raise",
    train_on: str = "assistant",
    seed: int = 0,
    format: str | None = "auto",
    overwrite: bool = False,
    rows_per_shard: int = 2048,
    validate: bool = True,
    progress: Any = None,
    log: Callable[[str], None] | None = None,
    image_processor: Any = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    num_proc: int | None = None,
    media_dir: str | os.PathLike | None = None,
    allow_any_media_path: bool = False,
) -> PackResult:
    """Pack chat/instruction data into an offline packed dataset (Parquet shards + metadata.json).

    Steps: read + normalise + tokenize (``seqpack.data.prepare``), expand image placeholders and apply
    the over-length policy (:func:`apply_length_policy`), plan the packs (``seqpack.algorithms.pack_lengths``), build one THD row per pack
    (``seqpack.packed.build_packed_sequence``, rows validated against every invariant of
    packed-batch-spec.md), write atomically (``seqpack.io.PackedWriter``).

    Image-text records (LLaVA ``image``/``images``, messages with image parts) are packed at their
    expanded length (image tokens included, a placeholder run never cut) and each pack stores, per
    segment in pack order, ``images`` (paths relative to the media root), ``image_grid_thw`` and
    ``image_tokens``: no pixels. ``load_packed(..., load_media=True)`` recomputes ``pixel_values`` with the
    image processor settings stored in ``metadata.json`` (``media``). Text-only records in the same inputs
    pack as usual. Image references must lie inside the media root (``media_dir``, default each data
    file's folder; ``seqpack.data.media_root``).

    Memory: input files are read and tokenized one at a time; samples go to a disk spill batch by batch
    as they are made (:class:`seqpack.io.spill.SampleSpill`, a hidden ``.<output name>.spill-*`` folder
    beside the output, deleted at the end and on error) and are dropped, so memory holds the length array and small
    per-sample metadata, not the token arrays; packs are then built from the spill pack by pack.
    In-memory inputs (``datasets.Dataset``, record lists) keep their samples in memory. Both paths give
    byte-identical output. Writing a row group of long packs peaks ~18 MB lower with Arrow on the C
    library's allocator (``ARROW_DEFAULT_MEMORY_POOL=system`` set before pyarrow is imported, as the
    ``seqpack`` command does: :mod:`seqpack.cli.allocator`); the bytes written are the same.

    Repeated inputs: the same file given twice, or a glob overlapping an explicit path, is read ONCE
    (files compared by real path; each repeat is named through ``log``, or without it as a WARNING on the
    ``seqpack.data.sources`` logger), so no record is packed twice.

    Args:
        inputs: path(s)/glob(s) of JSON/JSONL/Parquet files or ``datasets.Dataset`` objects; ``None``
            packs the embedded ``sample_chat.jsonl`` (:func:`sample_data_path`).
        output: dataset directory to create.
        tokenizer: tokenizer name/path or a loaded HF tokenizer (``"qwen3"`` = embedded Qwen3).
        seq_length: pack capacity in tokens; must be divisible by the pad multiple.
        algorithm: a ``PackingAlgorithm`` or its name (``None`` = ``DEFAULT_ALGORITHM``).
        pad_to_multiple_of: per-segment multiple (Megatron-Bridge ``pad_seq_to_mult``).
        context_parallel_size: CP size; CP > 1 pads every segment to a multiple of 2*CP.
        overlength, on_error, train_on, format: data-preparation policies (see ``seqpack.data.prepare``);
            ``format="auto"`` detects per record.
        seed: planner seed (pack order shuffle).
        overwrite: replace an existing dataset at ``output``.
        rows_per_shard: packs per Parquet shard.
        validate: check every built row (``PackedSequence.validate``) before writing.
        progress: optional ``rich.progress.Progress`` (one bar per stage) or a
            ``callback(stage, done, total)`` with stages ``prepare``, ``plan``, ``write``.
        log: optional callable receiving one-line stage messages.
        image_processor: Qwen2-VL image processor for image records: ``None`` (transformers'
            defaults), a ``preprocessor_config.json`` path/folder, a dict, or a processor.
        min_pixels, max_pixels: override the processor's pixel bounds (fewer pixels = fewer image
            tokens per image).
        num_proc: processes that render and tokenize records: ``None`` (default) = the cores available to
            this process (``len(os.sched_getaffinity(0))``), started once 2,048 records and 5 s of preparation
            were spent in this process (``seqpack.data.workers.AUTO_MIN_RECORDS``; smaller inputs never start them);
            1 = this process; N = N worker processes. The output (rows, report, metadata fingerprint) and
            the errors are the same for every value; not a metadata setting. A worker process that dies
            (e.g. killed by the out-of-memory killer) raises ``WorkerDiedError``; nothing is written.
        media_dir: the media root image references resolve against (``root/ref``, then
            ``root/images/ref``) and must stay inside after resolving symlinks; default: each data file's
            folder. Stored image paths are relative to it (or to the folder common to the data files),
            and it is recorded in ``metadata.json`` (``media.media_root``, outside the fingerprint).
        allow_any_media_path: read images wherever the records point (no media root check).

    Returns:
        :class:`PackResult`.

    Raises:
        PackConfigError: invalid settings (names the keys), e.g. ``seq_length`` not divisible by the
            multiple (case B23: capacity 150 with CP=2) or above the planner's capacity limit; checked
            before any data is read.
        NothingToPackError: every record was dropped or skipped (nothing is written).
        TypeError: ``tokenizer`` is neither a name/path nor a loaded tokenizer (checked before any work).
        FileExistsError: ``output`` exists and ``overwrite`` is False (checked before any work);
            ``seqpack.io.OutputBusyError`` (a FileExistsError): another run is writing ``output``.
        PermissionError: the output's parent is not writable, or ``overwrite`` would replace a dataset
            this user cannot delete (checked before any work).
        FileNotFoundError / seqpack.data errors: bad inputs (name the file, record and fix); a missing
            or unreadable image raises ``ValueError`` naming the sample and path (``on_error="skip"``
            lists it in the report as ``skipped``/``bad_media``; an image above PIL's pixel limit as
            ``image_too_large``; one outside the media root as ``media_outside_root``).
    """
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    bars = stages.Progress(progress)
    job = PackJob.create(
        inputs, output, tokenizer=tokenizer, seq_length=seq_length, algorithm=algorithm,
        pad_to_multiple_of=pad_to_multiple_of, context_parallel_size=context_parallel_size, overlength=overlength,
        on_error=on_error, train_on=train_on, seed=seed, format=format, overwrite=overwrite,
        rows_per_shard=rows_per_shard, validate=validate, image_processor=image_processor,
        min_pixels=min_pixels, max_pixels=max_pixels, num_proc=num_proc, media_dir=media_dir,
        allow_any_media_path=allow_any_media_path, log=log,
    )
    with lock_output(job.output):  # until published or failed; removes what killed runs left
        return _pack_locked(job, t0, say, bars)


def _pack_locked(job: PackJob, t0: float, say: Callable[[str], None], bars: Any) -> PackResult:
    """:func:`pack_dataset`'s work once the job is checked and the output's lock is held."""
    tok = stages.open_tokenizer(job)
    totals = stages.PrepareTotals()
    proc = job.image_processor
    spill = None
    workers = PreparePool(job.num_proc, tok.tokenizer)
    try:
        # ---- 1. prepare: files one at a time into a disk spill; in-memory inputs all at once in memory
        if not _FORCE_IN_MEMORY.get() and all(isinstance(i, (str, os.PathLike)) for i in job.inputs):
            output = job.output
            spill = SampleSpill(temp_name(output, "spill"))
            counts = RecordCounts(list(job.inputs))  # the prepare bar's total over all files
            for i, (item, name) in enumerate(zip(job.inputs, stages.input_names(job))):
                base = totals.report.records_read

                def file_progress(stage: str, done: int, total: int | None, _base: int = base, _i: int = i) -> None:
                    if stage != "prepare":
                        bars(stage, done, total)
                        return
                    if total is not None:
                        counts.learn(_i, total)
                    bars(stage, _base + done, counts.total())

                part = stages.prepare(job, tok, [item], [name], image_processor=proc, progress=file_progress,
                                      workers=workers, sink=spill.extend)
                proc = part.image_processor
                totals.add(part)
            num_samples, trainable, get_sample = len(spill), spill.trainable_tokens, spill.get
            lengths = spill.lengths()
        else:
            part = stages.prepare(job, tok, list(job.inputs), image_processor=proc, progress=bars, workers=workers)
            proc, samples = part.image_processor, part.samples
            totals.add(part)
            num_samples, trainable = len(samples), int(sum(s.num_trainable for s in samples))
            get_sample = samples.__getitem__
            lengths = np.fromiter((s.length for s in samples), dtype=np.int64, count=len(samples))
        workers.close()
        report = totals.finish()
        t_prep = time.perf_counter()
        stages.check_prepared(job, report, totals.sources, num_samples, totals.stats, say)

        # ---- 2. plan (the job's one pad multiple, as the row builder: case B24)
        plan = stages.plan(job, lengths, bars)
        t_plan = time.perf_counter()
        say(f"planned {plan.num_bins} packs (lower bound {plan.lower_bound}) with {job.algorithm.value}")

        # ---- 3. build rows and write atomically
        settings = job.metadata_settings(
            tokenizer_hash=tok.files_sha256, chat_template_hash=tok.chat_template_sha256, pad_token_id=tok.pad_token_id
        )
        media = ({**media_metadata(proc, tok.tokenizer, job.media_root, job.output), **totals.stats}
                 if totals.stats["images"] else None)
        meta = build_metadata(
            lengths=lengths, trainable_tokens=int(trainable), bins=plan.bins, lower_bound=int(plan.lower_bound),
            report=report, settings=settings, described_inputs=[describe_input(i) for i in job.inputs],
            tokenizer_name=tok.name, media=media,
            # the opt-out changes which image records are packed; not a setting of text-only data
            fingerprint_extra={"allow_any_media_path": True} if media and job.allow_any_media_path else None,
        )
        rows = stages.build_rows(job, plan.bins, get_sample, tok.pad_token_id, bars)
        meta = stages.write(job, rows, meta, report.entries)
    finally:
        workers.close()
        if spill is not None:
            spill.cleanup()
    t_end = time.perf_counter()
    say(f"wrote {meta.num_packs} packs to {job.output}")
    return PackResult(job.output, meta, report, plan, stages.timings(t0, t_prep, t_plan, t_end))


_FORCE_IN_MEMORY: ContextVar[bool] = ContextVar("seqpack_pack_in_memory", default=False)


def _pack_in_memory(*args: Any, **kwargs: Any) -> PackResult:
    """:func:`pack_dataset` with every prepared ``Sample`` kept in memory between prepare and writing
    (the path used for in-memory inputs). Same arguments and byte-identical output as the default
    file-by-file spill path; kept callable so tests can compare the two."""
    token = _FORCE_IN_MEMORY.set(True)
    try:
        return pack_dataset(*args, **kwargs)
    finally:
        _FORCE_IN_MEMORY.reset(token)
