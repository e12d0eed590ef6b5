"""``report.jsonl``: one JSON line per input record that was not packed as is (dropped, skipped,
truncated, split or kept), the file form of :class:`seqpack.accounting.PrepareReport.entries`.

:func:`write_report` is the one writer of that file: the dataset writer calls it inside the dataset's
temp folder, and :func:`write_rejected_report` calls it when no record is left to pack, so the
records that were refused are listed even though no dataset is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from seqpack.io.fingerprint import sha256_file
from seqpack.io.metadata import REPORT_FILE
from seqpack.io.output_dir import temp_name

__all__ = ["rejected_report_path", "write_rejected_report", "write_report"]


def write_report(path: str | os.PathLike, entries: Iterable[Any]) -> str:
    """Write ``entries`` (:class:`~seqpack.accounting.SampleRecord` dataclasses or dicts) to ``path``,
    one JSON object per line (UTF-8, non-ASCII kept), fsync it, and return its sha256 (hex).

    Raises:
        OSError: the file cannot be written.
    """
    with open(path, "w", encoding="utf-8") as f:
        for e in entries:
            d = asdict(e) if hasattr(e, "__dataclass_fields__") else dict(e)
            f.write(json.dumps(d, ensure_ascii=False, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return sha256_file(path)


def rejected_report_path(output: str | os.PathLike) -> Path:
    """Where the report of a run that packed nothing goes: ``<parent>/<name>.report.jsonl``, beside the
    output folder (never inside it, so an existing dataset there stays whole)."""
    out = Path(output)
    return out.parent / f"{out.name}.{REPORT_FILE}"


def write_rejected_report(output: str | os.PathLike, entries: Iterable[Any]) -> Path:
    """Write the report of a run that packed nothing to :func:`rejected_report_path` ``(output)``
    atomically (a temp file renamed over any earlier one); returns its path. The temp file is the
    output's ``.NAME.tmp-<pid>-<id>`` sibling, so a run killed while writing it leaves a leftover that
    :func:`seqpack.io.output_dir.remove_leftovers` removes.

    Raises:
        OSError: the parent folder is not writable.
    """
    path = rejected_report_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(output, "tmp")
    try:
        write_report(tmp, entries)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
