"""Long texts tokenized in pieces (seqpack.data.long_text) give the ids and trainable mask of one whole call."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqpack.data import long_text
from seqpack.data.chat_template import encode_texts
from seqpack.data.length_policy import trainable_mask
from seqpack.sample import IGNORE_INDEX, unshift_labels

_PARTS = ["hello", " world", "\n", "\n\n", "  ", "42", "3.14", "é", "中文字", "🙂", "'s", "<|im_end|>", "\t", ",",
          " x_1 = f(y)", "Ünïcödé", "\r\n", " ", "A"]


@pytest.fixture
def small_pieces(monkeypatch):
    """Cut every text above 40 characters into pieces of about 30, checked on 16 characters each side."""
    monkeypatch.setattr(long_text, "LONG_TEXT_CHARS", 40)
    monkeypatch.setattr(long_text, "PIECE_CHARS", 30)
    monkeypatch.setattr(long_text, "CHECK_CHARS", 16)
    import seqpack.data.chat_template as ct

    monkeypatch.setattr(ct, "LONG_TEXT_CHARS", 40)


def _assert_same(tok, texts, spans, train_on="assistant"):
    whole = encode_texts(tok, texts, spans, train_on, in_pieces=False)
    cut = encode_texts(tok, texts, spans, train_on)
    assert len(whole) == len(cut)
    for (a_ids, a_tr), (b_ids, b_tr) in zip(whole, cut):
        assert b_ids.dtype == np.int32 and b_tr.dtype == bool
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_tr, b_tr)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_PARTS), min_size=1, max_size=120), st.data())
def test_pieces_equal_whole_text(qwen3_tokenizer, small_pieces, parts, data):
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if a < b]
    _assert_same(qwen3_tokenizer, [text, "short one", text[::-1]], [spans, [(0, 5)], spans])
    _assert_same(qwen3_tokenizer, [text], [spans], "all")


def test_real_long_text_is_cut_and_equal(qwen3_tokenizer):
    rng = random.Random(0)
    words = ["packing", "rows", "the", "of", "3.5", "1234567", "naïve", "東京", "😀", "code()", "x\ty"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) for _ in range(9000)]
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + "\n".join(lines) + "<|im_end|>\n"
    assert len(text) > long_text.LONG_TEXT_CHARS
    cuts = long_text.cut_points(qwen3_tokenizer, text)
    assert len(cuts) >= 3 and all(0 < c < len(text) for c in cuts) and cuts == sorted(cuts)
    _assert_same(qwen3_tokenizer, [text, "a"], [[(47, len(text) - 11)], [(0, 1)]])


def test_text_without_usable_cut_is_encoded_whole(qwen3_tokenizer, small_pieces):
    text = "x" * 200  # one pre-token: no line or word start
    assert long_text.cut_points(qwen3_tokenizer, text) == []
    _assert_same(qwen3_tokenizer, [text], [[(0, 200)]])


def test_candidate_refused_by_the_tokenizer_check_is_skipped(qwen3_tokenizer, small_pieces, monkeypatch):
    text = "\n".join(["alpha beta gamma delta"] * 20)
    monkeypatch.setattr(long_text, "_cut_is_invisible", lambda tok, t, c: False)
    assert long_text.cut_points(qwen3_tokenizer, text) == []
    _assert_same(qwen3_tokenizer, [text], [[(3, 300)]])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([IGNORE_INDEX, 0, 5, 7]), max_size=40))
def test_trainable_mask_is_unshift_labels_as_bools(labels):
    lab = np.asarray(labels, dtype=np.int32)
    expect = np.asarray(unshift_labels(lab, final_target="drop")) != IGNORE_INDEX
    np.testing.assert_array_equal(trainable_mask(lab), expect)
