"""Read input files and datasets into ``RawRecord`` s: JSON, JSONL, Parquet, HF ``datasets`` (objects,
``save_to_disk`` folders, ``.arrow`` files), LLaMA-Factory ``dataset_info.json`` entries, record lists.

Text files are UTF-8 (a leading UTF-8 byte-order mark is accepted). JSONL is decoded line by line, so a
line that is not valid UTF-8 is one bad record (``reason="bad_encoding"``), skippable like malformed
JSON; in a ``.json`` array it makes the whole file unreadable. JSON and JSONL reading, line ends and
the refusals of whole files: ``seqpack.data.json_files``.

Arrow-sourced records (Parquet files, HF ``datasets``) are cleaned of ``None``-valued keys, recursively
(``strip_arrow_nulls``): Arrow stores one struct type per column, the union of the keys of all rows,
and fills a key that a row lacks with ``None``; without the cleaning, every tool schema or tool-call
argument object would gain the other rows' keys as ``null`` and render differently from the JSONL
source. Consequence: an explicit ``null`` inside a Parquet / dataset row is indistinguishable from an
absent key and is dropped too; JSON / JSONL files and in-memory record lists keep every ``null``.
"""

from __future__ import annotations

import glob as _glob
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from seqpack.data.json_files import iter_json, iter_jsonl
from seqpack.data.llamafactory import LlamaFactorySource, is_dataset_info, read_dataset_info
from seqpack.data.records import DataFormatError, RawRecord

__all__ = [
    "InMemoryRecords",
    "dataset_name",
    "dedupe_paths",
    "expand_inputs",
    "expand_named",
    "is_dataset",
    "iter_records",
    "strip_arrow_nulls",
]

logger = logging.getLogger(__name__)


class InMemoryRecords(list):
    """A list of record dicts given directly to ``prepare`` (source name ``"records"``)."""

    name = "records"


def expand_inputs(inputs: Any, log: Callable[[str], None] | None = None) -> list[Any]:
    """Expand ``inputs`` (a path, a glob, a ``datasets.Dataset``, a list of those, or a list of
    record dicts) to a list of ``Path`` objects, dataset objects and ``InMemoryRecords``, in the
    given order (globs sorted). A ``datasets`` ``save_to_disk`` folder is one input; a LLaMA-Factory
    ``dataset_info.json`` is one :class:`~seqpack.data.llamafactory.LlamaFactorySource` per entry (and per
    file of a directory entry); such sources may also be given directly.

    A file reached twice (the same path given twice, a glob overlapping a path, a symlink to a file
    already listed) is read once, at its first position: later occurrences are dropped by real path
    (``os.path.realpath``) and reported through ``log``, else logged at WARNING level on the
    ``seqpack.data.sources`` logger, naming both as given (:func:`dedupe_paths`).

    Raises:
        FileNotFoundError: a path does not exist or a glob matches nothing.
        DataFormatError: a directory that is not a ``save_to_disk`` folder of one ``Dataset``, a
            ``DatasetDict`` (object or folder), or a ``dataset_info.json`` that does not parse.
    """
    pairs = expand_named(inputs)
    return dedupe_paths([x for x, _ in pairs], log, names=[n for _, n in pairs])


def expand_named(inputs: Any) -> list[tuple[Any, str | None]]:
    """:func:`expand_inputs` before repeats are dropped: ``(input, name as given)`` pairs, the name being the
    path as the user typed it (``"./data/chat.jsonl"``, which ``Path`` shortens) or a glob's match with the glob
    (``"./data/chat.jsonl (matched by './data/*.jsonl')"``); ``None`` for datasets, record lists and LLaMA-Factory
    sources. Raises as :func:`expand_inputs`."""
    if isinstance(inputs, (str, os.PathLike)) or is_dataset(inputs) or is_dataset_dict(inputs):
        inputs = [inputs]
    if isinstance(inputs, InMemoryRecords):
        return [(inputs, None)]
    if isinstance(inputs, (list, tuple)) and inputs and all(
        isinstance(x, dict) and not is_dataset_dict(x) for x in inputs
    ):
        return [(InMemoryRecords(inputs), None)]
    out: list[tuple[Any, str | None]] = []
    for item in inputs:
        if is_dataset_dict(item):
            raise DataFormatError(
                f"got a DatasetDict with splits {list(item.keys())}, not a Dataset.",
                source="DatasetDict",
                reason="bad_input",
                fix="pass one split, e.g. ds['train'].",
            )
        if is_dataset(item) or isinstance(item, LlamaFactorySource):
            out.append((item, None))
            continue
        s = os.fspath(item)
        if any(ch in s for ch in "*?["):
            matches = sorted(_glob.glob(s, recursive=True))
            if not matches:
                raise FileNotFoundError(f"input glob {s!r} matches no file. Fix: check the pattern and the cwd.")
            out.extend((Path(m), f"{m} (matched by {s!r})") for m in matches if not Path(m).is_dir())
            continue
        p = Path(s)
        if p.is_dir():
            _check_saved_dataset(p)
        elif not p.exists():
            raise FileNotFoundError(f"input file {s!r} does not exist. Fix: check the path (cwd = {os.getcwd()}).")
        out.extend([(x, None) for x in read_dataset_info(p)] if is_dataset_info(p) else [(p, s)])
    return out


