"""MTP-ready packing: roll packed rows for multi-token prediction without crossing documents.

Multi-token prediction (MTP, DeepSeek-V3 style; Megatron-Core ``mtp_num_layers``) feeds layer ``k``
the input ids and labels rolled left by ``k`` tokens. On a packed THD row a plain ``torch.roll``
over the whole row moves the first tokens of document B into the last slots of document A (the
MTP analogue of case B03), and rolling with the *logical* boundaries while the row is laid out by
the *padded* ones shifts by the wrong offsets whenever segments carry alignment padding
(Megatron-LM PRs #4494/#4495). :func:`roll_packed` rolls each segment inside its own real slots,
locating segment ``s`` at physical offset ``cu_seqlens_padded[s]`` with real length
``cu_seqlens[s+1] - cu_seqlens[s]``.

Context parallelism: roll BEFORE CP slicing. The roll needs each segment's neighbouring tokens,
which after the per-segment zigzag split (``seqpack.parallel``) may live on another rank; rolling
the full pre-CP row and then slicing every rolled field with the same index array keeps the roll
inside segments and is exactly what a CP=1 run computes.

Works on numpy arrays; torch tensors in give torch tensors out (same dtype and device; torch is
imported lazily).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqpack.sample import IGNORE_INDEX  # label value the loss ignores (re-exported)

__all__ = ["IGNORE_INDEX", "roll_batch", "roll_packed", "roll_sample"]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _np(x: Any, name: str) -> np.ndarray:
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    return arr


def _gather_plan(cu_seqlens_padded: np.ndarray, cu_seqlens: np.ndarray, T: int, shifts: int):
    """Source index per slot and the mask of real slots vacated by the roll."""
    cup = cu_seqlens_padded.astype(np.int64)
    cu = cu_seqlens.astype(np.int64)
    if cup.ndim != 1 or cu.ndim != 1 or cup.shape != cu.shape or cup.size < 2:
        raise ValueError(
            "cu_seqlens and cu_seqlens_padded must be 1-D with the same length N+1 >= 2, got shapes "
            f"{cu_seqlens.shape} and {cu_seqlens_padded.shape}"
        )
    if cu[0] != 0 or cup[0] != 0:
        raise ValueError(f"boundary arrays must start at 0, got cu_seqlens[0]={cu[0]}, cu_seqlens_padded[0]={cup[0]}")
    if cup[-1] != T:
        raise ValueError(f"cu_seqlens_padded[-1]={cup[-1]} must equal the row length T={T}")
    real = np.diff(cu)
    padded = np.diff(cup)
    bad = np.flatnonzero((real < 1) | (real > padded))
    if bad.size:
        s = int(bad[0])
        raise ValueError(
            f"segment {s}: real length {int(real[s])} must satisfy 0 < real <= padded length {int(padded[s])} "
            "(pass the logical cu_seqlens and the physical cu_seqlens_padded of the same row)"
        )
    seg = np.repeat(np.arange(padded.size), padded)  # segment of every slot
    offset = np.arange(T, dtype=np.int64) - cup[seg]  # position inside the segment
    L = real[seg]
    is_real = offset < L
    rollable = offset + shifts < L
    src = np.where(rollable, np.arange(T, dtype=np.int64) + shifts, np.arange(T, dtype=np.int64))
    vacated = is_real & ~rollable
    return src, vacated


def roll_packed(
    input_ids,
    labels,
    position_ids,
    cu_seqlens_padded,
    cu_seqlens,
    shifts: int = 1,
    *,
    pad_token_id: int = 0,
    padding_mask=None,
):
    """Roll a packed row left by ``shifts`` tokens inside every segment (MTP inputs and targets).

    For segment ``s`` with physical start ``a = cu_seqlens_padded[s]`` and real length
    ``L = cu_seqlens[s+1] - cu_seqlens[s]``, and every real slot ``t < L``:

    - ``t + shifts < L``: ``out[a+t] = x[a+t+shifts]`` for ``input_ids``, ``labels``, ``position_ids``;
    - otherwise (the last ``shifts`` real slots): ``input_ids = pad_token_id``, ``labels = -100``,
      ``position_ids = position_ids[a+t] + shifts`` (positions keep counting, as the rolled
      per-segment arange would).

    With ``padding_mask`` (bool, True = pad) the vacated slots become padding too (True), so MoE routers
    and anything else reading the mask skip them as they skip alignment padding; real rolled slots keep
    False. Alignment/tail padding slots (``t >= L``) are returned unchanged. Because ``labels`` are
    already shifted per segment (``labels[t]`` = target of the logit at ``t``, spec), the result's
    labels are the depth-``shifts`` MTP targets and the last ``shifts + 1`` real slots of each
    segment are -100. ``roll_packed(.., shifts=k)`` equals ``k`` applications of ``shifts=1``, and
    equals rolling every sample alone (:func:`roll_sample`) and packing the results.

    Under context parallelism call this on the full pre-CP row, then CP-slice every rolled field
    with the same index array (see the module docstring).

    Args:
        input_ids: int array ``[..., T]`` (numpy or torch; any leading dims, e.g. ``[1, T]``).
        labels: int array ``[..., T]``, shifted per segment, -100 = ignored.
        position_ids: int array ``[..., T]`` (per-segment positions) or None.
        cu_seqlens_padded: int ``[N+1]``, physical boundaries, ``[-1] == T``.
        cu_seqlens: int ``[N+1]``, logical (real-token) boundaries.
        shifts: tokens to roll by (MTP depth), int >= 1.
        pad_token_id: id written to the vacated input slots (Megatron's roll fills 0).
        padding_mask: bool array ``[..., T]`` (True = pad) or None.

    Returns:
        ``(input_ids, labels, position_ids)`` rolled, same types, shapes and dtypes as given
        (``position_ids`` is None when given None), and the rolled ``padding_mask`` as a fourth element
        when one was given. Inputs are not modified. :func:`roll_batch` rolls every per-token field of
        a batch dict.

    Raises:
        ValueError: ``shifts < 1``; mismatched last dims; boundary arrays that do not describe a row
            of length T (names the first bad segment).
        TypeError: non-integer arrays.
    """
    if int(shifts) != shifts or shifts < 1:
        raise ValueError(f"shifts must be an integer >= 1, got {shifts!r}")
    shifts = int(shifts)
    torch_out = _is_torch(input_ids)
    ids = _np(input_ids, "input_ids")
    lab = _np(labels, "labels")
    pos = None if position_ids is None else _np(position_ids, "position_ids")
    T = ids.shape[-1]
    pm = None
    if padding_mask is not None:
        pm = padding_mask.detach().cpu().numpy() if _is_torch(padding_mask) else np.asarray(padding_mask)
        if pm.dtype != np.bool_:
            raise TypeError(f"padding_mask must be a bool array (True = pad), got dtype {pm.dtype}")
    for name, a in (("labels", lab), ("position_ids", pos), ("padding_mask", pm)):
        if a is not None and a.shape != ids.shape:
            raise ValueError(f"{name} shape {a.shape} differs from input_ids shape {ids.shape}")
    src, vacated = _gather_plan(_np(cu_seqlens_padded, "cu_seqlens_padded"), _np(cu_seqlens, "cu_seqlens"),
                                T, shifts)

    if torch_out:
        import torch

        dev = input_ids.device
        src_t = torch.as_tensor(src, device=dev)
        vac_t = torch.as_tensor(vacated, device=dev)
        out_ids = input_ids.index_select(-1, src_t).masked_fill(vac_t, pad_token_id)
        out_lab = labels.index_select(-1, src_t).masked_fill(vac_t, IGNORE_INDEX)
        out_pos = None
        if position_ids is not None:
            out_pos = torch.where(vac_t, position_ids + shifts, position_ids.index_select(-1, src_t))
        if padding_mask is None:
            return out_ids, out_lab, out_pos
        pm_t = torch.as_tensor(padding_mask, device=dev)
        return out_ids, out_lab, out_pos, pm_t.index_select(-1, src_t).masked_fill(vac_t, True)

    out_ids = ids[..., src].copy()
    out_ids[..., vacated] = pad_token_id
    out_lab = lab[..., src].copy()
    out_lab[..., vacated] = IGNORE_INDEX
    out_pos = None
    if pos is not None:
        out_pos = np.where(vacated, pos + shifts, pos[..., src]).astype(pos.dtype, copy=False)
    if pm is None:
        return out_ids, out_lab, out_pos
    out_pm = pm[..., src].copy()
    out_pm[..., vacated] = True
    return out_ids, out_lab, out_pos, out_pm


def roll_batch(batch, shifts: int = 1, *, pad_token_id: int = 0) -> dict:
    """Roll every per-token field of a canonical THD batch (``format="thd"``, ``as_batch``) for MTP depth
    ``shifts``, all in step (:func:`roll_packed` rules):

    - ``input_ids``, ``labels``, ``position_ids``, ``padding_mask`` as :func:`roll_packed` (the vacated
      last ``shifts`` real slots of every segment: pad id, -100, continued positions, padding True);
    - ``loss_mask`` (bool or float weights) moves with the labels; vacated slots get False / 0;
    - ``seq_idx`` and the boundary arrays are unchanged (segments keep their slots).

    Other keys are passed through as they are. Returns a new dict; the input is not modified.

    Raises:
        KeyError: the batch lacks ``input_ids``, ``labels``, ``cu_seqlens`` or ``cu_seqlens_padded``.
        ValueError, TypeError: as :func:`roll_packed`.
    """
    out = dict(batch)
    res = roll_packed(batch["input_ids"], batch["labels"], batch.get("position_ids"), batch["cu_seqlens_padded"],
                      batch["cu_seqlens"], shifts, pad_token_id=pad_token_id, padding_mask=batch.get("padding_mask"))
    for name, v in zip(("input_ids", "labels", "position_ids", "padding_mask"), res):
        if v is not None:
            out[name] = v
    lm = batch.get("loss_mask")
    if lm is not None:
        T = _np(batch["input_ids"], "input_ids").shape[-1]
        src, vacated = _gather_plan(_np(batch["cu_seqlens_padded"], "cu_seqlens_padded"),
                                    _np(batch["cu_seqlens"], "cu_seqlens"), T, int(shifts))
        if _is_torch(lm):
            import torch

            src_t, vac_t = torch.as_tensor(src, device=lm.device), torch.as_tensor(vacated, device=lm.device)
            out["loss_mask"] = lm.index_select(-1, src_t).masked_fill(vac_t, 0)
        else:
            lm_np = np.asarray(lm)[..., src].copy()
            lm_np[..., vacated] = 0
            out["loss_mask"] = lm_np
    return out


def roll_sample(input_ids, labels, position_ids=None, shifts: int = 1, *, pad_token_id: int = 0):
    """Reference: roll ONE unpacked sample (1-D numpy arrays of its real tokens) left by ``shifts``.

    Same rules as :func:`roll_packed` for a single segment without padding; used to test it.

    Returns:
        ``(input_ids, labels, position_ids)`` numpy arrays (``position_ids`` defaults to ``arange(L)``).
    """
    ids = np.asarray(input_ids)
    lab = np.asarray(labels)
    L = ids.shape[0]
    pos = np.arange(L, dtype=np.int64) if position_ids is None else np.asarray(position_ids)
    k = min(int(shifts), L)
    out_ids = np.concatenate([ids[k:], np.full(k, pad_token_id, dtype=ids.dtype)])
    out_lab = np.concatenate([lab[k:], np.full(k, IGNORE_INDEX, dtype=lab.dtype)])
    out_pos = np.concatenate([pos[k:], pos[L - k:] + int(shifts)]).astype(pos.dtype)
    return out_ids, out_lab, out_pos
