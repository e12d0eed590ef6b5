"""Read ``.json`` and ``.jsonl`` files into ``RawRecord`` s (``seqpack.data.sources.iter_records`` dispatches here).

Text is UTF-8 (a leading UTF-8 byte-order mark is accepted; UTF-16 / UTF-32 text is refused as a whole).

JSONL is split into lines as bytes and decoded line by line, so a line that is not valid UTF-8 or not
valid JSON is one bad record (it carries ``error``; ``on_error="skip"`` lists it). Lines end with LF or
CRLF; a file whose first line ends with a lone CR (classic Mac OS) is split like Python's universal
newlines (CR, LF and CRLF), so its line numbers are those an editor shows. A ``.jsonl`` file that holds
one JSON document spread over several lines (a pretty-printed array, or objects written with
``indent=``) is refused as a whole, naming the fix, instead of reporting every line as malformed.

An empty file (0 bytes, or only whitespace) holds no record, ``.json`` and ``.jsonl`` alike
(:func:`is_blank_file`). A ``.json`` file holds one top-level array of records, or one record object (one that
has a record key, :data:`~seqpack.data.records.RECORD_KEYS`); any other top-level object, such as a wrapper
``{"data": [...]}``, is refused as a whole, naming its keys (seqpack does not guess which key holds the
records; the fix names the ``jq`` command that extracts an array of records). A ``.json`` file holding
JSON Lines (its first line one complete object, more values on the following lines) is read as JSONL;
any other text after the top-level value is refused, naming where it starts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from seqpack.data.records import RECORD_KEYS, DataFormatError, RawRecord, json_kind

__all__ = ["is_blank_file", "iter_json", "iter_jsonl", "jsonl_lines"]

_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20
_JSON_SPACE = " \t\r\n"  # the whitespace JSON allows between values (RFC 8259)


def jsonl_lines(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw bytes)`` of every line of the binary file ``f`` read from its start (1-based;
    each line keeps its line end). Lines end with LF (CRLF lines keep their CR, which JSON reads as
    whitespace); when the first line ends with a lone CR, lines are split on CR, LF and CRLF alike
    (``bytes.splitlines``)."""
    if not _lone_cr_first(f):
        yield from enumerate(f, start=1)
        return
    lineno, carry = 0, b""
    while chunk := f.read(_CHUNK):
        lines = (carry + chunk).splitlines(keepends=True)
        carry = lines.pop()  # maybe incomplete, or a CR whose LF is in the next chunk
        for line in lines:
            lineno += 1
            yield lineno, line
    if carry:
        yield lineno + 1, carry


def _lone_cr_first(f: BinaryIO) -> bool:
    """Whether the first line end of ``f`` is a CR not followed by LF (``f`` is rewound to its start)."""
    f.seek(0)
    try:
        while chunk := f.read(1 << 16):
            lf, cr = chunk.find(b"\n"), chunk.find(b"\r")
            if cr < 0 or 0 <= lf < cr:
                if lf >= 0:
                    return False
                continue
            return (chunk[cr + 1:cr + 2] or f.read(1)) != b"\n"
        return False
    finally:
        f.seek(0)


def iter_jsonl(path: Path, base: Path) -> Iterator[RawRecord]:
    """One ``RawRecord`` per non-blank line of a JSONL file (``index = line - 1``, ``line`` 1-based,
    ``base_dir=base``); a line that is not valid UTF-8 or not valid JSON yields a record carrying ``error``.

    Raises:
        DataFormatError: the file is UTF-16 / UTF-32 (``"bad_encoding"``), or it holds JSON written over
            several lines (``"malformed_json"``): its first non-blank line is an unfinished JSON text (``[``,
            ``{``, ``[{"messages": [`` ...) and the next non-blank line is not valid JSON either, as in a
            pretty-printed file. An unfinished first line followed by a valid one is one bad record.
    """
    src = str(path)
    with open(path, "rb") as f:
        refuse_wide_encoding(path, f.read(4))
        held: tuple[RawRecord, str] | None = None  # an unfinished first line, until the next line tells
        first = True
        for lineno, raw_line in jsonl_lines(f):
            rec, unfinished = _line_record(src, base, lineno, raw_line.removeprefix(_BOM) if lineno == 1 else raw_line)
            del raw_line  # while the record is prepared, only its parsed copy stays in memory
            if rec is None:
                continue
            if held is not None:
                if rec.error is not None and rec.error.reason == "malformed_json":
                    _refuse_multiline_json(path, held[0].line, held[1])
                yield held[0]
                held = None
            elif first and unfinished is not None:
                held, first = (rec, unfinished), False
                continue
            first = False
            yield rec
        if held is not None:
            yield held[0]


