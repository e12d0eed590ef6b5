"""The one place where the per-segment pad multiple is computed and checked.

Every layer that needs the multiple (planner, row builder, config validation, CP slicing) calls
:func:`compute_pad_multiple` once and passes the integer on; nobody recomputes it differently
(docs/cases.md, B24: one pad multiple for planner, builder and metadata). Every layer that needs
``seq_length`` to be a multiple of it calls :func:`check_seq_length` (or, for a rule that reports
problem and fix apart, :func:`seq_length_problem`), so the rule and its message exist once.
This module imports nothing else of seqpack and needs no torch.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

__all__ = ["compute_pad_multiple", "round_up", "seq_length_problem", "check_seq_length", "check_positive_int"]


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


def check_positive_int(value: Any, name: str = "seq_length", *, error: type[Exception] = ValueError) -> int:
    """Return ``value`` as an ``int`` when it is an integer >= 1; refuse bool, float, str and ``None``.

    Args:
        value: the given length (``int`` or a numpy integer).
        name: the keyword the message names (``"seq_length"``, ``"capacity"``).
        error: the exception class to raise (a ``ValueError`` subclass of the calling layer).

    Raises:
        error: ``value`` is not an integer >= 1, with ``"<name> must be an integer >= 1, got <value!r>"``.

    Example:
        >>> check_positive_int(np.int64(128))
        128
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise error(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def seq_length_problem(
    seq_length: int,
    multiple: int,
    settings: Mapping[str, Any] | None = None,
    *,
    name: str = "seq_length",
    flags: Mapping[str, str] | None = None,
) -> tuple[str, str] | None:
    """Say why ``seq_length`` is not a multiple of the pad multiple, and what to set instead.

    Args:
        seq_length: the packed row length in tokens (the planner's capacity).
        multiple: the pad multiple from :func:`compute_pad_multiple` (>= 1).
        settings: the settings the multiple came from, named as the user set them
            (e.g. ``{"pad_to_multiple_of": 1, "context_parallel_size": 2}``); ``None`` entries are left out.
        name: what the caller calls the row length (``"seq_length"``; ``"capacity"`` inside the
            algorithms).
        flags: optional key -> command-line flag (``{"seq_length": "--seq-length"}``); a named key is
            shown as ``seq_length (--seq-length)``.

    Returns:
        ``None`` when ``seq_length % multiple == 0``, else ``(problem, fix)``: the problem names the
        value, the multiple and the settings behind it; the fix names the nearest valid values below and
        above (only above when the one below would be 0).
    """
    if seq_length % multiple == 0:
        return None
    flags = flags or {}

    def key(k: str) -> str:
        return f"{k} ({flags[k]})" if k in flags else k

    named = {k: v for k, v in (settings or {}).items() if v is not None}
    where = ", ".join(f"{k}={v}" for k, v in named.items())
    problem = f"{name}={seq_length} is not divisible by the pad multiple {multiple}" + (f" ({where})" if where else "")
    if int(named.get("context_parallel_size") or 1) > 1:
        problem += "; context parallelism pads every segment to a multiple of 2*context_parallel_size"
    lo = seq_length - seq_length % multiple
    hi = lo + multiple
    fix = f"set {key(name)} to {lo} or {hi}" if lo > 0 else f"set {key(name)} to {hi}"
    changeable = [key(k) for k in named if k != name]
    if changeable:
        fix += ", or change " + " / ".join(changeable)
    return problem, fix


def check_seq_length(
    seq_length: int,
    multiple: int,
    settings: Mapping[str, Any] | None = None,
    *,
    name: str = "seq_length",
    flags: Mapping[str, str] | None = None,
    error: type[Exception] = ValueError,
) -> None:
    """Raise ``error`` unless ``seq_length`` is a multiple of the pad multiple (message of :func:`seq_length_problem`).

    Args:
        seq_length, multiple, settings, name, flags: as :func:`seq_length_problem`.
        error: the exception class to raise (a ``ValueError`` subclass of the calling layer, e.g.
            ``PackConfigError``).

    Raises:
        error: ``seq_length % multiple != 0``, with ``"<problem>; <fix>"``.

    Example:
        >>> check_seq_length(152, compute_pad_multiple(context_parallel_size=2), {"context_parallel_size": 2})
        >>> try:
        ...     check_seq_length(150, 4, {"context_parallel_size": 2})
        ... except ValueError as e:
        ...     print(str(e).split(";")[0])
        seq_length=150 is not divisible by the pad multiple 4 (context_parallel_size=2)
    """
    found = seq_length_problem(seq_length, multiple, settings, name=name, flags=flags)
    if found is not None:
        raise error("; ".join(found))
