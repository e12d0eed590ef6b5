"""Chat template rendering and the assistant-token mask: a ``Conversation`` in, text + trainable spans
out (``render_conversation``), then token ids + a per-token trainable mask (``encode_texts``).

How assistant tokens are found and what is trained: ``docs/notes/chat_template.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from seqpack.data.records import Conversation, DataFormatError
from seqpack.data.long_text import LONG_TEXT_CHARS, encode_long_texts
from seqpack.data.template_env import speed_up_template
from seqpack.data.token_mask import span_mask, span_mask_at_boundaries

__all__ = ["TRAIN_ON", "TemplateMarkers", "render_conversation", "encode_texts"]

#: Which tokens are trained: ``"assistant"`` (what the model generates) or ``"all"``.
TRAIN_ON = ("assistant", "all")

_SENT_USER = "\ue000seqpack user probe\ue001"
_SENT_ASSISTANT = "\ue000seqpack assistant probe\ue001"


@dataclass(frozen=True)
class TemplateMarkers:
    """What a chat template puts around an assistant turn (learned by ``probe``).

    Attributes:
        headers: candidate assistant headers (not trained). At render time the candidate whose
            first occurrence after the previous turn ends earliest marks the span start; all true
            candidates are suffixes of the same header text, so they end at the same place.
        end_of_turn: the end-of-turn text that closes the last assistant turn (trained).
        end_of_turn_mid: the end-of-turn text that closes an earlier assistant turn, where the
            template uses a different one (gpt-oss: ``<|end|>`` vs ``<|return|>``); else equal
            to ``end_of_turn``. A span ends at the earliest of the two.
    """

    headers: tuple[str, ...]
    end_of_turn: str
    end_of_turn_mid: str = ""

    @property
    def ends(self) -> tuple[str, ...]:
        """The distinct non-empty end-of-turn strings (``end_of_turn`` first), searched after a turn's header."""
        return tuple(dict.fromkeys(e for e in (self.end_of_turn, self.end_of_turn_mid) if e))

    @classmethod
    def probe(cls, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> "TemplateMarkers":
        """Learn the markers of ``tokenizer.chat_template`` by rendering sentinel conversations.

        Renders ``[user]`` with and without the generation prompt, ``[user, assistant]`` and
        ``[user, assistant, user, assistant]`` with sentinel contents. The header is the text that
        the generation prompt and the full rendering share after the user content, cut before a
        ``<think>`` opener (so a think block is trained, not prompted) and reduced to the part
        after the user turn's closing text; end-of-turn markers are the texts after an assistant
        content up to the EOS token / the user turn's closing pattern, compared token by token.

        ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) are passed to every render.

        Raises:
            DataFormatError: (reason ``"template_error"``) the template cannot render a plain
                user/assistant exchange, or renders nothing after the assistant content.
        """
        kw = dict(chat_template_kwargs or {})
        cached = getattr(tokenizer, "_seqpack_markers", None)
        key = (_template_key(tokenizer), repr(sorted(kw.items())))
        if cached is not None and cached[0] == key:
            return cached[1]
        name = str(getattr(tokenizer, "name_or_path", "tokenizer"))
        u1, a1, u2, a2 = (_SENT_USER, _SENT_ASSISTANT, _SENT_USER + "2", _SENT_ASSISTANT + "2")
        user = [{"role": "user", "content": u1}]
        both = user + [{"role": "assistant", "content": a1}]
        two = both + [{"role": "user", "content": u2}, {"role": "assistant", "content": a2}]
        try:
            base = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False, **kw)
            gen = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True, **kw)
            full = tokenizer.apply_chat_template(both, tokenize=False, **kw)
        except Exception as e:  # noqa: BLE001
            raise DataFormatError(
                f"the chat template cannot render a user/assistant exchange: {e}",
                source=name,
                reason="template_error",
                fix="use a tokenizer whose chat_template supports user and assistant roles.",
            ) from e
        try:
            full2 = tokenizer.apply_chat_template(two, tokenize=False, **kw)
        except Exception:  # noqa: BLE001 - single-turn-only templates
            full2 = None
        ia, iu, iu_base = full.find(a1), full.find(u1), base.find(u1)
        if ia < 0 or iu < 0 or iu_base < 0 or gen.find(u1) < 0:
            raise DataFormatError(
                "the chat template does not render message contents verbatim.",
                source=name,
                reason="template_error",
                fix="use a template that inserts message['content'] as-is.",
            )
        after_user_gen = gen[gen.find(u1) + len(u1):]
        between = full[iu + len(u1): ia]  # user close + assistant header (+ think block)
        user_close = base[iu_base + len(u1):]
        prompt = _token_lcp(tokenizer, after_user_gen, between) or between
        if "<think>" in prompt:
            prompt = prompt[: prompt.index("<think>")]
        close = _token_lcp(tokenizer, user_close, prompt)
        headers: list[str] = []
        for h in (prompt[len(close):], prompt, between):
            if h.strip() and h not in headers:
                headers.append(h)
        if gen.startswith(base) and len(gen) > len(base):
            h = gen[len(base):]
            if "<think>" in h:
                h = h[: h.index("<think>")]
            if h.strip() and h not in headers:
                headers.append(h)
        if not headers:
            raise DataFormatError(
                "the chat template renders no assistant header.",
                source=name,
                reason="template_error",
                fix="use a chat template that marks assistant turns.",
            )
        eot = _cut_end(tokenizer, full[ia + len(a1):])
        mid = ""
        if full2 is not None:
            j1, j2 = full2.find(a1), full2.find(u2)
            if 0 <= j1 < j2:
                after_a1 = full2[j1 + len(a1): j2]
                mid = _cut_end(tokenizer, _token_lcp(tokenizer, after_a1, user_close) or after_a1)
        if not eot.strip():
            raise DataFormatError(
                "the chat template renders no end-of-turn marker after assistant content, so the model "
                "would never learn to stop.",
                source=name,
                reason="template_error",
                fix="use a chat template that closes assistant turns with an end-of-turn/EOS token.",
            )
        markers = cls(headers=tuple(headers), end_of_turn=eot, end_of_turn_mid=mid if mid.strip() else eot)
        try:
            tokenizer._seqpack_markers = (key, markers)
        except Exception:  # noqa: BLE001 - caching is optional
            pass
        return markers


