"""The trainable-token mask of one encoded text from character spans (``seqpack.data.chat_template.encode_texts``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["span_mask", "span_mask_at_boundaries"]


def span_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """``bool[L]``: token ``t`` is trainable when its start offset lies in a span (start inclusive, end
    exclusive); ``offsets`` = the ``L`` ``(start, end)`` character offsets, ``spans`` sorted, disjoint."""
    starts = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
    bounds = np.asarray(spans, dtype=np.int64).reshape(-1)
    # position in [s0, e0, s1, e1, ...]: odd -> inside a span
    return (np.searchsorted(bounds, starts, side="right") % 2) == 1


def span_mask_at_boundaries(enc: Any, n: int, n_chars: int, spans: Sequence[tuple[int, int]]) -> np.ndarray | None:
    """:func:`span_mask` read from the tokens at the span boundaries only (no offsets list for the whole
    text, which costs more than the rest of the mask): for a boundary ``b`` the number of tokens starting
    before it, ``c(b)``, is found with ``char_to_token`` and checked on both sides (``start[c-1] < b <=
    start[c]``); the mask is then ``[c(s), c(e))`` per span. Equal to :func:`span_mask` because token
    start offsets never decrease along one encoded text. ``None`` when a boundary cannot be placed that
    way (the caller then uses the full offsets)."""

    def start(t: int) -> int:
        return enc.token_to_chars(t)[0]

    def before(b: int) -> int | None:
        if b >= n_chars:
            c = n
        else:
            k = enc.char_to_token(b)
            if k is None:
                return None
            c = k if start(k) >= b else k + 1
        if (c > 0 and start(c - 1) >= b) or (c < n and start(c) < b):
            return None
        return c

    mask = np.zeros(n, dtype=bool)
    for s, e in spans:
        cs, ce = before(s), before(e)
        if cs is None or ce is None:
            return None
        mask[cs:ce] = True
    return mask