def _line_record(src: str, base: Path, lineno: int, raw_line: bytes) -> tuple[RawRecord | None, str | None]:
    """The record of one JSONL line (``None`` for a blank line) and, when the line is JSON text that ends
    before its value does (the parser ran out of input: ``[``, ``{"a": [``), that text, stripped."""
    try:
        line = raw_line.decode("utf-8")
    except UnicodeDecodeError as e:
        err = DataFormatError(
            f"not valid UTF-8 (byte 0x{raw_line[e.start]:02x} at byte column {e.start + 1}).",
            source=src, index=lineno - 1, line=lineno, reason="bad_encoding",
            fix="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in.jsonl > out.jsonl`), "
            "or repair / remove this line; on_error='skip' skips and reports it.",
        )
        return RawRecord(None, src, lineno - 1, line=lineno, base_dir=base, error=err), None
    if not line.strip():
        return None, None
    try:
        return RawRecord(json.loads(line), src, lineno - 1, line=lineno, base_dir=base), None
    except (ValueError, RecursionError) as e:
        err = DataFormatError(
            f"malformed JSON ({json_problem(e)}).", source=src, index=lineno - 1, line=lineno,
            reason="malformed_json",
            fix="repair or remove this line (each JSONL line must be one complete JSON object).",
        )
        text = line.strip()
        ran_out = isinstance(e, json.JSONDecodeError) and e.pos >= len(line.rstrip())
        return RawRecord(None, src, lineno - 1, line=lineno, base_dir=base, error=err), text if ran_out else None


def _refuse_multiline_json(path: Path, lineno: int | None, text: str) -> None:
    """Raise for a JSONL file holding JSON written over several lines; ``text`` is its first non-blank line
    (line ``lineno``), an unfinished JSON text: an array opened there is a JSON array file, else an object
    written with ``indent=``."""
    if text.startswith("["):
        what = "a JSON array written over several lines"
        fix = (f"rename it to {path.stem}.json (a .json file is read whole: one array of records, or one record), "
               f"or write one record per line: `jq -c '.[]' {path.name} > {path.stem}.lines.jsonl`.")
    else:
        what = "JSON records written over several lines"
        fix = (f"write one record per line: `jq -c . {path.name} > {path.stem}.lines.jsonl` (one line per "
               f"object); a file holding one JSON array, or one record, may instead be renamed {path.stem}.json.")
    raise DataFormatError(
        f"looks like {what} (pretty-printed JSON: line {lineno} is {text[:40]!r}, the start of a JSON value "
        "that goes on over the next lines), not JSON Lines, where each line is one complete record.",
        source=str(path), line=lineno, reason="malformed_json", fix=fix,
    )


def is_blank_file(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` holds nothing but whitespace (0 bytes, blank lines; a leading UTF-8 BOM
    aside): an empty file, whose records are none. Reads only up to its first other byte."""
    with open(path, "rb") as f:
        first = True
        while chunk := f.read(_CHUNK):
            if (chunk.removeprefix(_BOM) if first else chunk).strip(_JSON_SPACE.encode()):
                return False
            first = False
    return True


def iter_json(path: Path, base: Path, on_count: Callable[[int], None] | None = None) -> Iterator[RawRecord]:
    """The records of a ``.json`` file: the elements of its top-level array (``index`` 0-based), or the one
    record it holds (a top-level object with a record key); none for an empty file (0 bytes or only whitespace, as a ``.jsonl``
    file); ``on_count(n)`` is called once the array is parsed. A file of JSON Lines (first line one complete
    object) is read as :func:`iter_jsonl`.

    Raises:
        DataFormatError: the file is not UTF-8 (``"bad_encoding"``), not valid JSON, or has text after
            its top-level value (``"malformed_json"``, naming the line and column), or its top-level value
            is not an array or a record object (``"unknown_format"``; a wrapper object ``{"data": [...]}`` names
            the ``jq`` command that extracts the array).
    """
    src = str(path)
    text = decode_whole(path)
    if not text.strip(_JSON_SPACE):  # an empty file: no record, as an empty .jsonl (the caller names it)
        if on_count is not None:
            on_count(0)
        return
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        if getattr(e, "msg", None) != "Extra data":
            raise DataFormatError(
                f"is not valid JSON ({json_problem(e, with_line=True)}).", source=src,
                line=getattr(e, "lineno", None), reason="malformed_json",
                fix="repair the JSON (a JSON file must hold one array of records; use .jsonl for one record per "
                "line).",
            ) from None
        head = text[:e.pos].strip()
        if not head.startswith("{") or "\n" in head or "\r" in head:
            raise _trailing_data(path, text, e) from None
        del text  # a .json file holding JSON lines: its first line is one complete object
        yield from iter_jsonl(path, base)
        return
    del text  # the parsed records hold their own strings: one copy of a large file, not two
    if isinstance(data, dict):
        if not any(k in data for k in RECORD_KEYS):
            raise _not_an_array(path, data)
        data = [data]
    if not isinstance(data, list):
        raise DataFormatError(
            f"top-level JSON value is {json_kind(data)}, expected an array of records.", source=src,
            reason="unknown_format", fix="store the records as a JSON array [{...}, {...}] or as JSONL.",
        )
    if on_count is not None:
        on_count(len(data))
    for i, rec in enumerate(data):
        yield RawRecord(rec, src, i, base_dir=base)


def _not_an_array(path: Path, obj: dict) -> DataFormatError:
    """The error for a ``.json`` file whose top-level value is an object that is no record (no
    :data:`~seqpack.data.records.RECORD_KEYS`): a wrapper such as ``{"data": [...]}``. The keys holding a
    list of objects are named, with the ``jq`` command that extracts the first one."""
    what = f"an object with keys {sorted(obj)[:12]}" if obj else "an empty object {}"
    lists = [k for k, v in obj.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
    if lists:
        key = lists[0]
        sel = f".{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else f".[{json.dumps(key)}]"
        sel = f"'{sel}'" if "'" not in sel else shlex.quote(sel)  # quoted for the shell, as jq filters are
        others = f"; arrays of objects are also under {lists[1:6]}" if len(lists) > 1 else ""
        fix = (f"extract the records: `jq {sel} {shlex.quote(path.name)} > "
               f"{shlex.quote(path.stem + '.records.json')}` (the array under {key!r}{others}), and pack that file.")
    else:
        fix = ("store the records as a JSON array [{...}, {...}], or as JSON Lines (.jsonl, one record per line); "
               f"a file of one record object needs one of the record keys {', '.join(RECORD_KEYS)}.")
    return DataFormatError(
        f"a JSON file must hold one array of records (or use JSON Lines); this file's top level is {what}.",
        source=str(path), reason="unknown_format", fix=fix,
    )


