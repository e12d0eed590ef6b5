"""Image-text preparation over many samples, each through the one over-length policy
(``seqpack.data.length_policy``):

* :func:`expand_samples` / :func:`prepare_multimodal`: batch and streaming use; each sample keeps its
  ``pixel_values`` and ``mrope_position_ids``; default policy ``"drop"``.
* :func:`apply_length_policy`: the offline job's final length step (``seqpack pack``) on text and
  image samples; image samples keep only references (paths, grids, token counts); default
  ``"truncate"`` (given by the job).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.data.length_policy import OverlengthError, apply_overlength, trainable_mask
from seqpack.data.media.images import load_image_processor
from seqpack.data.media.placeholders import _position, _record, expand_image_placeholders
from seqpack.data.media_root import is_url, stored_image_path
from seqpack.data.prepare import UNLIMITED, prepare
from seqpack.sample import Sample
from seqpack.accounting import PrepareReport, SampleRecord

__all__ = ["apply_length_policy", "expand_samples", "prepare_multimodal"]

logger = logging.getLogger(__name__)


class _InMemoryImageError(ValueError):
    """An image given as an object (PIL, bytes) where the offline dataset needs a path."""


def _raise_media_error(e: ValueError) -> None:
    """Raise the one error of a bad image sample under ``on_error="raise"``: ``e`` itself when its message
    already names the fix (an in-memory image, an image too large), else ``e`` with the fix appended."""
    if isinstance(e, _InMemoryImageError) or "Fix:" in str(e):
        raise e
    raise ValueError(
        f"{e}. Fix: correct the image path or file in the record, or pass --on-error skip (on_error='skip') to "
        "list such records in the report (report.jsonl) and pack the rest"
    ) from e


def _image_ref(ref: Any, where: str) -> str:
    if isinstance(ref, dict) and isinstance(ref.get("path"), str) and not ref.get("bytes"):
        ref = ref["path"]
    if isinstance(ref, (str, os.PathLike)):
        s = os.fspath(ref)
        return s if is_url(s) else os.path.abspath(s)
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
    media_root: str | os.PathLike | None = None,
) -> tuple[list[Any], Any, dict[str, int]]:
    """Final length step of the offline path, after an unlimited-length ``prepare``.

    Text-only samples longer than ``seq_length`` go through ``seqpack.data.length_policy.apply_overlength``
    (the same policy ``prepare`` applies). Samples with images go through
    ``seqpack.data.media.expand_image_placeholders``: each ``<image>`` becomes ``<|vision_start|>`` +
    n x ``<|image_pad|>`` + ``<|vision_end|>`` with n = prod(image_grid_thw) // merge_size**2, then the
    policy acts on the expanded length (``truncate`` cuts before an image run, never inside;
    ``split`` drops, since an image sample cannot be split). The sample's ``media`` keeps only
    references: ``images`` (paths relative to ``media_root`` with POSIX separators,
    ``seqpack.data.media_root.stored_image_path``; absolute when ``media_root`` is ``None`` or the file
    lies outside it), ``image_grid_thw`` (int64 [k, 3]) and ``image_tokens`` (int64 [k]); pixels are
    dropped (recomputed at load time). A bad image is skipped under ``on_error="skip"`` with its
    ``ImageError.reason`` (``"bad_media"``, ``"image_too_large"``).

    Returns:
        ``(samples, report, stats)`` with ``stats = {"images", "image_tokens", "samples_with_images"}``;
        ``report`` gets one entry per dropped/truncated/split/skipped sample and updated totals.

    Raises:
        ValueError: an unreadable/missing image with ``on_error="raise"`` (names the sample id, source,
            index and path), an in-memory image, or an over-length sample under ``overlength="error"``.
    """
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
            new, entries = apply_overlength(
                s.input_ids, trainable_mask(s.labels), seq_length=seq_length, overlength=overlength, sample_id=s.sample_id,
                source=s.source, index=s.index, media=s.media, meta=s.meta,
            )
            out.extend(new)
            report.entries.extend(entries)
            continue
        if proc is None:
            proc = load_image_processor(None)
        where = f"sample {s.sample_id!r} (source {s.source}, {_position(s.source, s.index)})"
        try:
            refs = [_image_ref(r, where) for r in imgs]
            new, rec = expand_image_placeholders(
                s, tokenizer, proc, images=refs, seq_length=seq_length, overlength=overlength
            )
        except OverlengthError as e:
            raise ValueError(f"{e} (--overlength error)") from e
        except ValueError as e:
            if on_error == "raise":
                _raise_media_error(e)
            reason = getattr(e, "reason", "bad_media")
            report.entries.append(SampleRecord(s.sample_id, s.source, s.index, "skipped", reason, str(e)))
            continue
        if rec is not None:
            report.entries.append(rec)
        if new is not None:
            media = dict(new.media or {})
            grid = np.asarray(media.get("image_grid_thw", np.zeros((0, 3))), dtype=np.int64).reshape(-1, 3)
            ntok = np.prod(grid, axis=1) // (int(proc.merge_size) ** 2)
            stored = [stored_image_path(x, media_root) for x in media.get("images") or []]
            new.media = {"images": stored, "image_grid_thw": grid, "image_tokens": ntok}
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


def expand_samples(
    samples: Iterable[Sample],
    tokenizer,
    image_processor=None,
    *,
    seq_length: int | None = None,
    overlength: str = "drop",
    on_error: str = "raise",
    report: PrepareReport | None = None,
) -> tuple[list[Sample], PrepareReport]:
    """:func:`expand_image_placeholders` over many samples, with accounting.

    Args:
        on_error: ``"raise"`` or ``"skip"`` (a bad sample, e.g. unreadable image or placeholder
            mismatch, is listed in the report with status ``"skipped"``).
        report: a report to extend (e.g. the one from ``seqpack.data.prepare``); a new one otherwise.

    Returns:
        ``(samples, report)``; every input is either returned or listed in ``report.entries``.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    rep = report if report is not None else PrepareReport()
    proc = image_processor if image_processor is not None else load_image_processor()
    out: list[Sample] = []
    fresh = report is None
    for s in samples:
        if fresh:
            rep.records_read += 1
        try:
            new, rec = expand_image_placeholders(s, tokenizer, proc, seq_length=seq_length, overlength=overlength)
        except OverlengthError:
            raise
        except ValueError as e:
            if on_error == "raise":
                _raise_media_error(e)
            rep.entries.append(_record(s, "skipped", getattr(e, "reason", "bad_media"), str(e)))
            continue
        if rec is not None:
            rep.entries.append(rec)
            logger.warning("%s %s: %s", rec.status, rec.sample_id, rec.detail)
        if new is None:
            continue
        out.append(new)
    rep.samples_out = len(out)
    rep.tokens = int(sum(x.length for x in out))
    rep.trainable_tokens = int(sum(x.num_trainable for x in out))
    return out, rep


