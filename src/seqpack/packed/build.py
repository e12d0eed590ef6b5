"""The row builders: samples -> one packed row, and packed rows -> one flattened row.

:func:`build_packed_sequence` is the one builder of a row from samples (the offline writer, the
streaming packer, the in-batch collator and the reference trainer call it); :func:`join_rows` lays
rows end to end (the packed collator with micro-batch > 1). Both finish in
:meth:`~seqpack.packed.PackedSequence.from_boundaries`, which derives every per-slot field and the
M-RoPE table once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from seqpack.packed.boundaries import concat_boundaries, real_boundaries
from seqpack.packed.mrope import concat_mrope_tables
from seqpack.packed.sequence import PackedSequence
from seqpack.padding import check_seq_length, round_up
from seqpack.sample import IGNORE_INDEX, Sample

__all__ = ["build_packed_sequence", "join_rows"]


def build_packed_sequence(
    samples: Sequence[Any],
    *,
    pad_to_multiple_of: int = 1,
    pad_token_id: int,
    seq_length: int | None = None,
    pad_to_max_length: bool = False,
    tail_segment: bool = False,
) -> PackedSequence:
    """Build one THD row from samples (labels already shifted per sample).

    Each segment's physical length is ``round_up(len, pad_to_multiple_of)`` (the multiple from
    :func:`seqpack.padding.compute_pad_multiple`, the one source of truth, case B24); with
    ``pad_to_max_length`` the row is padded to ``seq_length`` and the last segment absorbs the
    tail (its positions keep counting; case B17 "extend last" policy), or, with ``tail_segment``,
    the tail becomes its own all-padding segment (Megatron-Bridge's in-batch VLM layout:
    ``cu_seqlens`` repeats its last value, ``num_segments = N + 1``, the tail has no sample id).

    Example::

        >>> row = build_packed_sequence([Sample([5, 6, 7], [6, 7, -100], "a"), Sample([8, 9], [9, -100], "b")],
        ...                             pad_to_multiple_of=4, pad_token_id=0)
        >>> row.input_ids.tolist(), row.cu_seqlens.tolist(), row.cu_seqlens_padded.tolist()
        ([5, 6, 7, 0, 8, 9, 0, 0], [0, 3, 5], [0, 4, 8])

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
        tail_segment: with ``pad_to_max_length``, put the tail in its own segment (see above).

    Returns:
        PackedSequence with ``T = seq_length`` (pad_to_max_length) or ``sum(padded lengths)``;
        ``extra["mrope_position_ids"]`` int64 ``[3, T]`` when the samples' media carry M-RoPE tables.

    Raises:
        TypeError: ``pad_token_id`` None or not an integer; a sample that is neither a ``Sample`` nor a
            mapping with ``input_ids``/``labels``; a single sample instead of a sequence of them.
        ValueError: empty sample list; an empty sample; a mapping without ``labels`` or whose labels
            look unshifted (HF convention: ``labels[t] == input_ids[t]`` on every trained token);
            a negative ``pad_token_id``; ``seq_length % pad_to_multiple_of != 0``
            (names both keys); padded total > ``seq_length`` (names sample ids and lengths);
            ``pad_to_max_length`` without ``seq_length``.
    """
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
            f"different pad multiple or capacity: plan with pack_lengths(..., pad_to_multiple_of={m}); for "
            f"in-batch packing lower the micro-batch size or raise seq_length"
        )
    tail = int(seq_length) - total if pad_to_max_length else 0
    real_lens = lens
    if tail and tail_segment:
        padded = np.append(padded, tail)
        real_lens = np.append(lens, 0)
    elif tail:
        padded[-1] += tail
    cu = np.zeros(real_lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(real_lens, out=cu[1:])
    cup = np.zeros(real_lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(padded, out=cup[1:])
    t = int(cup[-1])
    if t == total and m == 1:
        input_ids = np.concatenate([s.input_ids for s in samples]).astype(np.int64)
        labels = np.concatenate([s.labels for s in samples]).astype(np.int64)
    else:
        input_ids = np.full(t, pad_token_id, dtype=np.int64)
        labels = np.full(t, IGNORE_INDEX, dtype=np.int64)
        for a, s in zip(cup[:-1].tolist(), samples):
            input_ids[a : a + s.length] = s.input_ids
            labels[a : a + s.length] = s.labels
    has_final = np.array([int(s.labels[-1]) != IGNORE_INDEX for s in samples] + [False] * (len(padded) - len(lens)),
                         dtype=bool)
    media = [s.media for s in samples] + [None] * (len(padded) - len(lens))
    return PackedSequence.from_boundaries(
        input_ids, labels, cu, cup, [str(s.sample_id) for s in samples],
        media=media if any(x is not None for x in media) else None,
        has_final_target=has_final,
        tail_segment=len(padded) > len(lens),
        extra={
            "pad_to_multiple_of": m,
            "seq_length": seq_length,
            "pad_to_max_length": bool(pad_to_max_length),
            "pad_token_id": int(pad_token_id),
        },
    )


def join_rows(rows: Sequence[PackedSequence]) -> PackedSequence:
    """Lay packed rows end to end as one row of ``sum T_i`` slots and ``sum N_i`` segments.

    Boundaries are offset with :func:`seqpack.packed.boundaries.concat_boundaries` (row ``i``'s
    ``cu_seqlens_padded`` by the widths of the rows before it, its ``cu_seqlens`` by their real-token
    counts); static-shape boundary arrays are trimmed to each row's ``num_segments`` first. The rows'
    M-RoPE tables (``extra["mrope_position_ids"]``) are concatenated, text rows contributing their
    1-D positions on all three axes. The result owns new arrays (never views of the inputs).

    Args:
        rows: one or more :class:`PackedSequence`.

    Returns:
        PackedSequence (``sample_ids`` and ``media`` concatenated in row order).

    Raises:
        ValueError: no rows.
    """
    if len(rows) == 0:
        raise ValueError("join_rows needs at least one row")
    bounds = [real_boundaries(r)[:2] for r in rows]
    cu, cup = concat_boundaries(bounds)
    media: list[Any] = []
    for r, (c, _) in zip(rows, bounds):
        media.extend(list(r.media) if r.media is not None else [None] * (len(c) - 1))
    table = concat_mrope_tables([r.extra.get("mrope_position_ids") for r in rows], [r.position_ids for r in rows])
    real = np.diff(cu)
    return PackedSequence.from_boundaries(
        np.concatenate([r.input_ids for r in rows]).astype(np.int64, copy=False),
        np.concatenate([r.labels for r in rows]).astype(np.int64, copy=False),
        cu, cup, [str(s) for r in rows for s in r.sample_ids],
        media=media if any(x is not None for x in media) else None,
        has_final_target=np.concatenate([np.asarray(r.extra.get("has_final_target", np.zeros(len(c) - 1, bool)),
                                                    dtype=bool) for r, (c, _) in zip(rows, bounds)]),
        tail_segment=bool(real[-1] == 0),
        extra={} if table is None else {"mrope_position_ids": table},
    )


_SAMPLE_HINT = ("expected seqpack.sample.Sample objects or mappings with 'input_ids' and 'labels' "
                "(labels shifted within the sample: labels[t] = input_ids[t+1] or -100) and an optional "
                "'sample_id'")


def _as_segments(samples: Any) -> list[Any]:
    """Samples as a list of ``Sample``-like objects; mappings are converted (see build_packed_sequence)."""
    if isinstance(samples, Mapping) or hasattr(samples, "input_ids"):
        raise TypeError(f"build_packed_sequence takes a sequence of samples, got a single "
                        f"{type(samples).__name__}; wrap it in a list: build_packed_sequence([sample], ...)")
    if not hasattr(samples, "__len__"):
        if not hasattr(samples, "__iter__"):
            raise TypeError(f"build_packed_sequence: samples must be a sequence, got {type(samples).__name__}; "
                            + _SAMPLE_HINT)
        samples = list(samples)
    if all(type(s) is Sample for s in samples):  # hot path: Sample objects, no per-item checks
        return samples
    out = []
    for i, s in enumerate(samples):
        if type(s) is Sample:
            out.append(s)
        elif isinstance(s, Mapping):
            out.append(_sample_from_mapping(s, i))
        elif all(hasattr(s, a) for a in ("input_ids", "labels", "length", "sample_id")):
            out.append(s)
        else:
            raise TypeError(f"build_packed_sequence: sample at position {i} is a {type(s).__name__}; "
                            + _SAMPLE_HINT)
    return out


def _sample_from_mapping(d: Any, i: int) -> Sample:
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
                "sample (labels[t] = input_ids[t+1]). Shift them first (seqpack.sample.shift_labels), or "
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
