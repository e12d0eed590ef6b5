"""The trainable mask read at span boundaries equals the mask from every token's offsets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.data.chat_template import TemplateMarkers, encode_texts, render_conversation
from seqpack.data.formats import normalize_record
from seqpack.data.sources import iter_records
from seqpack.data.token_mask import span_mask, span_mask_at_boundaries
from seqpack.pipeline import sample_data_path


def _rendered(tok, path):
    markers = TemplateMarkers.probe(tok)
    texts, spans = [], []
    for raw in iter_records(path):
        try:
            text, sp = render_conversation(normalize_record(raw, None), tok, markers)
        except Exception:  # noqa: BLE001 - records the template refuses are not this test's subject
            continue
        texts.append(text)
        spans.append(sp)
    return texts, spans


@pytest.mark.parametrize("name", ["llama-factory/alpaca_en_demo.json", "llama-factory/identity.json",
                                  "llama-factory/glaive_toolcall_en_demo.json", "llama-factory/reason_tool_use_demo_50.jsonl",
                                  "fastchat/dummy_conversation.json", "llama-factory/mllm_demo.json",
                                  "lmms-finetune/celeba_image_train.json", None])
def test_boundary_mask_equals_offsets_mask_on_real_data(shared_data, qwen3_tokenizer, name):
    path = sample_data_path() if name is None else shared_data / name
    texts, spans = _rendered(qwen3_tokenizer, path)
    assert len(texts) >= 5
    encs = qwen3_tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    trained = 0
    for text, enc, sp in zip(texts, encs, spans):
        fast = span_mask_at_boundaries(enc, len(enc.ids), len(text), sp)
        assert fast is not None  # no fallback on this data: the fast path is what runs
        full = span_mask(enc.offsets, sp)
        assert np.array_equal(fast, full)
        trained += int(full.sum())
    assert trained > 0
    # encode_texts gives exactly these masks
    for (ids, tr), enc, sp in zip(encode_texts(qwen3_tokenizer, texts, spans), encs, spans):
        assert ids.tolist() == enc.ids and np.array_equal(tr, span_mask(enc.offsets, sp) if sp else np.zeros(len(ids), bool))


_PIECES = ["a", " ", "  ", "\n", "\n\n", "hello", " world", "é", "中文", "😀", "<|im_end|>", "<|im_start|>", "\t", "12345",
           "ĠĊ", "e\u0301", "Ω", "\u00a0", "'s", "!!"]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=40), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_boundary_mask_equals_offsets_mask_on_random_text(qwen3_tokenizer, pieces, cuts):
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts})
    spans = [(bounds[i], bounds[i + 1]) for i in range(0, len(bounds) - 1, 2)]
    enc = qwen3_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    full = span_mask(enc.offsets, spans) if spans else np.zeros(len(enc.ids), bool)
    fast = span_mask_at_boundaries(enc, len(enc.ids), len(text), spans)
    if fast is not None:  # None = the caller falls back to the offsets
        assert np.array_equal(fast, full)
    (ids, tr), = encode_texts(qwen3_tokenizer, [text], [spans])
    assert ids.tolist() == enc.ids and np.array_equal(tr, full)
