"""seqpack_bench.algorithms (`seqpack bench algorithms`) in a tiny mode: it runs, its JSON has the right keys
and sane values (no speed is asserted here)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seqpack_bench import references as ref

from _bench_cli import _cli, _forbid, _one_line_error


def test_bench_algorithms_tiny(tmp_path):
    from seqpack_bench.algorithms import run_algorithms

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


def test_cli_bench_algorithms_and_bad_sizes(tmp_path):
    app = _cli()
    r = CliRunner().invoke(app, ["bench", "algorithms", "--sizes", "2000", "--repeats", "1", "--no-trl",
                                 "--mixes", "none", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "seqpack balanced_best_fit" in r.output and (tmp_path / "algorithms.json").is_file()
    bad = CliRunner().invoke(app, ["bench", "algorithms", "--sizes", "ten", "--out", str(tmp_path)])
    assert bad.exit_code == 2


def test_run_functions_check_out_dir_before_work(tmp_path):
    from seqpack_bench.algorithms import run_algorithms
    from seqpack_bench.timing import OutputDirError

    (tmp_path / "f").write_text("")
    logged = []
    with pytest.raises(OutputDirError, match="out_dir"):
        run_algorithms([100], repeats=1, out_dir=tmp_path / "f" / "out", trl=False, log=logged.append)
    assert logged == []


@pytest.mark.skipif(not ref.trl_available(), reason="trl/datasets not importable")
def test_algorithms_marks_trl_wrapped_as_cutting_samples_in_table_and_png(tmp_path, monkeypatch):
    import seqpack_bench.algorithms as alg

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


def test_cli_bench_algorithms_prints_skipped_baselines_after_the_tables(tmp_path):
    r = CliRunner().invoke(_cli(), ["bench", "algorithms", "--sizes", "1500", "--repeats", "1", "--no-trl",
                                    "--max-bridge-n", "0", "--max-reference-n", "0", "--mixes", "none",
                                    "--out", str(tmp_path)])
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
    calls = _forbid(monkeypatch, "seqpack_bench.algorithms", "run_algorithms")
    r = CliRunner().invoke(_cli(), ["bench", "algorithms", "--sizes", "100", option, "-5", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert _one_line_error(r) == f"error: {option} must be >= 0 (0 = never run that baseline); got -5"
    assert calls == []
    help_text = " ".join(CliRunner().invoke(_cli(), ["bench", "algorithms", "--help"], env={"COLUMNS": "200"})
                         .output.split())
    assert "(>= 0; 0 = never run it)" in help_text


def test_run_algorithms_rejects_negative_max_n(tmp_path):
    from seqpack_bench.algorithms import run_algorithms

    with pytest.raises(ValueError, match=r"max_bridge_n must be >= 0"):
        run_algorithms([100], repeats=1, out_dir=tmp_path, trl=False, max_bridge_n=-1, log=lambda _m: None)


def test_run_algorithms_quick_verdicts_are_informational(tmp_path, capsys):
    from seqpack_bench.algorithms import QUICK_NOTE, run_algorithms

    data = run_algorithms([1500], repeats=1, out_dir=tmp_path, trl=False, max_bridge_n=0, quick=True,
                          log=lambda _m: None)
    out = capsys.readouterr().out
    assert data["goals"] and all(g["informational"] == "quick: informational" for g in data["goals"])
    assert "(quick: informational)  n=1,500: seqpack default packs <= LLaMA-Factory" in out
    assert QUICK_NOTE in out and "100,000 and 1,000,000 lengths" in QUICK_NOTE
    full = run_algorithms([1500], repeats=1, out_dir=tmp_path, trl=False, max_bridge_n=0, log=lambda _m: None)
    assert all("informational" not in g for g in full["goals"])


class _FakePacker:
    """A stand-in for ``seqpacker.Packer``: next fit in input order, flat output like ``pack_flat``;
    strategy ``"lose"`` drops the last index, ``"over"`` puts everything in one pack."""

    def __init__(self, capacity, strategy="obfd", seed=None):
        self.capacity, self.strategy = capacity, strategy

    def pack_flat(self, lengths):
        import numpy as np

        items, offsets, load = list(range(len(lengths))), [], 0
        for i, n in enumerate(lengths):
            if load + int(n) > self.capacity:
                offsets.append(i)
                load = 0
            load += int(n)
        if self.strategy == "lose":
            items, offsets = items[:-1], [o for o in offsets if o < len(items) - 1]
        if self.strategy == "over":
            offsets = []
        return np.array(items, np.int64), np.array(offsets, np.int64)


def _fake_seqpacker(monkeypatch, strategies):
    import sys
    import types

    mod = types.ModuleType("seqpacker")
    mod.__version__, mod.Packer = "0.0.fake", _FakePacker
    monkeypatch.setitem(sys.modules, "seqpacker", mod)
    monkeypatch.setattr(ref, "SEQPACKER_STRATEGIES", strategies)


def test_algorithms_without_seqpacker_records_one_skip_line(tmp_path, monkeypatch, capsys):
    import sys

    from seqpack_bench.algorithms import run_algorithms

    monkeypatch.setitem(sys.modules, "seqpacker", None)  # `import seqpacker` raises ImportError
    assert ref.seqpacker_module() is None
    data = run_algorithms([1500], repeats=1, out_dir=tmp_path, trl=False, max_reference_n=0, max_bridge_n=0,
                          log=lambda _m: None)
    lines = capsys.readouterr().out.splitlines()
    skip = "skipped: seqpacker, every n: not installed (bash ../shared/tools/install-seqpacker.sh)"
    assert lines.count(skip) == 1
    assert {"program": "seqpacker", "n": None, "reason": f"not installed ({ref.SEQPACKER_INSTALL})"} in data["skipped"]
    assert not any(r["program"].startswith("seqpacker") for r in data["results"]) and data["refused"] == []
    assert not any("seqpacker" in g["goal"] for g in data["goals"])
    assert "seqpack balanced_best_fit (default)" in {r["program"] for r in data["results"]}


def test_algorithms_with_a_fake_seqpacker_checks_and_refuses(tmp_path, monkeypatch, capsys):
    from seqpack_bench.algorithms import lognormal_lengths, run_algorithms

    _fake_seqpacker(monkeypatch, ("nf", "lose", "over", "hk"))
    data = run_algorithms([1500], repeats=2, out_dir=tmp_path, trl=False, max_reference_n=0, max_bridge_n=0,
                          max_seqpacker_hk_n=1000, log=lambda _m: None)
    out = capsys.readouterr().out
    rows = {r["program"]: r for r in data["results"]}
    nf = rows["seqpacker 0.0.fake nf"]
    x = lognormal_lengths(1500)
    _items, offsets = _FakePacker(4096).pack_flat(x)
    assert nf["bins"] == len(offsets) + 1 and nf["repeats"] == 2 and nf["lower_bound_l2"] <= nf["bins"]
    assert nf["utilization"] == pytest.approx(x.sum() / (nf["bins"] * 4096), abs=1e-6)
    assert not any(p.endswith((" lose", " over", " hk")) for p in rows)
    refused = {r["program"]: r["reason"] for r in data["refused"]}
    assert set(refused) == {"seqpacker 0.0.fake lose", "seqpacker 0.0.fake over"}
    assert refused["seqpacker 0.0.fake lose"].startswith("index 1499 packed 0 times")
    assert "tokens > capacity 4096" in refused["seqpacker 0.0.fake over"]
    assert "refused: seqpacker 0.0.fake lose, n=1,500: index 1499 packed 0 times" in out
    assert "skipped: seqpacker 0.0.fake hk, n=1,500: n > max_seqpacker_hk_n=1,000" in out
    base = rows["seqpack balanced_best_fit (default)"]
    goals = {g["goal"]: g for g in data["goals"] if "seqpacker" in g["goal"]}
    assert len(goals) == 2
    fewest = goals["n=1,500: seqpack default packs <= seqpacker's fewest packs"]
    assert fewest["pass"] == (base["bins"] <= nf["bins"]) and f"vs {nf['bins']} (seqpacker 0.0.fake nf)" in fewest["info"]
    speed = next(g for k, g in goals.items() if "2x faster" in k)
    if nf["bins"] <= base["bins"]:
        assert "seqpacker 0.0.fake nf" in speed["info"] and "x (" in speed["info"]
    else:  # next fit needs more packs than seqpack: nothing of equal packs to compare with
        assert speed["pass"] and "no seqpacker strategy reaches" in speed["info"]


def test_check_flat_bins_accepts_a_packing_and_names_the_fault():
    import re

    import numpy as np

    x = np.array([5, 5, 3, 7, 2])
    assert ref.check_flat_bins([3, 2, 0, 1, 4], [2, 4], x, 10, program="p").tolist() == [10, 10, 2]
    for items, offsets, fault in (([3, 2, 0, 1], [2], "index 4 packed 0 times"),
                                  ([3, 2, 0, 1, 1], [2, 4], "index 1 packed 2 times"),
                                  ([3, 2, 0, 1, 9], [2, 4], "index 9 is outside [0, 5)"),
                                  ([3, 2, 0, 1, 4], [2, 2], "an empty pack"),
                                  ([3, 2, 0, 1, 4], [1], "pack 1 holds 15 tokens > capacity 10")):
        with pytest.raises(ref.PeerResultError, match="^peer X: result refused: " + re.escape(fault)):
            ref.check_flat_bins(items, offsets, x, 10, program="peer X")


def test_planner_mixes_rows_and_seven_verdicts_per_mix(capsys):
    import numpy as np

    from seqpack_bench.algorithms_mixes import MIX_NAMES, mix, run_mixes

    x, cap = mix("lognormal 0.5@4096", 5000)
    assert cap == 4096 and x.min() >= 8 and x.max() <= 4096 and np.array_equal(x, mix("lognormal 0.5@4096", 5000)[0])
    assert [mix(m, 300)[0].size for m in MIX_NAMES] == [300] * len(MIX_NAMES)
    names = ("halves_thirds", "ffd_11_9")
    out = run_mixes(3000, 6000, repeats=1, names=names, log=lambda _m: None)
    assert {r["mix"] for r in out["rows"]} == set(names)
    base = [r for r in out["rows"] if r["program"] == "seqpack default"]
    assert [r["n"] for r in base] == [3000, 6000, 3000, 6000]
    for r in base:
        assert r["bins"] > 0 and r["load_spread"] >= 0 and r["ns_per_item"] > 0
    assert len(out["goals"]) == 7 * len(names)
    assert any(g["goal"] == "ffd_11_9: packs <= L2 + 0.05 %" and g["pass"] for g in out["goals"])
    printed = capsys.readouterr().out
    assert "halves_thirds: linear in n" in printed and ("PASS" in printed or "MISS" in printed)
    with pytest.raises(ValueError, match="unknown mix 'nope'"):
        run_mixes(10, 0, names=("nope",))


def test_cli_bench_algorithms_refuses_unknown_mix(tmp_path):
    res = CliRunner().invoke(_cli(), ["bench", "algorithms", "--mixes", "lognormal 0.5@4096,bogus",
                                      "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "unknown mix 'bogus'" in _one_line_error(res)
