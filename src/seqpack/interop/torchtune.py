"""Export to / import from torchtune's packed-sample layout.

torchtune's ``PackedDataset`` yields one dict per pack with ``tokens``, ``labels``, ``input_pos`` and
``seq_lens`` (all ``torch.long``), padded to ``max_seq_len``:

* ``labels`` are **unshifted** (a copy of ``tokens`` with non-trained positions at -100); the recipes
  shift them over the whole row at loss time (``labels[..., 1:]`` followed by one ignore index, e.g.
  ``full_finetune_single_device._loss_step``). So the export writes -100 at every segment's first slot,
  which makes that whole-row shift reproduce seqpack's per-segment shifted labels exactly and never lets
  a label cross into the next segment.
* ``input_pos`` restarts at 0 per sample and keeps counting through padding (same as seqpack's
  ``position_ids``).
* ``seq_lens`` are the segment lengths used to build the block-causal mask; they sum to the row width.
  torchtune puts the row's tail padding in an extra trailing entry; seqpack's last segment absorbs the
  tail (it is only padding, label -100, and causal attention keeps real tokens from seeing it), so the
  export writes the physical segment lengths ``diff(cu_seqlens_padded)``.

torchtune's layout does not record which slots of a segment are alignment padding; pass
``real_seq_lens`` to :func:`from_torchtune` to restore them (lengths are never inferred from token
values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack.packed import PackedSequence, real_boundaries, segment_fields
from seqpack.sample import IGNORE_INDEX, shift_unshifted_labels, unshift_labels

__all__ = ["to_torchtune", "from_torchtune"]


def to_torchtune(pack: Any, *, final_target: str = "error", as_torch: bool = False) -> dict[str, Any]:
    """Convert one seqpack pack to torchtune's packed-sample dict.

    Args:
        pack: a :class:`~seqpack.packed.PackedSequence`.
        final_target: what to do with an explicit final target (case B12) sitting on a segment's last
            physical slot, which unshifted labels cannot hold: ``"error"`` or ``"drop"`` (see
            :func:`seqpack.sample.unshift_labels`). A final target followed by a padding
            slot is stored in that slot and survives.
        as_torch: return ``torch.long`` tensors (as torchtune's ``PackedDataset`` does) instead of numpy.

    Returns:
        ``{"tokens": int64 [T], "labels": int64 [T] (unshifted), "input_pos": int64 [T],
        "seq_lens": int64 [N]}`` with ``sum(seq_lens) == T``.

    Raises:
        ValueError: unrepresentable final target with ``final_target="error"``.
    """
    cu, cup, n = real_boundaries(pack)
    labels = unshift_labels(
        np.asarray(pack.labels), cup, final_target=final_target, sample_ids=getattr(pack, "sample_ids", None)
    )
    out = {
        "tokens": np.asarray(pack.input_ids, dtype=np.int64).copy(),
        "labels": labels,
        "input_pos": np.asarray(pack.position_ids, dtype=np.int64).copy(),
        "seq_lens": np.diff(cup).astype(np.int64),
    }
    if as_torch:
        import torch

        out = {k: torch.from_numpy(v) for k, v in out.items()}
    return out


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.int64)


def from_torchtune(
    sample: dict[str, Any],
    *,
    real_seq_lens: Any = None,
    trailing_padding: bool = False,
    sample_ids: list[str] | None = None,
    where: str = "pack",
):
    """Convert one torchtune packed-sample dict back into a seqpack pack.

    Args:
        sample: dict with ``tokens``, ``labels`` (unshifted), ``seq_lens`` (torch tensors or arrays);
            ``input_pos`` is not needed (positions are rebuilt from the boundaries).
        real_seq_lens: optional int [N] real lengths of the segments (``pack.seq_lens`` of the exported
            pack); default: each segment is entirely real.
        trailing_padding: the last ``seq_lens`` entry is torchtune's tail-padding entry (as written by
            ``PackedDataset`` when the pack is not full): merge it into the previous segment as tail.
        sample_ids: optional ids (default ``"{where}#seg{i}"``).
        where: name of the pack for error messages.

    Returns:
        :class:`~seqpack.packed.PackedSequence`.

    Raises:
        ValueError: ``sum(seq_lens) != len(tokens)``, a zero length, or ``real_seq_lens`` out of range.
    """
    tokens = _np(sample["tokens"])
    hf = _np(sample["labels"])
    lens = _np(sample["seq_lens"])
    T = tokens.shape[0]
    if hf.shape[0] != T:
        raise ValueError(f"{where}: labels has {hf.shape[0]} entries, tokens {T}")
    if trailing_padding:
        if lens.size < 2:
            raise ValueError(f"{where}: trailing_padding=True needs at least 2 seq_lens entries, got {lens.tolist()}")
        lens = np.concatenate([lens[:-2], [lens[-2] + lens[-1]]])
    if int(lens.sum()) != T or np.any(lens < 1):
        raise ValueError(f"{where}: seq_lens {lens.tolist()[:8]} must be >= 1 and sum to len(tokens) = {T}")
    cup = np.concatenate([[0], np.cumsum(lens)])
    if real_seq_lens is None:
        real = lens.copy()
    else:
        real = _np(real_seq_lens)
        if real.shape != lens.shape or np.any(real < 1) or np.any(real > lens):
            raise ValueError(
                f"{where}: real_seq_lens {real.tolist()[:8]} do not fit seq_lens {lens.tolist()[:8]}"
            )
    cu = np.concatenate([[0], np.cumsum(real)])
    labels = shift_unshifted_labels(hf, cup)
    labels[segment_fields(cup, real)[1]] = IGNORE_INDEX  # padding slots are never labelled
    if sample_ids is None:
        sample_ids = [f"{where}#seg{i}" for i in range(lens.size)]
    return PackedSequence.from_boundaries(
        tokens, labels, cu.astype(np.int32), cup.astype(np.int32), sample_ids=list(sample_ids)
    )
