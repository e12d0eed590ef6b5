"""StreamingPacker on sources that cannot be replayed or states that do not fit the source: a one-shot
iterator read twice, a resume from a generator that already started, a cursor past the shard's end, and an
empty sample, each refused with a message naming the fix (never fewer samples, silently)."""

from __future__ import annotations

import numpy as np
import pytest

from _stream_data import lognormal_lengths

from seqpack.stream import StreamingPacker

LENS = [int(x) for x in lognormal_lengths(2000, 1024, 11)]


def _packer(source):
    return StreamingPacker(source, 1024, packing_buffer_size=200, output="indices", seed=0)


def _keys(packs):
    return [[int(k) for k in p] for p in packs]


def test_a_new_generator_resumes_exactly():
    full = _keys(_packer(x for x in LENS))
    p = _packer(x for x in LENS)
    it = iter(p)
    first = [next(it) for _ in range(10)]
    q = _packer(x for x in LENS)
    q.load_state_dict(p.state_dict())
    assert _keys(first) + _keys(q) == full
    assert sorted(k for pack in full for k in pack) == list(range(len(LENS)))  # every sample once


def test_resuming_from_the_same_started_generator_is_refused():
    gen = (x for x in LENS)
    p = _packer(gen)
    it = iter(p)
    for _ in range(10):
        next(it)
    q = _packer(gen)  # the caller hands the half-read generator over again
    q.load_state_dict(p.state_dict())
    with pytest.raises(ValueError, match=r"cannot resume: the source generator has already yielded items, but a "
                                         r"resume replays the source from its first item .* Fix: pass a re-iterable"):
        next(iter(q))


def test_a_second_pass_over_a_one_shot_iterator_is_refused():
    p = _packer(iter(LENS))
    assert sum(len(k) for k in _keys(p)) == len(LENS)
    p.set_epoch(1)
    with pytest.raises(ValueError, match="one-shot iterator .* already read, so another pass .* would miss samples"):
        next(iter(p))
    again = _packer(list(LENS))  # a list is re-iterable: every epoch holds every sample
    for epoch in (0, 1):
        again.set_epoch(epoch)
        assert sum(len(k) for k in _keys(again)) == len(LENS)


def test_a_state_past_the_end_of_a_map_source_is_refused():
    p = _packer(np.array(LENS))
    next(iter(p))
    state = p.state_dict()
    state["cursor"] = 10**6
    q = _packer(np.array(LENS))
    q.load_state_dict(state)
    with pytest.raises(ValueError, match=rf"saved at item 1000000 of this shard, but the shard has only {len(LENS)} "
                                         "items; the state is not from this source"):
        next(iter(q))


def test_an_empty_sample_is_named_as_empty():
    with pytest.raises(ValueError, match=r"source key 0 is empty \(length 0\): it has no token to pack"):
        list(StreamingPacker(np.array([0, 5, 7]), 1024, packing_buffer_size=8, output="indices"))
