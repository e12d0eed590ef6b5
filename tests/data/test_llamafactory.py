"""LLaMA-Factory dataset_info.json reading, checked against LLaMA-Factory 0.9.5's own parser
(``get_dataset_list``) and format converters (``get_dataset_converter``) on the same files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from _llamafactory import llamafactory_data
from seqpack.data.formats import normalize_record
from seqpack.data.llamafactory import read_dataset_info
from seqpack.data.records import DataFormatError
from seqpack.data.sources import expand_inputs, iter_records

INFO = {
    "alpaca_demo": {"file_name": "alpaca.json"},
    "alpaca_cols": {"file_name": "alp2.jsonl", "formatting": "alpaca",
                    "columns": {"prompt": "q", "query": "ctx", "response": "a", "system": "sys", "history": "hist"}},
    "sharegpt_demo": {"file_name": "sg.json", "formatting": "sharegpt",
                      "columns": {"messages": "conversations", "system": "system", "tools": "tools"}},
    "sharegpt_tags": {"file_name": "sg_dir", "formatting": "sharegpt", "columns": {"messages": "messages"},
                      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                               "assistant_tag": "assistant", "system_tag": "system"}},
    "mm_demo": {"file_name": "sub/mm.json", "formatting": "sharegpt",
                "columns": {"messages": "messages", "images": "images"},
                "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}},
}
FILES = {
    "alpaca.json": [{"instruction": "Name a colour.", "input": "", "output": "Blue."},
                    {"instruction": "Translate", "input": "bonjour", "output": "hello"},
                    {"instruction": "", "input": "only the query", "output": "ok", "history": [["hi", "hello!"]]}],
    "alp2.jsonl": [{"q": "Sum", "ctx": "2 and 3", "a": "5", "sys": "You add.", "hist": [["1+1?", "2"]]},
                   {"q": "Why?", "a": "Because.", "id": "r7"}],
    "sg.json": [{"conversations": [{"from": "human", "value": "Weather?"}, {"from": "gpt", "value": "Sunny."}],
                 "system": "Be brief."},
                {"conversations": [{"from": "system", "value": "Turn sys"}, {"from": "human", "value": "A"},
                                   {"from": "function_call", "value": '{"name": "f", "arguments": {"x": 1}}'},
                                   {"from": "observation", "value": "obs"}, {"from": "gpt", "value": "C"}],
                 "system": "ignored: the first turn is the system tag",
                 "tools": '[{"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}]'},
                {"conversations": [{"from": "human", "value": "A"}, {"from": "human", "value": "B"}]}],
    "sg_dir/a.jsonl": [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
                                     {"role": "assistant", "content": "a1"}]}],
    "sg_dir/b.jsonl": [{"messages": [{"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"},
                                     {"role": "user", "content": "u3"}, {"role": "assistant", "content": "a3"}]},
                       {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                                     {"role": "user", "content": "no answer"}]}],
    "sub/mm.json": [{"messages": [{"role": "user", "content": "<image>What is it?"},
                                  {"role": "assistant", "content": "A square."}], "images": ["imgs/sq.png"]}],
}
BROKEN = {("sg.json", 2), ("b.jsonl", 1)}  # LLaMA-Factory skips these as abnormal


@pytest.fixture()
def lfdir(tmp_path: Path) -> Path:
    from PIL import Image

    (tmp_path / "dataset_info.json").write_text(json.dumps(INFO))
    for name, recs in FILES.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(map(json.dumps, recs)) if name.endswith(".jsonl") else json.dumps(recs))
    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (28, 28), "red").save(tmp_path / "imgs" / "sq.png")
    return tmp_path


def test_attributes_agree_with_llamafactory_parser(lfdir):
    lf = llamafactory_data()
    theirs = lf.parser.get_dataset_list(list(INFO), str(lfdir))
    mine = {s.entry: s.attrs for s in read_dataset_info(lfdir / "dataset_info.json")}
    assert list(mine) == list(INFO)
    for name, attr in zip(INFO, theirs):
        expected = {f.name: getattr(attr, f.name) for f in dataclasses.fields(attr)}
        assert mine[name] == expected, name
    assert mine["sharegpt_tags"]["observation_tag"] is None  # a tags object unsets the tags it leaves out
    assert mine["alpaca_cols"]["messages"] is None and mine["alpaca_demo"]["query"] == "input"


def _lf_messages(conv: dict) -> list[tuple[str, str]]:
    role = {"user": "user", "assistant": "assistant", "observation": "tool", "function": "function"}
    msgs = [("system", conv["_system"])] if conv["_system"] else []
    return msgs + [(role[m["role"]], m["content"]) for m in conv["_prompt"] + conv["_response"]]


def _mine(c) -> list[tuple[str, str]]:
    out = []
    for m in c.messages:
        if m.get("tool_calls"):  # LLaMA-Factory keeps a function turn as its JSON text
            out.append(("function", json.dumps({"name": m["tool_calls"][0]["function"]["name"],
                                                "arguments": m["tool_calls"][0]["function"]["arguments"]})))
        else:
            out.append((m["role"], m["content"]))
    return out


def test_records_agree_with_llamafactory_converters(lfdir):
    lf = llamafactory_data()
    attrs = lf.parser.get_dataset_list(list(INFO), str(lfdir))
    seen = 0
    for src in expand_inputs(lfdir / "dataset_info.json"):
        attr = attrs[list(INFO).index(src.entry)]
        convert = lf.converter.get_dataset_converter(attr.formatting, attr, SimpleNamespace(media_dir=str(lfdir)))
        for raw_rec, rec in zip(FILES[str(src.path.relative_to(lfdir))], iter_records(src)):
            cols = {v for k, v in src.attrs.items() if k in ("prompt", "query", "response", "history", "messages",
                                                             "system", "tools", "images") and v}
            theirs = convert({c: raw_rec.get(c) for c in cols})  # datasets gives every column to every row
            if (src.path.name, rec.index) in BROKEN:
                assert theirs["_prompt"] == [] and theirs["_response"] == []
                with pytest.raises(DataFormatError, match=f"dataset '{src.entry}'"):
                    normalize_record(rec)
                continue
            conv = normalize_record(rec)
            seen += 1
            assert _mine(conv) == [(r, json.dumps(json.loads(t)) if r == "function" else t)
                                   for r, t in _lf_messages(theirs)], (src.name, rec.index)
            assert conv.images == (theirs["_images"] or []), (src.name, rec.index)
            if theirs["_tools"]:
                assert conv.tools[0]["function"]["name"] == json.loads(theirs["_tools"])[0]["name"]
    assert seen == sum(map(len, FILES.values())) - len(BROKEN)


def test_pack_cli_reads_dataset_info_and_selects_entries(lfdir, tmp_path):
    from seqpack.cli.app import app
    from seqpack.io import load_packed

    out = tmp_path / "p_all"
    r = CliRunner().invoke(app, ["pack", str(lfdir / "dataset_info.json"), "-o", str(out), "--seq-length", "512",
                                 "--on-error", "skip", "-q"])
    assert r.exit_code == 0, r.output
    ds = load_packed(out)
    ids = sorted(s for p in ds for s in p.sample_ids)
    assert len(ids) == sum(map(len, FILES.values())) - len(BROKEN)
    assert {i.rsplit(":", 1)[0] for i in ids} == {"alpaca_demo", "alpaca_cols", "sharegpt_demo", "sharegpt_tags/a.jsonl",
                                                  "sharegpt_tags/b.jsonl", "mm_demo"}
    assert sorted(e["reason"] for e in ds.report()) == ["no_assistant_turn", "unknown_role"]
    one = tmp_path / "p_one"
    r = CliRunner().invoke(app, ["pack", str(lfdir / "dataset_info.json"), "-o", str(one), "--dataset",
                                 "alpaca_cols", "-q"])
    assert r.exit_code == 0, r.output
    assert sorted(s for p in load_packed(one) for s in p.sample_ids) == ["alpaca_cols:0", "alpaca_cols:1"]
    r = CliRunner().invoke(app, ["pack", str(lfdir / "alpaca.json"), "-o", str(tmp_path / "x"), "--dataset", "a"])
    assert r.exit_code == 2 and "dataset_info.json" in r.output


@pytest.mark.parametrize("entry, needle", [
    ({"file_name": "alpaca.json", "colums": {}}, "dataset 'bad', key 'colums': unknown key"),
    ({"file_name": "alpaca.json", "columns": {"promt": "q"}}, "key 'columns.promt': unknown key"),
    ({"file_name": "alpaca.json", "columns": {"query": "q"}}, "key 'columns.prompt': is unset"),
    ({"hf_hub_url": "org/ds"}, "key 'hf_hub_url': seqpack reads local files only"),
    ({"file_name": "alpaca.json", "num_samples": 10}, "key 'num_samples'"),
    ({"file_name": "alpaca.json", "ranking": True}, "key 'ranking'"),
    ({"file_name": "alpaca.json", "formatting": "openai"}, "key 'formatting'"),
    ({"file_name": "nope.json"}, "key 'file_name': .*nope.json not found"),
])
def test_bad_entries_name_the_entry_and_key(lfdir, entry, needle):
    (lfdir / "dataset_info.json").write_text(json.dumps({"bad": entry}))
    with pytest.raises(DataFormatError, match=needle):
        expand_inputs([lfdir / "dataset_info.json"])


def test_hf_dataset_info_and_unknown_entry_are_refused(lfdir, tmp_path):
    hf = tmp_path / "hf" / "dataset_info.json"
    hf.parent.mkdir()
    hf.write_text(json.dumps({"builder_name": "json", "features": {}, "splits": {}}))
    with pytest.raises(DataFormatError, match="pass the folder itself"):
        expand_inputs(hf)
    with pytest.raises(DataFormatError, match=r"no dataset entry \['missing'\]"):
        read_dataset_info(lfdir / "dataset_info.json", "alpaca_demo,missing")


def test_all_entries_with_some_unreadable_lists_the_usable_ones_and_the_dataset_flag(lfdir, tmp_path):
    from seqpack.cli.app import app

    info = {"alpaca_demo": INFO["alpaca_demo"], "hub_only": {"hf_hub_url": "org/ds"},
            "gone": {"file_name": "gone.json"}, "sharegpt_demo": INFO["sharegpt_demo"]}
    path = lfdir / "dataset_info.json"
    path.write_text(json.dumps(info))
    want = (f"{path}: 2 of 4 dataset entries cannot be read ('hub_only': key 'hf_hub_url': seqpack reads local files "
            f"only; 'gone': key 'file_name': {lfdir / 'gone.json'} not found), and without --dataset every entry is "
            "packed. Usable entries (their data file is present): ['alpaca_demo', 'sharegpt_demo']. Fix: pick the "
            "entries to pack with --dataset NAME[,NAME], e.g. `--dataset alpaca_demo,sharegpt_demo` (Python: "
            "read_dataset_info(path, 'alpaca_demo,sharegpt_demo') as the input), or make the other entries readable.")
    with pytest.raises(DataFormatError) as ei:
        expand_inputs(path)
    assert str(ei.value) == want and ei.value.reason == "bad_input"
    r = CliRunner().invoke(app, ["pack", str(path), "-o", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 1 and " ".join(r.stderr.split()) == f"error: {want}"
    r = CliRunner().invoke(app, ["pack", str(path), "-o", str(tmp_path / "o"), "-q", "--seq-length", "512",
                                 "--on-error", "skip", "--dataset", "alpaca_demo,sharegpt_demo"])  # the fix works
    assert r.exit_code == 0, r.output
    with pytest.raises(DataFormatError, match=r"^[^(]*dataset 'gone', key 'file_name': .*gone.json not found"):
        read_dataset_info(path, "alpaca_demo,gone")  # a named entry keeps its own error
    path.write_text(json.dumps({"hub_only": {"hf_hub_url": "org/ds"}, "gone": {"file_name": "gone.json"}}))
    with pytest.raises(DataFormatError, match=r"2 of 2 dataset entries cannot be read .* No entry is usable\. Fix: "
                                              r"make an entry readable: download the data"):
        expand_inputs(path)
