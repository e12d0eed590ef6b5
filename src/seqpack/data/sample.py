"""The unit of training data: one tokenized sample, and the accounting report.

Label convention (one source of truth, see ``packed-batch-spec.md``): ``Sample.labels`` is already
**shifted within the sample**: ``labels[t]`` is the target of the logit at position ``t`` (i.e.
``input_ids[t+1]`` when that token is trained), else -100. ``labels[-1]`` is -100 unless the sample
stores an explicit final target (a sample truncated to capacity keeps the first dropped token as the
target of its last slot, case B12). The packed-row builder copies these labels per segment, so a
label never crosses into the next segment (case B03).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqpack.packed import IGNORE_INDEX  # one definition (the label ignore index, -100, as in PyTorch CE)

__all__ = ["IGNORE_INDEX", "Sample", "shift_labels", "SampleRecord", "PrepareReport"]


def shift_labels(input_ids: np.ndarray, trainable: np.ndarray, final_target: int | None = None) -> np.ndarray:
    """Build per-sample shifted labels from a per-token trainable mask.

    Args:
        input_ids: int array ``[L]``.
        trainable: bool array ``[L]``; ``trainable[t]`` says token ``t`` is a training target
            (e.g. an assistant token). This is the unshifted "completion mask" of TRL / HF.
        final_target: optional token id that follows ``input_ids[-1]`` in the original text (kept
            when truncating, case B12); it becomes ``labels[-1]``.

    Returns:
        int32 array ``[L]``: ``labels[t] = input_ids[t+1] if trainable[t+1] else -100``;
        ``labels[L-1] = final_target if given else -100``.
    """
    ids = np.asarray(input_ids)
    tr = np.asarray(trainable, dtype=bool)
    if ids.shape != tr.shape or ids.ndim != 1:
        raise ValueError(f"input_ids and trainable must be 1-D of equal length, got {ids.shape} and {tr.shape}")
    labels = np.full(ids.shape[0], IGNORE_INDEX, dtype=np.int32)
    if ids.shape[0] > 1:
        labels[:-1] = np.where(tr[1:], ids[1:], IGNORE_INDEX)
    if final_target is not None and ids.shape[0] > 0:
        labels[-1] = int(final_target)
    return labels


@dataclass
class Sample:
    """One tokenized training example (a segment once packed).

    Attributes:
        input_ids: int32 ``[L]`` token ids, ``L >= 1``.
        labels: int32 ``[L]`` shifted labels (module docstring), -100 = not trained.
        sample_id: stable provenance key, e.g. ``"alpaca_en_demo.json:17"`` (file name and record
            index) or the record's own ``id``; for split fragments ``"<id>#part<k>"``.
        source: source file path (or dataset name) the record came from, if any.
        index: record index (0-based; JSONL: line number - 1) in ``source``.
        media: per-sample media payload for VLMs (e.g. ``{"pixel_values": ..., "image_grid_thw": ...}``)
            in the order the placeholders appear; ``None`` for text.
        meta: free-form extra info (e.g. truncation applied).
    """

    input_ids: np.ndarray
    labels: np.ndarray
    sample_id: str
    source: str | None = None
    index: int | None = None
    media: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.input_ids = np.ascontiguousarray(self.input_ids, dtype=np.int32)
        self.labels = np.ascontiguousarray(self.labels, dtype=np.int32)
        if self.input_ids.ndim != 1 or self.labels.shape != self.input_ids.shape:
            raise ValueError(
                f"sample {self.sample_id!r}: input_ids and labels must be 1-D of equal length, "
                f"got {self.input_ids.shape} and {self.labels.shape}"
            )

    @property
    def length(self) -> int:
        """Number of tokens (the packing cost before pad rounding); always ``len(input_ids)``."""
        return int(self.input_ids.shape[0])

    @property
    def num_trainable(self) -> int:
        """Number of label slots != -100."""
        return int(np.count_nonzero(self.labels != IGNORE_INDEX))


@dataclass
class SampleRecord:
    """Accounting entry for one input record that was not packed as-is.

    ``status`` is one of ``"dropped"``, ``"skipped"`` (bad input with ``on_error=skip``),
    ``"truncated"``, ``"split"``, ``"kept"`` (no trainable token but kept on request,
    ``keep_untrainable=True``); ``reason`` is a short machine-readable key (e.g. ``"overlength"``,
    ``"no_trainable_tokens"``, ``"malformed_json"``) and ``detail`` the human message.
    """

    sample_id: str
    source: str | None
    index: int | None
    status: str
    reason: str
    detail: str = ""
    tokens_before: int | None = None
    tokens_after: int | None = None


@dataclass
class PrepareReport:
    """What happened to every input record (nothing is lost silently).

    ``records_read`` counts every record seen; ``entries`` lists every record that was dropped,
    skipped, truncated or split, with its reason and provenance.
    """

    records_read: int = 0
    samples_out: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    entries: list[SampleRecord] = field(default_factory=list)

    def count(self, status: str | None = None, reason: str | None = None) -> int:
        """Number of ``entries`` with this ``status`` and ``reason`` (``None`` matches any)."""
        return sum(
            1
            for e in self.entries
            if (status is None or e.status == status) and (reason is None or e.reason == reason)
        )

    def by_reason(self) -> dict[str, dict[str, int]]:
        """Entry counts as ``{status: {reason: count}}`` (statuses and reasons in first-seen order)."""
        out: dict[str, dict[str, int]] = {}
        for e in self.entries:
            out.setdefault(e.status, {}).setdefault(e.reason, 0)
            out[e.status][e.reason] += 1
        return out

    def merge(self, other: "PrepareReport") -> None:
        """Add ``other``'s counters to this report and append its entries (in place)."""
        self.records_read += other.records_read
        self.samples_out += other.samples_out
        self.tokens += other.tokens
        self.trainable_tokens += other.trainable_tokens
        self.entries.extend(other.entries)
