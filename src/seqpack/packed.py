"""The canonical packed sequence: one THD row (see ``packed-batch-spec.md``).

OWNER: packed-row helper. The dataclass fields below are the contract other modules code against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class PackedSequence:
    """One physical row of width ``T`` holding ``N`` segments.

    Fields (numpy inside; ``.to_torch()`` converts at the edge):
        input_ids: int64 [T]; alignment and tail slots hold ``pad_token_id``.
        labels: int64 [T]; shifted per segment, -100 at each segment's last real slot and on padding.
        loss_mask: bool [T]; ``labels != -100``.
        position_ids: int64 [T]; restart at 0 per segment, keep counting through its padding.
        cu_seqlens: int32 [N+1]; logical (real-token) boundaries.
        cu_seqlens_padded: int32 [N+1]; physical boundaries, last == T.
        seq_lens: int32 [N]; ``diff(cu_seqlens)``.
        max_seqlen: int; ``max(diff(cu_seqlens_padded))``.
        padding_mask: bool [T]; True = padding (Megatron-Core polarity).
        seq_idx: int32 [T]; segment index of every slot (padding belongs to its segment).
        sample_ids: list[str] of length N.
        media: list (length N) of per-segment media dicts or None.
        num_segments: N (true count, also when boundary arrays are padded for static shapes).
    """

    input_ids: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    cu_seqlens_padded: np.ndarray
    seq_lens: np.ndarray
    max_seqlen: int
    padding_mask: np.ndarray
    seq_idx: np.ndarray
    sample_ids: list = field(default_factory=list)
    media: list | None = None
    num_segments: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
