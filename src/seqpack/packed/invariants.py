"""The invariants of a packed row (``packed-batch-spec.md``, invariants 1-10) and their checker.

:func:`validate` checks every invariant and names the invariant number and the offending slot or
segment; :meth:`seqpack.packed.PackedSequence.validate` calls it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack.packed.boundaries import segment_fields
from seqpack.sample import IGNORE_INDEX

__all__ = ["PackedSequenceError", "violation", "validate", "stored_row_problem", "token_range_problem"]


class PackedSequenceError(ValueError):
    """A packed row breaks an invariant of ``packed-batch-spec.md`` (message names the invariant)."""


def violation(inv: int, msg: str) -> PackedSequenceError:
    """The error for invariant ``inv`` (raise it): ``"packed-batch-spec invariant {inv} violated: {msg}"``."""
    return PackedSequenceError(f"packed-batch-spec invariant {inv} violated: {msg}")


def _fail(inv: int, msg: str) -> None:
    raise violation(inv, msg)


def _segment_name(packed: Any, i: int) -> str:
    if packed.sample_ids and i < len(packed.sample_ids):
        return f"sample {packed.sample_ids[i]!r}"
    return f"segment {i}"


def stored_row_problem(cu_seqlens, cu_seqlens_padded, num_input_ids: int, num_labels: int, num_sample_ids: int,
                       final_target_segments=()) -> str | None:
    """What makes stored row columns unusable for building a row (a crafted or damaged file), or None.

    Checked before any array is indexed with the boundaries: both arrays have the same >= 2 entries,
    start at 0 and never decrease, ``cu_seqlens_padded[-1]`` equals the number of ``input_ids`` (and of
    labels), no segment has more real tokens than slots, one sample id per segment, and the final-target
    segment indices exist. The full invariants are :func:`validate`'s.
    """
    cu, cup = np.asarray(cu_seqlens, dtype=np.int64), np.asarray(cu_seqlens_padded, dtype=np.int64)
    if cu.ndim != 1 or cu.size < 2 or cu.shape != cup.shape:
        return f"cu_seqlens has {cu.size} entries and cu_seqlens_padded {cup.size} (need the same number, >= 2)"
    if int(cu[0]) != 0 or int(cup[0]) != 0 or np.any(np.diff(cup) < 0) or np.any(np.diff(cu) < 0):
        return "a boundary array does not start at 0 and increase"
    if int(cup[-1]) != num_input_ids or num_labels != num_input_ids:
        return (f"cu_seqlens_padded[-1]={int(cup[-1])}, {num_input_ids} input_ids and {num_labels} labels "
                "(they must agree)")
    if np.any(np.diff(cu) > np.diff(cup)):
        return "a segment has more real tokens (cu_seqlens) than slots (cu_seqlens_padded)"
    if num_sample_ids != cu.size - 1:
        return f"{num_sample_ids} sample ids for {cu.size - 1} segments"
    ft = np.asarray(final_target_segments if final_target_segments is not None else (), dtype=np.int64)
    if ft.size and (int(ft.min()) < 0 or int(ft.max()) >= cu.size - 1):
        return f"final_target_segments {ft.tolist()} name segments outside 0..{cu.size - 2}"
    return None


def token_range_problem(input_ids, labels, vocab_size: int | None = None) -> str | None:
    """What puts a row's token ids out of range (invariant 11), or None.

    ``input_ids`` are never negative; a label is the ignore index (-100) or a non-negative id; with
    ``vocab_size``, every id and non-ignored label is below it. The first offending position is named.
    """
    ids, lab = np.asarray(input_ids), np.asarray(labels)
    if ids.size and int(ids.min()) < 0:
        s = int(np.flatnonzero(ids < 0)[0])
        return f"input_ids[{s}]={int(ids[s])} is negative"
    bad_lab = (lab < 0) & (lab != IGNORE_INDEX)
    if bad_lab.any():
        s = int(np.flatnonzero(bad_lab)[0])
        return f"labels[{s}]={int(lab[s])} is negative and not the ignore index {IGNORE_INDEX}"
    if vocab_size is not None:
        if ids.size and int(ids.max()) >= vocab_size:
            s = int(np.flatnonzero(ids >= vocab_size)[0])
            return f"input_ids[{s}]={int(ids[s])} is outside the vocabulary (vocab_size={vocab_size})"
        over = lab >= vocab_size
        if over.any():
            s = int(np.flatnonzero(over)[0])
            return f"labels[{s}]={int(lab[s])} is outside the vocabulary (vocab_size={vocab_size})"
    return None


def validate(packed: Any, capacity: int | None = None, context_parallel_size: int = 1,
             multiple: int | None = None, *, vocab_size: int | None = None) -> Any:
    """Check every invariant (1-11) of ``packed-batch-spec.md`` on one row.

    Args:
        packed: a :class:`~seqpack.packed.PackedSequence`.
        capacity: pack capacity in tokens (``seq_length``); when given, ``T <= capacity`` and
            ``max(position_ids) < capacity``.
        context_parallel_size: CP size; > 1 enables invariant 8 with multiple ``2*CP``.
        multiple: the full pad multiple from :func:`seqpack.padding.compute_pad_multiple`
            (e.g. ``lcm(2*CP, CP*TP)`` with sequence parallelism); when given, every padded
            segment length and ``T`` must be divisible by it.
        vocab_size: the tokenizer's / embedding's vocabulary size (``len(tokenizer)``); when given,
            every ``input_ids`` and every label other than -100 lies in ``[0, vocab_size)`` (invariant
            11). Negative ids are refused always.

    Returns:
        ``packed`` (so ``build(...).validate()`` chains).

    Raises:
        PackedSequenceError: naming the invariant number and the offending slot / segment.
        ValueError: ``vocab_size`` that is not a positive integer (a caller's mistake, not the row's).
    """
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer))
                                   or vocab_size < 1):
        raise ValueError(f"vocab_size must be a positive integer (len(tokenizer)), got {vocab_size!r}")
    # ---- 1: shapes and dtypes
    t = packed.length
    per_token = {
        "input_ids": (packed.input_ids, "i"),
        "labels": (packed.labels, "i"),
        "loss_mask": (packed.loss_mask, "bf"),
        "position_ids": (packed.position_ids, "i"),
        "padding_mask": (packed.padding_mask, "b"),
        "seq_idx": (packed.seq_idx, "i"),
    }
    for name, (arr, kinds) in per_token.items():
        if not isinstance(arr, np.ndarray):
            _fail(1, f"{name} must be a numpy array, got {type(arr).__name__}")
        if arr.ndim != 1 or arr.shape[0] != t:
            _fail(1, f"{name} has shape {arr.shape}, expected [T]=[{t}]")
        if arr.dtype.kind not in kinds:
            _fail(1, f"{name} has dtype {arr.dtype}, expected kind {kinds!r}")
    for name in ("input_ids", "labels", "position_ids"):
        if getattr(packed, name).dtype != np.int64:
            _fail(1, f"{name} must be int64, got {getattr(packed, name).dtype}")
    if packed.seq_idx.dtype != np.int32:
        _fail(1, f"seq_idx must be int32, got {packed.seq_idx.dtype}")
    for name in ("cu_seqlens", "cu_seqlens_padded", "seq_lens"):
        arr = getattr(packed, name)
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype != np.int32 or not arr.flags.c_contiguous:
            _fail(1, f"{name} must be a 1-D contiguous int32 array, got "
                     f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}")
    if t == 0:
        _fail(1, "row is empty (T = 0)")
    if capacity is not None and t > capacity:
        _fail(1, f"row length T={t} exceeds capacity {capacity}")

    # ---- 11: token ids in range (before anything indexes with them)
    problem = token_range_problem(packed.input_ids, packed.labels, vocab_size)
    if problem is not None:
        _fail(11, problem)

    # ---- 2: boundary arrays
    cu_raw, cup_raw = packed.cu_seqlens, packed.cu_seqlens_padded
    if cu_raw.shape != cup_raw.shape:
        _fail(2, f"cu_seqlens has {cu_raw.shape[0]} entries but cu_seqlens_padded {cup_raw.shape[0]}")
    n = int(packed.num_segments)
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
    exp_pos, exp_pad, exp_seq = segment_fields(cup, real)
    # logical boundaries must sit inside their physical segment: cu[i] is the count of real
    # tokens before segment i
    exp_cu = np.concatenate([[0], np.cumsum(real)])
    if np.any(exp_cu != cu):
        i = int(np.flatnonzero(exp_cu != cu)[0])
        _fail(4, f"cu_seqlens[{i}]={int(cu[i])} != cumulative real length {int(exp_cu[i])}")
    if np.any(packed.padding_mask != exp_pad):
        s = int(np.flatnonzero(packed.padding_mask != exp_pad)[0])
        _fail(4, f"padding_mask[{s}]={bool(packed.padding_mask[s])} but the boundaries make slot {s} "
                 f"{'padding' if exp_pad[s] else 'real'} (segment {int(exp_seq[s])})")
    if np.any(packed.seq_idx != exp_seq):
        s = int(np.flatnonzero(packed.seq_idx != exp_seq)[0])
        _fail(4, f"seq_idx[{s}]={int(packed.seq_idx[s])} but the boundaries put slot {s} "
                 f"in segment {int(exp_seq[s])}")

    # ---- 5: position_ids
    if np.any(packed.position_ids != exp_pos):
        s = int(np.flatnonzero(packed.position_ids != exp_pos)[0])
        _fail(5, f"position_ids[{s}]={int(packed.position_ids[s])}, expected {int(exp_pos[s])} "
                 f"(segment {int(exp_seq[s])} restarts at slot {int(starts[exp_seq[s]])})")
    if capacity is not None and int(packed.position_ids.max()) >= capacity:
        _fail(5, f"max(position_ids)={int(packed.position_ids.max())} must be < capacity {capacity}")

    # ---- 6: labels on padding, loss_mask
    lab = packed.labels
    on_pad = np.flatnonzero(packed.padding_mask & (lab != IGNORE_INDEX))
    if on_pad.size:
        s = int(on_pad[0])
        _fail(6, f"labels[{s}]={int(lab[s])} on a padding slot (segment {int(exp_seq[s])}); must be -100")
    if packed.loss_mask.dtype == bool:
        lm_bad = np.flatnonzero(packed.loss_mask != (lab != IGNORE_INDEX))
    else:  # per-token weights: zero exactly where labels are ignored
        lm_bad = np.flatnonzero((packed.loss_mask != 0) != (lab != IGNORE_INDEX))
    if lm_bad.size:
        s = int(lm_bad[0])
        _fail(6, f"loss_mask[{s}]={bool(packed.loss_mask[s])} but labels[{s}]={int(lab[s])} (segment {int(exp_seq[s])})")

    # ---- 7: next-token consistency inside each segment
    last_real = starts + real - 1
    inside = (~exp_pad).copy()
    inside[last_real] = False  # last real slot handled separately
    idx = np.flatnonzero(inside & (lab != IGNORE_INDEX))
    wrong = idx[lab[idx] != packed.input_ids[idx + 1]]
    if wrong.size:
        s = int(wrong[0])
        _fail(7, f"labels[{s}]={int(lab[s])} != input_ids[{s + 1}]={int(packed.input_ids[s + 1])} "
                 f"inside segment {int(exp_seq[s])} ({_segment_name(packed, int(exp_seq[s]))})")
    hft = packed.extra.get("has_final_target")
    hft = np.zeros(n, dtype=bool) if hft is None else np.asarray(hft, dtype=bool)
    if hft.shape != (n,):
        _fail(7, f"extra['has_final_target'] has shape {hft.shape}, expected [N]=[{n}]")
    crossing = np.flatnonzero((lab[last_real] != IGNORE_INDEX) & ~hft)
    if crossing.size:
        i = int(crossing[0])
        s = int(last_real[i])
        _fail(7, f"labels[{s}]={int(lab[s])} at the last real slot of segment {i} ({_segment_name(packed, i)}) must be "
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
            _fail(8, f"segment {i} ({_segment_name(packed, i)}) has padded length {int(padded[i])}, not divisible by "
                     f"{mult} (context_parallel_size={context_parallel_size}); rebuild with "
                     f"pad_to_multiple_of=seqpack.padding.compute_pad_multiple(...)")
        if t % mult:
            _fail(8, f"row length T={t} not divisible by {mult}")

    # ---- 9: max_seqlen
    mx = int(padded.max())
    if int(packed.max_seqlen) < mx:
        _fail(9, f"max_seqlen={int(packed.max_seqlen)} < longest padded segment {mx}")
    if int(packed.max_seqlen) != mx and not packed.extra.get("max_seqlen_pinned", False):
        _fail(9, f"max_seqlen={int(packed.max_seqlen)} != longest padded segment {mx} "
                 f"(only a static-shape mode may pin it; set extra['max_seqlen_pinned'])")

    # ---- 10: lengths come from the boundary arrays only
    if np.any(packed.seq_lens.astype(np.int64) != real) or packed.seq_lens.shape[0] != n:
        _fail(10, f"seq_lens {packed.seq_lens.tolist()[:8]} != diff(cu_seqlens) {real.tolist()[:8]}")
    if packed.sample_ids is not None and len(packed.sample_ids) not in (0, n):
        _fail(10, f"{len(packed.sample_ids)} sample_ids for {n} segments")
    if packed.media is not None and len(packed.media) != n:
        _fail(10, f"{len(packed.media)} media entries for {n} segments")
    return packed
