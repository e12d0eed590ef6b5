"""Helpers shared by the format normalisers: provenance for error messages, typed field access, tool
calls and tool schemas, and the checks every normalised conversation passes."""

from __future__ import annotations

import json
from typing import Any

from seqpack.data.media_root import MediaRoot
from seqpack.data.records import DataFormatError, RawRecord, json_kind


def _get(d: dict, *keys: str) -> Any:
    """First non-None value among ``keys`` (Arrow/datasets rows fill absent struct fields with None)."""
    for k in keys:
        v = d.get(k)
        if v is not None:
            return v
    return None


def _present(rec: dict, key: str) -> bool:
    return key in rec and rec[key] is not None


class _Ctx:
    """Provenance of the record being normalised (for error messages)."""

    def __init__(self, raw: RawRecord, media: MediaRoot | None = None) -> None:
        self.raw = raw
        self.media = media if media is not None else MediaRoot()  # where image references may point
        self.inline_images: list[Any] = []  # image references from typed content parts

    def err(self, message: str, reason: str, fix: str) -> DataFormatError:
        return DataFormatError(
            message, source=self.raw.source, index=self.raw.index, line=self.raw.line, reason=reason, fix=fix
        )


def _text(value: Any, ctx: _Ctx, what: str) -> str:
    if isinstance(value, str):
        return value
    raise ctx.err(
        f"{what} is {json_kind(value)}, expected a string.",
        "bad_content_type",
        f"make {what} a string.",
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} overflows to infinity")
    return v


def strict_json(text: str) -> Any:
    """``json.loads`` that takes only RFC 8259 JSON: ``NaN``, ``Infinity`` and numbers that overflow to
    infinity (``1e999``) raise ``ValueError`` (Python's ``json`` accepts them; a chat template would then
    render them and the model learn to emit invalid JSON). RecursionError (deep nesting) propagates."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def _non_finite(obj: Any) -> str | None:
    """The path of the first NaN / infinite float inside a parsed value (iterative; ``None`` if none)."""
    stack = [(obj, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return path or "(the value)"
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
    return None


def _tool_calls_from_json(value: Any, ctx: _Ctx, where: str) -> list[dict]:
    """Parse a ``function_call`` / v1 ``tool_call`` value (JSON ``{name, arguments}`` or a list)."""
    obj = value
    if isinstance(value, str):
        try:
            obj = strict_json(value)
        except (ValueError, RecursionError) as e:
            raise ctx.err(
                f"{where} is not valid JSON ({getattr(e, 'msg', None) or e or type(e).__name__}).",
                "bad_tool_call",
                'a tool call must be JSON {"name": ..., "arguments": {...}}.',
            ) from None
    calls = obj if isinstance(obj, list) else [obj]
    out = []
    for c in calls:
        if isinstance(c, dict) and isinstance(c.get("function"), dict):
            c = c["function"]
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"].strip():
            got = c.get("name") if isinstance(c, dict) else c
            raise ctx.err(
                f"{where} has no non-empty string 'name' (got {str(got)[:40]!r}).",
                "bad_tool_call",
                'a tool call must be JSON {"name": ..., "arguments": {...}}.',
            )
        out.append({"type": "function", "function": {
            "name": c["name"], "arguments": _arguments(c.get("arguments"), ctx, f"{where} ({c['name']!r}).arguments")}})
    return out


def _arguments(args: Any, ctx: _Ctx, where: str) -> dict:
    """Tool-call arguments as a dict: a JSON object, or a string holding one (OpenAI stores them as a JSON
    string; HF chat templates take a dict). Absent arguments are ``{}``.

    Raises:
        DataFormatError: (reason ``"bad_tool_call"``) arguments that are not a JSON object, or a string
            that does not parse as one: a template would render them as free text the model then learns.
    """
    if args is None:
        return {}
    parsed = args
    if isinstance(args, str):
        try:
            parsed = strict_json(args) if args.strip() else {}
        except (ValueError, RecursionError) as e:
            why = getattr(e, "msg", None) or str(e) or type(e).__name__
            raise ctx.err(
                f"{where} is a string that is not valid JSON ({why}): {args[:80]!r}.",
                "bad_tool_call",
                'tool-call arguments must be a JSON object, e.g. "{\"city\": \"Paris\"}"; repair or remove the '
                "record (on_error='skip' skips and reports it).",
            ) from None
    if not isinstance(parsed, dict):
        raise ctx.err(
            f"{where} is {json_kind(parsed)}, not an object.",
            "bad_tool_call",
            "tool-call arguments must be a JSON object mapping parameter names to values; repair or remove the "
            "record (on_error='skip' skips and reports it).",
        )
    bad = _non_finite(parsed)
    if bad is not None:
        raise ctx.err(
            f"{where}{bad if bad.startswith(('.', '[')) else ''} is NaN or infinite, which JSON cannot hold.",
            "bad_tool_call",
            "tool-call arguments must be valid JSON (no NaN / Infinity); repair or remove the record "
            "(on_error='skip' skips and reports it).",
        )
    return parsed


def _append_assistant_calls(msgs: list[dict], calls: list[dict]) -> None:
    """Attach tool calls to the preceding assistant message (one turn) or start a new turn."""
    if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
        msgs[-1]["tool_calls"] = calls
    else:
        msgs.append({"role": "assistant", "content": "", "tool_calls": calls})


def _parse_tools(tools: Any, ctx: _Ctx) -> list[dict] | None:
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = strict_json(tools)
        except (ValueError, RecursionError) as e:
            raise ctx.err(
                f"'tools' is not valid JSON ({getattr(e, 'msg', None) or e or type(e).__name__}).", "bad_tools",
                "store tools as a JSON list of function schemas."
            ) from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise ctx.err(f"'tools' is {json_kind(tools)}, expected a list.", "bad_tools", "make 'tools' a list.")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise ctx.err(f"tools[{i}] is not an object.", "bad_tools", "each tool is a JSON schema object.")
        if t.get("function") is not None or t.get("type") not in (None, "function"):
            tool = t
        else:
            tool = {"type": "function", "function": t}
        fn = tool.get("function")
        if tool.get("type") in (None, "function") and not (
                isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"].strip()):
            name = fn.get("name") if isinstance(fn, dict) else None
            raise ctx.err(
                f"tools[{i}] is a function schema without a name." if name is None or isinstance(name, str) else
                f"tools[{i}] is a function schema whose name is {json_kind(name)}, not a non-empty text.",
                "bad_tools",
                'give every function schema a name: {"type": "function", "function": {"name": ..., '
                '"parameters": {...}}}; or remove the record (on_error=\'skip\' skips and reports it).',
            )
        params = fn.get("parameters") if isinstance(fn, dict) else None
        if params is not None and not isinstance(params, dict):
            raise ctx.err(
                f"tools[{i}] ({fn.get('name')!r}).parameters is {json_kind(params)}, not an object.",
                "bad_tools",
                'a function schema\'s "parameters" is a JSON Schema object, e.g. {"type": "object", '
                '"properties": {...}}; repair or remove the record (on_error=\'skip\' skips and reports it).',
            )
        bad = _non_finite(tool)
        if bad is not None:
            raise ctx.err(f"tools[{i}]{bad} is NaN or infinite, which JSON cannot hold.", "bad_tools",
                          "store tools as valid JSON (no NaN / Infinity).")
        out.append(tool)
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
