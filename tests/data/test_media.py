"""Image-text samples: open by content, placeholder expansion, over-length policy, packing with media."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqpack.data.media import (
    OverlengthError,
    VisionTokens,
    collate_media,
    expand_image_placeholders,
    expand_samples,
    load_image_processor,
    num_image_tokens,
    open_image,
    prepare_multimodal,
)
from seqpack.sample import IGNORE_INDEX, Sample, shift_labels

SMALL = {"max_pixels": 64 * 28 * 28, "min_pixels": 4 * 28 * 28}  # keeps image runs short and tests fast


@pytest.fixture(scope="module")
def proc():
    return load_image_processor(SMALL)


@pytest.fixture(scope="module")
def vt(qwen3_tokenizer):
    return VisionTokens.from_tokenizer(qwen3_tokenizer)


def text_sample(tok, user: str, answer: str, images, sid="t0") -> Sample:
    """A hand-built chat sample: prompt untrained, answer trained (shifted labels)."""
    prompt = tok.encode(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    ans = tok.encode(f"{answer}<|im_end|>", add_special_tokens=False)
    ids = np.array(prompt + ans, np.int32)
    trainable = np.r_[np.zeros(len(prompt), bool), np.ones(len(ans), bool)]
    return Sample(ids, shift_labels(ids, trainable), sample_id=sid, source="hand", index=0, media={"images": images})


def image_runs(ids, vt):
    """(start, n_pad) of each <|vision_start|> <|image_pad|>* <|vision_end|> run."""
    runs = []
    for s in np.flatnonzero(ids == vt.vision_start_id):
        e = s + 1
        while ids[e] == vt.image_pad_id:
            e += 1
        assert ids[e] == vt.vision_end_id
        runs.append((int(s), int(e - s - 1)))
    return runs


# ------------------------------------------------------------------------------------ images


def test_open_image_by_content_and_rgb(shared_data, tmp_path):
    img_dir = shared_data / "lmms-finetune" / "images"
    png_named_jpg = open_image(img_dir / "soccer1.jpg")
    webp_named_jpg = open_image(img_dir / "soccer2.jpg")
    rgba = open_image(img_dir / "post1.png")
    assert (png_named_jpg.mode, png_named_jpg.size) == ("RGB", (1368, 912))
    assert (webp_named_jpg.mode, webp_named_jpg.size) == ("RGB", (650, 431))
    assert (rgba.mode, rgba.size) == ("RGB", (930, 1240))
    # transparent pixels are composited on white, not on the hidden colour under alpha 0
    from PIL import Image

    a = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    a.putpixel((0, 0), (200, 0, 0, 255))
    p = tmp_path / "fake.jpg"  # PNG content, wrong extension
    a.save(p, format="PNG")
    out = open_image(p)
    assert out.getpixel((1, 1)) == (255, 255, 255) and out.getpixel((0, 0)) == (200, 0, 0)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="bad.jpg"):
        open_image(bad)
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        open_image(tmp_path / "missing.jpg")


def test_processor_defaults_and_config_file(shared_data, tmp_path):
    img = shared_data / "llama-factory" / "mllm_demo_data" / "1.jpg"  # 300x168
    default = load_image_processor()
    from seqpack.data.media import process_images

    pv, grid = process_images([img], default)
    assert grid.tolist() == [[1, 12, 22]]  # 168x308 after rounding to 28-pixel multiples
    assert pv.shape == (264, 1176) and pv.dtype == np.float32
    assert num_image_tokens(grid, default.merge_size).tolist() == [66]
    cfg = tmp_path / "preprocessor_config.json"
    cfg.write_text(json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "merge_size": 2, "patch_size": 14,
                               "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 28 * 28 * 16}))
    small = load_image_processor(tmp_path)
    _, g2 = process_images([img], small)
    assert int(np.prod(g2)) // 4 <= 16


# ------------------------------------------------------------------------------------ expansion


def test_expansion_handles_bpe_merged_placeholders(qwen3_tokenizer, vt, proc, shared_data):
    tok = qwen3_tokenizer
    imgs = [shared_data / "llama-factory" / "mllm_demo_data" / f"{i}.jpg" for i in (1, 2, 3)]
    # "?<" and "><" are single BPE tokens: the placeholder shares tokens with its neighbours
    s = text_sample(tok, "What is this?<image><image> and<image>", "Two footballers and an astronaut.", imgs)
    assert 75414 in s.input_ids.tolist() or 1784 in s.input_ids.tolist()
    out, rec = expand_image_placeholders(s, tok, proc)
    assert rec is None
    grid = out.media["image_grid_thw"]
    n = num_image_tokens(grid, proc.merge_size)
    runs = image_runs(out.input_ids, vt)
    assert [r[1] for r in runs] == n.tolist()
    assert out.meta["image_tokens"] == n.tolist()
    assert out.media["pixel_values"].shape[0] == int(np.prod(grid, axis=1).sum())
    # the text around the placeholders is unchanged
    text = tok.decode(out.input_ids.tolist())
    import re

    restored = re.sub(r"<\|vision_start\|>(<\|image_pad\|>)+<\|vision_end\|>", "<image>", text)
    assert restored == tok.decode(s.input_ids.tolist())
    # labels: shifted, never on image tokens, the answer is still trained exactly as before
    lab = out.labels
    assert not np.isin(lab, [vt.image_pad_id, vt.vision_start_id, vt.vision_end_id]).any()
    ok = (lab[:-1] == IGNORE_INDEX) | (lab[:-1] == out.input_ids[1:])
    assert ok.all() and lab[-1] == IGNORE_INDEX
    assert out.num_trainable == s.num_trainable
    # idempotent on already-expanded runs (re-expansion keeps the counts)
    again, _ = expand_image_placeholders(out, tok, proc)
    assert np.array_equal(again.input_ids, out.input_ids)


def test_placeholder_count_mismatch_names_sample(qwen3_tokenizer, proc, shared_data):
    img = shared_data / "llama-factory" / "mllm_demo_data" / "1.jpg"
    s = text_sample(qwen3_tokenizer, "<image><image>hi", "ok", [img], sid="bad-rec")
    with pytest.raises(ValueError, match=r"bad-rec.*2 image placeholder\(s\) but 1 image"):
        expand_image_placeholders(s, qwen3_tokenizer, proc)
    out, rep = expand_samples([s], qwen3_tokenizer, proc, on_error="skip")
    assert out == [] and rep.count("skipped", "bad_media") == 1


def test_overlength_policy_never_cuts_inside_an_image_run(qwen3_tokenizer, vt, proc, shared_data):
    tok = qwen3_tokenizer
    imgs = [shared_data / "llama-factory" / "mllm_demo_data" / f"{i}.jpg" for i in (1, 2)]
    s = text_sample(tok, "<image> first, then <image> second", "A long answer " * 20, imgs, sid="long")
    full, _ = expand_image_placeholders(s, tok, proc)
    runs = image_runs(full.input_ids, vt)
    cut_inside = runs[1][0] + 3  # a limit that would fall inside the second image run
    with pytest.raises(OverlengthError, match="long"):
        expand_image_placeholders(s, tok, proc, seq_length=cut_inside, overlength="error")
    dropped, rec = expand_image_placeholders(s, tok, proc, seq_length=cut_inside, overlength="drop")
    assert dropped is None and (rec.status, rec.reason) == ("dropped", "overlength")
    # truncation would leave only prompt tokens -> dropped, reported
    t, rec = expand_image_placeholders(s, tok, proc, seq_length=cut_inside, overlength="truncate")
    assert t is None and rec.reason == "no_trainable_tokens"
    assert rec.tokens_before == len(full.input_ids) > cut_inside and rec.tokens_after < cut_inside  # before the cut
    # put the answer first so a truncated sample keeps trained tokens
    s2 = text_sample(tok, "hi", "Answer " * 5 + "<image> and <image>", imgs, sid="ans")
    f2, _ = expand_image_placeholders(s2, tok, proc)
    r2 = image_runs(f2.input_ids, vt)
    limit = r2[1][0] + 5
    t2, rec2 = expand_image_placeholders(s2, tok, proc, seq_length=limit, overlength="truncate")
    assert rec2.status == "truncated"
    assert t2.length == r2[1][0] <= limit  # cut moved back to the start of the run
    assert len(image_runs(t2.input_ids, vt)) == 1 and t2.media["image_grid_thw"].shape == (1, 3)
    assert t2.media["pixel_values"].shape[0] == int(np.prod(t2.media["image_grid_thw"]))
    assert t2.labels[-1] == f2.labels[t2.length - 1]  # the kept last slot keeps its target (B12)


# ------------------------------------------------------------------------------------ real data + packing


def _check_pack(pk, vt, merge):
    media = pk.media or [None] * pk.num_segments
    for j in range(pk.num_segments):
        a, b = int(pk.cu_seqlens_padded[j]), int(pk.cu_seqlens_padded[j + 1])
        seg_pads = int((pk.input_ids[a:b] == vt.image_pad_id).sum())
        m = media[j]
        if m is None or "image_grid_thw" not in m:
            assert seg_pads == 0
            continue
        assert seg_pads == int(num_image_tokens(m["image_grid_thw"], merge).sum())
        assert m["pixel_values"].shape[0] == int(np.prod(m["image_grid_thw"], axis=1).sum())
    col = collate_media(pk.media)
    total = int((pk.input_ids == vt.image_pad_id).sum())
    if col is None:
        assert total == 0
    else:
        assert total == int(num_image_tokens(col["image_grid_thw"], merge).sum())
        assert col["pixel_values"].shape[0] == int(np.prod(col["image_grid_thw"], axis=1).sum())


def test_mixed_text_image_packs_carry_aligned_media(qwen3_tokenizer, vt, proc, shared_data):
    pytest.importorskip("torch")
    from seqpack.stream import StreamingPacker

    tok = qwen3_tokenizer
    lf = shared_data / "lmms-finetune"
    files = [shared_data / "llama-factory" / "mllm_demo.json"] + sorted(lf.glob("*.json"))  # every VLM file
    samples, rep = prepare_multimodal(files, tok, seq_length=1024, image_processor=SMALL)
    assert rep.records_read == 6 + 10 + 90 + 2 + 2 + 4
    assert len(samples) + len(rep.entries) - rep.count("truncated") == rep.records_read
    with_img = [s for s in samples if s.media and "image_grid_thw" in s.media]
    assert len(with_img) == 6 + 10 + 90 + 2 + 2 + 2 and len(samples) - len(with_img) == 2
    for s in with_img:
        assert [r[1] for r in image_runs(s.input_ids, vt)] == s.meta["image_tokens"]
    packer = StreamingPacker(samples, 1024, packing_buffer_size=32, pad_to_multiple_of=8,
                             pad_token_id=tok.pad_token_id, output="packed", seed=0)
    packs = list(packer)
    assert sorted(sid for pk in packs for sid in pk.sample_ids) == sorted(s.sample_id for s in samples)
    assert any(pk.media is not None and sum(m is not None for m in pk.media) >= 2 for pk in packs)
    for pk in packs:
        pk.validate(capacity=1024)
        _check_pack(pk, vt, proc.merge_size)


def test_all_lmms_finetune_files_default_processor(qwen3_tokenizer, vt, shared_data):
    """The real files with the default processor; large RGBA posts are dropped under a small capacity."""
    tok = qwen3_tokenizer
    lf = shared_data / "lmms-finetune"
    samples, rep = prepare_multimodal(lf / "multi_images.json", tok, seq_length=4096, overlength="drop")
    # the 4-poster record (4 RGBA 930x1240 images at ~1,200 tokens each) does not fit 4096
    assert len(samples) == 1 and rep.count("dropped", "overlength") == 1
    assert "4 image(s)" in rep.entries[0].detail
    s = samples[0]
    assert s.media["image_grid_thw"].shape == (2, 3)
    assert [r[1] for r in image_runs(s.input_ids, vt)] == s.meta["image_tokens"]


def _hf_rope_index(ids, grid, merge):
    """transformers' Qwen2VLModel.get_rope_index on one sequence (no model weights needed)."""
    import types

    torch = pytest.importorskip("torch")
    from transformers.models.qwen2_vl import modeling_qwen2_vl as m

    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=merge)),
        get_vision_position_ids=lambda *a, **k: m.Qwen2VLModel.get_vision_position_ids(None, *a, **k),
    )
    t_ids = torch.as_tensor(np.asarray(ids, np.int64))[None]
    pos, _ = m.Qwen2VLModel.get_rope_index(
        fake, t_ids, (t_ids == 151655).int(), image_grid_thw=torch.as_tensor(np.asarray(grid, np.int64))
    )
    return pos[:, 0].numpy()


