"""Refuse a seqpack packed dataset given as the input of a pack job: its folder, its ``metadata.json`` or a
Parquet shard of it holds packed rows, not records, and would otherwise be refused with a text about record
formats ("unknown record format ... rename the columns") or ``datasets`` folders.

A folder is a packed dataset by :func:`seqpack.io.metadata.is_packed_dataset`; a Parquet file is a shard by
:func:`seqpack.io.cache.is_packed_shard` (the packed column set).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seqpack.data.records import DataFormatError
from seqpack.io.metadata import METADATA_FILE, PackedDatasetError, PackedMetadata, is_packed_dataset

__all__ = ["refuse_packed_input"]


def refuse_packed_input(item: Any) -> None:
    """Raise when ``item`` (an input path; anything else is ignored) is a packed dataset folder, its
    ``metadata.json``, or a packed shard (a ``.parquet`` file with the packed columns).

    Raises:
        DataFormatError: ``reason="bad_input"``; names what the path is, the records the dataset was packed
            from (``metadata.json`` ``inputs``) when they can be read, and the fix (``load_packed`` /
            ``seqpack inspect``, or the source records).

    Example:
        >>> refuse_packed_input("out")  # doctest: +SKIP
        DataFormatError: out: is already a seqpack packed dataset (it holds metadata.json) ...
    """
    if not isinstance(item, (str, os.PathLike)):
        return
    p = Path(item)
    notes = []
    if is_packed_dataset(p):
        folder, what = p, "is already a seqpack packed dataset"
        notes.append(f"it holds {METADATA_FILE}")
    elif p.name == METADATA_FILE and is_packed_dataset(p.parent):
        folder, what = p.parent, f"is the {METADATA_FILE} of the seqpack packed dataset {p.parent}"
    elif p.suffix.lower() == ".parquet" and p.is_file() and (columns := _shard_columns(p)):
        folder = p.parent.parent if is_packed_dataset(p.parent.parent) else None
        what = f"is a shard of the seqpack packed dataset {folder}" if folder else "is a shard of a seqpack packed dataset"
        notes.append(f"packed columns {', '.join(columns)}")
    else:
        return
    notes += _packed_from(folder)
    target = os.fspath(folder) if folder is not None else "DATASET_FOLDER"
    raise DataFormatError(
        f"{what}" + (f" ({'; '.join(notes)})" if notes else "") + ": packed rows, not records to pack.",
        source=os.fspath(item), reason="bad_input",
        fix=f"to train on it, load it with seqpack.io.load_packed({target!r}), or look at it with `seqpack inspect "
        f"{target}`; to pack again, give the source records (JSON, JSONL, Parquet of records) as the input.",
    )


def _shard_columns(path: Path) -> tuple[str, ...]:
    """The packed columns of ``path`` when it is a packed shard, else ``()``."""
    from seqpack.io.cache import SHARD_COLUMNS, is_packed_shard  # defers pyarrow until a .parquet input is checked

    return SHARD_COLUMNS if is_packed_shard(path) else ()


def _packed_from(folder: Path | None) -> list[str]:
    """``["packed from a.jsonl, b.json"]`` from the dataset's ``metadata.json``, or ``[]`` when unknown."""
    if folder is None:
        return []
    try:
        paths = [str(i.get("path")) for i in PackedMetadata.read(folder).inputs if isinstance(i, dict)]
    except (PackedDatasetError, OSError, TypeError, ValueError):
        return []
    more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
    return [f"packed from {', '.join(paths[:5])}{more}"] if paths else []
