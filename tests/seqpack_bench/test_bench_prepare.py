"""seqpack_bench.prepare (`seqpack bench prepare`) in a tiny mode: the data sets, the TRL and seqpack sides,
the notes on why they differ (no speed is asserted here)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seqpack_bench import references as ref

from _bench_cli import _cli, _forbid, _one_line_error


def test_synthetic_chat_is_deterministic_openai_jsonl(tmp_path):
    from seqpack_bench.prepare import write_synthetic_chat

    a = write_synthetic_chat(tmp_path / "a.jsonl", 50, seed=3).read_text()
    b = write_synthetic_chat(tmp_path / "b.jsonl", 50, seed=3).read_text()
    assert a == b
    recs = [json.loads(line) for line in a.splitlines()]
    assert len(recs) == 50
    for r in recs:
        roles = [m["role"] for m in r["messages"]]
        assert roles[-1] == "assistant" and "user" in roles and all(m["content"] for m in r["messages"])
    with pytest.raises(ValueError, match="records"):
        write_synthetic_chat(tmp_path / "c.jsonl", 0)


def test_bench_prepare_tiny_real_and_synthetic(tmp_path, shared_data, qwen3_tokenizer):
    from seqpack_bench.prepare import run_prepare

    sub = tmp_path / "data" / "llama-factory"
    sub.mkdir(parents=True)
    (sub / "identity.json").write_bytes((shared_data / "llama-factory" / "identity.json").read_bytes())
    use_trl = ref.trl_available()
    logs: list[str] = []
    data = run_prepare(shared_data=tmp_path / "data", records=120, seq_length=1024, repeats=1,
                       out_dir=tmp_path / "out", tokenizer=qwen3_tokenizer, trl=use_trl, log=logs.append, num_proc=2)
    on_disk = json.loads((tmp_path / "out" / "prepare.json").read_text())
    # one untimed warm-up of each program before the first timed run (one-time costs not charged to it)
    first_timed = next(i for i, m in enumerate(logs) if m.endswith("seqpack x1"))
    assert any(m.startswith("warm-up (untimed)") for m in logs[:first_timed])
    assert not any(m.startswith("note: warm-up skipped") for m in logs)
    assert on_disk["warmup"].startswith("50 synthetic chats")
    assert on_disk["benchmark"] == "prepare" and [e["dataset"] for e in on_disk["datasets"]] == [
        "llama-factory/identity.json", "synthetic_chat (120 records)"]
    ident, syn = data["datasets"]
    assert ident["seqpack"]["samples"] == 91 and syn["seqpack"]["samples"] == 120
    for e in data["datasets"]:
        s = e["seqpack"]
        assert 0 < s["efficiency"] <= 1 and s["packs"] >= 1 and 0 < s["trainable_tokens"] < s["tokens"]
        assert s["wall_s"] > 0
        if use_trl:
            t = e["trl"]
            assert t["samples"] == s["samples"] and 0 < t["efficiency"] <= 1
            assert 0 < t["trainable_tokens"] < t["tokens"]  # TRL got assistant masks too
            assert abs(t["tokens"] - s["tokens"]) / s["tokens"] < 0.1  # same data, similar templates
            assert e["speedup_wall"] > 0
        # the bound: encode_batch of the texts seqpack renders, on the same number of threads as processes
        assert e["bound"]["texts"] == s["samples"] and e["bound"]["threads"] == data["num_proc"]
        assert e["bound"]["wall_s"] > 0 and e["bound_ratio"] == round(s["prepare_s"] / e["bound"]["wall_s"], 3)
        assert 0 < s["prepare_s"] < s["wall_s"]
    assert data["num_proc"] == 2
    assert (tmp_path / "out" / "prepare_time.png").stat().st_size > 1000
    assert not list((tmp_path / "out").glob("_prepare_work*"))  # scratch removed


def test_bench_prepare_with_nothing_to_run_raises(tmp_path, qwen3_tokenizer):
    from seqpack_bench.prepare import run_prepare

    notes = []
    with pytest.raises(ValueError, match="nothing to benchmark"):
        run_prepare(shared_data=tmp_path / "none", records=0, out_dir=tmp_path / "out", tokenizer=qwen3_tokenizer,
                    trl=False, log=notes.append)
    # the default folder being absent is a printed note, not silence
    assert any(m.startswith("note: real-data folder") and "not found" in m for m in notes)


def _fake_shared(root, names=("alpaca_en_demo.json", "identity.json")):
    """A ../shared/data look-alike with tiny alpaca-format files under llama-factory/."""
    sub = root / "llama-factory"
    sub.mkdir(parents=True)
    recs = [{"instruction": f"Say the number {i} in words, please.", "input": "",
             "output": f"The number is {i}; written out it is a small number."} for i in range(3)]
    for n in names:
        (sub / n).write_text(json.dumps(recs))
    return root


def test_cli_bench_prepare_shared_data_named_must_exist(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack_bench.prepare", "run_prepare")
    r = CliRunner().invoke(_cli(), ["bench", "prepare", "--shared-data", str(tmp_path / "nonexistent"),
                                    "--records", "50", "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert _one_line_error(r).startswith(f"error: --shared-data {tmp_path / 'nonexistent'}: folder not found")
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(_cli(), ["bench", "prepare", "--shared-data", str(tmp_path / "empty"),
                                    "--records", "50", "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    line = _one_line_error(r)
    assert "--shared-data" in line and "none of the files" in line and "llama-factory/alpaca_en_demo.json" in line
    assert calls == []


def test_cli_bench_prepare_seq_length_error_names_its_own_options(tmp_path):
    shared = _fake_shared(tmp_path / "data")
    r = CliRunner().invoke(_cli(), ["bench", "prepare", "--shared-data", str(shared), "--records", "0", "--no-trl",
                                    "--repeats", "1", "--seq-length", "8", "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    line = _one_line_error(r)
    assert "no sample left to pack" in line and "raise --seq-length (now 8)" in line
    assert "--format" not in line and "--overlength" not in line and "--on-error" not in line  # `seqpack pack` options


def test_cli_bench_prepare_table_shows_whole_dataset_names(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    import seqpack_bench.prepare.run as prep
    from seqpack_bench.timing import print_table

    buf = io.StringIO()
    monkeypatch.setattr(prep, "print_table", lambda *a, **k: print_table(
        *a, **{**k, "console": Console(file=buf, width=100, color_system=None)}))  # a 100-column terminal
    names = ("alpaca_en_demo.json", "identity.json", "glaive_toolcall_en_demo.json")
    shared = _fake_shared(tmp_path / "data", names)
    r = CliRunner().invoke(_cli(), ["bench", "prepare", "--shared-data", str(shared), "--records", "4", "--no-trl",
                                    "--repeats", "1", "--seq-length", "512", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    table = buf.getvalue()
    assert "…" not in table
    rows = [ln for ln in table.splitlines() if "seqpack" in ln and ln.startswith("│")]
    assert [ln.split("│")[1].strip() for ln in rows] == [*names, "synthetic_chat (4 records)"]
    data = json.loads((tmp_path / "out" / "prepare.json").read_text())
    assert [e["dataset"] for e in data["datasets"]][:3] == [f"llama-factory/{n}" for n in names]  # JSON keeps paths
    assert {s["dataset"] for s in data["skipped"]} == {"fastchat/dummy_conversation.json"}  # absent: listed
    assert "note: " in r.output and "dummy_conversation.json not found: skipped" in r.output


def _chat(turns: list[tuple[str, str]]) -> dict:
    conv = []
    for user, assistant in turns:
        conv += [{"from": "human", "value": user}, {"from": "gpt", "value": assistant}]
    return {"conversations": conv}


@pytest.fixture(scope="module")
def prepare_quick_run(tmp_path_factory):
    """`bench prepare --quick` on a crafted FastChat-format file: 3 two-turn chats (1 empty think block each
    that only TRL's template writes) and 1 chat whose first assistant turn lies past --seq-length 128
    (seqpack drops it: no trainable token; TRL keeps its first 128 tokens)."""
    if not ref.trl_available():
        pytest.skip("trl/datasets not importable")
    root = tmp_path_factory.mktemp("prep")
    (root / "data" / "fastchat").mkdir(parents=True)
    recs = [_chat([(f"Hello number {i}.", f"Hi {i}, how can I help?"), ("Tell me a fact.", "Water boils at 100 C.")])
            for i in range(3)]
    recs.append(_chat([(" ".join(["word"] * 300), "Too late to be seen."), ("And now?", "Still cut.")]))
    (root / "data" / "fastchat" / "dummy_conversation.json").write_text(json.dumps(recs))
    r = CliRunner().invoke(_cli(), ["bench", "prepare", "--quick", "--records", "0", "--seq-length", "128",
                                    "--shared-data", str(root / "data"), "--out", str(root / "out")])
    assert r.exit_code == 0, r.output
    return r.output, json.loads((root / "out" / "prepare.json").read_text())


def test_cli_bench_prepare_notes_why_samples_and_tokens_differ(prepare_quick_run):
    output, data = prepare_quick_run
    (entry,) = data["datasets"]
    c = entry["comparison"]
    assert c["samples"] == {"seqpack": 3, "trl": 4}
    assert c["seqpack_report"]["dropped"] == {"no_trainable_tokens": 1}
    assert c["trl_samples_at_seq_length"] == 1 and c["trl_samples_without_trainable_tokens"] == 1
    # seqpack: a think block in each last turn (3); TRL: in every assistant turn (6), none in the cut record's 128
    assert c["think_blocks"] == {"seqpack": 3, "trl": 6} and c["think_block_tokens"] == 12
    assert c["tokens"]["trl"] - c["tokens"]["seqpack"] == 12 + 128  # think blocks + the record only TRL keeps
    lines = [ln for ln in output.splitlines() if ln.startswith("note: dummy_conversation.json")]
    assert lines == c["notes"] and len(lines) == 2
    assert lines[0].startswith("note: dummy_conversation.json: samples differ: seqpack 3, TRL 4; seqpack's report: "
                               "dropped 1 (no_trainable_tokens: 1) (e.g. dummy_conversation.json:3: truncated from")
    assert "with no trainable token: 1" in lines[0]
    assert lines[1] == (f"note: dummy_conversation.json: tokens differ: seqpack {c['tokens']['seqpack']:,}, TRL "
                        f"{c['tokens']['trl']:,} (+140); empty think blocks: seqpack 3, TRL 6 = +12 tokens; the "
                        "other +128 are in the samples TRL keeps and seqpack drops")
    assert "note: why tokens differ: TRL's qwen3_training.jinja" in output and data["notes"][:2] == lines
    assert output.index("note: dummy_conversation.json") > output.index("prepare: tokenize + pack + write")


def test_cli_bench_prepare_quick_verdicts_are_informational(prepare_quick_run):
    output, data = prepare_quick_run
    bound, goal = data["goals"]
    assert goal["informational"] == "quick: informational" and data["quick"] is True
    tag = "PASS" if goal["pass"] else "MISS"
    assert f"{tag} (quick: informational)  fastchat/dummy_conversation.json: seqpack >= 2x" in output
    assert bound["informational"] == "quick: informational"
    assert "seqpack preparation within 1.3x of tokenizers' encode_batch" in bound["goal"]
    note = [ln for ln in output.splitlines() if ln.startswith("note: --quick verdicts are informational")]
    assert len(note) == 1 and "judged on the full run (`seqpack bench prepare`: 100,000 synthetic records" in note[0]


def test_cli_bench_prepare_malformed_data_file_exits_1_naming_it(tmp_path):
    shared = _fake_shared(tmp_path / "data", ("identity.json",))
    bad = shared / "llama-factory" / "identity.json"
    bad.write_text('[{"instruction": "hi", "output": "ok"},\n{"instruction": ')  # cut mid-record
    r = CliRunner().invoke(_cli(), ["bench", "prepare", "--shared-data", str(shared), "--records", "0", "--no-trl",
                                    "--repeats", "1", "--out", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output  # a data error, as in `seqpack train`; 2 is for a bad option
    line = _one_line_error(r)
    assert str(bad) in line and line.startswith("error: seqpack could not prepare")


@pytest.mark.skipif(not ref.trl_available(), reason="trl/datasets not importable")
def test_trl_path_data_error_is_a_prepare_data_error(tmp_path, qwen3_tokenizer):
    from seqpack_bench.prepare import PrepareDataError, trl_prepare_and_pack

    f = tmp_path / "x.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    with pytest.raises(PrepareDataError, match=r"TRL path could not read .*x\.jsonl"):
        trl_prepare_and_pack(f, qwen3_tokenizer, 256, tmp_path / "o.parquet")
    f.write_text('{"text": "no instruction, conversations or messages"}\n')
    with pytest.raises(PrepareDataError, match=r"record 0 of .*x\.jsonl"):
        trl_prepare_and_pack(f, qwen3_tokenizer, 256, tmp_path / "o.parquet")


@pytest.mark.skipif(not ref.trl_available(), reason="trl/datasets not importable")
def test_trl_conversion_renders_glaive_tool_calls_like_seqpack(shared_data, qwen3_tokenizer):
    # the TRL path must render function calls as <tool_call> blocks and tools as {"type": "function", ...}
    # schemas, as seqpack does: apart from empty think blocks, both sides give the same text
    from seqpack_bench.prepare.programs import _read_records, _to_chatml, _trl_training_template
    from seqpack.data import prepare

    path = shared_data / "llama-factory" / "glaive_toolcall_en_demo.json"
    samples, _ = prepare([path], qwen3_tokenizer, seq_length=100_000)
    think = "<think>\n\n</think>\n\n"
    template = _trl_training_template()
    for rec, s in list(zip(_read_records(path), samples))[:40]:
        r = _to_chatml(rec)
        trl_text = qwen3_tokenizer.apply_chat_template(r["messages"], tools=r["tools"], chat_template=template,
                                                       tokenize=False)
        assert trl_text.replace(think, "") == qwen3_tokenizer.decode(s.input_ids.tolist()).replace(think, "")
