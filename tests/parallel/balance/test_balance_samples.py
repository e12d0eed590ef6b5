"""Sample-level DP balance: seqpack.parallel.balance.balance_samples / balance_batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.algorithms import pack_lengths
from seqpack.parallel.balance import (
    FILLER,
    balance_batch,
    balance_packs,
    balance_samples,
    cost_ratio_lower_bound,
    pack_costs,
)


def _check_sample_plan(plan, lengths, capacity, dp, mb, pad=1):
    """Every sample exactly once, no micro-batch over capacity, step shapes multiples of dp."""
    n = len(lengths)
    padded = -(-np.asarray(lengths, dtype=np.int64) // pad) * pad
    flat = np.concatenate(plan.bins) if plan.bins else np.zeros(0, np.int64)
    assert sorted(flat.tolist()) == list(range(n))  # every sample exactly once
    assert all(b.size > 0 for b in plan.bins)  # empty micro-batches are fillers, never packs
    for b in plan.bins:
        assert int(padded[b].sum()) <= capacity  # no micro-batch over the cap
    used = np.concatenate([s.reshape(-1) for s in plan.schedule.steps]) if plan.schedule.steps else np.zeros(0)
    assert sorted(used[used != FILLER].tolist()) == list(range(len(plan.bins)))  # every pack scheduled once
    assert plan.num_fillers == int(np.sum(used == FILLER))
    assert 0 <= plan.extra_packs <= dp - 1  # at most one extra pack per rank
    p0 = len(pack_lengths(padded, capacity, pad_to_multiple_of=pad).bins) if n else 0
    assert len(plan.bins) <= p0 + plan.extra_packs  # extras are the only packs added
    for k, s in enumerate(plan.schedule.steps):
        assert s.shape[0] == dp and s.size % dp == 0  # micro-batches per step: a multiple of dp
        if k < plan.num_steps - 1:
            assert s.shape[1] == mb
        else:
            assert 1 <= s.shape[1] <= mb
        if n >= dp * s.shape[1]:  # enough samples for every slot: at most one empty micro-batch per rank
            assert np.all(np.sum(s == FILLER, axis=1) <= 1)
    # the [step][rank][micro-batch] view is the same schedule
    again = [i for step in plan.steps() for rank in step for mbatch in rank for i in mbatch.tolist()]
    assert sorted(again) == list(range(n))


def _lognormal(n, cap, seed=0):
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(150), 0.8, n)
    long = rng.lognormal(np.log(600), 0.6, n)
    return np.clip(np.where(rng.random(n) < 0.7, short, long).astype(np.int64), 4, cap)


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=120), st.integers(1, 5), st.integers(1, 3),
       st.sampled_from([1, 2, 4]), st.integers(0, 2))
def test_property_every_sample_once_cap_and_dp_multiple(lengths, dp, mb, pad, seed):
    capacity = 64
    plan = balance_samples(np.array(lengths), capacity, dp, mb, pad_to_multiple_of=pad, seed=seed)
    _check_sample_plan(plan, lengths, capacity, dp, mb, pad)
    st_ = plan.stats()
    assert st_["over_cap"] == 0 and st_["max_pack_tokens"] <= capacity


@settings(deadline=None, max_examples=40)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=80), st.integers(1, 6), st.integers(0, 2))
def test_property_balance_batch_every_sample_once(lengths, dp, seed):
    capacity = 100
    plan = balance_batch(np.array(lengths), capacity, dp, seed=seed)
    assert plan.num_steps == 1
    ranks = plan.step(0)
    assert len(ranks) == dp and len({len(r) for r in ranks}) == 1
    got = sorted(i for r in ranks for m in r for i in m.tolist())
    assert got == list(range(len(lengths)))
    for r in ranks:
        for m in r:
            assert int(np.asarray(lengths)[m].sum()) <= capacity


def _sft_mix(n, cap, seed):
    """70% chat-like (median 300 tokens) + 30% document-like (median 2000), as seqpack_bench.bench_balance."""
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(300), 0.8, n)
    long = rng.lognormal(np.log(2000), 0.7, n)
    return np.clip(np.where(rng.random(n) < 0.7, short, long).astype(np.int64), 8, cap)


def test_sample_level_meets_goals_where_whole_packs_cannot():
    """dp=4, 2 micro-batches: whole packs miss the cost goal (1.080); re-leveling samples meets both goals."""
    lengths = _sft_mix(2000, 4096, seed=1)
    dp, mb, cap = 4, 2, 4096
    plan = balance_samples(lengths, cap, dp, mb)
    _check_sample_plan(plan, lengths, cap, dp, mb)
    s = plan.stats()
    assert s["token_spread_max"] <= 1e-3  # measured 0.086%
    assert s["cost_max_over_mean_worst"] <= 1.05  # measured 1.049
    assert s["over_cap"] == 0
    packs = pack_lengths(lengths, cap)
    tokens, cost = pack_costs(packs.bins, lengths)
    whole = balance_packs(tokens, cost, dp, mb, token_cap=cap).stats(tokens, cost, cap)
    assert whole["cost_max_over_mean_worst"] > 1.07  # measured 1.080: the pack-level limit
    # deterministic for a seed
    again = balance_samples(lengths, cap, dp, mb)
    assert all(np.array_equal(a, b) for a, b in zip(plan.bins, again.bins))
    assert all(np.array_equal(a, b) for a, b in zip(plan.schedule.steps, again.schedule.steps))


def test_extra_packs_fill_every_step_to_a_multiple_of_dp():
    """13 packs at dp=4: 3 extra packs (one per rank at most) make 4 full steps of 4, none empty."""
    lengths = np.array([25] * 52)  # 52 samples of 25 tokens, capacity 100 -> 13 full packs
    plan = balance_samples(lengths, 100, 4, 1, seed=0)
    _check_sample_plan(plan, lengths, 100, 4, 1)
    assert plan.extra_packs == 3
    assert plan.num_steps == 4 and plan.num_fillers == 0
    loads = plan.schedule.loads(plan.pack_tokens_and_cost()[0])
    assert int(loads.sum()) == 52 * 25
    # every step's ranks hold the same number of 25-token samples (step totals may differ)
    assert all(len(set(row.tolist())) == 1 for row in loads)
    assert plan.stats()["token_spread_max"] == 0.0


def test_balance_batch_in_batch_packing_evens_ranks():
    lengths = _lognormal(400, 1024, seed=3)
    plan = balance_batch(lengths, 1024, 8)
    s = plan.stats()
    assert s["token_spread_max"] <= 1e-3  # measured 0.04%
    assert s["cost_max_over_mean_worst"] <= 1.05
    m = plan.micro_batches
    assert m == -(-len(pack_lengths(lengths, 1024).bins) // 8)  # the fewest micro-batches that hold the batch
    with pytest.raises(ValueError, match=r"needs \d+ packs of capacity 1024, more than dp_size\*micro_batches = 8\*1"):
        balance_batch(lengths, 1024, 8, micro_batches=1)


def test_errors_name_the_sample_and_the_fix():
    with pytest.raises(ValueError, match=r"sample 2 has length 5000 .*outside \[1, capacity=4096\]"):
        balance_samples([10, 20, 5000], 4096, 2)
    with pytest.raises(ValueError, match=r"sample 0 has length 0"):
        balance_samples([0, 1], 16, 2)
    with pytest.raises(ValueError, match="dp_size"):
        balance_samples([1], 16, 0)
    with pytest.raises(ValueError, match="micro_batches"):
        balance_samples([1], 16, 1, 0)
    with pytest.raises(ValueError, match="divisible"):
        balance_samples([1], 10, 1, pad_to_multiple_of=4)
    with pytest.raises(TypeError, match="integers"):
        balance_samples([1.5], 16, 1)
    with pytest.raises(ValueError, match="1-D"):
        balance_samples([[1, 2]], 16, 1)
    with pytest.raises(ValueError, match="prefer must be 'goals' or 'excess'"):
        balance_samples([1], 16, 1, prefer="fast")
    with pytest.raises(ValueError, match="formation must be"):
        balance_samples([1], 16, 1, formation="bogus")


def test_pad_multiple_counts_padded_lengths():
    lengths = np.array([5, 3, 7, 1, 8, 2, 6, 4] * 4)
    plan = balance_samples(lengths, 16, 2, 2, pad_to_multiple_of=4)
    _check_sample_plan(plan, lengths, 16, 2, 2, pad=4)
    assert plan.lengths.tolist() == (-(-lengths // 4) * 4).tolist()


def test_cost_ratio_lower_bound_values():
    # one 10-token sample, nine of 1 token, dp=2, cap=10: other rank holds <= 10 ones -> cost 9
    assert cost_ratio_lower_bound([10] + [1] * 9, 10, 2, 1) == pytest.approx(2 * 100 / (100 + 9))
    # budget cut mid-sample: others [6, 6], budget 10 -> 6*6 + 4*6 = 60
    assert cost_ratio_lower_bound([8, 6, 6], 10, 2, 1) == pytest.approx(2 * 64 / (64 + 60))
    assert cost_ratio_lower_bound([], 10, 2) == 1.0


def test_cost_lower_bound_holds_for_the_plan():
    """No schedule beats the bound: check it against the step holding the longest sample."""
    lengths = np.concatenate([[1000], _lognormal(300, 400, seed=5)])
    lengths = np.minimum(lengths, 1024)
    plan = balance_samples(lengths, 1024, 4, 1)
    lb = cost_ratio_lower_bound(lengths, 1024, 4, 1)
    assert lb > 1.05  # a 1000-token sample among ~150-token chats: the cost goal is out of reach
    _, cost = plan.pack_tokens_and_cost()
    cl = plan.schedule.loads(cost)
    ratios = cl.max(axis=1) / cl.mean(axis=1)
    k = next(i for i, s in enumerate(plan.schedule.steps) if any(0 in plan.bins[b] for b in s.reshape(-1) if b >= 0))
    assert ratios[k] >= lb - 1e-9


def test_off_step_packs_trade_places_to_meet_the_token_goal():
    """One micro-batch, 100,000 lognormal lengths (seed 4): the band schedule leaves a step of one-document
    packs (4086, 4087, 4095 tokens) at 0.22 %; trading its packs outside the window with near-cost packs of
    on-target steps (both evened by swaps) brings every full step within 0.1 % (measured 0.073 %)."""
    rng = np.random.default_rng(4)  # as seqpack_bench.bench_balance.issue_lengths(100_000, 4096, seed=4)
    lengths = np.clip(np.exp(rng.normal(6.2, 0.9, 100_000)), 8, 4096).astype(np.int64)
    plan = balance_samples(lengths, 4096, 8, 1, seed=4)
    s = plan.stats()
    assert s["token_spread_max"] <= 1e-3 and s["over_cap"] == 0
    assert s["cost_max_over_mean_worst"] <= 1.035  # measured 1.0332, as before the trades
    got = np.sort(np.concatenate(plan.bins))
    assert np.array_equal(got, np.arange(lengths.size))


def test_band_schedule_levels_off_steps_to_the_band_stop_score():
    """Four micro-batches, 10,000 lognormal lengths (seed 4): the steps the band schedule levels stop at
    ``BAND_STOP_SCORE`` (0.9) by default; the plan's worst and mean figures are those of ``stop_score=0.5``
    (measured 0.0980 % / cost 1.0085 both ways, at about half the leveling time), every sample once, none
    over the cap."""
    from seqpack.parallel.balance.samples import BAND_STOP_SCORE, SEARCH_STOP_SCORE

    assert (BAND_STOP_SCORE, SEARCH_STOP_SCORE) == (0.9, 0.5)
    rng = np.random.default_rng(4)  # as seqpack_bench.bench_balance.issue_lengths(10_000, 4096, seed=4)
    lengths = np.clip(np.exp(rng.normal(6.2, 0.9, 10_000)), 8, 4096).astype(np.int64)
    fast = balance_samples(lengths, 4096, 8, 4, seed=4).stats()
    slow = balance_samples(lengths, 4096, 8, 4, seed=4, stop_score=0.5).stats()
    for key in ("token_spread_max", "token_spread_mean", "cost_max_over_mean_worst", "cost_max_over_mean_mean"):
        assert fast[key] == pytest.approx(slow[key], abs=1e-4), key
    assert fast["token_spread_max"] <= 1e-3 and fast["over_cap"] == 0


@settings(deadline=None, max_examples=8, derandomize=True)
@given(st.integers(0, 10_000), st.sampled_from([1, 2, 4]), st.sampled_from([None, 0.5, 0.9]))
def test_property_band_schedule_every_sample_once_and_under_the_cap(seed, mb, stop):
    """Inputs above the small-input limit (the band schedule and its leveling only), fixed seeds: every
    sample in exactly one micro-batch, no micro-batch above the capacity, whatever ``stop_score``."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(5.0, 0.9, 5_000)), 1, 1024).astype(np.int64)
    plan = balance_samples(lengths, 1024, 4, mb, seed=seed, stop_score=stop)
    _check_sample_plan(plan, lengths, 1024, 4, mb, 1)
    assert plan.stats()["over_cap"] == 0
