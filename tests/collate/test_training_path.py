"""The training path (collators -> ``seqpack.hf.packed_forward`` -> ``seqpack.loss``) on flattened and image rows.

BUG 1  flattened rows (``PackedCollator`` with B > 1) offset the LOGICAL ``cu_seqlens`` of row ``i``
       by the physical width of the rows before it (real length > padded length, wrong
       ``cu_seqlens_q`` for Megatron / Transformer Engine THD).
BUG 2  image rows ran with 1-D text ``position_ids``: HF Qwen2-VL then skips its M-RoPE
       (``get_rope_index``) and image tokens rotate with text positions.
BUG 3  ``packed_forward(model, PackedSequence)`` crashed.
Rough edges: NaN loss without loss tokens, empty-list loss helpers, HF-style labels accepted silently.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqpack.collate import InBatchPackingCollator, PackedCollator
from seqpack.packed.mrope import mrope_position_ids
from seqpack.sample import Sample, shift_labels
from seqpack.hf import packed_forward
from seqpack.loss import global_token_count, sequence_mean, token_mean
from seqpack.packed import PackedSequence, build_packed_sequence

IGN = -100


def _samples(lengths, seed=0, vocab=250, prefix="s"):
    rng = np.random.default_rng(seed)
    out = []
    for i, L in enumerate(lengths):
        ids = rng.integers(1, vocab, L)
        tr = np.ones(L, bool)
        tr[: min(2, L)] = False
        out.append(Sample(ids, shift_labels(ids, tr), sample_id=f"{prefix}{i}"))
    return out


def _check_flat_row(b, rows):
    """The flattened batch obeys the row invariants and keeps each segment's real length/offset."""
    cu, cup = b["cu_seqlens"].numpy(), b["cu_seqlens_padded"].numpy()
    want_real = np.concatenate([np.diff(r.cu_seqlens) for r in rows])
    want_pad = np.concatenate([np.diff(r.cu_seqlens_padded) for r in rows])
    assert np.array_equal(np.diff(cu), want_real)
    assert np.array_equal(np.diff(cup), want_pad)
    assert (np.diff(cu) <= np.diff(cup)).all()
    flat = PackedSequence.from_boundaries(b["input_ids"][0].numpy(), b["labels"][0].numpy(), cu, cup)
    flat.validate()
    assert np.array_equal(flat.padding_mask, b["padding_mask"][0].numpy())
    assert np.array_equal(flat.seq_idx, b["seq_idx"][0].numpy())
    assert int((~b["padding_mask"]).sum()) == int(cu[-1]) == sum(int(r.cu_seqlens[-1]) for r in rows)
    # megatron view: cu_seqlens_q is the logical array, q_padded the physical one
    m = PackedCollator(format="megatron")(rows)["packed_seq_params"]
    assert m["cu_seqlens_q"].tolist() == cu.tolist() and m["cu_seqlens_q_padded"].tolist() == cup.tolist()


def test_bug1_flattened_rows_offset_logical_boundaries_by_real_tokens():
    r0 = build_packed_sequence(_samples((5, 3)), pad_to_multiple_of=4, pad_token_id=0, seq_length=16,
                               pad_to_max_length=True)
    r1 = build_packed_sequence(_samples((7, 2), seed=1, prefix="t"), pad_to_multiple_of=4, pad_token_id=0,
                               seq_length=16, pad_to_max_length=True)
    b = PackedCollator()([r0, r1])
    assert b["cu_seqlens"].tolist() == [0, 5, 8, 15, 17]  # before the fix: [0, 5, 8, 23, 25]
    assert b["cu_seqlens_padded"].tolist() == [0, 8, 16, 24, 32]
    assert b["padding_mask"][0, 16:].tolist() == [False] * 7 + [True] + [False] * 2 + [True] * 6
    _check_flat_row(b, [r0, r1])


@settings(deadline=None, max_examples=40)
@given(st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=4), min_size=1, max_size=4),
       st.sampled_from([1, 2, 4]), st.booleans())
def test_bug1_flattened_rows_satisfy_row_invariants(row_lengths, multiple, to_max):
    rows = []
    for i, lens in enumerate(row_lengths):
        need = sum(-(-L // multiple) * multiple for L in lens)
        rows.append(build_packed_sequence(_samples(lens, seed=i, prefix=f"r{i}_"), pad_to_multiple_of=multiple,
                                          pad_token_id=0, seq_length=need + 2 * multiple if to_max else None,
                                          pad_to_max_length=to_max))
    _check_flat_row(PackedCollator()(rows), rows)


def test_bug1_real_alpaca_rows(shared_data, qwen3_tokenizer, tmp_path):
    """The tester's case: alpaca, seq_length=512, pad_to_multiple_of=8, two packs flattened."""
    from seqpack.io import load_packed
    from seqpack.pipeline import pack_dataset

    pack_dataset([shared_data / "llama-factory" / "alpaca_en_demo.json"], tmp_path / "p",
                 tokenizer=qwen3_tokenizer, seq_length=512, pad_to_multiple_of=8)
    ds = load_packed(tmp_path / "p")
    r0, r1 = ds[0], ds[1]
    b = PackedCollator()([r0, r1])
    n0 = int(r0.cu_seqlens[-1])
    assert b["cu_seqlens"].tolist() == r0.cu_seqlens.tolist() + (r1.cu_seqlens[1:] + n0).tolist()
    assert b["cu_seqlens_padded"].tolist() == r0.cu_seqlens_padded.tolist() + (
        r1.cu_seqlens_padded[1:] + r0.length).tolist()
    _check_flat_row(b, [r0, r1])


# ----------------------------------------------------------------------------------------- BUG 2
IMG, VS, VE = 150, 152, 153
PATCH_DIM = 3 * 1 * 2 * 2  # channels * temporal_patch * patch * patch


def _qwen2vl():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1e4}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=2,
                           spatial_merge_size=2, temporal_patch_size=1, in_channels=3),
        image_token_id=IMG, video_token_id=151, vision_start_token_id=VS, vision_end_token_id=VE,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(cfg).eval()


