"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5 and Qwen3.5-MoE on seqpack's image path: packed
rows train exactly like each sample run alone through the model's own forward, or are refused by name.

Data: three records (one image; two images of other sizes; text only) written as ShareGPT-style JSON
with PNG images made by PIL, tokenised with the real Qwen3 tokenizer and expanded by seqpack
(``prepare_multimodal`` for in-batch / streaming rows, ``pack_dataset`` -> ``load_packed(load_media=True)``
for offline rows) with each family's patch size (14 for Qwen2/2.5-VL, 16 for Qwen3-VL / Qwen3.5).

Models: tiny random-init configs (2 text layers, hidden 32, a 2-block vision tower; Qwen2.5-VL with
window attention and one full-attention block, Qwen3-VL with a deepstack layer, Qwen3.5 with
full-attention layers only; the real vocabulary size, since the ids are the tokenizer's), fp32, train
mode, sdpa as loaded (eager for two of them). The reference is ``model(input_ids, pixel_values,
image_grid_thw, mm_token_type_ids)`` on one sample, so the M-RoPE positions are transformers' own
``get_rope_index``; the vision tower splits its attention per image (``cu_seqlens`` from
``image_grid_thw``) in both runs, the text decoder of the packed run gets seqpack's block-diagonal mask.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

from seqpack.adapters import gather_real
from seqpack.collate import InBatchPackingCollator, PackedCollator
from seqpack.data.media import load_image_processor, prepare_multimodal
from seqpack.hf import hf_inputs, packed_forward
from seqpack.loss import packed_cross_entropy

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB = 151680  # > the Qwen3 tokenizer's largest id (151668)
IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653)
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
SIZES = [(56, 84), (112, 56), (84, 140)]  # (width, height) of the three images


def _text(rope_section, head_dim=None, **kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0,
               rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": rope_section}, **kw)
    if head_dim:
        cfg["head_dim"] = head_dim
    return cfg


def _vision3(**kw):
    return dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=16,
                spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0],
                **kw)


def _config(name, **text_kw):
    T = transformers
    if name == "qwen2_vl":  # head_dim 8: sections sum to 4
        return T.Qwen2VLConfig(text_config=_text([2, 1, 1], **text_kw), **IDS, vision_config=dict(
            depth=2, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2))
    if name == "qwen2_5_vl":  # a 2x2 merged-token window: several windows per image, block 1 full attention
        return T.Qwen2_5_VLConfig(text_config=_text([2, 1, 1], **text_kw), **IDS, vision_config=dict(
            depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1]))
    if name == "qwen3_vl":  # head_dim 16, interleaved sections
        return T.Qwen3VLConfig(text_config=_text([4, 2, 2], head_dim=16, **text_kw), vision_config=_vision3(), **IDS)
    if name == "qwen3_vl_moe":
        return T.Qwen3VLMoeConfig(text_config=_text([4, 2, 2], head_dim=16, moe_intermediate_size=16, num_experts=4,
                                                    num_experts_per_tok=2, decoder_sparse_step=1, **text_kw),
                                  vision_config=_vision3(), **IDS)
    full = ["full_attention"] * 2  # Qwen3.5's default linear-attention layers carry state: refused elsewhere
    vision35 = {k: v for k, v in _vision3().items() if k != "deepstack_visual_indexes"}
    if name == "qwen3_5":
        return T.Qwen3_5Config(text_config=_text([4, 2, 2], head_dim=16, layer_types=full, **text_kw),
                               vision_config=vision35, **IDS)
    if name == "qwen3_5_moe":
        return T.Qwen3_5MoeConfig(text_config=_text([4, 2, 2], head_dim=16, layer_types=full, moe_intermediate_size=16,
                                                    shared_expert_intermediate_size=16, num_experts=4,
                                                    num_experts_per_tok=2, **text_kw),
                                  vision_config=vision35, **IDS)
    raise KeyError(name)


def _model(name, attn_implementation=None, **text_kw):
    """The tiny model, train mode, attention as transformers loads it unless ``attn_implementation`` is given."""
    cfg = _config(name, **text_kw)
    cls = getattr(transformers, type(cfg).__name__.replace("Config", "ForConditionalGeneration"))
    torch.manual_seed(0)
    kw = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return cls._from_config(cfg, **kw).train()


