"""Bin-packing algorithms for sequence packing (pure numpy/numba, no torch, no tokenizer).

Public API: :class:`PackingAlgorithm`, :func:`pack_lengths`, :class:`PackingPlan`,
:func:`lower_bound_l1`, :func:`lower_bound_l2`, :func:`check_plan`. This package imports only the
ground floor (``seqpack.padding``).
"""

from seqpack.algorithms.core import (  # noqa: F401
    DEFAULT_ALGORITHM,
    MAX_CAPACITY_UNITS,
    PackingAlgorithm,
    PackingPlan,
    check_plan,
    lower_bound_l1,
    lower_bound_l2,
    pack_lengths,
    resolve_algorithm,
)

__all__ = [
    "DEFAULT_ALGORITHM",
    "MAX_CAPACITY_UNITS",
    "PackingAlgorithm",
    "PackingPlan",
    "check_plan",
    "lower_bound_l1",
    "lower_bound_l2",
    "pack_lengths",
    "resolve_algorithm",
]