def _trailing_data(path: Path, text: str, e: json.JSONDecodeError) -> DataFormatError:
    """The error for a ``.json`` file whose top-level value is followed by more text (``e``: "Extra data")."""
    head = text[:e.pos].rstrip()
    end_line = head.count("\n") + 1
    end_col = len(head) - (head.rfind("\n") + 1)
    kind = "array" if head.lstrip().startswith("[") else "object" if head.lstrip().startswith("{") else "value"
    snippet = text[e.pos:e.pos + 30].splitlines()[0]  # e.pos is the first character after the value's whitespace
    return DataFormatError(
        f"has text after its top-level JSON {kind}: the {kind} ends at line {end_line}, column {end_col}, and "
        f"{snippet!r} follows at line {e.lineno}, column {e.colno}.",
        source=str(path), line=e.lineno, reason="malformed_json",
        fix="delete what follows the top-level value (a .json file holds one array of records), or store the "
        "records as JSONL, one complete record per line.",
    )


def refuse_wide_encoding(path: Path, head: bytes) -> None:
    """Refuse a UTF-16 / UTF-32 file (``head``: its first 4 bytes) as one whole-file error, before its NUL
    bytes make every line look like a bad record. The encoding is told by the BOM or, without one, by the
    NUL-byte pattern of the first ASCII characters (RFC 4627, section 3; ``json.detect_encoding``).

    Raises:
        DataFormatError: ``reason="bad_encoding"``, with the ``iconv`` command that converts the file.
    """
    enc = json.detect_encoding(head) if len(head) >= 2 else "utf-8"
    if enc.replace("-sig", "") == "utf-8":
        return
    iconv = enc.upper().replace("-LE", "LE").replace("-BE", "BE")  # iconv's names: UTF-16, UTF-16LE, ...
    raise DataFormatError(
        f"is {enc.upper()} text; seqpack reads UTF-8 only.",
        source=str(path),
        reason="bad_encoding",
        fix=f"convert it: `iconv -f {iconv} -t UTF-8 {path.name} > {path.stem}.utf8{path.suffix}` "
        f"(or in Python: `open(out, 'w', encoding='utf-8').write(open(src, encoding='{enc}').read())`).",
    )


def decode_whole(path: Path) -> str:
    """Read a whole text file as UTF-8 (a leading BOM is dropped).

    Raises:
        DataFormatError: UTF-16 / UTF-32 text, or bytes that are not UTF-8 (naming their line and column).
    """
    data = path.read_bytes()
    refuse_wide_encoding(path, data[:4])
    data = data.removeprefix(_BOM)
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


def json_problem(e: BaseException, *, with_line: bool = False) -> str:
    """What is wrong with a JSON text, for a message: the decoder's complaint and column, nesting too deep
    for Python's parser, or an integer too long to convert (CPython's 4300-digit limit)."""
    if isinstance(e, json.JSONDecodeError):
        if e.msg.startswith("Invalid control character") and e.doc[e.pos:e.pos + 1] in ("\n", "\r"):
            msg = "a line break inside a string: the text ends before the string does (cut off?)"
        else:
            msg = e.msg.removesuffix(" at")  # "Invalid control character at" is the decoder's whole text
        return f"{msg} at line {e.lineno}, column {e.colno}" if with_line else f"{msg} at column {e.colno}"
    if isinstance(e, RecursionError):
        return "nested too deeply for the JSON parser"
    if "integer string conversion" in str(e):
        return "an integer with more than 4300 digits"
    return str(e)