def _image_sample(i, before, grid_hw, after, rng):
    h, w = grid_hw
    n_img = (h // 2) * (w // 2)
    ids = np.concatenate([rng.integers(1, 140, before), [VS], np.full(n_img, IMG), [VE],
                          rng.integers(1, 140, after)]).astype(np.int64)
    grid = np.array([[1, h, w]], np.int64)
    media = {"pixel_values": rng.standard_normal((h * w, PATCH_DIM)).astype(np.float32),
             "image_grid_thw": grid, "mrope_position_ids": mrope_position_ids(ids, grid, 2, IMG)}
    tr = np.zeros(ids.size, bool)
    tr[-after:] = True
    return Sample(ids, shift_labels(ids, tr), sample_id=f"img{i}", media=media)


@pytest.fixture(scope="module")
def vlm_case():
    rng = np.random.default_rng(0)
    samples = [_image_sample(0, 3, (4, 4), 5, rng), _samples((6,), seed=3, vocab=140, prefix="txt")[0],
               _image_sample(1, 2, (4, 6), 4, rng)]
    model = _qwen2vl()
    refs = []
    with torch.no_grad():
        for s in samples:
            ids = torch.as_tensor(s.input_ids[None])
            kw = {}
            if s.media:  # HF computes M-RoPE itself (get_rope_index): an independent reference
                kw = dict(pixel_values=torch.as_tensor(s.media["pixel_values"]),
                          image_grid_thw=torch.as_tensor(s.media["image_grid_thw"]),
                          mm_token_type_ids=(ids == IMG).long())
            refs.append(model(input_ids=ids, **kw).logits[0])
    return model, samples, refs


def _assert_segments_match(logits, batch, refs):
    cu, cup = batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()
    for j, ref in enumerate(refs):
        a = cup[j]
        got = logits[0, a : a + cu[j + 1] - cu[j]]
        assert got.shape == ref.shape
        assert (got - ref).abs().max().item() <= 1e-5, j


def test_bug2_in_batch_image_row_uses_mrope_positions(vlm_case):
    model, samples, refs = vlm_case
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4)(samples)
    assert batch["mrope_position_ids"].shape == (3, batch["input_ids"].shape[1])
    with torch.no_grad():
        out = packed_forward(model, batch, compute_loss=False)
        _assert_segments_match(out.logits, batch, refs)
        # no stored table: computed from image_grid_thw + the model config
        bare = {k: v for k, v in batch.items() if k != "mrope_position_ids"}
        _assert_segments_match(packed_forward(model, bare, compute_loss=False).logits, batch, refs)
        # the HF format for Trainer sends [3, 1, T] positions
        hf = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, format="hf",
                                    config=model.config)(samples)
        assert hf["position_ids"].shape == (3, 1, batch["input_ids"].shape[1])
        _assert_segments_match(model(**hf).logits, batch, refs)
        # what the collators sent before: 1-D text positions -> image segments drift (test sensitivity)
        text_pos = model(**dict(hf, position_ids=batch["position_ids"])).logits
        a, n = batch["cu_seqlens_padded"][0].item(), samples[0].length
        assert (text_pos[0, a : a + n] - refs[0]).abs().max().item() > 1e-4


def test_bug2_mrope_table_with_forced_tail_segment(vlm_case):
    _, samples, _ = vlm_case
    b = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=4, seq_length=64,
                               force_to_pad_to_seq_len=True)(samples)
    m, cup = b["mrope_position_ids"], b["cu_seqlens_padded"].tolist()
    assert m.shape == (3, 64) and b["num_segments"] == 4
    for j, s in enumerate(samples):
        want = s.media["mrope_position_ids"] if s.media else np.broadcast_to(np.arange(s.length), (3, s.length))
        assert m[:, cup[j] : cup[j] + s.length].tolist() == np.asarray(want).tolist()
    assert m[:, cup[3]:].tolist() == [list(range(64 - cup[3]))] * 3  # the empty tail keeps 1-D positions


