"""``seqpack.data.prepare``: image records refused (they need the media step), progress totals for JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from seqpack.data import prepare
from seqpack.data.media import prepare_multimodal
from seqpack.data.records import DataFormatError


def _llava(tmp_path):
    Image.new("RGB", (56, 56), (200, 10, 10)).save(tmp_path / "red.png")
    p = tmp_path / "llava.json"
    p.write_text(json.dumps([
        {"id": "t", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "v", "image": "red.png",
         "conversations": [{"from": "human", "value": "<image>What colour?"}, {"from": "gpt", "value": "Red."}]},
    ]))
    return p


def test_prepare_refuses_image_records_and_names_the_fix(tmp_path, qwen3_tokenizer):
    p = _llava(tmp_path)
    for on_error in ("raise", "skip"):  # a usage error, never a skipped record
        with pytest.raises(DataFormatError, match=r"has images \(1; sample llava\.json:1\).*prepare_multimodal") as e:
            prepare(p, qwen3_tokenizer, seq_length=512, on_error=on_error)
        # the file is named as given (not "<input>"), with the record's index
        assert (e.value.source, e.value.index, e.value.reason) == (str(p), 1, "bad_input")
        assert str(e.value).startswith(f"{p}, record 1: has images")
    # the media path takes the same file: the image becomes its run of image tokens
    samples, _ = prepare_multimodal(p, qwen3_tokenizer, seq_length=512)
    img = qwen3_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert [s.input_ids.tolist().count(img) for s in samples] == [0, 4]  # 56x56 px: 2x2 merged patches


def test_prepare_progress_has_a_total_for_jsonl(tmp_path, qwen3_tokenizer):
    p = tmp_path / "chat.jsonl"
    rec = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    p.write_text("\n".join(json.dumps(rec) for _ in range(5)) + "\n\n")  # a trailing blank line is no record
    calls = []
    prepare(p, qwen3_tokenizer, seq_length=128, progress=lambda *a: calls.append(a))
    assert calls and all(total == 5 for _, _, total in calls) and calls[-1][1] == 5


def test_prepare_progress_total_counts_lone_cr_lines(tmp_path, qwen3_tokenizer):
    p = tmp_path / "mac.jsonl"
    rec = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    p.write_bytes(("\r".join(json.dumps(rec) for _ in range(3)) + "\r").encode())  # classic Mac OS line ends
    calls = []
    samples, _ = prepare(p, qwen3_tokenizer, seq_length=128, progress=lambda *a: calls.append(a))
    assert len(samples) == 3 and calls and all(total == 3 for _, _, total in calls)


@pytest.mark.parametrize("bad", [True, 128.9, "128", "abc", None, 0])
def test_prepare_refuses_a_seq_length_that_is_not_an_integer(bad, qwen3_tokenizer):
    src = Path(__file__).resolve().parents[2] / "src/seqpack/resources/sample_chat.jsonl"
    with pytest.raises(ValueError) as e:
        prepare(src, qwen3_tokenizer, seq_length=bad)
    assert str(e.value) == f"seq_length must be an integer >= 1, got {bad!r}"
