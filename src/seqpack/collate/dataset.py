"""Map-style dataset of packed rows for a ``torch.utils.data.DataLoader``."""

from __future__ import annotations

from typing import Any, Mapping

from seqpack._torch import torch_hint

with torch_hint("seqpack.collate (the collators and PackedRowsDataset)"):
    import torch

__all__ = ["PackedRowsDataset"]


class PackedRowsDataset(torch.utils.data.Dataset):
    """Map-style torch dataset of packed rows: ``ds[i]`` is a ``PackedSequence`` (the on-disk reader is
    :class:`seqpack.io.PackedDataset`; this wraps it, or any sequence of rows, for a ``DataLoader``).

    Args:
        source: a packed dataset directory (opened with ``seqpack.io.load_packed(source, expect)``)
            or any sequence of ``PackedSequence`` (e.g. a list, or an already opened dataset).
        expect: settings checked against the directory's metadata (see ``load_packed``).

    Picklable when ``source`` is: for a directory only the path is pickled and workers reopen it.
    """

    def __init__(self, source: Any, expect: Mapping[str, Any] | None = None):
        self._path = None
        self._expect = dict(expect) if expect else None
        if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
            self._path = str(source)
            self._rows = None
        else:
            if not hasattr(source, "__getitem__") or not hasattr(source, "__len__"):
                raise TypeError(f"PackedRowsDataset needs a directory or a sequence of PackedSequence, got {type(source)!r}")
            self._rows = source

    def _open(self):
        if self._rows is None:
            from seqpack.io import load_packed  # deferred: pyarrow

            self._rows = load_packed(self._path, self._expect)
        return self._rows

    def __len__(self) -> int:
        return len(self._open())

    def __getitem__(self, i: int):
        return self._open()[i]

    def __getstate__(self):
        state = dict(self.__dict__)
        if self._path is not None:
            state["_rows"] = None  # reopen (memory map) in the worker
        return state
