"""`seqpack bench ...` through the seqpack.cli entry points: option errors before any work, help texts,
and the bench_compare wrapper."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from _bench_cli import _cli, _forbid, _one_line_error


def test_bench_compare_wrapper_runs_quick(tmp_path):
    import subprocess

    from seqpack_bench._child import child_env, module_command

    cmd = module_command("seqpack_bench.bench_compare", "bench", "algorithms", "--sizes", "1000", "--repeats", "1",
                         "--no-trl", "--mixes", "none", "--out", str(tmp_path))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((tmp_path / "algorithms.json").read_text())["sizes"] == [1000]


@pytest.mark.parametrize("command", [["algorithms", "--quick"], ["prepare", "--records", "5", "--no-trl"],
                                     ["stream", "--quick"]])
def test_cli_bench_unwritable_out_fails_in_one_line_before_any_work(tmp_path, monkeypatch, command):
    calls = {c: _forbid(monkeypatch, f"seqpack_bench.{c}", f"run_{c}") for c in ("algorithms", "prepare", "stream")}
    blocker = tmp_path / "passwd"
    blocker.write_text("root:x:0:0\n")
    r = CliRunner().invoke(_cli(), ["bench", *command, "--out", str(blocker / "x")])
    assert r.exit_code == 2
    line = _one_line_error(r)
    assert line.startswith(f"error: --out {blocker / 'x'}: cannot create this folder") and "passwd is a file" in line
    assert calls[command[0]] == []  # nothing measured before the error


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


@pytest.mark.parametrize("out_args", [["--out", ""], ["--out="], ["--out", "  "]])
@pytest.mark.parametrize("command", [["algorithms", "--sizes", "100", "--no-trl"],
                                     ["prepare", "--records", "5", "--no-trl"], ["stream", "--quick"]])
def test_cli_bench_empty_out_is_refused_not_the_current_folder(tmp_path, monkeypatch, command, out_args):
    calls = {c: _forbid(monkeypatch, f"seqpack_bench.{c}", f"run_{c}") for c in ("algorithms", "prepare", "stream")}
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(_cli(), ["bench", *command, *out_args])
    assert r.exit_code == 2, r.output
    line = _one_line_error(r)
    assert line.startswith("error: --out is empty (") and "--out bench_results" in line
    assert calls[command[0]] == [] and list(tmp_path.iterdir()) == []  # nothing run, nothing written here


@pytest.mark.parametrize("command,codes", [
    ("algorithms", "Exit codes: 2 bad option (before any work), otherwise 0"),
    ("prepare", "Exit codes: 2 bad option (--out, --shared-data, or a --seq-length that leaves nothing to pack), "
                "1 data error"),
    ("stream", ("Exit codes: 2 bad --out (before any work), 1 the benchmark failed, otherwise 0 "
                "(MISS verdicts included).")),
])
def test_cli_bench_help_states_exit_codes(command, codes):
    r = CliRunner().invoke(_cli(), ["bench", command, "--help"], env={"COLUMNS": "200"})
    assert codes in " ".join(r.output.split())