def test_mrope_positions_match_transformers_and_restart_per_segment(qwen3_tokenizer, vt, proc, shared_data):
    from seqpack.packed.mrope import mrope_position_ids
    from seqpack.stream import pack_selected_samples

    tok = qwen3_tokenizer
    imgs = [shared_data / "lmms-finetune" / "images" / n for n in ("soccer1.jpg", "curry.jpg")]
    a, _ = expand_image_placeholders(text_sample(tok, "<image> vs <image>?", "The first.", imgs, "a"), tok, proc)
    b = text_sample(tok, "plain text", "answer", [], "b")
    c, _ = expand_image_placeholders(
        text_sample(tok, "see<image>", "ok", imgs[1:], "c"), tok, proc
    )
    for s in (a, c):
        ref = _hf_rope_index(s.input_ids, s.media["image_grid_thw"], proc.merge_size)
        assert np.array_equal(s.media["mrope_position_ids"], ref)
        assert np.array_equal(
            mrope_position_ids(s.input_ids, s.media["image_grid_thw"], proc.merge_size, vt.image_pad_id), ref
        )
    row = pack_selected_samples([a, b, c], pad_token_id=tok.pad_token_id, pad_to_multiple_of=16)
    row.validate()
    pos = row.extra["mrope_position_ids"]
    assert pos.shape == (3, len(row.input_ids))
    for j, s in enumerate((a, b, c)):
        lo, hi = int(row.cu_seqlens_padded[j]), int(row.cu_seqlens_padded[j + 1])
        real = s.length
        expect = s.media["mrope_position_ids"] if j != 1 else np.broadcast_to(np.arange(real), (3, real))
        assert np.array_equal(pos[:, lo : lo + real], expect)  # restarts at every segment
        if hi > lo + real:  # padding keeps counting
            assert np.array_equal(pos[:, lo + real], np.full(3, expect.max() + 1))


