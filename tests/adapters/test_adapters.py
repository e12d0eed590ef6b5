"""seqpack.adapters: Megatron fields, flash kwargs, masks, FlexAttention, label conventions, gather/scatter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from _models import random_samples
from hypothesis import strategies as st

from seqpack.adapters import (
    additive_mask,
    as_batch,
    dense_block_causal_mask,
    flash_attn_kwargs,
    flex_block_mask,
    from_hf_flattening,
    gather_real,
    hf_unshifted_labels,
    real_token_indices,
    scatter_real,
    sdpa_mask,
    segments_from_doc_ids,
    shifted_from_hf_labels,
    to_megatron,
)
from seqpack.collate import InBatchPackingCollator
from seqpack.sample import Sample, shift_labels
from seqpack.packed import build_packed_sequence

IGN = -100


def _samples(lengths, seed=0, vocab=1000):
    return random_samples(lengths, vocab=vocab, seed=seed, prefix="doc")


def test_B18_interior_padding_gather_by_mask():
    idx, lengths = segments_from_doc_ids(torch.tensor([1, 1, 1, 0, 2, 2, 0, 0]))
    assert idx.tolist() == [0, 1, 2, 4, 5]
    assert lengths.tolist() == [3, 2]
    pad = torch.tensor([0, 0, 0, 1, 0, 0, 1, 1], dtype=torch.bool)
    assert real_token_indices(pad).tolist() == [0, 1, 2, 4, 5]
    x = torch.arange(8)[None, :, None].float() * 10  # [1, T, 1]
    real = gather_real(x, pad)
    assert real[:, 0].tolist() == [0, 10, 20, 40, 50]  # slot 3 never taken, slot 5 never dropped
    back = scatter_real(real, pad, fill=-1)
    assert back[:, 0].tolist() == [0, 10, 20, -1, 40, 50, -1, -1]
    with pytest.raises(ValueError, match="4 values for 5 real slots"):
        scatter_real(real[:4], pad)
    # the same on a row built by the collator (lengths [3, 2], multiple 4)
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(_samples((3, 2)))
    assert real_token_indices(b["padding_mask"]).tolist() == [0, 1, 2, 4, 5]


def test_B03_labels_never_cross_boundaries():
    a = Sample(np.array([11, 12, 13]), shift_labels(np.array([11, 12, 13]), np.ones(3, bool)), sample_id="A")
    b = Sample(np.array([21, 22]), shift_labels(np.array([21, 22]), np.ones(2, bool)), sample_id="B")
    row = build_packed_sequence([a, b], pad_token_id=0, seq_length=6, pad_to_max_length=True)
    batch = as_batch(row)
    assert batch["input_ids"][0].tolist() == [11, 12, 13, 21, 22, 0]
    assert batch["labels"][0].tolist() == [12, 13, IGN, 22, IGN, IGN]
    assert int(batch["loss_mask"].sum()) == 3
    hf = hf_unshifted_labels(batch["labels"][0], batch["cu_seqlens_padded"])
    assert hf.tolist() == [IGN, 12, 13, IGN, 22, IGN]
    assert shifted_from_hf_labels(hf, batch["cu_seqlens_padded"]).tolist() == [12, 13, IGN, 22, IGN, IGN]
    # in-batch collator, same layout
    c = InBatchPackingCollator(pad_token_id=0, seq_length=6, force_to_pad_to_seq_len=True)([a, b])
    assert c["labels"][0].tolist() == [12, 13, IGN, 22, IGN, IGN]
    # an explicit final target on a segment's last physical slot cannot be expressed unshifted
    with pytest.raises(ValueError, match="segment 0 has a target at its last physical slot 2"):
        hf_unshifted_labels(torch.tensor([12, 13, 99, 22, IGN]), torch.tensor([0, 3, 5]))


def test_megatron_fields():
    row = build_packed_sequence(_samples((5, 3)), pad_to_multiple_of=4, pad_token_id=0, seq_length=16,
                                pad_to_max_length=True)
    m = to_megatron(row)
    p = m["packed_seq_params"]
    assert p["qkv_format"] == "thd"
    assert p["cu_seqlens_q"].tolist() == [0, 5, 8] == p["cu_seqlens_kv"].tolist()
    assert p["cu_seqlens_q_padded"].tolist() == [0, 8, 16] == p["cu_seqlens_kv_padded"].tolist()  # B17
    assert p["cu_seqlens_q"].dtype == torch.int32 and p["cu_seqlens_q_padded"].dtype == torch.int32
    assert p["max_seqlen_q"] == p["max_seqlen_kv"] == 8 and isinstance(p["max_seqlen_q"], int)
    for k in ("tokens", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert m[k].shape == (1, 16), k
    assert m["loss_mask"].dtype == torch.float32 and m["padding_mask"].dtype == torch.bool
    assert int((~m["padding_mask"]).sum()) == 8
    dc = to_megatron(row, as_dataclass=True)["packed_seq_params"]
    assert dc.qkv_format == "thd" and dc.max_seqlen_kv == 8
    # static-shape boundary arrays (repeat-last) are trimmed by the true N (B19 form)
    padded = row.pad_cu_seqlens(4)
    assert to_megatron(padded)["packed_seq_params"]["cu_seqlens_q"].tolist() == [0, 5, 8]


def test_B02_each_cp_rank_slice_carries_boundaries():
    """One 1024-token row with 5 documents, cp=2: every rank's Megatron inputs carry the global
    cu_seqlens / cu_seqlens_padded (so THD attention can respect documents), per-token fields are the
    rank's zigzag slice; a slice stripped of its boundaries is refused."""
    from seqpack.parallel import slice_for_cp

    samples = _samples((300, 100, 250, 174, 196))
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, seq_length=1024,
                                   force_to_pad_to_seq_len=False)(samples)
    assert batch["input_ids"].shape == (1, 1024) and int(batch["num_segments"]) == 5
    seen = []
    for rank in range(2):
        local = slice_for_cp(batch, 2, rank)
        m = to_megatron(local)
        p = m["packed_seq_params"]
        assert p["cu_seqlens_q"].tolist() == batch["cu_seqlens"].tolist()
        assert p["cu_seqlens_q_padded"].tolist() == batch["cu_seqlens_padded"].tolist()
        assert p["max_seqlen_q"] == batch["max_seqlen"]
        assert m["tokens"].shape == (1, 512)
        idx = torch.as_tensor(local["cp_indices"])
        assert torch.equal(m["position_ids"][0], batch["position_ids"][0, idx])
        seen.append(idx)
        stripped = {k: v for k, v in local.items() if not k.startswith("cu_seqlens")}
        with pytest.raises(KeyError, match="B02"):
            to_megatron(stripped)
    assert sorted(torch.cat(seen).tolist()) == list(range(1024))


