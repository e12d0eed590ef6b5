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


# ------------------------------------------------- 7. line ends and the shape of a whole JSON file


@pytest.mark.parametrize("indent_kind", ["array", "objects"])
def test_pretty_printed_json_in_a_jsonl_file_is_one_error_naming_the_rename(tmp_path, qwen3_tokenizer, indent_kind):
    p = tmp_path / "pretty.jsonl"
    if indent_kind == "array":
        p.write_text(json.dumps([GOOD, GOOD], indent=2) + "\n")
    else:
        p.write_text("\n".join(json.dumps(GOOD, indent=2) for _ in range(2)) + "\n")
    for on_error in ("raise", "skip"):  # a whole-file refusal, not one skipped record per line
        with pytest.raises(DataFormatError) as ei:
            prepare(p, qwen3_tokenizer, seq_length=64, on_error=on_error)
        e = ei.value
        assert (e.source, e.line, e.reason) == (str(p), 1, "malformed_json")
        assert str(e).startswith(f"{p}, line 1: looks like ")
        if indent_kind == "array":
            assert "a JSON array written over several lines" in str(e) and "rename it to pretty.json" in e.fix
        else:
            assert "JSON records written over several lines" in str(e) and "one record per line" in e.fix
    renamed = p.rename(tmp_path / "pretty.json")
    if indent_kind == "array":  # the fix named works
        samples, rep = prepare(renamed, qwen3_tokenizer, seq_length=64)
        assert rep.records_read == 2 and [s.sample_id for s in samples] == ["pretty.json:0", "pretty.json:1"]


@pytest.mark.parametrize("chunk", [None, 7])  # 7 bytes: lines and CRLF pairs cut across reads
def test_lone_cr_line_ends_split_like_universal_newlines(tmp_path, qwen3_tokenizer, monkeypatch, chunk):
    from seqpack.data import json_files

    if chunk:
        monkeypatch.setattr(json_files, "_CHUNK", chunk)
    good = json.dumps(GOOD)
    p = tmp_path / "mac.jsonl"
    p.write_bytes(f"{good}\r{{bad\r\r{good}\r\n{good}\n{good}".encode())  # CR first, then CR CR / CRLF / LF / EOF
    assert [(r.line, r.error is None) for r in iter_records(p)] == [
        (1, True), (2, False), (4, True), (5, True), (6, True)]
    with pytest.raises(DataFormatError) as ei:
        prepare(p, qwen3_tokenizer, seq_length=64)
    assert (ei.value.line, ei.value.reason) == (2, "malformed_json") and f"{p}, line 2: malformed JSON" in str(ei.value)
    samples, rep = prepare(p, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert [s.index for s in samples] == [0, 3, 4, 5]
    assert [(x.reason, x.index) for x in rep.entries] == [("malformed_json", 1)]
    crlf = tmp_path / "dos.jsonl"  # CRLF files keep being read line by line, CR kept as JSON whitespace
    crlf.write_bytes(f"{good}\r\n{{bad\r\n{good}\r\n".encode())
    assert [(r.line, r.error is None) for r in iter_records(crlf)] == [(1, True), (2, False), (3, True)]


def test_text_after_the_top_level_value_of_a_json_file_names_its_line(tmp_path, qwen3_tokenizer):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([GOOD, GOOD], indent=1) + "\n\ngarbage here\n")
    n_lines = json.dumps([GOOD, GOOD], indent=1).count("\n") + 1
    for on_error in ("raise", "skip"):
        with pytest.raises(DataFormatError) as ei:
            prepare(p, qwen3_tokenizer, seq_length=64, on_error=on_error)
        e = ei.value
        assert (e.source, e.line, e.reason) == (str(p), n_lines + 2, "malformed_json")
        assert f"the array ends at line {n_lines}, column 1, and 'garbage here' follows at line {n_lines + 2}" in str(e)
        assert "delete what follows the top-level value" in e.fix
    one_line = tmp_path / "o.json"  # a second array after a one-line array: not JSON Lines either
    one_line.write_text(json.dumps([GOOD]) + "\n" + json.dumps([GOOD]) + "\n")
    with pytest.raises(DataFormatError, match=r"o\.json, line 2: has text after its top-level JSON array"):
        prepare(one_line, qwen3_tokenizer, seq_length=64)


