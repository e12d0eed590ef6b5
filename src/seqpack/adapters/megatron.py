"""Megatron-Core view of a packed row, without importing megatron."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqpack.packed.boundaries import trim_cu_seqlens

from .batch import as_batch

__all__ = ["PackedSeqParamsLike", "to_megatron"]


@dataclass
class PackedSeqParamsLike:
    """Duck-typed stand-in for ``megatron.core.packed_seq_params.PackedSeqParams``.

    Same field names and meaning: ``cu_seqlens_q/kv`` are the logical (real-token) boundaries,
    ``cu_seqlens_q/kv_padded`` the physical ones (Transformer Engine uses the padded array to find
    each segment in memory and the logical one to know how many tokens are real), both int32
    ``[N+1]`` and global (not per context-parallel rank). ``max_seqlen_q/kv`` are python ints.
    Use ``PackedSeqParams(**dataclasses.asdict(p))`` to get the real class.
    """

    qkv_format: str
    cu_seqlens_q: Any
    cu_seqlens_kv: Any
    cu_seqlens_q_padded: Any
    cu_seqlens_kv_padded: Any
    max_seqlen_q: int
    max_seqlen_kv: int


def to_megatron(batch: Any, *, as_dataclass: bool = False) -> dict[str, Any]:
    """Megatron-Core inputs for one packed THD row (Megatron-Bridge's packed-sequence path).

    Works on a full row or on one context-parallel rank's slice: per-token fields are taken as they
    are (``[1, T]`` or ``[1, T/CP]``), while the boundary arrays and ``max_seqlen`` must be the
    **global** ones of the pre-CP row (Transformer Engine's THD CP attention needs them on every rank;
    a slice without them would attend across documents, case B02).

    Args:
        batch: dict (canonical keys, possibly CP-sliced per-token fields) or ``PackedSequence``.
        as_dataclass: return ``packed_seq_params`` as :class:`PackedSeqParamsLike` instead of a dict.

    Returns:
        ``{"tokens", "labels", "loss_mask" (float32), "position_ids", "padding_mask"}`` as ``[1, T]``
        plus ``"packed_seq_params"`` with ``qkv_format="thd"``, ``cu_seqlens_q/kv``,
        ``cu_seqlens_q/kv_padded`` (int32 [N+1]) and ``max_seqlen_q/kv`` (int).

    Raises:
        KeyError: when the boundary metadata is missing (message names the fix).
    """
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
        max_seqlen = int(batch["max_seqlen"]) if batch.get("max_seqlen") is not None else int((cup[1:] - cup[:-1]).max())

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
    params = PackedSeqParamsLike(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cup,
        cu_seqlens_kv_padded=cup,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )
    out["packed_seq_params"] = params if as_dataclass else dict(params.__dict__)
    return out
