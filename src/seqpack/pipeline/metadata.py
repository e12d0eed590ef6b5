"""The ``metadata.json`` of an offline packed dataset, computed from the packing outcome (both engines)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from seqpack.data.media.placeholders import VisionTokens
from seqpack.io.fingerprint import compute_fingerprint, fingerprint_settings
from seqpack.io.media import media_root_metadata
from seqpack.io.metadata import PackedMetadata
from seqpack.pipeline.job import processor_settings

__all__ = ["build_metadata", "media_metadata"]


def media_metadata(proc: Any, tok: Any, media_root: Any = None, output: Any = None) -> dict[str, Any]:
    """The ``metadata.json`` ``media`` section: image processor settings (``image_processor``, the full
    config; ``min_pixels``, ``max_pixels``, ``patch_size``, ``merge_size``, ``temporal_patch_size``), the
    vision token ids (``image_pad_id``, ``vision_start_id``, ``vision_end_id``) and, given the pack's
    ``media_root`` and ``output`` folder, where the stored image paths are relative to
    (``seqpack.io.media.media_root_metadata``; not in the fingerprint)."""
    cfg = processor_settings(proc)
    vt = VisionTokens.from_tokenizer(tok)
    return {
        **(media_root_metadata(media_root, output) if media_root is not None else {}),
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
    fp_settings = fingerprint_settings(settings, fingerprint_extra=fingerprint_extra, media=media)
    if media:
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