def test_an_unfinished_first_jsonl_line_before_a_valid_one_is_one_bad_record(tmp_path, qwen3_tokenizer):
    p = tmp_path / "cut.jsonl"  # a truncated first record, not a pretty-printed file: only it is skipped
    p.write_text('{"messages": [\n' + json.dumps(GOOD) + "\n[\n")
    samples, rep = prepare(p, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert [s.index for s in samples] == [1]
    assert [(x.reason, x.index) for x in rep.entries] == [("malformed_json", 0), ("malformed_json", 2)]
    with pytest.raises(DataFormatError, match=r"cut\.jsonl, line 1: malformed JSON \(Expecting value"):
        prepare(p, qwen3_tokenizer, seq_length=64)


def test_a_cut_off_line_and_a_raw_control_character_are_named_plainly(tmp_path):
    """A line that ends inside a string (a record cut off) and a raw NUL byte in a string: the decoder's
    "Invalid control character at" is worded once, and a line break is called what it is."""
    good = json.dumps(GOOD)
    p = tmp_path / "cut.jsonl"
    p.write_bytes(f'{good}\n{{"messages":[{{"role":"user","con\n{{"a": "x\x00y"}}\n'.encode())
    errs = [str(r.error) for r in iter_records(p) if r.error is not None]
    assert len(errs) == 2
    assert "line 2: malformed JSON (a line break inside a string: the text ends before the string does (cut off?) " \
           "at column 33)" in errs[0]
    assert "line 3: malformed JSON (Invalid control character at column 9)" in errs[1] and "at at" not in errs[1]


# ----------------------------------------------------------------------- top-level objects, empty files


def test_an_empty_json_file_reads_as_no_record_like_jsonl(tmp_path):
    counted = []
    for name, content in (("a.json", b""), ("b.json", b"\xef\xbb\xbf \n\t\r\n"), ("c.jsonl", b"\n\n")):
        (tmp_path / name).write_bytes(content)
        assert list(iter_records(tmp_path / name, on_count=counted.append)) == []
    assert counted == [0, 0]  # the .json files report their (empty) count; JSONL is counted by the caller


@pytest.mark.parametrize("top, shown, fix", [
    ({"data": [GOOD, GOOD]}, "an object with keys ['data']",
     "extract the records: `jq '.data' w.json > w.records.json` (the array under 'data'), and pack that file."),
    ({"train": [GOOD], "my set": [GOOD], "n": 3}, "an object with keys ['my set', 'n', 'train']",
     "extract the records: `jq '.train' w.json > w.records.json` (the array under 'train'; arrays of objects are "
     "also under ['my set']), and pack that file."),
    ({"my set": [GOOD]}, "an object with keys ['my set']",
     "extract the records: `jq '.[\"my set\"]' w.json > w.records.json` (the array under 'my set'), and pack that "
     "file."),
    ({}, "an empty object {}",
     "store the records as a JSON array [{...}, {...}], or as JSON Lines (.jsonl, one record per line); a file of "
     "one record object needs one of the record keys messages, conversations, instruction, output."),
])
def test_a_top_level_object_that_is_no_record_is_one_file_error(tmp_path, top, shown, fix):
    p = tmp_path / "w.json"
    p.write_text(json.dumps(top))
    with pytest.raises(DataFormatError) as ei:
        list(iter_records(p))
    assert ei.value.reason == "unknown_format" and ei.value.index is None and ei.value.line is None
    assert str(ei.value) == (f"{p}: a JSON file must hold one array of records (or use JSON Lines); this file's "
                             f"top level is {shown}. Fix: {fix}")


def test_a_top_level_record_object_is_one_record(tmp_path, qwen3_tokenizer):
    p = tmp_path / "one.json"
    p.write_text(json.dumps(GOOD))
    samples, rep = prepare(p, qwen3_tokenizer, seq_length=512)
    assert [s.sample_id for s in samples] == ["one.json:0"] and rep.records_read == 1
    p.write_text(json.dumps({"instruction": "only"}))  # a record (with a problem), not a wrapper
    with pytest.raises(DataFormatError, match=r"record 0: 'output' is missing"):
        prepare(p, qwen3_tokenizer, seq_length=512)


def test_record_keys_are_the_keys_formats_are_detected_by():
    from seqpack.data.formats import detect_format
    from seqpack.data.records import RECORD_KEYS

    sharegpt = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    records = [GOOD, {"conversations": sharegpt}, {"instruction": "i", "input": "", "output": "o"},
               {"image": "x.png", "conversations": sharegpt}, {"images": ["x.png"], **GOOD}]
    for rec in records:  # every format is told by a record key; without them, no format fits
        assert detect_format(rec) is not None
        assert detect_format({k: v for k, v in rec.items() if k not in RECORD_KEYS}) is None
