"""Chat template rendering, assistant-only labels and the over-length policy.

How assistant tokens are found (template-agnostic, no ``{% generation %}`` tags needed):

1. Once per tokenizer, ``TemplateMarkers.probe`` renders two tiny sentinel conversations to learn
   the template's **assistant header** (what ``add_generation_prompt=True`` appends, e.g.
   ``"<|im_start|>assistant\\n"`` for Qwen3) and its **end-of-turn** text (what follows the
   assistant content, cut after the EOS token or trailing whitespace, e.g. ``"<|im_end|>"``).
2. Each conversation is rendered to text **once**, with its real contents and ``tools=``
   (``render_conversation``). Walking the messages in order, each assistant turn's span is
   ``[end of its header, end of its end-of-turn marker)`` in character space. Templates whose
   rendering of a prefix is not a prefix of the full rendering (Qwen3 drops reasoning from earlier
   turns and adds an empty think block only after the last user query) need nothing special,
   because only the full rendering is used.
3. All texts of a batch are tokenized in one fast-tokenizer call with
   ``return_offsets_mapping=True``; a token is trainable when its first character lies in an
   assistant span. Labels follow the shifted contract: ``shift_labels(input_ids, trainable)``.

What is trained (``train_on="assistant"``): everything the template renders for an assistant turn
after the assistant header, i.e. what the model generates: the think block as rendered (Qwen3: the
``<think>...</think>`` block, empty or not, where the template emits one; reasoning of earlier turns
is dropped by the template and so is not in the text), the content, the tool calls as rendered,
and the end-of-turn token (``<|im_end|>`` for Qwen3). The newline after ``<|im_end|>`` is not
trained. ``train_on="all"`` trains every token.

Jinja renders message contents as data, so literal ``{{name}}`` text in records stays literal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .formats import Conversation, DataFormatError
from .sample import Sample, SampleRecord, shift_labels

__all__ = [
    "OVERLENGTH_POLICIES",
    "TRAIN_ON",
    "OverlengthError",
    "TemplateMarkers",
    "render_conversation",
    "encode_texts",
    "apply_overlength",
]

OVERLENGTH_POLICIES = ("truncate", "drop", "split", "error")
TRAIN_ON = ("assistant", "all")

_SENT_USER = "\ue000seqpack user probe\ue001"
_SENT_ASSISTANT = "\ue000seqpack assistant probe\ue001"


class OverlengthError(ValueError):
    """A sample is longer than ``seq_length`` under ``overlength="error"``."""


@dataclass(frozen=True)
class TemplateMarkers:
    """What a chat template puts around an assistant turn (learned by ``probe``).

    Attributes:
        headers: candidate assistant headers, most specific first (the generation prompt, then the
            text between the user turn and the assistant content in a full rendering).
        end_of_turn: the end-of-turn text that closes an assistant turn (trained).
    """

    headers: tuple[str, ...]
    end_of_turn: str

    @classmethod
    def probe(cls, tokenizer: Any) -> "TemplateMarkers":
        """Learn the markers of ``tokenizer.chat_template`` by rendering sentinel conversations.

        Raises:
            DataFormatError: (reason ``"template_error"``) the template cannot render a plain
                user/assistant exchange, or renders nothing after the assistant content.
        """
        cached = getattr(tokenizer, "_seqpack_markers", None)
        key = _template_key(tokenizer)
        if cached is not None and cached[0] == key:
            return cached[1]
        user = [{"role": "user", "content": _SENT_USER}]
        both = user + [{"role": "assistant", "content": _SENT_ASSISTANT}]
        try:
            base = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=False)
            gen = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(both, tokenize=False)
        except Exception as e:  # noqa: BLE001
            raise DataFormatError(
                f"the chat template cannot render a user/assistant exchange: {e}",
                source=str(getattr(tokenizer, "name_or_path", "tokenizer")),
                reason="template_error",
                fix="use a tokenizer whose chat_template supports user and assistant roles.",
            ) from e
        ia = full.find(_SENT_ASSISTANT)
        iu = full.find(_SENT_USER)
        if ia < 0 or iu < 0:
            raise DataFormatError(
                "the chat template does not render message contents verbatim.",
                source=str(getattr(tokenizer, "name_or_path", "tokenizer")),
                reason="template_error",
                fix="use a template that inserts message['content'] as-is.",
            )
        headers: list[str] = []
        if gen.startswith(base) and len(gen) > len(base):
            headers.append(gen[len(base):])
        # text between the end of the user content's rendering and the assistant content
        cp = _common_prefix_len(base, full)
        cp = max(cp, iu + len(_SENT_USER))
        between = full[cp:ia]
        if between and between not in headers:
            headers.append(between)
        # first line of the generation prompt (templates whose prompt opens a think block)
        if headers and "\n" in headers[0].rstrip("\n"):
            first = headers[0][: headers[0].index("\n") + 1]
            if first not in headers:
                headers.append(first)
        if not headers:
            raise DataFormatError(
                "the chat template renders no assistant header.",
                source=str(getattr(tokenizer, "name_or_path", "tokenizer")),
                reason="template_error",
                fix="use a chat template that marks assistant turns.",
            )
        suffix = full[ia + len(_SENT_ASSISTANT):]
        eos = getattr(tokenizer, "eos_token", None)
        if eos and eos in suffix:
            eot = suffix[: suffix.index(eos) + len(eos)]
        else:
            eot = suffix.rstrip()
        if not eot.strip():
            raise DataFormatError(
                "the chat template renders no end-of-turn marker after assistant content, so the model "
                "would never learn to stop.",
                source=str(getattr(tokenizer, "name_or_path", "tokenizer")),
                reason="template_error",
                fix="use a chat template that closes assistant turns with an end-of-turn/EOS token.",
            )
        markers = cls(headers=tuple(headers), end_of_turn=eot)
        try:
            tokenizer._seqpack_markers = (key, markers)
        except Exception:  # noqa: BLE001 - caching is optional
            pass
        return markers


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
    conv: Conversation, tokenizer: Any, markers: TemplateMarkers
) -> tuple[str, list[tuple[int, int]]]:
    """Render one conversation with the tokenizer's chat template and find its assistant spans.

    Returns:
        ``(text, spans)``: the full rendering (``tools=conv.tools`` passed through) and one
        ``(start, end)`` character span per assistant turn, in order (module docstring).

    Raises:
        DataFormatError: the template raised (reason ``"template_error"``, e.g. roles that must
            alternate) or an assistant turn could not be located (``"template_span_mismatch"``).
    """
    try:
        text = tokenizer.apply_chat_template(conv.messages, tools=conv.tools, tokenize=False)
    except Exception as e:  # noqa: BLE001
        raise DataFormatError(
            f"the chat template failed on this record: {e}",
            source=conv.source,
            index=conv.index,
            reason="template_error",
            fix="make the record fit the template (e.g. role order), or skip it with on_error='skip'.",
        ) from e
    if not isinstance(text, str):  # batched / odd return types
        raise DataFormatError(
            f"apply_chat_template returned {type(text).__name__}, expected str.",
            source=conv.source,
            index=conv.index,
            reason="template_error",
        )
    eot = markers.end_of_turn
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
            if p >= 0:
                start = p + len(h)
                break
        if start < 0:
            raise DataFormatError(
                f"assistant message {k}: its header {markers.headers[0]!r} is not in the rendered text.",
                source=conv.source,
                index=conv.index,
                reason="template_span_mismatch",
                fix="the chat template dropped or rewrote this assistant turn; check the role order.",
            )
        q = start
        if eot in content:  # content holding the marker literally: search past the content
            p = text.find(content, start)
            if p >= 0:
                q = p + len(content)
        e = text.find(eot, q)
        if e < 0:
            raise DataFormatError(
                f"assistant message {k}: no end-of-turn marker {eot!r} after it in the rendered text.",
                source=conv.source,
                index=conv.index,
                reason="template_span_mismatch",
                fix="the chat template does not close this assistant turn; use another template.",
            )
        end = e + len(eot)
        spans.append((start, end))
        cursor = end
    return text, spans


def encode_texts(
    tokenizer: Any, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], train_on: str = "assistant"
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokenize rendered texts in one batched fast-tokenizer call and mark trainable tokens.

    Args:
        tokenizer: a fast ``transformers`` tokenizer (needs character offsets).
        texts: rendered conversations (``add_special_tokens=False``: templates render BOS themselves).
        spans: per text, sorted non-overlapping ``(start, end)`` character spans to train.
        train_on: ``"assistant"`` (tokens whose first character lies in a span) or ``"all"``.

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
    want_offsets = train_on == "assistant"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        # the same call transformers' fast tokenizer makes, without its per-text Python conversion
        encs = backend.encode_batch(list(texts), add_special_tokens=False)
        all_ids = [e.ids for e in encs]
        all_offsets = [e.offsets for e in encs] if want_offsets else None
    else:  # pragma: no cover - fast tokenizers always have a backend
        enc = tokenizer(
            list(texts),
            add_special_tokens=False,
            return_offsets_mapping=want_offsets,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )
        all_ids = enc["input_ids"]
        all_offsets = enc["offset_mapping"] if want_offsets else None
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for i, ids_list in enumerate(all_ids):
        ids = np.asarray(ids_list, dtype=np.int32)
        if not want_offsets:
            out.append((ids, np.ones(ids.shape[0], dtype=bool)))
            continue
        sp = spans[i]
        if not sp or ids.shape[0] == 0:
            out.append((ids, np.zeros(ids.shape[0], dtype=bool)))
            continue
        starts = np.asarray(all_offsets[i], dtype=np.int64)[:, 0]
        bounds = np.asarray(sp, dtype=np.int64).reshape(-1)
        # position in [s0, e0, s1, e1, ...]: odd -> inside a span (start inclusive, end exclusive)
        trainable = (np.searchsorted(bounds, starts, side="right") % 2) == 1
        out.append((ids, trainable))
    return out


def apply_overlength(
    input_ids: np.ndarray,
    trainable: np.ndarray,
    *,
    seq_length: int,
    overlength: str = "truncate",
    sample_id: str,
    source: str | None = None,
    index: int | None = None,
    media: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    keep_untrainable: bool = False,
) -> tuple[list[Sample], list[SampleRecord]]:
    """Turn one tokenized example into final ``Sample``(s) under the over-length policy.

    Args:
        input_ids: int ``[L]`` token ids.
        trainable: bool ``[L]`` unshifted trainable mask (``trainable[t]``: token t is a target).
        seq_length: capacity in tokens (a sample keeps at most this many tokens).
        overlength: ``"truncate"`` (SFT default: keep the first ``seq_length`` tokens; the first
            dropped token becomes the explicit final target ``labels[-1]`` when it is trainable,
            case B12), ``"drop"``, ``"error"`` or ``"split"`` (pretraining-style, opt-in: fragments
            ``"<id>#part<k>"``, k = 0, 1, ..., each ``<= seq_length`` tokens; every token is kept
            exactly once and each fragment's last label is the first token of the next fragment
            when trainable, cases B09/B10). Samples carrying media are dropped rather than cut
            (cutting would orphan image placeholders; reason ``"overlength_media"``).
        sample_id, source, index, media, meta: provenance copied into the ``Sample``(s).
        keep_untrainable: keep (instead of drop) a sample left with no trainable label.

    Returns:
        ``(samples, entries)``: the samples (their ``length`` is recomputed after every
        transform, case B11) and the report entries (``truncated``/``split``/``dropped``) for this
        example. A dropped sample is never charged its raw length.

    Raises:
        OverlengthError: ``overlength="error"`` and ``L > seq_length``.
        ValueError: unknown policy or ``seq_length < 1``.
    """
    if overlength not in OVERLENGTH_POLICIES:
        raise ValueError(f"overlength={overlength!r} is not one of {OVERLENGTH_POLICIES}")
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    ids = np.asarray(input_ids, dtype=np.int32)
    tr = np.asarray(trainable, dtype=bool)
    n = int(ids.shape[0])
    meta = dict(meta or {})
    entries: list[SampleRecord] = []

    def rec(status: str, reason: str, detail: str, before: int | None, after: int | None) -> SampleRecord:
        return SampleRecord(sample_id, source, index, status, reason, detail, before, after)

    if n == 0:
        return [], [rec("dropped", "empty_sample", "the rendered conversation has no tokens", 0, 0)]

    if n > seq_length:
        if overlength == "error":
            raise OverlengthError(
                f"sample {sample_id!r} ({source}, record {index}) has {n} tokens > seq_length={seq_length}. "
                "Fix: raise seq_length, or set overlength to 'truncate' (SFT default), 'drop' or 'split'."
            )
        if overlength == "drop":
            return [], [rec("dropped", "overlength", f"{n} tokens > seq_length={seq_length}", n, 0)]
        if media and overlength in ("truncate", "split"):
            return [], [
                rec(
                    "dropped",
                    "overlength_media",
                    f"{n} tokens > seq_length={seq_length}; a sample with images is dropped rather than cut "
                    "(cutting would orphan image placeholders). Raise seq_length to keep it.",
                    n,
                    0,
                )
            ]
        if overlength == "split":
            samples = []
            n_parts = -(-n // seq_length)
            untrained = 0
            for k in range(n_parts):
                a, b = k * seq_length, min(n, (k + 1) * seq_length)
                final = int(ids[b]) if b < n and tr[b] else None
                labels = shift_labels(ids[a:b], tr[a:b], final_target=final)
                s = Sample(
                    ids[a:b],
                    labels,
                    f"{sample_id}#part{k}",
                    source,
                    index,
                    media,
                    {**meta, "part": k, "num_parts": n_parts, "tokens_before": n},
                )
                untrained += s.num_trainable == 0
                samples.append(s)
            detail = f"{n} tokens split into {n_parts} fragments of <= {seq_length} (pretraining-style)"
            if untrained:
                detail += f"; {untrained} fragment(s) have no trainable label (kept: split keeps every token)"
            return samples, [rec("split", "overlength", detail, n, n)]
        # truncate (B11/B12): keep seq_length tokens, first dropped token as explicit final target
        final = int(ids[seq_length]) if tr[seq_length] else None
        t_ids, t_tr = ids[:seq_length], tr[:seq_length]
        labels = shift_labels(t_ids, t_tr, final_target=final)
        sample = Sample(t_ids, labels, sample_id, source, index, media, {**meta, "truncated_from": n})
        if sample.num_trainable == 0 and not keep_untrainable:
            return [], [
                rec(
                    "dropped",
                    "no_trainable_tokens",
                    f"truncated from {n} to {seq_length} tokens, no trainable token left",
                    n,
                    0,
                )
            ]
        entries.append(rec("truncated", "overlength", f"truncated from {n} to {seq_length} tokens", n, seq_length))
        if sample.num_trainable == 0:
            entries.append(rec("kept", "no_trainable_tokens", "kept (keep_untrainable=True)", n, seq_length))
        return [sample], entries

    labels = shift_labels(ids, tr)
    sample = Sample(ids, labels, sample_id, source, index, media, meta)
    if sample.num_trainable == 0:
        if not keep_untrainable:
            return [], [rec("dropped", "no_trainable_tokens", "no trainable token", n, 0)]
        entries.append(rec("kept", "no_trainable_tokens", "kept (keep_untrainable=True)", n, n))
    return [sample], entries
