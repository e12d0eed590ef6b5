"""seqpack_bench.references: the LLaMA-Factory and Megatron-Bridge baselines against their installed code."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack_bench import references as ref


def test_llamafactory_reference_known_example():
    # sorted ascending [1,2,3,4,5]; pack 1 takes 5 then 3 (fills 8); pack 2 takes 4, 2, 1
    packs = ref.llamafactory_greedy_knapsack([5, 4, 3, 2, 1], 8)
    assert [sorted(p) for p in packs] == [[0, 2], [1, 3, 4]]
    with pytest.raises(ValueError, match="capacity"):
        ref.llamafactory_greedy_knapsack([9], 8)


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 64), min_size=0, max_size=80), st.integers(64, 200))
def test_llamafactory_reference_places_every_index_once_within_capacity(lengths, cap):
    packs = ref.llamafactory_greedy_knapsack(lengths, cap)
    flat = sorted(i for p in packs for i in p)
    assert flat == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= cap for p in packs)
    assert all(p for p in packs)
    if lengths:
        assert len(packs) >= math.ceil(sum(lengths) / cap)


needs_llamafactory = pytest.mark.skipif(ref.llamafactory_installed() is None,
                                        reason=f"llamafactory not installed ({ref.BASELINE_INSTALL})")


needs_bridge = pytest.mark.skipif(ref.megatron_bridge_installed() is None,
                                  reason=f"megatron-bridge not installed ({ref.BASELINE_INSTALL})")


@needs_llamafactory
@settings(deadline=None, max_examples=80)
@given(st.lists(st.integers(1, 120), min_size=0, max_size=150), st.integers(120, 400))
def test_llamafactory_reference_equals_installed_greedy_knapsack(lengths, cap):
    # the re-implementation (used when llamafactory is absent) must give the published function's packs,
    # in its order, with its index choice among equal lengths
    assert ref.llamafactory_greedy_knapsack(lengths, cap) == ref.llamafactory_installed_greedy_knapsack(lengths, cap)


@needs_bridge
@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=200), st.integers(100, 300))
def test_megatron_bridge_ffd_loads_equal_seqpack_ffd(lengths, cap):
    from seqpack.algorithms import pack_lengths

    bridge = ref.megatron_bridge_packing(lengths, cap, "first_fit_decreasing")
    ours = pack_lengths(np.asarray(lengths), cap, "first_fit_decreasing", shuffle_packs=False)
    # FFD is deterministic up to ties between equal lengths, which do not change the loads
    assert np.asarray(ours.bin_loads).tolist() == bridge.tolist()
    assert int(bridge.sum()) == sum(lengths) and int(bridge.max()) <= cap


@needs_bridge
def test_megatron_bridge_shuffle_is_seeded_and_keeps_global_rng():
    x = [int(v) for v in np.random.default_rng(3).integers(1, 500, 400)]
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = ref.megatron_bridge_packing(x, 1024, "first_fit_shuffle", seed=7)
    assert np.array_equal(np.random.get_state()[1], before)  # the caller's global NumPy RNG is untouched
    b = ref.megatron_bridge_packing(x, 1024, "first_fit_shuffle", seed=7)
    c = ref.megatron_bridge_packing(x, 1024, "first_fit_shuffle", seed=8)
    assert a.tolist() == b.tolist() and int(a.sum()) == sum(x)
    assert int(c.sum()) == sum(x) and a.tolist() != c.tolist()
    with pytest.raises(ValueError, match="first_fit_decreasing"):
        ref.megatron_bridge_packing(x, 1024, "best_fit")
    with pytest.raises(ValueError, match="capacity"):
        ref.megatron_bridge_packing([2000], 1024)


def test_load_installed_file_names_the_install_command():
    with pytest.raises(ref.ReferenceUnavailable, match="pip install --no-deps llamafactory==0.9.5"):
        ref.load_installed_file("no-such-distribution-xyz", "x/y.py")
    with pytest.raises(ref.ReferenceUnavailable, match="has no not/a/file.py"):
        ref.load_installed_file("numpy", "not/a/file.py")
    with pytest.raises(ValueError, match=">= 1|< 1"):
        ref.llamafactory_greedy_knapsack([0, 3], 8)
