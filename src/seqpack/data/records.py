"""The record types shared by the readers (``seqpack.data.sources``) and the format normalisers
(``seqpack.data.formats``): the raw record with its provenance, the normalised ``Conversation``, the
error every bad input raises, and the image placeholder text.

Every problem raises ``DataFormatError`` naming the file, the line (JSONL, 1-based) or the index
(JSON array / Parquet row / dataset row, 0-based) and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["IMAGE_PLACEHOLDER", "RECORD_KEYS", "Conversation", "DataFormatError", "RawRecord"]

#: The text that stands for one image in a record (LLaVA / LLaMA-Factory convention).
IMAGE_PLACEHOLDER = "<image>"

#: The keys ``seqpack.data.formats.detect_format`` tells a record's format by (openai ``messages``, sharegpt /
#: LLaVA ``conversations``, alpaca ``instruction`` + ``output``): an object holding none of them is no record of
#: any format (a ``.json`` file's top-level object without them is a wrapper, refused by ``seqpack.data.json_files``).
RECORD_KEYS = ("messages", "conversations", "instruction", "output")


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
            ``"missing_key"`` (a forced format's key is absent, or one of alpaca's two; a key holding JSON null
            is ``"bad_content_type"``, detected or forced), ``"empty_assistant_turn"``; from rendering: ``"template_error"``,
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


def json_kind(value: Any) -> str:
    """A parsed JSON value's type in JSON's words, with its article, for messages: ``"a JSON number"``,
    ``"a JSON array"``, ``"JSON null"`` ... (other Python objects: ``"a <type name>"``)."""
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, (int, float)):
        return "a JSON number"
    kind = {str: "string", list: "array", dict: "object"}.get(type(value))
    return f"a JSON {kind}" if kind else f"a {type(value).__name__}"


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
        line: 1-based line number for JSONL inputs, else ``None`` (errors name it, as for raw records).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    images: list[Any] = field(default_factory=list)
    source: str | None = None
    index: int | None = None
    id: str | None = None
    format: str = ""
    line: int | None = None


@dataclass
class RawRecord:
    """A raw input record with its provenance (``line`` is 1-based, JSONL only)."""

    data: Any
    source: str
    index: int
    line: int | None = None
    base_dir: Path | None = None
    error: DataFormatError | None = None  # set when the record itself could not be parsed
