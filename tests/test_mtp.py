"""seqpack.mtp.roll_packed: per-segment MTP roll equals rolling every sample alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.mtp import IGNORE_INDEX, roll_batch, roll_packed, roll_sample
from seqpack.padding import round_up

PAD = 0


def _make_samples(lengths, rng):
    out = []
    for n in lengths:
        ids = rng.integers(1, 1000, size=n).astype(np.int64)
        lab = np.concatenate([ids[1:], [IGNORE_INDEX]]).astype(np.int64)
        lab[rng.random(n) < 0.3] = IGNORE_INDEX  # some prompt tokens
        out.append((ids, lab))
    return out


def _pack(samples, multiple, tail=0):
    """Lay samples out as one THD row (spec layout; positions keep counting through padding)."""
    real = [len(s[0]) for s in samples]
    padded = [round_up(n, multiple) for n in real]
    padded[-1] += tail
    T = sum(padded)
    ids = np.full(T, PAD, np.int64)
    lab = np.full(T, IGNORE_INDEX, np.int64)
    pos = np.zeros(T, np.int64)
    cup = np.concatenate([[0], np.cumsum(padded)]).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(real)]).astype(np.int32)
    for s, (i, l) in enumerate(samples):
        a = cup[s]
        ids[a:a + len(i)] = i
        lab[a:a + len(l)] = l
        pos[a:a + padded[s]] = np.arange(padded[s])
    return ids, lab, pos, cup, cu


def test_worked_example_two_docs_with_alignment_padding():
    # docs A=[11,12,13], B=[21,22], multiple 4: row [11,12,13,P | 21,22,P,P]
    ids, lab, pos, cup, cu = _pack([(np.array([11, 12, 13]), np.array([12, 13, -100])),
                                    (np.array([21, 22]), np.array([22, -100]))], 4)
    r_ids, r_lab, r_pos = roll_packed(ids, lab, pos, cup, cu)
    assert r_ids.tolist() == [12, 13, PAD, PAD, 22, PAD, PAD, PAD]
    assert r_lab.tolist() == [13, -100, -100, -100, -100, -100, -100, -100]
    assert r_pos.tolist() == [1, 2, 3, 3, 1, 2, 2, 3]
    # inputs untouched
    assert ids.tolist() == [11, 12, 13, PAD, 21, 22, PAD, PAD]


@settings(deadline=None, max_examples=80)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    multiple=st.sampled_from([1, 2, 4, 8]),
    tail=st.integers(0, 5),
    shifts=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_roll_packed_equals_rolling_each_sample_alone(lengths, multiple, tail, shifts, seed):
    rng = np.random.default_rng(seed)
    samples = _make_samples(lengths, rng)
    ids, lab, pos, cup, cu = _pack(samples, multiple, tail)
    r_ids, r_lab, r_pos = roll_packed(ids, lab, pos, cup, cu, shifts=shifts)

    rolled_alone = []
    for s, (i, l) in enumerate(samples):
        ri, rl, rp = roll_sample(i, l, pos[cup[s]:cup[s] + len(i)], shifts=shifts)
        rolled_alone.append((ri, rl))
        a = cup[s]
        n = len(i)
        assert r_ids[a:a + n].tolist() == ri.tolist()
        assert r_lab[a:a + n].tolist() == rl.tolist()
        assert r_pos[a:a + n].tolist() == rp.tolist()
        # padding slots unchanged; the last shifts+1 real slots carry no target
        assert r_ids[a + n:cup[s + 1]].tolist() == ids[a + n:cup[s + 1]].tolist()
        assert r_pos[a + n:cup[s + 1]].tolist() == pos[a + n:cup[s + 1]].tolist()
        assert (r_lab[max(a, a + n - shifts - 1):cup[s + 1]] == IGNORE_INDEX).all()
    # packing the individually rolled samples gives the same row
    p_ids, p_lab, _, _, _ = _pack(rolled_alone, multiple, tail)
    assert r_ids.tolist() == p_ids.tolist() and r_lab.tolist() == p_lab.tolist()


@settings(deadline=None, max_examples=40)
@given(lengths=st.lists(st.integers(1, 10), min_size=1, max_size=5), multiple=st.sampled_from([1, 4]),
       k=st.integers(2, 4), seed=st.integers(0, 1000))
def test_roll_k_equals_k_single_rolls(lengths, multiple, k, seed):
    ids, lab, pos, cup, cu = _pack(_make_samples(lengths, np.random.default_rng(seed)), multiple)
    once = roll_packed(ids, lab, pos, cup, cu, shifts=k)
    step = (ids, lab, pos)
    for _ in range(k):
        step = roll_packed(*step, cup, cu, shifts=1)
    for a, b in zip(once, step):
        assert a.tolist() == b.tolist()


def test_roll_never_crosses_a_segment():
    # tag every token with its segment: after the roll each real slot holds a token of its own segment
    lengths = [5, 3, 7, 1]
    samples = [(np.full(n, 100 * (s + 1)) + np.arange(n), np.full(n, -100)) for s, n in enumerate(lengths)]
    ids, lab, pos, cup, cu = _pack(samples, 4, tail=3)
    r_ids, _, _ = roll_packed(ids, lab, pos, cup, cu, shifts=2)
    for s, n in enumerate(lengths):
        seg = r_ids[cup[s]:cup[s] + n]
        assert all(t == PAD or t // 100 == s + 1 for t in seg.tolist())
        # exactly: the segment's own tokens moved left by 2, its last 2 real slots padding
        own = (100 * (s + 1) + np.arange(n)).tolist()
        assert seg.tolist() == own[2:] + [PAD] * min(2, n)


def test_B22_roll_uses_padded_offsets_not_logical_ones():
    """Rolling by logical cu_seqlens as if they were physical offsets shifts segment 2 wrongly
    (Megatron-LM PRs #4494/#4495); roll_packed locates segments by cu_seqlens_padded."""
    samples = [(np.array([1, 2, 3]), np.array([2, 3, -100])), (np.array([7, 8, 9]), np.array([8, 9, -100]))]
    ids, lab, pos, cup, cu = _pack(samples, 4)  # cup [0,4,8], cu [0,3,6]
    r_ids, r_lab, _ = roll_packed(ids, lab, pos, cup, cu)
    assert r_ids.tolist() == [2, 3, PAD, PAD, 8, 9, PAD, PAD]
    assert r_lab.tolist() == [3, -100, -100, -100, 9, -100, -100, -100]
    with pytest.raises(ValueError, match="cu_seqlens_padded"):
        roll_packed(ids, lab, pos, cu, cu)  # logical boundaries passed as physical: rejected, not mis-rolled


def test_roll_before_cp_slicing_matches_per_rank_view():
    """Roll the full pre-CP row, then zigzag-slice (spec layout): each rank's rolled tokens equal the
    CP=1 rolled row at the same global indices, and come from the rank's own segments."""
    samples = [(np.arange(10, 18), np.r_[np.arange(11, 18), -100]), (np.arange(50, 55), np.r_[np.arange(51, 55), -100])]
    cp = 2
    ids, lab, pos, cup, cu = _pack(samples, 2 * cp)  # padded 8 and 8
    r_ids, r_lab, _ = roll_packed(ids, lab, pos, cup, cu)
    union = []
    for rank in range(cp):
        idx = []
        for s in range(len(samples)):
            a, P = int(cup[s]), int(cup[s + 1] - cup[s])
            c = P // (2 * cp)
            for chunk in (rank, 2 * cp - 1 - rank):
                idx.extend(range(a + chunk * c, a + (chunk + 1) * c))
        union += idx
        sl = r_ids[idx]
        seg_of = np.searchsorted(cup, idx, side="right") - 1
        for t, s in zip(sl.tolist(), seg_of.tolist()):
            assert t == PAD or t in samples[s][0].tolist()
    assert sorted(union) == list(range(len(ids)))
    assert [0, 1, 6, 7, 8, 9, 14, 15] == sorted(union[:8])


def test_torch_tensors_in_torch_out_and_leading_dim():
    torch = pytest.importorskip("torch")
    samples = _make_samples([4, 6, 2], np.random.default_rng(0))
    ids, lab, pos, cup, cu = _pack(samples, 4, tail=2)
    want = roll_packed(ids, lab, pos, cup, cu, shifts=2)
    got = roll_packed(torch.from_numpy(ids)[None], torch.from_numpy(lab)[None], torch.from_numpy(pos)[None],
                      torch.from_numpy(cup), torch.from_numpy(cu), shifts=2)
    for g, w in zip(got, want):
        assert isinstance(g, torch.Tensor) and g.shape == (1, len(ids)) and g.dtype == torch.int64
        assert g[0].tolist() == w.tolist()
    n = roll_packed(ids[None], lab[None], None, cup, cu)
    assert n[0].shape == (1, len(ids)) and n[2] is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(shifts=0), "shifts"),
    (dict(cu=np.array([0, 3, 9])), "real length"),
    (dict(cup=np.array([0, 4, 7])), "row length"),
    (dict(cu=np.array([1, 3, 6])), "start at 0"),
    (dict(cu=np.array([0, 6])), "same length"),
    (dict(cu=np.array([0, 3, 3])), "real length 0"),
])
def test_errors(kwargs, match):
    ids, lab, pos, cup, cu = _pack([(np.array([1, 2, 3]), np.array([2, 3, -100])),
                                    (np.array([4, 5, 6]), np.array([5, 6, -100]))], 4)
    args = dict(cup=cup, cu=cu, shifts=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        roll_packed(ids, lab, pos, args["cup"], args["cu"], shifts=args["shifts"])


def test_float_input_rejected():
    with pytest.raises(TypeError, match="integer"):
        roll_packed(np.zeros(4), np.zeros(4, int), None, np.array([0, 4]), np.array([0, 4]))


def _padding_mask(cup, cu):
    T = int(cup[-1])
    pm = np.ones(T, bool)
    for s in range(len(cu) - 1):
        pm[cup[s]:cup[s] + cu[s + 1] - cu[s]] = False
    return pm


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5), multiple=st.sampled_from([1, 4, 8]),
       tail=st.integers(0, 5), shifts=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_padding_mask_moves_in_step(lengths, multiple, tail, shifts, seed):
    """After the roll the padding mask is True exactly at the padding slots and at each segment's last
    ``shifts`` real slots (the filler), and every slot it marks real holds a rolled real token."""
    samples = _make_samples(lengths, np.random.default_rng(seed))
    ids, lab, pos, cup, cu = _pack(samples, multiple, tail)
    pm = _padding_mask(cup, cu)
    r_ids, r_lab, r_pos, r_pm = roll_packed(ids, lab, pos, cup, cu, shifts=shifts, padding_mask=pm)
    want = pm.copy()
    for s, (i, _) in enumerate(samples):
        L = len(i)
        want[cup[s] + max(L - shifts, 0):cup[s] + L] = True
        assert np.array_equal(r_ids[cup[s]:cup[s] + max(L - shifts, 0)], i[shifts:])  # real slots: real tokens
    assert np.array_equal(r_pm, want)
    assert (r_lab[r_pm] == IGNORE_INDEX).all() and (r_ids[r_pm & ~pm] == PAD).all()
    # the 3-tuple is unchanged by passing the mask
    assert all(np.array_equal(a, b) for a, b in zip(roll_packed(ids, lab, pos, cup, cu, shifts=shifts),
                                                    (r_ids, r_lab, r_pos)))
    # k single rolls of the mask == one roll by k
    step = (ids, lab, pos, pm)
    for _ in range(shifts):
        step = roll_packed(step[0], step[1], step[2], cup, cu, shifts=1, padding_mask=step[3])
    assert np.array_equal(step[3], r_pm)


