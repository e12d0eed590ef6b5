"""Tokenizing one very long rendered text in pieces, with the tokens of one whole-text call.

A fast tokenizer's ``encode`` of one text builds every token's id, string, offsets and masks in Rust at
once: about 100-130 bytes of memory per input character at its peak (measured with the embedded Qwen3
tokenizer on a 5 MB text: +646 MB). :func:`encode_long_texts` cuts a text longer than
:data:`LONG_TEXT_CHARS` into pieces of about :data:`PIECE_CHARS` characters and tokenizes them one
after the other with ``seqpack.data.chat_template.encode_texts`` (the one trainable rule, on each
piece's share of the spans), so the peak is that of one piece plus the int32 ids and bool mask.

Cuts are placed only where they change no token:

* candidates are line starts (``"\\n"`` followed by a non-space) and word starts (a non-space, then
  ``" "`` and a letter): pre-token boundaries of the byte-level BPE split patterns (GPT-2, Llama 3,
  Qwen), so the pieces' tokens concatenate to the whole text's;
* every candidate is checked with the tokenizer itself: the :data:`CHECK_CHARS` characters on each side
  of it must tokenize to the same ids whole and cut there. A candidate that fails (a tokenizer that adds
  a prefix to every text, strips whitespace at text ends, or merges across the cut) is skipped; a text
  with no usable cut is tokenized whole, as before.

Texts up to :data:`LONG_TEXT_CHARS` characters take the ordinary batched path unchanged.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["CHECK_CHARS", "LONG_TEXT_CHARS", "PIECE_CHARS", "cut_points", "encode_long_texts"]

#: texts with more characters than this are tokenized in pieces
LONG_TEXT_CHARS = 65_536
#: target characters per piece (a piece ends at the first usable cut after this many)
PIECE_CHARS = 16_384
#: characters on each side of a candidate cut that must tokenize the same whole and cut
CHECK_CHARS = 512

# group 1: a line start after "\n" (cut after the newline); group 2: a word start (cut before the space)
_CANDIDATE = re.compile(r"\n(?=\S)|(?<=\S)( )(?=[^\W\d_])")

EncodeFn = Callable[..., list]


def _ids(tokenizer: Any, text: str) -> list[int]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return tokenizer(text, add_special_tokens=False)["input_ids"]  # pragma: no cover - fast tokenizers have one


def _cut_is_invisible(tokenizer: Any, text: str, c: int) -> bool:
    """Whether the ``CHECK_CHARS`` characters each side of ``c`` tokenize the same whole and cut at ``c``."""
    left, right = text[max(0, c - CHECK_CHARS):c], text[c:c + CHECK_CHARS]
    return _ids(tokenizer, left + right) == _ids(tokenizer, left) + _ids(tokenizer, right)


def cut_points(tokenizer: Any, text: str, piece_chars: int | None = None) -> list[int]:
    """Character positions at which ``text`` is cut into pieces (sorted, each in ``(0, len(text))``).

    A piece ends at the first candidate (module docstring) at or after ``piece_chars`` characters
    (default :data:`PIECE_CHARS`) that passes the tokenizer check. Empty when ``text`` has no usable cut.
    """
    step = PIECE_CHARS if piece_chars is None else int(piece_chars)
    cuts: list[int] = []
    pos = step
    while pos < len(text):
        m = _CANDIDATE.search(text, pos)
        if m is None:
            break
        c = m.start(1) if m.group(1) else m.end()
        if 0 < c < len(text) and _cut_is_invisible(tokenizer, text, c):
            cuts.append(c)
            pos = c + step
        else:
            pos = m.end()
    return cuts


def _piece_spans(spans: Sequence[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    """``spans`` clipped to ``[a, b)`` and shifted to start at 0 (a token starting at ``t`` lies in a span
    iff ``t - a`` lies in its clipped, shifted copy)."""
    return [(max(s, a) - a, min(e, b) - a) for s, e in spans if s < b and e > a]


def encode_long_texts(
    tokenizer: Any, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], train_on: str,
    encode: EncodeFn,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``encode(tokenizer, texts, spans, train_on, in_pieces=False)`` (``seqpack.data.chat_template.encode_texts``
    tokenizing each text whole), with every text longer than :data:`LONG_TEXT_CHARS` tokenized in pieces
    (module docstring).

    Returns:
        per text ``(input_ids int32[L], trainable bool[L])``, equal to one ``encode`` call on all texts.
    """
    long = [i for i, t in enumerate(texts) if len(t) > LONG_TEXT_CHARS]
    short = sorted(set(range(len(texts))) - set(long))
    out: list[Any] = [None] * len(texts)
    if short:
        for i, r in zip(short, encode(tokenizer, [texts[i] for i in short], [spans[i] for i in short], train_on, in_pieces=False)):
            out[i] = r
    for i in long:
        text, sp = texts[i], list(spans[i])
        bounds = [0, *cut_points(tokenizer, text), len(text)]
        parts = [
            encode(tokenizer, [text[a:b]], [_piece_spans(sp, a, b)], train_on, in_pieces=False)[0] for a, b in zip(bounds, bounds[1:])
        ]
        if len(parts) == 1:
            out[i] = parts[0]
            continue
        ids = np.concatenate([p[0] for p in parts]).astype(np.int32, copy=False)
        trainable = np.concatenate([p[1] for p in parts]).astype(bool, copy=False)
        out[i] = (ids, trainable)
    return out
