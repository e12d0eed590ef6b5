"""``openai``: ``{messages: [{role, content, tool_calls?, reasoning_content?}], tools?}`` with roles
system, user, assistant, tool. ``content`` is a string or a list of typed parts: OpenAI parts
``{type: "text", text}`` / ``{type: "image" | "image_url", ...}`` and LLaMA-Factory "v1" parts
``{type: "text" | "reasoning" | "tool_call", value}``."""

from __future__ import annotations

from typing import Any

from seqpack.data.formats._common import _Ctx, _get, _text, _tool_calls_from_json
from seqpack.data.records import IMAGE_PLACEHOLDER, json_kind

__all__ = ["from_openai"]

_OPENAI_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def from_openai(rec: dict, ctx: _Ctx) -> list[dict]:
    """Messages of an openai record (typed parts split into text, reasoning, tool calls, images)."""
    raw_msgs = rec.get("messages")
    if not isinstance(raw_msgs, list):
        raise ctx.err(
            f"'messages' is {json_kind(raw_msgs)}, expected a list of {{role, content}}.",
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
        if role is None:
            raise ctx.err(f"messages[{k}] has no 'role'.", "unknown_role",
                          f"give every message a role, one of {sorted(_OPENAI_ROLES)}.")
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
                raise ctx.err(f"messages[{k}].tool_calls is {json_kind(m['tool_calls'])}, expected a list.",
                              "bad_content_type", "make tool_calls a list of {type: 'function', function: {name, "
                              "arguments}} objects.")
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
            f"{where} is {json_kind(content)}, expected a string or a list of typed parts.",
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
