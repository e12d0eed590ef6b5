"""The offline packing job: prepare -> expand images + over-length policy -> plan -> build rows -> write
(used by ``seqpack pack`` and :func:`pack_dataset`).

Image-text records are packed at their expanded length: every ``<image>`` becomes the model's image-token
run (``seqpack.data.media``), so packing costs include image tokens, and each pack stores its segments'
image paths and ``image_grid_thw`` (no pixels; ``load_packed(..., load_media=True)`` recomputes them with
the image processor settings recorded in ``metadata.json``).

Memory (issue #8): input files are prepared one at a time and their samples spilled to disk
(:class:`seqpack.io.spill.SampleSpill`); planning uses the int64 length array and rows are rebuilt pack
by pack from the spill, so peak memory does not grow with the corpus beyond the length array and small
per-sample metadata. In-memory inputs keep the samples in memory (same output, byte for byte).

One source of truth for the pad multiple (case B24): :func:`seqpack.padding.compute_pad_multiple` is
called once here and the same integer goes to the planner (``pack_lengths(..., pad_to_multiple_of=m)``),
the row builder (``build_packed_sequence(..., pad_to_multiple_of=m)``), the row validator and the
metadata (``effective_pad_multiple``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from seqpack.io.fingerprint import compute_fingerprint, describe_input
from seqpack.io.metadata import FORMAT_VERSION, PackedMetadata
from seqpack.io.writer import PackedWriter, check_output_dir
from seqpack.algorithms import resolve_algorithm
from seqpack.padding import check_seq_length, compute_pad_multiple

__all__ = [
    "NothingToPackError",
    "PackConfigError",
    "PackResult",
    "apply_length_policy",
    "build_metadata",
    "dedupe_inputs",
    "media_metadata",
    "pack_dataset",
    "processor_settings",
    "resolve_image_processor",
    "sample_data_path",
]


_UNLIMITED = 2**31 - 1  # prepare's seq_length for the unlimited first pass


class PackConfigError(ValueError):
    """Invalid packing settings (the message names the config keys and the fix)."""


class NothingToPackError(ValueError):
    """Every input record was dropped or skipped; the message gives the counts per reason."""


def sample_data_path() -> Path:
    """Path of the embedded demo dataset ``seqpack/resources/sample_chat.jsonl`` (40 OpenAI-format
    chats written for seqpack: system prompts, multi-turn, tool calls with ``tools``)."""
    return Path(str(resources.files("seqpack") / "resources" / "sample_chat.jsonl"))


#: ``pack_dataset`` keyword -> ``seqpack pack`` flag, for messages that name both.
PACK_FLAGS = {
    "seq_length": "--seq-length",
    "pad_to_multiple_of": "--pad-to-multiple-of",
    "context_parallel_size": "--context-parallel-size",
}


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
        """Number of packs (rows) written, from the metadata."""
        return self.metadata.num_packs

    def load(self, expect: dict | None = None):
        """Open the written dataset (:func:`seqpack.io.load_packed`)."""
        from seqpack.io.reader import load_packed

        return load_packed(self.output, expect=expect)


def _validate_settings(seq_length: int, pad_to_multiple_of: int, context_parallel_size: int) -> int:
    """Check the packing settings before anything is read; return the effective pad multiple.

    Checks (each error names the config key and the ``seqpack pack`` flag): ``seq_length`` is an
    integer >= 1 that fits the int32 boundary arrays; the multiple ``compute_pad_multiple(
    pad_to_multiple_of, context_parallel_size)`` is valid; ``seq_length`` is divisible by it (case
    B23); ``seq_length / multiple`` is within :data:`seqpack.algorithms.MAX_CAPACITY_UNITS` (the
    planner keeps O(capacity) tables).

    Raises:
        PackConfigError: any of the above.
    """
    from seqpack.algorithms import MAX_CAPACITY_UNITS

    if isinstance(seq_length, bool) or not isinstance(seq_length, (int, np.integer)) or seq_length < 1:
        raise PackConfigError(f"seq_length (--seq-length) must be an integer >= 1, got {seq_length!r}")
    if seq_length > np.iinfo(np.int32).max:
        raise PackConfigError(
            f"seq_length={seq_length} (--seq-length) does not fit the int32 boundary arrays "
            f"(cu_seqlens); use at most {np.iinfo(np.int32).max}"
        )
    try:
        m = compute_pad_multiple(pad_to_multiple_of, context_parallel_size)
    except ValueError as e:
        raise PackConfigError(f"{e} (--pad-to-multiple-of / --context-parallel-size)") from None
    check_seq_length(
        seq_length, m, {"pad_to_multiple_of": pad_to_multiple_of, "context_parallel_size": context_parallel_size},
        flags=PACK_FLAGS, error=PackConfigError,
    )
    if seq_length // m > MAX_CAPACITY_UNITS:
        need = -(-seq_length // MAX_CAPACITY_UNITS)
        raise PackConfigError(
            f"seq_length={seq_length} (--seq-length) / pad multiple {m} = {seq_length // m} units exceeds the "
            f"planner's limit of {MAX_CAPACITY_UNITS} (seqpack.algorithms.MAX_CAPACITY_UNITS; the packing kernels "
            f"keep O(capacity) tables); lower --seq-length to at most {MAX_CAPACITY_UNITS * m}, or raise "
            f"--pad-to-multiple-of to a value >= {need} that divides --seq-length"
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


def _input_list(inputs: Any) -> list[Any]:
    """``inputs`` as a list: ``None`` = the embedded demo data, one path/dataset = a one-item list."""
    if inputs is None:
        return [sample_data_path()]
    if isinstance(inputs, (str, os.PathLike)) or not isinstance(inputs, (list, tuple)):
        return [inputs]
    return list(inputs)


def _load_tokenizer(tokenizer: Any) -> tuple[Any, str | None]:
    """``(tokenizer object, name recorded in metadata)`` from a name/path (``load_tokenizer``) or an object."""
    from seqpack.data.tokenizer import load_tokenizer

    if isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer), str(tokenizer)
    return tokenizer, getattr(tokenizer, "name_or_path", None)


def _tokenizer_hashes(tok: Any) -> tuple[str | None, str | None]:
    """``(tokenizer files sha256, chat template sha256)`` from ``seqpack.data.tokenizer_fingerprint``
    (the one place tokenizers are identified)."""
    from seqpack.data.tokenizer import tokenizer_fingerprint

    fp = tokenizer_fingerprint(tok)
    return fp.get("files_sha256"), fp.get("chat_template_sha256")


def _metadata_settings(
    *,
    seq_length: int,
    pad_to_multiple_of: int,
    context_parallel_size: int,
    effective_pad_multiple: int,
    algorithm: str,
    seed: int,
    overlength: str,
    train_on: str,
    on_error: str,
    format: str | None,
    tokenizer_hash: str | None,
    chat_template_hash: str | None,
    pad_token_id: int,
) -> dict[str, Any]:
    """The ``settings`` dict given to :func:`build_metadata` (every key enters the fingerprint), built in
    one place so the local and Ray engines write identical metadata for identical runs."""
    return {
        "format_version": FORMAT_VERSION,
        "seq_length": int(seq_length),
        "pad_to_multiple_of": int(pad_to_multiple_of),
        "context_parallel_size": int(context_parallel_size),
        "effective_pad_multiple": int(effective_pad_multiple),
        "algorithm": algorithm,
        "seed": int(seed),
        "overlength": overlength,
        "train_on": train_on,
        "on_error": on_error,
        "format": format,
        "tokenizer_hash": tokenizer_hash,
        "chat_template_hash": chat_template_hash,
        "pad_token_id": pad_token_id,
    }


def dedupe_inputs(inputs: Sequence[Any], log: Callable[[str], None] | None = None) -> list[Any]:
    """Expand globs and drop repeated files, keeping the first occurrence (input order kept).

    The same file given twice, or a glob that overlaps an explicit path, would otherwise be read twice
    and every record packed twice (duplicate ``sample_ids``). Files are compared by
    ``os.path.realpath`` (symlinks and ``./a`` vs ``a`` resolve to the same file); in-memory
    datasets/records are never merged. Each dropped repeat is reported through ``log`` (else as a
    WARNING on the ``seqpack.data.formats`` logger).

    Returns:
        the expanded inputs (``Path`` objects, datasets, record lists), without repeats.

    Raises:
        FileNotFoundError / DataFormatError: from ``seqpack.data.formats.expand_inputs`` (missing path,
            empty glob, directory).
    """
    from seqpack.data.formats import _dedupe_paths, expand_inputs

    inputs = list(inputs)
    if inputs and all(isinstance(x, dict) for x in inputs):  # one list of in-memory records
        return expand_inputs(inputs)
    expanded = [x for item in inputs for x in expand_inputs([item])]  # per item: repeats are seen here
    return _dedupe_paths(expanded, log)


def _input_label(item: Any) -> str:
    return os.fspath(item) if isinstance(item, (str, os.PathLike)) else f"<{type(item).__name__}>"


def _empty_inputs(items: Sequence[Any], sources: set[str], entries: Sequence[Any]) -> list[str]:
    """Inputs (files) that produced neither a sample (``sources``: ``str(Sample.source)`` of every
    packed sample) nor a report entry: they hold no record."""
    seen = set(sources) | {str(e.source) for e in entries}
    out = []
    for it in items:
        if isinstance(it, (str, os.PathLike)):
            name = os.fspath(it)
            if name not in seen and str(Path(name)) not in seen and Path(name).name not in seen:
                out.append(name)
    return out


_MEDIA_OVERLENGTH = {"truncate": "truncate", "drop": "drop", "error": "error", "split": "drop"}


def resolve_image_processor(
    image_processor: Any = None, *, min_pixels: int | None = None, max_pixels: int | None = None
) -> Any:
    """Build the Qwen2-VL image processor for image-text records (``seqpack.data.media.load_image_processor``).

    Args:
        image_processor: ``None`` (transformers' defaults), a ``preprocessor_config.json`` path (or a
            folder holding one), a settings dict, or a processor.
        min_pixels, max_pixels: override the processor's pixel bounds (``size.shortest_edge`` /
            ``size.longest_edge`` in transformers 5: the resized image's area in pixels stays in
            [min_pixels, max_pixels]).

    Raises:
        PackConfigError: the config file is missing/invalid, or the bounds are not 1 <= min <= max
            (names ``--image-processor`` / ``--min-pixels`` / ``--max-pixels``).
    """
    from seqpack.data.media import load_image_processor

    for key, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise PackConfigError(f"{key} (--{key.replace('_', '-')}) must be an integer >= 1, got {v!r}")
    if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
        raise PackConfigError(f"min_pixels={min_pixels} > max_pixels={max_pixels} (--min-pixels/--max-pixels)")
    try:
        proc = load_image_processor(image_processor)
        if min_pixels is not None or max_pixels is not None:
            cfg = processor_settings(proc)
            size = dict(cfg.get("size") or {})
            if min_pixels is not None:
                size["shortest_edge"] = int(min_pixels)
                cfg["min_pixels"] = int(min_pixels)
            if max_pixels is not None:
                size["longest_edge"] = int(max_pixels)
                cfg["max_pixels"] = int(max_pixels)
            lo, hi = size.get("shortest_edge"), size.get("longest_edge")
            if lo is not None and hi is not None and lo > hi:
                raise PackConfigError(
                    f"min_pixels={lo} > max_pixels={hi} after applying --min-pixels/--max-pixels to the "
                    "image processor config; set both"
                )
            cfg["size"] = size
            proc = load_image_processor(cfg)
    except (FileNotFoundError, json.JSONDecodeError, TypeError, ValueError) as e:
        if isinstance(e, PackConfigError):
            raise
        raise PackConfigError(f"image processor (--image-processor {image_processor}): {e}") from None
    return proc


def processor_settings(proc: Any) -> dict[str, Any]:
    """JSON-safe settings of an image processor (``to_dict()``); ``load_image_processor`` of the result
    rebuilds an equivalent processor (same resize bounds, patch/merge sizes, normalisation)."""
    d = proc.to_dict() if hasattr(proc, "to_dict") else dict(proc)
    d = json.loads(json.dumps(d, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    size = d.get("size") or {}
    for key, alt in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if d.get(key) is None and isinstance(size, dict) and size.get(alt) is not None:
            d[key] = size[alt]
    return d


def media_metadata(proc: Any, tok: Any) -> dict[str, Any]:
    """The ``metadata.json`` ``media`` section: image processor settings (``image_processor``, the full
    config; ``min_pixels``, ``max_pixels``, ``patch_size``, ``merge_size``, ``temporal_patch_size``) and
    the vision token ids (``image_pad_id``, ``vision_start_id``, ``vision_end_id``)."""
    from seqpack.data.media import VisionTokens

    cfg = processor_settings(proc)
    vt = VisionTokens.from_tokenizer(tok)
    return {
        "image_processor": cfg,
        "min_pixels": cfg.get("min_pixels"),
        "max_pixels": cfg.get("max_pixels"),
        "patch_size": cfg.get("patch_size"),
        "merge_size": cfg.get("merge_size"),
        "temporal_patch_size": cfg.get("temporal_patch_size"),
        "image_pad_id": vt.image_pad_id,
        "vision_start_id": vt.vision_start_id,
        "vision_end_id": vt.vision_end_id,
    }


class _InMemoryImageError(ValueError):
    """An image given as an object (PIL, bytes) where the offline dataset needs a path."""


def _image_ref(ref: Any, where: str) -> str:
    if isinstance(ref, dict) and isinstance(ref.get("path"), str) and not ref.get("bytes"):
        ref = ref["path"]
    if isinstance(ref, (str, os.PathLike)):
        s = os.fspath(ref)
        return s if s.startswith(("data:", "http://", "https://", "s3://", "gs://", "hf://")) else os.path.abspath(s)
    raise _InMemoryImageError(
        f"{where}: image is an in-memory {type(ref).__name__}; the offline dataset stores image references "
        "(paths), not pixels. Fix: save the images to files and reference them by path, or pack in batch/"
        "streaming mode (seqpack.collate / seqpack.stream with seqpack.data.media.prepare_multimodal)"
    )


def apply_length_policy(
    samples: Sequence[Any],
    report: Any,
    tokenizer: Any,
    *,
    seq_length: int,
    overlength: str,
    on_error: str,
    image_processor: Any = None,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> tuple[list[Any], Any, dict[str, int]]:
    """Final length step of the offline path, after an unlimited-length ``prepare``.

    Text-only samples longer than ``seq_length`` go through ``seqpack.data.tokenize.apply_overlength``
    (the same policy ``prepare`` applies). Samples with images go through
    ``seqpack.data.media.expand_image_placeholders``: each ``<image>`` becomes ``<|vision_start|>`` +
    n x ``<|image_pad|>`` + ``<|vision_end|>`` with n = prod(image_grid_thw) // merge_size**2, then the
    policy acts on the expanded length (``truncate`` cuts before an image run, never inside;
    ``split`` drops, since an image sample cannot be split). The sample's ``media`` keeps only
    references: ``images`` (absolute paths), ``image_grid_thw`` (int64 [k, 3]) and ``image_tokens``
    (int64 [k]); pixels are dropped (recomputed at load time).

    Returns:
        ``(samples, report, stats)`` with ``stats = {"images", "image_tokens", "samples_with_images"}``;
        ``report`` gets one entry per dropped/truncated/split/skipped sample and updated totals.

    Raises:
        ValueError: an unreadable/missing image with ``on_error="raise"`` (names the sample id, source,
            index and path), an in-memory image, or an over-length sample under ``overlength="error"``.
    """
    from seqpack.data.sample import IGNORE_INDEX, SampleRecord
    from seqpack.data.tokenize import apply_overlength

    out: list[Any] = []
    stats = {"images": 0, "image_tokens": 0, "samples_with_images": 0}
    proc = image_processor
    total = len(samples)
    for k, s in enumerate(samples, 1):
        imgs = list((s.media or {}).get("images") or [])
        if not imgs:
            if s.length <= seq_length:
                out.append(s)
                continue
            lab = np.asarray(s.labels)
            tr = np.zeros(s.length, dtype=bool)
            tr[1:] = lab[:-1] != IGNORE_INDEX
            new, entries = apply_overlength(
                s.input_ids, tr, seq_length=seq_length, overlength=overlength, sample_id=s.sample_id,
                source=s.source, index=s.index, media=s.media, meta=s.meta,
            )
            out.extend(new)
            report.entries.extend(entries)
            continue
        from seqpack.data.media import OverlengthError as MediaOverlengthError
        from seqpack.data.media import expand_image_placeholders, load_image_processor

        if proc is None:
            proc = load_image_processor(None)
        where = f"sample {s.sample_id!r} (source {s.source}, index {s.index})"
        try:
            refs = [_image_ref(r, where) for r in imgs]
            new, rec = expand_image_placeholders(
                s, tokenizer, proc, images=refs, seq_length=seq_length, overlength=_MEDIA_OVERLENGTH[overlength]
            )
        except MediaOverlengthError as e:
            raise ValueError(f"{e} (--overlength error)") from e
        except ValueError as e:
            if on_error == "raise":
                if isinstance(e, _InMemoryImageError):
                    raise
                raise ValueError(
                    f"{e}. Fix: correct the image path in the record, or pass --on-error skip "
                    "(on_error='skip') to list such records in report.jsonl and pack the rest"
                ) from e
            report.entries.append(SampleRecord(s.sample_id, s.source, s.index, "skipped", "bad_media", str(e)))
            continue
        if rec is not None:
            if overlength == "split" and rec.status == "dropped" and rec.reason == "overlength":
                rec = SampleRecord(rec.sample_id, rec.source, rec.index, "dropped", "overlength_media",
                                   rec.detail + "; a sample with images is dropped rather than split",
                                   rec.tokens_before, rec.tokens_after)
            report.entries.append(rec)
        if new is not None:
            media = dict(new.media or {})
            grid = np.asarray(media.get("image_grid_thw", np.zeros((0, 3))), dtype=np.int64).reshape(-1, 3)
            ntok = np.prod(grid, axis=1) // (int(proc.merge_size) ** 2)
            new.media = {"images": list(media.get("images") or []), "image_grid_thw": grid, "image_tokens": ntok}
            stats["images"] += int(grid.shape[0])
            stats["image_tokens"] += int(ntok.sum())
            stats["samples_with_images"] += 1
            out.append(new)
        if progress is not None and (k % 64 == 0 or k == total):
            progress("media", k, total)
    report.samples_out = len(out)
    report.tokens = int(sum(x.length for x in out))
    report.trainable_tokens = int(sum(x.num_trainable for x in out))
    return out, report, stats


class _Stages:
    """Adapt ``progress`` (a ``rich.progress.Progress``, a ``callback(stage, done, total)`` or None)
    to one bar per stage: ``prepare`` (reading + tokenizing, reported by ``seqpack.data.prepare``),
    ``plan`` and ``write``."""

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
    media: dict[str, Any] | None = None,
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
        media: the ``media`` section for datasets with images (:func:`media_metadata` plus counts
            ``images``, ``image_tokens``, ``samples_with_images``); its image processor settings
            enter the fingerprint.

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
    if media:
        fp_settings["image_processor"] = media.get("image_processor")
        for key in ("images", "image_tokens", "samples_with_images"):
            if key in media:
                counts[key] = int(media[key])
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
        media=dict(media) if media else None,
    )


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


def _prepare_in_memory(
    items: list[Any], tok: Any, *, seq_length: int, overlength: str, on_error: str, train_on: str,
    fmt: str | None, proc: Any, stages: Any,
) -> tuple[list[Any], Any, dict[str, int], Any]:
    """Stage 1 on all inputs at once: ``(samples, report, media_stats, image_processor)``."""
    from seqpack.data import prepare
    from seqpack.data.formats import InMemoryRecords

    prep_inputs: Any = items[0] if len(items) == 1 and isinstance(items[0], InMemoryRecords) else items
    samples, report = prepare(
        prep_inputs, tok, seq_length=_UNLIMITED, overlength="error", on_error=on_error,
        train_on=train_on, format=fmt, progress=stages,
    )
    if proc is None and any((s.media or {}).get("images") for s in samples):
        proc = resolve_image_processor(None)
    samples, report, media_stats = apply_length_policy(
        samples, report, tok, seq_length=seq_length, overlength=overlength, on_error=on_error,
        image_processor=proc, progress=stages,
    )
    return samples, report, media_stats, proc


def _prepare_to_spill(
    items: list[Any], spill: Any, tok: Any, *, seq_length: int, overlength: str, on_error: str, train_on: str,
    fmt: str | None, proc: Any, stages: Any,
) -> tuple[Any, dict[str, int], Any, set[str]]:
    """Stage 1 one input file at a time, each file's samples appended to ``spill`` then dropped.

    Gives the same samples (ids, order), report and media counts as :func:`_prepare_in_memory` on all
    files at once: sample ids use the display names of the whole input list
    (``seqpack.data.prepare._display_names``, which tells apart files sharing a name), and the report
    lists every read/tokenize entry (all files, in order) before the over-length/image entries.
    Returns ``(report, media_stats, image_processor, sources)``.
    """
    from seqpack.data import prepare
    from seqpack.data.prepare import _display_names, _rename_source
    from seqpack.data.sample import PrepareReport

    names = _display_names(items)
    report = PrepareReport()
    policy_entries: list[Any] = []
    stats = {"images": 0, "image_tokens": 0, "samples_with_images": 0}
    sources: set[str] = set()
    for item, name in zip(items, names):
        base = report.records_read

        def progress(stage: str, done: int, total: int | None, _base: int = base) -> None:
            stages(stage, _base + done if stage == "prepare" else done, total)

        samples, rep = prepare(
            [item], tok, seq_length=_UNLIMITED, overlength="error", on_error=on_error,
            train_on=train_on, format=fmt, progress=progress,
        )
        _rename_source((*samples, *rep.entries), _display_names([item])[0], name)
        if proc is None and any((s.media or {}).get("images") for s in samples):
            proc = resolve_image_processor(None)
        n_prep = len(rep.entries)
        samples, rep, st = apply_length_policy(
            samples, rep, tok, seq_length=seq_length, overlength=overlength, on_error=on_error,
            image_processor=proc, progress=stages,
        )
        policy_entries.extend(rep.entries[n_prep:])
        del rep.entries[n_prep:]
        report.merge(rep)
        for key in stats:
            stats[key] += int(st[key])
        for s in samples:
            sources.add(str(s.source))
            spill.append(s)
        del samples
    report.entries.extend(policy_entries)
    return report, stats, proc, sources


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
) -> PackResult:
    """Pack chat/instruction data into an offline packed dataset (Parquet shards + metadata.json).

    Steps: read + normalise + tokenize (``seqpack.data.prepare``), expand image placeholders and apply
    the over-length policy (:func:`apply_length_policy`), plan the packs (``seqpack.algorithms.pack_lengths``), build one THD row per pack
    (``seqpack.packed.build_packed_sequence``, rows validated against every invariant of
    packed-batch-spec.md), write atomically (``seqpack.io.PackedWriter``).

    Image-text records (LLaVA ``image``/``images``, messages with image parts) are packed at their
    expanded length (image tokens included, a placeholder run never cut) and each pack stores, per
    segment in pack order, ``images`` (absolute paths), ``image_grid_thw`` and ``image_tokens``: no
    pixels. ``load_packed(..., load_media=True)`` recomputes ``pixel_values`` with the image processor
    settings stored in ``metadata.json`` (``media``). Text-only records in the same inputs pack as usual.

    Memory: input files are read and tokenized one at a time; each file's samples go to a disk spill
    (:class:`seqpack.io.spill.SampleSpill`, a hidden ``.<output name>.spill-*`` folder beside the output,
    deleted at the end and on error) and are dropped, so memory holds the length array and small
    per-sample metadata, not the token arrays; packs are then built from the spill pack by pack.
    In-memory inputs (``datasets.Dataset``, record lists) keep their samples in memory. Both paths give
    byte-identical output.

    Repeated inputs: the same file given twice, or a glob overlapping an explicit path, is read ONCE
    (files compared by real path; a log line names each repeat), so no record is packed twice.

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

    Returns:
        :class:`PackResult`.

    Raises:
        PackConfigError: invalid settings (names the keys), e.g. ``seq_length`` not divisible by the
            multiple (case B23: capacity 150 with CP=2) or above the planner's capacity limit; checked
            before any data is read.
        NothingToPackError: every record was dropped or skipped (nothing is written).
        FileExistsError: ``output`` exists and ``overwrite`` is False (checked before any work).
        FileNotFoundError / seqpack.data errors: bad inputs (name the file, record and fix); a missing
            or unreadable image raises ``ValueError`` naming the sample and path (``on_error="skip"``
            lists it in the report as ``skipped``/``bad_media``).
    """
    t0 = time.perf_counter()
    say = log or (lambda _msg: None)
    stages = _Stages(progress)
    m = _validate_settings(seq_length, pad_to_multiple_of, context_parallel_size)
    algo = resolve_algorithm(algorithm, error=PackConfigError)
    _validate_policies(overlength=overlength, on_error=on_error, train_on=train_on, format=format)
    output = Path(output)
    check_output_dir(output, overwrite)
    proc = None
    if image_processor is not None or min_pixels is not None or max_pixels is not None:
        proc = resolve_image_processor(image_processor, min_pixels=min_pixels, max_pixels=max_pixels)
    fmt = None if format in (None, "auto") else format
    items = dedupe_inputs(_input_list(inputs), say)
    tok, tok_name = _load_tokenizer(tokenizer)
    tok_hash, chat_hash = _tokenizer_hashes(tok)

    # ---- 1. read, normalise, tokenize without a length limit (an image sample's length is only known
    # after its placeholders are expanded), then expand images and apply the over-length policy.
    # Files go one at a time into a disk spill (memory: the length array + small per-sample metadata);
    # in-memory inputs (datasets, record lists) keep their samples in memory.
    use_spill = not _FORCE_IN_MEMORY.get() and all(isinstance(i, (str, os.PathLike)) for i in items)
    spill = None
    try:
        if use_spill:
            from seqpack.io.spill import SampleSpill

            output.parent.mkdir(parents=True, exist_ok=True)
            spill = SampleSpill(output.parent / f".{output.name}.spill-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            report, media_stats, proc, sources = _prepare_to_spill(
                items, spill, tok, seq_length=seq_length, overlength=overlength, on_error=on_error,
                train_on=train_on, fmt=fmt, proc=proc, stages=stages,
            )
            num_samples, trainable = len(spill), spill.trainable_tokens
            get_sample: Callable[[int], Any] = spill.get
            lengths = spill.lengths()
        else:
            samples, report, media_stats, proc = _prepare_in_memory(
                items, tok, seq_length=seq_length, overlength=overlength, on_error=on_error,
                train_on=train_on, fmt=fmt, proc=proc, stages=stages,
            )
            sources = {str(s.source) for s in samples}
            num_samples, trainable = len(samples), int(sum(s.num_trainable for s in samples))
            get_sample = samples.__getitem__
            lengths = np.fromiter((s.length for s in samples), dtype=np.int64, count=len(samples))
        return _plan_and_write(
            items, output, tok, tok_name, tok_hash, chat_hash, report, media_stats, proc, sources,
            num_samples, trainable, lengths, get_sample, t0=t0, say=say, stages=stages, m=m, algo=algo,
            seq_length=seq_length, pad_to_multiple_of=pad_to_multiple_of,
            context_parallel_size=context_parallel_size, overlength=overlength, on_error=on_error,
            train_on=train_on, seed=seed, fmt=fmt, overwrite=overwrite, rows_per_shard=rows_per_shard,
            validate=validate,
        )
    finally:
        if spill is not None:
            spill.cleanup()


def _nothing_to_pack(items: Sequence[Any], report: Any, empty: Sequence[str] = ()) -> NothingToPackError:
    """The error for a job whose every record was dropped or skipped (or whose inputs hold no record):
    names the inputs, the counts by status and reason, and the fix (shared by the local and Ray engines)."""
    names = ", ".join(_input_label(i) for i in items)
    if report.records_read == 0:
        return NothingToPackError(
            f"no record to pack: 0 records read from {names} (empty file(s) or empty JSON array). "
            "Fix: check that the path points to the data file you meant (JSON array of records, JSONL "
            "with one record per line, or Parquet) and that it is not empty"
        )
    return NothingToPackError(
        f"no sample left to pack: {report.records_read} record(s) read from {names}, none usable "
        f"(by status and reason: {report.by_reason()}). Fix: check --format; for overlength drops raise "
        "--seq-length or change --overlength; for skipped records fix them (each is named when packing "
        "with --on-error raise)"
        + (f"; empty input(s): {', '.join(empty)}" if empty else "")
    )


def _check_plan_places_all(plan: Any, num_samples: int, what: str) -> None:
    """Raise ``RuntimeError`` (a planner bug, never a user error) unless ``plan.bins`` place every index
    ``0 .. num_samples-1`` exactly once; ``what`` names the algorithm/planning mode in the message."""
    order = np.concatenate(plan.bins) if plan.bins else np.zeros(0, np.int64)
    if order.shape[0] != num_samples or not np.array_equal(np.sort(order), np.arange(num_samples)):
        raise RuntimeError(
            f"packing plan ({what}) does not place every sample exactly once "
            f"({order.shape[0]} placements for {num_samples} samples)"
        )


def _build_row(
    samples: Sequence[Any], *, m: int, pad_token_id: int, seq_length: int, validate: bool,
    context_parallel_size: int,
) -> Any:
    """One offline THD row (:func:`seqpack.packed.build_packed_sequence` with the job's pad multiple
    ``m``, no tail padding), checked against every invariant when ``validate`` (shared by the local and
    Ray engines, so both write the same rows).

    Raises:
        ValueError / PackedSequenceError: from the builder or the validator (names the sample ids).
    """
    from seqpack.packed import build_packed_sequence

    row = build_packed_sequence(samples, pad_to_multiple_of=m, pad_token_id=pad_token_id, seq_length=seq_length)
    if validate:
        row.validate(capacity=seq_length, context_parallel_size=context_parallel_size, multiple=m)
    return row


def _plan_and_write(
    items, output, tok, tok_name, tok_hash, chat_hash, report, media_stats, proc, sources, num_samples,
    trainable, lengths, get_sample, *, t0, say, stages, m, algo, seq_length, pad_to_multiple_of,
    context_parallel_size, overlength, on_error, train_on, seed, fmt, overwrite, rows_per_shard, validate,
) -> PackResult:
    """Stages 2-3 of :func:`pack_dataset` on prepared samples reached through ``get_sample(i)``."""
    t_prep = time.perf_counter()
    say(f"prepared {num_samples} samples from {report.records_read} records"
        + (f" ({media_stats['images']} images, {media_stats['image_tokens']} image tokens)"
           if media_stats["images"] else ""))
    empty = _empty_inputs(items, sources, report.entries)
    for name in empty:
        say(f"input {name} holds no record (empty file or empty JSON array)")
    if not num_samples:
        raise _nothing_to_pack(items, report, empty)

    # ---- 2. plan (same multiple m as the builder: case B24)
    from seqpack.algorithms import pack_lengths

    stages("plan", 0, 1)
    plan = pack_lengths(lengths, seq_length, algo, seed=seed, pad_to_multiple_of=m)
    stages("plan", 1, 1)
    _check_plan_places_all(plan, num_samples, algo.value)
    t_plan = time.perf_counter()
    say(f"planned {plan.num_bins} packs (lower bound {plan.lower_bound}) with {algo.value}")

    # ---- 3. build rows and write atomically
    pad_id = _pad_token_id(tok)

    def rows() -> Iterator[Any]:
        total = len(plan.bins)
        stages("write", 0, total)
        for k, b in enumerate(plan.bins, 1):
            row = _build_row(
                [get_sample(int(i)) for i in b], m=m, pad_token_id=pad_id, seq_length=seq_length,
                validate=validate, context_parallel_size=context_parallel_size,
            )
            if k % 64 == 0 or k == total:
                stages("write", k, total)
            yield row

    settings = _metadata_settings(
        seq_length=seq_length, pad_to_multiple_of=pad_to_multiple_of,
        context_parallel_size=context_parallel_size, effective_pad_multiple=m, algorithm=algo.value,
        seed=seed, overlength=overlength, train_on=train_on, on_error=on_error, format=fmt,
        tokenizer_hash=tok_hash, chat_template_hash=chat_hash, pad_token_id=pad_id,
    )
    meta = build_metadata(
        lengths=lengths,
        trainable_tokens=int(trainable),
        bins=plan.bins,
        lower_bound=int(plan.lower_bound),
        report=report,
        settings=settings,
        described_inputs=[describe_input(i) for i in items],
        tokenizer_name=tok_name,
        media={**media_metadata(proc, tok), **media_stats} if media_stats["images"] else None,
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
