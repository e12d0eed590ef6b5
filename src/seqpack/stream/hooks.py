"""Megatron-Energon-style packing hooks: two stateless functions, numpy only (no torch).

:func:`select_samples_to_pack` groups a buffer of samples into packs; :func:`pack_selected_samples`
builds one packed row from a group. An Energon ``TaskEncoder`` (which owns the buffer there,
``packing_buffer_size``) delegates to them through :class:`seqpack.interop.energon.SeqpackPackingMixin`,
which also gives every sample, pack and batch the ``__restore_key__`` Energon needs to restore a saved
loader state, and batches through :class:`~seqpack.collate.PackedCollator`.

The helpers below them (lengths, naming dropped samples, running an algorithm or a callable on a
buffer) are shared with :class:`~seqpack.stream.StreamingPacker`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from seqpack.algorithms import pack_lengths, resolve_algorithm
from seqpack.packed import PackedSequence, build_packed_sequence
from seqpack.padding import check_positive_int, check_seq_length, round_up

__all__ = ["pack_selected_samples", "sample_length", "select_samples_to_pack"]

#: one logger for the whole package: the public name ``seqpack.stream`` users filter on
logger = logging.getLogger("seqpack.stream")

#: how many dropped samples a warning names (the rest are counted; full lists are in ``stats``)
LOG_FIRST = 5

#: ``(lengths int64[n], capacity, seed, pad_to_multiple_of) -> list of index arrays`` (one per pack)
RunAlgorithm = Callable[[np.ndarray, int, int, int], list[np.ndarray]]


def sample_length(item: Any) -> int:
    """Packing cost (tokens) of one item before pad rounding.

    Accepts an ``int`` (length-only items), a :class:`~seqpack.sample.Sample` (``.length``), an
    object or dict with ``input_ids`` or ``length``, or anything with ``len()``.

    Raises:
        TypeError: when no length can be derived (names the item's type).
    """
    if isinstance(item, (int, np.integer)):
        return int(item)
    length = getattr(item, "length", None)
    if length is not None and not callable(length):
        return int(length)
    ids = getattr(item, "input_ids", None)
    if ids is not None:
        return len(ids)
    if isinstance(item, dict):
        if "length" in item:
            return int(item["length"])
        if "input_ids" in item:
            return len(item["input_ids"])
    try:
        return len(item)
    except TypeError:
        raise TypeError(
            f"cannot derive a packing length from an item of type {type(item).__name__}; pass "
            "length_fn=... (tokens per item) to the packer"
        ) from None


def sample_name(item: Any, key: int) -> str:
    """``source key K`` plus ``(sample_id ...)`` when the item carries one (for error messages)."""
    sid = getattr(item, "sample_id", None)
    if sid is None and isinstance(item, dict):
        sid = item.get("sample_id")
    return f"source key {key}" + (f" (sample_id {sid!r})" if sid is not None else "")


def first_names(bad, item_of, lens, padded, keys=None) -> str:
    """``name (length L)`` of the first :data:`LOG_FIRST` positions in ``bad``, then ``... and N more``."""
    shown = [
        f"{sample_name(item_of(int(i)), int(keys[i]) if keys is not None else int(i))} length {int(lens[i])}"
        + (f" (padded {int(padded[i])})" if padded[i] != lens[i] else "")
        for i in bad[:LOG_FIRST]
    ]
    more = len(bad) - len(shown)
    return "; ".join(shown) + (f"; ... and {more} more" if more > 0 else "")


def check_capacity(capacity: int, mult: int) -> None:
    """Raise ``ValueError`` unless ``capacity`` and ``mult`` are integers >= 1 and ``capacity % mult == 0``
    (the one check and message of :func:`seqpack.padding.check_seq_length`)."""
    check_positive_int(capacity, "capacity")
    check_positive_int(mult, "pad_to_multiple_of")
    check_seq_length(capacity, mult, {"pad_to_multiple_of": mult}, name="capacity")


def resolve_stream_algorithm(algorithm: Any) -> tuple[str, RunAlgorithm]:
    """Return (name used in the resume fingerprint, :data:`RunAlgorithm` function).

    ``algorithm`` is anything :func:`seqpack.algorithms.resolve_algorithm` accepts, or a callable
    ``(lengths int64[n], capacity, seed) -> list[index arrays]`` (its name is ``callable:module.qualname``).
    """
    if callable(algorithm) and not isinstance(algorithm, str) and not hasattr(algorithm, "value"):
        name = getattr(algorithm, "__qualname__", None) or type(algorithm).__name__
        mod = getattr(algorithm, "__module__", "")

        def run_callable(lengths, capacity, seed, mult):
            return [np.asarray(b, dtype=np.int64) for b in algorithm(lengths, capacity, seed)]

        return f"callable:{mod}.{name}", run_callable

    algo = resolve_algorithm(algorithm)

    def run_pack_lengths(lengths, capacity, seed, mult):
        plan = pack_lengths(
            lengths, capacity, algo, seed=seed, pad_to_multiple_of=mult, shuffle_packs=False
        )
        return plan.bins

    return str(getattr(algo, "value", algo)), run_pack_lengths


def unfit_text(name: str, length: int, padded: int, capacity: int) -> str:
    """Why a sample cannot be packed: it is empty (``length <= 0``: nothing to train on) or its padded length
    exceeds ``capacity``; ``name`` from :func:`sample_name`."""
    if length <= 0:
        return f"{name} is empty (length {length}): it has no token to pack"
    return f"{name} has length {length} (padded {padded}), which does not fit capacity {capacity}"


def select_samples_to_pack(
    samples: Sequence[Any],
    *,
    capacity: int,
    algorithm: Any = None,
    pad_to_multiple_of: int = 1,
    seed: int = 0,
    length_fn: Callable[[Any], int] | None = None,
    overlength: str = "error",
) -> list[list[Any]]:
    """Group a buffer of samples into packs (Megatron-Energon's ``select_samples_to_pack`` hook).

    Args:
        samples: the buffer (any items; lengths from ``length_fn`` or :func:`sample_length`).
        capacity: tokens per pack (the rows' ``seq_length``; divisible by ``pad_to_multiple_of``).
        algorithm: a :class:`~seqpack.algorithms.PackingAlgorithm` (or its value), ``None`` for the
            default, or a callable ``(lengths int64[n], capacity, seed) -> list[index arrays]``.
        pad_to_multiple_of: each length is rounded up to this multiple before packing (the one
            multiple from :func:`seqpack.padding.compute_pad_multiple`).
        seed: seeds the algorithm; the result is a pure function of the inputs (Energon restores
            its own buffer and expects deterministic selection).
        length_fn: item -> tokens.
        overlength: ``"error"`` raises for an item longer than ``capacity`` (after rounding);
            ``"drop"`` leaves it out; one warning per call gives the count and names the first five
            (each drop is logged at DEBUG level).

    Returns:
        list of packs, each a list of the original items; every item appears in exactly one pack
        (or is dropped and logged under ``overlength="drop"``).

    Raises:
        ValueError: over-length item under ``overlength="error"``, bad capacity/multiple.
    """
    if overlength not in ("error", "drop"):
        raise ValueError(f"overlength must be 'error' or 'drop', got {overlength!r}")
    check_capacity(capacity, pad_to_multiple_of)
    lf = length_fn or sample_length
    lens = np.fromiter((lf(s) for s in samples), dtype=np.int64, count=len(samples))
    padded = round_up(lens, pad_to_multiple_of) if len(lens) else lens
    bad = np.flatnonzero((padded > capacity) | (lens <= 0))
    keep = np.ones(len(samples), dtype=bool)
    for i in bad:
        msg = unfit_text(sample_name(samples[i], int(i)), int(lens[i]), int(padded[i]), capacity)
        if overlength == "error":
            raise ValueError(msg + "; truncate or drop it when preparing the data, or pass overlength='drop'")
        logger.debug("select_samples_to_pack: dropping %s", msg)
        keep[i] = False
    if len(bad) and overlength == "drop":  # one line per call, not one per sample
        logger.warning(
            "select_samples_to_pack: dropped %d over-length sample(s) of %d (capacity %d, overlength='drop'): %s",
            len(bad), len(samples), capacity, first_names(bad, lambda i: samples[i], lens, padded),
        )
    idx = np.flatnonzero(keep)
    if len(idx) == 0:
        return []
    _, run = resolve_stream_algorithm(algorithm)
    bins = run(lens[idx], capacity, int(seed), pad_to_multiple_of)
    return [[samples[int(idx[j])] for j in b] for b in bins]


def pack_selected_samples(
    samples: Sequence[Any],
    *,
    pad_token_id: int,
    pad_to_multiple_of: int = 1,
    seq_length: int | None = None,
    pad_to_max_length: bool = False,
) -> PackedSequence:
    """Build one packed row from a selected group (Megatron-Energon's ``pack_selected_samples``).

    The streaming side of the one row builder, :func:`seqpack.packed.build_packed_sequence`: it fills
    ``PackedSequence.media`` with each segment's ``Sample.media``, in segment order, and for
    image-text segments adds ``extra["mrope_position_ids"]`` (int64 ``[3, T]``, M-RoPE positions
    restarting per segment).

    Args:
        samples: :class:`~seqpack.sample.Sample` objects, in pack order.
        pad_token_id: id written into alignment/tail padding.
        pad_to_multiple_of: per-segment physical length multiple.
        seq_length: row width ``T`` when ``pad_to_max_length`` (else the padded total).
        pad_to_max_length: pad the row to ``seq_length`` (static shapes).

    Returns:
        :class:`~seqpack.packed.PackedSequence`.

    Raises:
        ValueError, TypeError: from :func:`~seqpack.packed.build_packed_sequence` (bad pad id,
            segments that do not fit ``seq_length``).
    """
    return build_packed_sequence(
        list(samples),
        pad_to_multiple_of=pad_to_multiple_of,
        pad_token_id=pad_token_id,
        seq_length=seq_length,
        pad_to_max_length=pad_to_max_length,
    )
