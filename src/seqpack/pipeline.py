"""The offline packing job: prepare -> plan -> build rows -> write (used by ``seqpack pack`` and
:func:`pack_dataset`).

One source of truth for the pad multiple (case B24): :func:`seqpack.padding.compute_pad_multiple` is
called once here and the same integer goes to the planner (``pack_lengths(..., pad_to_multiple_of=m)``),
the row builder (``build_packed_sequence(..., pad_to_multiple_of=m)``), the row validator and the
metadata (``effective_pad_multiple``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from seqpack.io.fingerprint import compute_fingerprint, describe_input
from seqpack.io.metadata import FORMAT_VERSION, PackedMetadata
from seqpack.io.writer import PackedWriter, check_output_dir
from seqpack.padding import compute_pad_multiple

__all__ = [
    "NothingToPackError",
    "PackConfigError",
    "PackResult",
    "build_metadata",
    "pack_dataset",
    "resolve_algorithm",
    "sample_data_path",
]


class PackConfigError(ValueError):
    """Invalid packing settings (the message names the config keys and the fix)."""


class NothingToPackError(ValueError):
    """Every input record was dropped or skipped; the message gives the counts per reason."""


def sample_data_path() -> Path:
    """Path of the embedded demo dataset ``seqpack/resources/sample_chat.jsonl`` (40 OpenAI-format
    chats written for seqpack: system prompts, multi-turn, tool calls with ``tools``)."""
    return Path(str(resources.files("seqpack") / "resources" / "sample_chat.jsonl"))


def resolve_algorithm(algorithm: Any) -> Any:
    """Return the :class:`~seqpack.algorithms.PackingAlgorithm` for a name/enum (``None`` = default).

    Raises:
        PackConfigError: unknown name (lists the valid ones).
    """
    from seqpack.algorithms import DEFAULT_ALGORITHM, PackingAlgorithm

    if algorithm is None:
        return PackingAlgorithm(DEFAULT_ALGORITHM)
    if isinstance(algorithm, PackingAlgorithm):
        return algorithm
    try:
        return PackingAlgorithm(str(algorithm).lower().replace("-", "_"))
    except ValueError:
        names = ", ".join(a.value for a in PackingAlgorithm)
        raise PackConfigError(f"unknown algorithm {algorithm!r} (key: algorithm); choose one of: {names}") from None


@dataclass
class PackResult:
    """What :func:`pack_dataset` produced.

    Attributes:
        output: the dataset directory.
        metadata: the written :class:`~seqpack.io.PackedMetadata` (counts, efficiency, fingerprint...).
        report: the :class:`~seqpack.data.sample.PrepareReport` (every dropped/truncated record).
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
        return self.metadata.num_packs

    def load(self, expect: dict | None = None):
        """Open the written dataset (:func:`seqpack.io.load_packed`)."""
        from seqpack.io.reader import load_packed

        return load_packed(self.output, expect=expect)


