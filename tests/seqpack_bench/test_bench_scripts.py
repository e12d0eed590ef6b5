"""Argument checks of the standalone benchmarks ``python -m seqpack_bench.bench_<name>`` (bad values exit 2
before any work, naming
the option; an explicit size is never replaced by --quick) and bench_balance's cost-bound wording.

No benchmark is run at its real size: the argument errors exit while parsing, and the few runs here use
a handful of items."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from seqpack_bench._child import child_env, module_command

# (script, argv, option the message must name); argparse scripts, one line "<script>: error: argument <opt>: ..."
ARGPARSE_CASES = [
    ("bench_algorithms.py", ["--n", "0"], "--n"),
    ("bench_algorithms.py", ["--n", "-5"], "--n"),
    ("bench_algorithms.py", ["--n", "1.5"], "--n"),
    ("bench_algorithms.py", ["--repeats", "0"], "--repeats"),
    ("bench_algorithms.py", ["--algorithms", "foo"], "--algorithms"),
    ("bench_algorithms.py", ["--algorithms", "balanced_best_fit,,first_fit_decreasing"], "--algorithms"),
    ("bench_algorithms.py", ["--instances", "foo"], "--instances"),
    ("bench_algorithms.py", ["--instances", "lognormal,nope"], "--instances"),
    ("bench_balance.py", ["--dp", "0"], "--dp"),
    ("bench_balance.py", ["--micro-batches", "1", "0"], "--micro-batches"),
    ("bench_balance.py", ["--capacity", "-1"], "--capacity"),
    ("bench_balance.py", ["--samples", "0"], "--samples"),
    ("bench_balance.py", ["--repeats", "0"], "--repeats"),
    ("bench_collate.py", ["--repeats", "0"], "--repeats"),
    ("bench_collate.py", ["--repeats", "x"], "--repeats"),
    ("bench_scale.py", ["--quick", "--no-ray", "--records", "0"], "--records"),
    ("bench_scale.py", ["--lengths", "-1"], "--lengths"),
    ("bench_scale.py", ["--shard-records", "0"], "--shard-records"),
    ("bench_scale.py", ["--growth", "--no-growth"], "--no-growth"),
    ("bench_scale.py", ["--records", "2", "--no-ray"], "--records"),  # growth runs need a quarter-size corpus
    ("bench_scale.py", ["--quick", "--growth", "--records", "3"], "--records"),
    ("bench_scale.py", ["--stage", "planner", "--repeats", "0"], "--repeats"),
    ("bench_stream.py", ["--n", "-5"], "--n"),
    ("bench_stream.py", ["--repeats", "0"], "--repeats"),
]

# bench_compare.py is a wrapper around the typer CLI (`seqpack bench ...`, `seqpack train ...`)
COMPARE_CASES = [
    (["bench", "algorithms", "--repeats", "0"], "--repeats"),
    (["bench", "algorithms", "--sizes", "0"], "--sizes"),
    (["bench", "prepare", "--seq-length", "0"], "--seq-length"),
    (["train", "--steps", "0"], "--steps"),
]


def _run(script: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m seqpack_bench.<script without .py> <argv>`` (argparse names itself ``<script>``)."""
    return subprocess.run(module_command(f"seqpack_bench.{script.removesuffix('.py')}", *argv), capture_output=True,
                          text=True, timeout=timeout, env=child_env())


@pytest.fixture(scope="module")
def bad_arg_results():
    """All bad-argument runs at once (each is interpreter start + imports + argparse)."""
    jobs = [(s, a) for s, a, _ in ARGPARSE_CASES] + [("bench_compare.py", a) for a, _ in COMPARE_CASES]
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = list(pool.map(lambda j: _run(*j), jobs))
    return {(s, tuple(a)): p for (s, a), p in zip(jobs, procs)}


@pytest.mark.parametrize("script,argv,option", ARGPARSE_CASES,
                         ids=[f"{s[:-3]}:{' '.join(a)}" for s, a, _ in ARGPARSE_CASES])
