"""Read chat records (JSON, JSONL, Parquet, HF ``datasets``) and normalise them into ``Conversation``.

Supported record formats (detected per record, or forced with ``format=``):

- ``alpaca``: ``{instruction, input?, output, system?, history?}`` (Stanford Alpaca; ``history`` is a
  list of ``[query, response]`` pairs as in LLaMA-Factory). The user turn is
  ``instruction + "\\n" + input`` when ``input`` is non-empty (LLaMA-Factory's convention).
- ``sharegpt``: ``{conversations: [{from, value}], system? | system_prompt?, tools?}``. Roles
  ``human``/``user``, ``gpt``/``assistant`` (also ``chatgpt``, ``bard``, ``bing``), ``system``,
  ``function_call`` (value = JSON ``{name, arguments}`` or a list of them) and
  ``observation``/``tool``. ``tools`` may be a JSON string (glaive / LLaMA-Factory).
- ``openai``: ``{messages: [{role, content, tool_calls?, reasoning_content?}], tools?}`` with roles
  system, user, assistant, tool. ``content`` is a string or a list of typed parts: OpenAI parts
  ``{type: "text", text}`` / ``{type: "image" | "image_url", ...}`` and LLaMA-Factory "v1" parts
  ``{type: "text" | "reasoning" | "tool_call", value}``.
- ``llava``: the text side of LLaVA-style records: any of the above plus ``image`` / ``images``
  (a path or a list of paths). ``<image>`` placeholders stay in the text; the image references are
  resolved (relative to the data file's folder, then its ``images/`` folder, as in lmms-finetune) and
  kept in ``Conversation.images`` in placeholder order. Pixels are loaded elsewhere.

Normalised message dicts follow the Hugging Face chat-template convention
(https://huggingface.co/docs/transformers/chat_templating): ``{"role", "content"}`` plus
``tool_calls = [{"type": "function", "function": {"name", "arguments": dict}}]`` and
``reasoning_content`` where present. Tools are OpenAI JSON-schema dicts
``{"type": "function", "function": {...}}``; bare ``{name, description, parameters}`` tools (glaive)
are wrapped into that form.

Every problem raises ``DataFormatError`` naming the file, the line (JSONL, 1-based) or the index
(JSON array / Parquet row / dataset row, 0-based) and the fix.

Text files are UTF-8 (a leading UTF-8 byte-order mark is accepted). JSONL is decoded line by line, so a
line that is not valid UTF-8 is one bad record (``reason="bad_encoding"``), skippable like malformed
JSON; in a ``.json`` array it makes the whole file unreadable.

Arrow-sourced records (Parquet files, HF ``datasets``) are cleaned of ``None``-valued keys, recursively
(``strip_arrow_nulls``): Arrow stores one struct type per column, the union of the keys of all rows,
and fills a key that a row lacks with ``None``; without the cleaning, every tool schema or tool-call
argument object would gain the other rows' keys as ``null`` and render differently from the JSONL
source. Consequence: an explicit ``null`` inside a Parquet / dataset row is indistinguishable from an
absent key and is dropped too; JSON / JSONL files and in-memory record lists keep every ``null``.
"""

from __future__ import annotations

import glob as _glob
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = [
    "DataFormatError",
    "Conversation",
    "RawRecord",
    "FORMATS",
    "IMAGE_PLACEHOLDER",
    "detect_format",
    "normalize_record",
    "expand_inputs",
    "iter_records",
    "strip_arrow_nulls",
]

FORMATS = ("alpaca", "sharegpt", "openai", "llava")
IMAGE_PLACEHOLDER = "<image>"

logger = logging.getLogger(__name__)
_BOM = b"\xef\xbb\xbf"

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "function_call": "function_call",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}
_OPENAI_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


