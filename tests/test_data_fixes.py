"""Regression tests for data-layer bugs found by a newcomer run: Arrow null fill in tool schemas,
invalid UTF-8 / BOM in JSONL, empty assistant turns, forced-format key errors, unknown tokenizers,
the same file given twice and files sharing a name."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from seqpack.data import DataFormatError, TokenizerError, load_tokenizer, prepare
from seqpack.data.formats import RawRecord, expand_inputs, iter_records, normalize_record

REPO = Path(__file__).resolve().parents[1]
SAMPLE_CHAT = REPO / "src" / "seqpack" / "resources" / "sample_chat.jsonl"

GOOD = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def _ids(samples):
    return [(s.sample_id, s.input_ids.tolist(), s.labels.tolist()) for s in samples]


# ----------------------------------------------------------------------- 1. Arrow-sourced null fill


def test_parquet_and_hf_dataset_tokens_equal_jsonl(tmp_path, qwen3_tokenizer):
    """Arrow merges every row's tool-schema / argument structs into one type, filling absent keys with
    None; the Parquet and Dataset paths must render exactly like the JSONL source (7142 tokens)."""
    import datasets
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    table = pj.read_json(SAMPLE_CHAT)
    pq.write_table(table, tmp_path / "sample_chat.parquet")
    ref, ref_rep = prepare(SAMPLE_CHAT, qwen3_tokenizer, seq_length=4096)
    assert ref_rep.tokens == 7142 and len(ref) == 46
    pq_samples, pq_rep = prepare(tmp_path / "sample_chat.parquet", qwen3_tokenizer, seq_length=4096)
    ds_samples, ds_rep = prepare(datasets.Dataset(table), qwen3_tokenizer, seq_length=4096)
    assert pq_rep.tokens == ds_rep.tokens == 7142
    want = [(s.input_ids.tolist(), s.labels.tolist()) for s in ref]
    assert [(s.input_ids.tolist(), s.labels.tolist()) for s in pq_samples] == want
    assert [(s.input_ids.tolist(), s.labels.tolist()) for s in ds_samples] == want
    # the rows really carry Arrow's None fill (else this test could not fail)
    rows = table.to_pylist()
    assert any(
        v is None for r in rows if r.get("tools") for t in r["tools"]
        for v in t["function"]["parameters"]["properties"].values()
    )


def test_jsonl_null_is_kept_arrow_null_is_dropped(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "default": None}}}}}
    rec = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": None}}}]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "a"},
    ], "tools": [tool]}
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    (raw,) = iter_records(p)
    conv = normalize_record(raw)
    assert conv.tools[0]["function"]["parameters"]["properties"]["x"] == {"type": "string", "default": None}
    assert conv.messages[1]["tool_calls"][0]["function"]["arguments"] == {"x": None}
    # Parquet: a null is indistinguishable from Arrow's fill, so it is dropped (documented)
    pq.write_table(pa.Table.from_pylist([rec]), tmp_path / "d.parquet")
    (raw,) = iter_records(tmp_path / "d.parquet")
    conv = normalize_record(raw)
    assert conv.tools[0]["function"]["parameters"]["properties"]["x"] == {"type": "string"}
    assert conv.messages[1]["tool_calls"][0]["function"]["arguments"] == {}


def test_strip_arrow_nulls_recursion():
    from seqpack.data.formats import strip_arrow_nulls

    assert strip_arrow_nulls({"a": None, "b": [{"c": None, "d": 1}, None], "e": {"f": {"g": None}}}) == {
        "b": [{"d": 1}, None], "e": {"f": {}}
    }
    blob = b"\x00\x01"
    assert strip_arrow_nulls({"bytes": blob, "path": None}) == {"bytes": blob}


# ------------------------------------------------------------------------- 2. UTF-8 and the BOM


def test_invalid_utf8_line_is_one_bad_record(tmp_path, qwen3_tokenizer):
    p = tmp_path / "d.jsonl"
    bad = json.dumps({"messages": [{"role": "user", "content": "caf"}]}).encode().replace(b"caf", b"caf\xff")
    p.write_bytes(json.dumps(GOOD).encode() + b"\n" + bad + b"\n" + json.dumps(GOOD).encode() + b"\n")
    with pytest.raises(DataFormatError) as ei:
        prepare(p, qwen3_tokenizer, seq_length=64)
    e = ei.value
    assert (e.reason, e.line, e.index) == ("bad_encoding", 2, 1)
    assert f"{p}, line 2: not valid UTF-8 (byte 0xff" in str(e) and "Fix:" in str(e) and "UTF-8" in e.fix
    samples, rep = prepare(p, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert rep.records_read == 3 and [s.index for s in samples] == [0, 2]
    assert [(x.status, x.reason, x.index, x.sample_id) for x in rep.entries] == [
        ("skipped", "bad_encoding", 1, "d.jsonl:1")
    ]


def test_utf8_bom_is_accepted(tmp_path, qwen3_tokenizer):
    bom = b"\xef\xbb\xbf"
    jl = tmp_path / "a.jsonl"
    jl.write_bytes(bom + (json.dumps(GOOD) + "\r\n\r\n" + json.dumps(GOOD) + "\r\n").encode())  # CRLF too
    js = tmp_path / "b.json"
    js.write_bytes(bom + json.dumps([GOOD, GOOD]).encode())
    samples, rep = prepare([jl, js], qwen3_tokenizer, seq_length=64)
    assert rep.records_read == 4 and not rep.entries
    assert [s.sample_id for s in samples] == ["a.jsonl:0", "a.jsonl:2", "b.json:0", "b.json:1"]
    assert len({tuple(s.input_ids.tolist()) for s in samples}) == 1


def test_invalid_utf8_in_json_array_names_line(tmp_path, qwen3_tokenizer):
    p = tmp_path / "d.json"
    p.write_bytes(b'[{"instruction": "a", "output": "b"},\n{"instruction": "\xe9", "output": "b"}]')
    with pytest.raises(DataFormatError) as ei:
        prepare(p, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert (ei.value.reason, ei.value.line) == ("bad_encoding", 2) and "byte 0xe9" in str(ei.value)


# ------------------------------------------------------------------------ 3. empty assistant turns


EMPTY_TURNS = [
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": " \n"}]}]},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": ""},
                       {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]},
    {"instruction": "q", "output": ""},
]


@pytest.mark.parametrize("rec", EMPTY_TURNS)
def test_empty_assistant_turn_is_an_error(tmp_path, qwen3_tokenizer, rec):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(GOOD) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(DataFormatError) as ei:
        prepare(p, qwen3_tokenizer, seq_length=64)
    e = ei.value
    assert (e.reason, e.line) == ("empty_assistant_turn", 2)
    assert f"{p}, line 2: assistant turn 1 (message 1 " in str(e) and "Fix:" in str(e)
    samples, rep = prepare(p, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert len(samples) == 1 and [(x.reason, x.index) for x in rep.entries] == [("empty_assistant_turn", 1)]


def test_null_content_with_tool_calls_and_reasoning_only_turns_are_valid(qwen3_tokenizer):
    rec = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": "{\"c\": \"Oslo\"}"}}]},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "", "reasoning_content": "It rains, so say so."},
    ]}
    samples, rep = prepare([rec], qwen3_tokenizer, seq_length=512)
    assert len(samples) == 1 and not rep.entries
    trained = qwen3_tokenizer.decode(samples[0].input_ids[1:][samples[0].labels[:-1] != -100])
    assert '"name": "w"' in trained and "It rains, so say so." in trained


# ---------------------------------------------------------------------- 4. forced-format key errors


def test_forced_alpaca_on_messages_names_missing_key_and_detected_format():
    with pytest.raises(DataFormatError) as ei:
        normalize_record(RawRecord(GOOD, "d.jsonl", 0, line=1), "alpaca")
    e = ei.value
    assert e.reason == "missing_key"
    assert "missing key 'instruction'" in str(e) and "NoneType" not in str(e)
    assert "(record looks like the 'openai' format; use --format auto" in str(e)
    with pytest.raises(DataFormatError, match="missing key 'messages'.*looks like the 'alpaca' format"):
        normalize_record(RawRecord({"instruction": "a", "output": "b"}, "d.json", 0), "openai")
    with pytest.raises(DataFormatError, match="missing key 'output'"):
        normalize_record(RawRecord({"instruction": "a"}, "d.json", 0), "alpaca")


# -------------------------------------------------------------------------------- 5. tokenizers


def test_tokenizer_error_is_a_value_error():
    assert issubclass(TokenizerError, ValueError) and issubclass(TokenizerError, RuntimeError)


def test_unknown_tokenizer_offline_fails_fast(monkeypatch, capfd):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError) as ei:
        load_tokenizer("bogus/model")
    assert time.perf_counter() - t0 < 10
    msg = str(ei.value)
    assert "'bogus/model'" in msg and "HF_HUB_OFFLINE=1" in msg and "Fix: pass 'qwen3'" in msg
    assert "Traceback" not in capfd.readouterr().err


def test_unknown_tokenizer_unreachable_hub_fails_fast(monkeypatch, capfd):
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError, match=r"hub cannot be used \(127\.0\.0\.1:9 unreachable"):
        load_tokenizer("bogus/model")
    assert time.perf_counter() - t0 < 10
    err = capfd.readouterr().err
    assert "Retrying" not in err and "Traceback" not in err


def test_hub_tokenizer_cache_first_then_one_quiet_online_attempt(monkeypatch):
    from seqpack.data import tokenizer as tk

    calls = []
    seen_levels = []

    class FakeAuto:
        @staticmethod
        def from_pretrained(name, **kw):
            calls.append(kw.get("local_files_only", False))
            seen_levels.append(logging.getLogger("huggingface_hub").level)
            raise OSError("not found")

    monkeypatch.setattr(tk, "_offline", lambda: None)
    monkeypatch.setattr(tk, "_hub_unreachable", lambda endpoint: None)
    with pytest.raises(TokenizerError, match="could not load tokenizer 'org/name' from the hub"):
        tk._load_hub_tokenizer(FakeAuto, "org/name", {})
    assert calls == [True, False] and seen_levels == [logging.CRITICAL] * 2
    calls.clear()
    with pytest.raises(TokenizerError, match=r"cannot be used \(local_files_only=True\)"):
        tk._load_hub_tokenizer(FakeAuto, "org/name", {"local_files_only": True})
    assert calls == [True]
    with pytest.raises(TokenizerError, match="tokenizer folder './nope' does not exist"):
        load_tokenizer("./nope")


# ---------------------------------------------------------------- 6. duplicate inputs, same names


def test_same_file_twice_or_by_overlapping_glob_is_read_once(tmp_path, qwen3_tokenizer, caplog):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    b.write_text(json.dumps(GOOD) + "\n")
    (tmp_path / "link.jsonl").symlink_to(a)
    with caplog.at_level(logging.WARNING, logger="seqpack.data.formats"):
        samples, rep = prepare([str(a), str(a)], qwen3_tokenizer, seq_length=64)
    assert rep.records_read == 2 and [s.sample_id for s in samples] == ["a.jsonl:0", "a.jsonl:1"]
    assert "same file" in caplog.text and "read once" in caplog.text
    samples, rep = prepare([str(a), str(tmp_path / "*.jsonl")], qwen3_tokenizer, seq_length=64)
    assert rep.records_read == 3
    assert [s.sample_id for s in samples] == ["a.jsonl:0", "a.jsonl:1", "b.jsonl:0"]  # link.jsonl = a.jsonl
    assert expand_inputs([tmp_path / "link.jsonl", a]) == [tmp_path / "link.jsonl"]


def test_files_sharing_a_name_get_shortest_unique_path_suffix(tmp_path, qwen3_tokenizer):
    paths = [tmp_path / "a" / "x.json", tmp_path / "b" / "x.json", tmp_path / "p" / "c" / "y.json",
             tmp_path / "q" / "c" / "y.json", tmp_path / "z.json"]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps([GOOD]))
    samples, rep = prepare(paths, qwen3_tokenizer, seq_length=64)
    assert [s.sample_id for s in samples] == ["a/x.json:0", "b/x.json:0", "p/c/y.json:0", "q/c/y.json:0", "z.json:0"]
    assert rep.records_read == 5
