"""The one place where the per-segment pad multiple is computed (case B24).

Every layer that needs the multiple (planner, row builder, config validation, CP slicing) calls
:func:`compute_pad_multiple` once and passes the integer on; nobody recomputes it differently.
This module imports nothing else of seqpack and needs no torch.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["compute_pad_multiple", "round_up"]


def compute_pad_multiple(
    pad_to_multiple_of: int = 1,
    context_parallel_size: int = 1,
    tensor_model_parallel_size: int = 1,
    sequence_parallel: bool = False,
) -> int:
    """Return the multiple every packed segment's physical length is padded to.

    ``lcm(pad_to_multiple_of, 2*CP if CP > 1, CP*TP if sequence_parallel and TP > 1)``.
    The ``2*CP`` term is what Transformer Engine's THD context-parallel partitioning needs (each
    segment is cut into ``2*CP`` equal chunks, see ``seqpack.parallel``); the ``CP*TP`` term is
    Megatron-Core's sequence-parallel divisibility rule.

    Args:
        pad_to_multiple_of: user multiple (Megatron-Bridge ``pad_seq_to_mult``), >= 1.
        context_parallel_size: CP world size, >= 1.
        tensor_model_parallel_size: TP world size, >= 1.
        sequence_parallel: Megatron sequence parallelism on.

    Returns:
        int >= 1.

    Raises:
        ValueError: if any size is < 1 (naming the key).
    """
    for key, val in (
        ("pad_to_multiple_of", pad_to_multiple_of),
        ("context_parallel_size", context_parallel_size),
        ("tensor_model_parallel_size", tensor_model_parallel_size),
    ):
        if int(val) != val or val < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {val!r}")
    m = int(pad_to_multiple_of)
    if context_parallel_size > 1:
        m = math.lcm(m, 2 * int(context_parallel_size))
    if sequence_parallel and tensor_model_parallel_size > 1:
        m = math.lcm(m, int(context_parallel_size) * int(tensor_model_parallel_size))
    return m


def round_up(lengths, multiple: int):
    """Round lengths up to a multiple: ``ceil(lengths / multiple) * multiple``.

    Args:
        lengths: int or integer array-like (tokens).
        multiple: int >= 1 (from :func:`compute_pad_multiple`).

    Returns:
        Same kind as the input (int for int, ``np.ndarray[int64]`` otherwise).
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    if np.isscalar(lengths):
        return -(-int(lengths) // multiple) * multiple
    arr = np.asarray(lengths, dtype=np.int64)
    return -(-arr // multiple) * multiple
