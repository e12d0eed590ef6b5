"""Reading one shard of a packer's source (numpy only, no torch).

A map-style source is read by key in this shard's epoch order (:func:`map_reader`); a plain
iterable is read in order, and on resume replayed up to the saved cursor so that the items still
waiting in the saved buffer are collected again (:func:`iterable_reader`). Both return
``read(n) -> (keys int64[k], lens int64[k], items list | None)`` with ``k <= n`` (``k < n`` at the
end of the shard), advancing ``buffer.cursor``.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from seqpack.stream.buffer import CarryOverBuffer
from seqpack.stream.hooks import sample_length

__all__ = ["Reader", "check_one_shot", "iterable_reader", "map_reader"]

Reader = Callable[[int], tuple[np.ndarray, np.ndarray, "list[Any] | None"]]


def map_reader(src: Any, keys: np.ndarray, run: CarryOverBuffer, *, length_fn: Callable[[Any], int],
               numeric: bool, need_items: bool) -> Reader:
    """Read ``src[k]`` for this shard's ``keys`` from ``run.cursor`` on; ``numeric``: ``src`` is an int
    array of lengths (items are fetched only when ``need_items``).

    Raises:
        ValueError: on resume, when the saved cursor lies past this shard's end (a state of another source).
    """
    if run.cursor > len(keys):
        raise ValueError(
            f"cannot resume: the state was saved at item {run.cursor} of this shard, but the shard has only "
            f"{len(keys)} items; the state is not from this source (or the source shrank since it was saved)")

    def read(n: int):
        ks = keys[run.cursor : run.cursor + n]
        run.cursor += len(ks)
        if numeric:
            lens = src[ks].astype(np.int64)
            items = [src[int(k)] for k in ks] if need_items else None
        else:
            items = [src[int(k)] for k in ks]
            lens = np.fromiter((length_fn(x) for x in items), dtype=np.int64, count=len(items))
        return ks, lens, items

    return read


def check_one_shot(source: Any, cursor: int, read_before: bool) -> None:
    """Refuse to read a one-shot iterator ``source`` (a generator, a file, ``map(...)``: an ``Iterator``)
    where it would silently yield too little: a second pass by the same packer (it is exhausted), or a
    resume (``cursor > 0``: the replay from the first item) from a generator that has already started.

    Raises:
        ValueError: naming the case and the fix (a re-iterable source, or a new generator).
    """
    fix = ("pass a re-iterable source (a list, a datasets.Dataset, or an object whose __iter__ returns a new "
           "iterator each time), or a new generator to a new StreamingPacker")
    if read_before:
        raise ValueError("the source is a one-shot iterator (e.g. a generator) that this packer has already "
                         f"read, so another pass (the next epoch, a resume, iterating again) would miss samples. Fix: {fix}")
    if cursor > 0 and inspect.isgenerator(source) and inspect.getgeneratorstate(source) != inspect.GEN_CREATED:
        raise ValueError(f"cannot resume: the source generator has already yielded items, but a resume replays "
                         f"the source from its first item up to the saved position ({cursor}). Fix: {fix}")


def iterable_reader(it: Iterator[Any], run: CarryOverBuffer, *, shard: int, nshards: int,
                    length_fn: Callable[[Any], int], need_items: bool) -> Reader:
    """Read this shard's items from ``it`` (already restricted to the shard); the ``k``-th item has
    source key ``shard + k * nshards``.

    Raises:
        ValueError: on resume, when the source ends before the saved cursor or the items waiting in
            the saved buffer are not found in the replay (the source changed since the state was saved).
    """
    wanted = set(run.buf_keys.tolist()) | set(run.pend_keys.tolist()) if need_items else set()
    found: dict[int, Any] = {}
    for k in range(run.cursor):
        try:
            x = next(it)
        except StopIteration:
            raise ValueError(
                f"cannot resume: the source ended after {k} items of this shard, but the state was saved at "
                f"{run.cursor}; the source changed since the state was saved"
            ) from None
        pos = shard + k * nshards
        if pos in wanted:
            found[pos] = x
    if len(found) != len(wanted):
        raise ValueError("cannot resume: items waiting in the saved buffer were not found in the source replay")
    run.items.update(found)

    def read(n: int):
        chunk = list(itertools.islice(it, n))
        start = run.cursor
        run.cursor += len(chunk)
        ks = shard + nshards * np.arange(start, start + len(chunk), dtype=np.int64)
        if chunk and isinstance(chunk[0], (int, np.integer)) and length_fn is sample_length:
            lens = np.fromiter(chunk, dtype=np.int64, count=len(chunk))
        else:
            lens = np.fromiter((length_fn(x) for x in chunk), dtype=np.int64, count=len(chunk))
        return ks, lens, chunk

    return read