def test_flash_kwargs_use_physical_boundaries():
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(_samples((5, 3)))
    fk = flash_attn_kwargs(b)
    assert fk["cu_seq_lens_q"].tolist() == [0, 8, 12] and fk["cu_seq_lens_k"].dtype == torch.int32
    assert fk["max_length_q"] == fk["max_length_k"] == 8
    assert all(isinstance(fk[k], int) for k in ("max_length_q", "max_length_k"))


def test_dense_masks():
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(_samples((3, 2)))
    m = dense_block_causal_mask(b["seq_idx"], b["padding_mask"])
    # slots: a a a P | b b P P
    assert m[2].nonzero().flatten().tolist() == [0, 1, 2]
    assert m[4].nonzero().flatten().tolist() == [4]
    assert m[5].nonzero().flatten().tolist() == [4, 5]
    assert m[3].nonzero().flatten().tolist() == [0, 1, 2, 3]  # a pad query sees its segment + itself
    assert m[7].nonzero().flatten().tolist() == [4, 5, 7]
    assert not m[:, 3].any() or m[:, 3].nonzero().flatten().tolist() == [3]  # no one else reads a pad key
    s = sdpa_mask(b)
    assert s.shape == (1, 1, 8, 8) and s.dtype == torch.bool and torch.equal(s[0, 0], m)
    a = additive_mask(b, dtype=torch.float64)
    assert a.dtype == torch.float64 and (a[0, 0][m] == 0).all()
    assert (a[0, 0][~m] == torch.finfo(torch.float64).min).all()
    # no mask row is empty (SDPA would give NaN)
    assert m.any(dim=1).all()


