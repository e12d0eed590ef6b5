"""``prepare_multimodal``'s arguments, as ``prepare``'s: a tokenizer name, the pixel bounds of the image
processor (as ``seqpack pack --min-pixels/--max-pixels``), the length policy on text-only samples, and a clear
refusal of arguments it does not take. Local images only (tmp_path), no network."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import seqpack.data
from seqpack.data import prepare
from seqpack.data.media import expand_samples, load_image_processor, prepare_multimodal
from seqpack.data.media.images import PixelBoundsError
from seqpack.data.tokenizer import TokenizerError, resolve_tokenizer

LONG_TEXT = {"id": "long", "conversations": [{"from": "human", "value": "hi " * 200},
                                             {"from": "gpt", "value": "the answer is " * 40}]}


def _data(tmp_path, side: int = 448):
    """A LLaVA file: one short text record, one record with a ``side`` x ``side`` image, one long text record."""
    Image.new("RGB", (side, side), (200, 10, 10)).save(tmp_path / "red.png")
    p = tmp_path / "llava.json"
    p.write_text(json.dumps([
        {"id": "t", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "v", "image": "red.png",
         "conversations": [{"from": "human", "value": "<image>What colour?"}, {"from": "gpt", "value": "Red."}]},
        LONG_TEXT,
    ]))
    return p


def _pads(samples, tok):
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    return [int((s.input_ids == pad).sum()) for s in samples]


def test_tokenizer_name_is_resolved_as_prepare_does(tmp_path, qwen3_tokenizer):
    p = _data(tmp_path, side=56)
    by_name, rep_name = seqpack.data.prepare_multimodal(p, "qwen3", seq_length=1024)
    by_obj, rep_obj = prepare_multimodal(p, qwen3_tokenizer, seq_length=1024)
    assert [s.sample_id for s in by_name] == ["llava.json:0", "llava.json:1", "llava.json:2"]
    assert [s.input_ids.tolist() for s in by_name] == [s.input_ids.tolist() for s in by_obj]
    assert _pads(by_name, qwen3_tokenizer) == [0, 4, 0]  # 56x56 px: 2x2 merged patches
    assert rep_name.records_read == rep_obj.records_read == 3
    assert resolve_tokenizer(qwen3_tokenizer) is qwen3_tokenizer
    with pytest.raises(TokenizerError, match="does not exist"):
        prepare_multimodal(p, "./no/such/tokenizer", seq_length=1024)
    # expand_samples takes a name too
    raw, rep = prepare(p, "qwen3", seq_length=2**31 - 1, keep_image_placeholders=True)
    out, _ = expand_samples(raw, "qwen3", seq_length=1024, report=rep)
    assert [s.input_ids.tolist() for s in out] == [s.input_ids.tolist() for s in by_obj]


def test_text_records_match_prepare(tmp_path, qwen3_tokenizer):
    p = tmp_path / "text.json"
    p.write_text(json.dumps([LONG_TEXT]))
    mm, _ = prepare_multimodal(p, "qwen3", seq_length=4096)
    txt, _ = prepare(p, "qwen3", seq_length=4096)
    assert len(mm) == 1 and mm[0].input_ids.tolist() == txt[0].input_ids.tolist()
    assert mm[0].labels.tolist() == txt[0].labels.tolist()


@pytest.mark.parametrize("overlength", ["drop", "truncate", "split", "error"])
def test_text_only_samples_follow_the_length_policy(tmp_path, qwen3_tokenizer, overlength):
    """A text record longer than seq_length is treated as prepare() treats it, never returned over-long."""
    p = _data(tmp_path, side=56)
    full, _ = prepare(p, "qwen3", seq_length=4096, overlength="error", keep_image_placeholders=True)
    n_long = full[2].length
    assert n_long > 300
    if overlength == "error":
        with pytest.raises(seqpack.data.OverlengthError, match=f"{n_long} tokens > seq_length=300"):
            prepare_multimodal(p, "qwen3", seq_length=300, overlength=overlength)
        return
    mm, rep = prepare_multimodal(p, "qwen3", seq_length=300, overlength=overlength)
    txt, txt_rep = prepare(_text_copy(tmp_path), "qwen3", seq_length=300, overlength=overlength)
    assert all(s.length <= 300 for s in mm)
    long_mm = [s for s in mm if s.index == 2]
    assert [s.input_ids.tolist() for s in long_mm] == [s.input_ids.tolist() for s in txt]
    assert [s.labels.tolist() for s in long_mm] == [s.labels.tolist() for s in txt]
    assert [(e.status, e.reason) for e in rep.entries] == [(e.status, e.reason) for e in txt_rep.entries]
    expected = {"drop": ([], [("dropped", "overlength")]), "truncate": ([300], [("truncated", "overlength")]),
                "split": ([300, n_long - 300], [("split", "overlength")])}[overlength]
    assert [s.length for s in long_mm] == expected[0]
    assert [(e.status, e.reason) for e in rep.entries] == expected[1]
    assert rep.samples_out == len(mm) and rep.tokens == sum(s.length for s in mm)


def _text_copy(tmp_path):
    q = tmp_path / "long.json"
    q.write_text(json.dumps([LONG_TEXT]))
    return q


def test_max_pixels_and_min_pixels_set_the_image_tokens(tmp_path, qwen3_tokenizer):
    p = _data(tmp_path, side=448)  # 448 / 14 = 32 patches a side: 32 x 32 / 2^2 = 256 image tokens by default
    counts = {}
    for max_pixels in (None, 64 * 28 * 28, 16 * 28 * 28):
        samples, _ = prepare_multimodal(p, "qwen3", seq_length=1024, max_pixels=max_pixels)
        img = samples[1]
        counts[max_pixels] = (_pads(samples, qwen3_tokenizer)[1], img.media["image_grid_thw"].tolist(),
                              img.meta["image_tokens"], img.media["pixel_values"].shape)
        assert img.media["image_grid_thw"].dtype == np.int64 and img.media["pixel_values"].dtype == np.float32
        assert img.media["mrope_position_ids"].shape == (3, img.length)
    assert counts == {
        None: (256, [[1, 32, 32]], [256], (1024, 1176)),
        64 * 28 * 28: (64, [[1, 16, 16]], [64], (256, 1176)),
        16 * 28 * 28: (16, [[1, 8, 8]], [16], (64, 1176)),
    }
    # min_pixels scales a small image up: 56 x 56 px (4 tokens) -> at least 16 x 28 x 28 px (16 tokens)
    (tmp_path / "small").mkdir()
    small = _data(tmp_path / "small", side=56)
    samples, _ = prepare_multimodal(small, "qwen3", seq_length=1024, min_pixels=16 * 28 * 28)
    assert _pads(samples, qwen3_tokenizer)[1] == 16
    # the bounds override a given processor's settings, as `seqpack pack --max-pixels` does
    samples, _ = prepare_multimodal(p, "qwen3", seq_length=1024, image_processor={"max_pixels": 1003520},
                                    max_pixels=16 * 28 * 28)
    assert samples[1].meta["image_tokens"] == [16]


def test_pixel_bounds_have_one_home(tmp_path):
    from seqpack.pipeline import PackConfigError, processor_settings, resolve_image_processor

    a = load_image_processor(None, min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
    b = resolve_image_processor(None, min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
    assert processor_settings(a) == processor_settings(b)
    assert (processor_settings(a)["min_pixels"], processor_settings(a)["max_pixels"]) == (3136, 50176)
    proc = load_image_processor()
    assert load_image_processor(proc) is proc  # a processor without bounds is returned as it is
    for kw, msg in (({"max_pixels": 0}, "max_pixels must be an integer >= 1, got 0"),
                    ({"min_pixels": 2.5}, "min_pixels must be an integer >= 1, got 2.5"),
                    ({"min_pixels": 9000, "max_pixels": 4000}, "min_pixels=9000 > max_pixels=4000"),
                    ({"min_pixels": 2_000_000}, "min_pixels=2000000 > max_pixels=1003520 after applying")):
        with pytest.raises(PixelBoundsError, match=msg):
            load_image_processor(None, **kw)
        with pytest.raises(PackConfigError, match=msg):
            resolve_image_processor(None, **kw)
    p = _data(tmp_path, side=56)
    with pytest.raises(ValueError, match="max_pixels must be an integer >= 1"):
        prepare_multimodal(p, "qwen3", seq_length=1024, max_pixels=0)


def test_unsupported_arguments_are_named(tmp_path):
    p = _data(tmp_path, side=56)
    with pytest.raises(TypeError, match=r"unsupported argument\(s\) maxpixels\. It takes .*max_pixels.*train_on"):
        prepare_multimodal(p, "qwen3", seq_length=1024, maxpixels=3)
    with pytest.raises(TypeError, match=r"unsupported argument\(s\) keep_image_placeholders, sink\."):
        prepare_multimodal(p, "qwen3", seq_length=1024, sink=print, keep_image_placeholders=True)
    for bad in (0, True, 1024.5, "1024"):
        with pytest.raises(ValueError) as e:
            prepare_multimodal(p, "qwen3", seq_length=bad)
        assert str(e.value) == f"seq_length must be an integer >= 1, got {bad!r}"
    with pytest.raises(ValueError, match=r"overlength='cut' is not one of"):
        prepare_multimodal(p, "qwen3", seq_length=1024, overlength="cut")
    # prepare()'s own options pass through: train_on="all" trains the prompt tokens too
    a, _ = prepare_multimodal(p, "qwen3", seq_length=1024)
    b, _ = prepare_multimodal(p, "qwen3", seq_length=1024, train_on="all")
    assert [s.input_ids.tolist() for s in a] == [s.input_ids.tolist() for s in b]
    assert all(y.num_trainable > x.num_trainable for x, y in zip(a, b))
