"""StreamingPacker: accounting, determinism, sharding, exact resume (also in a new process)."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _stream_data import keys_of, lognormal_lengths, make_samples  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seqpack.stream import StreamingPacker  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf)  # weights_only default: the state is tensors + plain types


class Stream:
    """A plain (non-indexable) iterable source, re-iterable per epoch."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


# ------------------------------------------------------------------------------------ accounting


def test_every_sample_exactly_once_and_packs_fit():
    cap = 2048
    lens = lognormal_lengths(3000, cap)
    p = StreamingPacker(lens, cap, packing_buffer_size=300, output="indices", seed=1)
    packs = list(p)
    ks = keys_of(packs)
    assert sorted(ks) == list(range(len(lens)))
    loads = [int(lens[pk].sum()) for pk in packs]
    assert max(loads) <= cap
    l1 = -(-int(lens.sum()) // cap)
    assert l1 <= len(packs) <= l1 * 1.02
    assert p.stats["samples_packed"] == len(lens) and p.stats["packs_emitted"] == len(packs)
    assert p.stats["tokens_packed"] == int(lens.sum())
    assert 0 < p.stats["max_wait"] <= p.max_wait


@settings(deadline=None, max_examples=60)
@given(
    lens=st.lists(st.integers(1, 300), min_size=0, max_size=250),
    buf=st.integers(1, 64),
    mult=st.sampled_from([1, 2, 8]),
    drop_last=st.booleans(),
    max_wait=st.integers(0, 3),
    world=st.integers(1, 3),
)
def test_property_accounting(lens, buf, mult, drop_last, max_wait, world):
    """Across ranks every sample is packed once or listed as dropped; no pack overflows; waits bounded."""
    cap = 304
    arr = np.asarray(lens, np.int64)
    packed, dropped = [], []
    for r in range(world):
        p = StreamingPacker(arr, cap, packing_buffer_size=buf, output="indices", pad_to_multiple_of=mult,
                            drop_last=drop_last, max_wait=max_wait, rank=r, world_size=world)
        packs = list(p)
        for pk in packs:
            assert len(pk) >= 1
            assert int((-(-arr[pk] // mult) * mult).sum()) <= cap
        packed += keys_of(packs)
        dropped += p.stats["dropped_last"]
        assert p.stats["max_wait"] <= max_wait
        assert p.stats["samples_packed"] == sum(len(pk) for pk in packs)
        if not drop_last:
            assert not p.stats["dropped_last"]
    assert sorted(packed + dropped) == list(range(len(lens)))


def test_pad_multiple_is_respected():
    cap, m = 1024, 64
    lens = lognormal_lengths(800, cap - m)
    p = StreamingPacker(lens, cap, packing_buffer_size=100, output="indices", pad_to_multiple_of=m)
    packs = list(p)
    for pk in packs:
        assert int((-(-lens[pk] // m) * m).sum()) <= cap
    assert sorted(keys_of(packs)) == list(range(800))  # the loop above saw every sample


def test_end_of_stream_drains_and_drop_last_is_reported(caplog):
    cap = 1000
    lens = np.array([600, 300, 500, 200, 100, 450, 50], np.int64)  # total 2200 -> last pack partial
    full = list(StreamingPacker(lens, cap, packing_buffer_size=4, output="indices", seed=0))
    assert sorted(keys_of(full)) == list(range(7))
    with caplog.at_level("WARNING", logger="seqpack.stream"):
        p = StreamingPacker(lens, cap, packing_buffer_size=4, output="indices", seed=0, drop_last=True)
        kept = list(p)
    dropped = p.stats["dropped_last"]
    assert dropped, "the last pack is partial, so drop_last must drop it"
    assert int(lens[dropped].sum()) < cap
    assert sorted(keys_of(kept) + dropped) == list(range(7))
    assert "drop_last=True dropped" in caplog.text


def test_overlength_policy_error_names_sample_and_drop_reports():
    lens = np.array([10, 5000, 20], np.int64)
    with pytest.raises(ValueError, match=r"source key 1 .*5000.*capacity 100"):
        list(StreamingPacker(lens, 100, packing_buffer_size=8, output="indices"))
    p = StreamingPacker(lens, 100, packing_buffer_size=8, output="indices", overlength="drop")
    assert sorted(keys_of(list(p))) == [0, 2]
    assert p.stats["overlength_dropped"] == [1]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        StreamingPacker([1], 100, pad_to_multiple_of=8)
    with pytest.raises(ValueError, match="packing_buffer_size"):
        StreamingPacker([1], 128, packing_buffer_size=0)
    with pytest.raises(ValueError, match="rank"):
        StreamingPacker([1], 128, rank=2, world_size=2)
    with pytest.raises(TypeError, match="neither a dataset nor iterable"):
        StreamingPacker(42, 128)
    with pytest.raises(ValueError, match="output"):
        StreamingPacker([1], 128, output="rows")


def test_settings_object_and_attributes_agree():
    p = StreamingPacker(np.array([3, 5]), 128, packing_buffer_size=4, pad_to_multiple_of=8, max_wait=2)
    s = p.settings
    assert (s.seq_length, s.packing_buffer_size, s.pad_to_multiple_of, s.max_wait) == (128, 4, 8, 2)
    assert (p.capacity, p.packing_buffer_size, p.pad_to_multiple_of, p.max_wait) == (128, 4, 8, 2)
    assert p.algorithm_name == s.algorithm == "best_fit_decreasing" and (p.rank, p.world_size) == (0, 1)
    assert p.state_dict()["config"]["capacity"] == 128  # the saved fingerprint keeps its key names


# ------------------------------------------------------------------------------------ determinism


def test_deterministic_no_global_rng_and_epochs_reshuffle():
    lens = lognormal_lengths(1500, 2048)
    mk = lambda: StreamingPacker(lens, 2048, packing_buffer_size=200, output="indices", seed=7)  # noqa: E731
    np.random.seed(1)
    torch.manual_seed(1)
    a = [pk.tolist() for pk in mk()]
    np.random.seed(2)
    torch.manual_seed(2)
    b = [pk.tolist() for pk in mk()]
    assert a == b
    p = mk()
    p.set_epoch(1)
    c = [pk.tolist() for pk in p]
    assert c != a and sorted(keys_of(c)) == sorted(keys_of(a))
    other_seed = [pk.tolist() for pk in StreamingPacker(lens, 2048, packing_buffer_size=200, output="indices", seed=8)]
    assert other_seed != a


def test_sharding_ranks_partition_the_source():
    lens = lognormal_lengths(1001, 2048)
    seen = []
    for r in range(3):
        seen += keys_of(StreamingPacker(lens, 2048, packing_buffer_size=50, output="indices", rank=r, world_size=3))
    assert sorted(seen) == list(range(1001))
    it_seen = []
    for r in range(3):
        it_seen += keys_of(
            StreamingPacker(Stream([int(x) for x in lens]), 2048, packing_buffer_size=50, output="indices", rank=r, world_size=3)
        )
    assert sorted(it_seen) == list(range(1001))


# ------------------------------------------------------------------------------------ resume


def _run_with_stop(mk, stop):
    p = mk()
    it = iter(p)
    head = []
    for _ in range(stop):
        head.append(next(it))
    state = roundtrip(p.state_dict())
    q = mk()
    q.load_state_dict(state)
    return head + list(q)


@settings(deadline=None, max_examples=25)
@given(stop_frac=st.floats(0, 1), buf=st.integers(1, 120), seed=st.integers(0, 5), iterable=st.booleans())
def test_resume_in_process_is_exact(stop_frac, buf, seed, iterable):
    lens = lognormal_lengths(400, 1024, seed)
    src = Stream([int(x) for x in lens]) if iterable else lens
    out = "samples" if iterable else "indices"

    def mk():
        return StreamingPacker(src, 1024, packing_buffer_size=buf, output=out, seed=seed, carry_fill=0.99)

    full = [list(map(int, pk)) for pk in mk()]
    stop = int(stop_frac * len(full))
    resumed = [list(map(int, pk)) for pk in _run_with_stop(mk, stop)]
    assert resumed == full


def test_resume_with_samples_output_packed_rows():
    samples = make_samples(lognormal_lengths(120, 512, 3))

    def mk():
        return StreamingPacker(samples, 512, packing_buffer_size=16, output="packed", pad_to_multiple_of=8, seed=3)

    full = list(mk())
    for pk in full:
        pk.validate(capacity=512)
    resumed = _run_with_stop(mk, 7)
    assert [pk.sample_ids for pk in resumed] == [pk.sample_ids for pk in full]
    assert all(np.array_equal(a.input_ids, b.input_ids) for a, b in zip(resumed, full))
    assert sorted(sid for pk in full for sid in pk.sample_ids) == sorted(s.sample_id for s in samples)


def test_state_refused_under_other_settings_names_keys():
    lens = lognormal_lengths(200, 1024)
    p = StreamingPacker(lens, 1024, packing_buffer_size=20, output="indices", seed=0)
    it = iter(p)
    next(it)
    st_ = p.state_dict()
    q = StreamingPacker(lens, 2048, packing_buffer_size=30, output="indices", seed=1)
    with pytest.raises(ValueError) as e:
        q.load_state_dict(st_)
    msg = str(e.value)
    for key in ("capacity", "packing_buffer_size", "seed"):
        assert key in msg
    assert "world_size" not in msg
    q2 = StreamingPacker(lens, 1024, packing_buffer_size=20, output="indices", seed=0, world_size=2, rank=0)
    with pytest.raises(ValueError, match="world_size: saved 1 vs now 2"):
        q2.load_state_dict(st_)
    q3 = StreamingPacker(lens, 1024, packing_buffer_size=20, output="indices", seed=0, algorithm="first_fit_decreasing")
    with pytest.raises(ValueError, match="algorithm"):
        q3.load_state_dict(st_)


def test_state_holds_keys_not_tensors_and_is_small():
    lens = lognormal_lengths(30000, 4096)
    p = StreamingPacker(lens, 4096, packing_buffer_size=10000, output="indices")
    it = iter(p)
    next(it)
    state = p.state_dict()
    size = len(pickle.dumps(state))
    # buffer keys + lengths + ages as int64 (3 x 8 B x 10,000) plus pending packs: well under 1 MB
    assert size < 600_000, size
    assert len(state["buffer_keys"]) + len(state["pending_keys"]) <= 10000
    assert state["buffer_keys"].dtype == torch.int64


# ------------------------------------------------------------------------------------ new process + StatefulDataLoader

_SCRIPT = textwrap.dedent(
    """
    import json, sys, numpy as np, torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from seqpack.stream import StreamingPacker

    mode, path, stops = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]]
    rng = np.random.default_rng(11)
    lens = np.clip(rng.lognormal(5.5, 0.9, 1200).astype(np.int64), 1, 2048)
    for rank in range(2):
        packer = StreamingPacker(lens, 2048, packing_buffer_size=64, output="indices", seed=4,
                                 rank=rank, world_size=2)
        loader = StatefulDataLoader(packer, batch_size=None, num_workers=2)
        base = f"{path}.r{rank}"
        if mode == "resume":
            loader.load_state_dict(torch.load(base + ".state"))
        packs = []
        for pk in loader:
            packs.append([int(k) for k in pk])
            if mode == "head" and len(packs) == stops[rank]:
                break  # the state is taken right after the consumer received pack `stop`
        if mode == "head":
            torch.save(loader.state_dict(), base + ".state")
        json.dump(packs, open(f"{base}.{mode}.json", "w"))
    """
)


def _run_script(tmp_path, *args):
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    res = subprocess.run(
        [sys.executable, str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=240
    )
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.multiprocess
def test_resume_in_new_process_two_ranks_two_workers(tmp_path):
    """Stop after a random number of packs, restore through StatefulDataLoader in a new process."""
    pytest.importorskip("torchdata")
    rng = np.random.default_rng()
    base = str(tmp_path / "run")
    _run_script(tmp_path, "full", base)
    full = [json.load(open(f"{base}.r{r}.full.json")) for r in range(2)]
    stops = [int(rng.integers(1, len(f))) for f in full]
    _run_script(tmp_path, "head", base, *stops)
    _run_script(tmp_path, "resume", base)
    all_keys = []
    for rank in range(2):
        head = json.load(open(f"{base}.r{rank}.head.json"))
        rest = json.load(open(f"{base}.r{rank}.resume.json"))
        assert len(head) == stops[rank]
        assert head + rest == full[rank], f"rank {rank}: resumed packs differ after stop {stops[rank]}"
        ks = keys_of(head + rest)
        assert len(ks) == len(set(ks)), "duplicated samples"
        all_keys += ks
    assert sorted(all_keys) == list(range(1200)), "every sample exactly once across 2 ranks x 2 workers"


# ------------------------------------------------------------------------------------ epochs, loaders, self-sharding sources


def test_resume_mid_epoch_two_restores_the_same_epoch():
    lens = lognormal_lengths(500, 1024, 2)

    def mk():
        p = StreamingPacker(lens, 1024, packing_buffer_size=40, output="indices", seed=9)
        p.set_epoch(2)
        return p

    full = [pk.tolist() for pk in mk()]
    p = mk()
    it = iter(p)
    head = [next(it).tolist() for _ in range(10)]
    state = roundtrip(p.state_dict())
    assert state["epoch"] == 2
    q = StreamingPacker(lens, 1024, packing_buffer_size=40, output="indices", seed=9)  # epoch comes from the state
    q.load_state_dict(state)
    assert head + [pk.tolist() for pk in q] == full
    q.set_epoch(3)
    assert sorted(keys_of(q)) == list(range(500))  # the next epoch starts fresh


def test_stateful_dataloader_in_process_samples_output():
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    samples = make_samples(lognormal_lengths(150, 512, 4))

    def loader():
        p = StreamingPacker(samples, 512, packing_buffer_size=20, output="samples", seed=1)
        return tdl.StatefulDataLoader(p, batch_size=None, num_workers=0)

    full = [[s.sample_id for s in pk] for pk in loader()]
    dl = loader()
    head = []
    for pk in dl:
        head.append([s.sample_id for s in pk])
        if len(head) == 9:
            break
    state = roundtrip(dl.state_dict())
    dl2 = loader()
    dl2.load_state_dict(state)
    assert head + [[s.sample_id for s in pk] for pk in dl2] == full


class SelfShardingStream(torch.utils.data.IterableDataset):
    """Yields only the current DataLoader worker's items (like HF IterableDataset in workers)."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(self.items[wid::nw])


def test_self_sharding_source_with_shard_source_false():
    lens = [int(x) for x in lognormal_lengths(300, 1024, 5)]
    p = StreamingPacker(SelfShardingStream(lens), 1024, packing_buffer_size=16, output="samples", shard_source=False)
    dl = torch.utils.data.DataLoader(p, batch_size=None, num_workers=2)
    got = sorted(x for pk in dl for x in pk)
    assert got == sorted(lens)


def test_hf_iterable_dataset_double_sharding_is_refused():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"length": list(range(1, 41))}).to_iterable_dataset(num_shards=2)
    p = StreamingPacker(ds, 64, packing_buffer_size=8, output="samples", length_fn=lambda r: r["length"])
    packs = list(p)  # main process: the HF dataset does not shard itself
    assert sorted(r["length"] for pk in packs for r in pk) == list(range(1, 41))
    dl = torch.utils.data.DataLoader(p, batch_size=None, num_workers=2)
    with pytest.raises(Exception, match="shard_source=False"):
        list(dl)
    ok = StreamingPacker(ds, 64, packing_buffer_size=8, output="samples", length_fn=lambda r: r["length"],
                         shard_source=False)
    got = [r["length"] for pk in torch.utils.data.DataLoader(ok, batch_size=None, num_workers=2) for r in pk]
    assert sorted(got) == list(range(1, 41))


def test_state_loaded_in_main_process_is_rechecked_inside_workers():
    lens = lognormal_lengths(200, 1024)
    p = StreamingPacker(lens, 1024, packing_buffer_size=20, output="indices")
    it = iter(p)
    next(it)
    q = StreamingPacker(lens, 1024, packing_buffer_size=20, output="indices")
    q.load_state_dict(p.state_dict())  # fine here (one process, no workers) ...
    with pytest.raises(Exception, match="num_workers: saved 1 vs now 2"):
        list(torch.utils.data.DataLoader(q, batch_size=None, num_workers=2))  # ... refused in the workers
