"""seqpack.collate: datasets and collators (torch DataLoader, workers, HF-format output)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.collate import (
    InBatchPackingCollator,
    PackedCollator,
    PackedRowsDataset,
    PaddedCollator,
    to_hf_inputs,
)
from seqpack.sample import Sample, shift_labels
from seqpack.packed import PackedSequence, build_packed_sequence


def _config():
    """A full-attention model config (no window, no chunks) for the format='hf' output checks."""
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=2)

IGN = -100


def _samples(lengths, seed=0, vocab=1000, prefix="s"):
    rng = np.random.default_rng(seed)
    out = []
    for i, L in enumerate(lengths):
        ids = rng.integers(1, vocab, L)
        tr = np.ones(L, bool)
        tr[: min(2, L)] = False  # a short "prompt"
        out.append(Sample(ids, shift_labels(ids, tr), sample_id=f"{prefix}{i}"))
    return out


def test_in_batch_matches_canonical_builder_and_validates():
    samples = _samples((5, 3, 9))
    b = InBatchPackingCollator(pad_token_id=7, pad_to_multiple_of=4)(samples)
    row = build_packed_sequence(samples, pad_to_multiple_of=4, pad_token_id=7)
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "padding_mask", "seq_idx"):
        assert np.array_equal(b[key][0].numpy(), np.asarray(getattr(row, key))), key
    assert b["cu_seqlens"].tolist() == [0, 5, 8, 17] and b["cu_seqlens_padded"].tolist() == [0, 8, 12, 24]
    assert b["max_seqlen"] == 12 and b["num_segments"] == 3 and b["sample_ids"] == ["s0", "s1", "s2"]
    assert b["seq_lens"].tolist() == [5, 3, 9]
    rebuilt = PackedSequence.from_boundaries(b["input_ids"][0].numpy(), b["labels"][0].numpy(),
                                             b["cu_seqlens"].numpy(), b["cu_seqlens_padded"].numpy())
    rebuilt.validate(capacity=24)


def test_force_to_pad_tail_is_its_own_empty_segment():
    """Megatron-Bridge VLM layout: tail = own segment in cu_seqlens_padded, never counted logically.
    Differs from the offline 'last segment absorbs the tail' layout of build_packed_sequence."""
    samples = _samples((3, 2))
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, seq_length=12,
                               force_to_pad_to_seq_len=True)(samples)
    assert b["input_ids"].shape == (1, 12)
    assert b["cu_seqlens_padded"].tolist() == [0, 4, 8, 12]
    assert b["cu_seqlens"].tolist() == [0, 3, 5, 5]
    assert b["num_segments"] == 3 and b["seq_lens"].tolist() == [3, 2, 0]
    assert b["seq_idx"][0].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert b["padding_mask"][0].tolist() == [0, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 1]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]
    assert int((~b["padding_mask"]).sum()) == 5  # real tokens for loss/routing (B17)
    assert (b["labels"][0, 5:] == IGN).all()
    # the offline layout of the same samples: last segment absorbs the tail
    row = build_packed_sequence(samples, pad_to_multiple_of=4, pad_token_id=0, seq_length=12,
                                pad_to_max_length=True)
    assert row.cu_seqlens_padded.tolist() == [0, 4, 12] and row.cu_seqlens.tolist() == [0, 3, 5]
    # when the samples fill seq_length exactly no tail segment is added
    full = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, seq_length=8,
                                  force_to_pad_to_seq_len=True)(samples)
    assert full["cu_seqlens_padded"].tolist() == [0, 4, 8] and full["num_segments"] == 2


def test_packed_collator_flattens_with_offset_boundaries():
    r0 = build_packed_sequence(_samples((3, 2)), pad_to_multiple_of=4, pad_token_id=0, seq_length=12,
                               pad_to_max_length=True)
    r1 = build_packed_sequence(_samples((6, 1, 2), seed=1, prefix="t"), pad_to_multiple_of=2, pad_token_id=0)
    b = PackedCollator()([r0, r1])
    T0 = r0.length
    assert b["input_ids"].shape == (1, T0 + r1.length)
    # logical boundaries offset by row 0's REAL tokens (5), physical ones by its width (12)
    assert b["cu_seqlens"].tolist() == [0, 3, 5, 5 + 6, 5 + 7, 5 + 9]
    assert b["cu_seqlens_padded"].tolist() == [0, 4, 12, 18, 20, 22]
    assert b["seq_lens"].tolist() == [3, 2, 6, 1, 2]
    assert b["padding_mask"][0].tolist() == [0, 0, 0, 1] + [0, 0] + [1] * 6 + [0] * 6 + [0, 1] + [0, 0]
    flat = PackedSequence.from_boundaries(b["input_ids"][0].numpy(), b["labels"][0].numpy(),
                                          b["cu_seqlens"].numpy(), b["cu_seqlens_padded"].numpy())
    flat.validate()  # real length <= padded length per segment; padding_mask/seq_idx implied by boundaries
    assert np.array_equal(flat.padding_mask, b["padding_mask"][0].numpy())
    assert np.array_equal(flat.seq_idx, b["seq_idx"][0].numpy())
    assert b["num_segments"] == 5 and b["sample_ids"] == ["s0", "s1", "t0", "t1", "t2"]
    assert b["seq_idx"][0, T0:].tolist() == [2] * 6 + [3] * 2 + [4] * 2
    assert b["position_ids"][0, T0:].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 0, 1]
    assert torch.equal(b["labels"][0, :T0], torch.as_tensor(r0.labels))
    # micro-batch 1: the row itself
    one = PackedCollator()([r1])
    assert one["cu_seqlens"].tolist() == r1.cu_seqlens.tolist()
    # static-shape (repeat-last) boundary arrays are trimmed by num_segments (B19 form)
    s = PackedCollator()([r0.pad_cu_seqlens(5), r1])
    assert s["cu_seqlens_padded"].tolist() == b["cu_seqlens_padded"].tolist()
    # dict features (e.g. to_torch()) work the same
    d = PackedCollator()([r0.to_torch(), r1.to_torch()])
    assert torch.equal(d["labels"], b["labels"]) and d["cu_seqlens"].tolist() == b["cu_seqlens"].tolist()
    with pytest.raises(KeyError, match="boundaries"):
        PackedCollator()([{"input_ids": np.zeros(3), "labels": np.zeros(3)}])


def test_padded_collator_baseline():
    samples = _samples((5, 2))
    b = PaddedCollator(pad_token_id=9, pad_to_multiple_of=4)(samples)
    assert set(b) == {"input_ids", "attention_mask", "labels", "shift_labels"}
    assert b["input_ids"].shape == (2, 8)
    assert b["attention_mask"].tolist() == [[1] * 5 + [0] * 3, [1, 1] + [0] * 6]
    assert b["input_ids"][1].tolist()[2:] == [9] * 6
    s0 = samples[0]
    assert b["shift_labels"][0, :5].tolist() == s0.labels.tolist()
    assert b["labels"][0, 1:6].tolist() == s0.labels.tolist() and b["labels"][0, 0] == IGN
    sh = PaddedCollator(pad_token_id=0, format="shifted")(samples)
    assert sh["labels"][0, :5].tolist() == s0.labels.tolist() and sh["loss_mask"].dtype == torch.bool
    assert sh["position_ids"][1].tolist() == list(range(5))
    with pytest.raises(ValueError, match="format"):
        PaddedCollator(pad_token_id=0, format="thd")


def test_collator_errors_name_samples_and_keys():
    with pytest.raises(ValueError, match=r"needs 12 slots.*seq_length=8.*s0:5->8, s1:3->4"):
        InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, seq_length=8)(_samples((5, 3)))
    with pytest.raises(ValueError, match="seq_length=10 is not divisible by the pad multiple 4"):
        InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, seq_length=10)
    with pytest.raises(ValueError, match="pad_to_multiple_of=3, context_parallel_size=2"):
        InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=3, context_parallel_size=2, seq_length=36 + 6)
    cp = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=3, context_parallel_size=2)(_samples((5, 13)))
    assert cp["cu_seqlens_padded"].tolist() == [0, 12, 36]  # lcm(3, 2*2) = 12
    with pytest.raises(ValueError, match="pad_to_multiple_of must be an integer >= 1"):
        InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="needs seq_length"):
        InBatchPackingCollator(pad_token_id=0, force_to_pad_to_seq_len=True)
    with pytest.raises(ValueError, match="needs config=model.config: the packed masks follow the model's attention"):
        InBatchPackingCollator(pad_token_id=0, format="hf", attn_implementation="sdpa")
    with pytest.raises(ValueError, match="empty"):
        InBatchPackingCollator(pad_token_id=0)([{"input_ids": [], "sample_id": "x"}])


@pytest.mark.parametrize("impl,keys", [
    ("sdpa", {"attention_mask"}),
    ("eager", {"attention_mask"}),
    ("flex_attention", {"attention_mask"}),
    ("flash_attention_2", {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}),
])
def test_hf_format_outputs_exactly_forward_kwargs(impl, keys):
    samples = _samples((5, 3))
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, format="hf", config=_config(),
                               attn_implementation=impl)(samples)
    assert set(b) == {"input_ids", "position_ids", "labels", "shift_labels"} | keys
    assert b["labels"][0].tolist() == to_hf_inputs(InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(
        samples), impl, config=_config())["labels"][0].tolist()
    if impl == "flex_attention":
        pickle.loads(pickle.dumps(b))  # crosses DataLoader worker boundaries


def test_dataloader_workers_and_pickling():
    from torch.utils.data import DataLoader

    rows = [build_packed_sequence(_samples((4, 3), seed=i, prefix=f"r{i}_"), pad_to_multiple_of=2, pad_token_id=0)
            for i in range(4)]
    ds = PackedRowsDataset(rows)
    coll = PackedCollator()
    pickle.loads(pickle.dumps(coll))
    serial = list(DataLoader(ds, batch_size=2, collate_fn=coll))
    par = list(DataLoader(ds, batch_size=2, collate_fn=coll, num_workers=2))
    assert len(par) == 2
    for a, b in zip(serial, par):
        assert torch.equal(a["input_ids"], b["input_ids"]) and a["cu_seqlens"].tolist() == b["cu_seqlens"].tolist()
        assert a["cu_seqlens_padded"][-1] == a["input_ids"].shape[1]
    samples = _samples((4, 7, 3, 2, 5, 6))
    ib = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, seq_length=32, force_to_pad_to_seq_len=True,
                                format="hf", config=_config(), attn_implementation="sdpa")
    out = list(DataLoader(samples, batch_size=3, collate_fn=ib, num_workers=2))
    assert [o["input_ids"].shape for o in out] == [(1, 32), (1, 32)]
    assert out[0]["attention_mask"].shape == (1, 1, 32, 32)


def test_packed_dataset_over_directory(tmp_path):
    from seqpack import io  # a core module: an import error must fail, not skip
    rows = [build_packed_sequence(_samples((4, 3), seed=i, prefix=f"r{i}_"), pad_to_multiple_of=2,
                                  pad_token_id=0, seq_length=8, pad_to_max_length=True) for i in range(3)]
    io.write_packed(rows, tmp_path / "packed", io.PackedMetadata(seq_length=8, pad_to_multiple_of=2))
    ds = PackedRowsDataset(tmp_path / "packed")
    assert len(ds) == 3
    ds2 = pickle.loads(pickle.dumps(ds))
    b = PackedCollator()([ds2[0], ds2[2]])
    assert b["input_ids"].shape == (1, 16)
    assert b["input_ids"][0, :8].tolist() == rows[0].input_ids.tolist()
    assert b["cu_seqlens_padded"].tolist() == [0, 4, 8, 12, 16]


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=8), st.sampled_from([1, 2, 4, 8, 16]),
       st.booleans())
def test_in_batch_invariants(lengths, multiple, force):
    samples = _samples(lengths)
    padded = [-(-L // multiple) * multiple for L in lengths]
    seq_length = -(-(sum(padded) + 5) // multiple) * multiple
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=multiple, seq_length=seq_length,
                               force_to_pad_to_seq_len=force)(samples)
    T = b["input_ids"].shape[1]
    cup = b["cu_seqlens_padded"].tolist()
    cu = b["cu_seqlens"].tolist()
    assert cup[-1] == T == (seq_length if force else sum(padded))
    assert all((cup[i + 1] - cup[i]) % multiple == 0 for i in range(len(cup) - 1))
    assert all(cu[i + 1] - cu[i] == L for i, L in enumerate(lengths))
    assert int((~b["padding_mask"]).sum()) == sum(lengths)
    assert (b["labels"][b["padding_mask"]] == IGN).all()
    assert torch.equal(b["loss_mask"], b["labels"] != IGN)
    for i, s in enumerate(samples):  # every sample placed once, intact, labels unchanged
        a = cup[i]
        assert b["input_ids"][0, a:a + s.length].tolist() == s.input_ids.tolist()
        assert b["labels"][0, a:a + s.length].tolist() == s.labels.tolist()
    if not force:
        PackedSequence.from_boundaries(b["input_ids"][0].numpy(), b["labels"][0].numpy(), b["cu_seqlens"].numpy(),
                                       b["cu_seqlens_padded"].numpy()).validate()


def test_media_concatenated_in_segment_order():
    s = _samples((4, 3, 5))
    s[0].media = {"pixel_values": np.full((4, 6), 1.0), "image_grid_thw": np.array([[1, 2, 2]])}
    s[2].media = {"pixel_values": np.full((8, 6), 3.0), "image_grid_thw": np.array([[1, 2, 4]])}
    b = InBatchPackingCollator(pad_token_id=0)(s)
    assert b["pixel_values"].shape == (12, 6) and b["pixel_values"][:4].eq(1).all() and b["pixel_values"][4:].eq(3).all()
    assert b["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]
    # no M-RoPE table and no way to compute one: the hf format refuses rather than use text positions
    with pytest.raises(ValueError, match="mrope_position_ids"):
        InBatchPackingCollator(pad_token_id=0, format="hf", config=_config(), attn_implementation="sdpa")(s)
    s[0].media["mrope_position_ids"] = np.array([[0, 1, 1, 2], [0, 1, 2, 3], [0, 2, 1, 3]])
    s[2].media["mrope_position_ids"] = np.array([[0, 1, 1, 1, 2], [0, 1, 1, 2, 3], [0, 1, 2, 1, 3]])
    hf = InBatchPackingCollator(pad_token_id=0, format="hf", config=_config(), attn_implementation="sdpa")(s)
    assert torch.equal(hf["image_grid_thw"], b["image_grid_thw"])
    assert hf["position_ids"].shape == (3, 1, 12)
    assert hf["position_ids"][:, 0, :4].tolist() == s[0].media["mrope_position_ids"].tolist()
    assert hf["position_ids"][:, 0, 4:7].tolist() == [[0, 1, 2]] * 3  # text segment: 1-D on all axes
    assert hf["position_ids"][:, 0, 7:].tolist() == s[2].media["mrope_position_ids"].tolist()
    rows = [build_packed_sequence(s[:2], pad_token_id=0), build_packed_sequence(s[2:], pad_token_id=0)]
    p = PackedCollator()(rows)
    assert torch.equal(p["pixel_values"], b["pixel_values"])
    assert "pixel_values" not in InBatchPackingCollator(pad_token_id=0)(_samples((3, 2)))


def test_megatron_format():
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, format="megatron")(_samples((5, 3)))
    assert set(b) == {"tokens", "labels", "loss_mask", "position_ids", "padding_mask", "packed_seq_params"}
    p = b["packed_seq_params"]
    assert p["qkv_format"] == "thd" and p["cu_seqlens_q"].tolist() == [0, 5, 8]
    assert p["cu_seqlens_kv_padded"].tolist() == [0, 8, 12] and p["max_seqlen_q"] == 8


def test_hf_label_convention_features():
    """Mapping features with HF (unshifted) labels, e.g. rows of an HF datasets.Dataset."""
    samples = _samples((6, 4))
    feats = []
    for s in samples:
        hf = np.full(s.length, IGN)
        hf[1:] = s.labels[:-1]
        feats.append({"input_ids": s.input_ids.tolist(), "labels": hf.tolist()})
    a = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, label_convention="hf")(feats)
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    assert torch.equal(a["labels"], b["labels"]) and torch.equal(a["input_ids"], b["input_ids"])
    pa = PaddedCollator(pad_token_id=0, label_convention="hf")(feats)
    pb = PaddedCollator(pad_token_id=0)(samples)
    assert torch.equal(pa["labels"], pb["labels"]) and torch.equal(pa["shift_labels"], pb["shift_labels"])
    # no labels at all: train on every next token
    c = InBatchPackingCollator(pad_token_id=0)([{"input_ids": [4, 5, 6]}])
    assert c["labels"][0].tolist() == [5, 6, IGN] and c["sample_ids"] == ["0"]
