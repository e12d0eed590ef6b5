"""Offline packs (``PackedSequence`` rows) -> one flattened THD row per micro-batch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from seqpack.collate.output import as_int64, check_format, feature_value, format_batch, row_batch
from seqpack.packed import PackedSequence, join_rows, trim_cu_seqlens

__all__ = ["PackedCollator"]


class PackedCollator:
    """Collate offline packs (``PackedSequence`` rows) into ONE THD row.

    With micro-batch size 1 the row is the pack itself. With ``B > 1`` packs the per-token fields
    are concatenated; ``cu_seqlens_padded`` of row ``i`` is offset by the widths of the rows before
    it (``+ sum(T_j, j < i)``) and the logical ``cu_seqlens`` by their real-token counts
    (``+ sum(cu_seqlens_j[-1], j < i)``), so every segment keeps its real length
    ``cu[s+1] - cu[s]`` at slot offset ``cup[s]`` (Transformer Engine THD-with-padding semantics)
    and the flattened row has ``sum(N_i)`` segments; static-shape padded boundary arrays (B19) are
    trimmed to each row's true ``num_segments`` first (:func:`seqpack.packed.join_rows`).

    Image rows: the rows' M-RoPE tables (``PackedSequence.extra["mrope_position_ids"]``, a mapping's
    ``mrope_position_ids``, or built from the segments' ``media["mrope_position_ids"]``) are
    concatenated into ``batch["mrope_position_ids"]`` int64 ``[3, T]`` (text rows: their 1-D
    positions on all axes); ``format="hf"`` sends it as ``position_ids`` ``[3, 1, T]``.

    Args:
        format: ``"thd"``, ``"hf"`` or ``"megatron"`` (module docstring).
        config: the model's config (``model.config``), required for ``format="hf"``: the masks follow its
            attention implementation and pattern (sliding-window and chunked layers get their own masks,
            :func:`seqpack.adapters.to_hf_inputs`).
        attn_implementation: optional with ``format="hf"``; default ``config._attn_implementation``.
        mask_dtype: dtype of the eager additive mask.

    Features: ``PackedSequence`` objects or mappings with ``input_ids``, ``labels``, ``cu_seqlens``,
    ``cu_seqlens_padded`` (optionally ``num_segments``, ``sample_ids``).

    Raises:
        KeyError: a feature lacks boundary arrays.
        ValueError: ``format="hf"`` without ``config``, or for a model seqpack cannot mask exactly (at
            construction, :func:`seqpack.collate.output.check_format`).
    """

    def __init__(self, *, format: str = "thd", config: Any = None, attn_implementation: str | None = None,
                 mask_dtype=None):
        check_format(format, attn_implementation, config)
        self.format = format
        self.config = config
        self.attn_implementation = attn_implementation
        self.mask_dtype = mask_dtype

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        if len(features) == 0:
            raise ValueError("PackedCollator got an empty batch")
        row = join_rows([_feature_row(f, i) for i, f in enumerate(features)])
        return format_batch(row_batch(row), self.format, self.attn_implementation, self.mask_dtype, self.config)


def _table(m: Any, width: int, index: int) -> np.ndarray | None:
    """A row's M-RoPE table as int64 ``[3, width]`` (``[3, 1, width]`` accepted), or None."""
    if m is None:
        return None
    shape = tuple(np.shape(m))
    if shape not in ((3, width), (3, 1, width)):
        raise ValueError(f"pack {index}: mrope_position_ids has shape {shape}, expected (3, {width})")
    return as_int64(m).reshape(3, width)


def _feature_row(f: Any, i: int) -> PackedSequence:
    """Feature ``i`` as a row: a ``PackedSequence`` as it is, a mapping rebuilt from its boundaries."""
    if isinstance(f, PackedSequence):
        m = f.extra.get("mrope_position_ids")
        return f if m is None else replace(f, extra={**f.extra, "mrope_position_ids": _table(m, f.length, i)})
    cu = feature_value(f, "cu_seqlens")
    cup = feature_value(f, "cu_seqlens_padded")
    if cu is None or cup is None:
        raise KeyError(f"pack {i} has no cu_seqlens/cu_seqlens_padded; PackedCollator needs the boundaries")
    # static-shape boundary arrays (B19): trim by the carried N, else let the padded array decide
    cup = trim_cu_seqlens(as_int64(cup), feature_value(f, "num_segments", None) or None)
    cu = trim_cu_seqlens(as_int64(cu), cup.shape[0] - 1)
    ids = as_int64(feature_value(f, "input_ids"))
    if ids.shape[0] != int(cup[-1]):
        raise ValueError(f"pack {i}: {ids.shape[0]} slots but cu_seqlens_padded[-1] = {int(cup[-1])}")
    n = cu.shape[0] - 1
    sids = feature_value(f, "sample_ids", None)
    table = _table(feature_value(f, "mrope_position_ids", None), ids.shape[0], i)
    if table is None and isinstance(feature_value(f, "extra", None), Mapping):
        table = _table(f.extra.get("mrope_position_ids"), ids.shape[0], i)
    return PackedSequence.from_boundaries(
        ids, as_int64(feature_value(f, "labels")), cu, cup,
        list(sids) if sids is not None else [f"{i}:{j}" for j in range(n)],
        media=feature_value(f, "media", None), num_segments=n,
        tail_segment=bool(n > 1 and cu[-1] == cu[-2]),
        extra=None if table is None else {"mrope_position_ids": table},
    )
