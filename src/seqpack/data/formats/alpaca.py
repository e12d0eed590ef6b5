"""``alpaca``: ``{instruction, input?, output, system?, history?}`` (Stanford Alpaca; ``history`` is a
list of ``[query, response]`` pairs as in LLaMA-Factory). The user turn is ``instruction + "\\n" + input``
when ``input`` is non-empty (LLaMA-Factory's convention)."""

from __future__ import annotations

from seqpack.data.formats._common import _Ctx, _text
from seqpack.data.records import json_kind

__all__ = ["from_alpaca"]


def from_alpaca(rec: dict, ctx: _Ctx) -> list[dict]:
    """Messages of an alpaca record (system, history pairs, the instruction turn, the output turn)."""
    msgs: list[dict] = []
    system = rec.get("system")
    if system:
        msgs.append({"role": "system", "content": _text(system, ctx, "'system'")})
    history = rec.get("history") or []
    if not isinstance(history, list):
        raise ctx.err(f"'history' is {json_kind(history)}, expected a list of [query, response] pairs.",
                      "bad_content_type", "make 'history' a list like [[\"query\", \"response\"], ...].")
    for k, pair in enumerate(history):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ctx.err(
                f"'history[{k}]' must be a [query, response] pair.", "bad_content_type",
                "make each 'history' item a two-element list [query, response]."
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
