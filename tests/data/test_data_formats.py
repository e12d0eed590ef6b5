"""Record reading and normalisation (seqpack.data.sources, seqpack.data.formats) and bad-input errors through prepare()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqpack.data import DataFormatError, prepare
from seqpack.data.formats import RawRecord, detect_format, iter_records, normalize_record


def norm(rec, fmt=None, base_dir=None):
    return normalize_record(RawRecord(rec, "mem.json", 3, base_dir=base_dir), fmt)


# ------------------------------------------------------------------------------------------ formats


def test_alpaca_with_system_history_and_input():
    c = norm(
        {
            "instruction": "Add",
            "input": "1 and 2",
            "output": "3",
            "system": "Be terse.",
            "history": [["hi", "hello"]],
        }
    )
    assert c.format == "alpaca"
    assert c.messages == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "Add\n1 and 2"},
        {"role": "assistant", "content": "3"},
    ]
    assert c.tools is None and c.images == [] and c.index == 3 and c.source == "mem.json"


def test_alpaca_empty_input_is_instruction_only():
    c = norm({"instruction": "Say hi", "input": "", "output": "hi"})
    assert c.messages[0] == {"role": "user", "content": "Say hi"}


def test_sharegpt_function_call_observation_and_tools_string():
    tools = json.dumps([{"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}])
    c = norm(
        {
            "id": "x1",
            "system": "sys",
            "tools": tools,
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "function_call", "value": '{"name": "f", "arguments": {"a": 1}}'},
                {"from": "observation", "value": '{"r": 2}'},
                {"from": "gpt", "value": "done"},
            ],
        }
    )
    assert c.format == "sharegpt" and c.id == "x1"
    assert [m["role"] for m in c.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert c.messages[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert c.messages[3]["content"] == '{"r": 2}'
    # bare glaive tool schemas are wrapped into the OpenAI form
    assert c.tools == [{"type": "function", "function": json.loads(tools)[0]}]


def test_sharegpt_text_then_function_call_is_one_assistant_turn():
    c = norm(
        {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": "let me look"},
                {"from": "function_call", "value": '[{"name": "a", "arguments": "{}"}, {"name": "b"}]'},
            ]
        }
    )
    assert len(c.messages) == 2
    calls = c.messages[1]["tool_calls"]
    assert [x["function"]["name"] for x in calls] == ["a", "b"]
    assert calls[0]["function"]["arguments"] == {} and calls[1]["function"]["arguments"] == {}


def test_openai_messages_with_tool_calls_and_tool_role():
    c = norm(
        {
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "assistant", "content": [{"type": "text", "text": "It is "}, {"type": "text", "text": "sunny."}]},
            ],
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {}}}],
        }
    )
    assert c.format == "openai"
    assert c.messages[1]["tool_calls"][0]["function"] == {"name": "w", "arguments": {"city": "Paris"}}
    assert c.messages[1]["content"] == ""
    assert c.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert c.messages[3]["content"] == "It is sunny."
    assert c.tools[0]["function"]["name"] == "w"


def test_llamafactory_v1_parts_reasoning_and_tool_call():
    c = norm(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "value": "q"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "reasoning", "value": "think"},
                        {"type": "tool_call", "value": '{"name": "f", "arguments": {"x": 1}}'},
                        {"type": "tool_call", "value": '{"name": "g", "arguments": {}}'},
                    ],
                },
                {"role": "tool", "content": [{"type": "text", "value": "r"}]},
                {"role": "assistant", "content": [{"type": "reasoning", "value": "ok"}, {"type": "text", "value": "A"}]},
            ]
        }
    )
    a = c.messages[1]
    assert a["content"] == "" and a["reasoning_content"] == "think"
    assert [t["function"]["name"] for t in a["tool_calls"]] == ["f", "g"]
    assert c.messages[3] == {"role": "assistant", "content": "A", "reasoning_content": "ok"}


def test_llava_image_resolution_and_placeholders(tmp_path: Path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"x")
    (tmp_path / "b.jpg").write_bytes(b"y")
    rec = {
        "image": ["a.jpg", "b.jpg"],
        "conversations": [{"from": "human", "value": "<image><image>Compare"}, {"from": "gpt", "value": "same"}],
    }
    assert detect_format(rec) == "llava"
    c = norm(rec, base_dir=tmp_path)
    assert c.format == "llava"
    assert c.images == [str(tmp_path / "images" / "a.jpg"), str(tmp_path / "b.jpg")]
    assert c.messages[0]["content"] == "<image><image>Compare"  # placeholders kept as text


def test_llava_errors_missing_image_and_count_mismatch(tmp_path: Path):
    conv = [{"from": "human", "value": "<image>x"}, {"from": "gpt", "value": "y"}]
    with pytest.raises(DataFormatError) as ei:
        norm({"image": "nope.jpg", "conversations": conv}, base_dir=tmp_path)
    assert ei.value.reason == "missing_image" and "nope.jpg" in str(ei.value)
    (tmp_path / "a.jpg").write_bytes(b"x")
    with pytest.raises(DataFormatError) as ei:
        norm({"images": ["a.jpg", "a.jpg"], "conversations": conv}, base_dir=tmp_path)
    assert ei.value.reason == "image_placeholder_mismatch" and "2 image(s) but 1" in str(ei.value)


@pytest.mark.parametrize("key, value, said", [("image", "", "an empty string"), ("image", None, "null"),
                                              ("images", [], "an empty list")])
def test_an_emptied_image_column_with_placeholders_is_refused_not_trained_as_text(tmp_path: Path, key, value, said):
    """Placeholders with an empty image column would be tokenized as the literal text '<image>'."""
    conv = [{"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "a cat"}]
    with pytest.raises(DataFormatError) as ei:
        norm({key: value, "conversations": conv}, base_dir=tmp_path)
    assert ei.value.reason == "image_placeholder_mismatch"
    assert f"'{key}' is {said} but the text has 1 '<image>' placeholder(s)" in str(ei.value)
    # an empty column without placeholders is a text-only record; no image column at all stays text
    assert norm({key: value, "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
                base_dir=tmp_path).images == []
    assert norm({"conversations": conv}, base_dir=tmp_path).images == []


def test_an_image_path_naming_a_folder_says_so(tmp_path: Path):
    (tmp_path / "imgs").mkdir()
    conv = [{"from": "human", "value": "<image>x"}, {"from": "gpt", "value": "y"}]
    with pytest.raises(DataFormatError) as ei:
        norm({"image": "imgs", "conversations": conv}, base_dir=tmp_path)
    assert ei.value.reason == "missing_image" and f"is a folder ({tmp_path / 'imgs'}), not an image file" in str(ei.value)


def test_openai_inline_image_parts(tmp_path: Path):
    (tmp_path / "a.png").write_bytes(b"x")
    rec = {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "what?"},
                                         {"type": "image_url", "image_url": {"url": "https://x/y.jpg"}}]},
            {"role": "assistant", "content": "a cat"},
        ]
    }
    c = norm(rec, base_dir=tmp_path)
    assert c.messages[0]["content"] == "<image>what?<image>"
    assert c.images == [str(tmp_path / "a.png"), "https://x/y.jpg"]
    with pytest.raises(DataFormatError) as ei:
        norm({**rec, "images": ["a.png"]}, base_dir=tmp_path)
    assert ei.value.reason == "image_placeholder_mismatch"


def test_arrow_none_filled_struct_fields():
    c = norm({"messages": [
        {"role": "user", "content": [{"type": "text", "text": None, "value": "q"}], "tool_calls": None},
        {"role": "assistant", "reasoning_content": None, "tool_calls": None,
         "content": [{"type": "text", "text": "a", "value": None}]},
    ], "tools": None, "images": None})
    assert c.messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    c = norm({"conversations": [{"from": None, "role": "user", "value": None, "content": "q"},
                                {"from": "gpt", "value": "a"}]})
    assert c.messages[0] == {"role": "user", "content": "q"}


def test_none_valued_columns_are_absent():
    # Parquet / datasets give None for missing columns
    c = norm({"instruction": "a", "input": None, "output": "b", "system": None, "history": None,
              "image": None, "conversations": None, "messages": None})
    assert c.format == "alpaca" and len(c.messages) == 2


def test_forced_format_is_used():
    rec = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "instruction": "i"}
    assert norm(rec, "sharegpt").format == "sharegpt"
    with pytest.raises(DataFormatError) as ei:
        norm({"conversations": []}, "alpaca")
    assert ei.value.reason == "missing_key" and "missing key 'instruction'" in str(ei.value)


# ------------------------------------------------------------------------------------- bad input


GOOD = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}

BAD_RECORDS = [
    ({"foo": 1}, "unknown_format", "rename the columns"),
    ({"conversations": []}, "empty_conversation", "remove the record"),
    ({"conversations": [{"from": "human", "value": "q"}]}, "no_assistant_turn", "add an assistant turn"),
    ({"conversations": [{"from": "robot", "value": "q"}, {"from": "gpt", "value": "a"}]}, "unknown_role", "robot"),
    ({"conversations": [{"from": "human", "value": 5}, {"from": "gpt", "value": "a"}]}, "bad_content_type", "a JSON number"),
    ({"messages": [{"role": "user", "content": {"x": 1}}, {"role": "assistant", "content": "a"}]},
     "bad_content_type", "a JSON object"),
    ({"instruction": ["x"], "output": "y"}, "bad_content_type", "'instruction'"),
]


@pytest.mark.parametrize("bad,reason,needle", BAD_RECORDS)
def test_bad_record_in_json_array_names_file_index_and_fix(tmp_path, qwen3_tokenizer, bad, reason, needle):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([GOOD, GOOD, bad]))
    with pytest.raises(DataFormatError) as ei:
        prepare(p, qwen3_tokenizer, seq_length=64)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.reason == reason and e.index == 2 and e.line is None
    msg = str(e)
    assert str(p) in msg and "record 2" in msg and "Fix:" in msg and needle in msg
    # skip: reported with its reason, file and index; the good records survive
    samples, rep = prepare(p, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert rep.records_read == 3 and len(samples) == 2
    (entry,) = rep.entries
    assert (entry.status, entry.reason, entry.source, entry.index) == ("skipped", reason, str(p), 2)
    assert entry.sample_id == "d.json:2"


def test_malformed_jsonl_line_names_line_and_skip_reports_it(tmp_path, qwen3_tokenizer):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(GOOD) + "\n\n" + '{"conversations": [\n' + json.dumps(GOOD) + "\n")
    with pytest.raises(DataFormatError) as ei:
        prepare(str(p), qwen3_tokenizer, seq_length=64)
    assert ei.value.line == 3 and ei.value.reason == "malformed_json"
    assert f"{p}, line 3" in str(ei.value) and "Fix:" in str(ei.value)
    samples, rep = prepare(str(p), qwen3_tokenizer, seq_length=64, on_error="skip")
    assert rep.records_read == 3  # blank line is not a record
    assert [s.index for s in samples] == [0, 3]  # index = line - 1
    assert [(e.reason, e.index) for e in rep.entries] == [("malformed_json", 2)]


def test_whole_file_invalid_json_raises_even_with_skip(tmp_path, qwen3_tokenizer):
    p = tmp_path / "d.json"
    p.write_text('[{"a": 1},\n{"b": ')
    with pytest.raises(DataFormatError) as ei:
        prepare(p, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert ei.value.reason == "malformed_json" and "line 2" in str(ei.value)


def test_json_file_holding_json_lines_is_read_as_jsonl(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    recs = list(iter_records(p))
    assert [(r.index, r.line) for r in recs] == [(0, 1), (1, 2)]


def test_unknown_extension_and_missing_paths(tmp_path, qwen3_tokenizer):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n")
    with pytest.raises(DataFormatError, match="unknown file type"):
        prepare(p, qwen3_tokenizer, seq_length=64)
    with pytest.raises(FileNotFoundError):
        prepare(tmp_path / "none.json", qwen3_tokenizer, seq_length=64)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        prepare(str(tmp_path / "*.jsonl"), qwen3_tokenizer, seq_length=64)
    with pytest.raises(DataFormatError, match="is a directory"):
        prepare(tmp_path, qwen3_tokenizer, seq_length=64)


def test_parquet_glob_and_hf_dataset_inputs(tmp_path, qwen3_tokenizer):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instruction": f"q{i}", "input": "", "output": f"a{i}"} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "b.parquet")
    seen = []
    samples, rep = prepare(
        str(tmp_path / "*.parquet"), qwen3_tokenizer, seq_length=64, progress=lambda *a: seen.append(a)
    )
    assert rep.records_read == 7 and len(samples) == 7 and rep.samples_out == 7
    assert [s.sample_id for s in samples[4:]] == ["a.parquet:4", "b.parquet:0", "b.parquet:1"]
    assert seen[-1] == ("prepare", 7, None)
    ds = datasets.Dataset.from_list(rows)
    samples2, rep2 = prepare([ds, ds], qwen3_tokenizer, seq_length=64, progress=lambda *a: seen.append(a))
    assert rep2.records_read == 10 and seen[-1] == ("prepare", 10, 10)
    assert len({s.sample_id for s in samples2}) == 10  # unique ids across same-named datasets
    assert [s.input_ids.tolist() for s in samples2[:5]] == [s.input_ids.tolist() for s in samples[:5]]
    it_samples, it_rep = prepare(ds.to_iterable_dataset(), qwen3_tokenizer, seq_length=64,
                                 progress=lambda *a: seen.append(a))
    assert it_rep.records_read == 5 and seen[-1] == ("prepare", 5, None)
    assert [s.input_ids.tolist() for s in it_samples] == [s.input_ids.tolist() for s in samples[:5]]
    with pytest.raises(DataFormatError, match="DatasetDict"):
        prepare(datasets.DatasetDict({"train": ds}), qwen3_tokenizer, seq_length=64)


def test_invalid_options(qwen3_tokenizer, tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([GOOD]))
    for kw in ({"overlength": "cut"}, {"on_error": "ignore"}, {"train_on": "user"}, {"seq_length": 0}):
        args = {"seq_length": 64, **kw}
        with pytest.raises(ValueError):
            prepare(p, qwen3_tokenizer, **args)
    with pytest.raises(ValueError, match="format="):
        prepare(p, qwen3_tokenizer, seq_length=64, format="csv")


def test_in_memory_record_dicts(qwen3_tokenizer):
    recs = [{"instruction": "q", "output": "a"}, {"foo": 1}]
    samples, rep = prepare(recs, qwen3_tokenizer, seq_length=64, on_error="skip")
    assert [s.sample_id for s in samples] == ["records:0"]
    assert rep.records_read == 2 and rep.entries[0].sample_id == "records:1"
    assert rep.entries[0].reason == "unknown_format"


def test_tokenizer_without_chat_template_is_refused(qwen3_tokenizer):
    import copy

    from seqpack.data import TokenizerError

    tok = copy.copy(qwen3_tokenizer)
    tok.chat_template = None
    with pytest.raises(TokenizerError, match="no chat template"):
        prepare([{"instruction": "q", "output": "a"}], tok, seq_length=64)


def test_data_format_error_survives_pickling():
    """Errors raised in worker processes (DataLoader, Ray) must arrive with the same text and fields."""
    import pickle

    from seqpack.data.formats import DataFormatError

    err = DataFormatError("bad role 'robot'", source="a.jsonl", line=7, index=6, reason="unknown_role",
                          fix="use user/assistant")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is DataFormatError
    assert str(back) == str(err) == "a.jsonl, line 7: bad role 'robot' Fix: use user/assistant"
    assert (back.source, back.line, back.index, back.reason, back.fix) == ("a.jsonl", 7, 6, "unknown_role",
                                                                           "use user/assistant")


# ------------------------------------------------------------------------ 3. empty assistant turns


GOOD_OPENAI = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}

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
    p.write_text(json.dumps(GOOD_OPENAI) + "\n" + json.dumps(rec) + "\n")
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
        normalize_record(RawRecord(GOOD_OPENAI, "d.jsonl", 0, line=1), "alpaca")
    e = ei.value
    assert e.reason == "missing_key"
    assert "missing key 'instruction'" in str(e) and "NoneType" not in str(e)
    assert "(record looks like the 'openai' format; use --format auto" in str(e)
    with pytest.raises(DataFormatError, match="missing key 'messages'.*looks like the 'alpaca' format"):
        normalize_record(RawRecord({"instruction": "a", "output": "b"}, "d.json", 0), "openai")
    with pytest.raises(DataFormatError, match="missing key 'output'"):
        normalize_record(RawRecord({"instruction": "a"}, "d.json", 0), "alpaca")


@pytest.mark.parametrize("arguments, message", [
    ('{"x": NaN}', "NaN is not JSON"),
    ('{"x": -Infinity}', "-Infinity is not JSON"),
    ('{"x": 1e999}', "overflows to infinity"),
    ({"x": float("nan")}, r"arguments\.x is NaN or infinite"),
    ({"x": [1.0, float("inf")]}, r"arguments\.x\[1\] is NaN or infinite"),
    ("[1, 2]", "is a JSON array, not an object"),
    ("5", "is a JSON number, not an object"),
])
def test_tool_call_arguments_must_be_finite_json_objects(arguments, message):
    rec = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": arguments}}]}]}
    with pytest.raises(DataFormatError, match=message) as ei:
        norm(rec, "openai")
    assert ei.value.reason == "bad_tool_call" and ei.value.line is None and ei.value.index == 3


@pytest.mark.parametrize("name", ["", "  ", 5, None])
def test_tool_call_needs_a_non_empty_name(name):
    rec = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": "{}"}}]}]}
    with pytest.raises(DataFormatError, match="has no non-empty string 'name'") as ei:
        norm(rec, "openai")
    assert ei.value.reason == "bad_tool_call"


@pytest.mark.parametrize("tool, message", [
    ({"type": "function", "function": {"name": "f", "parameters": "notobj"}}, r"\('f'\)\.parameters is a JSON string"),
    ({"name": "f", "parameters": [1]}, "parameters is a JSON array"),
    ({"name": "f", "parameters": {"default": float("nan")}}, "NaN or infinite"),
    ({"type": "function", "function": {"parameters": {}}}, r"tools\[0\] is a function schema without a name\."),
    ({"name": "  ", "parameters": {}}, r"tools\[0\] is a function schema without a name\."),
    ({"name": 5, "parameters": {}}, r"tools\[0\] is a function schema whose name is a JSON number, not a non-empty"),
])
def test_tool_schema_parameters_must_be_an_object(tool, message):
    rec = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": [tool]}
    with pytest.raises(DataFormatError, match=message) as ei:
        norm(rec, "openai")
    assert ei.value.reason == "bad_tools"
    ok = {**rec, "tools": [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"default": 1.5}}}}]}
    assert norm(ok, "openai").tools[0]["function"]["name"] == "f"


def test_template_errors_name_the_jsonl_line(tmp_path, qwen3_tokenizer):
    p = tmp_path / "d.jsonl"
    good = json.dumps({"instruction": "a", "output": "b"})
    lone = '{"instruction": "x \\ud83d y", "output": "b"}'  # a JSON escape of half a UTF-16 pair
    p.write_text(good + "\n" + lone + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as ei:
        prepare(p, qwen3_tokenizer, seq_length=64)
    assert (ei.value.reason, ei.value.line, ei.value.index) == ("bad_encoding", 2, 1)
    assert f"{p}, line 2: the text holds a lone surrogate" in str(ei.value)


def test_type_errors_use_json_words():
    with pytest.raises(DataFormatError, match="'messages' is a JSON number, expected a list"):
        norm({"messages": 5}, "openai")
    with pytest.raises(DataFormatError, match="is a JSON number, expected a string"):
        norm({"instruction": "a", "output": "b", "input": 3}, "alpaca")


@pytest.mark.parametrize("rec, reason, message", [
    ({"messages": None}, "bad_content_type", "'messages' is JSON null, expected a list of messages (openai format)."),
    ({"conversations": None, "id": 1}, "bad_content_type",
     "'conversations' is JSON null, expected a list of messages (sharegpt format)."),
    ({"instruction": "a", "output": None}, "bad_content_type",
     "'output' is JSON null, expected a string (alpaca format; a record needs both 'instruction' and 'output')."),
    ({"instruction": None, "output": None}, "bad_content_type", "'instruction' is JSON null, expected a string"),
    ({"instruction": "a", "context": "", "response": "b"}, "missing_key",
     "'output' is missing; an alpaca record needs both 'instruction' and 'output' (record keys: "
     "['context', 'instruction', 'response']). Fix: rename the column holding the output text to 'output'"),
    ({"output": "b", "input": ""}, "missing_key",
     "'instruction' is missing; an alpaca record needs both 'instruction' and 'output'"),
    ({"messages": [{"content": "q"}, {"role": "assistant", "content": "a"}]}, "unknown_role",
     "messages[0] has no 'role'."),
    ({"conversations": [{"value": "q"}, {"from": "gpt", "value": "a"}]}, "unknown_role",
     "conversations[0] has no 'from' (or 'role')."),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": "f()"}]},
     "bad_content_type", "messages[1].tool_calls is a JSON string, expected a list."),
    ({"instruction": "a", "output": "b", "history": "x"}, "bad_content_type",
     "'history' is a JSON string, expected a list of [query, response] pairs."),
])
def test_a_record_using_a_formats_keys_wrongly_is_told_which_key(rec, reason, message):
    with pytest.raises(DataFormatError) as ei:
        norm(rec)
    assert ei.value.reason == reason and message in str(ei.value), str(ei.value)
    assert "unknown record format" not in str(ei.value)


@pytest.mark.parametrize("fmt, rec, message", [
    ("openai", {"messages": None},
     "records, record 1: 'messages' is JSON null, expected a list of messages (openai format). Fix: give "
     "'messages' a list of messages, or remove the record; on_error='skip' skips and reports it."),
    ("sharegpt", {"conversations": None},
     "records, record 1: 'conversations' is JSON null, expected a list of messages (sharegpt format). Fix: give "
     "'conversations' a list of messages, or remove the record; on_error='skip' skips and reports it."),
    ("alpaca", {"instruction": "q", "output": None},
     "records, record 1: 'output' is JSON null, expected a string (alpaca format; a record needs both "
     "'instruction' and 'output'). Fix: give 'output' a string, or remove the record; on_error='skip' skips "
     "and reports it."),
])
def test_a_null_required_key_is_the_same_wrong_type_detected_or_forced(qwen3_tokenizer, fmt, rec, message):
    good = {"openai": GOOD_OPENAI, "sharegpt": GOOD, "alpaca": {"instruction": "q", "output": "a"}}[fmt]
    for forced in (None, fmt):  # a present key holding null is not a missing key, whichever path reads it
        samples, rep = prepare([good, rec], qwen3_tokenizer, seq_length=512, on_error="skip", format=forced)
        assert len(samples) == 1 and rep.by_reason() == {"skipped": {"bad_content_type": 1}}, forced
        (entry,) = rep.entries
        assert entry.detail == message, forced
        with pytest.raises(DataFormatError) as ei:
            prepare([good, rec], qwen3_tokenizer, seq_length=512, format=forced)
        assert (ei.value.reason, str(ei.value)) == ("bad_content_type", message)
    if fmt != "alpaca":  # absent, not null: still a missing key
        with pytest.raises(DataFormatError) as ei:
            prepare([good, {"id": 1}], qwen3_tokenizer, seq_length=512, format=fmt)
        assert ei.value.reason == "missing_key" and f"missing key '{list(rec)[0]}'" in str(ei.value)
