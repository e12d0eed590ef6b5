"""seqpack.io.spill.SampleSpill: samples written to disk come back identical (bounded-memory packing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.sample import IGNORE_INDEX, Sample
from seqpack.io.spill import SampleSpill


@st.composite
def samples(draw):
    n = draw(st.integers(1, 40))
    ids = np.array(draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)), dtype=np.int32)
    lab = np.array(draw(st.lists(st.one_of(st.just(IGNORE_INDEX), st.integers(0, 2**31 - 1)), min_size=n, max_size=n)),
                   dtype=np.int32)
    media = draw(st.one_of(st.none(), st.fixed_dictionaries({"images": st.lists(st.text(max_size=5), max_size=2)})))
    meta = draw(st.dictionaries(st.sampled_from(["format", "record_id", "truncated"]), st.one_of(st.text(max_size=4), st.integers()),
                                max_size=2))
    return Sample(ids, lab, sample_id=draw(st.text(max_size=12)), source=draw(st.one_of(st.none(), st.sampled_from(["a.json", "b.jsonl"]))),
                  index=draw(st.one_of(st.none(), st.integers(0, 2**40))), media=media, meta=meta)


def _same(a: Sample, b: Sample) -> None:
    assert a.input_ids.dtype == b.input_ids.dtype == np.int32 and b.labels.dtype == np.int32
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert (a.sample_id, a.source, a.index, a.media, a.meta) == (b.sample_id, b.source, b.index, b.media, b.meta)


@settings(deadline=None, max_examples=60)
@given(st.lists(samples(), min_size=1, max_size=25), st.data())
def test_round_trip_random_samples(tmp_path_factory, batch, data):
    d = tmp_path_factory.mktemp("spill")
    with SampleSpill(d / "s") as sp:
        half = len(batch) // 2
        sp.extend(batch[:half])
        if half:  # reading between appends sees the flushed data
            _same(batch[0], sp.get(0))
        sp.extend(batch[half:])
        assert len(sp) == len(batch)
        np.testing.assert_array_equal(sp.lengths(), [s.length for s in batch])
        assert sp.lengths().dtype == np.int64
        assert sp.num_tokens == sum(s.length for s in batch)
        assert sp.trainable_tokens == sum(s.num_trainable for s in batch)
        order = data.draw(st.permutations(range(len(batch))))
        for i in order:  # random access
            _same(batch[i], sp.get(i))
        _same(batch[-1], sp[-1])
    assert not (d / "s").exists()  # the context manager deletes the folder


def test_get_returns_copies_and_fresh_meta(tmp_path):
    s = Sample(np.arange(5), np.full(5, IGNORE_INDEX), "x:0", "x.json", 0, None, {"format": "openai"})
    with SampleSpill(tmp_path / "s") as sp:
        sp.append(s)
        a = sp.get(0)
        a.input_ids[0] = 99
        a.meta["changed"] = True
        b = sp.get(0)
        assert b.input_ids[0] == 0 and b.meta == {"format": "openai"}
        assert b.input_ids.flags.writeable and not isinstance(b.input_ids, np.memmap)


def test_reads_do_not_map_the_spill_files(tmp_path):
    """Reads are positioned copies: the spill files never appear in the process's memory maps, so
    reading a large spill adds no file-backed resident memory (Linux only: reads /proc/self/maps)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps")
    with SampleSpill(tmp_path / "s") as sp:
        for k in range(50):
            sp.append(Sample(np.full(1000, k), np.full(1000, IGNORE_INDEX), f"s{k}"))
        assert [int(sp.get(k).input_ids[0]) for k in range(49, -1, -1)] == list(range(49, -1, -1))
        assert str(tmp_path / "s") not in maps.read_text()


def test_errors(tmp_path):
    sp = SampleSpill(tmp_path / "b")
    sp.append(Sample(np.arange(3), np.full(3, IGNORE_INDEX), "only"))
    with pytest.raises(IndexError, match="out of range for a spill of 1"):
        sp.get(1)
    with pytest.raises(IndexError):
        sp.get(-2)
    with pytest.raises(FileExistsError, match="already holds a sample spill"):
        SampleSpill(tmp_path / "b")
    sp.close()
    with pytest.raises(ValueError, match="closed"):
        sp.append(Sample(np.arange(3), np.full(3, IGNORE_INDEX), "late"))
    with pytest.raises(ValueError, match="closed"):
        sp.get(0)
    sp.cleanup()


def test_ids_and_shared_values_round_trip_exactly(tmp_path):
    """Sample ids of any text (non-ASCII, lone surrogates, empty) and non-str ids come back equal; a meta
    value keeps its type ({"truncated": 1} is not {"truncated": True}); equal sources / meta are stored once."""
    odd = [("é中:0", "a.json", {"truncated": 1}), ("\udcff", "a.json", {"truncated": True}), ("", None, None),
           (7, "b.jsonl", {"tags": ["x"]}), ("z:1", "b.jsonl", {"tags": ["x"]}), ("z:2", "a.json", {"truncated": 1.0})]
    with SampleSpill(tmp_path / "s") as sp:
        for sid, src, meta in odd:
            sp.append(Sample(np.arange(2), np.full(2, IGNORE_INDEX), sid, src, None, None, meta))
        for k in range(1000):
            sp.append(Sample(np.arange(2), np.full(2, IGNORE_INDEX), f"many:{k}", "a.json", k, None, {}))
        got = [sp.get(i) for i in range(len(odd))]
        assert [(g.sample_id, g.source, g.meta) for g in got] == odd
        assert [type(g.sample_id) for g in got] == [type(o[0]) for o in odd]
        assert [{k: type(v) for k, v in (g.meta or {}).items()} for g in got] == [
            {k: type(v) for k, v in (o[2] or {}).items()} for o in odd]
        assert sp.get(1005).sample_id == "many:999" and sp.get(1005).index == 999 and sp.get(1005).meta == {}
        # a.json, b.jsonl, None (source and meta), the three truncated metas, the two unhashable tags metas, {}
        assert len(sp._values) == 9