def _cut_end(tokenizer: Any, suffix: str) -> str:
    """End-of-turn text from what follows an assistant content: up to the EOS token, else the
    text with trailing whitespace removed."""
    eos = getattr(tokenizer, "eos_token", None)
    if eos and eos in suffix:
        return suffix[: suffix.index(eos) + len(eos)]
    return suffix.rstrip()


def _token_lcp(tokenizer: Any, a: str, b: str) -> str:
    """Longest common prefix of ``a`` and ``b`` cut at a token boundary of ``a`` (so a shared
    ``"<|"`` of two different special tokens is not taken for a common marker)."""
    n = _common_prefix_len(a, b)
    if n == len(a) or n == len(b) or n == 0:  # one is a prefix of the other: no cut inside a token
        return a[:n]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return a[:n]
    ea, eb = backend.encode(a, add_special_tokens=False), backend.encode(b, add_special_tokens=False)
    cut = 0
    for (ta, oa), (tb, ob) in zip(zip(ea.ids, ea.offsets), zip(eb.ids, eb.offsets)):
        if ta != tb or oa != ob or oa[1] > n:
            break
        cut = oa[1]
    return a[:cut]


def _template_key(tokenizer: Any) -> Any:
    t = getattr(tokenizer, "chat_template", None)
    return (t if isinstance(t, str) else repr(t), getattr(tokenizer, "eos_token", None))


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def render_conversation(
    conv: Conversation,
    tokenizer: Any,
    markers: TemplateMarkers,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """Render one conversation with the tokenizer's chat template and find its assistant spans.

    Returns:
        ``(text, spans)``: the full rendering (``tools=conv.tools`` passed through) and one
        ``(start, end)`` character span per assistant turn, in order (module docstring).

    Raises:
        DataFormatError: the template raised (reason ``"template_error"``, e.g. roles that must
            alternate) or an assistant turn could not be located (``"template_span_mismatch"``).
    """
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        speed_up_template(template)
    template = template if isinstance(template, str) else repr(template)
    missing = []
    if conv.tools and "tools" not in template:
        missing.append("tools (the record's function schemas)")
    if "tool_calls" not in template and any(m.get("tool_calls") for m in conv.messages):
        missing.append("tool_calls (the assistant's function calls)")
    if missing:
        raise DataFormatError(
            f"the chat template does not render {' or '.join(missing)}, so they would be lost silently.",
            source=conv.source,
            index=conv.index, line=conv.line,
            reason="template_unsupported",
            fix="use a tokenizer whose chat template supports tool use, or drop the tool fields from the data.",
        )
    try:
        text = tokenizer.apply_chat_template(
            conv.messages, tools=conv.tools, tokenize=False, **(chat_template_kwargs or {})
        )
    except Exception as e:  # noqa: BLE001
        raise DataFormatError(
            f"the chat template failed on this record: {e}",
            source=conv.source,
            index=conv.index, line=conv.line,
            reason="template_error",
            fix="make the record fit the template (e.g. role order), or skip it with on_error='skip'.",
        ) from e
    if not isinstance(text, str):  # batched / odd return types
        raise DataFormatError(
            f"apply_chat_template returned {type(text).__name__}, expected str.",
            source=conv.source,
            index=conv.index, line=conv.line,
            reason="template_error",
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataFormatError(
            f"the text holds a lone surrogate {text[e.start]!r} (half of a UTF-16 pair, not a character), which no "
            f"tokenizer can encode; near {text[max(0, e.start - 30):e.start]!r}.",
            source=conv.source,
            index=conv.index, line=conv.line,
            reason="bad_encoding",
            fix="repair the text (the file was probably written from UTF-16 data, e.g. a JSON escape \\ud83d "
            "without its pair), or remove the record; on_error='skip' skips and reports it.",
        ) from None
    ends = markers.ends

    def span_mismatch(k: int, what: str, fix: str) -> DataFormatError:
        return DataFormatError(
            f"assistant message {k}: {what}", source=conv.source, index=conv.index, line=conv.line,
            reason="template_span_mismatch", fix=fix,
        )

    spans: list[tuple[int, int]] = []
    cursor = 0
    for k, m in enumerate(conv.messages):
        content = m.get("content") or ""
        if m["role"] != "assistant":
            if content:
                p = text.find(content, cursor)
                if p >= 0:
                    cursor = p + len(content)
                else:
                    s = content.strip()
                    p = text.find(s, cursor) if s else -1
                    if p >= 0:
                        cursor = p + len(s)
            continue
        start = -1
        for h in markers.headers:
            p = text.find(h, cursor)
            if p >= 0 and (start < 0 or p + len(h) < start):
                start = p + len(h)
        if start < 0:
            raise span_mismatch(
                k, f"its header {markers.headers[0]!r} is not in the rendered text.",
                fix="the chat template dropped or rewrote this assistant turn; check the role order.",
            )
        q = start
        if any(x in content for x in ends):  # content holding a marker literally: search past it
            p = text.find(content, start)
            if p >= 0:
                q = p + len(content)
        e, eot = -1, ""
        for x in ends:
            p = text.find(x, q)
            if p >= 0 and (e < 0 or p < e):
                e, eot = p, x
        if e < 0:
            raise span_mismatch(
                k, f"no end-of-turn marker {ends} after it in the rendered text.",
                fix="the chat template does not close this assistant turn; use another template.",
            )
        end = e + len(eot)
        plain = content.strip()
        if plain and "<think>" not in content and "</think>" not in content and plain not in text[start:end]:
            raise span_mismatch(
                k, f"its content is not inside the span found for it ({text[start:end][:80]!r}...), so the "
                "template does not render it verbatim or the turn boundaries are ambiguous (e.g. content "
                "holding template markers).",
                fix="check the record for chat-template marker strings in its text, or skip it with on_error='skip'.",
            )
        spans.append((start, end))
        cursor = end
    return text, spans


def encode_texts(
    tokenizer: Any, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], train_on: str = "assistant",
    *, in_pieces: bool = True,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokenize rendered texts in one batched fast-tokenizer call and mark trainable tokens.

    Args:
        tokenizer: a fast ``transformers`` tokenizer (needs character offsets).
        texts: rendered conversations (``add_special_tokens=False``: templates render BOS themselves).
        spans: per text, sorted non-overlapping ``(start, end)`` character spans to train.
        train_on: ``"assistant"`` (tokens whose first character lies in a span) or ``"all"``.
        in_pieces: tokenize a very long text in pieces, with the same result and a bounded peak memory
            (``seqpack.data.long_text``); False tokenizes every text whole.

    Returns:
        per text ``(input_ids int32[L], trainable bool[L])`` (unshifted mask).

    Raises:
        ValueError: unknown ``train_on`` or a tokenizer without offsets (slow tokenizer).
    """
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on={train_on!r} is not one of {TRAIN_ON}")
    if not texts:
        return []
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} is not a fast tokenizer, so it has no "
            "character offsets. Fix: load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    if in_pieces and any(len(t) > LONG_TEXT_CHARS for t in texts):
        return encode_long_texts(tokenizer, texts, spans, train_on, encode_texts)
    want_offsets = train_on == "assistant"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        # the same call transformers' fast tokenizer makes, without its per-text Python conversion
        encs = backend.encode_batch(list(texts), add_special_tokens=False)
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for text, enc, sp in zip(texts, encs, spans):
            ids = np.asarray(enc.ids, dtype=np.int32)
            if not want_offsets:
                out.append((ids, np.ones(ids.shape[0], dtype=bool)))
            elif not sp or ids.shape[0] == 0:
                out.append((ids, np.zeros(ids.shape[0], dtype=bool)))
            else:
                tr = span_mask_at_boundaries(enc, ids.shape[0], len(text), sp)
                out.append((ids, tr if tr is not None else span_mask(enc.offsets, sp)))
        return out
    enc = tokenizer(  # pragma: no cover - fast tokenizers always have a backend
        list(texts),
        add_special_tokens=False,
        return_offsets_mapping=want_offsets,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )
    out = []
    for i, ids_list in enumerate(enc["input_ids"]):  # pragma: no cover
        ids = np.asarray(ids_list, dtype=np.int32)
        if not want_offsets:
            out.append((ids, np.ones(ids.shape[0], dtype=bool)))
        elif not spans[i] or ids.shape[0] == 0:
            out.append((ids, np.zeros(ids.shape[0], dtype=bool)))
        else:
            out.append((ids, span_mask(enc["offset_mapping"][i], spans[i])))
    return out