class DataFormatError(ValueError):
    """A record (or file) that cannot be read or normalised.

    Attributes:
        source: file path or dataset name.
        index: 0-based record index (JSONL: line number - 1), or ``None`` for a whole-file problem.
        line: 1-based line number for JSONL inputs, else ``None``.
        reason: short machine-readable key (``"malformed_json"``, ``"unknown_format"``,
            ``"empty_conversation"``, ``"no_assistant_turn"``, ``"unknown_role"``,
            ``"bad_content_type"``, ``"bad_tool_call"``, ``"bad_tools"``, ``"missing_image"``,
            ``"image_placeholder_mismatch"``, ``"bad_input"``, ``"bad_encoding"`` (not UTF-8),
            ``"missing_key"`` (a forced format's key is absent), ``"empty_assistant_turn"``; from rendering: ``"template_error"``,
            ``"template_unsupported"``, ``"template_span_mismatch"``).
        fix: what the user should change.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        index: int | None = None,
        line: int | None = None,
        reason: str = "bad_record",
        fix: str = "",
    ) -> None:
        self.detail = message
        self.source = source
        self.index = index
        self.line = line
        self.reason = reason
        self.fix = fix
        where = source or "<input>"
        if line is not None:
            where += f", line {line}"
        elif index is not None:
            where += f", record {index}"
        text = f"{where}: {message}"
        if fix:
            text += f" Fix: {fix}"
        super().__init__(text)

    def __reduce__(self):
        # Rebuild from the original fields (not the formatted text) so the error crosses process
        # boundaries (DataLoader workers, Ray tasks) unchanged.
        kwargs = dict(source=self.source, index=self.index, line=self.line, reason=self.reason, fix=self.fix)
        return (_rebuild_data_format_error, (type(self), self.detail, kwargs))


def _rebuild_data_format_error(cls, message, kwargs):
    return cls(message, **kwargs)


@dataclass
class Conversation:
    """One normalised chat record.

    Attributes:
        messages: list of ``{"role", "content", "tool_calls"?, "reasoning_content"?}`` dicts
            (roles system, user, assistant, tool); ``content`` is always a ``str``.
        tools: OpenAI tool schemas passed to the chat template as ``tools=``, or ``None``.
        images: image references in placeholder order (resolved paths for file inputs, or the
            objects found in a dataset row, e.g. PIL images).
        source: file path or dataset name.
        index: 0-based record index in ``source`` (JSONL: line number - 1).
        id: the record's own ``id`` field if it has one, else ``None``.
        format: the detected / forced format name.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    images: list[Any] = field(default_factory=list)
    source: str | None = None
    index: int | None = None
    id: str | None = None
    format: str = ""


@dataclass
class RawRecord:
    """A raw input record with its provenance (``line`` is 1-based, JSONL only)."""

    data: Any
    source: str
    index: int
    line: int | None = None
    base_dir: Path | None = None
    error: DataFormatError | None = None  # set when the record itself could not be parsed


# --------------------------------------------------------------------------------------------- reading


class InMemoryRecords(list):
    """A list of record dicts given directly to ``prepare`` (source name ``"records"``)."""

    name = "records"


def expand_inputs(inputs: Any) -> list[Any]:
    """Expand ``inputs`` (a path, a glob, a ``datasets.Dataset``, a list of those, or a list of
    record dicts) to a list of ``Path`` objects, dataset objects and ``InMemoryRecords``, in the
    given order (globs sorted).

    A file reached twice (the same path given twice, a glob overlapping a path, a symlink to a file
    already listed) is read once, at its first position: later occurrences are dropped by real path
    (``os.path.realpath``) and logged at WARNING level on the ``seqpack.data.formats`` logger.

    Raises:
        FileNotFoundError: a path does not exist or a glob matches nothing.
        DataFormatError: a directory or a ``DatasetDict`` was given.
    """
    if isinstance(inputs, (str, os.PathLike)) or _is_dataset(inputs) or _is_dataset_dict(inputs):
        inputs = [inputs]
    if isinstance(inputs, InMemoryRecords):
        return [inputs]
    if isinstance(inputs, (list, tuple)) and inputs and all(
        isinstance(x, dict) and not _is_dataset_dict(x) for x in inputs
    ):
        return [InMemoryRecords(inputs)]
    out: list[Any] = []
    for item in inputs:
        if _is_dataset_dict(item):
            raise DataFormatError(
                f"got a DatasetDict with splits {list(item.keys())}, not a Dataset.",
                source="DatasetDict",
                reason="bad_input",
                fix="pass one split, e.g. ds['train'].",
            )
        if _is_dataset(item):
            out.append(item)
            continue
        s = os.fspath(item)
        if any(ch in s for ch in "*?["):
            matches = sorted(_glob.glob(s, recursive=True))
            if not matches:
                raise FileNotFoundError(f"input glob {s!r} matches no file. Fix: check the pattern and the cwd.")
            out.extend(Path(m) for m in matches if not Path(m).is_dir())
            continue
        p = Path(s)
        if p.is_dir():
            raise DataFormatError(
                "is a directory.",
                source=s,
                reason="bad_input",
                fix="pass data files (.json, .jsonl, .parquet) or a glob such as 'dir/*.jsonl'.",
            )
        if not p.exists():
            raise FileNotFoundError(f"input file {s!r} does not exist. Fix: check the path (cwd = {os.getcwd()}).")
        out.append(p)
    return _dedupe_paths(out)