def _validate_settings(seq_length: int, pad_to_multiple_of: int, context_parallel_size: int) -> int:
    if isinstance(seq_length, bool) or not isinstance(seq_length, (int, np.integer)) or seq_length < 1:
        raise PackConfigError(f"seq_length must be an integer >= 1, got {seq_length!r}")
    try:
        m = compute_pad_multiple(pad_to_multiple_of, context_parallel_size)
    except ValueError as e:
        raise PackConfigError(str(e)) from None
    if seq_length % m:
        lo = (seq_length // m) * m
        hint = f"{lo} or {lo + m}" if lo else f"{m}"
        raise PackConfigError(
            f"seq_length={seq_length} is not divisible by the pad multiple {m} = compute_pad_multiple("
            f"pad_to_multiple_of={pad_to_multiple_of}, context_parallel_size={context_parallel_size})"
            + (" (context parallelism needs every segment padded to 2*CP)" if context_parallel_size > 1 else "")
            + f"; choose seq_length = {hint}, or change pad_to_multiple_of / context_parallel_size"
        )
    return m


def _validate_policies(**given: Any) -> None:
    """Check the data-preparation policies up front (before loading a tokenizer or reading data)."""
    from seqpack.data.formats import FORMATS
    from seqpack.data.prepare import ON_ERROR
    from seqpack.data.tokenize import OVERLENGTH_POLICIES, TRAIN_ON

    allowed = {
        "overlength": OVERLENGTH_POLICIES,
        "on_error": ON_ERROR,
        "train_on": TRAIN_ON,
        "format": ("auto", None, *FORMATS),
    }
    for key, val in given.items():
        if val not in allowed[key]:
            choices = ", ".join(str(c) for c in allowed[key] if c is not None)
            raise PackConfigError(f"{key}={val!r} is not valid (--{key.replace('_', '-')}); choose one of: {choices}")


def _tokenizer_hashes(tok: Any) -> tuple[str | None, str | None]:
    """``(tokenizer files sha256, chat template sha256)`` from ``seqpack.data.tokenizer_fingerprint``
    (the one place tokenizers are identified)."""
    from seqpack.data.tokenizer import tokenizer_fingerprint

    fp = tokenizer_fingerprint(tok)
    return fp.get("files_sha256"), fp.get("chat_template_sha256")


def _describe_inputs(inputs: Sequence[Any]) -> list[dict[str, Any]]:
    """:func:`~seqpack.io.describe_input` of every input after glob expansion (as ``prepare`` reads them)."""
    from seqpack.data.formats import expand_inputs

    return [describe_input(i) for i in expand_inputs(list(inputs))]


class _Stages:
    """Adapt ``progress`` (a ``rich.progress.Progress``, a ``callback(stage, done, total)`` or None)
    to one bar per stage: ``prepare`` (reading + tokenizing, reported by ``seqpack.data.prepare``),
    ``plan`` and ``write``."""

    _LABELS = {"prepare": "reading + tokenizing records", "plan": "planning packs", "write": "building + writing packs"}

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


def _pad_token_id(tok: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        v = getattr(tok, attr, None)
        if isinstance(v, int):
            return v
    return 0


def build_metadata(
    *,
    lengths: np.ndarray,
    trainable_tokens: int,
    bins: Sequence[np.ndarray],
    lower_bound: int,
    report: Any,
    settings: dict[str, Any],
    described_inputs: list[dict[str, Any]],
    tokenizer_name: str | None,
    fingerprint_extra: dict[str, Any] | None = None,
) -> PackedMetadata:
    """Compute every statistic of ``metadata.json`` from the packing outcome (shared by all engines).

    Args:
        lengths: int64 ``[n]`` real length of every packed sample (tokens).
        trainable_tokens: labels != -100 over all samples.
        bins: the plan's packs (indices into ``lengths``).
        lower_bound: the planner's lower bound on the number of packs.
        report: the ``PrepareReport`` (``records_read`` and per-reason counts).
        settings: ``seq_length``, ``pad_to_multiple_of``, ``context_parallel_size``,
            ``effective_pad_multiple``, ``algorithm``, ``seed``, ``overlength``, ``train_on``,
            ``on_error``, ``format``, ``tokenizer_hash``, ``chat_template_hash``, ``pad_token_id``
            (+ ``format_version``); all of it enters the fingerprint.
        described_inputs: :func:`seqpack.io.describe_input` of every input file.
        tokenizer_name: name/path recorded as ``tokenizer``.
        fingerprint_extra: further settings that change the output (e.g. an engine's planning mode).

    Returns:
        :class:`~seqpack.io.PackedMetadata` without shards (the writer fills them).

    Raises:
        ValueError: no bins (nothing to pack).
    """
    if len(bins) == 0:
        raise ValueError("build_metadata: no packs")
    cap = int(settings["seq_length"])
    m = int(settings["effective_pad_multiple"])
    lengths = np.asarray(lengths, dtype=np.int64)
    num_packs = len(bins)
    tokens = int(lengths.sum())
    padded_tokens = int((-(-lengths // m) * m).sum())
    bin_real = np.array([int(lengths[np.asarray(b)].sum()) for b in bins], dtype=np.int64)
    counts: dict[str, Any] = {
        "records_read": int(report.records_read),
        "samples_packed": int(lengths.shape[0]),
        "tokens": tokens,
        "trainable_tokens": int(trainable_tokens),
        "alignment_padding_tokens": padded_tokens - tokens,
        "tail_padding_tokens": num_packs * cap - padded_tokens,
    }
    for status, reasons in report.by_reason().items():
        counts[status] = dict(reasons)
    fp_settings = dict(settings)
    if fingerprint_extra:
        fp_settings.update(fingerprint_extra)
    return PackedMetadata(
        seq_length=cap,
        pad_to_multiple_of=int(settings["pad_to_multiple_of"]),
        context_parallel_size=int(settings["context_parallel_size"]),
        effective_pad_multiple=m,
        algorithm=str(settings["algorithm"]),
        seed=int(settings["seed"]),
        overlength=settings["overlength"],
        train_on=settings["train_on"],
        on_error=settings["on_error"],
        format=settings.get("format"),
        tokenizer=tokenizer_name,
        tokenizer_hash=settings.get("tokenizer_hash"),
        chat_template_hash=settings.get("chat_template_hash"),
        pad_token_id=settings.get("pad_token_id"),
        counts=counts,
        num_packs=num_packs,
        lower_bound=int(lower_bound),
        packing_efficiency=round(tokens / (num_packs * cap), 6),
        packing_factor=round(int(lengths.shape[0]) / num_packs, 6),
        max_samples_per_bin=max(len(b) for b in bins),
        dataset_max_seqlen=int(lengths.max()),
        min_packed_seqlen=int(bin_real.min()),
        fingerprint=compute_fingerprint(described_inputs, fp_settings),
        inputs=list(described_inputs),
        extra={"fingerprint_extra": dict(fingerprint_extra)} if fingerprint_extra else {},
    )


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
) -> PackResult:
    """Pack chat/instruction data into an offline packed dataset (Parquet shards + metadata.json).

    Steps: read + normalise + tokenize (``seqpack.data.prepare``, with the over-length policy), plan
    the packs (``seqpack.algorithms.pack_lengths``), build one THD row per pack
    (``seqpack.packed.build_packed_sequence``, rows validated against every invariant of
    packed-batch-spec.md), write atomically (``seqpack.io.PackedWriter``).

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

    Returns:
        :class:`PackResult`.

    Raises:
        PackConfigError: invalid settings (names the keys), e.g. ``seq_length`` not divisible by the
            multiple (case B23: capacity 150 with CP=2).
        NothingToPackError: every record was dropped or skipped (nothing is written).
        FileExistsError: ``output`` exists and ``overwrite`` is False (checked before any work).
        FileNotFoundError / seqpack.data errors: bad inputs (name the file, record and fix).
    """
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    stages = _Stages(progress)
    m = _validate_settings(seq_length, pad_to_multiple_of, context_parallel_size)
    algo = resolve_algorithm(algorithm)
    _validate_policies(overlength=overlength, on_error=on_error, train_on=train_on, format=format)
    output = Path(output)
    check_output_dir(output, overwrite)
    if inputs is None:
        inputs = [sample_data_path()]
    elif isinstance(inputs, (str, os.PathLike)) or not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    fmt = None if format in (None, "auto") else format

    from seqpack.data import prepare
    from seqpack.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    tok_name = str(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else getattr(tok, "name_or_path", None)
    tok_hash, chat_hash = _tokenizer_hashes(tok)

    # ---- 1. read, normalise, tokenize
    samples, report = prepare(
        list(inputs), tok, seq_length=seq_length, overlength=overlength, on_error=on_error,
        train_on=train_on, format=fmt, progress=stages,
    )
    t_prep = time.perf_counter()
    say(f"prepared {len(samples)} samples from {report.records_read} records")
    if not samples:
        raise NothingToPackError(
            f"no sample left to pack: {report.records_read} record(s) read, none usable "
            f"({report.by_reason() or 'no records'}); check the inputs, --format and --overlength/--on-error"
        )

    # ---- 2. plan (same multiple m as the builder: case B24)
    from seqpack.algorithms import pack_lengths

    lengths = np.fromiter((s.length for s in samples), dtype=np.int64, count=len(samples))
    stages("plan", 0, 1)
    plan = pack_lengths(lengths, seq_length, algo, seed=seed, pad_to_multiple_of=m)
    stages("plan", 1, 1)
    order = np.concatenate(plan.bins) if plan.bins else np.zeros(0, np.int64)
    if order.shape[0] != len(samples) or not np.array_equal(np.sort(order), np.arange(len(samples))):
        raise RuntimeError(  # planner bug: every sample must be in exactly one pack
            f"packing plan ({algo.value}) does not place every sample exactly once "
            f"({order.shape[0]} placements for {len(samples)} samples)"
        )
    t_plan = time.perf_counter()
    say(f"planned {plan.num_bins} packs (lower bound {plan.lower_bound}) with {algo.value}")

    # ---- 3. build rows and write atomically
    from seqpack.packed import build_packed_sequence

    pad_id = _pad_token_id(tok)

    def rows() -> Iterator[Any]:
        total = len(plan.bins)
        stages("write", 0, total)
        for k, b in enumerate(plan.bins, 1):
            row = build_packed_sequence(
                [samples[int(i)] for i in b], pad_to_multiple_of=m, pad_token_id=pad_id, seq_length=seq_length
            )
            if validate:
                row.validate(capacity=seq_length, context_parallel_size=context_parallel_size, multiple=m)
            if k % 64 == 0 or k == total:
                stages("write", k, total)
            yield row

    settings = {
        "format_version": FORMAT_VERSION,
        "seq_length": int(seq_length),
        "pad_to_multiple_of": int(pad_to_multiple_of),
        "context_parallel_size": int(context_parallel_size),
        "effective_pad_multiple": int(m),
        "algorithm": algo.value,
        "seed": int(seed),
        "overlength": overlength,
        "train_on": train_on,
        "on_error": on_error,
        "format": fmt,
        "tokenizer_hash": tok_hash,
        "chat_template_hash": chat_hash,
        "pad_token_id": pad_id,
    }
    meta = build_metadata(
        lengths=lengths,
        trainable_tokens=int(sum(s.num_trainable for s in samples)),
        bins=plan.bins,
        lower_bound=int(plan.lower_bound),
        report=report,
        settings=settings,
        described_inputs=_describe_inputs(inputs),
        tokenizer_name=tok_name,
    )
    with PackedWriter(output, overwrite=overwrite, rows_per_shard=rows_per_shard) as w:
        w.write_all(rows())
        meta = w.finalize(meta, report.entries)
    t_end = time.perf_counter()
    say(f"wrote {meta.num_packs} packs to {output}")
    return PackResult(
        output=output,
        metadata=meta,
        report=report,
        plan=plan,
        timings_s={
            "prepare": round(t_prep - t0, 3),
            "plan": round(t_plan - t_prep, 3),
            "write": round(t_end - t_plan, 3),
            "total": round(t_end - t0, 3),
        },
    )
