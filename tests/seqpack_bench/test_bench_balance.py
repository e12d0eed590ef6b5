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
    # one verdict line per goal, plus one per seed (PASS only when all its rows' goals pass)
    assert out.count("PASS") + out.count("MISS") == len(res["goals"]) + 1
    (ps,) = res["per_seed"]
    assert ps["seed"] == 3 and ps["pass"] == all(g["pass"] for g in res["goals"]) and r["seed"] == 3
    saved = json.loads((tmp_path / "balance.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(rows)) and saved["distribution"].startswith("exp(N(6.2, 0.9))")
    lens = issue_lengths(1000, 1024, seed=3)
    assert lens.dtype == np.int64 and lens.min() >= 8 and lens.max() <= 1024


def test_run_grid_several_seeds(capsys):
    from seqpack_bench.bench_balance import run_grid

    res = run_grid([300], [1], dp=2, capacity=1024, repeats=1, seed=[0, 5])
    out = capsys.readouterr().out
    assert [r["seed"] for r in res["rows"]] == [0, 5] and res["seeds"] == [0, 5]
    assert [p["seed"] for p in res["per_seed"]] == [0, 5] and "seed 5: every goal of its rows" in out
    for p, goals in zip(res["per_seed"], (res["goals"][:3], res["goals"][3:])):
        assert p["pass"] == all(g["pass"] for g in goals) and all("seed " + str(p["seed"]) in g["goal"] for g in goals)


def test_quick_marks_verdicts_informational(tmp_path):
    from seqpack_bench.bench_balance import run_grid

    res = run_grid([200], [1], dp=2, capacity=512, repeats=1, quick=True)
    assert res["quick"] and all(g.get("informational") == "quick: informational" for g in res["goals"])


def test_cli_bench_balance_passes_options_and_quick_sizes(tmp_path, monkeypatch):
    calls = _forbid(monkeypatch, "seqpack_bench.bench_balance", "run_grid")
    r = CliRunner().invoke(_cli(), ["bench", "balance", "--sizes", "1000,2000", "--micro-batches", "1,4", "--dp", "4",
                                    "--repeats", "2", "--seed", "0,3", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    (args, kw), = calls
    assert args == ([1000, 2000], [1, 4]) and kw["dp"] == 4 and kw["repeats"] == 2 and not kw["quick"]
    assert kw["seed"] == [0, 3]
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
    r = CliRunner().invoke(_cli(), ["bench", "balance", "--seed", "0,-1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and calls == []
    assert _one_line_error(r).startswith("error: --seed must be a comma list of integers >= 0")
    r = CliRunner().invoke(_cli(), ["bench", "balance", "--help"], env={"COLUMNS": "120"})
    text = " ".join(r.output.split())
    assert "--quick (2,000 and 10,000 samples, 1 repeat)" in text and "in --out (default ./bench_results)" in text
