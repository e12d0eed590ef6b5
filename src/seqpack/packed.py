"""The canonical packed sequence: one THD row (see ``packed-batch-spec.md``).

A :class:`PackedSequence` is one physical row of width ``T`` holding ``N`` segments (samples).
It is built from :class:`~seqpack.data.sample.Sample` objects by :func:`build_packed_sequence`,
rebuilt from stored columns by :meth:`PackedSequence.from_boundaries` (offline reader), and
checked against every invariant of the spec by :meth:`PackedSequence.validate`.

Everything here is numpy; torch is imported lazily only by :meth:`PackedSequence.to_torch`.

Conventions (one source of truth, cited from the spec):

* labels are **shifted per segment** (Megatron-Bridge / torchtune convention): ``labels[t]`` is the
  target of the logit at ``t``; a label never crosses into the next segment (case B03);
* ``position_ids`` restart at 0 at every segment start and keep counting through that segment's
  alignment padding (Megatron THD RoPE / torchtune convention);
* ``padding_mask`` is True on padding (Megatron-Core MoE router polarity);
* ``cu_seqlens`` holds logical (real-token) boundaries, ``cu_seqlens_padded`` physical ones; the
  tail of the row is absorbed by the last segment ("extend last" policy, case B17).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from seqpack.padding import check_seq_length

#: label ignore index (PyTorch cross-entropy's default ignore_index); the one definition seqpack imports everywhere.
IGNORE_INDEX = -100

__all__ = [
    "IGNORE_INDEX",
    "PackedSequence",
    "PackedSequenceError",
    "build_packed_sequence",
    "pad_cu_seqlens",
    "trim_cu_seqlens",
]

# Keys of ``PackedSequence.extra`` that are row/segment metadata, never per-token tables
# (context-parallel slicing leaves them alone).
NON_TOKEN_EXTRA_KEYS = frozenset(
    {"has_final_target", "pad_to_multiple_of", "seq_length", "pad_to_max_length", "pad_token_id",
     "max_samples_per_bin", "max_seqlen_pinned", "cp_indices", "cp_rank", "context_parallel_size"}
)


class PackedSequenceError(ValueError):
    """A packed row breaks an invariant of ``packed-batch-spec.md`` (message names the invariant)."""


def _fail(inv: int, msg: str) -> None:
    raise PackedSequenceError(f"packed-batch-spec invariant {inv} violated: {msg}")


def _segment_fields(cu_seqlens_padded: np.ndarray, real_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-slot fields implied by the boundaries (the one implementation, used by the builders,
    :meth:`PackedSequence.validate` and :mod:`seqpack.collate`).

    Args:
        cu_seqlens_padded: int [n+1] physical segment starts, ``[-1]`` = row length T.
        real_lens: int [n] real tokens per segment (``<=`` its padded length; 0 = all padding).

    Returns:
        ``(position_ids int64 [T], padding_mask bool [T] (True = pad), seq_idx int32 [T])``:
        positions restart at 0 on every segment start and keep counting through its padding.
    """
    cup = np.asarray(cu_seqlens_padded, dtype=np.int64)
    seg_len = np.diff(cup)
    t = int(cup[-1])
    position_ids = np.arange(t, dtype=np.int64) - np.repeat(cup[:-1], seg_len)
    padding_mask = position_ids >= np.repeat(np.asarray(real_lens, dtype=np.int64), seg_len)
    seq_idx = np.repeat(np.arange(seg_len.shape[0], dtype=np.int32), seg_len)
    return position_ids, padding_mask, seq_idx