def _check_saved_dataset(p: Path) -> None:
    """A directory input must be a ``Dataset.save_to_disk`` folder (``state.json`` + ``dataset_info.json``)."""
    if (p / "dataset_dict.json").is_file():
        splits = sorted(q.name for q in p.iterdir() if (q / "state.json").is_file())
        raise DataFormatError(
            f"is a DatasetDict saved with save_to_disk (splits {splits}), not one Dataset.", source=str(p),
            reason="bad_input", fix=f"pass one split's folder, e.g. {p / (splits[0] if splits else 'train')}.",
        )
    if not (p / "state.json").is_file() or not (p / "dataset_info.json").is_file():
        raise DataFormatError(
            "is a directory, not a datasets save_to_disk folder (it has no state.json + dataset_info.json).",
            source=str(p), reason="bad_input",
            fix="pass data files (.json, .jsonl, .parquet, .arrow), a glob such as 'dir/*.jsonl', a folder written "
            "by Dataset.save_to_disk, or a LLaMA-Factory dataset_info.json.",
        )


def dedupe_paths(items: list[Any], log: Callable[[str], None] | None = None,
                 names: list[str | None] | None = None) -> list[Any]:
    """Drop files whose real path was already listed (first occurrence wins); datasets are kept.

    Each dropped repeat is reported through ``log`` when given, else as a WARNING on this module's logger,
    naming both files by ``names`` (one per item: the path as the user typed it, :func:`expand_named`; an item
    without one is named by its ``Path``), e.g. ``"input ./a.jsonl is the same file as a.jsonl ..."``.
    """
    seen: dict[str, str] = {}
    out: list[Any] = []
    for k, it in enumerate(items):
        if isinstance(it, Path):
            real = os.path.realpath(it)
            name = (names[k] if names is not None else None) or os.fspath(it)
            if real in seen:
                msg = (f"input {name} is the same file as {seen[real]} (listed twice, e.g. by a "
                       "path and an overlapping glob): read once, so each record is packed once")
                if log is not None:
                    log(msg)
                else:
                    logger.warning("%s", msg)
                continue
            seen[real] = name
        out.append(it)
    return out


def _is_datasets_instance(obj: Any, *class_names: str) -> bool:
    """``isinstance(obj, datasets.<name>)`` for any of ``class_names``, False without ``datasets``."""
    if not type(obj).__module__.startswith("datasets"):  # avoid importing datasets (~0.5 s) for files
        return False
    try:
        import datasets
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, tuple(getattr(datasets, n) for n in class_names))


def is_dataset(obj: Any) -> bool:
    """Whether ``obj`` is an HF ``datasets.Dataset`` / ``IterableDataset`` (False without ``datasets``)."""
    return _is_datasets_instance(obj, "Dataset", "IterableDataset")


def is_dataset_dict(obj: Any) -> bool:
    """Whether ``obj`` is an HF ``DatasetDict`` / ``IterableDatasetDict`` (False without ``datasets``)."""
    return _is_datasets_instance(obj, "DatasetDict", "IterableDatasetDict")


