"""Label conventions: our per-segment shifted labels <-> HF unshifted labels, and
``transformers.DataCollatorWithFlattening`` output -> the canonical row."""

from __future__ import annotations

from typing import Any, Mapping

from seqpack._torch import torch_hint
from seqpack.sample import IGNORE_INDEX, shift_unshifted_labels, unshift_labels

from .batch import as_batch

__all__ = ["hf_unshifted_labels", "shifted_from_hf_labels", "from_hf_flattening"]


def hf_unshifted_labels(labels, cu_seqlens_padded):
    """HF-style unshifted labels from our shifted labels (HF causal-LM losses shift internally).

    ``hf[t] = labels[t-1]`` inside each physical segment and ``hf[start] = -100`` at every segment's
    first slot, so after HF's internal shift the logit at ``t`` is trained on ``labels[t]`` and never
    on the next segment's first token (case B03). Torch form of :func:`seqpack.sample.unshift_labels`.

    Args:
        labels: int ``[T]`` or ``[B, T]`` shifted labels (``packed-batch-spec.md``).
        cu_seqlens_padded: int ``[N+1]`` physical boundaries over the last dim.

    Returns:
        int64 tensor of the same shape.

    Raises:
        ValueError: if a segment's last *physical* slot carries a target (an explicit final target
            with no padding slot after it, case B12): HF's unshifted form cannot hold it. Use the
            shifted labels with ``seqpack.loss`` or the ``shift_labels`` key of ``format="hf"``.
    """
    with torch_hint("seqpack.adapters.labels.hf_unshifted_labels()"):
        import torch

    return unshift_labels(torch.as_tensor(labels), cu_seqlens_padded)


def shifted_from_hf_labels(hf_labels, cu_seqlens_padded):
    """Inverse of :func:`hf_unshifted_labels`: ``labels[t] = hf[t+1]`` inside a segment, -100 at its last slot.

    Torch form of :func:`seqpack.sample.shift_unshifted_labels`.

    Args:
        hf_labels: int ``[T]`` or ``[B, T]`` unshifted labels.
        cu_seqlens_padded: int ``[N+1]`` physical boundaries over the last dim.

    Returns:
        int64 tensor of the same shape.
    """
    with torch_hint("seqpack.adapters.labels.shifted_from_hf_labels()"):
        import torch

    return shift_unshifted_labels(torch.as_tensor(hf_labels), cu_seqlens_padded)


def from_hf_flattening(batch: Mapping[str, Any], *, position_ids_start: int = 0) -> dict[str, Any]:
    """Convert ``transformers.DataCollatorWithFlattening`` output to the canonical THD batch dict.

    Boundaries come from, in order: ``cu_seq_lens_q`` (``return_flash_attn_kwargs=True``), ``seq_idx``
    (``return_seq_idx=True``), else the restarts of ``position_ids`` (== ``position_ids_start``).
    That collator adds no padding, so ``cu_seqlens == cu_seqlens_padded``.

    Args:
        batch: dict with ``input_ids`` ``[1, T]``, optional ``labels`` ``[1, T]`` (unshifted, separator
            -100 at each sequence start) and the boundary source above.
        position_ids_start: the collator's ``position_ids_start``.

    Returns:
        canonical batch dict (``seqpack.adapters.batch``) with our per-segment shifted ``labels``.

    Raises:
        KeyError: when no boundary source is present.
        ValueError: when the input is not one row.
    """
    with torch_hint("seqpack.adapters.labels.from_hf_flattening()"):
        import torch

    ids = torch.as_tensor(batch["input_ids"])
    if ids.dim() == 2 and ids.shape[0] != 1 or ids.dim() > 2:
        raise ValueError(f"DataCollatorWithFlattening output is one row [1, T]; got input_ids {tuple(ids.shape)}")
    ids = ids.reshape(-1).to(torch.int64)
    T = ids.shape[0]
    if batch.get("cu_seq_lens_q") is not None:
        cu = torch.as_tensor(batch["cu_seq_lens_q"]).reshape(-1).to(torch.int32)
    elif batch.get("seq_idx") is not None:
        s = torch.as_tensor(batch["seq_idx"]).reshape(-1)
        starts = torch.nonzero(torch.diff(s, prepend=s[:1] - 1) != 0).reshape(-1)
        cu = torch.cat([starts, torch.tensor([T])]).to(torch.int32)
    elif batch.get("position_ids") is not None:
        p = torch.as_tensor(batch["position_ids"]).reshape(-1)
        starts = torch.nonzero(p == position_ids_start).reshape(-1)
        if starts.numel() == 0 or int(starts[0]) != 0:
            raise ValueError("position_ids do not start a sequence at slot 0; pass position_ids_start")
        cu = torch.cat([starts, torch.tensor([T])]).to(torch.int32)
    else:
        raise KeyError(
            "DataCollatorWithFlattening output has no boundaries: build it with return_flash_attn_kwargs=True, "
            "return_seq_idx=True or return_position_ids=True"
        )
    out: dict[str, Any] = {"input_ids": ids, "cu_seqlens": cu, "cu_seqlens_padded": cu.clone()}
    if batch.get("labels") is not None:
        out["labels"] = shifted_from_hf_labels(torch.as_tensor(batch["labels"]).reshape(-1), cu)
    else:
        out["labels"] = torch.full((T,), IGNORE_INDEX, dtype=torch.int64)
    return as_batch(out)