def test_flex_block_mask_matches_dense():
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, seq_length=64,
                               force_to_pad_to_seq_len=True)(_samples((13, 2, 20)))
    bm = flex_block_mask(b, block_size=16)
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    out_flex = flex_attention(q, k, v, block_mask=bm)
    out_ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask(b))
    assert (out_flex - out_ref).abs().max() <= 1e-5


def test_from_hf_flattening_roundtrip():
    from transformers import DataCollatorWithFlattening

    samples = _samples((4, 6, 3))
    feats = []
    for s in samples:  # HF features: unshifted labels
        hf = np.full(s.length, IGN)
        hf[1:] = s.labels[:-1]
        feats.append({"input_ids": s.input_ids.tolist(), "labels": hf.tolist()})
    ours = InBatchPackingCollator(pad_token_id=0)(samples)
    for kw in ({}, {"return_flash_attn_kwargs": True}, {"return_seq_idx": True}):
        out = DataCollatorWithFlattening(return_tensors="pt", **kw)(feats)
        canon = from_hf_flattening(out)
        for key in ("input_ids", "labels", "position_ids", "seq_idx", "padding_mask"):
            assert torch.equal(canon[key], ours[key].to(canon[key].dtype)), (kw, key)
        assert canon["cu_seqlens"].tolist() == [0, 4, 10, 13] == canon["cu_seqlens_padded"].tolist()
    with pytest.raises(KeyError, match="return_flash_attn_kwargs"):
        from_hf_flattening({"input_ids": torch.zeros(1, 3, dtype=torch.long)})


def test_as_batch_requires_boundaries():
    with pytest.raises(KeyError, match="never inferred"):
        as_batch({"input_ids": torch.zeros(5, dtype=torch.long), "position_ids": torch.tensor([0, 1, 2, 0, 1])})


@settings(deadline=None, max_examples=40)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=6), st.sampled_from([1, 2, 4, 8]))
def test_mask_property_real_tokens_see_only_own_prefix(lengths, multiple):
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=multiple)(_samples(lengths))
    m = dense_block_causal_mask(b["seq_idx"], b["padding_mask"])
    cup = b["cu_seqlens_padded"].tolist()
    for i, L in enumerate(lengths):
        for j in range(L):
            q = cup[i] + j
            assert m[q].nonzero().flatten().tolist() == list(range(cup[i], q + 1))


def test_B19_sentinel_boundaries_trimmed():
    """cu_seqlens padded with -1 sentinels (Megatron-Bridge Parquet) or repeated values: trimmed to
    [0, 5, 8], never to an empty tensor, int32, 1-D, starting at 0."""
    row = build_packed_sequence(_samples((5, 3)), pad_token_id=0)
    for cu, cup in (([0, 5, 8, -1, -1], [0, 5, 8, -1, -1]), ([0, 5, 8], [0, 5, 8]), ([0, 5, 8, 8], [0, 5, 8, 8])):
        d = {"input_ids": torch.as_tensor(row.input_ids), "labels": torch.as_tensor(row.labels),
             "cu_seqlens": torch.tensor(cu), "cu_seqlens_padded": torch.tensor(cup)}
        b = as_batch(d)
        assert b["cu_seqlens"].tolist() == [0, 5, 8] and b["cu_seqlens"].dtype == torch.int32
        assert b["num_segments"] == 2
        d["position_ids"], d["padding_mask"] = b["position_ids"], b["padding_mask"]
        assert to_megatron(d)["packed_seq_params"]["cu_seqlens_q"].tolist() == [0, 5, 8]
    # the in-batch tail-segment layout keeps its repeated logical boundary
    t = InBatchPackingCollator(pad_token_id=0, seq_length=12, force_to_pad_to_seq_len=True)(_samples((5, 3)))
    assert as_batch({k: t[k] for k in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded")}
                    )["cu_seqlens"].tolist() == [0, 5, 8, 8]
