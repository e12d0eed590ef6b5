"""Label-convention conversions shared by the exporters (numpy only).

seqpack stores labels **shifted per segment** (``packed-batch-spec.md``): ``labels[t]`` is the target of
the logit at ``t``. Frameworks that store **unshifted** labels (HF collators, torchtune's packed
datasets) keep ``hf[t]`` = "the token at ``t`` is a target", and shift at loss time. Within a segment the
two are related by ``hf[t] = labels[t-1]``; every segment's first slot is -100 in ``hf`` so that a
whole-row shift (torchtune: ``labels[..., 1:]`` + one ignore index) never crosses a segment boundary.
"""

from __future__ import annotations

import numpy as np

from seqpack.packed import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "unshift_per_segment", "shift_per_segment", "segment_bounds"]


def segment_bounds(pack) -> tuple[np.ndarray, np.ndarray, int]:
    """Return ``(cu_seqlens, cu_seqlens_padded, N)`` of a pack, trimmed to its true segment count.

    Static-shape packs may carry boundary arrays padded by repeating the last value; ``num_segments``
    (when > 0) gives the true ``N``.
    """
    cu = np.asarray(pack.cu_seqlens, dtype=np.int64)
    cup = np.asarray(pack.cu_seqlens_padded, dtype=np.int64)
    n = int(getattr(pack, "num_segments", 0) or (len(cu) - 1))
    return cu[: n + 1], cup[: n + 1], n


def unshift_per_segment(
    labels: np.ndarray,
    cu_seqlens: np.ndarray,
    cu_seqlens_padded: np.ndarray,
    *,
    final_target: str = "error",
    sample_ids=None,
) -> np.ndarray:
    """Per-segment shifted labels -> unshifted (HF / torchtune) labels.

    ``hf[t] = labels[t-1]`` when ``t-1`` and ``t`` are in the same physical segment, else -100
    (so ``hf`` is -100 at every segment's first slot).

    A label on the last *physical* slot of a segment (an explicit final target kept by truncation, case
    B12, with no padding slot after it) has no slot to move to in the unshifted layout.

    Args:
        labels: int [T] shifted labels.
        cu_seqlens, cu_seqlens_padded: int [N+1] boundaries (logical, physical; last == T).
        final_target: ``"error"`` (default) raises for such a label; ``"drop"`` drops it (that one token
            is then not trained).
        sample_ids: optional ids for the error message.

    Returns:
        int64 [T].

    Raises:
        ValueError: a final target cannot be represented and ``final_target="error"``.
    """
    if final_target not in ("error", "drop"):
        raise ValueError(f"final_target must be 'error' or 'drop', got {final_target!r}")
    lab = np.asarray(labels, dtype=np.int64)
    T = lab.shape[0]
    cup = np.asarray(cu_seqlens_padded, dtype=np.int64)
    hf = np.full(T, IGNORE_INDEX, dtype=np.int64)
    if T == 0:
        return hf
    hf[1:] = lab[:-1]
    starts = cup[:-1]
    hf[starts[starts < T]] = IGNORE_INDEX
    ends = cup[1:] - 1  # last physical slot of each segment
    lost = np.nonzero(lab[ends] != IGNORE_INDEX)[0]
    if lost.size and final_target == "error":
        i = int(lost[0])
        sid = sample_ids[i] if sample_ids is not None and i < len(sample_ids) else f"segment {i}"
        raise ValueError(
            f"sample {sid!r}: its final target (label {int(lab[ends[i]])} at slot {int(ends[i])}, the last "
            f"physical slot of the segment) cannot be stored with unshifted labels: there is no slot after "
            f"it. Fix: pass final_target='drop' to drop that one target, or pack with pad_to_multiple_of > 1 "
            f"so segments keep a padding slot."
        )
    return hf


def shift_per_segment(hf_labels: np.ndarray, cu_seqlens_padded: np.ndarray) -> np.ndarray:
    """Unshifted (HF / torchtune) labels -> per-segment shifted labels.

    ``labels[t] = hf[t+1]`` when ``t+1`` is in the same physical segment, else -100. Inverse of
    :func:`unshift_per_segment` (exactly, when no final target was dropped).

    Args:
        hf_labels: int [T] unshifted labels.
        cu_seqlens_padded: int [N+1] physical boundaries, last == T.

    Returns:
        int64 [T].
    """
    hf = np.asarray(hf_labels, dtype=np.int64)
    T = hf.shape[0]
    cup = np.asarray(cu_seqlens_padded, dtype=np.int64)
    out = np.full(T, IGNORE_INDEX, dtype=np.int64)
    if T == 0:
        return out
    out[:-1] = hf[1:]
    ends = cup[1:] - 1
    out[ends[(ends >= 0) & (ends < T)]] = IGNORE_INDEX
    return out