def _dedupe_paths(items: list[Any], log: Callable[[str], None] | None = None) -> list[Any]:
    """Drop files whose real path was already listed (first occurrence wins); datasets are kept.

    Each dropped repeat is reported through ``log`` when given, else as a WARNING on this module's logger.
    """
    seen: dict[str, Path] = {}
    out: list[Any] = []
    for it in items:
        if isinstance(it, Path):
            real = os.path.realpath(it)
            if real in seen:
                if log is not None:
                    log(f"input {os.fspath(it)} is the same file as {os.fspath(seen[real])}; read once")
                else:
                    logger.warning(
                        "input %s is the same file as %s (listed twice, e.g. by a path and an overlapping "
                        "glob): read once", it, seen[real]
                    )
                continue
            seen[real] = it
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


def _is_dataset(obj: Any) -> bool:
    return _is_datasets_instance(obj, "Dataset", "IterableDataset")


def _is_dataset_dict(obj: Any) -> bool:
    return _is_datasets_instance(obj, "DatasetDict", "IterableDatasetDict")


def dataset_name(ds: Any) -> str:
    """A readable name for an HF dataset (its builder / dataset name, else ``"dataset"``)."""
    info = getattr(ds, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    return str(name) if name else "dataset"


def iter_records(item: Any) -> Iterator[RawRecord]:
    """Yield every record of one input (a ``Path`` or an HF dataset) as a ``RawRecord``.

    JSONL: one record per non-blank line (``index = line - 1``); a line that is not valid UTF-8 or
    not valid JSON yields a record carrying ``error`` (so it can be skipped and reported). JSON: a
    top-level array (a file that is really JSONL is read as JSONL). Parquet: one record per row.
    HF datasets: one per row. A leading UTF-8 BOM is ignored. Parquet / dataset rows go through
    ``strip_arrow_nulls`` (Arrow's ``None`` fill of absent struct keys is removed; see the module doc).

    Raises:
        DataFormatError: the whole file cannot be parsed (``.json`` that is not UTF-8 or not JSON),
            or the extension is unknown.
    """
    if isinstance(item, InMemoryRecords):
        for i, row in enumerate(item):
            yield RawRecord(row, item.name, i)
        return
    if _is_dataset(item):
        name = dataset_name(item)
        for i, row in enumerate(item):
            yield RawRecord(strip_arrow_nulls(row), name, i)
        return
    path = Path(item)
    src = str(path)
    suffix = path.suffix.lower()
    base = path.resolve().parent
    if suffix in (".jsonl", ".ndjson"):
        yield from _iter_jsonl(path, base)
    elif suffix == ".json":
        text = _decode_whole(path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data":  # a .json file holding JSON lines
                yield from _iter_jsonl(path, base)
                return
            raise DataFormatError(
                f"is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}).",
                source=src,
                line=e.lineno,
                reason="malformed_json",
                fix="repair the JSON (a JSON file must hold one array of records; use .jsonl for one record per line).",
            ) from None
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise DataFormatError(
                f"top-level JSON value is a {type(data).__name__}, expected an array of records.",
                source=src,
                reason="unknown_format",
                fix="store the records as a JSON array [{...}, {...}] or as JSONL.",
            )
        for i, rec in enumerate(data):
            yield RawRecord(rec, src, i, base_dir=base)
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
            fix="use .json (array), .jsonl or .parquet files, or load the data with `datasets` and pass the Dataset.",
        )


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


def _decode_whole(path: Path) -> str:
    """Read a whole text file as UTF-8 (a leading BOM is dropped); bad bytes raise with line/column."""
    data = path.read_bytes()
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataFormatError(
            f"is not valid UTF-8 (byte 0x{data[e.start]:02x} at line {line}, byte column {col}).",
            source=str(path),
            line=line,
            reason="bad_encoding",
            fix="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in.json > out.json`), "
            "or store the records as JSONL, where an undecodable line can be skipped with on_error='skip'.",
        ) from None


def _iter_jsonl(path: Path, base: Path) -> Iterator[RawRecord]:
    """One ``RawRecord`` per non-blank line; lines are split on ``\\n`` as bytes and decoded one by one,
    so bad UTF-8 or bad JSON on one line makes only that record carry an ``error``."""
    src = str(path)
    with open(path, "rb") as f:
        for lineno, raw_line in enumerate(f, start=1):
            if lineno == 1 and raw_line.startswith(_BOM):
                raw_line = raw_line[len(_BOM):]
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as e:
                err = DataFormatError(
                    f"not valid UTF-8 (byte 0x{raw_line[e.start]:02x} at byte column {e.start + 1}).",
                    source=src,
                    index=lineno - 1,
                    line=lineno,
                    reason="bad_encoding",
                    fix="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in.jsonl > out.jsonl`), "
                    "or repair / remove this line; on_error='skip' skips and reports it.",
                )
                yield RawRecord(None, src, lineno - 1, line=lineno, base_dir=base, error=err)
                continue
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                err = DataFormatError(
                    f"malformed JSON ({e.msg} at column {e.colno}).",
                    source=src,
                    index=lineno - 1,
                    line=lineno,
                    reason="malformed_json",
                    fix="repair or remove this line (each JSONL line must be one complete JSON object).",
                )
                yield RawRecord(None, src, lineno - 1, line=lineno, base_dir=base, error=err)
                continue
            yield RawRecord(rec, src, lineno - 1, line=lineno, base_dir=base)


# ------------------------------------------------------------------------------------------ normalising


def _get(d: dict, *keys: str) -> Any:
    """First non-None value among ``keys`` (Arrow/datasets rows fill absent struct fields with None)."""
    for k in keys:
        v = d.get(k)
        if v is not None:
            return v
    return None


def _present(rec: dict, key: str) -> bool:
    return key in rec and rec[key] is not None


def detect_format(rec: Any) -> str | None:
    """Return the format name of one record (``FORMATS``) or ``None`` when no format fits.

    A record with ``image``/``images`` and a ``conversations`` or ``messages`` list is ``"llava"``.
    """
    if not isinstance(rec, dict):
        return None
    has_img = (_present(rec, "image") or _present(rec, "images")) and not _empty_images(rec)
    if _present(rec, "messages"):
        return "llava" if has_img else "openai"
    if _present(rec, "conversations"):
        return "llava" if has_img else "sharegpt"
    if _present(rec, "instruction") and _present(rec, "output"):
        return "alpaca"
    return None


def _empty_images(rec: dict) -> bool:
    for key in ("images", "image"):
        v = rec.get(key)
        if v is None:
            continue
        if isinstance(v, (list, tuple)) and len(v) == 0:
            continue
        if isinstance(v, str) and v == "":
            continue
        return False
    return True


class _Ctx:
    """Provenance of the record being normalised (for error messages)."""

    def __init__(self, raw: RawRecord) -> None:
        self.raw = raw
        self.inline_images: list[Any] = []  # image references from typed content parts

    def err(self, message: str, reason: str, fix: str) -> DataFormatError:
        return DataFormatError(
            message, source=self.raw.source, index=self.raw.index, line=self.raw.line, reason=reason, fix=fix
        )


def normalize_record(raw: RawRecord, format: str | None = None) -> Conversation:
    """Normalise one raw record into a ``Conversation``.

    Args:
        raw: the record and its provenance.
        format: one of ``FORMATS`` to force, or ``None`` to detect (``detect_format``).

    Raises:
        DataFormatError: malformed JSON or bad UTF-8 (carried by ``raw``), unknown format, a key
            the forced ``format`` needs is missing, empty conversation, no assistant turn, an empty
            assistant turn (no text, tool calls or reasoning), unknown role, content of the wrong type, bad tool call JSON, missing
            image file, or a ``<image>`` count that differs from the number of images.
    """
    if raw.error is not None:
        raise raw.error
    ctx = _Ctx(raw)
    rec = raw.data
    if not isinstance(rec, dict):
        raise ctx.err(
            f"record is a {type(rec).__name__}, expected a JSON object.",
            "unknown_format",
            "each record must be an object such as {\"messages\": [...]} or {\"instruction\": ..., \"output\": ...}.",
        )
    fmt = format
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is not one of {FORMATS} (or None to detect per record)")
    detected = detect_format(rec)
    if fmt is None:
        fmt = detected
    if fmt is None:
        raise ctx.err(
            f"unknown record format (keys: {sorted(rec)[:12]}).",
            "unknown_format",
            "use alpaca {instruction, input, output}, sharegpt {conversations: [{from, value}]}, "
            "openai {messages: [{role, content}]} or LLaVA (one of those plus image/images); "
            "rename the columns to these keys.",
        )
    if format is not None:
        _check_forced_keys(rec, fmt, detected, ctx)
    if fmt == "alpaca":
        messages, tools = _from_alpaca(rec, ctx), None
    elif fmt in ("sharegpt", "openai", "llava"):
        if fmt == "llava":
            inner = "openai" if _present(rec, "messages") else "sharegpt"
        else:
            inner = fmt
        if inner == "sharegpt":
            messages = _from_sharegpt(rec, ctx)
        else:
            messages = _from_openai(rec, ctx)
        tools = _parse_tools(rec.get("tools"), ctx)
    else:  # pragma: no cover
        raise AssertionError(fmt)
    _check_conversation(messages, ctx)
    images = _images(rec, messages, ctx)
    rid = rec.get("id")
    return Conversation(
        messages=messages,
        tools=tools,
        images=images,
        source=raw.source,
        index=raw.index,
        id=None if rid is None else str(rid),
        format=fmt,
    )


_REQUIRED_KEYS = {
    "alpaca": (("instruction",), ("output",)),
    "sharegpt": (("conversations",),),
    "openai": (("messages",),),
    "llava": (("messages", "conversations"),),
}


def _check_forced_keys(rec: dict, fmt: str, detected: str | None, ctx: _Ctx) -> None:
    """A forced format's required key is absent (or ``None``): say which, and what the record looks like."""
    for alternatives in _REQUIRED_KEYS[fmt]:
        if any(_present(rec, k) for k in alternatives):
            continue
        key = " or ".join(repr(k) for k in alternatives)
        if detected is not None and detected != fmt:
            hint = f" (record looks like the {detected!r} format; use --format auto, or format=None in Python)"
            fix = f"use --format auto (format=None) to detect the format per record, or --format {detected}."
        else:
            hint = f" (record keys: {sorted(rec)[:12]})"
            fix = f"give every record the {fmt} key(s) {key}, or rename the column holding them."
        raise ctx.err(f"missing key {key} required by format {fmt!r}{hint}.", "missing_key", fix)


def _text(value: Any, ctx: _Ctx, what: str) -> str:
    if isinstance(value, str):
        return value
    raise ctx.err(
        f"{what} is a {type(value).__name__}, expected a string.",
        "bad_content_type",
        f"make {what} a string.",
    )


def _from_alpaca(rec: dict, ctx: _Ctx) -> list[dict]:
    msgs: list[dict] = []
    system = rec.get("system")
    if system:
        msgs.append({"role": "system", "content": _text(system, ctx, "'system'")})
    history = rec.get("history") or []
    if not isinstance(history, list):
        raise ctx.err("'history' must be a list of [query, response] pairs.", "bad_content_type", "fix 'history'.")
    for k, pair in enumerate(history):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ctx.err(
                f"'history[{k}]' must be a [query, response] pair.", "bad_content_type", "fix 'history'."
            )
        msgs.append({"role": "user", "content": _text(pair[0], ctx, f"'history[{k}][0]'")})
        msgs.append({"role": "assistant", "content": _text(pair[1], ctx, f"'history[{k}][1]'")})
    instruction = _text(rec.get("instruction"), ctx, "'instruction'")
    inp = rec.get("input")
    inp = "" if inp is None else _text(inp, ctx, "'input'")
    query = instruction + "\n" + inp if inp else instruction
    msgs.append({"role": "user", "content": query})
    msgs.append({"role": "assistant", "content": _text(rec.get("output"), ctx, "'output'")})
    return msgs


def _tool_calls_from_json(value: Any, ctx: _Ctx, where: str) -> list[dict]:
    """Parse a ``function_call`` / v1 ``tool_call`` value (JSON ``{name, arguments}`` or a list)."""
    obj = value
    if isinstance(value, str):
        try:
            obj = json.loads(value)
        except json.JSONDecodeError as e:
            raise ctx.err(
                f"{where} is not valid JSON ({e.msg}).",
                "bad_tool_call",
                'a tool call must be JSON {"name": ..., "arguments": {...}}.',
            ) from None
    calls = obj if isinstance(obj, list) else [obj]
    out = []
    for c in calls:
        if isinstance(c, dict) and isinstance(c.get("function"), dict):
            c = c["function"]
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise ctx.err(
                f"{where} has no string 'name'.",
                "bad_tool_call",
                'a tool call must be JSON {"name": ..., "arguments": {...}}.',
            )
        out.append({"type": "function", "function": {"name": c["name"], "arguments": _arguments(c.get("arguments"))}})
    return out


def _arguments(args: Any) -> Any:
    """Tool-call arguments as a dict when they are a JSON object string (HF convention), else as given."""
    if args is None:
        return {}
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            return args
        return parsed if isinstance(parsed, dict) else args
    return args


def _append_assistant_calls(msgs: list[dict], calls: list[dict]) -> None:
    """Attach tool calls to the preceding assistant message (one turn) or start a new turn."""
    if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
        msgs[-1]["tool_calls"] = calls
    else:
        msgs.append({"role": "assistant", "content": "", "tool_calls": calls})


def _from_sharegpt(rec: dict, ctx: _Ctx) -> list[dict]:
    turns = rec.get("conversations")
    if not isinstance(turns, list):
        raise ctx.err(
            f"'conversations' is a {type(turns).__name__}, expected a list of {{from, value}} turns.",
            "bad_content_type",
            "make 'conversations' a list.",
        )
    msgs: list[dict] = []
    for key in ("system", "system_prompt"):
        if rec.get(key):
            msgs.append({"role": "system", "content": _text(rec[key], ctx, f"'{key}'")})
            break
    for k, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ctx.err(f"conversations[{k}] is not an object.", "bad_content_type", "each turn is {from, value}.")
        frm = _get(t, "from", "role")
        role = _SHAREGPT_ROLES.get(frm) if isinstance(frm, str) else None
        if role is None:
            raise ctx.err(
                f"conversations[{k}] has unknown role {frm!r}.",
                "unknown_role",
                f"use one of {sorted(_SHAREGPT_ROLES)}.",
            )
        value = _get(t, "value", "content")
        if role == "function_call":
            _append_assistant_calls(msgs, _tool_calls_from_json(value, ctx, f"conversations[{k}] (function_call)"))
            continue
        content = _text(value, ctx, f"conversations[{k}].value")
        msgs.append({"role": role, "content": content})
    return msgs


def _from_openai(rec: dict, ctx: _Ctx) -> list[dict]:
    raw_msgs = rec.get("messages")
    if not isinstance(raw_msgs, list):
        raise ctx.err(
            f"'messages' is a {type(raw_msgs).__name__}, expected a list of {{role, content}}.",
            "bad_content_type",
            "make 'messages' a list.",
        )
    msgs: list[dict] = []
    if rec.get("system") and not (raw_msgs and isinstance(raw_msgs[0], dict) and raw_msgs[0].get("role") == "system"):
        msgs.append({"role": "system", "content": _text(rec["system"], ctx, "'system'")})
    for k, m in enumerate(raw_msgs):
        if not isinstance(m, dict):
            raise ctx.err(f"messages[{k}] is not an object.", "bad_content_type", "each message is {role, content}.")
        role = m.get("role")
        if role not in _OPENAI_ROLES:
            raise ctx.err(
                f"messages[{k}] has unknown role {role!r}.",
                "unknown_role",
                f"use one of {sorted(_OPENAI_ROLES)}.",
            )
        role = {"developer": "system", "function": "tool"}.get(role, role)
        text, reasoning, calls = _content_parts(m.get("content"), ctx, f"messages[{k}].content")
        out: dict[str, Any] = {"role": role, "content": text}
        if m.get("reasoning_content") is not None:
            reasoning.insert(0, _text(m["reasoning_content"], ctx, f"messages[{k}].reasoning_content"))
        if reasoning:
            if role != "assistant":
                raise ctx.err(
                    f"messages[{k}] ({role}) has reasoning content.", "bad_content_type",
                    "only assistant messages may carry reasoning.",
                )
            out["reasoning_content"] = "\n".join(reasoning)
        if m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise ctx.err(f"messages[{k}].tool_calls must be a list.", "bad_content_type", "fix tool_calls.")
            calls = _tool_calls_from_json(m["tool_calls"], ctx, f"messages[{k}].tool_calls") + calls
        if calls:
            if role != "assistant":
                raise ctx.err(
                    f"messages[{k}] ({role}) has tool calls.", "bad_content_type",
                    "only assistant messages may carry tool calls.",
                )
            out["tool_calls"] = calls
        if role == "tool" and isinstance(m.get("name"), str):
            out["name"] = m["name"]
        if role == "tool" and m.get("tool_call_id") is not None:
            out["tool_call_id"] = m["tool_call_id"]
        msgs.append(out)
    return msgs


def _content_parts(content: Any, ctx: _Ctx, where: str) -> tuple[str, list[str], list[dict]]:
    """Split message content into (text, reasoning parts, tool calls). Image parts become ``<image>``."""
    if content is None:
        return "", [], []
    if isinstance(content, str):
        return content, [], []
    if not isinstance(content, list):
        raise ctx.err(
            f"{where} is a {type(content).__name__}, expected a string or a list of typed parts.",
            "bad_content_type",
            "make content a string or a list like [{\"type\": \"text\", \"text\": ...}].",
        )
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ctx.err(f"{where}[{j}] is not a typed part.", "bad_content_type", "each part needs a 'type'.")
        ptype = part["type"]
        if ptype == "text":
            texts.append(_text(_get(part, "text", "value"), ctx, f"{where}[{j}].text"))
        elif ptype in ("reasoning", "thinking"):
            reasoning.append(_text(_get(part, "value", "text", "thinking"), ctx, f"{where}[{j}].value"))
        elif ptype == "tool_call":
            calls.extend(_tool_calls_from_json(part.get("value"), ctx, f"{where}[{j}].value"))
        elif ptype in ("image", "image_url"):
            ref = _get(part, "image", "image_url", "url", "value")
            if isinstance(ref, dict):
                ref = _get(ref, "url", "path") or ref
            if ref is None:
                raise ctx.err(
                    f"{where}[{j}] is an image part without a reference.",
                    "bad_content_type",
                    "give image parts an 'image' path or an 'image_url': {'url': ...}.",
                )
            ctx.inline_images.append(ref)
            texts.append(IMAGE_PLACEHOLDER)
        else:
            raise ctx.err(
                f"{where}[{j}] has unknown part type {ptype!r}.",
                "bad_content_type",
                "use part types text, reasoning, tool_call, image or image_url.",
            )
    return "".join(texts), reasoning, calls


def _parse_tools(tools: Any, ctx: _Ctx) -> list[dict] | None:
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise ctx.err(
                f"'tools' is not valid JSON ({e.msg}).", "bad_tools", "store tools as a JSON list of function schemas."
            ) from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise ctx.err(f"'tools' is a {type(tools).__name__}, expected a list.", "bad_tools", "make 'tools' a list.")
    out = []
    for t in tools:
        if not isinstance(t, dict):
            raise ctx.err("a tool is not an object.", "bad_tools", "each tool is a JSON schema object.")
        if t.get("function") is not None or t.get("type") not in (None, "function"):
            out.append(t)
        else:
            out.append({"type": "function", "function": t})
    return out or None


def _check_conversation(msgs: list[dict], ctx: _Ctx) -> None:
    if not msgs or all(m["role"] == "system" for m in msgs):
        raise ctx.err(
            "empty conversation (no user or assistant turn).",
            "empty_conversation",
            "remove the record or add its turns.",
        )
    if not any(m["role"] == "assistant" for m in msgs):
        raise ctx.err(
            "no assistant turn, so there is nothing to train on.",
            "no_assistant_turn",
            "add an assistant turn (gpt / assistant / output) or remove the record.",
        )
    turn = 0
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        turn += 1
        if m["content"].strip() or m.get("tool_calls") or (m.get("reasoning_content") or "").strip():
            continue
        raise ctx.err(
            f"assistant turn {turn} (message {k} of the normalised conversation, 0-based) is empty: content "
            f"{m['content']!r}, no tool calls, no reasoning; it would train only on the template's end-of-turn "
            "tokens.",
            "empty_assistant_turn",
            "give the assistant turn its text (or tool_calls), or remove the record; on_error='skip' skips "
            "and reports it.",
        )


def _images(rec: dict, msgs: list[dict], ctx: _Ctx) -> list[Any]:
    refs: list[Any] = []
    for key in ("images", "image"):
        v = rec.get(key)
        if v is None or (isinstance(v, str) and v == ""):
            continue
        refs.extend(v if isinstance(v, (list, tuple)) else [v])
    if refs and ctx.inline_images:
        raise ctx.err(
            "the record has both an image/images column and image parts inside messages.",
            "image_placeholder_mismatch",
            "use one way to give images: either the images column with '<image>' placeholders, or image parts.",
        )
    refs = refs or list(ctx.inline_images)
    n_ph = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in msgs)
    if not refs:
        return []
    if n_ph != len(refs):
        raise ctx.err(
            f"{len(refs)} image(s) but {n_ph} '{IMAGE_PLACEHOLDER}' placeholder(s) in the text.",
            "image_placeholder_mismatch",
            f"put exactly one '{IMAGE_PLACEHOLDER}' in the text for each image, in order.",
        )
    out: list[Any] = []
    for r in refs:
        if isinstance(r, dict) and isinstance(r.get("path"), str) and not r.get("bytes"):
            r = r["path"]
        if isinstance(r, (str, os.PathLike)):
            out.append(_resolve_image(os.fspath(r), ctx))
        else:
            out.append(r)  # PIL image or {bytes, path} from a datasets Image column
    return out


def _resolve_image(ref: str, ctx: _Ctx) -> str:
    if ref.startswith(("data:", "http://", "https://", "s3://", "gs://", "hf://")):
        return ref  # URLs and data URIs are kept as given (loaded by the media stage)
    base = ctx.raw.base_dir
    candidates = [Path(ref)] if Path(ref).is_absolute() or base is None else [base / ref, base / "images" / ref]
    if base is None and not Path(ref).is_absolute():
        candidates = [Path(ref).resolve()]
    for c in candidates:
        if c.is_file():
            return str(c)
    raise ctx.err(
        f"image {ref!r} not found (looked at {', '.join(str(c) for c in candidates)}).",
        "missing_image",
        "make image paths relative to the data file's folder (or its images/ folder) or absolute.",
    )
