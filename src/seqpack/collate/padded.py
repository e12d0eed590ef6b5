"""The unpacked baseline: right-padded ``[B, S]`` rows (for comparisons with packing)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from seqpack._torch import torch_hint

with torch_hint("seqpack.collate (the collators and PackedRowsDataset)"):
    import torch

from seqpack.collate.output import check_label_convention, feature_sample
from seqpack.padding import round_up
from seqpack.sample import IGNORE_INDEX, unshift_labels

__all__ = ["PaddedCollator"]


class PaddedCollator:
    """The unpacked baseline: right-pad each sample to the longest in the batch (``[B, S]``).

    Args:
        pad_token_id: id written into padding slots.
        pad_to_multiple_of: round ``S`` up to this multiple (>= 1).
        format: ``"hf"`` -> ``input_ids, attention_mask (1 = real), labels (HF unshifted)`` and, when
            ``shift_labels=True``, ``shift_labels`` (our shifted labels, keeps explicit final targets);
            ``"shifted"`` -> ``input_ids, attention_mask, labels (shifted), loss_mask, position_ids``.
        label_convention: convention of the incoming ``labels``: ``"shifted"`` (``Sample``) or ``"hf"``.
        shift_labels: also emit ``shift_labels`` in ``format="hf"``.

    Features are ``Sample`` objects or mappings with ``input_ids`` (and optionally ``labels``,
    ``sample_id``); missing labels mean "train on every next token".

    Returns (``__call__``):
        dict of tensors; int64 ``[B, S]`` for ids/labels/mask, bool ``loss_mask``.
    """

    def __init__(self, pad_token_id: int, *, pad_to_multiple_of: int = 1, format: str = "hf",
                 label_convention: str = "shifted", shift_labels: bool = True):
        if format not in ("hf", "shifted"):
            raise ValueError(f"PaddedCollator format must be 'hf' or 'shifted', got {format!r}")
        check_label_convention(label_convention)
        if int(pad_to_multiple_of) < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        self.format = format
        self.label_convention = label_convention
        self.shift_labels = shift_labels

    def __call__(self, features: Sequence[Any]) -> dict[str, torch.Tensor]:
        if len(features) == 0:
            raise ValueError("PaddedCollator got an empty batch")
        rows = [feature_sample(f, self.label_convention, i) for i, f in enumerate(features)]
        S = round_up(max(r.length for r in rows), self.pad_to_multiple_of)
        B = len(rows)
        ids = np.full((B, S), self.pad_token_id, dtype=np.int64)
        lab = np.full((B, S), IGNORE_INDEX, dtype=np.int64)
        att = np.zeros((B, S), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : r.length] = r.input_ids
            lab[i, : r.length] = r.labels
            att[i, : r.length] = 1
        out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(att)}
        labels = torch.from_numpy(lab)
        if self.format == "shifted":
            out["labels"] = labels
            out["loss_mask"] = labels != IGNORE_INDEX
            out["position_ids"] = torch.arange(S).unsqueeze(0).expand(B, S).clone()
            return out
        out["labels"] = unshift_labels(labels, None, final_target="drop")  # each row is one segment
        if self.shift_labels:
            out["shift_labels"] = labels
        return out
