"""Bin-packing algorithms for sequence packing (pure numpy/numba, no torch, no tokenizer).

Public API: :class:`PackingAlgorithm`, :func:`pack_lengths`, :class:`PackingPlan`.
"""

from seqpack.algorithms.core import (  # noqa: F401
    DEFAULT_ALGORITHM,
    PackingAlgorithm,
    PackingPlan,
    lower_bound_l1,
    lower_bound_l2,
    pack_lengths,
)

__all__ = [
    "DEFAULT_ALGORITHM",
    "PackingAlgorithm",
    "PackingPlan",
    "lower_bound_l1",
    "lower_bound_l2",
    "pack_lengths",
]
