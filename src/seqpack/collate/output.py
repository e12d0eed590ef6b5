"""What every collator shares: feature -> ``Sample``, packed row -> batch dict, and the output formats.

Output formats (``format=``; details in ``docs/notes/collate.md``): ``"thd"`` the canonical batch dict
(:mod:`seqpack.adapters.batch`) plus ``sample_ids``, media and ``mrope_position_ids``; ``"hf"`` the
keyword arguments of a transformers causal LM (:func:`seqpack.adapters.to_hf_inputs`, for the model whose
``config=`` the collator got: its attention implementation and pattern); ``"megatron"``
:func:`seqpack.adapters.to_megatron` of the row.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from seqpack._torch import torch_hint

with torch_hint("seqpack.collate (the collators and PackedRowsDataset)"):
    import torch

from seqpack.adapters import MEDIA_KEYS, as_batch, to_hf_inputs, to_megatron
from seqpack.adapters.attention_pattern import attention_pattern
from seqpack.adapters.hf_forward import resolve_attn_implementation
from seqpack.data.media import collate_media
from seqpack.packed import PackedSequence
from seqpack.packed.masks import ATTN_IMPLEMENTATIONS
from seqpack.sample import Sample, shift_labels, shift_unshifted_labels

__all__ = ["FORMATS", "HF_ATTN", "LABEL_CONVENTIONS", "check_format", "check_label_convention", "feature_value",
           "as_int64", "feature_sample", "row_batch", "format_batch"]

FORMATS = ("thd", "hf", "megatron")
#: ``attn_implementation`` values ``format="hf"`` accepts (transformers' names).
HF_ATTN = ATTN_IMPLEMENTATIONS
#: Conventions of incoming ``labels``: ``"shifted"`` (``Sample``) or ``"hf"`` (unshifted, HF collators).
LABEL_CONVENTIONS = ("shifted", "hf")


def feature_value(obj: Any, key: str, default=None):
    """``obj[key]`` of a mapping feature, ``obj.key`` of an object feature."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def as_int64(x) -> np.ndarray:
    """A feature field (list, numpy array or tensor) as a flat int64 numpy array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.int64).reshape(-1)


def check_format(fmt: str, attn_implementation: str | None, config: Any = None) -> None:
    """Check a collator's output settings before any batch is built.

    Raises:
        ValueError: an unknown ``format``; ``format="hf"`` without ``config=model.config`` (the masks follow
            the model's attention pattern: sliding windows, chunks), with an implementation other than the
            config's, or for a model whose attention pattern seqpack cannot mask
            (:func:`seqpack.adapters.attention_pattern.attention_pattern`).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "hf":
        resolve_attn_implementation(config, attn_implementation, what="format='hf'")
        attention_pattern(config)


def check_label_convention(label_convention: str) -> None:
    """Raises ValueError unless ``label_convention`` is one of :data:`LABEL_CONVENTIONS`."""
    if label_convention not in LABEL_CONVENTIONS:
        raise ValueError(f"label_convention must be 'shifted' or 'hf', got {label_convention!r}")


def feature_sample(feature: Any, label_convention: str, index: int) -> Sample:
    """One unpacked feature as a :class:`Sample` with shifted labels.

    Args:
        feature: a ``Sample`` or a mapping with ``input_ids`` and optionally ``labels`` (missing: train
            on every next token), ``sample_id`` (default: ``str(index)``) and ``media``.
        label_convention: ``"shifted"`` or ``"hf"`` (unshifted labels, shifted here).
        index: position in the micro-batch (default id, error messages).

    Raises:
        KeyError: no ``input_ids``. ValueError: an empty feature; labels of another length.
    """
    if type(feature) is Sample and label_convention == "shifted":
        return feature
    ids = feature_value(feature, "input_ids")
    lab = feature_value(feature, "labels")
    sid = feature_value(feature, "sample_id", None)
    sid = str(sid) if sid is not None else str(index)
    if ids is None:
        raise KeyError(f"feature {index} (sample {sid!r}) has no 'input_ids'")
    ids = as_int64(ids)
    if ids.size == 0:
        raise ValueError(f"feature {index} (sample {sid!r}) is empty; empty segments never reach a kernel")
    if lab is None:
        lab = shift_labels(ids, np.ones(ids.shape, dtype=bool))
    else:
        lab = as_int64(lab)
        if lab.shape != ids.shape:
            raise ValueError(f"feature {index} (sample {sid!r}): labels {lab.shape} vs input_ids {ids.shape}")
        if label_convention == "hf":
            lab = shift_unshifted_labels(lab)
    return Sample(ids, lab, sample_id=sid, media=feature_value(feature, "media", None))


def row_batch(row: PackedSequence) -> dict[str, Any]:
    """The ``"thd"`` batch of one row: :func:`seqpack.adapters.as_batch` plus ``sample_ids``, the M-RoPE
    table ``mrope_position_ids`` int64 ``[3, T]`` (image rows) and the segments' media concatenated in
    segment order (``pixel_values``, ``image_grid_thw``)."""
    batch = as_batch(row)
    batch["seq_lens"] = torch.from_numpy(np.ascontiguousarray(row.seq_lens, dtype=np.int32))
    batch["sample_ids"] = list(row.sample_ids)
    table = row.extra.get("mrope_position_ids")
    if table is not None:
        batch["mrope_position_ids"] = torch.from_numpy(np.ascontiguousarray(table, dtype=np.int64))
    cm = collate_media(list(row.media)) if row.media is not None and any(m for m in row.media) else None
    for k, v in (cm or {}).items():
        batch[k] = torch.from_numpy(np.ascontiguousarray(v))
    return batch


def format_batch(batch: dict[str, Any], fmt: str, attn_implementation: str | None, mask_dtype,
                 config: Any = None) -> dict[str, Any]:
    """The ``"thd"`` batch in output format ``fmt`` (module docstring); ``"hf"`` needs the model's ``config``."""
    if fmt == "thd":
        return batch
    if fmt == "megatron":
        out = to_megatron(batch)
        for k in (*MEDIA_KEYS, "mrope_position_ids"):
            if k in batch:
                out[k] = batch[k]
        return out
    return to_hf_inputs(batch, attn_implementation, config=config, mask_dtype=mask_dtype)
