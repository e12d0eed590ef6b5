"""Normalise raw chat records into ``Conversation`` (record formats detected per record, or forced).

One module per format: ``alpaca``, ``sharegpt``, ``openai``, ``llava`` (their docstrings describe the
records). Normalised message dicts follow the Hugging Face chat-template convention
(https://huggingface.co/docs/transformers/chat_templating): ``{"role", "content"}`` plus
``tool_calls = [{"type": "function", "function": {"name", "arguments": dict}}]`` and
``reasoning_content`` where present. Tools are OpenAI JSON-schema dicts
``{"type": "function", "function": {...}}``; bare ``{name, description, parameters}`` tools (glaive)
are wrapped into that form. Reading files is ``seqpack.data.sources``; the record types are in
``seqpack.data.records`` (both re-exported here).
"""

from __future__ import annotations

from typing import Any

from seqpack.data.formats._common import _check_conversation, _Ctx, _parse_tools, _present
from seqpack.data.formats.alpaca import from_alpaca
from seqpack.data.formats.llava import has_images, record_images
from seqpack.data.formats.openai import from_openai
from seqpack.data.formats.sharegpt import from_sharegpt
from seqpack.data.media_root import MediaRoot
from seqpack.data.records import Conversation, DataFormatError, IMAGE_PLACEHOLDER, RawRecord, json_kind
from seqpack.data.sources import InMemoryRecords, expand_inputs, iter_records, strip_arrow_nulls

__all__ = [
    "DataFormatError",
    "Conversation",
    "RawRecord",
    "FORMATS",
    "IMAGE_PLACEHOLDER",
    "InMemoryRecords",
    "detect_format",
    "normalize_record",
    "expand_inputs",
    "iter_records",
    "strip_arrow_nulls",
]

FORMATS = ("alpaca", "sharegpt", "openai", "llava")


def detect_format(rec: Any) -> str | None:
    """Return the format name of one record (``FORMATS``) or ``None`` when no format fits.

    A record with ``image``/``images`` and a ``conversations`` or ``messages`` list is ``"llava"``.
    """
    if not isinstance(rec, dict):
        return None
    has_img = (_present(rec, "image") or _present(rec, "images")) and has_images(rec)
    if _present(rec, "messages"):
        return "llava" if has_img else "openai"
    if _present(rec, "conversations"):
        return "llava" if has_img else "sharegpt"
    if _present(rec, "instruction") and _present(rec, "output"):
        return "alpaca"
    return None


