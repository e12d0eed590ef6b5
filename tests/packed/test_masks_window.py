"""The packed mask rule with sliding windows and chunks, against transformers' own mask functions per sample.

Reference: each segment's real tokens as a sample alone, masked by ``transformers.masking_utils``
(``causal_mask_function``, ``sliding_window_causal_mask_function``, ``chunked_causal_mask_function``)
at the sample's own indices; the packed mask must equal it on every (real query, key) pair, see nothing
across segments or on padding keys, and give each padding query itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.packed import build_packed_sequence
from seqpack.packed.masks import (
    SegmentCausalMaskMod,
    attention_inputs,
    dense_block_causal_mask,
    flex_block_mask,
    segment_starts,
)
from seqpack.sample import Sample, shift_labels


def _row(lengths, multiple, total=None):
    samples = [Sample(np.arange(1, L + 1), shift_labels(np.arange(1, L + 1), np.ones(L, bool)), sample_id=f"s{i}")
               for i, L in enumerate(lengths)]
    row = build_packed_sequence(samples, pad_to_multiple_of=multiple, pad_token_id=0, seq_length=total,
                                pad_to_max_length=total is not None)
    b = row.to_torch()
    return b, row


def _hf_alone(L, window, chunk):
    """transformers' mask of one sample of length L run alone (bool [L, L])."""
    from transformers import masking_utils as mu

    if window is not None:
        fn = mu.sliding_window_causal_mask_function(window)
    elif chunk is not None:
        fn = mu.chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long))
    else:
        fn = mu.causal_mask_function
    q = torch.arange(L).view(-1, 1)
    k = torch.arange(L).view(1, -1)
    return torch.as_tensor(fn(torch.zeros((), dtype=torch.long), 0, q, k)).expand(L, L)


def _expected(b, window, chunk):
    T = b["input_ids"].shape[-1]
    want = torch.zeros(T, T, dtype=torch.bool)
    cu, cup = b["cu_seqlens"].tolist(), b["cu_seqlens_padded"].tolist()
    for s in range(len(cup) - 1):
        a, n = cup[s], cu[s + 1] - cu[s]
        want[a:a + n, a:a + n] = _hf_alone(n, window, chunk) if n else want[a:a + n, a:a + n]
    pad = b["padding_mask"].reshape(-1).bool()
    idx = torch.nonzero(pad).flatten()
    want[idx, idx] = True  # a padding query sees itself; its other entries are free, checked separately
    return want, pad


layouts = st.tuples(st.lists(st.integers(1, 23), min_size=1, max_size=5), st.sampled_from([1, 3, 8]),
                    st.booleans())
kinds = st.one_of(st.tuples(st.integers(1, 9), st.none()), st.tuples(st.none(), st.integers(1, 9)),
                  st.just((None, None)))


@settings(max_examples=60, deadline=None)
@given(layout=layouts, kind=kinds)
def test_dense_rule_equals_each_sample_alone(layout, kind):
    lengths, multiple, tail = layout
    window, chunk = kind
    total = None
    if tail:
        total = -(-sum(-(-L // multiple) * multiple for L in lengths) // multiple) * multiple + 2 * multiple
    b, _ = _row(lengths, multiple, total)
    got = dense_block_causal_mask(b["seq_idx"], b["padding_mask"], sliding_window=window, chunk_size=chunk)
    want, pad = _expected(b, window, chunk)
    real = ~pad
    # real queries: exactly the sample-alone mask (nothing across segments, no padding key)
    assert torch.equal(got[real], want[real])
    # padding queries: see themselves, never a real key of another segment
    seq = b["seq_idx"].reshape(-1)
    for q in torch.nonzero(pad).flatten().tolist():
        assert got[q, q]
        assert not bool((got[q] & (seq != seq[q])).any())
    # FlexAttention's mask_mod is the same rule, elementwise
    mod = SegmentCausalMaskMod(seq, b["padding_mask"].reshape(-1).bool(), window, chunk)
    T = seq.shape[0]
    q, k = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
    assert torch.equal(mod(0, 0, q.expand(T, T), k.expand(T, T)), got)
    # the sdpa / eager inputs of attention_inputs are this mask
    sd = attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"], "sdpa",
                          sliding_window=window, chunk_size=chunk)["attention_mask"]
    ea = attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"], "eager",
                          sliding_window=window, chunk_size=chunk)["attention_mask"]
    assert torch.equal(sd[0, 0], got)
    assert torch.equal(ea[0, 0] == 0, got)


def test_window_off_by_one_is_transformers_inequality():
    """``q - k < W``: a window of 3 lets query 5 see keys 3, 4, 5 (transformers: ``kv_idx > q_idx - W``)."""
    seq = torch.zeros(8, dtype=torch.long)
    m = dense_block_causal_mask(seq, sliding_window=3)
    assert m[5].nonzero().flatten().tolist() == [3, 4, 5]
    assert torch.equal(m, _hf_alone(8, 3, None))
    # chunks restart at each segment's first slot: segment 1 starts at slot 5, chunk 2 -> {5, 6}, {7, 8}
    seq = torch.tensor([0] * 5 + [1] * 4)
    assert segment_starts(seq).tolist() == [0] * 5 + [5] * 4
    c = dense_block_causal_mask(seq, chunk_size=2)
    assert c[6].nonzero().flatten().tolist() == [5, 6]
    assert c[8].nonzero().flatten().tolist() == [7, 8]
    assert c[4].nonzero().flatten().tolist() == [4]


def test_flex_block_mask_with_window_matches_dense():
    from torch.nn.attention.flex_attention import flex_attention

    b, _ = _row([13, 2, 20, 9], 8, 64)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    for window, chunk in ((5, None), (None, 6)):
        bm = flex_block_mask(b["seq_idx"], b["padding_mask"], block_size=16, sliding_window=window, chunk_size=chunk)
        dense = dense_block_causal_mask(b["seq_idx"], b["padding_mask"], sliding_window=window, chunk_size=chunk)
        out_flex = flex_attention(q, k, v, block_mask=bm)
        out_ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense[None, None])
        assert (out_flex - out_ref).abs().max() <= 1e-5


def test_sizes_checked_and_flash_refuses_long_chunks():
    seq = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="sliding_window must be a positive number of tokens"):
        dense_block_causal_mask(seq, sliding_window=0)
    with pytest.raises(ValueError, match="not both"):
        dense_block_causal_mask(seq, sliding_window=2, chunk_size=2)
    b, _ = _row([9, 3], 1)
    kw = attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"],
                          "flash_attention_2", sliding_window=4)
    assert set(kw) == {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}  # the layer applies W
    with pytest.raises(ValueError, match="flash_attention_2 cannot restrict attention to chunks of 4 tokens.*9 slots"):
        attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"],
                         "flash_attention_2", chunk_size=4)
    # every segment within one chunk: chunks change nothing, flash is exact
    attention_inputs(b["seq_idx"], b["padding_mask"], b["cu_seqlens_padded"], b["max_seqlen"], "flash_attention_2",
                     chunk_size=9)