def _processor_settings(name):
    ps = 16 if name.startswith("qwen3") else 14  # Qwen3-VL and Qwen3.5 checkpoints: patch 16
    unit = (2 * ps) ** 2  # one merged token
    return {"patch_size": ps, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 4 * unit,
            "max_pixels": 24 * unit}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("vlm_records")
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate(SIZES):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / f"im{i}.png")
    recs = [
        {"messages": [{"role": "user", "content": "<image>What is in this picture?"},
                      {"role": "assistant", "content": "Random coloured noise."}], "images": [str(d / "im0.png")]},
        {"messages": [{"role": "user", "content": "Compare <image> with <image>, please."},
                      {"role": "assistant", "content": "The second one is taller."}],
         "images": [str(d / "im1.png"), str(d / "im2.png")]},
        {"messages": [{"role": "user", "content": "A question without images"},
                      {"role": "assistant", "content": "An answer without images."}]},
    ]
    path = d / "records.json"
    path.write_text(json.dumps(recs))
    return path


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _single_inputs(model, s):
    ids = torch.as_tensor(s.input_ids[None], dtype=torch.long)
    if not (s.media and s.media.get("pixel_values") is not None):
        return {"input_ids": ids}
    return {"input_ids": ids, "pixel_values": torch.as_tensor(s.media["pixel_values"]),
            "image_grid_thw": torch.as_tensor(s.media["image_grid_thw"]),
            "mm_token_type_ids": (ids == model.config.image_token_id).long()}


def _reference(model, samples):
    """Each sample alone through the model's own forward: logits by sample id, grads of sum-CE / tokens."""
    model.zero_grad(set_to_none=True)
    logits, sums, count = {}, [], 0
    for s in samples:
        out = model(**_single_inputs(model, s), use_cache=False)
        ls, n = packed_cross_entropy(out.logits[0], torch.as_tensor(s.labels, dtype=torch.long))
        logits[s.sample_id] = out.logits[0].detach()
        sums.append(ls)
        count += int(n)
    (torch.stack(sums).sum() / count).backward()
    return logits, _grads(model), count


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, records, qwen3_tokenizer):
    name = request.param
    proc = load_image_processor(_processor_settings(name))
    samples, report = prepare_multimodal(str(records), qwen3_tokenizer, seq_length=512, image_processor=proc)
    assert len(samples) == 3 and not report.entries
    grids = [s.media["image_grid_thw"].tolist() for s in samples[:2]]
    assert len({tuple(g) for gs in grids for g in gs}) == 3  # three different image sizes
    model = _model(name)
    assert model.config._attn_implementation == "sdpa"  # the default as loaded
    return name, model, samples, _reference(model, samples)


def _check(model, batch, ref, *, grads=True):
    """Packed logits (and every gradient) within TOL of the one-by-one reference."""
    ref_logits, ref_grads, ref_count = ref
    model.zero_grad(set_to_none=True)
    out = packed_forward(model, batch, compute_loss=False)
    cu, cup = batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()
    assert len(batch["sample_ids"]) == len(ref_logits)
    for j, sid in enumerate(batch["sample_ids"]):
        got = out.logits[0, cup[j]: cup[j] + cu[j + 1] - cu[j]].detach()
        assert got.shape == ref_logits[sid].shape
        assert (got - ref_logits[sid]).abs().max().item() <= TOL, sid
    if not grads:
        return
    ls, n = packed_cross_entropy(out.logits, batch["labels"])
    assert int(n) == ref_count
    (ls / n).backward()
    got = _grads(model)
    assert got.keys() == ref_grads.keys()
    assert any("visual" in k for k in got)  # the vision tower is trained too
    worst = max((got[k] - ref_grads[k]).abs().max().item() for k in got)
    assert worst <= TOL, worst


