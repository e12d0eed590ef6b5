"""``report.jsonl``: one JSON line per input record that was not packed as is (dropped, skipped,
truncated, split or kept), the file form of :class:`seqpack.accounting.PrepareReport.entries`.

:func:`write_report` is the one writer of that file: the dataset writer calls it inside the dataset's
temp folder, and :func:`write_rejected_report` calls it when no record is left to pack, so the
records that were refused are listed even though no dataset is written. :func:`read_report` reads it
back, refusing a line that is not one such entry.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any, Iterable

from seqpack.io.fingerprint import sha256_file
from seqpack.accounting import SampleRecord
from seqpack.io.metadata import REPORT_FILE, PackedDatasetError
from seqpack.io.output_dir import temp_name

__all__ = ["read_report", "rejected_report_path", "write_rejected_report", "write_report"]

#: The JSON types each :class:`~seqpack.accounting.SampleRecord` field may hold in ``report.jsonl``.
_FIELD_TYPES = {"str": (str,), "str | None": (str, type(None)), "int | None": (int, type(None))}


def _line_problem(d: Any) -> str | None:
    """What makes the parsed line ``d`` not a report entry (``None``: it is one). A field without a
    default that may not be null (``sample_id``, ``status``, ``reason``) must be present; every
    :class:`~seqpack.accounting.SampleRecord` field present must have its type; other keys are kept."""
    if not isinstance(d, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(d), "a number")
        return f"it is {kind}, not a JSON object"
    for f in fields(SampleRecord):
        types = _FIELD_TYPES[str(f.type)]
        if f.name not in d:
            if f.default is MISSING and type(None) not in types:
                return f"it has no {f.name!r}"
            continue
        v = d[f.name]
        if not isinstance(v, types) or isinstance(v, bool):
            want = " or ".join("null" if t is type(None) else {"str": "a string", "int": "an integer"}[t.__name__]
                               for t in types)
            return f"its {f.name!r} is {json.dumps(v, ensure_ascii=False)[:40]}, not {want}"
    return None


def read_report(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read ``report.jsonl`` at ``path``: one dict per non-blank line, each a
    :class:`~seqpack.accounting.SampleRecord`'s fields (keys ``sample_id``, ``source``, ``index``,
    ``status``, ``reason``, ``detail``, ``tokens_before``, ``tokens_after``). A missing file reads as ``[]``.

    Raises:
        PackedDatasetError: a line is not UTF-8, not JSON, not an object, or lacks / mistypes a field; the message
            names the file, the line number and what is wrong, e.g.
            ``DIR/report.jsonl line 13: not JSON (Expecting value at column 1). report.jsonl was edited or
            damaged after packing; re-pack, or check it with `seqpack inspect DIR --verify```.
    Example:
        >>> read_report("packed/report.jsonl")[0]["reason"]  # doctest: +SKIP
        'overlength'
    """
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                d = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                problem: str | None = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte column {exc.start + 1})"
            except json.JSONDecodeError as exc:
                problem = f"not JSON ({exc.msg} at column {exc.colno})"
            else:
                problem = _line_problem(d)
            if problem is not None:
                raise PackedDatasetError(
                    f"{p} line {n}: {problem}. {REPORT_FILE} was edited or damaged after packing; re-pack, or "
                    f"check it with `seqpack inspect {p.parent} --verify`")
            out.append(d)
    return out


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
