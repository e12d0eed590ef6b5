"""seqpack.bench: timing helpers, the LLaMA-Factory reference, and each benchmark in a tiny mode
(proves it runs and that its JSON has the right keys and sane values; no speed is asserted here)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from seqpack.bench import references as ref
from seqpack.bench.timing import Timing, timed, write_json


def test_timed_returns_median_of_repeats_and_last_result():
    calls = []

    def fn():
        calls.append(1)
        return len(calls)

    res, t = timed(fn, repeats=3, warmup=2)
    assert res == 5 and len(calls) == 5  # 2 untimed + 3 timed, last result returned
    assert isinstance(t, Timing) and t.repeats == 3 and len(t.walls_s) == 3
    assert t.wall_s == sorted(t.walls_s)[1] and t.wall_s >= 0 and t.cpu_s >= 0
    with pytest.raises(ValueError, match="repeats"):
        timed(fn, repeats=0)


def test_write_json_converts_numpy_and_non_finite(tmp_path):
    p = write_json(tmp_path / "a" / "x.json", {"n": np.int64(3), "v": np.array([1.5, 2.0]), "bad": float("nan")})
    data = json.loads(p.read_text())
    assert data["n"] == 3 and data["v"] == [1.5, 2.0] and data["bad"] is None
    assert data["machine"]["cpu_count"] >= 1 and "utc" in data["machine"]


def test_llamafactory_reference_known_example():
    # sorted ascending [1,2,3,4,5]; pack 1 takes 5 then 3 (fills 8); pack 2 takes 4, 2, 1
    packs = ref.llamafactory_greedy_knapsack([5, 4, 3, 2, 1], 8)
    assert [sorted(p) for p in packs] == [[0, 2], [1, 3, 4]]
    with pytest.raises(ValueError, match="capacity"):
        ref.llamafactory_greedy_knapsack([9], 8)


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 64), min_size=0, max_size=80), st.integers(64, 200))
def test_llamafactory_reference_places_every_index_once_within_capacity(lengths, cap):
    packs = ref.llamafactory_greedy_knapsack(lengths, cap)
    flat = sorted(i for p in packs for i in p)
    assert flat == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= cap for p in packs)
    assert all(p for p in packs)
    if lengths:
        assert len(packs) >= math.ceil(sum(lengths) / cap)


needs_llamafactory = pytest.mark.skipif(ref.llamafactory_installed() is None,
                                        reason=f"llamafactory not installed ({ref.BASELINE_INSTALL})")
needs_bridge = pytest.mark.skipif(ref.megatron_bridge_installed() is None,
                                  reason=f"megatron-bridge not installed ({ref.BASELINE_INSTALL})")


@needs_llamafactory
@settings(deadline=None, max_examples=80)
@given(st.lists(st.integers(1, 120), min_size=0, max_size=150), st.integers(120, 400))
def test_llamafactory_reference_equals_installed_greedy_knapsack(lengths, cap):
    # the re-implementation (used when llamafactory is absent) must give the published function's packs,
    # in its order, with its index choice among equal lengths
    assert ref.llamafactory_greedy_knapsack(lengths, cap) == ref.llamafactory_installed_greedy_knapsack(lengths, cap)


@needs_bridge
@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=200), st.integers(100, 300))
def test_megatron_bridge_ffd_loads_equal_seqpack_ffd(lengths, cap):
    from seqpack.algorithms import pack_lengths

    bridge = ref.megatron_bridge_packing(lengths, cap, "first_fit_decreasing")
    ours = pack_lengths(np.asarray(lengths), cap, "first_fit_decreasing", shuffle_packs=False)
    # FFD is deterministic up to ties between equal lengths, which do not change the loads
    assert np.asarray(ours.bin_loads).tolist() == bridge.tolist()
    assert int(bridge.sum()) == sum(lengths) and int(bridge.max()) <= cap


@needs_bridge
def test_megatron_bridge_shuffle_is_seeded_and_keeps_global_rng():
    x = [int(v) for v in np.random.default_rng(3).integers(1, 500, 400)]
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = ref.megatron_bridge_packing(x, 1024, "first_fit_shuffle", seed=7)
    assert np.array_equal(np.random.get_state()[1], before)  # the caller's global NumPy RNG is untouched
    b = ref.megatron_bridge_packing(x, 1024, "first_fit_shuffle", seed=7)
    c = ref.megatron_bridge_packing(x, 1024, "first_fit_shuffle", seed=8)
    assert a.tolist() == b.tolist() and int(a.sum()) == sum(x)
    assert int(c.sum()) == sum(x) and a.tolist() != c.tolist()
    with pytest.raises(ValueError, match="first_fit_decreasing"):
        ref.megatron_bridge_packing(x, 1024, "best_fit")
    with pytest.raises(ValueError, match="capacity"):
        ref.megatron_bridge_packing([2000], 1024)


def test_load_installed_file_names_the_install_command():
    with pytest.raises(ref.ReferenceUnavailable, match="pip install --no-deps llamafactory==0.9.5"):
        ref.load_installed_file("no-such-distribution-xyz", "x/y.py")
    with pytest.raises(ref.ReferenceUnavailable, match="has no not/a/file.py"):
        ref.load_installed_file("numpy", "not/a/file.py")
    with pytest.raises(ValueError, match=">= 1|< 1"):
        ref.llamafactory_greedy_knapsack([0, 3], 8)


def test_bench_algorithms_tiny(tmp_path):
    from seqpack.bench.algorithms import run_algorithms

    out = run_algorithms([3000], repeats=1, out_dir=tmp_path, trl=ref.trl_available(), log=lambda _m: None)
    data = json.loads((tmp_path / "algorithms.json").read_text())
    assert data["benchmark"] == "algorithms" and data["sizes"] == [3000]
    progs = {r["program"] for r in data["results"]}
    lf_version, bridge_version = ref.llamafactory_installed(), ref.megatron_bridge_installed()
    lf_name = f"llamafactory {lf_version} greedy_knapsack" if lf_version else ref.LLAMAFACTORY_NAME
    assert "seqpack balanced_best_fit (default)" in progs and lf_name in progs
    if bridge_version:
        assert {f"megatron-bridge {bridge_version} {a}" for a in ref.BRIDGE_ALGORITHMS} <= progs
    else:
        assert any(s["program"] == "megatron-bridge" for s in data["skipped"])
    if ref.trl_available():
        assert {"trl pack_dataset bfd", "trl pack_dataset wrapped"} <= progs
    for r in data["results"]:
        assert r["n"] == 3000 and r["bins"] >= r["lower_bound_l2"] >= r["lower_bound_l1"] > 0
        assert 0 < r["utilization"] <= 1 and r["load_spread"] >= 0 and r["cpu_s"] >= 0 and r["repeats"] >= 1
        if not r["breaks_samples"]:  # every sample placed whole: utilization = sum / (bins * C)
            assert r["bins"] * r["utilization"] * 4096 == pytest.approx(out["results"][0]["bins"]
                                                                       * out["results"][0]["utilization"] * 4096,
                                                                       rel=1e-4)
    assert all({"goal", "pass", "info"} <= set(g) for g in data["goals"])
    assert (tmp_path / "algorithms_time.png").stat().st_size > 1000
    assert (tmp_path / "algorithms_bins.png").stat().st_size > 1000


def test_synthetic_chat_is_deterministic_openai_jsonl(tmp_path):
    from seqpack.bench.prepare import write_synthetic_chat

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
    from seqpack.bench.prepare import run_prepare

    sub = tmp_path / "data" / "llama-factory"
    sub.mkdir(parents=True)
    (sub / "identity.json").write_bytes((shared_data / "llama-factory" / "identity.json").read_bytes())
    use_trl = ref.trl_available()
    logs: list[str] = []
    data = run_prepare(shared_data=tmp_path / "data", records=120, seq_length=1024, repeats=1,
                       out_dir=tmp_path / "out", tokenizer=qwen3_tokenizer, trl=use_trl, log=logs.append)
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
    assert (tmp_path / "out" / "prepare_time.png").stat().st_size > 1000
    assert not list((tmp_path / "out").glob("_prepare_work*"))  # scratch removed


def _cli():
    import seqpack.cli.bench_cmd  # noqa: F401 - registers `bench` on the app
    from seqpack.cli.app import app

    return app


def test_cli_bench_algorithms_and_bad_sizes(tmp_path):
    app = _cli()
    r = CliRunner().invoke(app, ["bench", "algorithms", "--sizes", "2000", "--repeats", "1", "--no-trl",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "seqpack balanced_best_fit" in r.output and (tmp_path / "algorithms.json").is_file()
    bad = CliRunner().invoke(app, ["bench", "algorithms", "--sizes", "ten", "--out", str(tmp_path)])
    assert bad.exit_code == 2


def test_bench_prepare_with_nothing_to_run_raises(tmp_path, qwen3_tokenizer):
    from seqpack.bench.prepare import run_prepare

    notes = []
    with pytest.raises(ValueError, match="nothing to benchmark"):
        run_prepare(shared_data=tmp_path / "none", records=0, out_dir=tmp_path / "out", tokenizer=qwen3_tokenizer,
                    trl=False, log=notes.append)
    # the default folder being absent is a printed note, not silence
    assert any(m.startswith("note: real-data folder") and "not found" in m for m in notes)


def test_cli_bench_stream_missing_script_names_the_option(tmp_path):
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--script", str(tmp_path / "nope.py"),
                                    "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert f"--script {tmp_path / 'nope.py'}: file not found" in r.output
    assert "script=PATH" not in r.output and "Traceback" not in r.output


def test_stream_wrapper_records_output_and_goals(tmp_path):
    from seqpack.bench.stream import run_stream

    script = tmp_path / "fake_bench.py"
    script.write_text("import sys\nprint('table PASSED')\nprint('PASS  goal one: 3x')\nprint('MISS  goal two')\n"
                      "print('  goal: a: PASS; b: MISS')\nprint('summary: throughput PASS')\n"
                      "sys.exit(0 if '--quick' in sys.argv else 4)\n")
    expected = [{"goal": "goal one: 3x", "pass": True}, {"goal": "goal two", "pass": False},
                {"goal": "goal: a: PASS; b: MISS", "pass": False}, {"goal": "summary: throughput PASS", "pass": True}]
    res = run_stream(quick=True, script=script, out_dir=tmp_path, echo=False)
    assert res["returncode"] == 0 and res["quick"] is True
    assert res["goals"] == [{**g, "informational": "quick: informational"} for g in expected]
    assert json.loads((tmp_path / "stream.json").read_text())["output"].startswith("table")
    full = run_stream(script=script, out_dir=tmp_path, echo=False)
    assert full["returncode"] == 4 and full["goals"] == expected  # the full run judges the goals
    with pytest.raises(FileNotFoundError, match="not found"):
        run_stream(script=tmp_path / "missing.py", out_dir=tmp_path)


def test_bench_compare_wrapper_runs_quick(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_compare.py"
    p = subprocess.run([sys.executable, str(script), "bench", "algorithms", "--sizes", "1000", "--repeats", "1",
                        "--no-trl", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((tmp_path / "algorithms.json").read_text())["sizes"] == [1000]


# --------------------------------------------------------------------------- newcomer-tester findings
def _one_line_error(r) -> str:
    """The single ``error: ...`` line of a failed command (no traceback)."""
    assert "Traceback" not in r.output, r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, r.output
    return errors[0]


def _forbid(monkeypatch, module: str, name: str) -> list:
    """Replace ``module.name`` by a recorder: a command that reaches it did work before failing."""
    import importlib

    calls = []
    monkeypatch.setattr(importlib.import_module(module), name, lambda *a, **k: calls.append((a, k)) or {})
    return calls


def test_ensure_out_dir_creates_checks_and_names_the_option(tmp_path):
    from seqpack.bench.timing import OutputDirError, ensure_out_dir

    made = ensure_out_dir(tmp_path / "a" / "b")
    assert made.is_dir() and list(made.iterdir()) == []  # created; the write probe left nothing behind
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(OutputDirError, match=r"^--out .*file\.txt/x: cannot create this folder \(.*file\.txt is a file"):
        ensure_out_dir(blocker / "x")
    with pytest.raises(OutputDirError, match=r"^out_dir .*file\.txt: this is a file, not a folder"):
        ensure_out_dir(blocker, option="out_dir")


@pytest.mark.parametrize("command", [["algorithms", "--quick"], ["prepare", "--records", "5", "--no-trl"],
                                     ["stream", "--quick"]])
def test_cli_bench_unwritable_out_fails_in_one_line_before_any_work(tmp_path, monkeypatch, command):
    calls = {c: _forbid(monkeypatch, f"seqpack.bench.{c}", f"run_{c}") for c in ("algorithms", "prepare", "stream")}
    blocker = tmp_path / "passwd"
    blocker.write_text("root:x:0:0\n")
    r = CliRunner().invoke(_cli(), ["bench", *command, "--out", str(blocker / "x")])
    assert r.exit_code == 2
    line = _one_line_error(r)
    assert line.startswith(f"error: --out {blocker / 'x'}: cannot create this folder") and "passwd is a file" in line
    assert calls[command[0]] == []  # nothing measured before the error


def test_run_functions_check_out_dir_before_work(tmp_path):
    from seqpack.bench.algorithms import run_algorithms
    from seqpack.bench.timing import OutputDirError

    (tmp_path / "f").write_text("")
    logged = []
    with pytest.raises(OutputDirError, match="out_dir"):
        run_algorithms([100], repeats=1, out_dir=tmp_path / "f" / "out", trl=False, log=logged.append)
    assert logged == []


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
    calls = _forbid(monkeypatch, "seqpack.bench.prepare", "run_prepare")
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

    import seqpack.bench.prepare as prep
    from seqpack.bench.timing import print_table

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


@pytest.mark.skipif(not ref.trl_available(), reason="trl/datasets not importable")
def test_algorithms_marks_trl_wrapped_as_cutting_samples_in_table_and_png(tmp_path, monkeypatch):
    import seqpack.bench.algorithms as alg

    tables, charts = [], []
    monkeypatch.setattr(alg, "print_table", lambda title, cols, rows, **k: tables.append(rows))
    real_bar = alg.bar_chart
    monkeypatch.setattr(alg, "bar_chart", lambda path, labels, values, **k: charts.append((path.name, labels, k))
                        or real_bar(path, labels, values, **k))
    alg.run_algorithms([2000], repeats=1, out_dir=tmp_path, max_reference_n=0, max_bridge_n=0, log=lambda _m: None)
    programs = [row[0] for row in tables[0]]
    assert "trl pack_dataset wrapped (cuts samples)" in programs and "trl pack_dataset bfd" in programs
    assert [p for p in programs if "cuts samples" in p] == ["trl pack_dataset wrapped (cuts samples)"]
    assert {name for name, _, _ in charts} == {"algorithms_time.png", "algorithms_bins.png"}
    for _name, labels, kw in charts:
        marked = [i for i, lb in enumerate(labels) if "(cuts samples)" in lb]
        assert [labels[i] for i in marked] == ["trl pack_dataset wrapped (cuts samples), n=2,000"]
        assert [c for c in kw["colors"] if c] == [kw["colors"][marked[0]]]  # only that bar is set apart
        assert "cuts samples" in kw["title"]
    data = json.loads((tmp_path / "algorithms.json").read_text())
    assert [r["program"] for r in data["results"] if r["breaks_samples"]] == ["trl pack_dataset wrapped"]


# the format benchmarks/bench_stream.py prints (copied from a --quick run)
_STREAM_OUTPUT = """
== 1. throughput: 300,000 length-only samples, buffer 10,000, capacity 4096, median of 2
  map-style numpy source :      4,562,753 samples/s  ( 219.2 ns/sample)
  plain iterable of ints :      4,609,135 samples/s
  share inside algorithm : 44.2 %  (packer overhead 122.3 ns/sample)
  offline pack_lengths   :      9,127,468 samples/s  (streaming / offline time = 2.00)
  goal >= 1,000,000 samples/s: PASS