def test_hf_rope_index_equals_the_stored_tables(family):
    """transformers' own get_rope_index of each image sample is the table seqpack stored for it."""
    _, model, samples, _ = family
    for s in samples[:2]:
        x = _single_inputs(model, s)
        pos, _ = model.model.get_rope_index(x["input_ids"], x["mm_token_type_ids"], image_grid_thw=x["image_grid_thw"])
        assert pos[:, 0].tolist() == np.asarray(s.media["mrope_position_ids"]).tolist()


def test_in_batch_rows_equal_one_by_one(family):
    _, model, samples, ref = family
    batch = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8)(samples)
    assert bool(batch["padding_mask"].any()) and batch["pixel_values"].shape[0] == sum(
        int(np.prod(s.media["image_grid_thw"], axis=1).sum()) for s in samples[:2])
    _check(model, batch, ref)
    # sensitivity: 1-D text positions on the same row move the image segments' logits
    with torch.no_grad():
        inputs = hf_inputs(model, batch)
        assert inputs["position_ids"].shape == (3, 1, batch["input_ids"].shape[1])
        text = model(**dict(inputs, position_ids=batch["position_ids"]), use_cache=False).logits
    sid = batch["sample_ids"][0]
    n = ref[0][sid].shape[0]
    assert (text[0, :n] - ref[0][sid]).abs().max().item() > 1e-4


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_eager_attention_rows_equal_one_by_one(name, records, qwen3_tokenizer):
    proc = load_image_processor(_processor_settings(name))
    samples, _ = prepare_multimodal(str(records), qwen3_tokenizer, seq_length=512, image_processor=proc)
    model = _model(name, "eager")
    _check(model, InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8)(samples), _reference(model, samples))


def _hf_collator(model):
    """The Trainer-format collator for ``model`` (config= where the collator takes it)."""
    params = inspect.signature(InBatchPackingCollator).parameters
    kw = {"config": model.config} if "config" in params else {"attn_implementation": model.config._attn_implementation}
    return InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, format="hf", **kw)


def test_trainer_format_rows_equal_one_by_one(family):
    """``format="hf"`` + ``model(**batch)`` as the Trainer calls it; the packed loss is the samples' token mean."""
    _, model, samples, (ref_logits, _, count) = family
    thd = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8)(samples)
    hf = _hf_collator(model)(samples)
    assert hf["position_ids"].shape == (3, 1, thd["input_ids"].shape[1])
    with torch.no_grad():
        out = model(**hf, use_cache=False)
        got = gather_real(out.logits, thd["padding_mask"])
        want = torch.cat([ref_logits[s] for s in thd["sample_ids"]])
        assert (got - want).abs().max().item() <= TOL
        ls = sum(packed_cross_entropy(ref_logits[s.sample_id], torch.as_tensor(s.labels))[0] for s in samples)
        assert abs(out.loss.item() - (ls / count).item()) <= TOL


def test_offline_and_streaming_rows_equal_one_by_one(family, records, qwen3_tokenizer, tmp_path):
    """``pack_dataset`` -> ``load_packed(load_media=True)`` -> ``PackedCollator``, and streaming-built rows."""
    from seqpack.io import load_packed
    from seqpack.pipeline import pack_dataset
    from seqpack.stream import pack_selected_samples

    name, model, samples, ref = family
    res = pack_dataset([records], tmp_path / "p", tokenizer=qwen3_tokenizer, seq_length=64, pad_to_multiple_of=8,
                       image_processor=_processor_settings(name))
    ds = load_packed(res.output, load_media=True)
    rows = [ds[i] for i in range(len(ds))]
    assert len(rows) == 2 and all(r.extra.get("mrope_position_ids") is not None for r in rows)
    assert sorted(sid for r in rows for sid in r.sample_ids) == sorted(ref[0])
    batch = PackedCollator()(rows)
    assert batch["mrope_position_ids"].shape == (3, batch["input_ids"].shape[1])
    _check(model, batch, ref)
    row = pack_selected_samples(samples[::-1], pad_token_id=0, pad_to_multiple_of=16)
    _check(model, PackedCollator()([row]), ref, grads=False)


