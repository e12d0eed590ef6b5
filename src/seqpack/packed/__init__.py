"""The packed row (``packed-batch-spec.md``): one THD row of ``N`` segments, numpy only.

- :mod:`~seqpack.packed.sequence` -- :class:`PackedSequence` (with a picture of a row) and
  :func:`pad_cu_seqlens` (static shapes);
- :mod:`~seqpack.packed.build` -- :func:`build_packed_sequence` (samples -> row), :func:`join_rows`;
- :mod:`~seqpack.packed.boundaries` -- :func:`trim_cu_seqlens`, :func:`segment_fields`, ...;
- :mod:`~seqpack.packed.invariants` -- :func:`validate` and :class:`PackedSequenceError`;
- :mod:`~seqpack.packed.mrope` -- Qwen2-VL M-RoPE positions of samples and rows;
- :mod:`~seqpack.packed.masks` -- the attention inputs of a row for every backend (torch, lazily).
"""

from seqpack.packed.boundaries import concat_boundaries, real_boundaries, segment_fields, trim_cu_seqlens
from seqpack.packed.build import build_packed_sequence, join_rows
from seqpack.packed.invariants import PackedSequenceError, validate
from seqpack.packed.sequence import NON_TOKEN_EXTRA_KEYS, PackedSequence, pad_cu_seqlens
from seqpack.sample import IGNORE_INDEX

__all__ = [
    "IGNORE_INDEX",
    "NON_TOKEN_EXTRA_KEYS",
    "PackedSequence",
    "PackedSequenceError",
    "build_packed_sequence",
    "concat_boundaries",
    "join_rows",
    "pad_cu_seqlens",
    "real_boundaries",
    "segment_fields",
    "trim_cu_seqlens",
    "validate",
]
