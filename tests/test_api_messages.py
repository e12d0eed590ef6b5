"""Input validation and messages of the public API: pack_lengths inputs, build_packed_sequence inputs,
StreamingPacker over-length logging (aggregated, nothing lost from stats)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from seqpack.algorithms import pack_lengths
from seqpack.sample import Sample
from seqpack.packed import build_packed_sequence


# ------------------------------------------------------------------------------------ pack_lengths
def test_pack_lengths_accepts_any_iterable_of_ints():
    lens = [300, 700, 200, 900, 100]
    ref = pack_lengths(lens, 1000, seed=3)
    # the list route itself is right: all 5 samples once, in ceil(2200 / 1000) = 3 packs, none over 1000
    assert sorted(np.concatenate(ref.bins).tolist()) == list(range(5))
    assert ref.num_bins == 3 and int(ref.bin_loads.max()) <= 1000 and int(ref.bin_loads.sum()) == 2200
    for it in ((x for x in lens), iter(lens), tuple(lens), range(100, 600, 100), map(int, lens)):
        plan = pack_lengths(it, 1000, seed=3)
        if isinstance(it, range):
            assert sorted(np.concatenate(plan.bins).tolist()) == list(range(5))
            assert int(plan.bin_loads.sum()) == sum(range(100, 600, 100))
        else:
            assert [b.tolist() for b in plan.bins] == [b.tolist() for b in ref.bins]
            assert plan.bin_loads.tolist() == ref.bin_loads.tolist()
    assert pack_lengths((x for x in []), 8).num_bins == 0


@pytest.mark.parametrize("bad,exc,match", [
    (5, ValueError, "got a single value 5"),
    ([[1, 2], [3, 4]], ValueError, r"got an array of shape \(2, 2\)"),
    ({3, 4}, TypeError, "ordered 1-D sequence .* got set"),
    ({"a": 3}, TypeError, "got dict"),
    ((x / 2 for x in (3, 4)), TypeError, "integer dtype .* got dtype float64"),
])
def test_pack_lengths_bad_inputs_say_what_was_given(bad, exc, match):
    with pytest.raises(exc, match=match):
        pack_lengths(bad, 8)


# ------------------------------------------------------------------------ build_packed_sequence
def _shifted(ids):
    return list(ids[1:]) + [-100]


def test_build_packed_sequence_accepts_mappings_like_samples():
    import torch

    a, b = [5, 6, 7, 8], [9, 10, 11]
    dicts = [{"input_ids": a, "labels": _shifted(a), "sample_id": "a"},
             {"input_ids": torch.tensor(b), "labels": np.array(_shifted(b))}]  # no sample_id: position
    row = build_packed_sequence(dicts, pad_to_multiple_of=4, pad_token_id=0)
    ref = build_packed_sequence([Sample(np.array(a), np.array(_shifted(a)), sample_id="a"),
                                 Sample(np.array(b), np.array(_shifted(b)), sample_id="1")],
                                pad_to_multiple_of=4, pad_token_id=0)
    assert row.sample_ids == ["a", "1"]
    for f in ("input_ids", "labels", "position_ids", "cu_seqlens", "cu_seqlens_padded", "padding_mask"):
        np.testing.assert_array_equal(getattr(row, f), getattr(ref, f))
    assert row.labels.tolist() == [6, 7, 8, -100, 10, 11, -100, -100]
    row.validate()


def test_build_packed_sequence_bad_samples_raise_named_errors():
    ids = [1, 2, 3, 4]
    with pytest.raises(TypeError, match="position 1 is a str; expected seqpack.sample.Sample objects or "
                                        "mappings with 'input_ids' and 'labels'"):
        build_packed_sequence([{"input_ids": ids, "labels": _shifted(ids)}, "oops"], pad_token_id=0)
    with pytest.raises(TypeError, match="got a single dict; wrap it in a list"):
        build_packed_sequence({"input_ids": ids, "labels": _shifted(ids)}, pad_token_id=0)
    with pytest.raises(ValueError, match=r"sample 's7' \(position 0\) has no \['labels'\]"):
        build_packed_sequence([{"input_ids": ids, "sample_id": "s7"}], pad_token_id=0)
    # HF-style (unshifted) labels would silently train every token on itself: refused with the fix
    with pytest.raises(ValueError, match="unshifted \\(HF\\) labels.*shift_labels"):
        build_packed_sequence([{"input_ids": ids, "labels": [-100, -100, 3, 4]}], pad_token_id=0)


def test_build_packed_sequence_generator_of_samples():
    s = [Sample(np.array([1, 2, 3]), np.array([2, 3, -100]), sample_id=f"s{i}") for i in range(2)]
    row = build_packed_sequence((x for x in s), pad_token_id=0)
    assert row.sample_ids == ["s0", "s1"] and row.cu_seqlens.tolist() == [0, 3, 6]


@pytest.mark.parametrize("pad,exc,match", [
    (None, TypeError, r"pad_token_id is required \(the tokenizer's pad_token_id; Qwen3: tok.pad_token_id\)"),
    (1.5, TypeError, "pad_token_id must be an integer token id .* got 1.5"),
    ("0", TypeError, "must be an integer token id"),
    (-1, ValueError, "pad_token_id must be a token id >= 0"),
])
def test_build_packed_sequence_pad_token_id_messages(pad, exc, match):
    s = Sample(np.array([1, 2, 3]), np.array([2, 3, -100]), sample_id="s")
    with pytest.raises(exc, match=match):
        build_packed_sequence([s], pad_token_id=pad)


def test_build_packed_sequence_numpy_pad_token_id_still_works():
    s = Sample(np.array([1, 2, 3]), np.array([2, 3, -100]), sample_id="s")
    row = build_packed_sequence([s], pad_token_id=np.int64(151643), pad_to_multiple_of=4)
    assert row.input_ids.tolist() == [1, 2, 3, 151643]


# ------------------------------------------------------------------- StreamingPacker over-length
def test_streaming_overlength_drop_logs_in_aggregate(caplog):
    pytest.importorskip("torch")
    from seqpack.stream import StreamingPacker

    lens = np.array([50, 500, 60, 700, 40, 900, 30, 800, 20, 600, 10, 1000, 70, 550], np.int64)
    over = np.flatnonzero(lens > 100).tolist()  # 7 over-length samples
    p = StreamingPacker(lens, 100, packing_buffer_size=4, output="indices", overlength="drop", shuffle=False)
    with caplog.at_level(logging.WARNING, logger="seqpack.stream"):
        packs = list(p)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # first drop + end-of-epoch summary, not one line per sample
    assert "dropping over-length samples" in warnings[0] and "source key 1" in warnings[0]
    assert "7 over-length sample(s) dropped in epoch 0" in warnings[1]
    assert "..., " not in warnings[1] and ", ...;" in warnings[1]  # first five keys, then an ellipsis
    assert sorted(p.stats["overlength_dropped"]) == over  # the full list, nothing lost
    packed = sorted(int(k) for pk in packs for k in pk)
    assert packed == sorted(set(range(len(lens))) - set(over))


def test_select_samples_to_pack_drop_logs_once(caplog):
    from seqpack.stream import select_samples_to_pack

    samples = [Sample(np.arange(1, n + 1), np.full(n, -100), sample_id=f"r{i}")
               for i, n in enumerate([10, 500, 20, 600, 700, 800, 900, 950, 30])]
    with caplog.at_level(logging.WARNING, logger="seqpack.stream"):
        packs = select_samples_to_pack(samples, capacity=100, overlength="drop")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "dropped 6 over-length sample(s) of 9" in warnings[0]
    assert "sample_id 'r1'" in warnings[0] and "... and 1 more" in warnings[0]
    assert sorted(s.sample_id for pk in packs for s in pk) == ["r0", "r2", "r8"]
    with pytest.raises(ValueError, match="sample_id 'r1'.*pass overlength='drop'"):
        select_samples_to_pack(samples, capacity=100)
