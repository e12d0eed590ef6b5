"""`seqpack bench balance` (seqpack_bench.bench_balance.run_grid): the rows, goals and JSON it produces, and
the command's options (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from _bench_cli import _cli, _forbid, _one_line_error


def test_run_grid_rows_goals_and_json(tmp_path, capsys):
    from seqpack_bench.bench_balance import issue_lengths, run_grid

    res = run_grid([300, 500], [1, 2], dp=2, capacity=1024, repeats=1, seed=3, out_dir=tmp_path)
    out = capsys.readouterr().out
    rows = res["rows"]
    assert [(r["samples"], r["micro_batches"]) for r in rows] == [(300, 1), (300, 2), (500, 1), (500, 2)]
    for r in rows:
        assert r["dp"] == 2 and r["capacity"] == 1024 and r["over_cap"] == 0
        assert r["cpu_s"] >= 0 and r["wall_s"] > 0 and r["steps"] >= 1
        assert 0 <= r["token_spread_mean"] <= r["token_spread_worst"] and r["cost_ratio_worst"] >= 1.0
    # three goals per row, each judged on that row's figures
    assert len(res["goals"]) == 3 * len(rows)
    for r, (t, sp, oc) in zip(rows, zip(*[iter(res["goals"])] * 3)):
        assert t["pass"] == (r["cpu_s"] <= 1.0) and sp["pass"] == (r["token_spread_worst"] <= 1e-3)
        assert oc["pass"] and "over the cap" in oc["goal"]
    assert out.count("PASS") + out.count("MISS") == len(res["goals"])
    saved = json.loads((tmp_path / "balance.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(rows)) and saved["distribution"].startswith("exp(N(6.2, 0.9))")
    lens = issue_lengths(1000, 1024, seed=3)
    assert lens.dtype == np.int64 and lens.min() >= 8 and lens.max() <= 1024


def test_quick_marks_verdicts_informational(tmp_path):
    from seqpack_bench.bench_balance import run_grid

    res = run_grid([200], [1], dp=2, capacity=512, repeats=1, quick=True)
    assert res["quick"] and all(g.get("informational") == "quick: informational" for g in res["goals"])


def test_cli_bench_balance_passes_options_and_quick_sizes(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack_bench.bench_balance", "run_grid")
    r = CliRunner().invoke(_cli(), ["bench", "balance", "--sizes", "1000,2000", "--micro-batches", "1,4", "--dp", "4",
                                    "--repeats", "2", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    (args, kw), = calls
    assert args == ([1000, 2000], [1, 4]) and kw["dp"] == 4 and kw["repeats"] == 2 and not kw["quick"]
    calls.clear()
    r = CliRunner().invoke(_cli(), ["bench", "balance", "--quick", "--out", str(tmp_path / "q")])
    assert r.exit_code == 0, r.output
    (args, kw), = calls
    assert args[0] == [2000, 10000] and kw["repeats"] == 1 and kw["quick"]


def test_cli_bench_balance_bad_option_fails_before_any_work(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack_bench.bench_balance", "run_grid")
    r = CliRunner().invoke(_cli(), ["bench", "balance", "--sizes", "10,x", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and calls == []
    assert _one_line_error(r).startswith("error: --sizes must be a comma list of integers")
    r = CliRunner().invoke(_cli(), ["bench", "balance", "--help"], env={"COLUMNS": "120"})
    text = " ".join(r.output.split())
    assert "--quick (2,000 and 10,000 samples, 1 repeat)" in text and "in --out (default ./bench_results)" in text