def normalize_record(raw: RawRecord, format: str | None = None, media: MediaRoot | None = None) -> Conversation:
    """Normalise one raw record into a ``Conversation``.

    Args:
        raw: the record and its provenance.
        format: one of ``FORMATS`` to force, or ``None`` to detect (``detect_format``).
        media: where image references may point (``seqpack.data.media_root.MediaRoot``; default: inside
            the record's data folder, ``raw.base_dir``).

    Raises:
        DataFormatError: malformed JSON or bad UTF-8 (carried by ``raw``), unknown format, a key
            the forced ``format`` needs is missing (``"missing_key"``) or JSON null (``"bad_content_type"``,
            as when detected), empty conversation, no assistant turn, an empty
            assistant turn (no text, tool calls or reasoning), unknown role, content of the wrong type, bad tool call JSON, missing
            image file, an image outside the media root (``"media_outside_root"``), or a ``<image>``
            count that differs from the number of images.
    """
    if raw.error is not None:
        raise raw.error
    ctx = _Ctx(raw, media)
    rec = raw.data
    if not isinstance(rec, dict):
        raise ctx.err(
            f"record is {json_kind(rec)}, expected a JSON object.",
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
        _near_miss(rec, ctx)
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
        messages, tools = from_alpaca(rec, ctx), None
    elif fmt in ("sharegpt", "openai", "llava"):
        if fmt == "llava":
            inner = "openai" if _present(rec, "messages") else "sharegpt"
        else:
            inner = fmt
        if inner == "sharegpt":
            messages = from_sharegpt(rec, ctx)
        else:
            messages = from_openai(rec, ctx)
        tools = _parse_tools(rec.get("tools"), ctx)
    else:  # pragma: no cover
        raise AssertionError(fmt)
    _check_conversation(messages, ctx)
    images = record_images(rec, messages, ctx)
    rid = rec.get("id")
    return Conversation(
        messages=messages,
        tools=tools,
        images=images,
        source=raw.source,
        index=raw.index,
        id=None if rid is None else str(rid),
        format=fmt,
        line=raw.line,
    )


_REQUIRED_KEYS = {
    "alpaca": (("instruction",), ("output",)),
    "sharegpt": (("conversations",),),
    "openai": (("messages",),),
    "llava": (("messages", "conversations"),),
}


#: What a format's required key holds (named when the key is JSON null).
_KEY_HOLDS = {"messages": "a list of messages", "conversations": "a list of messages", "instruction": "a string",
              "output": "a string"}


def _null_key_error(key: str, fmt: str, ctx: _Ctx, detected: str | None = None) -> DataFormatError:
    """The error for a record whose required ``key`` is present but JSON null, the same whether ``fmt`` was
    detected or forced: reason ``"bad_content_type"`` (a null value is the wrong type, not a missing key).
    ``detected``: the format the record looks like, named in the fix when it is not ``fmt``."""
    holds = _KEY_HOLDS[key]
    both = "; a record needs both 'instruction' and 'output'" if fmt == "alpaca" else ""
    fix = f"give '{key}' {holds}, or remove the record; on_error='skip' skips and reports it."
    if detected is not None and detected != fmt:
        fix += f" The record looks like the {detected!r} format: use --format auto (format=None in Python)."
    return ctx.err(f"'{key}' is JSON null, expected {holds} ({fmt} format{both}).", "bad_content_type", fix)


def _near_miss(rec: dict, ctx: _Ctx) -> None:
    """A record no format fits that still uses a format's keys: its conversation key is null, one of
    alpaca's two keys is null (the other given or null too), or one of them is missing. Raises the error
    that names that key (else returns)."""
    for key, fmt in (("messages", "openai"), ("conversations", "sharegpt")):
        if key in rec:  # present but null (a non-null value would have been detected)
            raise _null_key_error(key, fmt, ctx)
    has = [k for k in ("instruction", "output") if _present(rec, k)]
    nulls = [k for k in ("instruction", "output") if k in rec and rec[k] is None]
    if nulls and (has or len(nulls) == 2):
        raise _null_key_error(nulls[0], "alpaca", ctx)
    if len(has) == 1:
        other = "output" if has == ["instruction"] else "instruction"
        raise ctx.err(f"'{other}' is missing; an alpaca record needs both 'instruction' and 'output' (record keys: "
                      f"{sorted(rec)[:12]}).", "missing_key", f"rename the column holding the {other} text to "
                      f"'{other}' (e.g. Dolly's 'response' is 'output'), give the record its '{other}', or remove "
                      "it; on_error='skip' skips and reports it.")


def _check_forced_keys(rec: dict, fmt: str, detected: str | None, ctx: _Ctx) -> None:
    """A forced format's required key is absent (reason ``"missing_key"``) or JSON null
    (:func:`_null_key_error`): say which, and what the record looks like."""
    for alternatives in _REQUIRED_KEYS[fmt]:
        if any(_present(rec, k) for k in alternatives):
            continue
        null = next((k for k in alternatives if k in rec), None)
        if null is not None:
            raise _null_key_error(null, fmt, ctx, detected)
        key = " or ".join(repr(k) for k in alternatives)
        if detected is not None and detected != fmt:
            hint = f" (record looks like the {detected!r} format; use --format auto, or format=None in Python)"
            fix = f"use --format auto (format=None) to detect the format per record, or --format {detected}."
        else:
            hint = f" (record keys: {sorted(rec)[:12]})"
            fix = f"give every record the {fmt} key(s) {key}, or rename the column holding them."
        raise ctx.err(f"missing key {key} required by format {fmt!r}{hint}.", "missing_key", fix)