def prepare_multimodal(
    inputs: Any,
    tokenizer,
    *,
    seq_length: int,
    image_processor: Any = None,
    overlength: str = "drop",
    on_error: str = "raise",
    **prepare_kwargs: Any,
) -> tuple[list[Sample], PrepareReport]:
    """Tokenize image-text records and expand their images: ``seqpack.data.prepare`` + media step.

    The text side runs without a length limit (placeholders must be expanded before a cut can be
    placed safely); the over-length policy is then applied to the expanded length.

    Args:
        inputs: what :func:`seqpack.data.prepare` accepts (e.g. ``mllm_demo.json`` or the
            lmms-finetune JSON files; text-only records pass through unchanged).
        tokenizer: Qwen-style tokenizer (``load_tokenizer("qwen3")``).
        seq_length: capacity in tokens.
        image_processor: ``None``, a config dict/path, or a processor (:func:`load_image_processor`).
        overlength: ``"drop"`` | ``"error"`` | ``"truncate"`` (never inside an image run).
        on_error: ``"raise"`` | ``"skip"`` for bad records and bad images.
        prepare_kwargs: passed to ``prepare`` (``train_on``, ``format``, ``progress``).

    Returns:
        ``(samples, report)`` as from ``prepare``; the report also lists media drops/truncations.
    """
    proc = load_image_processor(image_processor)
    samples, report = prepare(
        inputs, tokenizer, seq_length=UNLIMITED, overlength="error", on_error=on_error,
        keep_image_placeholders=True, **prepare_kwargs,
    )
    out, report = expand_samples(
        samples, tokenizer, proc, seq_length=seq_length, overlength=overlength, on_error=on_error, report=report
    )
    return out, report
