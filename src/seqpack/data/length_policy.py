"""The over-length policy: what happens to a sample longer than ``seq_length``, for text and images.

One set of policy names (:data:`OVERLENGTH_POLICIES`), one error (:class:`OverlengthError`) and the two
cuts: :func:`apply_overlength` for a tokenized text sample, :func:`image_cut` for an image-text sample
after its placeholders are expanded (``seqpack.data.media.expand_image_placeholders``), where a cut may
never fall inside an image-token run and ``"split"`` drops (an image sample cannot be split).

Defaults per public entry point (each documents its own):

* ``"truncate"``: ``seqpack.data.prepare``, ``seqpack.pipeline.pack_dataset`` / ``seqpack pack`` and
  ``seqpack.pipeline.apply_length_policy`` (SFT default: keep the head of the conversation).
* ``"drop"``: ``seqpack.data.media.expand_image_placeholders``, ``expand_samples`` and
  ``prepare_multimodal`` (batch / streaming image-text preparation: a truncated image sample loses
  the images after the cut, so the conservative default keeps only whole samples).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from seqpack.accounting import SampleRecord
from seqpack.padding import check_positive_int
from seqpack.sample import IGNORE_INDEX, Sample, shift_labels

__all__ = [
    "OVERLENGTH_POLICIES",
    "OverlengthError",
    "apply_overlength",
    "check_overlength",
    "image_cut",
    "trainable_mask",
]

#: Over-length policies: ``"truncate"`` keep the first ``seq_length`` tokens; ``"drop"`` drop the
#: sample; ``"split"`` cut a text sample into fragments (pretraining-style, opt-in; an image sample is
#: dropped instead); ``"error"`` raise :class:`OverlengthError`.
OVERLENGTH_POLICIES = ("truncate", "drop", "split", "error")


class OverlengthError(ValueError):
    """A sample (text, or image-text after expansion) is longer than ``seq_length`` under
    ``overlength="error"``; the message names the sample and the fix."""


def check_overlength(overlength: str) -> None:
    """Raise ``ValueError`` unless ``overlength`` is one of :data:`OVERLENGTH_POLICIES`."""
    if overlength not in OVERLENGTH_POLICIES:
        raise ValueError(f"overlength={overlength!r} is not one of {OVERLENGTH_POLICIES}")


def trainable_mask(labels: np.ndarray) -> np.ndarray:
    """The unshifted per-token trainable mask of one sample's shifted labels, bool ``[L]``.

    ``mask[t] = labels[t-1] != -100`` for ``t >= 1`` and ``mask[0] = False`` (the sample as one segment
    of :func:`seqpack.sample.unshift_labels`); an explicit final target ``labels[-1]``
    has no slot in the mask and is not represented.
    """
    lab = np.asarray(labels)
    mask = np.zeros(lab.shape[0], dtype=bool)
    np.not_equal(lab[:-1], IGNORE_INDEX, out=mask[1:])  # unshift_labels of one segment, as bools only
    return mask


def image_cut(
    length: int, run_spans: Sequence[tuple[int, int]], *, seq_length: int | None, overlength: str, where: str,
    num_images: int,
) -> tuple[int | None, str, str]:
    """The over-length decision for an expanded image-text sample of ``length`` tokens.

    Args:
        length: tokens after expanding every placeholder to its image-token run.
        run_spans: ``[start, end)`` of each image run (``<|vision_start|>`` ... ``<|vision_end|>``).
        seq_length: capacity in tokens (``None`` = no limit).
        overlength: one of :data:`OVERLENGTH_POLICIES`.
        where: the sample named for messages (``"sample 'x' (source s, index i)"``).
        num_images: images of the sample (for the detail text).

    Returns:
        ``(cut, reason, detail)``: ``cut == length`` keeps the sample whole (``reason == ""``);
        ``cut is None`` drops it (``reason`` ``"overlength"``, or ``"overlength_media"`` for ``"split"``);
        else truncate to ``cut`` tokens, moved back to the start of an image run the limit falls in.

    Raises:
        OverlengthError: ``overlength="error"`` and ``length > seq_length``.
        ValueError: unknown policy.
    """
    check_overlength(overlength)
    if seq_length is None or length <= seq_length:
        return length, "", ""
    detail = f"{length} tokens after expanding {num_images} image(s) > seq_length {seq_length}"
    if overlength == "error":
        raise OverlengthError(
            f"{where}: {detail}. Fix: raise seq_length, lower max_pixels (fewer image tokens), or pass "
            "overlength='drop' or overlength='truncate'."
        )
    if overlength == "drop":
        return None, "overlength", detail
    if overlength == "split":
        return None, "overlength_media", detail + "; a sample with images is dropped rather than split"
    cut = int(seq_length)
    for s, e in run_spans:
        if s < cut < e:
            cut = s
            break
    return cut, "overlength", detail


def apply_overlength(
    input_ids: np.ndarray,
    trainable: np.ndarray,
    *,
    seq_length: int,
    overlength: str = "truncate",
    sample_id: str,
    source: str | None = None,
    index: int | None = None,
    media: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    keep_untrainable: bool = False,
) -> tuple[list[Sample], list[SampleRecord]]:
    """Turn one tokenized example into final ``Sample``(s) under the over-length policy.

    Args:
        input_ids: int ``[L]`` token ids.
        trainable: bool ``[L]`` unshifted trainable mask (``trainable[t]``: token t is a target).
        seq_length: capacity in tokens (a sample keeps at most this many tokens).
        overlength: ``"truncate"`` (SFT default: keep the first ``seq_length`` tokens; the first
            dropped token becomes the explicit final target ``labels[-1]`` when it is trainable,
            case B12), ``"drop"``, ``"error"`` or ``"split"`` (pretraining-style, opt-in: fragments
            ``"<id>#part<k>"``, k = 0, 1, ..., each ``<= seq_length`` tokens; every token is kept
            exactly once and each fragment's last label is the first token of the next fragment
            when trainable, cases B09/B10). Samples carrying media are dropped rather than cut
            (cutting would orphan image placeholders; reason ``"overlength_media"``).
        sample_id, source, index, media, meta: provenance copied into the ``Sample``(s).
        keep_untrainable: keep (instead of drop) a sample left with no trainable label.

    Returns:
        ``(samples, entries)``: the samples (their ``length`` is recomputed after every
        transform, case B11) and the report entries (``truncated``/``split``/``dropped``) for this
        example. A dropped sample is never charged its raw length.

    Raises:
        OverlengthError: ``overlength="error"`` and ``L > seq_length``.
        ValueError: unknown policy or ``seq_length`` not an integer >= 1.
    """
    check_overlength(overlength)
    seq_length = check_positive_int(seq_length)
    ids = np.asarray(input_ids, dtype=np.int32)
    tr = np.asarray(trainable, dtype=bool)
    n = int(ids.shape[0])
    meta = dict(meta or {})
    entries: list[SampleRecord] = []

    def rec(status: str, reason: str, detail: str, before: int | None, after: int | None) -> SampleRecord:
        return SampleRecord(sample_id, source, index, status, reason, detail, before, after)

    if n == 0:
        return [], [rec("dropped", "empty_sample", "the rendered conversation has no tokens", 0, 0)]

    if n > seq_length:
        if overlength == "error":
            raise OverlengthError(
                f"sample {sample_id!r} ({source}, record {index}) has {n} tokens > seq_length={seq_length}. "
                "Fix: raise seq_length, or pass overlength='truncate' (the SFT default), overlength='drop' or "
                "overlength='split'."
            )
        if overlength == "drop":
            return [], [rec("dropped", "overlength", f"{n} tokens > seq_length={seq_length}", n, 0)]
        if media and overlength in ("truncate", "split"):
            return [], [
                rec(
                    "dropped",
                    "overlength_media",
                    f"{n} tokens > seq_length={seq_length}; a sample with images is dropped rather than cut "
                    "(cutting would orphan image placeholders). Raise seq_length to keep it.",
                    n,
                    0,
                )
            ]
        if overlength == "split":
            samples = []
            n_parts = -(-n // seq_length)
            untrained = 0
            for k in range(n_parts):
                a, b = k * seq_length, min(n, (k + 1) * seq_length)
                final = int(ids[b]) if b < n and tr[b] else None
                labels = shift_labels(ids[a:b], tr[a:b], final_target=final)
                s = Sample(
                    ids[a:b],
                    labels,
                    f"{sample_id}#part{k}",
                    source,
                    index,
                    media,
                    {**meta, "part": k, "num_parts": n_parts, "tokens_before": n},
                )
                untrained += s.num_trainable == 0
                samples.append(s)
            detail = f"{n} tokens split into {n_parts} fragments of <= {seq_length} (pretraining-style)"
            if untrained:
                detail += f"; {untrained} fragment(s) have no trainable label (kept: split keeps every token)"
            return samples, [rec("split", "overlength", detail, n, n)]
        # truncate (B11/B12): keep seq_length tokens, first dropped token as explicit final target
        final = int(ids[seq_length]) if tr[seq_length] else None
        t_ids, t_tr = ids[:seq_length].copy(), tr[:seq_length]  # a copy: the whole array is not kept alive
        labels = shift_labels(t_ids, t_tr, final_target=final)
        sample = Sample(t_ids, labels, sample_id, source, index, media, {**meta, "truncated_from": n})
        if sample.num_trainable == 0 and not keep_untrainable:
            return [], [
                rec(
                    "dropped",
                    "no_trainable_tokens",
                    f"truncated from {n} to {seq_length} tokens, no trainable token left",
                    n,
                    0,
                )
            ]
        entries.append(rec("truncated", "overlength", f"truncated from {n} to {seq_length} tokens", n, seq_length))
        if sample.num_trainable == 0:
            entries.append(rec("kept", "no_trainable_tokens", "kept (keep_untrainable=True)", n, seq_length))
        return [sample], entries

    labels = shift_labels(ids, tr)
    sample = Sample(ids, labels, sample_id, source, index, media, meta)
    if sample.num_trainable == 0:
        if not keep_untrainable:
            return [], [rec("dropped", "no_trainable_tokens", "no trainable token", n, 0)]
        entries.append(rec("kept", "no_trainable_tokens", "kept (keep_untrainable=True)", n, n))
    return [sample], entries
