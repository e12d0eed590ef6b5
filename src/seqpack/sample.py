"""The ground floor: one tokenized sample, the label ignore index, the per-token field names, and the
label conventions (the one shift and the one unshift).

Label conventions (``packed-batch-spec.md``):

* **shifted** (seqpack, Megatron-Bridge): ``labels[t]`` is the target of the logit at ``t``, i.e.
  ``input_ids[t+1]`` when that token is trained, else ``IGNORE_INDEX``. ``labels[-1]`` is
  ``IGNORE_INDEX`` unless the sample keeps an explicit final target (a sample truncated to capacity keeps
  the first dropped token as the target of its last slot, case B12: "final target").
* **unshifted** (HF collators, torchtune; ``label_convention="hf"``): ``unshifted[t]`` says "the token at
  ``t`` is a target"; the model shifts at loss time. Per segment ``unshifted[t] = labels[t-1]``, and
  every segment's first slot is ``IGNORE_INDEX`` so a whole-row shift never crosses a segment boundary
  (case B03: a label must not cross into the next segment).

:func:`shift_labels` builds shifted labels from a trainable mask; :func:`unshift_labels` and
:func:`shift_unshifted_labels` convert between the two conventions, per segment, on numpy arrays or
torch tensors alike (same indexing on both, no torch import here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

#: label ignore index (PyTorch cross-entropy's default ``ignore_index``); the one definition in seqpack.
IGNORE_INDEX = -100

#: Per-token fields of a packed row, all of length ``T`` (context parallelism slices them with one index).
TOKEN_FIELDS = ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask", "seq_idx")
#: dtype of each per-token field (numpy / torch dtype names).
TOKEN_DTYPES = {
    "input_ids": "int64",
    "labels": "int64",
    "loss_mask": "bool",
    "position_ids": "int64",
    "padding_mask": "bool",
    "seq_idx": "int32",
}

__all__ = [
    "IGNORE_INDEX",
    "TOKEN_FIELDS",
    "TOKEN_DTYPES",
    "Sample",
    "shift_labels",
    "unshift_labels",
    "shift_unshifted_labels",
]


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

    Raises:
        ValueError: ``input_ids`` and ``trainable`` are not 1-D of equal length.
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


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _int64(x):
    """``x`` as an int64 array of its own kind (a torch tensor stays a tensor, on its device)."""
    if _is_torch(x):
        import torch

        return x.to(torch.int64)
    return np.asarray(x, dtype=np.int64)


def _ignored_like(x):
    """An array of ``IGNORE_INDEX`` with the kind, shape, dtype and device of ``x``."""
    if _is_torch(x):
        import torch

        return torch.full_like(x, IGNORE_INDEX)
    return np.full_like(x, IGNORE_INDEX)


def _segment_edges(cu_seqlens_padded, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(first slots, last slots)`` of the physical segments inside a row of ``width`` slots.

    ``cu_seqlens_padded=None`` means the whole row is one segment (one sample, or a padded ``[B, S]`` row).
    Entries outside the row (a static-padded array repeating ``T``) are dropped.
    """
    if cu_seqlens_padded is None:
        cup = np.array([0, width], dtype=np.int64)
    elif _is_torch(cu_seqlens_padded):
        cup = cu_seqlens_padded.detach().cpu().numpy().reshape(-1).astype(np.int64)
    else:
        cup = np.asarray(cu_seqlens_padded, dtype=np.int64).reshape(-1)
    starts, ends = cup[:-1], cup[1:] - 1
    return starts[starts < width], ends[(ends >= 0) & (ends < width)]


def unshift_labels(labels, cu_seqlens_padded=None, *, final_target: str = "error",
                   sample_ids: Sequence[Any] | None = None):
    """Shifted labels -> unshifted (HF / torchtune) labels, per physical segment.

    ``unshifted[t] = labels[t-1]`` when ``t-1`` and ``t`` lie in the same segment, else -100 (so every
    segment's first slot is -100). A target on a segment's last *physical* slot (an explicit final
    target with no padding slot after it, case B12) has no slot to move to.

    Args:
        labels: int ``[T]`` or ``[B, T]`` shifted labels (numpy array or torch tensor).
        cu_seqlens_padded: int ``[N+1]`` physical boundaries over the last dim (numpy or torch; entries
            past ``T`` ignored); ``None`` = each row is one segment.
        final_target: ``"error"`` raises for a target on a segment's last physical slot; ``"drop"``
            drops it (that one token is then not trained).
        sample_ids: optional per-segment ids, named in the error.

    Returns:
        int64 array of the same kind and shape (a torch tensor stays on its device).

    Raises:
        ValueError: unknown ``final_target``; a final target that cannot be stored and
            ``final_target="error"`` (names the sample, the segment and the fixes).
    """
    if final_target not in ("error", "drop"):
        raise ValueError(f"final_target must be 'error' or 'drop', got {final_target!r}")
    lab = _int64(labels)
    width = int(lab.shape[-1])
    out = _ignored_like(lab)
    if width == 0:
        return out
    starts, ends = _segment_edges(cu_seqlens_padded, width)
    if final_target == "error":
        lost = np.asarray((lab[..., ends] != IGNORE_INDEX).tolist(), dtype=bool).reshape(-1, ends.shape[0])
        if lost.any():
            i = int(np.nonzero(lost.any(axis=0))[0][0])
            who = f"sample {sample_ids[i]!r}: " if sample_ids is not None and i < len(sample_ids) else ""
            raise ValueError(
                f"{who}segment {i} has a target at its last physical slot {int(ends[i])}: it cannot be stored "
                f"with unshifted labels, there is no slot after it. Fix: pass final_target='drop' to drop "
                f"that one target, pack with pad_to_multiple_of > 1 so segments keep a padding slot, or use "
                f"the shifted 'labels' with seqpack.loss / the 'shift_labels' key of format='hf'."
            )
    out[..., 1:] = lab[..., :-1]
    out[..., starts] = IGNORE_INDEX
    return out


def shift_unshifted_labels(unshifted, cu_seqlens_padded=None):
    """Unshifted (HF / torchtune) labels -> shifted labels, per physical segment.

    ``labels[t] = unshifted[t+1]`` when ``t+1`` lies in the same segment, else -100. Inverse of
    :func:`unshift_labels` (exactly, when no final target was dropped).

    Args:
        unshifted: int ``[T]`` or ``[B, T]`` (numpy array or torch tensor).
        cu_seqlens_padded: int ``[N+1]`` physical boundaries over the last dim; ``None`` = each row is one
            segment (one sample).

    Returns:
        int64 array of the same kind and shape.
    """
    hf = _int64(unshifted)
    width = int(hf.shape[-1])
    out = _ignored_like(hf)
    if width == 0:
        return out
    _, ends = _segment_edges(cu_seqlens_padded, width)
    out[..., :-1] = hf[..., 1:]
    out[..., ends] = IGNORE_INDEX
    return out


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
        media: per-sample media payload for VLMs (e.g. ``{"pixel_values": ..., "image_grid_thw": ...,
            "mrope_position_ids": int64 [3, L]}``) in the order the placeholders appear; ``None`` for text.
        meta: free-form extra info (e.g. truncation applied).

    Raises:
        ValueError: ``input_ids`` and ``labels`` are not 1-D of equal length.
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
