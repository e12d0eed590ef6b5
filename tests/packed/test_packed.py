"""Tests for the canonical packed row (seqpack.packed) against packed-batch-spec.md."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from seqpack.sample import Sample, shift_labels
from seqpack.packed import (
    IGNORE_INDEX as IGN,
    PackedSequence,
    PackedSequenceError,
    build_packed_sequence,
    pad_cu_seqlens,
    trim_cu_seqlens,
)
from seqpack.padding import compute_pad_multiple

PAD = 0


def mk(ids, sid, trainable=None, final_target=None):
    ids = np.asarray(ids)
    tr = np.ones(len(ids), bool) if trainable is None else np.asarray(trainable, bool)
    return Sample(ids, shift_labels(ids, tr, final_target), sid)


# ---------------------------------------------------------------- spec example and cases
def test_spec_example_layout():
    p = build_packed_sequence([mk([1, 2, 3], "a"), mk([4, 5], "b")], pad_to_multiple_of=4, pad_token_id=PAD,
                              seq_length=12, pad_to_max_length=True).validate(capacity=12)
    assert p.cu_seqlens.tolist() == [0, 3, 5]
    assert p.cu_seqlens_padded.tolist() == [0, 4, 12]
    assert p.seq_idx.tolist() == [0] * 4 + [1] * 8
    assert p.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]
    assert p.padding_mask.tolist() == [False] * 3 + [True] + [False] * 2 + [True] * 6
    assert p.input_ids.tolist() == [1, 2, 3, PAD, 4, 5] + [PAD] * 6
    assert p.max_seqlen == 8 and p.num_segments == 2 and p.seq_lens.tolist() == [3, 2]
    assert p.cu_seqlens.dtype == np.int32 and p.input_ids.dtype == np.int64 and p.seq_idx.dtype == np.int32


def test_B03_label_shift_never_crosses_boundary():
    p = build_packed_sequence([mk([11, 12, 13], "A"), mk([21, 22], "B")], pad_token_id=PAD, seq_length=6,
                              pad_to_max_length=True).validate(capacity=6)
    assert p.input_ids.tolist() == [11, 12, 13, 21, 22, PAD]
    assert p.labels.tolist() == [12, 13, IGN, 22, IGN, IGN]
    assert p.num_loss_tokens == 3
    assert p.hf_unshifted_labels().tolist() == [IGN, 12, 13, IGN, 22, IGN]
    assert p.loss_mask.tolist() == [True, True, False, True, False, False]


def test_B17_real_and_padded_boundaries_kept_apart():
    p = build_packed_sequence([mk(range(1, 6), "a"), mk([7, 8, 9], "b")], pad_to_multiple_of=4, pad_token_id=PAD,
                              seq_length=16, pad_to_max_length=True).validate(capacity=16, multiple=4)
    assert p.cu_seqlens.tolist() == [0, 5, 8]
    assert p.cu_seqlens_padded.tolist() == [0, 8, 16]
    assert p.num_real_tokens == 8
    assert np.all(np.diff(p.cu_seqlens_padded) % 4 == 0)
    assert np.all(np.diff(p.cu_seqlens) <= np.diff(p.cu_seqlens_padded))


def test_B23_cp2_pads_every_segment_to_multiple_of_four():
    m = compute_pad_multiple(context_parallel_size=2)
    assert m == 4
    samples = [mk(np.arange(1, L + 1), f"s{L}") for L in (5, 3, 7)]
    p = build_packed_sequence(samples, pad_to_multiple_of=m, pad_token_id=PAD, seq_length=24)
    p.validate(capacity=24, context_parallel_size=2)
    assert np.diff(p.cu_seqlens_padded).tolist() == [8, 4, 8]
    assert p.cu_seqlens_padded.tolist() == [0, 8, 12, 20]
    assert p.cu_seqlens.tolist() == [0, 5, 8, 15]
    # a row built without the CP multiple is refused by invariant 8
    q = build_packed_sequence(samples, pad_token_id=PAD, seq_length=24)
    with pytest.raises(PackedSequenceError, match="invariant 8.*segment 0"):
        q.validate(context_parallel_size=2)


def test_B23_seq_length_not_divisible_names_both_keys():
    with pytest.raises(ValueError, match="seq_length=150.*pad_to_multiple_of=4"):
        build_packed_sequence([mk([1, 2], "a")], pad_to_multiple_of=4, pad_token_id=PAD, seq_length=150)


def test_B24_builder_refuses_plan_exceeding_capacity():
    # planner assumed multiple 2 (6+6 = 12 fits), the packer pads to 4 (8+8 = 16 > 12)
    a, b = mk(np.arange(1, 6), "doc-a"), mk(np.arange(1, 6), "doc-b")
    with pytest.raises(ValueError, match=r"needs 16 slots.*seq_length=12.*doc-a:5->8.*doc-b:5->8"):
        build_packed_sequence([a, b], pad_to_multiple_of=4, pad_token_id=PAD, seq_length=12)
    # each alone fits
    for s in (a, b):
        build_packed_sequence([s], pad_to_multiple_of=4, pad_token_id=PAD, seq_length=12).validate(12, multiple=4)


def test_B24_with_pack_lengths_one_source_of_truth():
    from seqpack.algorithms import pack_lengths

    # 5 rounds up to 8 for multiple 4: two 8s do not share a 12-token pack, although 5 + 5 would fit
    plan = pack_lengths(np.array([5, 5]), 12, pad_to_multiple_of=4)
    assert plan.num_bins == 2
    assert plan.bin_loads.tolist() == [8, 8]
    samples = [mk(np.arange(1, 6), "a"), mk(np.arange(1, 6), "b")]
    for b, load in zip(plan.bins, plan.bin_loads):
        p = build_packed_sequence([samples[i] for i in b], pad_to_multiple_of=4, pad_token_id=PAD, seq_length=12)
        assert p.length == load == 8


def test_B19_trim_cu_seqlens():
    a = trim_cu_seqlens(np.array([0, 5, 8, -1, -1], dtype=np.int64))
    b = trim_cu_seqlens(np.array([0, 5, 8]))
    c = trim_cu_seqlens(np.array([0, 5, 8, 8, 8], dtype=np.int32))
    for x in (a, b, c):
        assert x.tolist() == [0, 5, 8] and x.dtype == np.int32 and x.ndim == 1 and x.flags.c_contiguous
    assert trim_cu_seqlens(np.array([0, 5, 8, 8, 8]), num_segments=2).tolist() == [0, 5, 8]
    torch = pytest.importorskip("torch")
    t = trim_cu_seqlens(torch.tensor([0, 5, 8, -1, -1]))
    assert isinstance(t, torch.Tensor) and t.tolist() == [0, 5, 8] and t.dtype == torch.int32
    with pytest.raises(ValueError, match="start at 0"):
        trim_cu_seqlens(np.array([1, 5]))
    with pytest.raises(ValueError, match="num_segments=3"):
        trim_cu_seqlens(np.array([0, 5, 8]), num_segments=3)


def test_B19_static_cu_seqlens_repeat_last_and_roundtrip():
    p = build_packed_sequence([mk([1, 2, 3], "a"), mk([4, 5], "b")], pad_to_multiple_of=2, pad_token_id=PAD,
                              seq_length=8, pad_to_max_length=True)
    q = pad_cu_seqlens(p, 4)
    assert q.cu_seqlens.tolist() == [0, 3, 5, 5, 5, 5]
    assert q.cu_seqlens_padded.tolist() == [0, 4, 8, 8, 8, 8]
    assert q.num_segments == 2 and -1 not in q.cu_seqlens.tolist()
    q.validate(capacity=8)
    assert trim_cu_seqlens(q.cu_seqlens_padded, q.num_segments).tolist() == [0, 4, 8]
    pinned = p.pad_cu_seqlens(4, pin_max_seqlen=True)
    assert pinned.max_seqlen == 8
    pinned.validate()
    # rebuilt from the static columns gives back the same row
    r = PackedSequence.from_boundaries(q.input_ids, q.labels, q.cu_seqlens, q.cu_seqlens_padded, q.sample_ids,
                                       num_segments=2)
    assert r.cu_seqlens.tolist() == [0, 3, 5] and r.position_ids.tolist() == p.position_ids.tolist()
    # sentinels are rejected by validate
    bad = pad_cu_seqlens(p, 4)
    bad.cu_seqlens[3:] = -1
    with pytest.raises(PackedSequenceError, match="invariant 2.*never -1"):
        bad.validate()


def test_pad_cu_seqlens_on_a_row_read_back_from_storage():
    p = build_packed_sequence([mk([1, 2, 3], "a"), mk([4, 5], "b")], pad_token_id=PAD, seq_length=8,
                              pad_to_max_length=True)
    r = PackedSequence.from_boundaries(p.input_ids, p.labels, p.cu_seqlens, p.cu_seqlens_padded, p.sample_ids,
                                       extra={"seq_length": 8})
    q = pad_cu_seqlens(r, 3)
    assert q.cu_seqlens_padded.tolist() == [0, 3, 8, 8, 8] and q.num_segments == 2
    q.validate(capacity=8)
    r2 = PackedSequence.from_boundaries(p.input_ids, p.labels, p.cu_seqlens, p.cu_seqlens_padded)
    with pytest.raises(ValueError, match="seq_length=None"):
        pad_cu_seqlens(r2, 3)


def test_pad_cu_seqlens_errors():
    p = build_packed_sequence([mk([1, 2, 3], "a")], pad_token_id=PAD, seq_length=8)
    with pytest.raises(ValueError, match="missing from the packed dataset's metadata"):
        pad_cu_seqlens(p, None)
    with pytest.raises(ValueError, match="padded to the same length.*pad_to_max_length=True"):
        pad_cu_seqlens(p, 4)
    full = build_packed_sequence([mk([1, 2], "a"), mk([3, 4], "b")], pad_token_id=PAD, seq_length=8,
                                 pad_to_max_length=True)
    with pytest.raises(ValueError, match="max_samples_per_bin=1 < this row's 2 segments"):
        pad_cu_seqlens(full, 1)


def test_builder_errors():
    with pytest.raises(ValueError, match="empty sample list"):
        build_packed_sequence([], pad_token_id=PAD)
    with pytest.raises(ValueError, match="'e'.*empty"):
        build_packed_sequence([mk([1], "x"), Sample(np.array([], np.int32), np.array([], np.int32), "e")],
                              pad_token_id=PAD)
    with pytest.raises(ValueError, match="needs seq_length"):
        build_packed_sequence([mk([1], "x")], pad_token_id=PAD, pad_to_max_length=True)
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        build_packed_sequence([mk([1], "x")], pad_token_id=PAD, pad_to_multiple_of=0)


def test_explicit_final_target_B12_is_allowed_and_media_order():
    a = mk([1, 2, 3], "trunc", final_target=99)
    a.media = {"pixel_values": "A"}
    b = mk([4, 5], "b")
    c = mk([6], "c")
    c.media = {"pixel_values": "C"}
    p = build_packed_sequence([a, b, c], pad_to_multiple_of=2, pad_token_id=PAD).validate()
    assert p.labels[2] == 99 and p.extra["has_final_target"].tolist() == [True, False, False]
    assert p.hf_unshifted_labels()[3] == 99  # representable: a padding slot follows
    assert p.media == [{"pixel_values": "A"}, None, {"pixel_values": "C"}]
    assert p.sample_ids == ["trunc", "b", "c"]


def test_B12_hf_unshifted_labels_drops_final_target_without_padding_slot():
    # multiple 1: the final target 99 sits on segment 0's last physical slot; in the unshifted layout it
    # would land on segment 1's first slot, which must stay -100 (case B03), so that one target is dropped
    p = build_packed_sequence([mk([1, 2, 3], "trunc", final_target=99), mk([4, 5], "b")], pad_token_id=PAD,
                              seq_length=5, pad_to_max_length=True)
    assert p.labels.tolist() == [2, 3, 99, 5, IGN]
    assert p.hf_unshifted_labels().tolist() == [IGN, 2, 3, IGN, 5]
    # static boundary arrays (num_segments < len(cu_seqlens) - 1) give the same labels
    s = pad_cu_seqlens(p, 4)
    assert s.cu_seqlens_padded.tolist() == [0, 3, 5, 5, 5, 5] and s.num_segments == 2
    assert s.hf_unshifted_labels().tolist() == [IGN, 2, 3, IGN, 5]


def test_prompt_tokens_masked_and_B04_real_length_from_metadata():
    eos = 2  # pad id == EOS id: the real length must not be found by scanning for it
    s = mk([7, 8, eos, 9, 10, eos], "chat", trainable=[0, 0, 0, 1, 1, 1])
    p = build_packed_sequence([s], pad_to_multiple_of=4, pad_token_id=eos, seq_length=8,
                              pad_to_max_length=True).validate(8)
    assert p.cu_seqlens.tolist() == [0, 6]
    assert p.labels.tolist()[:6] == [IGN, IGN, 9, 10, eos, IGN]
    assert p.num_real_tokens == 6


def test_to_torch_dtypes():
    torch = pytest.importorskip("torch")
    p = build_packed_sequence([mk([1, 2, 3], "a"), mk([4, 5], "b")], pad_to_multiple_of=4, pad_token_id=PAD)
    p.extra["mrope_position_ids"] = np.stack([p.position_ids] * 3)
    d = p.to_torch()
    assert d["input_ids"].dtype == torch.int64 and d["labels"].dtype == torch.int64
    assert d["position_ids"].dtype == torch.int64 and d["loss_mask"].dtype == torch.bool
    assert d["padding_mask"].dtype == torch.bool and d["seq_idx"].dtype == torch.int32
    assert d["cu_seqlens"].dtype == torch.int32 and d["cu_seqlens_padded"].tolist() == [0, 4, 8]
    assert d["max_seqlen"] == 4 and isinstance(d["max_seqlen"], int)
    assert tuple(d["mrope_position_ids"].shape) == (3, 8)
    assert "has_final_target" not in d


def test_from_boundaries_rebuilds_everything():
    p = build_packed_sequence([mk([1, 2, 3], "a"), mk([4, 5, 6, 7, 8], "b")], pad_to_multiple_of=4,
                              pad_token_id=PAD, seq_length=12, pad_to_max_length=True)
    r = PackedSequence.from_boundaries(p.input_ids, p.labels, p.cu_seqlens, p.cu_seqlens_padded, p.sample_ids)
    r.validate(capacity=12)
    for f in ("input_ids", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded", "seq_lens",
              "padding_mask", "seq_idx"):
        assert np.array_equal(getattr(r, f), getattr(p, f)), f
    assert r.max_seqlen == p.max_seqlen and r.num_segments == 2
    with pytest.raises(PackedSequenceError, match="invariant 2"):
        PackedSequence.from_boundaries(p.input_ids, p.labels, [0, 3, 8], [0, 4, 10])
    with pytest.raises(PackedSequenceError, match="invariant 3.*segment 1"):
        PackedSequence.from_boundaries(p.input_ids, p.labels, [0, 3, 12], [0, 4, 12])


# ---------------------------------------------------------------- hypothesis: build -> validate, mutations raise
seg_len = st.integers(min_value=1, max_value=12)


@st.composite
def packs(draw):
    n = draw(st.integers(1, 5))
    lens = draw(st.lists(seg_len, min_size=n, max_size=n))
    mult = draw(st.sampled_from([1, 2, 4, 8]))
    samples = []
    for i, L in enumerate(lens):
        ids = draw(st.lists(st.integers(1, 50), min_size=L, max_size=L))
        tr = draw(st.lists(st.booleans(), min_size=L, max_size=L))
        samples.append(mk(ids, f"s{i}", trainable=tr))
    total = sum(-(-L // mult) * mult for L in lens)
    extra = draw(st.integers(0, 3)) * mult
    return samples, mult, total + extra, draw(st.booleans())


@settings(deadline=None, max_examples=100)
@given(packs())
def test_property_build_validates(case):
    samples, mult, seq_length, to_max = case
    p = build_packed_sequence(samples, pad_to_multiple_of=mult, pad_token_id=PAD, seq_length=seq_length,
                              pad_to_max_length=to_max)
    p.validate(capacity=seq_length, multiple=mult)
    assert p.num_real_tokens == sum(s.length for s in samples)
    assert p.num_loss_tokens == sum(s.num_trainable for s in samples)
    if to_max:
        assert p.length == seq_length
    # per-segment content round-trips
    for i, s in enumerate(samples):
        a = int(p.cu_seqlens_padded[i])
        assert p.input_ids[a:a + s.length].tolist() == s.input_ids.tolist()
        assert p.labels[a:a + s.length].tolist() == s.labels.tolist()
    # offline rebuild agrees
    r = PackedSequence.from_boundaries(p.input_ids, p.labels, p.cu_seqlens, p.cu_seqlens_padded, p.sample_ids,
                                       has_final_target=p.extra["has_final_target"])
    assert np.array_equal(r.position_ids, p.position_ids) and np.array_equal(r.padding_mask, p.padding_mask)


@settings(deadline=None, max_examples=100)
@given(packs(), st.sampled_from(["cross_label", "position", "padding_flip", "seq_idx", "loss_mask",
                                 "pad_label", "inner_label", "max_seqlen", "seq_lens", "cu_real"]),
       st.integers(0, 10_000))
def test_property_mutations_are_caught(case, kind, r):
    samples, mult, seq_length, to_max = case
    p = build_packed_sequence(samples, pad_to_multiple_of=mult, pad_token_id=PAD, seq_length=seq_length,
                              pad_to_max_length=to_max)
    n, t = p.num_segments, p.length
    expect = None
    if kind == "cross_label":
        assume(n >= 2)
        i = r % (n - 1)
        last = int(p.cu_seqlens_padded[i] + p.seq_lens[i] - 1)
        p.labels[last] = p.input_ids[int(p.cu_seqlens_padded[i + 1])]
        p.loss_mask[last] = True
        expect = "invariant 7"
    elif kind == "position":
        s = r % t
        p.position_ids[s] += 1
        expect = "invariant 5"
    elif kind == "padding_flip":
        s = r % t
        p.padding_mask[s] = ~p.padding_mask[s]
        expect = "invariant 4"
    elif kind == "seq_idx":
        s = r % t
        p.seq_idx[s] = (p.seq_idx[s] + 1) % (n + 1)
        expect = "invariant 4"
    elif kind == "loss_mask":
        s = r % t
        p.loss_mask[s] = ~p.loss_mask[s]
        expect = "invariant 6"
    elif kind == "pad_label":
        pads = np.flatnonzero(p.padding_mask)
        assume(pads.size > 0)
        s = int(pads[r % pads.size])
        p.labels[s] = 5
        p.loss_mask[s] = True
        expect = "invariant 6"
    elif kind == "inner_label":
        real = np.flatnonzero(~p.padding_mask & p.loss_mask)
        assume(real.size > 0)
        s = int(real[r % real.size])
        p.labels[s] = 1000  # token ids are < 51, so this never equals the next token
        expect = "invariant 7"
    elif kind == "max_seqlen":
        p.max_seqlen -= 1
        expect = "invariant 9"
    elif kind == "seq_lens":
        p.seq_lens[r % n] += 1
        expect = "invariant 10"
    elif kind == "cu_real":
        assume(n >= 2)
        i = 1 + r % (n - 1)
        p.cu_seqlens[i] -= 1
        expect = "invariant"
    with pytest.raises(PackedSequenceError, match=expect):
        p.validate(capacity=seq_length, multiple=mult)


def test_validate_dtype_and_shape_errors():
    p = build_packed_sequence([mk([1, 2, 3], "a")], pad_token_id=PAD)
    p.cu_seqlens = p.cu_seqlens.astype(np.int64)
    with pytest.raises(PackedSequenceError, match="invariant 1.*cu_seqlens.*int32"):
        p.validate()
    p = build_packed_sequence([mk([1, 2, 3], "a")], pad_token_id=PAD)
    p.labels = p.labels[:-1]
    with pytest.raises(PackedSequenceError, match="invariant 1.*labels"):
        p.validate()
    p = build_packed_sequence([mk([1, 2, 3], "a")], pad_token_id=PAD)
    with pytest.raises(PackedSequenceError, match="invariant 1.*exceeds capacity 2"):
        p.validate(capacity=2)
