"""Canonical THD batch dict shared by the collators, adapters, ``seqpack.hf`` and ``seqpack.loss``.

A *batch* here is a ``dict[str, torch.Tensor | int]`` holding ONE THD row (several packs are
flattened into it with offset boundaries, see ``seqpack.collate``):

=====================  =======  ========  ==========================================================
key                    dtype    shape     meaning (``packed-batch-spec.md``)
=====================  =======  ========  ==========================================================
``input_ids``          int64    [1, T]    tokens; padding slots hold ``pad_token_id``
``labels``             int64    [1, T]    shifted per segment, -100 = no target
``loss_mask``          bool     [1, T]    ``labels != -100``
``position_ids``       int64    [1, T]    restart at 0 per segment, count on through its padding
``padding_mask``       bool     [1, T]    True = padding (Megatron-Core polarity)
``seq_idx``            int32    [1, T]    segment index of every slot (padding -> its segment)
``cu_seqlens``         int32    [N+1]     logical (real-token) boundaries
``cu_seqlens_padded``  int32    [N+1]     physical boundaries, last == T
``max_seqlen``         int      scalar    ``max(diff(cu_seqlens_padded))``
``num_segments``       int      scalar    N
=====================  =======  ========  ==========================================================

:func:`as_batch` turns a :class:`seqpack.packed.PackedSequence` (numpy) or a dict into this form.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from seqpack._torch import torch_hint
from seqpack.packed.boundaries import segment_fields, trim_cu_seqlens
from seqpack.sample import IGNORE_INDEX, TOKEN_DTYPES, TOKEN_FIELDS

__all__ = ["as_batch"]


def as_batch(packed: Any) -> dict[str, Any]:
    """Return the canonical THD batch dict (module docstring) for ``packed``.

    Args:
        packed: a ``PackedSequence`` (numpy fields, one row ``[T]``), or a mapping with at least
            ``input_ids`` ``[T]`` or ``[1, T]`` and ``cu_seqlens`` / ``cu_seqlens_padded``.
            Missing derived fields (``padding_mask``, ``seq_idx``, ``loss_mask``, ``max_seqlen``,
            ``num_segments``) are rebuilt from the two boundary arrays, never from token values.

    Returns:
        dict of torch tensors as in the module table (a new dict; tensors may share memory).

    Raises:
        KeyError: when the boundary arrays are missing (lengths are never inferred from tokens).
        ValueError: when a per-token field is not one row (``[T]`` or ``[1, T]``).
    """
    with torch_hint("seqpack.adapters.batch.as_batch()"):
        import torch

    if isinstance(packed, Mapping):
        src = dict(packed)
    else:
        src = {k: getattr(packed, k) for k in (*TOKEN_FIELDS, "cu_seqlens", "cu_seqlens_padded", "max_seqlen")
               if hasattr(packed, k)}
        n = getattr(packed, "num_segments", 0)
        if n:
            src["num_segments"] = n
    for key in ("cu_seqlens", "cu_seqlens_padded"):
        if key not in src or src[key] is None:
            raise KeyError(
                f"packed batch has no {key!r}: boundaries must travel with the tokens (they are never "
                "inferred from position_ids or pad ids); build it with seqpack.collate or seqpack.packed"
            )
    out: dict[str, Any] = {}
    # static-shape boundary arrays (-1 sentinels or repeated last value, B19): trim with the carried
    # segment count when there is one; the padded array decides N otherwise (the logical one may
    # legitimately repeat its last value for an empty in-batch tail segment)
    n_meta = src.get("num_segments") or None
    cup = trim_cu_seqlens(torch.as_tensor(np.asarray(src["cu_seqlens_padded"]) if not isinstance(
        src["cu_seqlens_padded"], torch.Tensor) else src["cu_seqlens_padded"]).reshape(-1), n_meta)
    n = int(cup.numel() - 1)
    cu = trim_cu_seqlens(torch.as_tensor(np.asarray(src["cu_seqlens"]) if not isinstance(
        src["cu_seqlens"], torch.Tensor) else src["cu_seqlens"]).reshape(-1), n)
    out["cu_seqlens"], out["cu_seqlens_padded"] = cu.to(torch.int32), cup.to(torch.int32)
    cu, cup = out["cu_seqlens"], out["cu_seqlens_padded"]
    T = int(cup[-1])
    for key in TOKEN_FIELDS:
        if key not in src or src[key] is None:
            continue
        v = src[key]
        v = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
        if v.dim() == 1:
            v = v.unsqueeze(0)
        if v.dim() != 2 or v.shape[0] != 1:
            raise ValueError(f"{key} must be one THD row [T] or [1, T], got shape {tuple(v.shape)}")
        out[key] = v.to(getattr(torch, TOKEN_DTYPES[key]))
    if "input_ids" in out and out["input_ids"].shape[1] != T:
        raise ValueError(f"input_ids has {out['input_ids'].shape[1]} slots but cu_seqlens_padded[-1] = {T}")
    if "seq_idx" not in out or "padding_mask" not in out:
        cup_np = cup.cpu().numpy()
        pos, pad, seq = segment_fields(cup_np, np.diff(cu.cpu().numpy().astype(np.int64)))
        out.setdefault("seq_idx", torch.from_numpy(seq).unsqueeze(0))
        out.setdefault("padding_mask", torch.from_numpy(pad).unsqueeze(0))
        out.setdefault("position_ids", torch.from_numpy(pos).unsqueeze(0))
    if "labels" in out and "loss_mask" not in out:
        out["loss_mask"] = out["labels"] != IGNORE_INDEX
    out["max_seqlen"] = int(src["max_seqlen"]) if src.get("max_seqlen") is not None else int(
        (cup[1:] - cup[:-1]).max()
    )
    out["num_segments"] = n
    return out
