"""Re-pairing of the one- and two-item packs (``_kernels_pairs.pair_slots``) on size-grouped slots."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.algorithms import _kernels as K
from seqpack.algorithms import _kernels_pairs as KP
from seqpack.algorithms import pack_lengths
from seqpack.algorithms.plan import check_plan


@st.composite
def slot_plans(draw):
    cap = draw(st.sampled_from([1, 2, 7, 10, 64, 100, 4097]))
    n = draw(st.integers(1, 120))
    x = np.array(draw(st.lists(st.integers(1, cap), min_size=n, max_size=n)), np.int64)
    target = max(1, round(draw(st.floats(0.0, 1.0)) * cap))
    return x, cap, target, draw(st.booleans())


@settings(deadline=None, max_examples=300)
@given(plan=slot_plans())
def test_pair_slots_keeps_packs_and_never_widens_the_loads(plan):
    x, cap, target, bfd = plan
    cnt, start = K.size_groups(x, cap)
    if bfd:
        slot, nb, room = K.grouped_best_fit(cnt, start, cap, x.size)
        loads = cap - room
    else:
        slot, nb, loads = K.grouped_exact_fill(cnt, start, cap, x.size, 8, target)
    before = K.slots_to_bins(x, start, slot)
    counts = np.bincount(before, minlength=nb)
    lo, hi = loads.min(), loads.max()
    KP.pair_slots(cnt, start, slot, loads)
    after = K.slots_to_bins(x, start, slot)
    now = np.bincount(after, minlength=nb)
    assert now.min() >= 1 and np.array_equal(now[counts > 2], counts[counts > 2])  # no pack emptied
    assert now[counts <= 2].max(initial=0) <= 2 and now.sum() == x.size
    big = counts[before] > 2
    assert np.array_equal(after[big], before[big])  # packs of 3+ items untouched
    assert np.array_equal(K.loads_of(x, after, nb), loads)  # loads kept in step
    assert lo <= loads.min() and loads.max() <= hi <= cap


def test_pair_slots_matches_long_heads_with_short_partners():
    # packs (9, 1), (5, 4), (6,): heads 5 < 6 < 9 take partners 4 > 1 > none
    x = np.array([9, 1, 5, 4, 6], np.int64)
    cnt, start = K.size_groups(x, 10)
    slot = np.empty(5, np.int32)
    for i, b in enumerate([0, 0, 1, 1, 2]):  # the pack of item i, written at its size-grouped slot
        slot[start[x[i]] + int(np.sum(x[:i] == x[i]))] = b
    loads = np.array([10, 9, 6], np.int64)
    assert KP.pair_slots(cnt, start, slot, loads) == 3
    bins = K.slots_to_bins(x, start, slot)
    assert bins.tolist() == [0, 2, 1, 1, 2] and loads.tolist() == [9, 9, 7]


def test_default_plan_on_uniform_lengths_has_an_even_load():
    # uniform lengths in [1, C]: the greedy fill leaves long samples alone at the end
    x = np.random.default_rng(7).integers(1, 4097, 1_000_000).astype(np.int64)  # the fill wins here
    plan = pack_lengths(x, 4096)
    check_plan(plan, x)
    assert plan.num_bins <= pack_lengths(x, 4096, "best_fit_decreasing").num_bins
    assert plan.detail["winner"] == "fill" and plan.load_spread <= 0.01 * 4096, plan.load_spread