def dataset_name(ds: Any) -> str:
    """A readable name for an HF dataset (its builder / dataset name, else ``"dataset"``)."""
    info = getattr(ds, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    return str(name) if name else "dataset"


def iter_records(item: Any, on_count: Callable[[int], None] | None = None) -> Iterator[RawRecord]:
    """Yield every record of one input (a ``Path`` or an HF dataset) as a ``RawRecord``.

    ``on_count(n)``, if given, is called with the number of records of a ``.json`` array once it is
    parsed, before its first record is yielded (progress totals; other kinds are counted by the caller).

    JSONL: one record per non-blank line (``index = line - 1``); a line that is not valid UTF-8 or
    not valid JSON yields a record carrying ``error`` (so it can be skipped and reported). JSON: a
    top-level array (a file that is really JSONL is read as JSONL). Parquet: one record per row.
    HF datasets: one per row; a ``save_to_disk`` folder (``datasets.load_from_disk``) or an ``.arrow``
    file (``datasets.Dataset.from_file``): one per row, ``source`` the path, image paths relative to the
    folder. A :class:`~seqpack.data.llamafactory.LlamaFactorySource`: its file's records in seqpack's keys
    (``LlamaFactorySource.records``). A leading UTF-8 BOM is ignored. Parquet / dataset rows go through
    ``strip_arrow_nulls`` (Arrow's ``None`` fill of absent struct keys is removed; see the module doc).

    Raises:
        DataFormatError: the whole file cannot be parsed (``.json`` that is not UTF-8 or not JSON, a
            folder or ``.arrow`` file datasets cannot load, a ``DatasetDict``), or the extension is unknown.
    """
    if isinstance(item, InMemoryRecords):
        for i, row in enumerate(item):
            yield RawRecord(row, item.name, i)
        return
    if is_dataset(item):
        name = dataset_name(item)
        for i, row in enumerate(item):
            yield RawRecord(strip_arrow_nulls(row), name, i)
        return
    if isinstance(item, LlamaFactorySource):
        yield from item.records(iter_records)
        return
    path = Path(item)
    src = str(path)
    suffix = path.suffix.lower()
    base = path.resolve().parent
    if path.is_dir() or suffix == ".arrow":
        ds = _load_arrow(path)
        for i, row in enumerate(ds):
            yield RawRecord(strip_arrow_nulls(row), src, i, base_dir=path.resolve() if path.is_dir() else base)
    elif suffix in (".jsonl", ".ndjson"):
        yield from iter_jsonl(path, base)
    elif suffix == ".json":
        yield from iter_json(path, base, on_count)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        i = 0
        for batch in pf.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                yield RawRecord(strip_arrow_nulls(row), src, i, base_dir=base)
                i += 1
    else:
        raise DataFormatError(
            f"unknown file type {path.suffix!r}.",
            source=src,
            reason="unknown_format",
            fix="use .json (array), .jsonl, .parquet or .arrow files, a datasets save_to_disk folder, or load the "
            "data with `datasets` and pass the Dataset.",
        )


def _load_arrow(path: Path) -> Any:
    """``datasets.load_from_disk`` (a folder) or ``datasets.Dataset.from_file`` (an ``.arrow`` file)."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path)) if path.is_dir() else datasets.Dataset.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - datasets/pyarrow raise many types for a bad file
        what = "a datasets save_to_disk folder" if path.is_dir() else "an Arrow stream file written by datasets"
        raise DataFormatError(
            f"cannot be read as {what} ({type(e).__name__}: {e}).", source=str(path), reason="bad_input",
            fix="pass a folder written by Dataset.save_to_disk or one of its data-*.arrow files (an Arrow IPC "
            "file/Feather written by pyarrow: convert it, e.g. pyarrow.parquet.write_table(table, 'x.parquet')).",
        ) from None
    if not isinstance(ds, datasets.Dataset):
        raise DataFormatError(f"holds a {type(ds).__name__}, not one Dataset.", source=str(path), reason="bad_input",
                              fix="pass one split's folder.")
    return ds


def strip_arrow_nulls(value: Any) -> Any:
    """Return ``value`` with every dict key whose value is ``None`` removed, recursively (through
    dicts and lists; other objects such as bytes or PIL images are returned as they are).

    Applied to Parquet and HF ``datasets`` rows only: Arrow gives every row of a struct column all the
    keys seen in any row, filling the absent ones with ``None`` (e.g. a tool schema gains another
    tool's ``"amount": null`` property). List elements that are ``None`` are kept.
    """
    if isinstance(value, dict):
        return {k: strip_arrow_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_arrow_nulls(v) for v in value]
    return value
