"""Megatron-Bridge packed rows (``GPTSFTPackedParquetDataset``): one seqpack pack <-> one Bridge row.

Bridge stores each segment's token ids unshifted with one extra id (runtime length = stored length - 1,
case B12) and a ``loss_mask`` rolled by one; the layout and the mapping to seqpack's row are in
``docs/notes/megatron_bridge.md``. Files (shards + ``packing_metadata.json``):
:mod:`seqpack.interop.megatron_bridge_files`.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from seqpack.packed import PackedSequence, real_boundaries, segment_fields
from seqpack.padding import round_up
from seqpack.sample import IGNORE_INDEX

__all__ = [
    "BRIDGE_COLUMNS",
    "BRIDGE_METADATA_FILE",
    "BRIDGE_EXTRA_COLUMNS",
    "to_bridge_row",
    "bridge_real_length",
    "from_bridge_row",
    "bridge_pack_metadata",
]

#: Columns Megatron-Bridge requires (``REQUIRED_COLUMNS`` of its packed Parquet reader).
BRIDGE_COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
#: Default file name of the Bridge packing-metadata list written next to the shards.
BRIDGE_METADATA_FILE = "packing_metadata.json"
#: Columns seqpack adds so the import is exact (Bridge ignores them).
BRIDGE_EXTRA_COLUMNS = ("seq_lens", "total_length", "sample_ids", "pad_token_id")


def to_bridge_row(
    pack: Any,
    *,
    pad_token_id: int,
    pad_to_multiple_of: int | None = None,
    eos_token_id: int | None = None,
    trailing_eos: str = "refuse",
) -> dict[str, Any]:
    """Convert one seqpack pack into one Megatron-Bridge packed row (see the module docstring).

    Args:
        pack: a :class:`~seqpack.packed.PackedSequence` (or duck-typed: ``input_ids``, ``labels``,
            ``cu_seqlens``, ``cu_seqlens_padded``, ``sample_ids``).
        pad_token_id: seqpack's pad id, stored in the ``pad_token_id`` column (the importer writes it back
            into padding slots); also the padding id when ``eos_token_id`` is None.
        pad_to_multiple_of: the effective per-segment multiple the pack was built with
            (``metadata.effective_pad_multiple``, = Bridge's ``pad_seq_to_mult``); sets how much of the last
            segment's physical length is alignment padding (kept) rather than row tail (dropped). Default:
            the pack's own ``extra["pad_to_multiple_of"]`` (set by ``build_packed_sequence``), else 1.
        eos_token_id: the id of Bridge's ``tokenizer.eos_id``. Given, padding is written as EOS and the row
            is checked against Bridge's collate (:func:`bridge_real_length`): it must recover every
            segment's real length and trained labels exactly, else ``ValueError``. ``None``: layout only
            (seqpack's own round trip; :func:`~seqpack.interop.export_megatron_bridge` always passes it).
        trailing_eos: a segment whose last real input tokens are EOS with no target (e.g. Llama 3's
            ``<|eot_id|>`` at the end of a chat), when ``pad_to_multiple_of > 1``: Bridge counts real
            tokens up to the last non-EOS one. ``"refuse"`` raises; ``"as_final_target"`` declares the
            segment that much shorter in ``seq_lens`` (stored ids unchanged: the EOS is then the final
            target of the token before it; same trained labels, and no trained position attends it).

    Returns:
        dict with ``input_ids`` int32 [sum(P_i + 1)], ``loss_mask`` uint8 [same], ``seq_start_id`` int32
        [N], ``seq_lens`` int32 [N] (real runtime lengths), ``total_length`` int (T), ``sample_ids``
        list[str], ``pad_token_id`` int, and ``runtime_lens`` int64 [N] (stored length - 1 of every segment; not a column).

    Raises:
        ValueError: a label inside a segment is neither -100 nor the next token (not representable:
            Bridge derives every label from the next stored id), naming the sample and slot; with
            ``eos_token_id``, a segment Bridge's collate would read differently (:func:`bridge_real_length`).
    """
    if trailing_eos not in ("refuse", "as_final_target"):
        raise ValueError(f"trailing_eos must be 'refuse' or 'as_final_target', got {trailing_eos!r}")
    if pad_to_multiple_of is None:
        pad_to_multiple_of = int((getattr(pack, "extra", None) or {}).get("pad_to_multiple_of") or 1)
    ids = np.asarray(pack.input_ids, dtype=np.int64)
    lab = np.asarray(pack.labels, dtype=np.int64)
    cu, cup, n = real_boundaries(pack)
    sample_ids = [str(s) for s in (getattr(pack, "sample_ids", None) or [f"segment-{i}" for i in range(n)])]
    T = int(cup[-1]) if n else 0
    real = np.diff(cu)
    phys = np.diff(cup)
    runtime = phys.copy()
    if n:
        runtime[-1] = min(int(phys[-1]), int(round_up(int(real[-1]), int(pad_to_multiple_of))))
    stored_total = int(runtime.sum()) + n
    fill = int(pad_token_id if eos_token_id is None else eos_token_id)
    out_ids = np.full(stored_total, fill, dtype=np.int64)
    declared = real.copy()
    out_mask = np.zeros(stored_total, dtype=np.uint8)
    starts = np.zeros(n, dtype=np.int64)
    pos = 0
    for i in range(n):
        b, L = int(cup[i]), int(real[i])
        seg_ids = ids[b : b + L]
        seg_lab = lab[b : b + L]
        # every trained label except the last real slot's must be the next token (invariant 7)
        if L > 1:
            inner = seg_lab[:-1]
            bad = np.nonzero((inner != IGNORE_INDEX) & (inner != seg_ids[1:]))[0]
            if bad.size:
                t = int(bad[0])
                raise ValueError(
                    f"sample {sample_ids[i]!r}: label {int(inner[t])} at segment slot {t} is not the next token "
                    f"{int(seg_ids[t + 1])}; Megatron-Bridge derives labels from the next stored id, so this "
                    "pack cannot be exported (the pack violates packed-batch-spec invariant 7; validate() it)."
                )
        if eos_token_id is not None:
            declared[i] = bridge_real_length(
                seg_ids, seg_lab, int(runtime[i]), int(eos_token_id), int(pad_to_multiple_of), sample_ids[i], trailing_eos
            )
        starts[i] = pos
        out_ids[pos : pos + L] = seg_ids
        out_mask[pos : pos + L] = seg_lab != IGNORE_INDEX
        if L and seg_lab[-1] != IGNORE_INDEX:
            out_ids[pos + L] = seg_lab[-1]  # explicit final target (case B12)
        pos += int(runtime[i]) + 1
    if np.any(out_ids < 0) or (out_ids.size and out_ids.max() > np.iinfo(np.int32).max):
        raise ValueError(f"pack {sample_ids[:3]}...: token ids must be in [0, 2**31) to store as int32")
    return {
        "input_ids": out_ids.astype(np.int32),
        "loss_mask": out_mask,
        "seq_start_id": starts.astype(np.int32),
        "seq_lens": declared.astype(np.int32),
        "total_length": T,
        "sample_ids": sample_ids,
        "pad_token_id": int(pad_token_id),
        "runtime_lens": runtime.astype(np.int64),
    }


def bridge_real_length(ids, labels, runtime_len: int, eos_token_id: int, pad_seq_to_mult: int, sample_id: str,
                       trailing_eos: str = "refuse") -> int:
    """The real length Megatron-Bridge's packed collate (``GPTSFTPackedDataset.collate_fn``) will see for one
    segment stored by :func:`to_bridge_row` with EOS padding, checked to train exactly as seqpack's.

    Bridge's rules (0.6): a position whose input token is EOS never has loss (``loss_mask[tokens == eos_id]
    = 0``); with ``pad_seq_to_mult > 1`` a segment's logical length ends at its last non-EOS runtime
    token; with ``pad_seq_to_mult == 1`` it is the runtime length (exact for any tokens).

    Args:
        ids, labels: the segment's real tokens and shifted labels (int [L]).
        runtime_len: its runtime length (stored - 1, padding included).
        eos_token_id: Bridge's ``tokenizer.eos_id``; pad_seq_to_mult: Bridge's setting (= the pack multiple).
        sample_id: named in errors. trailing_eos: as :func:`to_bridge_row`.

    Returns:
        the real length to declare (``L``, or shorter with ``trailing_eos="as_final_target"``).

    Raises:
        ValueError: Bridge would drop a trained label (its input is EOS), count the final target of a
            padded segment as a real token (it is not EOS), or stop short at a trailing EOS input; the
            message names the sample, the slot and what to do instead.
    """
    ids = np.asarray(ids, dtype=np.int64)
    lab = np.asarray(labels, dtype=np.int64)
    L, eos = int(ids.shape[0]), int(eos_token_id)
    bad = np.flatnonzero((ids == eos) & (lab != IGNORE_INDEX))
    if bad.size:
        raise ValueError(
            f"sample {sample_id!r}: slot {int(bad[0])} has input EOS ({eos}) and a trained label; Megatron-Bridge's "
            "packed collate zeroes the loss wherever the input token is EOS, so this label would silently not "
            "train. Train on other tokens (train_on) or export for a trainer without this rule."
        )
    if pad_seq_to_mult <= 1:
        return L
    if runtime_len > L and lab[-1] != IGNORE_INDEX and lab[-1] != eos:
        raise ValueError(
            f"sample {sample_id!r}: its final target {int(lab[-1])} is stored as the runtime token after its last real "
            f"token; it is not EOS ({eos}), so Megatron-Bridge (pad_seq_to_mult={pad_seq_to_mult}) counts it as real. "
            "Pack with pad_to_multiple_of=1 and set Bridge's pad_seq_to_mult=1 (lengths then come from seq_start_id)."
        )
    keep = L
    while keep > 0 and ids[keep - 1] == eos:
        keep -= 1
    if keep == L:
        return L
    if trailing_eos == "as_final_target" and keep > 0:
        return keep  # the EOS inputs have no target (checked above): the same trained labels
    raise ValueError(
        f"sample {sample_id!r} ends with {L - keep} EOS input token(s) ({eos}); Megatron-Bridge "
        f"(pad_seq_to_mult={pad_seq_to_mult}) counts real tokens up to the last non-EOS one, so it would see "
        f"{keep} of {L}. Pass trailing_eos='as_final_target' (declares {keep}; same trained labels), or pack with "
        "pad_to_multiple_of=1 and set Bridge's pad_seq_to_mult=1 (exact for any tokens)."
    )


def from_bridge_row(
    input_ids: Any,
    loss_mask: Any,
    seq_start_id: Any,
    *,
    seq_lens: Any = None,
    total_length: int | None = None,
    sample_ids: list[str] | None = None,
    pad_token_id: int = 0,
    where: str = "row",
):
    """Convert one Megatron-Bridge packed row back into a seqpack pack.

    Every stored segment ``[b, e)`` becomes a runtime segment of physical length ``e - b - 1`` with
    ``input_ids = ids[b:e-1]`` and ``labels[t] = ids[b+t+1] if loss_mask[b+t] else -100``.

    Args:
        input_ids, loss_mask: int [S] stored ids and rolled loss mask.
        seq_start_id: int [N] segment starts (first must be 0, strictly increasing).
        seq_lens: optional int [N] real runtime lengths (the ``seq_lens`` column written by
            :func:`to_bridge_row`). Without it the whole runtime segment counts as real: Bridge's layout
            does not record alignment padding, and lengths are never inferred from token values.
        total_length: optional row width ``T``; when larger than the runtime total, the last segment
            absorbs the difference as tail padding (``pad_token_id``, label -100).
        pad_token_id: token id for tail padding, and (when ``seq_lens`` is given) for every padding
            slot of a segment (the first may hold the previous slot's final target, see module doc).
        sample_ids: optional ids (default ``"{where}#seg{i}"``).
        pad_token_id: token id for tail padding.
        where: name of the row for error messages (file and row index).

    Returns:
        :class:`~seqpack.packed.PackedSequence` (built by ``PackedSequence.from_boundaries``).

    Raises:
        ValueError: malformed row (lengths differ, bad ``seq_start_id``, a stored segment shorter than 2,
            ``seq_lens`` out of range, ``total_length`` smaller than the runtime total), naming ``where``.
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    lm = np.asarray(loss_mask).astype(bool)
    st = np.asarray(seq_start_id, dtype=np.int64)
    S = ids.shape[0]
    if lm.shape[0] != S:
        raise ValueError(f"{where}: loss_mask has {lm.shape[0]} entries but input_ids has {S}")
    if st.size == 0 or st[0] != 0:
        raise ValueError(f"{where}: seq_start_id must start with 0, got {st[:5].tolist()}")
    bounds = np.append(st, S)
    stored = np.diff(bounds)
    if np.any(stored < 2):
        i = int(np.nonzero(stored < 2)[0][0])
        raise ValueError(
            f"{where}: segment {i} has stored length {int(stored[i])}; every stored segment needs >= 2 ids "
            "(runtime length = stored - 1 >= 1) and seq_start_id must be strictly increasing"
        )
    runtime = stored - 1
    n = runtime.shape[0]
    if seq_lens is None:
        real = runtime.copy()
    else:
        real = np.asarray(seq_lens, dtype=np.int64)
        if real.shape != runtime.shape or np.any(real < 1) or np.any(real > runtime):
            raise ValueError(
                f"{where}: seq_lens {real.tolist()[:8]} do not fit the runtime segment lengths "
                f"{runtime.tolist()[:8]} (need 1 <= seq_lens[i] <= stored length - 1)"
            )
    # gather runtime tokens and labels: all slots except each segment's last stored slot
    keep = np.ones(S, dtype=bool)
    keep[bounds[1:] - 1] = False
    tok = ids[keep]
    nxt = np.empty(S, dtype=np.int64)
    nxt[:-1] = ids[1:]
    nxt[-1] = IGNORE_INDEX
    lab = np.where(lm, nxt, IGNORE_INDEX)[keep]
    cup = np.concatenate([[0], np.cumsum(runtime)])
    cu = np.concatenate([[0], np.cumsum(real)])
    # slots past a segment's real length are padding: never labelled
    is_pad = segment_fields(cup, real)[1]
    lab[is_pad] = IGNORE_INDEX
    if seq_lens is not None:
        tok[is_pad] = int(pad_token_id)
    T_rt = int(cup[-1])
    if total_length is not None and int(total_length) != T_rt:
        if int(total_length) < T_rt:
            raise ValueError(f"{where}: total_length {total_length} < runtime total {T_rt}")
        extra = int(total_length) - T_rt
        tok = np.concatenate([tok, np.full(extra, int(pad_token_id), dtype=np.int64)])
        lab = np.concatenate([lab, np.full(extra, IGNORE_INDEX, dtype=np.int64)])
        cup[-1] = int(total_length)
    if sample_ids is None:
        sample_ids = [f"{where}#seg{i}" for i in range(n)]
    return PackedSequence.from_boundaries(
        tok, lab, cu.astype(np.int32), cup.astype(np.int32), sample_ids=list(sample_ids)
    )


def bridge_pack_metadata(runtime_lens_per_pack: Iterable[np.ndarray], pack_size: int) -> dict[str, Any]:
    """Megatron-Bridge's packing-metadata dict for one packed dataset.

    Same definitions as Bridge's ``create_packing_strategy``: ``dataset_max_seqlen`` = longest runtime
    segment, ``max_samples_per_bin`` = most segments in a pack, ``min_packed_seqlen`` = smallest sum of
    runtime lengths in a pack, ``packing_factor`` = segments / packs (2 decimals),
    ``packing_efficiency`` = 100 * sum(runtime lengths) / (packs * pack_size) (percent, 2 decimals).

    Args:
        runtime_lens_per_pack: one int array per pack (runtime segment lengths, padding included).
        pack_size: the runtime pack size (seqpack ``seq_length``).

    Raises:
        ValueError: no packs.
    """
    max_seg = 0
    max_n = 0
    min_total = None
    n_seg = 0
    total = 0
    n_packs = 0
    for r in runtime_lens_per_pack:
        r = np.asarray(r, dtype=np.int64)
        n_packs += 1
        n_seg += r.size
        s = int(r.sum())
        total += s
        max_seg = max(max_seg, int(r.max()) if r.size else 0)
        max_n = max(max_n, int(r.size))
        min_total = s if min_total is None else min(min_total, s)
    if n_packs == 0:
        raise ValueError("no packs to describe")
    return {
        "dataset_max_seqlen": max_seg,
        "max_samples_per_bin": max_n,
        "packing_factor": round(n_seg / n_packs, 2),
        "packing_efficiency": round(100.0 * total / (n_packs * int(pack_size)), 2),
        "pack_size": int(pack_size),
        "min_packed_seqlen": int(min_total),
    }