== 2. efficiency: packs above L1 (%), 150,000 samples per data set
  mix          cap      L1  offline offl-BFD | B=100    window  carry  wait | B=1000   window  carry  wait | B=10000  window  carry  wait
  lognormal   4096   23511    0.000    0.004 |         3.364  0.383     8 |         0.383  0.047     8 |         0.047  0.009     8
  bimodal     8192   13270    0.000    0.000 |         5.697  2.065     7 |         0.573  0.083     8 |         0.060  0.000     8
  (wait = most rounds a sample was carried; window = pack each buffer alone, carry = default)
"""


def test_parse_stream_output_reads_throughput_and_efficiency():
    from seqpack.bench.stream import parse_stream_output

    fig = parse_stream_output(_STREAM_OUTPUT)
    assert fig["throughput"] == {"stream_numpy_source": 4_562_753.0, "stream_iterable": 4_609_135.0,
                                 "offline_pack_lengths": 9_127_468.0}
    lg, bi = fig["efficiency"]
    assert (lg["mix"], lg["capacity"], lg["l1"], lg["offline_bfd_pct"]) == ("lognormal", 4096, 23511, 0.004)
    assert [b["buffer"] for b in lg["buffers"]] == [100, 1000, 10_000]
    assert lg["buffers"][1] == {"buffer": 1000, "window_pct": 0.383, "carry_pct": 0.047, "max_wait": 8}
    assert bi["buffers"][2]["carry_pct"] == 0.0 and bi["buffers"][0]["max_wait"] == 7
    assert parse_stream_output("no figures here\n") == {"throughput": {}, "efficiency": []}


def test_cli_bench_stream_writes_json_and_png(tmp_path):
    from seqpack.bench.stream import parse_stream_output

    # a stand-in for bench_stream.py: prints its text and writes its figures where --json says
    figures = json.dumps(parse_stream_output(_STREAM_OUTPUT))
    script = tmp_path / "fake_stream.py"
    script.write_text(f"import pathlib, sys\nsys.stdout.write({_STREAM_OUTPUT!r})\n"
                      f"pathlib.Path(sys.argv[sys.argv.index('--json') + 1]).write_text({figures!r})\nsys.exit(3)\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--script", str(script), "--out", str(out)])
    assert r.exit_code == 3  # the benchmark's exit code is relayed
    for png in ("stream_efficiency.png", "stream_throughput.png"):
        assert (out / png).stat().st_size > 5000, png
    data = json.loads((out / "stream.json").read_text())
    assert data["charts"] == ["stream_efficiency.png", "stream_throughput.png"] and data["charts_skipped"] == []
    assert data["efficiency"][0]["buffers"][1]["carry_pct"] == 0.047
    assert data["throughput"]["offline_pack_lengths"] == 9_127_468.0


def test_cli_bench_stream_without_figures_file_skips_charts_with_reason(tmp_path):
    script = tmp_path / "text_only.py"  # prints the figures but writes no --json file
    script.write_text(f"import sys\nsys.stdout.write({_STREAM_OUTPUT!r})\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--script", str(script), "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "stream.json").read_text())
    assert data["charts"] == [] and not (out / "stream_throughput.png").exists()
    assert [s.split(":")[0] for s in data["charts_skipped"]] == ["stream_efficiency.png", "stream_throughput.png"]
    assert "note: chart not written: stream_throughput.png: no throughput figures" in r.output


def test_bench_stream_script_json_matches_its_printed_figures(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from seqpack.bench.stream import parse_stream_output

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_stream.py"
    path = tmp_path / "sub" / "fig.json"
    p = subprocess.run([sys.executable, str(script), "--quick", "--n", "3000", "--repeats", "1", "--efficiency-n",
                        "3000", "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    fig, printed = json.loads(path.read_text()), parse_stream_output(p.stdout)
    assert fig["sizes"] == {"throughput_n": 3000, "repeats": 1, "efficiency_n": 3000, "rows_n": 20_000}
    assert set(printed["throughput"]) == {"stream_numpy_source", "stream_iterable", "offline_pack_lengths"}
    for key, rate in printed["throughput"].items():  # printed as whole samples/s
        assert abs(fig["throughput"][key] - rate) <= 0.5, key
    assert 0 < fig["throughput"]["algorithm_share"] < 1
    assert [(e["mix"], e["capacity"]) for e in fig["efficiency"]] == [
        ("lognormal", 4096), ("lognormal", 8192), ("bimodal", 4096), ("bimodal", 8192)]
    assert len(printed["efficiency"]) == 4
    for got, shown in zip(fig["efficiency"], printed["efficiency"]):  # printed with 3 decimals
        assert (got["mix"], got["capacity"], got["l1"]) == (shown["mix"], shown["capacity"], shown["l1"])
        assert [b["buffer"] for b in got["buffers"]] == [100, 1000, 10_000]
        for b, sb in zip(got["buffers"], shown["buffers"]):
            assert b["max_wait"] == sb["max_wait"]
            assert abs(b["window_pct"] - sb["window_pct"]) <= 5e-4 and abs(b["carry_pct"] - sb["carry_pct"]) <= 5e-4
    ok = fig["goals"]["throughput_ge_1M_per_s"]
    assert f"goal >= 1,000,000 samples/s: {'PASS' if ok else 'MISS'}" in p.stdout
    assert fig["state_dict"]["pickle_bytes"] > 0 and fig["rows"]["rows"] > 0


@pytest.mark.parametrize("command,full,quick", [
    ("algorithms", "2 min 19 s on 2 cores, peak memory 7.1 GB, TRL at 1,000,000 (measured ", "--quick (20,000 lengths, 2 repeats): about 25 s"),
    ("prepare", "Full default (100,000 synthetic chats, 1 run, plus the 4 real demo files, 3 repeats): about 10 "
                "minutes on 2 cores (estimated: ", "--quick (2,000 synthetic chats, 1 repeat): about 25 s"),
    ("stream", "about 20 s on 2 cores", "--quick (300,000 and 150,000, 2 repeats): about 10 s"),
])
def test_cli_bench_help_states_quick_full_duration_and_where_results_go(command, full, quick):
    r = CliRunner().invoke(_cli(), ["bench", command, "--help"], env={"COLUMNS": "120"})
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert full in text and quick in text
    assert "in --out (default ./bench_results)" in text


# --------------------------------------------------------------------------- second newcomer-tester round
@pytest.mark.parametrize("out_args", [["--out", ""], ["--out="], ["--out", "  "]])
@pytest.mark.parametrize("command", [["algorithms", "--sizes", "100", "--no-trl"],
                                     ["prepare", "--records", "5", "--no-trl"], ["stream", "--quick"]])
def test_cli_bench_empty_out_is_refused_not_the_current_folder(tmp_path, monkeypatch, command, out_args):
    calls = {c: _forbid(monkeypatch, f"seqpack.bench.{c}", f"run_{c}") for c in ("algorithms", "prepare", "stream")}
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(_cli(), ["bench", *command, *out_args])
    assert r.exit_code == 2, r.output
    line = _one_line_error(r)
    assert line.startswith("error: --out is empty (") and "--out bench_results" in line
    assert calls[command[0]] == [] and list(tmp_path.iterdir()) == []  # nothing run, nothing written here


def test_ensure_out_dir_refuses_empty_text(tmp_path):
    from seqpack.bench.timing import OutputDirError, ensure_out_dir

    for empty in ("", " "):
        with pytest.raises(OutputDirError, match=r"^out_dir is empty"):
            ensure_out_dir(empty, option="out_dir")
    assert ensure_out_dir(str(tmp_path / "ok")).is_dir()


def test_cli_bench_algorithms_prints_skipped_baselines_after_the_tables(tmp_path):
    r = CliRunner().invoke(_cli(), ["bench", "algorithms", "--sizes", "1500", "--repeats", "1", "--no-trl",
                                    "--max-bridge-n", "0", "--max-reference-n", "0", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "algorithms.json").read_text())
    skip_lines = [ln for ln in r.output.splitlines() if ln.startswith("skipped: ")]
    lf = f"llamafactory {ref.llamafactory_installed()} greedy_knapsack" if ref.llamafactory_installed() \
        else ref.LLAMAFACTORY_NAME
    assert f"skipped: {lf}, n=1,500: n > max_reference_n=0 (--max-reference-n; O(n^2) list.pop)" in skip_lines
    assert len(skip_lines) == len(data["skipped"]) >= 1  # every recorded skip is on the console
    bridge = ref.megatron_bridge_installed()
    for algo in ref.BRIDGE_ALGORITHMS if bridge else ():
        assert f"skipped: megatron-bridge {bridge} {algo}, n=1,500: n > max_bridge_n=0 (--max-bridge-n; " \
               "O(n * packs) first fit)" in skip_lines
    last_table_line = max(i for i, ln in enumerate(r.output.splitlines()) if ln.startswith("└"))
    assert min(i for i, ln in enumerate(r.output.splitlines()) if ln.startswith("skipped: ")) > last_table_line
    assert not any(lf in ln or "megatron" in ln for ln in r.output.splitlines() if ln.startswith("│"))


@pytest.mark.parametrize("option", ["--max-bridge-n", "--max-reference-n"])
def test_cli_bench_algorithms_negative_max_n_is_a_bad_option(tmp_path, monkeypatch, option):
    calls = _forbid(monkeypatch, "seqpack.bench.algorithms", "run_algorithms")
    r = CliRunner().invoke(_cli(), ["bench", "algorithms", "--sizes", "100", option, "-5", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert _one_line_error(r) == f"error: {option} must be >= 0 (0 = never run that baseline); got -5"
    assert calls == []
    help_text = " ".join(CliRunner().invoke(_cli(), ["bench", "algorithms", "--help"], env={"COLUMNS": "200"})
                         .output.split())
    assert "(>= 0; 0 = never run it)" in help_text


def test_run_algorithms_rejects_negative_max_n(tmp_path):
    from seqpack.bench.algorithms import run_algorithms

    with pytest.raises(ValueError, match=r"max_bridge_n must be >= 0"):
        run_algorithms([100], repeats=1, out_dir=tmp_path, trl=False, max_bridge_n=-1, log=lambda _m: None)


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
    (goal,) = data["goals"]
    assert goal["informational"] == "quick: informational" and data["quick"] is True
    tag = "PASS" if goal["pass"] else "MISS"
    assert f"{tag} (quick: informational)  fastchat/dummy_conversation.json: seqpack >= 2x" in output
    note = [ln for ln in output.splitlines() if ln.startswith("note: --quick verdicts are informational")]
    assert len(note) == 1 and "judged on the full run (`seqpack bench prepare`: 100,000 synthetic records" in note[0]


def test_run_algorithms_quick_verdicts_are_informational(tmp_path, capsys):
    from seqpack.bench.algorithms import QUICK_NOTE, run_algorithms

    data = run_algorithms([1500], repeats=1, out_dir=tmp_path, trl=False, max_bridge_n=0, quick=True,
                          log=lambda _m: None)
    out = capsys.readouterr().out
    assert data["goals"] and all(g["informational"] == "quick: informational" for g in data["goals"])
    assert "(quick: informational)  n=1,500: seqpack default packs <= LLaMA-Factory" in out
    assert QUICK_NOTE in out and "100,000 and 1,000,000 lengths" in QUICK_NOTE
    full = run_algorithms([1500], repeats=1, out_dir=tmp_path, trl=False, max_bridge_n=0, log=lambda _m: None)
    assert all("informational" not in g for g in full["goals"])


def test_stream_quick_labels_verdict_lines_informational(tmp_path, capsys):
    from seqpack.bench.stream import QUICK_NOTE, run_stream

    script = tmp_path / "fake.py"
    script.write_text("print('  goal >= 1,000,000 samples/s: MISS')\nprint('other line')\n")
    run_stream(quick=True, script=script, out_dir=tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["  goal >= 1,000,000 samples/s: MISS (quick: informational)", "other line"]
    assert QUICK_NOTE in out


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
    from seqpack.bench.prepare import PrepareDataError, trl_prepare_and_pack

    f = tmp_path / "x.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    with pytest.raises(PrepareDataError, match=r"TRL path could not read .*x\.jsonl"):
        trl_prepare_and_pack(f, qwen3_tokenizer, 256, tmp_path / "o.parquet")
    f.write_text('{"text": "no instruction, conversations or messages"}\n')
    with pytest.raises(PrepareDataError, match=r"record 0 of .*x\.jsonl"):
        trl_prepare_and_pack(f, qwen3_tokenizer, 256, tmp_path / "o.parquet")


@pytest.mark.parametrize("command,codes", [
    ("algorithms", "Exit codes: 2 bad option (before any work), otherwise 0"),
    ("prepare", "Exit codes: 2 bad option (--out, --shared-data, or a --seq-length that leaves nothing to pack), "
                "1 data error"),
    ("stream", "Exit codes: 2 bad --script/--out (before any work), otherwise bench_stream.py's own"),
])
def test_cli_bench_help_states_exit_codes(command, codes):
    r = CliRunner().invoke(_cli(), ["bench", command, "--help"], env={"COLUMNS": "200"})
    assert codes in " ".join(r.output.split())


def test_cli_bench_stream_script_folder_says_folder(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack.bench.stream", "run_stream")
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--script", str(tmp_path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    line = _one_line_error(r)
    assert line.startswith(f"error: --script {tmp_path}: this is a folder, not a file") and "file not found" not in line
    assert calls == []


def test_bar_chart_with_many_bars_is_horizontal_and_grows_in_height(tmp_path):
    from PIL import Image

    from seqpack.bench.timing import bar_chart

    def size(n):
        labels = [f"megatron-bridge 0.3.1 first_fit_shuffle, n={i:,}" for i in range(n)]
        p = bar_chart(tmp_path / f"b{n}.png", labels, [10.0 ** (i % 4) for i in range(n)], title="t", ylabel="s",
                      log=True, annotate=[str(i) for i in range(n)])
        with Image.open(p) as im:
            return im.size

    w8, h8 = size(8)
    w16, h16 = size(16)
    assert w16 == w8 and w16 < 1200  # width set by the labels, not by the number of bars
    assert h16 > h8 + 200 and h16 > 16 * 25  # about 0.3 inch (33 px) of height per bar
    w3, h3 = size(3)
    assert h3 == 440  # few bars: vertical columns as before (4 inches at 110 dpi)


@pytest.mark.skipif(not ref.trl_available(), reason="trl/datasets not importable")
def test_trl_conversion_renders_glaive_tool_calls_like_seqpack(shared_data, qwen3_tokenizer):
    # the TRL path must render function calls as <tool_call> blocks and tools as {"type": "function", ...}
    # schemas, as seqpack does: apart from empty think blocks, both sides give the same text
    from seqpack.bench.prepare import _read_records, _to_chatml, _trl_training_template
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
