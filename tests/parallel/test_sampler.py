"""seqpack.parallel.sampler.BalancedBatchSampler: one plan, each rank its row; exact resume; 2 real ranks (gloo)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from seqpack.parallel import BalancedBatchSampler

CAP = 4096


def _lengths(n=3000, seed=3):
    rng = np.random.default_rng(seed)
    return np.clip(np.exp(rng.normal(6.2, 0.9, n)), 8, CAP).astype(np.int64)


def _check_union(per_rank, lengths, mb):
    """Every sample once over all ranks, equal steps per rank, per-step token spread within 0.1 %."""
    flat = sorted(i for batches in per_rank for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    assert len({len(b) for b in per_rank}) == 1
    for b in per_rank:
        assert all(int(lengths[m].sum()) <= CAP for m in b)
    steps = len(per_rank[0]) // mb
    spreads = []
    for s in range(steps):
        tok = [sum(int(lengths[m].sum()) for m in b[s * mb:(s + 1) * mb]) for b in per_rank]
        spreads.append((max(tok) - min(tok)) / np.mean(tok))
    return max(spreads[:-1]) if len(spreads) > 1 else spreads[0]


def test_ranks_cover_every_sample_once_and_resume_is_exact():
    lengths = _lengths(2000)
    per_rank = [list(BalancedBatchSampler(lengths, CAP, 2, rank=r, world_size=2)) for r in range(2)]
    assert _check_union(per_rank, lengths, 2) <= 1e-3
    s = BalancedBatchSampler(lengths, CAP, 2, rank=1, world_size=2, seed=5)
    s.set_epoch(3)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    state = s.state_dict()
    rest = list(it)
    again = BalancedBatchSampler(lengths, CAP, 2, rank=1, world_size=2, seed=5)
    again.load_state_dict(state)
    again.set_epoch(3)
    assert list(again) == rest and head + rest == list(s)  # a new pass starts at the epoch's beginning
    s.set_epoch(4)
    assert list(s) != head + rest  # another epoch, another plan


def _worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        lengths = _lengths()
        sampler = BalancedBatchSampler(lengths, CAP, micro_batches=2, seed=1)  # rank/world from torch.distributed
        sampler.set_epoch(2)
        loader = torch.utils.data.DataLoader(np.arange(len(lengths)), batch_sampler=sampler,
                                             collate_fn=lambda b: [int(x) for x in b])
        got = list(loader)
        n = torch.tensor([len(got)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        # resume after 5 micro-batches: a fresh sampler yields the same remainder
        first = BalancedBatchSampler(lengths, CAP, micro_batches=2, seed=1)
        first.set_epoch(2)
        it = iter(first)
        for _ in range(5):
            next(it)
        resumed = BalancedBatchSampler(lengths, CAP, micro_batches=2, seed=1)
        resumed.load_state_dict(first.state_dict())
        resumed.set_epoch(2)
        rest = list(resumed)
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump({"batches": got, "max_len": int(n), "rest": rest, "rank": sampler.rank,
                       "world": sampler.world_size}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
def test_two_gloo_ranks_balanced_steps_and_exact_resume(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    res = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in res] == [0, 1] and all(r["world"] == 2 for r in res)
    per_rank = [r["batches"] for r in res]
    lengths = _lengths()
    assert _check_union(per_rank, lengths, 2) <= 1e-3  # the per-step token spread bound
    assert res[0]["max_len"] == len(per_rank[0]) == len(per_rank[1])  # same number of micro-batches
    for r in res:
        assert r["rest"] == r["batches"][5:]  # resume gives the identical remaining batches