# ------------------------------------------------------------------------------------------ refusals
@pytest.fixture(scope="module")
def image_batch(records, qwen3_tokenizer):
    proc = load_image_processor(_processor_settings("qwen2_vl"))
    samples, _ = prepare_multimodal(str(records), qwen3_tokenizer, seq_length=512, image_processor=proc)
    return InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8)(samples)


def test_image_rows_on_other_models_are_refused_by_name(image_batch):
    """A text model and a VLM whose positions are not seqpack's tables (GLM-4V) refuse image rows; the same
    models still take text rows."""
    T = transformers
    torch.manual_seed(0)
    text = T.AutoModelForCausalLM.from_config(T.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                            num_hidden_layers=1, num_attention_heads=4,
                                                            num_key_value_heads=2, head_dim=8))
    with pytest.raises(ValueError, match=r"'qwen3' has no vision tower.*qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe"):
        packed_forward(text, image_batch)
    glm = T.Glm4vForConditionalGeneration(T.Glm4vConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)))
    with pytest.raises(ValueError, match=r"model_type 'glm4v' computes its own image positions.*unpacked"):
        packed_forward(glm, image_batch)
    plain = {k: v for k, v in image_batch.items() if k not in ("pixel_values", "image_grid_thw", "mrope_position_ids")}
    plain["input_ids"] = plain["input_ids"] % 1000  # no image tokens left: a text row
    with torch.no_grad():
        assert torch.isfinite(packed_forward(text, plain).loss)


def test_trainer_format_refuses_image_rows_for_other_models(records, qwen3_tokenizer):
    """``format="hf"`` with ``config=`` (the Trainer path, no packed_forward): the collator refuses image rows
    for a model that does not take seqpack's M-RoPE tables."""
    if "config" not in inspect.signature(InBatchPackingCollator).parameters:
        pytest.skip("the collators take config= once the masks follow the model's attention pattern")
    proc = load_image_processor(_processor_settings("qwen2_vl"))
    samples, _ = prepare_multimodal(str(records), qwen3_tokenizer, seq_length=512, image_processor=proc)
    cfg = transformers.Glm4vConfig()
    cfg._attn_implementation = "sdpa"
    collate = InBatchPackingCollator(pad_token_id=0, format="hf", config=cfg)
    with pytest.raises(ValueError, match=r"model_type 'glm4v' computes its own image positions"):
        collate(samples)
    assert collate(samples[2:])["position_ids"].shape[0] == 1  # a text row is fine


def test_video_flash_and_wrong_patch_size_are_refused(image_batch):
    model = _model("qwen3_vl")
    with pytest.raises(ValueError, match=r"video inputs \(pixel_values_videos, video_grid_thw\).*images only"):
        packed_forward(model, image_batch, pixel_values_videos=torch.zeros(8, 1536),
                       video_grid_thw=torch.tensor([[2, 2, 2]]))
    # pixels made with Qwen2-VL's patch 14 for a Qwen3-VL tower (patch 16)
    with pytest.raises(ValueError, match=r"1176 values per patch.*takes 1536.*patch_size 16"):
        packed_forward(model, image_batch)
    # flash-attn: the decoder's cu_seq_lens_q would reach the vision tower's own varlen call
    flash = _model("qwen2_vl")
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"attn_implementation='flash_attention_2'.*cu_seq_lens_q.*'sdpa'"):
        packed_forward(flash, image_batch)


def test_sliding_window_layers_of_the_text_decoder(records, qwen3_tokenizer):
    """Qwen2-VL's text decoder with ``use_sliding_window`` (off in the published configs): the window reaches
    the packed mask, so a row whose samples outgrow the window is still exact."""
    pytest.importorskip("seqpack.adapters.attention_pattern", reason="masks from the attention pattern")
    assert _config("qwen2_vl").text_config.layer_types == ["full_attention"] * 2
    model = _model("qwen2_vl", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert model.config.text_config.layer_types == ["full_attention", "sliding_attention"]
    proc = load_image_processor(_processor_settings("qwen2_vl"))
    samples, _ = prepare_multimodal(str(records), qwen3_tokenizer, seq_length=512, image_processor=proc)
    assert min(s.length for s in samples) > 8
    ref = _reference(model, samples)
    _check(model, InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8)(samples), ref)
