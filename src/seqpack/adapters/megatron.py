"""Megatron-Core view of a packed row: ``[1, T]`` tensors and ``PackedSeqParams``.

``megatron.core`` is imported only when ``to_megatron(..., as_dataclass=True)`` asks for the dataclass
and megatron-core is installed; the dict form never imports it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

from seqpack._torch import torch_hint
from seqpack.packed.boundaries import segment_fields, trim_cu_seqlens

from .batch import as_batch

__all__ = ["PackedSeqParamsLike", "megatron_packed_seq_params_class", "packed_seq_params", "to_megatron"]


@dataclass
class PackedSeqParamsLike:
    """Stand-in for ``megatron.core.packed_seq_params.PackedSeqParams`` when megatron-core is absent.

    Same fields, order and defaults as megatron-core 0.19's class. seqpack fills: ``qkv_format="thd"``;
    ``cu_seqlens_q/kv`` the logical (real-token) boundaries and ``cu_seqlens_q/kv_padded`` the physical
    ones (Transformer Engine finds each segment in memory by the padded array and counts its real
    tokens by the logical one), both int32 ``[N+1]`` and global (not per context-parallel rank);
    ``max_seqlen_q/kv`` (python int, longest physical segment); ``total_tokens`` (python int, the row
    width ``T`` = ``cu_seqlens_padded[-1]``); ``seq_idx`` (int32 ``[1, T]``, segment index of every slot,
    padding counted with its segment: what Mamba layers scan by); ``pad_between_seqs`` (True when any
    segment has alignment padding). ``local_cp_size``, ``cp_group`` and ``tokens_per_sample`` keep their
    defaults (Megatron sets the CP group itself; a seqpack row is one sample of ``T`` tokens).
    """

    qkv_format: str = None
    cu_seqlens_q: Any = None
    cu_seqlens_kv: Any = None
    cu_seqlens_q_padded: Any = None
    cu_seqlens_kv_padded: Any = None
    max_seqlen_q: int = None
    max_seqlen_kv: int = None
    local_cp_size: int = None
    cp_group: Any = None
    total_tokens: int = None
    seq_idx: Any = None
    tokens_per_sample: int = None
    pad_between_seqs: bool = None


def megatron_packed_seq_params_class() -> type:
    """The ``PackedSeqParams`` class to build: megatron-core's own when it is installed, else
    :class:`PackedSeqParamsLike`.

    Raises:
        ImportError: megatron-core is installed but fails to import (never hidden behind the stand-in).
    """
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return PackedSeqParamsLike
    from megatron.core.packed_seq_params import PackedSeqParams  # deferred: megatron-core (imports torch)

    return PackedSeqParams


def packed_seq_params(cu_seqlens, cu_seqlens_padded, max_seqlen: int | None = None, *, as_dataclass: bool = False):
    """Megatron-Core ``PackedSeqParams`` fields of one THD row (the one place they are computed).

    Args:
        cu_seqlens: int ``[N+1]`` logical boundaries (numpy or torch; static padding already trimmed).
        cu_seqlens_padded: int ``[N+1]`` physical boundaries, ``[-1]`` = row width ``T``.
        max_seqlen: longest physical segment; derived from ``cu_seqlens_padded`` when ``None``.
        as_dataclass: build the class of :func:`megatron_packed_seq_params_class` (only the fields that
            class has; megatron-core 0.16 has no ``total_tokens`` / ``seq_idx`` / ``pad_between_seqs``)
            instead of returning the dict.

    Returns:
        dict (or dataclass) with the fields listed in :class:`PackedSeqParamsLike`: boundary arrays int32
        torch ``[N+1]``, ``seq_idx`` int32 ``[1, T]``, ints for ``max_seqlen_q/kv`` and ``total_tokens``.
    """
    with torch_hint("seqpack.adapters.megatron.packed_seq_params()"):
        import torch

    cu = torch.as_tensor(cu_seqlens).reshape(-1).to(torch.int32)
    cup = torch.as_tensor(cu_seqlens_padded).reshape(-1).to(torch.int32)
    if max_seqlen is None:
        max_seqlen = int((cup[1:] - cup[:-1]).max()) if cup.numel() > 1 else 0
    real = (cu[1:] - cu[:-1]).numpy()
    seq_idx = torch.from_numpy(segment_fields(cup.numpy(), real)[2]).to(torch.int32).unsqueeze(0)
    fields = {
        "qkv_format": "thd",
        "cu_seqlens_q": cu,
        "cu_seqlens_kv": cu,
        "cu_seqlens_q_padded": cup,
        "cu_seqlens_kv_padded": cup,
        "max_seqlen_q": int(max_seqlen),
        "max_seqlen_kv": int(max_seqlen),
        "total_tokens": int(cup[-1]) if cup.numel() else 0,
        "seq_idx": seq_idx,
        "pad_between_seqs": bool(torch.any(cu != cup)),
    }
    if not as_dataclass:
        return fields
    cls = megatron_packed_seq_params_class()
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


def to_megatron(batch: Any, *, as_dataclass: bool = False) -> dict[str, Any]:
    """Megatron-Core inputs for one packed THD row (Megatron-Bridge's packed-sequence path).

    Works on a full row or on one context-parallel rank's slice: per-token fields are taken as they
    are (``[1, T]`` or ``[1, T/CP]``), while the boundary arrays, ``max_seqlen``, ``total_tokens`` and
    ``seq_idx`` are the **global** ones of the pre-CP row (Transformer Engine's THD CP attention needs
    the boundaries on every rank, and Megatron's Mamba CP scans the all-to-all'ed full sequence; a slice
    without them would attend across documents, case B02).

    Args:
        batch: dict (canonical keys, possibly CP-sliced per-token fields) or ``PackedSequence``.
        as_dataclass: ``packed_seq_params`` as megatron-core's own ``PackedSeqParams`` when
            megatron-core is installed (every field of the installed version seqpack knows; see
            :func:`packed_seq_params`), else as :class:`PackedSeqParamsLike`.

    Returns:
        ``{"tokens", "labels", "loss_mask" (float32), "position_ids", "padding_mask"}`` as ``[1, T]``
        plus ``"packed_seq_params"`` (dict or dataclass, fields of :class:`PackedSeqParamsLike`).

    Raises:
        KeyError: when the boundary metadata is missing (message names the fix).
    """
    with torch_hint("seqpack.adapters.megatron.to_megatron()"):
        import torch

    if isinstance(batch, dict):
        missing = [k for k in ("cu_seqlens", "cu_seqlens_padded") if batch.get(k) is None]
        if missing:
            raise KeyError(
                f"to_megatron: batch lacks {missing}; every (context-parallel) slice must carry the global "
                "boundary arrays or attention crosses documents (B02). Slice per-token fields only, keep "
                "cu_seqlens/cu_seqlens_padded/max_seqlen from the full row."
            )
        cup = trim_cu_seqlens(torch.as_tensor(batch["cu_seqlens_padded"]).reshape(-1), batch.get("num_segments") or None)
        cu = trim_cu_seqlens(torch.as_tensor(batch["cu_seqlens"]).reshape(-1), cup.numel() - 1)
        max_seqlen = int(batch["max_seqlen"]) if batch.get("max_seqlen") is not None else None

        def tok(k):
            v = torch.as_tensor(batch[k])
            return v.unsqueeze(0) if v.dim() == 1 else v

        out = {
            "tokens": tok("input_ids").to(torch.int64),
            "labels": tok("labels").to(torch.int64),
            "position_ids": tok("position_ids").to(torch.int64),
            "padding_mask": tok("padding_mask").to(torch.bool),
        }
        out["loss_mask"] = (tok("loss_mask") if "loss_mask" in batch else out["labels"] != -100).to(torch.float32)
    else:
        b = as_batch(batch)
        cu, cup, max_seqlen = b["cu_seqlens"], b["cu_seqlens_padded"], b["max_seqlen"]
        out = {
            "tokens": b["input_ids"],
            "labels": b["labels"],
            "loss_mask": b["loss_mask"].to(torch.float32),
            "position_ids": b["position_ids"],
            "padding_mask": b["padding_mask"],
        }
    out["packed_seq_params"] = packed_seq_params(cu, cup, max_seqlen, as_dataclass=as_dataclass)
    return out
