"""seqpack_bench.stream / bench_stream (`seqpack bench stream`): the recorded output and goals, the charts,
the figures the benchmark returns (tiny sizes; no speed is asserted here)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from _bench_cli import _cli, _forbid, _one_line_error


def test_cli_bench_stream_missing_script_names_the_option(tmp_path):
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--script", str(tmp_path / "nope.py"),
                                    "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert f"--script {tmp_path / 'nope.py'}: file not found" in r.output
    assert "script=PATH" not in r.output and "Traceback" not in r.output


def test_stream_wrapper_records_output_and_goals(tmp_path):
    from seqpack_bench.stream import run_stream

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

def test_parse_stream_output_reads_throughput_and_efficiency():
    from seqpack_bench.stream import parse_stream_output

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
    from seqpack_bench.stream import parse_stream_output

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

    from seqpack_bench._child import child_env, module_command
    from seqpack_bench.stream import parse_stream_output

    path = tmp_path / "sub" / "fig.json"
    cmd = module_command("seqpack_bench.bench_stream", "--quick", "--n", "3000", "--repeats", "1", "--efficiency-n",
                         "3000", "--json", str(path))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())
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


def test_stream_quick_labels_verdict_lines_informational(tmp_path, capsys):
    from seqpack_bench.stream import QUICK_NOTE, run_stream

    script = tmp_path / "fake.py"
    script.write_text("print('  goal >= 1,000,000 samples/s: MISS')\nprint('other line')\n")
    run_stream(quick=True, script=script, out_dir=tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["  goal >= 1,000,000 samples/s: MISS (quick: informational)", "other line"]
    assert QUICK_NOTE in out


def test_cli_bench_stream_script_folder_says_folder(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack_bench.stream", "run_stream")
    r = CliRunner().invoke(_cli(), ["bench", "stream", "--script", str(tmp_path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    line = _one_line_error(r)
    assert line.startswith(f"error: --script {tmp_path}: this is a folder, not a file") and "file not found" not in line
    assert calls == []
