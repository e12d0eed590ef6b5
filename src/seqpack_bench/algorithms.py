"""``seqpack bench algorithms``: seqpack's packing algorithms against existing packers.

Compared on the same lengths (lognormal SFT mix: median 250 tokens, sigma 1, clipped to
[1, capacity]; capacity 4096), in one process:

- seqpack ``balanced_best_fit`` (the default), ``best_fit_decreasing`` and ``greedy_knapsack``
  (``seqpack.algorithms.pack_lengths``, numba kernels, bin index lists included);
- TRL ``pack_dataset`` with ``strategy="bfd"`` and ``"wrapped"`` (see :mod:`seqpack_bench.references`);
- LLaMA-Factory 0.9.5 ``greedy_knapsack``, the installed function (its reference re-implementation
  when ``llamafactory`` is not installed; pure Python; skipped above ``max_reference_n`` items because
  ``list.pop`` makes it O(n^2) in the worst case; a skip is recorded);
- Megatron-Bridge 0.3.1 ``create_packing_strategy`` with ``first_fit_decreasing`` and
  ``first_fit_shuffle`` (its default), installed; pure Python and O(n * packs), so skipped above
  ``max_bridge_n`` items (a skip is recorded). NeMo 2 ships the same code;
- seqpacker 0.1.3 (Rust) when ``import seqpacker`` works (a benchmark peer only: installed by
  ``bash ../shared/tools/install-seqpacker.sh``, otherwise one skip is recorded): every strategy of
  ``seqpacker.Packer(...).pack_flat``, timed round-robin with seqpack's algorithms (one run of each per
  round), each result checked (every index exactly once, no pack over capacity) or refused, ``hk``
  skipped above ``max_seqpacker_hk_n`` items. Per size a verdict compares seqpack's default with the
  fastest seqpacker strategy of equal or fewer packs (PASS at >= 2x, CPU seconds).

The PyPI baselines other than TRL install with
``pip install --no-deps llamafactory==0.9.5 megatron-bridge==0.3.1`` (see
:mod:`seqpack_bench.references`); a missing one is listed in ``skipped``, never silently dropped.

Reported per program and size: packs (bins), the L1 bound ``ceil(sum/C)`` and the Martello-Toth L2
bound, excess over L2 in %, utilization (tokens / (bins * C)), load spread (max - min pack load,
tokens), median wall and CPU seconds of ``repeats`` runs, and the time ratio to seqpack's default.
TRL ``wrapped`` cuts samples in the middle (flagged ``breaks_samples`` in the JSON, shown as
"trl pack_dataset wrapped (cuts samples)" in the table and in orange with that label in the PNGs): it is
not a packing result; it concatenates per ``Dataset.map`` batch (1,000 rows), so each batch leaves one
partial chunk and its count sits slightly above L1.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.algorithms import DEFAULT_ALGORITHM, PackingAlgorithm, lower_bound_l1, lower_bound_l2, pack_lengths
from seqpack_bench import references as ref
from seqpack_bench.algorithms_mixes import run_mixes, seqpacker_speed_verdict
from seqpack_bench.timing import Timing, bar_chart, ensure_out_dir, print_table, timed, verdict, write_json

__all__ = ["lognormal_lengths", "run_algorithms", "display_name", "skip_line", "DEFAULT_SIZES", "QUICK_SIZES",
           "CAPACITY", "QUICK_NOTE"]

CAPACITY = 4096
DEFAULT_SIZES = (100_000, 1_000_000)
QUICK_SIZES = (20_000,)
#: Printed after the verdicts of a ``--quick`` run (its verdicts are labelled "quick: informational").
QUICK_NOTE = ("note: --quick verdicts are informational: the goals are judged on the full run "
              "(`seqpack bench algorithms`: 100,000 and 1,000,000 lengths, 3 repeats)")


def lognormal_lengths(n: int, *, seed: int = 0, median: float = 250.0, sigma: float = 1.0,
                      capacity: int = CAPACITY) -> np.ndarray:
    """SFT-like lengths: int64 ``[n]`` lognormal (median ``median`` tokens), rounded, clipped to [1, capacity]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, capacity).astype(np.int64)


#: Suffix that marks a program that splits samples across packs (not comparable as a packing result).
CUTS_SAMPLES = " (cuts samples)"


