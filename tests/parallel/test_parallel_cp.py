"""Context-parallel slicing (seqpack.parallel.cp): cases B02, B21, B22, B23 and round-trip properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.sample import Sample, shift_labels
from seqpack.packed import build_packed_sequence
from seqpack.parallel import (
    CPConfigError,
    check_divisibility,
    compute_pad_multiple,
    cp_partition_indices,
    gather_from_cp,
    slice_for_cp,
    validate_cp_attention,
)
from seqpack import padding


def mk(ids, sid):
    ids = np.asarray(ids)
    return Sample(ids, shift_labels(ids, np.ones(len(ids), bool)), sid)


def test_compute_pad_multiple_is_reexported_not_reimplemented():
    import seqpack.parallel as par

    assert par.compute_pad_multiple is padding.compute_pad_multiple


def test_B21_zigzag_per_segment_not_over_whole_row():
    cup = np.array([0, 8, 16], dtype=np.int32)
    r0 = cp_partition_indices(cup, 2, 0)
    r1 = cp_partition_indices(cup, 2, 1)
    assert r0.tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert r1.tolist() == [2, 3, 4, 5, 10, 11, 12, 13]
    assert r0.tolist() != [0, 1, 2, 3, 12, 13, 14, 15]  # the buggy whole-stream zigzag
    assert r0.dtype == np.int64 and len(r0) == len(r1)
    assert sorted(np.concatenate([r0, r1]).tolist()) == list(range(16))


def test_B22_same_global_indices_for_every_per_token_field():
    p = build_packed_sequence([mk([11, 12, 13, 14], "a"), mk([21, 22, 23, 24], "b")], pad_to_multiple_of=4,
                              pad_token_id=0)
    assert p.cu_seqlens.tolist() == [0, 4, 8]
    table = np.arange(8 * 3).reshape(8, 3) * 10  # per-token RoPE-like table [T, D]
    p.extra["rope_table"] = table
    p.extra["mrope_position_ids"] = np.stack([p.position_ids, p.position_ids + 100, p.position_ids + 200])  # [3, T]
    s0, s1 = slice_for_cp(p, 2, 0), slice_for_cp(p, 2, 1)
    assert s0.extra["cp_indices"].tolist() == [0, 3, 4, 7]
    assert s1.extra["cp_indices"].tolist() == [1, 2, 5, 6]
    assert s0.position_ids.tolist() == [0, 3, 0, 3]
    assert s0.input_ids.tolist() == [11, 14, 21, 24]
    assert s0.labels.tolist() == [12, -100, 22, -100]
    assert s0.loss_mask.tolist() == [True, False, True, False]
    assert s0.seq_idx.tolist() == [0, 0, 1, 1]
    assert s0.padding_mask.tolist() == [False] * 4
    # packed-table lookup uses global rows [0,3,4,7], not local [0,3,0,3]
    assert np.array_equal(s0.extra["rope_table"], table[[0, 3, 4, 7]])
    assert s0.extra["mrope_position_ids"][1].tolist() == [100, 103, 100, 103]
    # boundaries and max_seqlen stay global
    assert s0.cu_seqlens.tolist() == [0, 4, 8] and s0.cu_seqlens_padded.tolist() == [0, 4, 8] and s0.max_seqlen == 4
    back = gather_from_cp([s0, s1])
    for f in ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask", "seq_idx"):
        assert np.array_equal(getattr(back, f), getattr(p, f)), f
    assert np.array_equal(back.extra["rope_table"], table)
    back.validate(context_parallel_size=2)


def test_B22_torch_mapping_slice_and_differentiable_gather():
    torch = pytest.importorskip("torch")
    p = build_packed_sequence([mk([1, 2, 3, 4, 5], "a"), mk([6, 7, 8], "b")], pad_to_multiple_of=4,
                              pad_token_id=0, seq_length=16, pad_to_max_length=True)
    d = p.to_torch()
    parts = [slice_for_cp(d, 2, r) for r in range(2)]
    assert parts[0]["input_ids"].dtype == torch.int64 and parts[0]["cu_seqlens"] is d["cu_seqlens"]
    assert parts[0]["max_seqlen"] == d["max_seqlen"]
    np.testing.assert_array_equal(parts[0]["cp_indices"], cp_partition_indices(d["cu_seqlens_padded"], 2, 0))
    full = gather_from_cp([x["position_ids"] for x in parts], d["cu_seqlens_padded"])
    assert torch.equal(full, d["position_ids"])
    # hidden states [t, H] gather with gradient flowing back to each rank's slice
    h = [torch.randn(8, 3, requires_grad=True) for _ in range(2)]
    g = gather_from_cp(h, d["cu_seqlens_padded"], axis=0)
    (g * torch.arange(16.0).view(16, 1)).sum().backward()
    assert h[0].grad[:, 0].tolist() == cp_partition_indices(d["cu_seqlens_padded"], 2, 0).astype(float).tolist()
    # a batched [1, T] row is sliced on its last axis
    b = {k: (v.unsqueeze(0) if k in ("input_ids", "labels") else v) for k, v in d.items()}
    sb = slice_for_cp(b, 2, 1)
    assert tuple(sb["input_ids"].shape) == (1, 8)


def test_B23_capacity_150_rejected_before_any_data():
    m = compute_pad_multiple(context_parallel_size=2)
    with pytest.raises(CPConfigError, match=r"seq_length=150.*multiple 4.*context_parallel_size=2.*148 or 152"):
        check_divisibility(150, m, context_parallel_size=2)
    check_divisibility(152, m, context_parallel_size=2)  # fine


def test_local_boundaries_of_a_cp_slice():
    from seqpack.parallel import cp_local_cu_seqlens_padded

    cup = np.array([0, 8, 12, 20], dtype=np.int32)
    local = cp_local_cu_seqlens_padded(cup, 2)
    assert local.tolist() == [0, 4, 6, 10] and local.dtype == np.int32
    # each rank's slice really holds segment i at local slots [local[i], local[i+1])
    seq_idx = np.repeat(np.arange(3), np.diff(cup))
    for r in range(2):
        got = seq_idx[cp_partition_indices(cup, 2, r)]
        assert got.tolist() == np.repeat(np.arange(3), np.diff(local)).tolist()
    with pytest.raises(ValueError, match="segment 1"):
        cp_local_cu_seqlens_padded([0, 8, 14], 2)


def test_B23_cp_slices_of_padded_row():
    m = compute_pad_multiple(context_parallel_size=2)
    p = build_packed_sequence([mk(np.arange(1, L + 1), f"s{L}") for L in (5, 3, 7)], pad_to_multiple_of=m,
                              pad_token_id=0, seq_length=24)
    assert p.cu_seqlens_padded.tolist() == [0, 8, 12, 20]
    idx = [cp_partition_indices(p.cu_seqlens_padded, 2, r) for r in range(2)]
    assert idx[0].tolist() == [0, 1, 6, 7, 8, 11, 12, 13, 18, 19]
    assert idx[1].tolist() == [2, 3, 4, 5, 9, 10, 14, 15, 16, 17]


def test_unaligned_segment_error_names_segment_and_fix():
    with pytest.raises(ValueError, match=r"segment 1 has padded length 6.*not divisible by 2\*context_parallel_size=4"
                                         r".*compute_pad_multiple"):
        cp_partition_indices([0, 8, 14], 2, 0)
    with pytest.raises(ValueError, match="cp_rank=2 out of range"):
        cp_partition_indices([0, 8], 2, 2)


def test_B19_static_padded_boundaries_are_trimmed_before_partition():
    a = cp_partition_indices(np.array([0, 8, 16, -1, -1]), 2, 0)
    b = cp_partition_indices(np.array([0, 8, 16, 16, 16]), 2, 0)
    assert a.tolist() == b.tolist() == [0, 1, 6, 7, 8, 9, 14, 15]


def test_cp1_is_identity():
    assert cp_partition_indices([0, 3, 10], 1, 0).tolist() == list(range(10))


@settings(deadline=None, max_examples=60)
@given(st.sampled_from([1, 2, 3, 4]), st.lists(st.integers(1, 20), min_size=1, max_size=6), st.data())
def test_property_partition_and_roundtrip(cp, lens, data):
    m = compute_pad_multiple(context_parallel_size=cp)
    samples = [mk(np.arange(1, L + 1) + 10 * i, f"s{i}") for i, L in enumerate(lens)]
    p = build_packed_sequence(samples, pad_to_multiple_of=m, pad_token_id=0)
    parts = [cp_partition_indices(p.cu_seqlens_padded, cp, r) for r in range(cp)]
    # union is every slot once, equal sizes, each rank holds 2 chunks per segment in order
    assert sorted(np.concatenate(parts).tolist()) == list(range(p.length))
    assert len({len(x) for x in parts}) == 1
    r = data.draw(st.integers(0, cp - 1))
    cup = p.cu_seqlens_padded.astype(int)
    expect = []
    for i in range(p.num_segments):
        c = (cup[i + 1] - cup[i]) // (2 * cp)
        expect += list(range(cup[i] + r * c, cup[i] + (r + 1) * c))
        expect += list(range(cup[i] + (2 * cp - 1 - r) * c, cup[i] + (2 * cp - r) * c))
    if cp == 1:
        expect = list(range(p.length))
    assert parts[r].tolist() == expect
    back = gather_from_cp([slice_for_cp(p, cp, k) for k in range(cp)])
    assert np.array_equal(back.input_ids, p.input_ids) and np.array_equal(back.labels, p.labels)
    back.validate(context_parallel_size=cp)


def test_B02_boundary_blind_cp_attention_is_refused():
    with pytest.raises(CPConfigError,
                       match=r"attention_backend='ring_flash_attn'.*context_parallel_size=2.*5 segments"):
        validate_cp_attention("ring_flash_attn", 2, num_segments=5)
    with pytest.raises(CPConfigError, match="unknown number of segments"):
        validate_cp_attention("sdpa", 4)
    with pytest.raises(CPConfigError, match="not known to take segment boundaries"):
        validate_cp_attention("my_custom_attn", 2, num_segments=3)
    with pytest.raises(CPConfigError, match="cp_comm_type='all_gather'.*p2p"):
        validate_cp_attention("te", 2, num_segments=3, cp_comm_type="all_gather")
    for name in ("flex", "local", "eager"):
        with pytest.raises(CPConfigError, match=name):
            validate_cp_attention(name, 2, num_segments=2)
    # accepted: boundary-aware paths, single-document rows, CP = 1
    validate_cp_attention("flash", 2, num_segments=4)
    validate_cp_attention("te", 2, num_segments=8, cp_comm_type="p2p")
    validate_cp_attention("ring_flash_attn_varlen", 4, num_segments=None)
    validate_cp_attention("ring_flash_attn", 2, num_segments=1)
    validate_cp_attention("ring_flash_attn", 1, num_segments=9)


def test_B21_matches_transformer_engine_when_available():
    torch = pytest.importorskip("torch")
    tex = pytest.importorskip("transformer_engine_torch")
    if not torch.cuda.is_available():
        pytest.skip("Transformer Engine's THD partition kernel needs CUDA")
    cup = torch.tensor([0, 8, 24, 32, 96], dtype=torch.int32, device="cuda")
    for cp in (2, 4):
        for r in range(cp):
            te = tex.thd_get_partitioned_indices(cup, 96, cp, r).cpu().numpy().astype(np.int64)
            assert te.tolist() == cp_partition_indices(cup, cp, r).tolist()