def test_bad_argument_exits_2_naming_the_option(bad_arg_results, script, argv, option):
    p = bad_arg_results[(script, tuple(argv))]
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-500:])
    assert p.stdout == ""  # nothing ran
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script}: error: argument {option}"), p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("argv,option", COMPARE_CASES, ids=[" ".join(a) for a, _ in COMPARE_CASES])
def test_bench_compare_bad_argument_exits_2(bad_arg_results, argv, option):
    p = bad_arg_results[("bench_compare.py", tuple(argv))]
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-500:])
    assert option in p.stderr and "Traceback" not in p.stderr


def test_bench_algorithms_explicit_n_wins_over_quick():
    # before: --quick replaced n by 100,000 unless n was exactly the default
    p = _run("bench_algorithms.py", ["--quick", "--n", "7", "--algorithms", "balanced_best_fit",
                                     "--instances", "lognormal,uniform,lognormal", "--no-trl", "--repeats", "1"])
    assert p.returncode == 0, p.stderr
    heads = [ln for ln in p.stdout.splitlines() if ln.startswith("== ") and "targets" not in ln]
    assert [h.split(":")[0] for h in heads] == ["== lognormal", "== uniform"]  # order kept, duplicate dropped
    assert all("n=7 " in h for h in heads)


def test_bench_scale_explicit_lengths_win_over_quick(tmp_path):
    # the planner stage alone (what bench_scale runs in a subprocess); --quick must not force 1,000,000 lengths
    out = tmp_path / "planner.json"
    p = _run("bench_scale.py", ["--stage", "planner", "--quick", "--lengths", "50", "--repeats", "1",
                                "--result", str(out)])
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["n"] == 50 and res["length_array_bytes"] == 50 * 8 and len(res["times"]) == 1


def _argtypes():
    return importlib.import_module("seqpack_bench._argtypes")


def test_argtypes_helpers():
    m = _argtypes()
    assert m.positive_int("1_000") == 1000 and m.int_at_least(0)("0") == 0
    for bad in ("0", "-1", "2.0", "", "0x10"):
        with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
            m.positive_int(bad)
    pick = m.comma_choices(["a", "b", "c"])
    assert pick("all") is None and pick("c, a,c") == ["c", "a"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown name.*'x'.*a, b, c"):
        pick("a,x")
    with pytest.raises(argparse.ArgumentTypeError, match="empty entry"):
        pick("a,")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown name.*'all'"):
        m.comma_choices(["a"], allow_all=False)("all")


@pytest.fixture(scope="module")
def bench_balance():
    return importlib.import_module("seqpack_bench.bench_balance")


def test_bench_balance_prints_trivial_bound_as_1_not_below(bench_balance, capsys):
    # cost_ratio_lower_bound returns 0.67 here (real SFT files at mb=4 gave "cost lower bound 0.6710"
    # for a max/mean ratio, which is never below 1)
    from seqpack.parallel.balance import cost_ratio_lower_bound

    lens = bench_balance.lognormal_mix(300, 4096)
    assert cost_ratio_lower_bound(lens, 4096, 2, 4) < 1.0
    (v,) = bench_balance.run("mix", lens, 4096, 2, [4], 1)
    assert "cost lower bound 1 (trivial" in v and "cost lower bound 0." not in v
    capsys.readouterr()


def test_bench_balance_bound_above_1_without_remainder_step(bench_balance, capsys):
    lens = np.array([100] + [10] * 70)  # 8 packs, dp 2 x mb 2: two full steps, no remainder
    (v,) = bench_balance.run("one long", lens, 100, 2, [2], 1)
    assert "cost lower bound 1.6667 > 1.05: goal unreachable for these lengths" in v
    assert "cost max/mean <= 1.05 MISS" in v
    capsys.readouterr()


def test_bench_balance_bound_with_a_remainder_step_is_not_claimed_for_full_steps(bench_balance, capsys):
    # the longest sample (19) lands in the remainder step (judged apart): the worst FULL step is 1.016,
    # below cost_ratio_lower_bound = 1.2053, so "goal unreachable" would be false here
    lens = np.array([19, 1, 3, 8, 1, 7, 2, 6, 6, 6, 3, 6, 8, 3, 7, 6, 3])
    (v,) = bench_balance.run("remainder", lens, 32, 2, [1], 1)
    assert "cost lower bound 1.2053 for the step holding the longest sample > 1.05: goal met only if that is " \
           "the remainder step" in v
    assert "unreachable" not in v
    capsys.readouterr()
