"""seqpack.pipeline.pack_dataset: the offline job end to end (prepare -> plan -> rows -> write -> load)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from seqpack.io import StalePackedDatasetError, load_packed
from seqpack.pipeline import PackConfigError, pack_dataset, sample_data_path

IGN = -100
END = "<|im_end|>"
N_SAMPLE = 46  # records in the embedded sample_chat.jsonl


def _runs(labels: np.ndarray) -> list[np.ndarray]:
    """Contiguous spans of trained label slots."""
    idx = np.flatnonzero(labels != IGN)
    if idx.size == 0:
        return []
    return np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)


def _trained_texts(tok, packed) -> dict[str, list[str]]:
    """sample_id -> decoded trained targets, one string per contiguous trained span."""
    out = {}
    cu = packed.cu_seqlens
    for i, sid in enumerate(packed.sample_ids):
        lab = packed.labels[cu[i] : cu[i + 1]]
        out[sid] = [tok.decode(lab[r].tolist(), skip_special_tokens=False) for r in _runs(lab)]
    return out


def _strip_think(text: str) -> str:
    return re.sub(r"^<think>.*?</think>\s*", "", text, flags=re.S)


@pytest.fixture(scope="module")
def sample_pack(tmp_path_factory, qwen3_tokenizer):
    out = tmp_path_factory.mktemp("emb") / "packed"
    return pack_dataset(None, out, tokenizer=qwen3_tokenizer, seq_length=1024, seed=3)


def test_embedded_sample_data_packs_and_reads_back(sample_pack, qwen3_tokenizer):
    res = sample_pack
    m = res.metadata
    assert m.counts["records_read"] == N_SAMPLE and m.counts["samples_packed"] == N_SAMPLE
    assert m.num_packs == m.lower_bound == res.plan.num_bins
    ds = load_packed(res.output, expect={"capacity": 1024, "context_parallel_size": 1})
    seen = []
    tokens = 0
    for i in range(len(ds)):
        p = ds[i].validate(capacity=1024)
        seen += p.sample_ids
        tokens += p.num_real_tokens
    assert sorted(seen) == sorted(f"sample_chat.jsonl:{k}" for k in range(N_SAMPLE))
    assert tokens == m.counts["tokens"]
    assert m.packing_efficiency == pytest.approx(tokens / (m.num_packs * 1024), abs=1e-6)
    assert m.inputs[0]["path"].endswith("sample_chat.jsonl")
    from seqpack.data import tokenizer_fingerprint

    fp = tokenizer_fingerprint(qwen3_tokenizer)
    assert (m.tokenizer_hash, m.chat_template_hash) == (fp["files_sha256"], fp["chat_template_sha256"])
    assert m.tokenizer == "qwen3" and len(m.tokenizer_hash) == 64
    # the tool-calling record trains on the call and on the final answer, never on the tool result
    texts = {}
    for i in range(len(ds)):
        texts.update(_trained_texts(qwen3_tokenizer, ds[i]))
    recs = [json.loads(line) for line in sample_data_path().read_text().splitlines()]
    k = next(i for i, r in enumerate(recs) if r.get("tools") and r["messages"][1]["content"].startswith("Do I need"))
    spans = texts[f"sample_chat.jsonl:{k}"]
    assert len(spans) == 2 and all(s.endswith(END) for s in spans)
    assert "get_weather" in spans[0] and "Lisbon" in spans[0]
    assert _strip_think(spans[1])[: -len(END)].strip() == recs[k]["messages"][-1]["content"]
    assert not any("light rain" in s and "temperature" in s for s in spans)
    # parallel tool calls: the three calls are one trained assistant turn
    k = next(i for i, r in enumerate(recs) if any(len(mm.get("tool_calls") or []) == 3 for mm in r["messages"]))
    spans = texts[f"sample_chat.jsonl:{k}"]
    assert len(spans) == 3 and spans[0].count("<tool_call>") == 3 and "Helsinki" in spans[0]


def test_embedded_sample_data_is_wellformed():
    recs = [json.loads(line) for line in sample_data_path().read_text(encoding="utf-8").splitlines()]
    assert len(recs) == N_SAMPLE
    assert len({r["id"] for r in recs}) == N_SAMPLE
    roles = [[m["role"] for m in r["messages"]] for r in recs]
    assert sum(r[0] == "system" for r in roles) >= 5
    assert sum(r.count("user") >= 2 for r in roles) >= 5  # multi-turn
    tool_recs = [r for r in recs if "tools" in r]
    assert any(any(m.get("tool_calls") for m in r["messages"]) and any(m["role"] == "tool" for m in r["messages"])
               for r in tool_recs)
    for r in recs:
        assert r["messages"][-1]["role"] == "assistant"


def test_fingerprint_is_deterministic_and_setting_sensitive(sample_pack, tmp_path, qwen3_tokenizer):
    again = pack_dataset(None, tmp_path / "again", tokenizer="qwen3", seq_length=1024, seed=3)
    assert again.metadata.fingerprint == sample_pack.metadata.fingerprint
    a, b = load_packed(again.output), load_packed(sample_pack.output)
    assert [a[i].sample_ids for i in range(len(a))] == [b[i].sample_ids for i in range(len(b))]
    other = pack_dataset(None, tmp_path / "other", tokenizer=qwen3_tokenizer, seq_length=1024, seed=3,
                         context_parallel_size=2)
    assert other.metadata.fingerprint != sample_pack.metadata.fingerprint


def test_B23_capacity_not_divisible_by_2cp_rejected_before_any_work(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(PackConfigError, match=r"seq_length=150 .*multiple 4.*context_parallel_size=2") as ei:
        pack_dataset(None, out, seq_length=150, context_parallel_size=2)
    assert "148 or 152" in str(ei.value)
    assert not out.exists()


def test_B23_stale_cp1_data_refused_for_cp2(sample_pack):
    with pytest.raises(StalePackedDatasetError, match="context_parallel_size: stored 1, expected 2"):
        load_packed(sample_pack.output, expect={"context_parallel_size": 2, "capacity": 1024})


def test_B24_one_pad_multiple_for_planner_builder_and_metadata(tmp_path, monkeypatch, qwen3_tokenizer):
    import seqpack.algorithms as alg
    import seqpack.packed as packed

    seen = {"plan": set(), "build": set()}
    real_plan, real_build = alg.pack_lengths, packed.build_packed_sequence

    def spy_plan(*a, **kw):
        seen["plan"].add(kw["pad_to_multiple_of"])
        return real_plan(*a, **kw)

    def spy_build(*a, **kw):
        seen["build"].add(kw["pad_to_multiple_of"])
        return real_build(*a, **kw)

    monkeypatch.setattr(alg, "pack_lengths", spy_plan)
    monkeypatch.setattr(packed, "build_packed_sequence", spy_build)
    # pad_to_multiple_of=6 and CP=2 (2*CP=4): the one multiple is lcm(6, 4) = 12
    res = pack_dataset(None, tmp_path / "m12", tokenizer=qwen3_tokenizer, seq_length=1200, pad_to_multiple_of=6, context_parallel_size=2)
    assert seen == {"plan": {12}, "build": {12}}
    m = res.metadata
    assert (m.effective_pad_multiple, m.pad_to_multiple_of, m.context_parallel_size) == (12, 6, 2)
    ds = load_packed(res.output, expect={"effective_pad_multiple": 12, "context_parallel_size": 2})
    for i in range(len(ds)):
        p = ds[i].validate(capacity=1200, context_parallel_size=2, multiple=12)
        assert (np.diff(p.cu_seqlens_padded) % 12 == 0).all()
        assert p.length <= 1200
    assert m.counts["alignment_padding_tokens"] > 0
    assert m.num_packs == m.lower_bound


def test_refuses_existing_output_before_tokenizing(sample_pack, monkeypatch):
    import seqpack.data as data

    def boom(*a, **kw):  # pragma: no cover - must not be reached
        raise AssertionError("prepare ran although the output exists")

    monkeypatch.setattr(data, "prepare", boom)
    with pytest.raises(FileExistsError, match="--overwrite"):
        pack_dataset(None, sample_pack.output, seq_length=1024)


def test_bad_settings_name_their_keys(tmp_path):
    with pytest.raises(PackConfigError, match="unknown packing algorithm 'nope'.*balanced_best_fit"):
        pack_dataset(None, tmp_path / "x", algorithm="nope")
    with pytest.raises(PackConfigError, match="context_parallel_size"):
        pack_dataset(None, tmp_path / "x", context_parallel_size=0)
    with pytest.raises(PackConfigError, match="seq_length"):
        pack_dataset(None, tmp_path / "x", seq_length=0)
    with pytest.raises(PackConfigError, match="overlength='chop'.*truncate"):
        pack_dataset(None, tmp_path / "x", overlength="chop")
    with pytest.raises(PackConfigError, match="train_on='everything'"):
        pack_dataset(None, tmp_path / "x", train_on="everything")
    with pytest.raises(PackConfigError, match="format='csv'.*sharegpt"):
        pack_dataset(None, tmp_path / "x", format="csv")
    with pytest.raises(PackConfigError, match="on_error='ignore'"):
        pack_dataset(None, tmp_path / "x", on_error="ignore")
    assert not (tmp_path / "x").exists()


def test_progress_callback_sees_every_stage(tmp_path, qwen3_tokenizer):
    calls = []
    pack_dataset(None, tmp_path / "p", tokenizer=qwen3_tokenizer, seq_length=2048, progress=lambda st, d, t: calls.append((st, d, t)))
    stages = {c[0] for c in calls}
    assert {"prepare", "plan", "write"} <= stages
    assert ("plan", 1, 1) in calls
    w = [c for c in calls if c[0] == "write"]
    assert w[-1][1] == w[-1][2] >= 1


# ---------------------------------------------------------------- real data (Done-when of issue #2)

FILES = [
    "llama-factory/alpaca_en_demo.json",
    "llama-factory/glaive_toolcall_en_demo.json",
    "llama-factory/reason_tool_use_demo_50.jsonl",
    "fastchat/dummy_conversation.json",
]


@pytest.fixture(scope="module")
def real_pack(shared_data, tmp_path_factory, qwen3_tokenizer):
    out = tmp_path_factory.mktemp("real") / "packed"
    res = pack_dataset([shared_data / f for f in FILES], out, tokenizer=qwen3_tokenizer, seq_length=4096)
    return res, load_packed(out)


def _load_records(path: Path) -> list:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(path.read_text(encoding="utf-8"))


def test_real_data_every_record_accounted_for_and_lower_bound(real_pack, shared_data):
    res, ds = real_pack
    m = res.metadata
    expected = set()
    for f in FILES:
        name = Path(f).name
        expected |= {f"{name}:{i}" for i in range(len(_load_records(shared_data / f)))}
    assert m.counts["records_read"] == len(expected) == 1849
    packed_ids = [sid for i in range(len(ds)) for sid in ds[i].sample_ids]
    assert len(packed_ids) == len(set(packed_ids)) == m.counts["samples_packed"]  # each packed exactly once
    report = ds.report()
    not_packed = {e["sample_id"] for e in report if e["status"] in ("dropped", "skipped")}
    assert set(packed_ids) | not_packed == expected and not set(packed_ids) & not_packed
    # the 11.5k-token glaive record: handled per the policy and reported with its reason
    long = [e for e in report if (e.get("tokens_before") or 0) > 11000]
    assert len(long) == 1 and long[0]["sample_id"].startswith("glaive_toolcall_en_demo.json:")
    assert long[0]["status"] in ("truncated", "dropped") and long[0]["reason"]
    assert m.num_packs == m.lower_bound
    assert m.dataset_max_seqlen <= 4096 and m.max_samples_per_bin >= 2
    for i in range(len(ds)):
        ds[i].validate(capacity=4096)


def test_real_data_trained_tokens_are_exactly_the_assistant_turns(real_pack, shared_data, qwen3_tokenizer):
    res, ds = real_pack
    texts: dict[str, list[str]] = {}
    for i in range(len(ds)):
        texts.update(_trained_texts(qwen3_tokenizer, ds[i]))
    truncated = {e["sample_id"] for e in ds.report() if e["status"] == "truncated"}
    checked = 0
    for f in FILES:
        name = Path(f).name
        for idx, rec in enumerate(_load_records(shared_data / f)):
            sid = f"{name}:{idx}"
            if sid not in texts or sid in truncated:
                continue
            spans = texts[sid]
            assert spans and all(s.endswith(END) for s in spans), sid  # each turn ends with its end-of-turn
            assert not any("<|im_start|>" in s for s in spans), sid  # never a role header / another turn
            bodies = [_strip_think(s)[: -len(END)].strip() for s in spans]
            if "output" in rec:  # alpaca
                assert bodies == [rec["output"].strip()], sid
            elif "conversations" in rec:  # sharegpt (fastchat, glaive)
                turns = [t for t in rec["conversations"] if t["from"] in ("gpt", "function_call")]
                assert len(bodies) == len(turns), sid
                for body, t in zip(bodies, turns):
                    if t["from"] == "gpt":
                        assert body == t["value"].strip(), sid
                    else:
                        assert json.loads(t["value"])["name"] in body and "<tool_call>" in body, sid
            else:  # LLaMA-Factory v1 messages (reasoning + tool calls)
                turns = [mm for mm in rec["messages"] if mm["role"] == "assistant"]
                assert len(spans) == len(turns), sid
                for span, mm in zip(spans, turns):
                    for part in mm["content"]:
                        if part["type"] == "text" and part["value"].strip():
                            assert part["value"].strip() in span, sid
                        elif part["type"] == "tool_call":
                            assert json.loads(part["value"])["name"] in span, sid
            checked += 1
    assert checked >= 1840


def test_build_metadata_statistics_by_hand():
    from seqpack.accounting import PrepareReport, SampleRecord
    from seqpack.pipeline import build_metadata

    rep = PrepareReport(records_read=4, entries=[SampleRecord("r:3", "r", 3, "dropped", "overlength")])
    settings = dict(format_version=1, seq_length=12, pad_to_multiple_of=4, context_parallel_size=1, effective_pad_multiple=4,
                    algorithm="first_fit_decreasing", seed=0, overlength="drop", train_on="assistant",
                    on_error="raise", format=None, tokenizer_hash="t", chat_template_hash="c", pad_token_id=0)
    meta = build_metadata(lengths=np.array([5, 3, 7]), trainable_tokens=9,
                          bins=[np.array([0, 1]), np.array([2])], lower_bound=2, report=rep,
                          settings=settings, described_inputs=[{"path": "r", "bytes": 1, "sha256": "x"}],
                          tokenizer_name="qwen3")
    c = meta.counts
    assert (c["records_read"], c["samples_packed"], c["tokens"], c["trainable_tokens"]) == (4, 3, 15, 9)
    assert (c["alignment_padding_tokens"], c["tail_padding_tokens"]) == (5, 4)  # padded [8,4,8]; 24 slots
    assert c["dropped"] == {"overlength": 1}
    assert meta.packing_efficiency == pytest.approx(15 / 24)
    assert (meta.packing_factor, meta.max_samples_per_bin, meta.dataset_max_seqlen, meta.min_packed_seqlen) == (
        1.5, 2, 7, 7)
    other = build_metadata(lengths=np.array([5, 3, 7]), trainable_tokens=9,
                           bins=[np.array([0, 1]), np.array([2])], lower_bound=2, report=rep,
                           settings=settings, described_inputs=[{"path": "r", "bytes": 1, "sha256": "x"}],
                           tokenizer_name="qwen3", fingerprint_extra={"planning": "per_shard"})
    assert other.fingerprint != meta.fingerprint and other.extra["fingerprint_extra"] == {"planning": "per_shard"}


def _chat(user: str, answer: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})


def test_skipped_and_dropped_records_are_counted_and_reported(tmp_path, qwen3_tokenizer):
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join([_chat("hi", "hello"), "{not json", _chat("long?", " ".join(["w"] * 300)),
                               _chat("bye", "goodbye")]) + "\n")
    res = pack_dataset(data, tmp_path / "o", tokenizer=qwen3_tokenizer, seq_length=64, overlength="drop",
                       on_error="skip")
    c = res.metadata.counts
    assert c["records_read"] == 4 and c["samples_packed"] == 2
    assert sum(c["skipped"].values()) == 1 and sum(c["dropped"].values()) == 1
    rep = {e["sample_id"]: e for e in load_packed(res.output).report()}
    assert rep["mixed.jsonl:1"]["status"] == "skipped" and rep["mixed.jsonl:2"]["status"] == "dropped"
    ds = load_packed(res.output)
    assert sorted(s for i in range(len(ds)) for s in ds[i].sample_ids) == ["mixed.jsonl:0", "mixed.jsonl:3"]


def test_nothing_left_to_pack_is_an_error_and_writes_nothing(tmp_path, qwen3_tokenizer):
    from seqpack.pipeline import NothingToPackError

    data = tmp_path / "long.jsonl"
    data.write_text(_chat("long?", " ".join(["w"] * 300)) + "\n")
    with pytest.raises(NothingToPackError, match=r"1 record\(s\) read.*dropped"):
        pack_dataset(data, tmp_path / "o", tokenizer=qwen3_tokenizer, seq_length=64, overlength="drop")
    assert not (tmp_path / "o").exists()


def test_every_record_bad_lists_each_in_a_report_beside_the_output_and_keeps_the_old_dataset(
    tmp_path, qwen3_tokenizer
):
    """on_error='skip' with no good record: an error (CLI exit 1) naming the report beside the output,
    which lists every record with its reason (written by the same writer as a dataset's report.jsonl);
    a dataset already at the output is left byte for byte; the next successful run removes the report."""
    from seqpack.cli import app
    from seqpack.pipeline import NothingToPackError
    from typer.testing import CliRunner

    good = tmp_path / "good.jsonl"
    good.write_text(_chat("hi", "hello") + "\n")
    out = tmp_path / "o"
    pack_dataset(good, out, tokenizer=qwen3_tokenizer, seq_length=64)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n" + _chat("long?", " ".join(["w"] * 300)) + "\n[1, 2]\n")
    with pytest.raises(NothingToPackError) as ei:
        pack_dataset(bad, out, tokenizer=qwen3_tokenizer, seq_length=64, overlength="drop", on_error="skip",
                     overwrite=True)
    report = tmp_path / "o.report.jsonl"
    assert str(report) in str(ei.value) and "left as it was" in str(ei.value)
    fix = str(ei.value).split("Fix: ")[1]  # the fixes that fit these reasons: malformed / not an object, overlength
    assert fix.startswith("check format='auto' against the records' keys; for overlength drops raise "
                          "seq_length=64 or change overlength='drop'; fix the skipped records"), fix
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert sorted((r["sample_id"], r["status"]) for r in rows) == [
        ("bad.jsonl:0", "skipped"), ("bad.jsonl:1", "dropped"), ("bad.jsonl:2", "skipped")]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    report.unlink()
    r = CliRunner().invoke(app, ["pack", str(bad), "-o", str(tmp_path / "c"), "--seq-length", "64",
                                 "--overlength", "drop", "--on-error", "skip", "-q"])
    assert r.exit_code == 1 and "c.report.jsonl" in r.output and "Traceback" not in r.output
    assert len((tmp_path / "c.report.jsonl").read_text().splitlines()) == 3 and not (tmp_path / "c").exists()
    pack_dataset(good, tmp_path / "c", tokenizer=qwen3_tokenizer, seq_length=64)
    assert not (tmp_path / "c.report.jsonl").exists()
    broken = tmp_path / "broken.jsonl"  # only malformed lines: no format or length advice
    broken.write_text("{not json\n{\"a\": \n")
    with pytest.raises(NothingToPackError) as ei:
        pack_dataset(broken, tmp_path / "d", tokenizer=qwen3_tokenizer, seq_length=64, on_error="skip")
    assert str(ei.value).split("Fix: ")[1] == (
        "fix the skipped records (each is named when packing with on_error='raise')"), str(ei.value)


def test_records_truncated_to_no_trainable_token_point_at_the_length_not_train_on(tmp_path, qwen3_tokenizer):
    """A record that lost its trained tokens to truncation gets the seq_length / overlength fix; one that
    had none before truncation keeps the train_on fix; the CLI names the flags."""
    from seqpack.cli import app
    from seqpack.pipeline import NothingToPackError
    from typer.testing import CliRunner

    data = tmp_path / "long.jsonl"
    data.write_text(_chat("a long question? " * 40, "yes") + "\n")
    with pytest.raises(NothingToPackError) as ei:
        pack_dataset(data, tmp_path / "o", tokenizer=qwen3_tokenizer, seq_length=64)
    assert str(ei.value).split("Fix: ")[1] == (
        "records truncated to seq_length=64 kept no trainable token: raise seq_length=64, or set "
        "overlength='split' (keeps every token) or overlength='drop'")
    rows = [json.loads(line) for line in (tmp_path / "o.report.jsonl").read_text().splitlines()]
    assert [(r["reason"], r["detail"].split(" to ")[0]) for r in rows] == [
        ("no_trainable_tokens", f"truncated from {rows[0]['tokens_before']}")]
    # a record with no trainable token before any truncation, beside a truncated one: both fixes
    from types import SimpleNamespace

    from seqpack.accounting import PrepareReport, SampleRecord
    from seqpack.pipeline.nothing_left import nothing_left_fixes

    report = PrepareReport(records_read=2, entries=[
        SampleRecord("a:0", "a", 0, "dropped", "no_trainable_tokens", "truncated from 90 to 64 tokens, no trainable "
                     "token left", 90, 0),
        SampleRecord("a:1", "a", 1, "dropped", "no_trainable_tokens", "no trainable token", 1, 0)])
    job = SimpleNamespace(format=None, seq_length=64, overlength="truncate", train_on="assistant")
    assert nothing_left_fixes(job, report) == [
        "records truncated to seq_length=64 kept no trainable token: raise seq_length=64, or set "
        "overlength='split' (keeps every token) or overlength='drop'",
        "no token left to train on: check train_on='assistant' and the assistant turns"]
    report.entries.pop(0)
    assert nothing_left_fixes(job, report) == [
        "no token left to train on: check train_on='assistant' and the assistant turns"]
    r = CliRunner().invoke(app, ["pack", str(data), "-o", str(tmp_path / "c"), "--seq-length", "64", "-q"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.stderr.rstrip("\n").split("Fix: ")[1] == (
        "records truncated to --seq-length 64 kept no trainable token: raise --seq-length 64, or set "
        "--overlength split (keeps every token) or --overlength drop")