def test_bug2_flattened_offline_image_rows(vlm_case):
    model, samples, refs = vlm_case
    rows = [build_packed_sequence(samples[:2], pad_to_multiple_of=4, pad_token_id=0, seq_length=40,
                                  pad_to_max_length=True),
            build_packed_sequence(samples[2:], pad_to_multiple_of=4, pad_token_id=0)]
    batch = PackedCollator()(rows)
    with torch.no_grad():
        _assert_segments_match(packed_forward(model, batch, compute_loss=False).logits, batch, refs)
        # BUG 3 on an image row: a PackedSequence goes through the collator's path
        one = PackedCollator()([rows[1]])
        _assert_segments_match(packed_forward(model, rows[1], compute_loss=False).logits, one, refs[2:])


def test_bug2_image_row_without_pixels_is_refused(vlm_case):
    model, samples, _ = vlm_case
    row = build_packed_sequence(samples[:1], pad_to_multiple_of=4, pad_token_id=0)
    with pytest.raises(ValueError, match="load_media=True"):
        packed_forward(model, row.to_torch())  # input_ids hold image tokens, no pixel_values
    stripped = Sample(samples[0].input_ids, samples[0].labels, sample_id="x",
                      media={k: v for k, v in samples[0].media.items() if k != "pixel_values"})
    with pytest.raises(ValueError, match="load_media=True"):
        packed_forward(model, build_packed_sequence([stripped], pad_token_id=0))


def test_bug2_guard_reads_mrope_positions(vlm_case):
    """M-RoPE positions stand still over an image; only a decrease is a packed restart."""
    from seqpack.hf import PackedAttentionError, check_hf_inputs

    _, samples, _ = vlm_case
    one = torch.as_tensor(samples[0].media["mrope_position_ids"])[:, None, :]
    ones = torch.ones(1, one.shape[-1], dtype=torch.long)
    check_hf_inputs({"position_ids": one, "attention_mask": ones})  # unpacked image sample: fine
    packed = InBatchPackingCollator(pad_token_id=0)(samples)["mrope_position_ids"][:, None, :]
    with pytest.raises(PackedAttentionError, match="B01"):
        check_hf_inputs({"position_ids": packed, "attention_mask": torch.ones(1, packed.shape[-1])})


# ----------------------------------------------------------------------------------------- BUG 3
def _qwen3(V=256):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()


def test_bug3_packed_forward_accepts_packed_sequence_from_disk(tmp_path):
    from seqpack import io

    rows = [build_packed_sequence(_samples((5, 3), seed=i), pad_to_multiple_of=4, pad_token_id=0, seq_length=16,
                                  pad_to_max_length=True) for i in range(2)]
    io.write_packed(rows, tmp_path / "p", io.PackedMetadata(seq_length=16, pad_to_multiple_of=4))
    row = io.load_packed(tmp_path / "p")[1]
    model = _qwen3()
    out = packed_forward(model, row)
    ref = packed_forward(model, PackedCollator()([row]))
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)
    assert torch.isfinite(out.loss) and out.loss.item() > 0


# ----------------------------------------------------------------------------------------- rough edges
def test_loss_is_zero_not_nan_without_loss_tokens():
    model = _qwen3()
    ids = np.array([5, 6, 7, 8])
    no_targets = Sample(ids, np.full(4, IGN), sample_id="none")
    one_tok = Sample(np.array([9]), np.array([IGN]), sample_id="one")
    for feats in ([no_targets], [one_tok], [no_targets, one_tok]):
        model.zero_grad()
        out = packed_forward(model, InBatchPackingCollator(pad_token_id=0)(feats))
        assert out.loss.item() == 0.0
        out.loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert all(torch.isfinite(g).all() and (g == 0).all() for g in grads)
    # with targets the loss is the token mean of packed_cross_entropy (unchanged semantics)
    s = _samples((6, 4), vocab=256)
    b = InBatchPackingCollator(pad_token_id=0)(s)
    out = packed_forward(model, b)
    ce = torch.nn.functional.cross_entropy(out.logits[0].float(), b["labels"][0], ignore_index=IGN)
    assert torch.allclose(out.loss, ce, atol=1e-6)


def test_loss_helpers_accept_empty_micro_batch_lists():
    assert global_token_count([]).item() == 0 and global_token_count([]).dtype == torch.int64
    assert token_mean([], 0).item() == 0.0
    assert token_mean([], global_token_count([3, 4])).item() == 0.0
    assert sequence_mean([]).item() == 0.0
    assert sequence_mean([torch.tensor([1.0]), torch.tensor([2.0])]).item() == 1.5


def test_in_batch_collator_warns_once_on_hf_style_labels():
    s = _samples((5, 4))
    hf_style = [{"input_ids": x.input_ids, "labels": np.where(x.labels != IGN, x.input_ids, IGN),
                 "sample_id": x.sample_id} for x in s]
    col = InBatchPackingCollator(pad_token_id=0)
    with pytest.warns(UserWarning, match="label_convention='hf'"):
        col(hf_style)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        col(hf_style)  # once per collator
        InBatchPackingCollator(pad_token_id=0)(s)  # properly shifted labels: silent
        InBatchPackingCollator(pad_token_id=0, label_convention="hf")(hf_style)
