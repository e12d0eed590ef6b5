"""``sharegpt``: ``{conversations: [{from, value}], system? | system_prompt?, tools?}``. Roles
``human``/``user``, ``gpt``/``assistant`` (also ``chatgpt``, ``bard``, ``bing``), ``system``,
``function_call`` (value = JSON ``{name, arguments}`` or a list of them) and ``observation``/``tool``.
``tools`` may be a JSON string (glaive / LLaMA-Factory)."""

from __future__ import annotations

from seqpack.data.formats._common import _append_assistant_calls, _Ctx, _get, _text, _tool_calls_from_json
from seqpack.data.records import json_kind

__all__ = ["from_sharegpt"]

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


def from_sharegpt(rec: dict, ctx: _Ctx) -> list[dict]:
    """Messages of a sharegpt record (``function_call`` turns become assistant ``tool_calls``)."""
    turns = rec.get("conversations")
    if not isinstance(turns, list):
        raise ctx.err(
            f"'conversations' is {json_kind(turns)}, expected a list of {{from, value}} turns.",
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
        if frm is None:
            raise ctx.err(f"conversations[{k}] has no 'from' (or 'role').", "unknown_role",
                          f"give every turn a 'from', one of {sorted(_SHAREGPT_ROLES)}.")
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
