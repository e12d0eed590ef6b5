"""Reading inputs (seqpack.data.sources) through prepare(): Arrow null fill in tool schemas, invalid
UTF-8 / BOM in JSON and JSONL, the same file given twice and files sharing a name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from seqpack.data import DataFormatError, prepare
from seqpack.data.formats import expand_inputs, iter_records, normalize_record

REPO = Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize("encoding,named,iconv", [
    ("utf-16", "UTF-16", "UTF-16"), ("utf-16-le", "UTF-16-LE", "UTF-16LE"), ("utf-16-be", "UTF-16-BE", "UTF-16BE"),
    ("utf-32", "UTF-32", "UTF-32"),
])
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_utf16_or_utf32_file_is_one_error_naming_its_encoding(tmp_path, qwen3_tokenizer, encoding, named,
                                                               iconv, suffix):
    p = tmp_path / f"d{suffix}"
    text = (json.dumps(GOOD) + "\n") * 3 if suffix == ".jsonl" else json.dumps([GOOD] * 3)
    p.write_text(text, encoding=encoding)
    for on_error in ("raise", "skip"):  # a whole-file problem: never 3 (or 0) "bad records"
        with pytest.raises(DataFormatError) as ei:
            prepare(p, qwen3_tokenizer, seq_length=64, on_error=on_error)
        e = ei.value
        assert (e.reason, e.line, e.source) == ("bad_encoding", None, str(p))
        assert f"is {named} text; seqpack reads UTF-8 only" in str(e)
        assert f"iconv -f {iconv} -t UTF-8 {p.name}" in e.fix and "latin1" not in str(e)
    converted = tmp_path / f"ok{suffix}"
    converted.write_text(p.read_text(encoding=encoding), encoding="utf-8")  # the fix, done as the message says
    samples, rep = prepare(converted, qwen3_tokenizer, seq_length=64)
    assert rep.records_read == 3 and len(samples) == 3


# ---------------------------------------------------------------- 6. duplicate inputs, same names


def test_same_file_twice_or_by_overlapping_glob_is_read_once(tmp_path, qwen3_tokenizer, caplog):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    b.write_text(json.dumps(GOOD) + "\n")
    (tmp_path / "link.jsonl").symlink_to(a)
    with caplog.at_level(logging.WARNING, logger="seqpack.data.sources"):
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
