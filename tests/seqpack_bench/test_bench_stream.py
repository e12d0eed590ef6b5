"""seqpack_bench.stream / bench_stream (`seqpack bench stream`): the recorded output and goals, the charts,
the figures the benchmark returns (tiny sizes; no speed is asserted here)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from _bench_cli import _cli, _forbid


def _fake_benchmark(monkeypatch, body):
    """Replace ``bench_stream.run_benchmark`` by ``body(quick, echo, figures)`` (run in-process, no sizes)."""
    from seqpack_bench import bench_stream

    calls = []

    def fake(*, quick=False, echo=None, figures=None, **kw):
        calls.append(quick)
        figures = {} if figures is None else figures
        body(quick, echo, figures)
        return figures

    monkeypatch.setattr(bench_stream, "run_benchmark", fake)
    return calls


def test_cli_bench_stream_has_no_script_option(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack_bench.stream", "run_stream")
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--script", str(tmp_path / "x.py"),
                                    "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and calls == []
    assert "--script" not in CliRunner().invoke(_cli(), ["bench", "stream", "--help"]).output


def test_stream_wrapper_records_output_and_goals(tmp_path, monkeypatch):
    from seqpack_bench.stream import BUILTIN_COMMAND, run_stream

    def body(quick, echo, figures):
        echo.line("table PASSED")
        echo.verdict("PASS  goal one: 3x", True)
        echo.verdict("MISS  goal two", False)
        echo.verdict("  goal: a: PASS; b: MISS", False)
        echo.verdict("summary: throughput PASS", True)
        echo.verdict("PASS  judged by the flag, not the word", False)
        if not quick:
            raise RuntimeError("the full run fails after its verdicts")

    calls = _fake_benchmark(monkeypatch, body)
    expected = [{"goal": "goal one: 3x", "pass": True}, {"goal": "goal two", "pass": False},
                {"goal": "goal: a: PASS; b: MISS", "pass": False}, {"goal": "summary: throughput PASS", "pass": True},
                {"goal": "judged by the flag, not the word", "pass": False}]
    res = run_stream(quick=True, out_dir=tmp_path, echo=False)
    assert res["returncode"] == 0 and res["quick"] is True and res["command"] == BUILTIN_COMMAND + " --quick"
    assert res["goals"] == [{**g, "informational": "quick: informational"} for g in expected]
    assert json.loads((tmp_path / "stream.json").read_text())["output"].startswith("table")
    full = run_stream(out_dir=tmp_path, echo=False)
    assert full["returncode"] == 1 and full["goals"] == expected  # the full run judges the goals; a raise is exit 1
    assert full["command"] == BUILTIN_COMMAND and calls == [True, False]


# the format seqpack_bench.bench_stream prints (copied from a --quick run)
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

# the figures bench_stream.run_benchmark returns for the run printed above
_STREAM_FIGURES = {
    "throughput": {"stream_numpy_source": 4_562_753.0, "stream_iterable": 4_609_135.0,
                   "offline_pack_lengths": 9_127_468.0},
    "efficiency": [
        {"mix": "lognormal", "capacity": 4096, "l1": 23511, "offline_pct": 0.0, "offline_bfd_pct": 0.004,
         "buffers": [{"buffer": 100, "window_pct": 3.364, "carry_pct": 0.383, "max_wait": 8},
                     {"buffer": 1000, "window_pct": 0.383, "carry_pct": 0.047, "max_wait": 8},
                     {"buffer": 10_000, "window_pct": 0.047, "carry_pct": 0.009, "max_wait": 8}]},
        {"mix": "bimodal", "capacity": 8192, "l1": 13270, "offline_pct": 0.0, "offline_bfd_pct": 0.0,
         "buffers": [{"buffer": 100, "window_pct": 5.697, "carry_pct": 2.065, "max_wait": 7},
                     {"buffer": 1000, "window_pct": 0.573, "carry_pct": 0.083, "max_wait": 8},
                     {"buffer": 10_000, "window_pct": 0.060, "carry_pct": 0.0, "max_wait": 8}]}],
}


def _print_output(echo):
    for line in _STREAM_OUTPUT.splitlines():
        echo.line(line)


def test_cli_bench_stream_writes_json_and_png(tmp_path, monkeypatch):
    import copy

    def body(quick, echo, figures):  # prints its text, returns its figures, then fails
        _print_output(echo)
        figures.update(copy.deepcopy(_STREAM_FIGURES))
        raise RuntimeError("after the sections")

    _fake_benchmark(monkeypatch, body)
    out = tmp_path / "out"
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--out", str(out)])
    assert r.exit_code == 1  # the benchmark raised: exit 1, the sections done are charted
    for png in ("stream_efficiency.png", "stream_throughput.png"):
        assert (out / png).stat().st_size > 5000, png
    data = json.loads((out / "stream.json").read_text())
    assert data["charts"] == ["stream_efficiency.png", "stream_throughput.png"] and data["charts_skipped"] == []
    assert data["efficiency"][0]["buffers"][1]["carry_pct"] == 0.047
    assert data["throughput"]["offline_pack_lengths"] == 9_127_468.0


def test_cli_bench_stream_without_figures_skips_charts_with_reason(tmp_path, monkeypatch):
    _fake_benchmark(monkeypatch, lambda quick, echo, figures: _print_output(echo))  # text, no figures
    out = tmp_path / "out"
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "stream.json").read_text())
    assert data["charts"] == [] and not (out / "stream_throughput.png").exists()
    assert [s.split(":")[0] for s in data["charts_skipped"]] == ["stream_efficiency.png", "stream_throughput.png"]
    assert "note: chart not written: stream_throughput.png: no throughput figures" in r.output


_RATE_LABELS = {"stream_numpy_source": "map-style numpy source", "stream_iterable": "plain iterable of ints",
                "offline_pack_lengths": "offline pack_lengths"}


def test_bench_stream_script_json_matches_its_printed_figures(tmp_path):
    import subprocess

    from seqpack_bench._child import child_env, module_command

    path = tmp_path / "sub" / "fig.json"
    cmd = module_command("seqpack_bench.bench_stream", "--quick", "--n", "3000", "--repeats", "1", "--efficiency-n",
                         "3000", "--json", str(path))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr[-2000:]
    fig, lines = json.loads(path.read_text()), p.stdout.splitlines()
    assert fig["sizes"] == {"throughput_n": 3000, "repeats": 1, "efficiency_n": 3000, "rows_n": 20_000}
    assert set(fig["throughput"]) == {*_RATE_LABELS, "algorithm_share"}
    for key, label in _RATE_LABELS.items():  # printed as whole samples/s
        shown = [ln for ln in lines if ln.split(":")[0].strip() == label]
        assert len(shown) == 1 and f"{fig['throughput'][key]:,.0f} samples/s" in shown[0], key
    assert 0 < fig["throughput"]["algorithm_share"] < 1
    assert [(e["mix"], e["capacity"]) for e in fig["efficiency"]] == [
        ("lognormal", 4096), ("lognormal", 8192), ("bimodal", 4096), ("bimodal", 8192)]
    for got in fig["efficiency"]:  # one printed row per entry, percentages with 3 decimals
        rows = [ln for ln in lines if ln.split()[:3] == [got["mix"], str(got["capacity"]), str(got["l1"])]]
        assert len(rows) == 1, got["mix"]
        assert [b["buffer"] for b in got["buffers"]] == [100, 1000, 10_000]
        cells = [c.split() for c in rows[0].split("|")[1:]]
        assert cells == [[f"{b['window_pct']:.3f}", f"{b['carry_pct']:.3f}", str(b["max_wait"])]
                         for b in got["buffers"]]
    ok = fig["goals"]["throughput_ge_1M_per_s"]
    assert f"goal >= 1,000,000 samples/s: {'PASS' if ok else 'MISS'}" in p.stdout
    assert fig["state_dict"]["pickle_bytes"] > 0 and fig["rows"]["rows"] > 0


def test_stream_quick_labels_verdict_lines_informational(tmp_path, capsys, monkeypatch):
    from seqpack_bench.stream import QUICK_NOTE, run_stream

    def body(quick, echo, figures):
        echo.verdict("  goal >= 1,000,000 samples/s: MISS", False)
        echo.line("other line")

    _fake_benchmark(monkeypatch, body)
    run_stream(quick=True, out_dir=tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["  goal >= 1,000,000 samples/s: MISS (quick: informational)", "other line"]
    assert QUICK_NOTE in out
