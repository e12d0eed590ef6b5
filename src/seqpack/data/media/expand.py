"""Image-text preparation over many samples, each through the one over-length policy
(``seqpack.data.length_policy``):

* :func:`expand_samples` / :func:`prepare_multimodal`: batch and streaming use; each sample keeps its
  ``pixel_values`` and ``mrope_position_ids``; default policy ``"drop"``.
* :func:`apply_length_policy`: the offline job's final length step (``seqpack pack``) on text and
  image samples; image samples keep only references (paths, grids, token counts); default
  ``"truncate"`` (given by the job).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterable
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.padding import check_positive_int
from seqpack.data.length_policy import OverlengthError, apply_overlength, check_overlength, trainable_mask
from seqpack.data.media.images import load_image_processor
from seqpack.data.media.placeholders import _record, expand_image_placeholders, sample_where
from seqpack.data.media_root import is_url, stored_image_path
from seqpack.data.prepare import UNLIMITED, prepare
from seqpack.data.tokenizer import resolve_tokenizer
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
        f"{e}. Fix: correct the image path or file in the record, or pass on_error='skip' to "
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


def _fit_text(s: Sample, seq_length: int | None, overlength: str) -> tuple[list[Sample], list[SampleRecord]]:
    """A sample without images under the over-length policy (``seqpack.data.length_policy.apply_overlength``,
    as ``prepare`` applies it): ``([s], [])`` when it fits or ``seq_length`` is ``None``."""
    if seq_length is None or s.length <= seq_length:
        return [s], []
    return apply_overlength(
        s.input_ids, trainable_mask(s.labels), seq_length=seq_length, overlength=overlength, sample_id=s.sample_id,
        source=s.source, index=s.index, media=s.media, meta=s.meta,
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
            new, entries = _fit_text(s, seq_length, overlength)
            out.extend(new)
            report.entries.extend(entries)
            continue
        if proc is None:
            proc = load_image_processor(None)
        where = sample_where(s)
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
    tokenizer: Any,
    image_processor: Any = None,
    *,
    seq_length: int | None = None,
    overlength: str = "drop",
    on_error: str = "raise",
    report: PrepareReport | None = None,
) -> tuple[list[Sample], PrepareReport]:
    """:func:`expand_image_placeholders` over many samples, with accounting; samples without images go
    through the same over-length policy as in ``seqpack.data.prepare``.

    Args:
        samples: text-side samples (``prepare(..., keep_image_placeholders=True)``).
        tokenizer: the tokenizer the samples were made with, or its name (``"qwen3"``; resolved by
            ``seqpack.data.tokenizer.resolve_tokenizer``, as ``prepare`` does).
        image_processor: a processor from :func:`load_image_processor` (``None`` = transformers' defaults).
        seq_length: capacity in tokens (``None`` = no limit).
        overlength: ``"drop"`` (default) | ``"error"`` | ``"truncate"`` | ``"split"``; see
            :func:`expand_image_placeholders` (image samples) and ``seqpack.data.length_policy.apply_overlength``
            (samples without images).
        on_error: ``"raise"`` or ``"skip"`` (a bad sample, e.g. unreadable image or placeholder
            mismatch, is listed in the report with status ``"skipped"``).
        report: a report to extend (e.g. the one from ``seqpack.data.prepare``); a new one otherwise.

    Returns:
        ``(samples, report)``; every input is either returned or listed in ``report.entries``.

    Raises:
        ValueError: a bad image or placeholder mismatch under ``on_error="raise"`` (names the sample and the
            fix), or an invalid ``on_error``.
        OverlengthError: a sample longer than ``seq_length`` under ``overlength="error"``.
        TokenizerError: ``tokenizer`` is a name that cannot be loaded.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    tokenizer = resolve_tokenizer(tokenizer, require_chat_template=False)
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
        recs = [rec] if rec is not None else []
        kept = [new] if new is not None else []
        if new is not None and not (new.media or {}).get("images"):
            kept, recs = _fit_text(new, seq_length, overlength)
        for r in recs:
            rep.entries.append(r)
            logger.warning("%s %s: %s", r.status, r.sample_id, r.detail)
        out.extend(kept)
    rep.samples_out = len(out)
    rep.tokens = int(sum(x.length for x in out))
    rep.trainable_tokens = int(sum(x.num_trainable for x in out))
    return out, rep


#: ``prepare`` arguments that ``prepare_multimodal`` sets itself (the text pass has no length limit and keeps
#: the image placeholders; samples are returned, not sunk).
_SET_BY_PREPARE_MULTIMODAL = ("inputs", "tokenizer", "seq_length", "overlength", "on_error",
                              "keep_image_placeholders", "sink")


def prepare_multimodal(
    inputs: Any,
    tokenizer: Any,
    *,
    seq_length: int,
    image_processor: Any = None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    overlength: str = "drop",
    on_error: str = "raise",
    **prepare_kwargs: Any,
) -> tuple[list[Sample], PrepareReport]:
    """Tokenize image-text records and expand their images: ``seqpack.data.prepare`` + media step.

    The text side runs without a length limit (placeholders must be expanded before a cut can be
    placed safely); the over-length policy is then applied to the expanded length of every sample,
    with or without images. Differences from ``prepare``: the default ``overlength`` is ``"drop"``
    (``prepare``: ``"truncate"``), and ``"split"`` drops image samples (they cannot be split).

    Args:
        inputs: what :func:`seqpack.data.prepare` accepts (e.g. ``mllm_demo.json`` or the
            lmms-finetune JSON files; text-only records pass through the same length policy).
        tokenizer: a Qwen-style tokenizer (with ``<|vision_start|>``, ``<|image_pad|>``,
            ``<|vision_end|>``) or its name, resolved as ``prepare`` does (``"qwen3"`` = the embedded
            Qwen3 tokenizer, a folder, a hub id: ``seqpack.data.tokenizer.resolve_tokenizer``).
        seq_length: capacity in tokens; no returned sample is longer.
        image_processor: ``None`` (transformers' defaults), a ``preprocessor_config.json`` path/folder, a
            settings dict, or a processor (:func:`load_image_processor`).
        min_pixels, max_pixels: override the processor's pixel bounds (as ``seqpack pack --min-pixels /
            --max-pixels``): each resized image's area stays in [min_pixels, max_pixels], so a lower
            ``max_pixels`` gives fewer image tokens per image.
        overlength: ``"drop"`` (default) | ``"error"`` | ``"truncate"`` (never inside an image run) |
            ``"split"`` (text samples only; image samples are dropped).
        on_error: ``"raise"`` | ``"skip"`` for bad records and bad images.
        prepare_kwargs: the other arguments of ``prepare`` (``train_on``, ``format``, ``progress``,
            ``chat_template_kwargs``, ``media_dir``, ``num_proc``, ...).

    Returns:
        ``(samples, report)`` as from ``prepare``; image samples have ``media`` = ``{"images",
        "pixel_values" float32 [P, D], "image_grid_thw" int64 [k, 3], "mrope_position_ids" int64 [3, L]}``
        and ``meta["image_tokens"]`` (image-token count per image); the report also lists media
        drops/truncations.

    Raises:
        TypeError: an argument that neither this function nor ``prepare`` takes, or one of ``prepare``'s
            that this function sets itself (``keep_image_placeholders``, ``sink``).
        PixelBoundsError: ``min_pixels`` / ``max_pixels`` not integers with 1 <= min <= max (a ``ValueError``).
        TokenizerError, DataFormatError, FileNotFoundError, ValueError: as ``prepare`` (bad input, bad
            option), and a bad image under ``on_error="raise"`` (names the record and the fix).
        OverlengthError: a sample longer than ``seq_length`` under ``overlength="error"``.
        ValueError: ``seq_length`` < 1 or an unknown ``overlength`` (before any record is read).

    Example::

        samples, report = prepare_multimodal("mllm_demo.json", "qwen3", seq_length=4096, max_pixels=200704)
        samples[0].media["image_grid_thw"]   # int64 [k, 3]; prod(row) // 4 image tokens per image
    """
    allowed = [k for k in inspect.signature(prepare).parameters if k not in _SET_BY_PREPARE_MULTIMODAL]
    bad = sorted(set(prepare_kwargs) - set(allowed))
    if bad:
        raise TypeError(
            f"prepare_multimodal() got unsupported argument(s) {', '.join(bad)}. It takes inputs, tokenizer, "
            "seq_length, image_processor, min_pixels, max_pixels, overlength, on_error and prepare()'s "
            f"{', '.join(allowed)}"
        )
    check_overlength(overlength)
    seq_length = check_positive_int(seq_length, "seq_length")
    tokenizer = resolve_tokenizer(tokenizer)
    proc = load_image_processor(image_processor, min_pixels=min_pixels, max_pixels=max_pixels)
    samples, report = prepare(
        inputs, tokenizer, seq_length=UNLIMITED, overlength="error", on_error=on_error,
        keep_image_placeholders=True, **prepare_kwargs,
    )
    out, report = expand_samples(
        samples, tokenizer, proc, seq_length=seq_length, overlength=overlength, on_error=on_error, report=report
    )
    return out, report
