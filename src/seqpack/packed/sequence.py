"""The canonical packed sequence: one THD row (see ``packed-batch-spec.md``).

A :class:`PackedSequence` is one physical row of width ``T`` holding ``N`` segments (samples); the class
docstring draws one. Every row is made by :meth:`PackedSequence.from_boundaries` (the builders of
:mod:`seqpack.packed.build` lay the samples out and call it; the offline reader and the importers call
it on stored columns) and checked by :meth:`PackedSequence.validate`.

Everything here is numpy; torch is imported lazily only by :meth:`PackedSequence.to_torch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from seqpack._torch import torch_hint
from seqpack.packed.boundaries import segment_fields, trim_cu_seqlens
from seqpack.packed.invariants import validate, violation
from seqpack.packed.mrope import packed_mrope_position_ids, with_segment_mrope
from seqpack.sample import IGNORE_INDEX, unshift_labels

__all__ = ["PackedSequence", "pad_cu_seqlens", "NON_TOKEN_EXTRA_KEYS"]

#: Keys of ``PackedSequence.extra`` that are row/segment metadata, never per-token tables
#: (context-parallel slicing leaves them alone).
NON_TOKEN_EXTRA_KEYS = frozenset(
    {"has_final_target", "pad_to_multiple_of", "seq_length", "pad_to_max_length", "pad_token_id",
     "max_samples_per_bin", "max_seqlen_pinned", "cp_indices", "cp_rank", "context_parallel_size"}
)


@dataclass
class PackedSequence:
    """One physical row of width ``T`` holding ``N`` segments (samples).

    Two samples ``a`` (3 tokens) and ``b`` (2 tokens), each padded to a multiple of 4 (``T = 8``)::

        slot                 0     1     2     3  |  4     5     6     7
        input_ids           a0    a1    a2   pad  | b0    b1   pad   pad
        labels              a1    a2  -100  -100  | b1  -100  -100  -100
        loss_mask            T     T     F     F  |  T     F     F     F
        position_ids         0     1     2     3  |  0     1     2     3
        padding_mask         F     F     F     T  |  F     F     T     T
        seq_idx              0     0     0     0  |  1     1     1     1
        cu_seqlens          [0, 3, 5]    logical boundaries (real tokens)
        cu_seqlens_padded   [0, 4, 8]    physical boundaries (slots), last == T
        seq_lens            [3, 2]       max_seqlen = 4

    Labels are shifted per segment (``labels[t]`` = target of the logit at ``t``, never the next
    segment's first token, case B03); positions restart at 0 per segment and count on through its
    padding; ``padding_mask`` is True on padding (Megatron-Core MoE router polarity). With
    ``pad_to_max_length`` the last segment absorbs the row's tail ("extend last", case B17).

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
        extra: row metadata (``has_final_target`` bool [N], ``pad_to_multiple_of``, ``seq_length``,
            ...) and optional per-token tables (an array whose axis 0 or last axis has length ``T``,
            e.g. the M-RoPE positions ``mrope_position_ids`` int64 ``[3, T]``); context-parallel
            slicing slices the tables.
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

    # ------------------------------------------------------------------ sizes
    @property
    def length(self) -> int:
        """Physical row width ``T`` (slots)."""
        return int(self.input_ids.shape[0])

    @property
    def num_real_tokens(self) -> int:
        """Real (non-padding) tokens: ``cu_seqlens[N]``-style count from the boundaries, never from token values."""
        return int(np.count_nonzero(~np.asarray(self.padding_mask, dtype=bool)))

    @property
    def num_loss_tokens(self) -> int:
        """Slots that carry a training target (``labels != -100``)."""
        return int(np.count_nonzero(np.asarray(self.labels) != IGNORE_INDEX))

    def real_boundaries(self) -> tuple[np.ndarray, np.ndarray]:
        """``(cu_seqlens, cu_seqlens_padded)`` trimmed to ``N + 1`` entries (static padding removed)."""
        return (
            trim_cu_seqlens(self.cu_seqlens, self.num_segments),
            trim_cu_seqlens(self.cu_seqlens_padded, self.num_segments),
        )

    def real_token_indices(self) -> np.ndarray:
        """Slot indices of real tokens (int64), from the boundary arrays (interior padding aware, case B18)."""
        return np.flatnonzero(~np.asarray(self.padding_mask, dtype=bool)).astype(np.int64)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_boundaries(
        cls,
        input_ids,
        labels,
        cu_seqlens,
        cu_seqlens_padded,
        sample_ids=None,
        *,
        media: list | None = None,
        num_segments: int | None = None,
        has_final_target=None,
        extra: dict[str, Any] | None = None,
        tail_segment: bool = False,
        image_pad_id: int | None = None,
        merge_size: int | None = None,
    ) -> "PackedSequence":
        """Build a full row from its tokens, labels and the two boundary arrays (every row is made here).

        Every derived field (``loss_mask``, ``position_ids``, ``seq_lens``, ``max_seqlen``,
        ``padding_mask``, ``seq_idx``) is computed from the two boundary arrays; nothing is
        inferred from token values (invariant 10). When the segments' media carry M-RoPE tables
        (``media[j]["mrope_position_ids"]`` int64 ``[3, L_j]``), or ``image_grid_thw`` together with
        ``image_pad_id`` / ``merge_size``, the row's table goes to ``extra["mrope_position_ids"]``
        (int64 ``[3, T]``, restarting per segment) unless ``extra`` already holds one.

        Args:
            input_ids: int [T].
            labels: int [T], shifted per segment.
            cu_seqlens: int [N+1] (or static-padded: ``-1`` sentinels / repeated last value).
            cu_seqlens_padded: int [N+1] (same padding rules), last real entry == T.
            sample_ids: N provenance keys; default ``["0", "1", ...]``.
            media: optional N per-segment media entries.
            num_segments: true N when the boundary arrays are static-padded.
            has_final_target: bool [N], segments whose last real label is an explicit final
                target (case B12). Default: derived from the stored labels (a non -100 label at a
                segment's last real slot is taken as explicit, since the stored row was validated
                when written).
            extra: further metadata / per-token tables.
            tail_segment: the last segment is all padding (real length 0: the in-batch
                ``force_to_pad_to_seq_len`` layout); otherwise every segment needs a real token.
            image_pad_id, merge_size: the ``<|image_pad|>`` id and vision merge size, to compute the
                M-RoPE tables of segments whose media have ``image_grid_thw`` but no table.

        Returns:
            PackedSequence (boundary arrays trimmed to N + 1 entries).

        Raises:
            PackedSequenceError: shapes or boundaries inconsistent (invariants 1-3).
            ValueError: a segment's image-token runs do not match its ``image_grid_thw``.
        """
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        lab = np.ascontiguousarray(labels, dtype=np.int64)
        if ids.ndim != 1 or lab.shape != ids.shape:
            raise violation(1, f"input_ids and labels must be 1-D of equal length, got {ids.shape} and {lab.shape}")
        if tail_segment and num_segments is None:  # cu_seqlens repeats its last value for the empty tail
            cup = trim_cu_seqlens(cu_seqlens_padded)
            cu = trim_cu_seqlens(cu_seqlens, len(cup) - 1)
        else:
            cu = trim_cu_seqlens(cu_seqlens, num_segments)
            cup = trim_cu_seqlens(cu_seqlens_padded, num_segments if num_segments is not None else len(cu) - 1)
        if cu.shape != cup.shape:
            raise violation(2, f"cu_seqlens has {cu.shape[0]} entries but cu_seqlens_padded {cup.shape[0]}")
        n = cu.shape[0] - 1
        if n < 1:
            raise violation(3, "a packed row needs at least one segment")
        t = ids.shape[0]
        if int(cup[-1]) != t:
            raise violation(2, f"cu_seqlens_padded[-1]={int(cup[-1])} != row length T={t}")
        real = np.diff(cu.astype(np.int64))
        padded = np.diff(cup.astype(np.int64))
        low = np.zeros(n, dtype=np.int64) + 1
        if tail_segment and n > 1:
            low[-1] = 0
        bad = np.flatnonzero((real < low) | (real > padded))
        if bad.size:
            i = int(bad[0])
            raise violation(3, f"segment {i}: real length {int(real[i])} must satisfy 0 < real <= padded "
                               f"({int(padded[i])})")
        position_ids, padding_mask, seq_idx = segment_fields(cup, real)
        sample_ids = [str(i) for i in range(n)] if sample_ids is None else list(sample_ids)
        ex = dict(extra or {})
        if has_final_target is None:
            last_real = cup[:-1].astype(np.int64) + np.maximum(real, 1) - 1
            has_final_target = (real > 0) & (lab[last_real] != IGNORE_INDEX)
        ex["has_final_target"] = np.asarray(has_final_target, dtype=bool)
        if media is not None:
            media = list(media)
            if image_pad_id is not None and merge_size:
                media = with_segment_mrope(media, ids, cu, cup, image_pad_id=image_pad_id, merge_size=merge_size)
            if ex.get("mrope_position_ids") is None:
                table = packed_mrope_position_ids(media, cu, cup)
                if table is not None:
                    ex["mrope_position_ids"] = table
        return cls(
            input_ids=ids,
            labels=lab,
            loss_mask=lab != IGNORE_INDEX,
            position_ids=position_ids,
            cu_seqlens=cu,
            cu_seqlens_padded=cup,
            seq_lens=real.astype(np.int32),
            max_seqlen=int(padded.max()),
            padding_mask=padding_mask,
            seq_idx=seq_idx,
            sample_ids=sample_ids,
            media=media,
            num_segments=n,
            extra=ex,
        )

    # ------------------------------------------------------------------ conversions
    def to_torch(self) -> dict[str, Any]:
        """Convert to torch tensors with the spec dtypes (torch imported lazily).

        Returns:
            dict with ``input_ids, labels, position_ids`` int64 [T]; ``loss_mask, padding_mask``
            bool [T]; ``seq_idx`` int32 [T]; ``cu_seqlens, cu_seqlens_padded`` int32 (as stored,
            static padding kept); ``seq_lens`` int32 [N]; ``max_seqlen`` and ``num_segments`` as
            Python ``int`` (what flash-attn / Megatron ``max_seqlen_q`` take); per-token tables from
            ``extra`` as tensors under their own key.
        """
        with torch_hint("PackedSequence.to_torch()"):
            import torch

        out: dict[str, Any] = {
            "input_ids": torch.from_numpy(np.ascontiguousarray(self.input_ids, dtype=np.int64)),
            "labels": torch.from_numpy(np.ascontiguousarray(self.labels, dtype=np.int64)),
            "loss_mask": torch.from_numpy(np.ascontiguousarray(self.loss_mask, dtype=bool)),
            "position_ids": torch.from_numpy(np.ascontiguousarray(self.position_ids, dtype=np.int64)),
            "cu_seqlens": torch.from_numpy(np.ascontiguousarray(self.cu_seqlens, dtype=np.int32)),
            "cu_seqlens_padded": torch.from_numpy(np.ascontiguousarray(self.cu_seqlens_padded, dtype=np.int32)),
            "seq_lens": torch.from_numpy(np.ascontiguousarray(self.seq_lens, dtype=np.int32)),
            "padding_mask": torch.from_numpy(np.ascontiguousarray(self.padding_mask, dtype=bool)),
            "seq_idx": torch.from_numpy(np.ascontiguousarray(self.seq_idx, dtype=np.int32)),
            "max_seqlen": int(self.max_seqlen),
            "num_segments": int(self.num_segments),
        }
        for key in self.per_token_extra_keys():
            val = self.extra[key]
            out[key] = val if isinstance(val, torch.Tensor) else torch.as_tensor(np.ascontiguousarray(val))
        return out

    def per_token_extra_keys(self) -> list[str]:
        """Keys of ``extra`` holding per-token tables (axis 0 or the last axis has length ``T``)."""
        t = self.length
        keys = []
        for k, v in self.extra.items():
            if k in NON_TOKEN_EXTRA_KEYS or not hasattr(v, "shape") or len(v.shape) == 0:
                continue
            if v.shape[0] == t or v.shape[-1] == t:
                keys.append(k)
        return keys

    def hf_unshifted_labels(self) -> np.ndarray:
        """Labels in the unshifted (HF) convention (the model shifts internally): ``hf[t] = labels[t-1]``.

        Returns:
            int64 [T]; -100 at every segment's first slot (so no segment learns from the previous
            one, case B03). An explicit final target (case B12) survives only when the segment has
            a padding slot after its last real token; otherwise the unshifted convention has no slot
            for it and it is dropped (:func:`seqpack.sample.unshift_labels` with ``final_target="drop"``,
            the conversion the exporters use).
        """
        _, cup = self.real_boundaries()
        return unshift_labels(self.labels, cup, final_target="drop")

    def validate(self, capacity: int | None = None, context_parallel_size: int = 1,
                 multiple: int | None = None, *, vocab_size: int | None = None) -> "PackedSequence":
        """Check every invariant (1-11) of ``packed-batch-spec.md``: :func:`seqpack.packed.invariants.validate`
        (``vocab_size=len(tokenizer)`` also checks every token id against the vocabulary).

        Returns:
            self (so ``build(...).validate()`` chains).

        Raises:
            PackedSequenceError: naming the invariant number and the offending slot / segment.
        """
        return validate(self, capacity, context_parallel_size, multiple, vocab_size=vocab_size)

    # ------------------------------------------------------------------ static shapes
    def pad_cu_seqlens(self, max_samples_per_bin: int | None, *, pin_max_seqlen: bool = False) -> "PackedSequence":
        """Method form of :func:`pad_cu_seqlens`."""
        return pad_cu_seqlens(self, max_samples_per_bin, pin_max_seqlen=pin_max_seqlen)


def pad_cu_seqlens(
    packed: PackedSequence, max_samples_per_bin: int | None, *, pin_max_seqlen: bool = False
) -> PackedSequence:
    """Pad both boundary arrays to a fixed ``max_samples_per_bin + 2`` entries (CUDA graphs).

    The padding repeats the last value (``cu_seqlens_padded[-1] == T``), never ``-1`` sentinels,
    so every kernel sees zero-length trailing segments at most; the true ``N`` stays in
    ``num_segments`` (case B19). ``+ 2`` = ``N + 1`` boundaries for up to ``max_samples_per_bin``
    segments plus one spare entry (the fixed width NeMo / Megatron-Bridge use for their padded
    packed ``cu_seqlens``).

    Args:
        packed: a row padded to its maximum length (built with ``pad_to_max_length=True``), so
            ``T`` is the same for every row.
        max_samples_per_bin: the largest segment count of any pack in the dataset (stored in the
            packed dataset's metadata).
        pin_max_seqlen: also pin ``max_seqlen`` to ``T`` (a static scalar for graph capture).

    Returns:
        A new PackedSequence (per-token arrays shared, boundary arrays int32 [max_samples_per_bin + 2]).

    Raises:
        ValueError: ``max_samples_per_bin`` is None / < N, or the row is not padded to max length.
    """
    if max_samples_per_bin is None:
        raise ValueError(
            "max_samples_per_bin is missing from the packed dataset's metadata; it is needed to pad "
            "cu_seqlens to a static shape. Re-pack the dataset (the writer records it) or pass it explicitly"
        )
    n = int(packed.num_segments)
    if max_samples_per_bin < n:
        raise ValueError(f"max_samples_per_bin={max_samples_per_bin} < this row's {n} segments "
                         f"({packed.sample_ids[:4]}...)")
    seq_length = packed.extra.get("seq_length")
    if seq_length is None or packed.length != seq_length:
        raise ValueError(
            f"static cu_seqlens need every row padded to the same length: this row has T={packed.length} "
            f"(seq_length={seq_length}, pad_to_max_length={packed.extra.get('pad_to_max_length', False)}); "
            f"build it with build_packed_sequence(..., seq_length=..., pad_to_max_length=True)"
        )
    width = int(max_samples_per_bin) + 2
    cu, cup = packed.real_boundaries()
    cu_s = np.full(width, cu[-1], dtype=np.int32)
    cu_s[: n + 1] = cu
    cup_s = np.full(width, cup[-1], dtype=np.int32)
    cup_s[: n + 1] = cup
    extra = dict(packed.extra)
    extra["max_samples_per_bin"] = int(max_samples_per_bin)
    max_seqlen = packed.max_seqlen
    if pin_max_seqlen:
        extra["max_seqlen_pinned"] = True
        max_seqlen = packed.length
    return replace(packed, cu_seqlens=cu_s, cu_seqlens_padded=cup_s, max_seqlen=max_seqlen, extra=extra)