def test_roll_batch_moves_every_token_field():
    import torch

    from seqpack.sample import TOKEN_FIELDS

    samples = _make_samples((5, 3, 7), np.random.default_rng(1))
    ids, lab, pos, cup, cu = _pack(samples, 4, tail=2)
    pm = _padding_mask(cup, cu)
    seq_idx = np.repeat(np.arange(3), np.diff(cup)).astype(np.int32)
    batch = {"input_ids": torch.from_numpy(ids)[None], "labels": torch.from_numpy(lab)[None],
             "position_ids": torch.from_numpy(pos)[None], "padding_mask": torch.from_numpy(pm)[None],
             "loss_mask": torch.from_numpy(lab != IGNORE_INDEX)[None], "seq_idx": torch.from_numpy(seq_idx)[None],
             "cu_seqlens": torch.from_numpy(cu), "cu_seqlens_padded": torch.from_numpy(cup), "max_seqlen": 8}
    assert set(TOKEN_FIELDS) <= set(batch)
    out = roll_batch(batch, shifts=2)
    r_ids, r_lab, r_pos, r_pm = roll_packed(ids, lab, pos, cup, cu, shifts=2, padding_mask=pm)
    assert np.array_equal(out["input_ids"][0].numpy(), r_ids) and np.array_equal(out["labels"][0].numpy(), r_lab)
    assert np.array_equal(out["position_ids"][0].numpy(), r_pos) and np.array_equal(out["padding_mask"][0].numpy(), r_pm)
    # loss_mask stays exactly labels != -100 (spec invariant), seq_idx and boundaries unchanged
    assert torch.equal(out["loss_mask"], out["labels"] != IGNORE_INDEX)
    assert torch.equal(out["seq_idx"], batch["seq_idx"]) and out["cu_seqlens"] is batch["cu_seqlens"]
    assert out["padding_mask"].dtype == torch.bool and not torch.equal(out["padding_mask"], batch["padding_mask"])
    assert torch.equal(batch["padding_mask"][0], torch.from_numpy(pm))  # input untouched


def test_padding_mask_must_be_bool():
    ids, lab, pos, cup, cu = _pack(_make_samples((4,), np.random.default_rng(0)), 1)
    with pytest.raises(TypeError, match="padding_mask must be a bool array"):
        roll_packed(ids, lab, pos, cup, cu, padding_mask=np.zeros(4, np.int64))