def trim_cu_seqlens(cu_seqlens, num_segments: int | None = None):
    """Drop static-shape padding from a boundary array (case B19).

    Handles the two fixed-width encodings seen in the field: ``-1`` sentinels
    (``[0, 5, 8, -1, -1]``, Megatron-Bridge packed Parquet) and repeated-last padding
    (``[0, 5, 8, 8, 8]``, this spec's CUDA-graph mode). An unpadded array is returned unchanged
    (``[0, 5, 8]`` stays ``[0, 5, 8]``; never an empty array, unlike an ``argmin`` fallback).

    Args:
        cu_seqlens: 1-D integer array (numpy or torch), starting at 0.
        num_segments: the true segment count ``N`` when it is carried as metadata (preferred: the
            valid count is then taken from it, not re-derived); ``None`` derives it.

    Returns:
        Contiguous 1-D int32 array of ``N + 1`` entries starting at 0 (a torch tensor when the
        input is a torch tensor, on the same device).

    Raises:
        ValueError: not 1-D, empty, not starting at 0, or ``num_segments`` out of range.
    """
    is_torch = type(cu_seqlens).__module__.startswith("torch")
    arr = cu_seqlens.detach().cpu().numpy() if is_torch else np.asarray(cu_seqlens)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"cu_seqlens must be a non-empty 1-D array, got shape {arr.shape}")
    if int(arr[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {arr[:4].tolist()}...")
    if num_segments is not None:
        n = int(num_segments)
        if n < 0 or n + 1 > arr.shape[0]:
            raise ValueError(f"num_segments={n} does not fit a boundary array of {arr.shape[0]} entries")
        end = n + 1
    else:
        neg = np.flatnonzero(arr < 0)
        end = int(neg[0]) if neg.size else arr.shape[0]
        # repeated-last padding: keep the first occurrence of the final value
        last = arr[end - 1]
        while end > 1 and arr[end - 2] == last:
            end -= 1
    out = np.ascontiguousarray(arr[:end], dtype=np.int32)
    if is_torch:
        import torch

        return torch.from_numpy(out).to(cu_seqlens.device)
    return out


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
        extra: row metadata (``has_final_target`` bool [N], ``pad_to_multiple_of``, ``seq_length``,
            ...) and optional per-token tables (an array whose axis 0 or last axis has length ``T``,
            e.g. multi-axis positions ``[A, T]``); context-parallel slicing slices the tables.
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
    ) -> "PackedSequence":
        """Rebuild a full row from stored columns (the offline reader's path).

        Every derived field (``loss_mask``, ``position_ids``, ``seq_lens``, ``max_seqlen``,
        ``padding_mask``, ``seq_idx``) is recomputed from the two boundary arrays; nothing is
        inferred from token values (invariant 10).

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

        Returns:
            PackedSequence (boundary arrays trimmed to N + 1 entries).

        Raises:
            PackedSequenceError: shapes or boundaries inconsistent (invariants 1-3).
        """
        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        lab = np.ascontiguousarray(labels, dtype=np.int64)
        if ids.ndim != 1 or lab.shape != ids.shape:
            _fail(1, f"input_ids and labels must be 1-D of equal length, got {ids.shape} and {lab.shape}")
        cu = trim_cu_seqlens(cu_seqlens, num_segments)
        cup = trim_cu_seqlens(cu_seqlens_padded, num_segments if num_segments is not None else len(cu) - 1)
        if cu.shape != cup.shape:
            _fail(2, f"cu_seqlens has {cu.shape[0]} entries but cu_seqlens_padded {cup.shape[0]}")
        n = cu.shape[0] - 1
        if n < 1:
            _fail(3, "a packed row needs at least one segment")
        t = ids.shape[0]
        if int(cup[-1]) != t:
            _fail(2, f"cu_seqlens_padded[-1]={int(cup[-1])} != row length T={t}")
        real = np.diff(cu.astype(np.int64))
        padded = np.diff(cup.astype(np.int64))
        bad = np.flatnonzero((real <= 0) | (real > padded))
        if bad.size:
            i = int(bad[0])
            _fail(3, f"segment {i}: real length {int(real[i])} must satisfy 0 < real <= padded ({int(padded[i])})")
        starts = cup[:-1].astype(np.int64)
        position_ids, padding_mask, seq_idx = _segment_fields(cup, real)
        if sample_ids is None:
            sample_ids = [str(i) for i in range(n)]
        sample_ids = list(sample_ids)
        ex = dict(extra or {})
        if has_final_target is None:
            last_real = starts + real - 1
            has_final_target = lab[last_real] != IGNORE_INDEX
        ex["has_final_target"] = np.asarray(has_final_target, dtype=bool)
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
            media=list(media) if media is not None else None,
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
        """Labels in the HF convention (the model shifts internally): ``hf[t] = labels[t-1]``.

        Returns:
            int64 [T]; -100 at every segment's first slot (so no segment learns from the previous
            one, case B03). An explicit final target (case B12) survives only when the segment has
            a padding slot after its last real token; otherwise the unshifted convention has no slot
            for it and it is dropped (:func:`seqpack.interop._labels.unshift_per_segment` with
            ``final_target="drop"``, the conversion the exporters use).
        """
        from seqpack.interop._labels import unshift_per_segment

        cu, cup = self.real_boundaries()
        return unshift_per_segment(self.labels, cu, cup, final_target="drop")

    # ------------------------------------------------------------------ validation
    def validate(
        self,
        capacity: int | None = None,
        context_parallel_size: int = 1,
        multiple: int | None = None,
    ) -> "PackedSequence":
        """Check every invariant (1-10) of ``packed-batch-spec.md``.

        Args:
            capacity: pack capacity in tokens (``seq_length``); when given, ``T <= capacity`` and
                ``max(position_ids) < capacity``.
            context_parallel_size: CP size; > 1 enables invariant 8 with multiple ``2*CP``.
            multiple: the full pad multiple from :func:`seqpack.padding.compute_pad_multiple`
                (e.g. ``lcm(2*CP, CP*TP)`` with sequence parallelism); when given, every padded
                segment length and ``T`` must be divisible by it.

        Returns:
            self (so ``build(...).validate()`` chains).

        Raises:
            PackedSequenceError: naming the invariant number and the offending slot / segment.
        """
        # ---- 1: shapes and dtypes
        t = self.length
        per_token = {
            "input_ids": (self.input_ids, "i"),
            "labels": (self.labels, "i"),
            "loss_mask": (self.loss_mask, "bf"),
            "position_ids": (self.position_ids, "i"),
            "padding_mask": (self.padding_mask, "b"),
            "seq_idx": (self.seq_idx, "i"),
        }
        for name, (arr, kinds) in per_token.items():
            if not isinstance(arr, np.ndarray):
                _fail(1, f"{name} must be a numpy array, got {type(arr).__name__}")
            if arr.ndim != 1 or arr.shape[0] != t:
                _fail(1, f"{name} has shape {arr.shape}, expected [T]=[{t}]")
            if arr.dtype.kind not in kinds:
                _fail(1, f"{name} has dtype {arr.dtype}, expected kind {kinds!r}")
        for name in ("input_ids", "labels", "position_ids"):
            if getattr(self, name).dtype != np.int64:
                _fail(1, f"{name} must be int64, got {getattr(self, name).dtype}")
        if self.seq_idx.dtype != np.int32:
            _fail(1, f"seq_idx must be int32, got {self.seq_idx.dtype}")
        for name in ("cu_seqlens", "cu_seqlens_padded", "seq_lens"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != np.int32 or not arr.flags.c_contiguous:
                _fail(1, f"{name} must be a 1-D contiguous int32 array, got "
                         f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}")
        if t == 0:
            _fail(1, "row is empty (T = 0)")
        if capacity is not None and t > capacity:
            _fail(1, f"row length T={t} exceeds capacity {capacity}")

        # ---- 2: boundary arrays
        cu_raw, cup_raw = self.cu_seqlens, self.cu_seqlens_padded
        if cu_raw.shape != cup_raw.shape:
            _fail(2, f"cu_seqlens has {cu_raw.shape[0]} entries but cu_seqlens_padded {cup_raw.shape[0]}")
        n = int(self.num_segments)
        if n < 1 or n + 1 > cu_raw.shape[0]:
            _fail(2, f"num_segments={n} inconsistent with {cu_raw.shape[0]} boundary entries")
        for name, arr in (("cu_seqlens", cu_raw), ("cu_seqlens_padded", cup_raw)):
            if int(arr[0]) != 0:
                _fail(2, f"{name} must start at 0, got {int(arr[0])}")
            tail = arr[n + 1:]
            if tail.size and np.any(tail != arr[n]):
                j = n + 1 + int(np.flatnonzero(tail != arr[n])[0])
                _fail(2, f"{name}[{j}]={int(arr[j])}: static-shape padding must repeat the last value "
                         f"{int(arr[n])} (never -1 sentinels)")
        cu, cup = cu_raw[: n + 1].astype(np.int64), cup_raw[: n + 1].astype(np.int64)
        for name, arr in (("cu_seqlens", cu), ("cu_seqlens_padded", cup)):
            d = np.diff(arr)
            if np.any(d <= 0):
                i = int(np.flatnonzero(d <= 0)[0])
                _fail(2, f"{name} not strictly increasing at segment {i}: {int(arr[i])} -> {int(arr[i + 1])}")
        if int(cup[-1]) != t:
            _fail(2, f"cu_seqlens_padded[-1]={int(cup[-1])} != row length T={t}")

        # ---- 3: segment lengths
        real = np.diff(cu)
        padded = np.diff(cup)
        bad = np.flatnonzero((real <= 0) | (real > padded))
        if bad.size:
            i = int(bad[0])
            _fail(3, f"segment {i}: real length {int(real[i])} must satisfy 0 < real <= padded ({int(padded[i])})")

        # ---- 4: padding_mask and seq_idx implied by the boundaries
        starts = cup[:-1]
        exp_pos, exp_pad, exp_seq = _segment_fields(cup, real)
        # logical boundaries must sit inside their physical segment: cu[i] is the count of real
        # tokens before segment i
        exp_cu = np.concatenate([[0], np.cumsum(real)])
        if np.any(exp_cu != cu):
            i = int(np.flatnonzero(exp_cu != cu)[0])
            _fail(4, f"cu_seqlens[{i}]={int(cu[i])} != cumulative real length {int(exp_cu[i])}")
        if np.any(self.padding_mask != exp_pad):
            s = int(np.flatnonzero(self.padding_mask != exp_pad)[0])
            _fail(4, f"padding_mask[{s}]={bool(self.padding_mask[s])} but the boundaries make slot {s} "
                     f"{'padding' if exp_pad[s] else 'real'} (segment {int(exp_seq[s])})")
        if np.any(self.seq_idx != exp_seq):
            s = int(np.flatnonzero(self.seq_idx != exp_seq)[0])
            _fail(4, f"seq_idx[{s}]={int(self.seq_idx[s])} but the boundaries put slot {s} "
                     f"in segment {int(exp_seq[s])}")

        # ---- 5: position_ids
        if np.any(self.position_ids != exp_pos):
            s = int(np.flatnonzero(self.position_ids != exp_pos)[0])
            _fail(5, f"position_ids[{s}]={int(self.position_ids[s])}, expected {int(exp_pos[s])} "
                     f"(segment {int(exp_seq[s])} restarts at slot {int(starts[exp_seq[s]])})")
        if capacity is not None and int(self.position_ids.max()) >= capacity:
            _fail(5, f"max(position_ids)={int(self.position_ids.max())} must be < capacity {capacity}")

        # ---- 6: labels on padding, loss_mask
        lab = self.labels
        on_pad = np.flatnonzero(self.padding_mask & (lab != IGNORE_INDEX))
        if on_pad.size:
            s = int(on_pad[0])
            _fail(6, f"labels[{s}]={int(lab[s])} on a padding slot (segment {int(exp_seq[s])}); must be -100")
        if self.loss_mask.dtype == bool:
            lm_bad = np.flatnonzero(self.loss_mask != (lab != IGNORE_INDEX))
        else:  # per-token weights: zero exactly where labels are ignored
            lm_bad = np.flatnonzero((self.loss_mask != 0) != (lab != IGNORE_INDEX))
        if lm_bad.size:
            s = int(lm_bad[0])
            _fail(6, f"loss_mask[{s}]={self.loss_mask[s]!r} but labels[{s}]={int(lab[s])} (segment {int(exp_seq[s])})")

        # ---- 7: next-token consistency inside each segment
        last_real = starts + real - 1
        inside = (~exp_pad).copy()
        inside[last_real] = False  # last real slot handled separately
        idx = np.flatnonzero(inside & (lab != IGNORE_INDEX))
        wrong = idx[lab[idx] != self.input_ids[idx + 1]]
        if wrong.size:
            s = int(wrong[0])
            _fail(7, f"labels[{s}]={int(lab[s])} != input_ids[{s + 1}]={int(self.input_ids[s + 1])} "
                     f"inside segment {int(exp_seq[s])} ({self._sid(int(exp_seq[s]))})")
        hft = self.extra.get("has_final_target")
        hft = np.zeros(n, dtype=bool) if hft is None else np.asarray(hft, dtype=bool)
        if hft.shape != (n,):
            _fail(7, f"extra['has_final_target'] has shape {hft.shape}, expected [N]=[{n}]")
        crossing = np.flatnonzero((lab[last_real] != IGNORE_INDEX) & ~hft)
        if crossing.size:
            i = int(crossing[0])
            s = int(last_real[i])
            _fail(7, f"labels[{s}]={int(lab[s])} at the last real slot of segment {i} ({self._sid(i)}) must be "
                     f"-100: a label must not cross into the next segment (case B03)")

        # ---- 8: context-parallel divisibility
        mult = 1
        if context_parallel_size > 1:
            mult = 2 * int(context_parallel_size)
        if multiple is not None:
            if multiple < 1:
                raise ValueError(f"multiple must be >= 1, got {multiple}")
            mult = int(np.lcm(mult, int(multiple)))
        if mult > 1:
            nd = np.flatnonzero(padded % mult)
            if nd.size:
                i = int(nd[0])
                _fail(8, f"segment {i} ({self._sid(i)}) has padded length {int(padded[i])}, not divisible by "
                         f"{mult} (context_parallel_size={context_parallel_size}); rebuild with "
                         f"pad_to_multiple_of=seqpack.padding.compute_pad_multiple(...)")
            if t % mult:
                _fail(8, f"row length T={t} not divisible by {mult}")

        # ---- 9: max_seqlen
        mx = int(padded.max())
        if int(self.max_seqlen) < mx:
            _fail(9, f"max_seqlen={int(self.max_seqlen)} < longest padded segment {mx}")
        if int(self.max_seqlen) != mx and not self.extra.get("max_seqlen_pinned", False):
            _fail(9, f"max_seqlen={int(self.max_seqlen)} != longest padded segment {mx} "
                     f"(only a static-shape mode may pin it; set extra['max_seqlen_pinned'])")

        # ---- 10: lengths come from the boundary arrays only
        if np.any(self.seq_lens.astype(np.int64) != real) or self.seq_lens.shape[0] != n:
            _fail(10, f"seq_lens {self.seq_lens.tolist()[:8]} != diff(cu_seqlens) {real.tolist()[:8]}")
        if self.sample_ids is not None and len(self.sample_ids) not in (0, n):
            _fail(10, f"{len(self.sample_ids)} sample_ids for {n} segments")
        if self.media is not None and len(self.media) != n:
            _fail(10, f"{len(self.media)} media entries for {n} segments")
        return self

    def _sid(self, i: int) -> str:
        if self.sample_ids and i < len(self.sample_ids):
            return f"sample {self.sample_ids[i]!r}"
        return f"segment {i}"

    # ------------------------------------------------------------------ static shapes
    def pad_cu_seqlens(self, max_samples_per_bin: int | None, *, pin_max_seqlen: bool = False) -> "PackedSequence":
        """Method form of :func:`pad_cu_seqlens`."""
        return pad_cu_seqlens(self, max_samples_per_bin, pin_max_seqlen=pin_max_seqlen)


_SAMPLE_HINT = ("expected seqpack.data.sample.Sample objects or mappings with 'input_ids' and 'labels' "
                "(labels shifted within the sample: labels[t] = input_ids[t+1] or -100) and an optional "
                "'sample_id'")


def _as_segments(samples: Any) -> list[Any]:
    """Samples as a list of ``Sample``-like objects; mappings are converted (see build_packed_sequence)."""
    from collections.abc import Mapping

    if isinstance(samples, Mapping) or hasattr(samples, "input_ids"):
        raise TypeError(f"build_packed_sequence takes a sequence of samples, got a single "
                        f"{type(samples).__name__}; wrap it in a list: build_packed_sequence([sample], ...)")
    if not hasattr(samples, "__len__"):
        if not hasattr(samples, "__iter__"):
            raise TypeError(f"build_packed_sequence: samples must be a sequence, got {type(samples).__name__}; "
                            + _SAMPLE_HINT)
        samples = list(samples)
    ok = _SEGMENT_TYPES
    if not ok:
        from seqpack.data.sample import Sample

        ok.add(Sample)
    if all(type(s) in ok for s in samples):  # hot path: Sample objects, no per-item checks
        return samples
    out = []
    for i, s in enumerate(samples):
        if type(s) in ok:
            out.append(s)
        elif isinstance(s, Mapping):
            out.append(_sample_from_mapping(s, i))
        elif all(hasattr(s, a) for a in ("input_ids", "labels", "length", "sample_id")):
            out.append(s)
        else:
            raise TypeError(f"build_packed_sequence: sample at position {i} is a {type(s).__name__}; "
                            + _SAMPLE_HINT)
    return out


_SEGMENT_TYPES: set = set()  # Sample, added on first use (no import of seqpack.data at module load)


def _sample_from_mapping(d: Any, i: int):
    from seqpack.data.sample import Sample

    sid = d.get("sample_id")
    sid = str(sid) if sid is not None else str(i)
    if d.get("input_ids") is None or d.get("labels") is None:
        missing = [k for k in ("input_ids", "labels") if d.get(k) is None]
        raise ValueError(f"build_packed_sequence: sample {sid!r} (position {i}) has no {missing}; "
                         + _SAMPLE_HINT + ". For unlabeled LM data use the collators, which default labels to "
                         "the next token")

    def arr(x):
        if hasattr(x, "detach"):  # torch tensor
            x = x.detach().cpu().numpy()
        return np.asarray(x).reshape(-1)

    ids, labels = arr(d["input_ids"]), arr(d["labels"])
    if ids.shape == labels.shape and ids.size > 1:
        trained = np.flatnonzero(labels != IGNORE_INDEX)
        nxt = trained[trained < ids.size - 1]
        if (trained.size >= 2 and np.array_equal(labels[trained], ids[trained])
                and not np.array_equal(labels[nxt], ids[nxt + 1])):
            raise ValueError(
                f"build_packed_sequence: sample {sid!r} (position {i}) has labels equal to input_ids on every "
                "trained token: these are unshifted (HF) labels, but seqpack labels are shifted within the "
                "sample (labels[t] = input_ids[t+1]). Shift them first (seqpack.data.sample.shift_labels), or "
                "use a collator with label_convention='hf'"
            )
    return Sample(ids, labels, sample_id=sid, media=d.get("media"))


def _check_pad_token_id(pad_token_id: Any) -> int:
    hint = "the tokenizer's pad_token_id; Qwen3: tok.pad_token_id"
    if pad_token_id is None:
        raise TypeError(f"pad_token_id is required ({hint}); it fills the padding slots, which are never trained")
    try:
        v = int(pad_token_id)
        ok = v == pad_token_id and not isinstance(pad_token_id, bool)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TypeError(f"pad_token_id must be an integer token id ({hint}), got {pad_token_id!r}")
    if v < 0:
        raise ValueError(f"pad_token_id must be a token id >= 0 ({hint}), got {v}")
    return v


def build_packed_sequence(
    samples: Sequence[Any],
    *,
    pad_to_multiple_of: int = 1,
    pad_token_id: int,
    seq_length: int | None = None,
    pad_to_max_length: bool = False,
) -> PackedSequence:
    """Build one THD row from samples (labels already shifted per sample).

    Each segment's physical length is ``round_up(len, pad_to_multiple_of)`` (the multiple from
    :func:`seqpack.padding.compute_pad_multiple`, the one source of truth, case B24); with
    ``pad_to_max_length`` the row is padded to ``seq_length`` and the last segment absorbs the
    tail (its positions keep counting; case B17 "extend last" policy).

    Args:
        samples: ``Sample`` objects (``input_ids``, ``labels`` int [L], ``sample_id``, ``media``), or
            mappings with ``input_ids`` and ``labels`` (lists, numpy arrays or CPU tensors; labels
            already shifted within the sample as in ``Sample``) and optional ``sample_id`` (default:
            the position in the pack) / ``media``; they are converted to ``Sample``.
        pad_to_multiple_of: per-segment pad multiple, >= 1.
        pad_token_id: token id written into padding slots (never used to infer lengths); required,
            the tokenizer's ``pad_token_id`` (Qwen3: ``tok.pad_token_id`` = 151643).
        seq_length: capacity in tokens; the padded total must fit.
        pad_to_max_length: pad the row to exactly ``seq_length`` (requires ``seq_length``).

    Returns:
        PackedSequence with ``T = seq_length`` (pad_to_max_length) or ``sum(padded lengths)``.

    Raises:
        TypeError: ``pad_token_id`` None or not an integer; a sample that is neither a ``Sample`` nor a
            mapping with ``input_ids``/``labels``; a single sample instead of a sequence of them.
        ValueError: empty sample list; an empty sample; a mapping without ``labels`` or whose labels
            look unshifted (HF convention: ``labels[t] == input_ids[t]`` on every trained token);
            a negative ``pad_token_id``; ``seq_length % pad_to_multiple_of != 0``
            (names both keys); padded total > ``seq_length`` (names sample ids and lengths);
            ``pad_to_max_length`` without ``seq_length``.
    """
    from seqpack.padding import round_up

    samples = _as_segments(samples)
    pad_token_id = _check_pad_token_id(pad_token_id)
    if len(samples) == 0:
        raise ValueError("build_packed_sequence: empty sample list; a packed row needs at least one sample")
    m = int(pad_to_multiple_of)
    if m != pad_to_multiple_of or m < 1:
        raise ValueError(f"pad_to_multiple_of must be an integer >= 1, got {pad_to_multiple_of!r}")
    if seq_length is not None:
        check_seq_length(seq_length, m, {"pad_to_multiple_of": m})
    if pad_to_max_length and seq_length is None:
        raise ValueError("pad_to_max_length=True needs seq_length")
    lens = np.array([int(s.length) for s in samples], dtype=np.int64)
    empty = np.flatnonzero(lens == 0)
    if empty.size:
        s = samples[int(empty[0])]
        raise ValueError(f"sample {s.sample_id!r} (position {int(empty[0])} in the pack) is empty; "
                         f"empty segments never reach a kernel")
    padded = round_up(lens, m)
    total = int(padded.sum())
    if seq_length is not None and total > seq_length:
        detail = ", ".join(f"{s.sample_id}:{int(l)}->{int(p)}" for s, l, p in zip(samples, lens, padded))
        raise ValueError(
            f"packed row of {len(samples)} samples needs {total} slots after padding each to a multiple of {m}, "
            f"more than seq_length={seq_length} (sample_id:length->padded: {detail}). The plan was made with a "
            f"different pad multiple or capacity; plan with pack_lengths(..., pad_to_multiple_of={m})"
        )
    if pad_to_max_length:
        padded[-1] += int(seq_length) - total
        total = int(seq_length)
    t = total
    cup = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(padded, out=cup[1:])
    cu = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    input_ids = np.full(t, int(pad_token_id), dtype=np.int64)
    labels = np.full(t, IGNORE_INDEX, dtype=np.int64)
    has_final = np.zeros(len(samples), dtype=bool)
    for i, s in enumerate(samples):
        a, L = int(cup[i]), int(lens[i])
        input_ids[a:a + L] = s.input_ids
        labels[a:a + L] = s.labels
        has_final[i] = int(s.labels[-1]) != IGNORE_INDEX
    position_ids, padding_mask, seq_idx = _segment_fields(cup, lens)
    media = [s.media for s in samples]
    return PackedSequence(
        input_ids=input_ids,
        labels=labels,
        loss_mask=labels != IGNORE_INDEX,
        position_ids=position_ids,
        cu_seqlens=cu.astype(np.int32),
        cu_seqlens_padded=cup.astype(np.int32),
        seq_lens=lens.astype(np.int32),
        max_seqlen=int(padded.max()),
        padding_mask=padding_mask,
        seq_idx=seq_idx,
        sample_ids=[str(s.sample_id) for s in samples],
        media=media if any(x is not None for x in media) else None,
        num_segments=len(samples),
        extra={
            "has_final_target": has_final,
            "pad_to_multiple_of": m,
            "seq_length": seq_length,
            "pad_to_max_length": bool(pad_to_max_length),
            "pad_token_id": int(pad_token_id),
        },
    )


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