def display_name(row: dict[str, Any]) -> str:
    """Program name for tables and charts: ``row["program"]`` plus " (cuts samples)" when
    ``row["breaks_samples"]`` (TRL ``wrapped``), so it is not read as a packer that keeps samples whole."""
    return row["program"] + (CUTS_SAMPLES if row.get("breaks_samples") else "")


def skip_line(skip: dict[str, Any]) -> str:
    """One console line for a ``skipped`` entry: ``skipped: <program>, n=<n>: <reason>`` (``n`` is
    "every n" for a baseline that is not installed)."""
    n = "every n" if skip.get("n") is None else f"n={skip['n']:,}"
    return f"skipped: {skip['program']}, {n}: {skip['reason']}"


def _timed_round_robin(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[Any, Timing]]:
    """Time every ``fns[name]()`` ``repeats`` times, one run of each per round (interleaved, so a busy
    moment of the machine hits all of them alike): ``{name: (last result, Timing of medians)}``."""
    runs: dict[str, list[tuple[Any, Timing]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(timed(fn, 1))
    return {name: (rs[-1][0], Timing(float(np.median([t.wall_s for _, t in rs])),
                                     float(np.median([t.cpu_s for _, t in rs])), repeats,
                                     [t.wall_s for _, t in rs], [t.cpu_s for _, t in rs]))
            for name, rs in runs.items()}


def _seqpacker_goals(n: int, base: dict[str, Any], rows: list[dict[str, Any]],
                     informational: str | None) -> list[dict[str, Any]]:
    """The seqpacker verdicts of one size: packs <= its fewest, and >= 2x faster (CPU) than its fastest
    strategy of equal or fewer packs (vacuous PASS, said so, when no strategy gets that few)."""
    fewest = min(rows, key=lambda r: (r["bins"], r["cpu_s"]))
    goals = [verdict(f"n={n:,}: seqpack default packs <= seqpacker's fewest packs", base["bins"] <= fewest["bins"],
                     f"{base['bins']} vs {fewest['bins']} ({fewest['program']})", informational=informational)]
    label = f"n={n:,}: seqpack default >= 2x faster than the fastest seqpacker strategy of <= its packs (CPU)"
    goals.append(seqpacker_speed_verdict(label, base, rows, informational,
                                         note=f"; interleaved, median of {base['repeats']}"))
    return goals


def _row(program: str, n: int, loads: np.ndarray, timing: Any, l1: int, l2: int, capacity: int,
         *, breaks_samples: bool = False, note: str = "") -> dict[str, Any]:
    bins = int(loads.shape[0])
    return {
        "program": program,
        "n": n,
        "bins": bins,
        "lower_bound_l1": l1,
        "lower_bound_l2": l2,
        "excess_vs_l2_pct": round(100.0 * (bins - l2) / l2, 4) if l2 else None,
        "utilization": round(float(loads.sum()) / (bins * capacity), 6) if bins else None,
        "load_spread": int(loads.max() - loads.min()) if bins else None,
        "wall_s": timing.wall_s if timing else None,
        "cpu_s": timing.cpu_s if timing else None,
        "repeats": timing.repeats if timing else 0,
        "breaks_samples": breaks_samples,
        "note": note,
    }


def run_algorithms(
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    capacity: int = CAPACITY,
    repeats: int = 3,
    out_dir: str | os.PathLike = "bench_results",
    max_reference_n: int = 1_000_000,
    max_bridge_n: int = 100_000,
    max_seqpacker_hk_n: int = 200_000,
    trl: bool = True,
    seed: int = 0,
    quick: bool = False,
    mixes: Sequence[str] = (),
    mix_n: int = 1_000_000,
    mix_big_n: int = 10_000_000,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the comparison and write ``algorithms.json`` + ``algorithms_time.png`` + ``algorithms_bins.png``.

    After the tables and verdicts, every skipped baseline is printed as one ``skipped:`` line
    (:func:`skip_line`: program, n, reason), as listed in the JSON's ``skipped``.

    Args:
        sizes: numbers of lengths (one instance each, same generator seed).
        capacity: tokens per pack.
        repeats: timed runs per program (median reported); TRL at n >= 1,000,000 runs once
            (memory: ~3 GB per run) and says so in ``note``.
        out_dir: folder for the JSON and PNG files (created and checked before any work).
        max_reference_n: largest n for LLaMA-Factory's pure-Python greedy knapsack (O(n^2) worst case);
            >= 0, 0 = never run it.
        max_bridge_n: largest n for Megatron-Bridge's pure-Python first fit (O(n * packs): about a
            minute per run at 100,000 lengths; above 20,000 lengths it runs once); >= 0, 0 = never run it.
        max_seqpacker_hk_n: largest n for seqpacker's ``hk`` (Harmonic-K, O(n * open packs): 20 s at
            1,000,000 lengths); >= 0, 0 = never run it. Its other strategies run at every n.
        trl: include TRL when importable (skips are recorded in ``skipped``).
        seed: seed of the length generator.
        quick: a ``--quick`` run: each verdict is printed and stored as "quick: informational" (small
            sizes do not judge the goals), followed by :data:`QUICK_NOTE`.
        mixes: names of the planner mixes (:data:`seqpack_bench.algorithms_mixes.MIX_NAMES`) judged after the
            tables above, by :func:`seqpack_bench.algorithms_mixes.run_mixes` (seqpack default vs every
            seqpacker strategy but ``hk``, round-robin); empty (default here) = none; ``seqpack bench
            algorithms`` passes all of them.
        mix_n, mix_big_n: lengths per mix, and the second, larger size of the linearity and ns-per-item
            verdicts (0 = skip it).
        log: one-line progress messages.

    Returns:
        the JSON payload: ``benchmark``, ``capacity``, ``sizes``, ``repeats``, ``results`` (one row per
        program and size, keys of :func:`_row`), ``skipped`` (program, n, reason), ``refused`` (program,
        n, reason: a peer result that failed the exactly-once / capacity check, printed as a
        ``refused:`` line), ``goals``.

    Raises:
        ValueError: empty ``sizes``, a size < 1, or ``max_reference_n`` / ``max_bridge_n`` /
            ``max_seqpacker_hk_n`` < 0.
        OutputDirError: ``out_dir`` cannot be created or written (checked first).
    """
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be a non-empty list of integers >= 1, got {list(sizes)!r}")
    for key, val in (("max_reference_n", max_reference_n), ("max_bridge_n", max_bridge_n),
                     ("max_seqpacker_hk_n", max_seqpacker_hk_n)):
        if val < 0:
            raise ValueError(f"{key} must be >= 0 (0 = never run that baseline), got {val}")
    informational = "quick: informational" if quick else None
    out_dir = ensure_out_dir(out_dir, option="out_dir")
    ours = [PackingAlgorithm(DEFAULT_ALGORITHM), PackingAlgorithm.best_fit_decreasing, PackingAlgorithm.greedy_knapsack]
    for a in ours:  # JIT warm-up (numba kernels, cached on disk)
        pack_lengths(np.array([5, 4, 3, 2, 1]), 8, a)
    has_trl = trl and ref.trl_available()
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    if trl and not has_trl:
        skipped.append({"program": "trl", "n": None, "reason": "trl/datasets not importable"})
    lf_version, bridge_version = ref.llamafactory_installed(), ref.megatron_bridge_installed()
    if lf_version:
        lf_name, lf_fn, lf_note = (f"llamafactory {lf_version} greedy_knapsack",
                                   ref.llamafactory_installed_greedy_knapsack, "installed, pure Python")
    else:
        lf_name, lf_fn, lf_note = (ref.LLAMAFACTORY_NAME, ref.llamafactory_greedy_knapsack,
                                   "pure-Python reference re-implementation")
        skipped.append({"program": "llamafactory", "n": None,
                        "reason": f"not installed ({ref.BASELINE_INSTALL}); its reference re-implementation runs"})
    if not bridge_version:
        skipped.append({"program": "megatron-bridge", "n": None,
                        "reason": f"not installed ({ref.BASELINE_INSTALL})"})
    sp = ref.seqpacker_module()
    sp_version = str(getattr(sp, "__version__", "?"))
    if sp is None:
        skipped.append({"program": "seqpacker", "n": None, "reason": f"not installed ({ref.SEQPACKER_INSTALL})"})
    refused: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    for n in sizes:
        x = lognormal_lengths(n, seed=seed, capacity=capacity)
        l1, l2 = lower_bound_l1(x, capacity), lower_bound_l2(x, capacity)
        log(f"n={n:,}: sum={int(x.sum()):,} tokens, L1={l1}, L2={l2}")
        by_prog: dict[str, dict[str, Any]] = {}
        fns: dict[str, Callable[[], Any]] = {}
        for a in ours:
            fns[f"seqpack {a.value}" + (" (default)" if a == DEFAULT_ALGORITHM else "")] = (
                lambda a=a: pack_lengths(x, capacity, a, seed=seed))
        peers: dict[str, Callable[[], Any]] = {}
        for strategy in ref.SEQPACKER_STRATEGIES if sp is not None else ():
            name = f"seqpacker {sp_version} {strategy}"
            if strategy == "hk" and n > max_seqpacker_hk_n:
                skipped.append({"program": name, "n": n, "reason": f"n > max_seqpacker_hk_n={max_seqpacker_hk_n:,} "
                                                                   "(--max-seqpacker-hk-n; O(n * open packs))"})
                continue
            try:  # one untimed run: a strategy it refuses is recorded, not timed
                ref.seqpacker_pack(sp, x[:2], capacity, strategy, seed=seed)
            except Exception as exc:  # noqa: BLE001 - a peer's failure is recorded, the run goes on
                skipped.append({"program": name, "n": n, "reason": f"failed: {type(exc).__name__}: {exc}"})
                continue
            peers[name] = lambda s=strategy: ref.seqpacker_pack(sp, x, capacity, s, seed=seed)
        if peers:
            log(f"  seqpack and {len(peers)} seqpacker strategies, round-robin x{repeats}")
        for name, (res, t) in _timed_round_robin({**fns, **peers}, repeats).items():
            if name in fns:
                by_prog[name] = _row(name, n, np.asarray(res.bin_loads, np.int64), t, l1, l2, capacity)
                continue
            try:
                loads = ref.check_flat_bins(*res, x, capacity, program=name)
            except ref.PeerResultError as exc:
                refused.append({"program": name, "n": n, "reason": exc.fault})
                continue
            by_prog[name] = _row(name, n, loads, t, l1, l2, capacity,
                                 note="Rust, pack_flat; timed round-robin with seqpack")
        if has_trl:
            ds = ref.trl_lengths_dataset(x)
            reps = 1 if n >= 1_000_000 else repeats
            note = "1 run (memory)" if reps < repeats else ""
            for strategy in ("bfd", "wrapped"):
                log(f"  trl pack_dataset(strategy={strategy!r}) x{reps}")
                packed, t = timed(lambda s=strategy: ref.trl_pack(ds, capacity, s), reps)
                loads = ref.loads_from_trl(packed)
                name = f"trl pack_dataset {strategy}"
                by_prog[name] = _row(name, n, loads, t, l1, l2, capacity, breaks_samples=strategy == "wrapped",
                                     note=note + ("; cuts samples (one partial chunk per 1,000-row map batch)"
                                                  if strategy == "wrapped" else ""))
                del packed
            del ds
        if n <= max_reference_n:
            reps = min(repeats, 2) if n > 50_000 else repeats  # O(n^2) worst case: at most 2 runs when large
            log(f"  {lf_name} x{reps}")
            packs, t = timed(lambda: lf_fn(x, capacity), reps)
            loads = np.array([int(x[p].sum()) for p in packs], np.int64)
            by_prog[lf_name] = _row(lf_name, n, loads, t, l1, l2, capacity, note=lf_note)
        else:
            skipped.append({"program": lf_name, "n": n,
                            "reason": f"n > max_reference_n={max_reference_n:,} (--max-reference-n; O(n^2) "
                                      "list.pop)"})
        for algo in ref.BRIDGE_ALGORITHMS if bridge_version else ():
            name = f"megatron-bridge {bridge_version} {algo}"
            if n > max_bridge_n:
                skipped.append({"program": name, "n": n,
                                "reason": f"n > max_bridge_n={max_bridge_n:,} (--max-bridge-n; O(n * packs) "
                                          "first fit)"})
                continue
            reps = 1 if n > 20_000 else repeats
            log(f"  {name} x{reps}")
            loads, t = timed(lambda a=algo: ref.megatron_bridge_packing(x, capacity, a, seed=seed), reps)
            by_prog[name] = _row(name, n, loads, t, l1, l2, capacity,
                                 note="installed, pure Python" + ("; 1 run (O(n * packs))" if reps < repeats else ""))
        base_name = f"seqpack {PackingAlgorithm(DEFAULT_ALGORITHM).value} (default)"
        base = by_prog[base_name]
        for r in by_prog.values():
            r["time_ratio_vs_seqpack_default"] = round(r["cpu_s"] / base["cpu_s"], 2) if base["cpu_s"] else None
            results.append(r)
        print_table(
            f"algorithms, n={n:,}, capacity={capacity}, L1={l1}, L2={l2} (median of repeats)",
            ["program", "bins", "excess % L2", "util", "spread", "wall s", "cpu s", "x seqpack time"],
            [[display_name(r), r["bins"], r["excess_vs_l2_pct"], r["utilization"], r["load_spread"], r["wall_s"],
              r["cpu_s"], r["time_ratio_vs_seqpack_default"]] for r in by_prog.values()],
        )
        trl_bfd = by_prog.get("trl pack_dataset bfd")
        if trl_bfd:
            goals.append(verdict(
                f"n={n:,}: seqpack default packs <= TRL bfd packs", base["bins"] <= trl_bfd["bins"],
                f"{base['bins']} vs {trl_bfd['bins']}", informational=informational))
            goals.append(verdict(
                f"n={n:,}: seqpack default faster than TRL bfd (CPU)", base["cpu_s"] < trl_bfd["cpu_s"],
                f"seqpack {base['cpu_s']:.3f} s vs TRL {trl_bfd['cpu_s']:.3f} s "
                f"(TRL takes {trl_bfd['cpu_s'] / max(base['cpu_s'], 1e-9):.1f}x as long)", informational=informational))
        lf = by_prog.get(lf_name)
        if lf:
            goals.append(verdict(
                f"n={n:,}: seqpack default packs <= LLaMA-Factory greedy knapsack packs", base["bins"] <= lf["bins"],
                f"{base['bins']} vs {lf['bins']}", informational=informational))
        for algo in ref.BRIDGE_ALGORITHMS:
            br = by_prog.get(f"megatron-bridge {bridge_version} {algo}")
            if br:
                goals.append(verdict(
                    f"n={n:,}: seqpack default packs <= Megatron-Bridge {algo} packs", base["bins"] <= br["bins"],
                    f"{base['bins']} vs {br['bins']}; Bridge takes {br['cpu_s'] / max(base['cpu_s'], 1e-9):.0f}x "
                    "as long", informational=informational))
        sp_rows = [r for name, r in by_prog.items() if name.startswith("seqpacker ")]
        if sp_rows:
            goals.extend(_seqpacker_goals(n, base, sp_rows, informational))
    mix_rows: list[dict[str, Any]] = []
    if mixes:
        log(f"planner mixes: {len(mixes)} mixes, n={mix_n:,}" + (f" and {mix_big_n:,}" if mix_big_n else ""))
        out = run_mixes(mix_n, mix_big_n, repeats=repeats, names=tuple(mixes), seed=seed,
                        informational=informational, log=log)
        goals.extend(out["goals"])
        skipped.extend(out["skipped"])
        mix_rows = out["rows"]
    if quick and goals:
        print(QUICK_NOTE)
    for skip in skipped:
        print(skip_line(skip))
    for bad in refused:
        print(f"refused: {bad['program']}, n={bad['n']:,}: {bad['reason']}")
    payload = {"benchmark": "algorithms", "capacity": capacity, "sizes": list(sizes), "repeats": repeats,
               "quick": quick, "distribution": "lognormal median 250 sigma 1 clipped to [1, capacity]",
               "results": results, "skipped": skipped, "refused": refused, "goals": goals, "mixes": mix_rows}
    write_json(out_dir / "algorithms.json", payload)
    labels = [f"{display_name(r)}, n={r['n']:,}" for r in results]
    colors = ["#dd8452" if r["breaks_samples"] else None for r in results]  # orange: not a packing result
    cut_note = "; orange = cuts samples, not comparable" if any(r["breaks_samples"] for r in results) else ""
    bar_chart(out_dir / "algorithms_time.png", labels, [r["cpu_s"] for r in results],
              title=f"Packing time (CPU s, median; log scale){cut_note}", ylabel="CPU seconds", log=True,
              annotate=[f"{r['cpu_s']:.3g}" for r in results], colors=colors)
    bar_chart(out_dir / "algorithms_bins.png", labels, [r["excess_vs_l2_pct"] for r in results],
              title=f"Packs above the L2 lower bound (%){cut_note}", ylabel="% over L2",
              annotate=[f"{r['bins']:,} packs" for r in results], colors=colors)
    return payload