def test_collate_media_without_pixels_says_to_load_media():
    """Offline packs keep image paths and grids only; collating them without pixels names the fix."""
    from seqpack.data.media import collate_media

    media = [None, {"images": ["/x/a.jpg"], "image_grid_thw": np.array([[1, 4, 4]])}]
    with pytest.raises(ValueError, match=r"load_media=True"):
        collate_media(media)
    assert collate_media([None, {"images": []}]) is None
    ok = collate_media([{"image_grid_thw": np.array([[1, 2, 2]]), "pixel_values": np.zeros((4, 3))}])
    assert ok["pixel_values"].shape == (4, 3) and ok["image_grid_thw"].tolist() == [[1, 2, 2]]


def test_packed_mrope_positions_with_empty_tail_segment():
    """The in-batch forced tail is a segment with 0 real tokens: its padding counts from 0, no crash."""
    from seqpack.packed.mrope import packed_mrope_position_ids

    table = np.array([[0, 1, 1], [0, 1, 2], [0, 2, 1]])
    out = packed_mrope_position_ids([{"mrope_position_ids": table}, None], [0, 3, 3], [0, 4, 8])
    assert out[:, :4].tolist() == [[0, 1, 1, 3], [0, 1, 2, 3], [0, 2, 1, 3]]
    assert out[:, 4:].tolist() == [[0, 1, 2, 3]] * 3
