"""The planner goals of ``seqpack bench algorithms`` on every benchmark length mix (second part of its run).

Mixes (:func:`mix`, each from its own seeded generator):

- ``lognormal s@C``: ``exp(N(6.2, s))`` rounded and clipped to [8, C], for s in 0.5, 0.7, 0.9, 1.2 and C in
  4096, 8192 (median 493 tokens);
- ``uniform``: integers uniform in [1, 4096];
- ``bimodal``: 60 % text (lognormal 0.9, C = 4096) and 40 % image-like lengths uniform in [1000, 3000];
- ``halves_thirds``: half just above C/2 (C/2 + [1, 64]), half just below C/3 (C/3 - [0, 63]);
- ``ffd_11_9``: the classic instance where FFD needs 11/9 OPT packs (m of C/2+e, m of C/4+2e, m of C/4+e,
  2m of C/4-2e, e = 16; OPT = 1.5 m).

Per mix, seqpack's default and its ``best_fit_decreasing`` plus every seqpacker strategy but ``hk``
(O(n * open packs)) are timed round-robin on ``n`` lengths (one run of each per round, CPU seconds of this
process, median); the default alone is timed again on ``big_n`` lengths. Verdicts per mix: packs <= every
peer's; packs <= L2 + 0.05 %; load spread (max - min pack load over all packs, tokens) <= 1 % of C;
<= 100 ns per item at ``n`` and at ``big_n``; linear in n (ns per item at ``big_n`` <= 1.5 x the figure at
``n``); >= 2x faster than seqpacker's fastest strategy of equal or fewer packs.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from seqpack.algorithms import PackingAlgorithm, lower_bound_l2, pack_lengths
from seqpack_bench import references as ref
from seqpack_bench.timing import print_table, timed, verdict

__all__ = ["MIX_NAMES", "mix", "run_mixes", "NS_PER_ITEM_GOAL", "LINEAR_GOAL"]

#: Mix names of :func:`mixes`, in order.
MIX_NAMES = tuple([f"lognormal {s}@{c}" for c in (4096, 8192) for s in (0.5, 0.7, 0.9, 1.2)]
                  + ["uniform", "bimodal", "halves_thirds", "ffd_11_9"])
#: Goal: CPU nanoseconds per item of the default planner (``pack_lengths``, plan included).
NS_PER_ITEM_GOAL = 100.0
#: Goal: ns per item at ``big_n`` at most this multiple of the figure at ``n`` (linear in n, with noise).
LINEAR_GOAL = 1.5


def seqpacker_speed_verdict(label: str, base: dict[str, Any], peers: list[dict[str, Any]],
                            informational: str | None, note: str = "") -> dict[str, Any]:
    """The one ">= 2x faster than seqpacker" verdict: seqpack's default (``base``: ``bins``, ``cpu_s``) against
    the fastest (CPU s) of the seqpacker rows ``peers`` with equal or fewer packs; a vacuous PASS, said so,
    when no strategy gets that few. ``note`` is appended to the figure (e.g. how the times were taken)."""
    eq = [r for r in peers if r["bins"] <= base["bins"]]
    if not eq:
        best = min(peers, key=lambda r: (r["bins"], r["cpu_s"]))
        return verdict(label, True, f"no seqpacker strategy reaches {base['bins']} packs (fewest {best['bins']}, "
                                    f"{best['program']})", informational=informational)
    fast = min(eq, key=lambda r: r["cpu_s"])
    ratio = fast["cpu_s"] / max(base["cpu_s"], 1e-9)
    return verdict(label, ratio >= 2.0, f"{fast['program']} {fast['cpu_s']:.4f} s / seqpack {base['cpu_s']:.4f} s "
                                        f"= {ratio:.2f}x ({fast['bins']} vs {base['bins']} packs{note})",
                   informational=informational)


def _lognormal(n: int, rng: np.random.Generator, sigma: float, cap: int) -> np.ndarray:
    return np.clip(np.rint(np.exp(rng.normal(6.2, sigma, n))), 8, cap).astype(np.int64)


def mix(name: str, n: int, *, seed: int = 0) -> tuple[np.ndarray, int]:
    """``(lengths int64[n], capacity)`` of one mix (module docstring), drawn from its own generator
    (``default_rng([seed, position in MIX_NAMES])``).

    Raises:
        ValueError: an unknown name (the message lists :data:`MIX_NAMES`).
    """
    if name not in MIX_NAMES:
        raise ValueError(f"unknown mix {name!r}; choose from: {', '.join(MIX_NAMES)}")
    rng = np.random.default_rng([seed, MIX_NAMES.index(name)])
    c = 4096
    if name.startswith("lognormal "):
        s, c = name.split()[1].split("@")
        return _lognormal(n, rng, float(s), int(c)), int(c)
    if name == "uniform":
        return rng.integers(1, c + 1, n).astype(np.int64), c
    if name == "bimodal":
        nt = int(n * 0.6)
        return rng.permutation(np.concatenate([_lognormal(nt, rng, 0.9, c), rng.integers(1000, 3001, n - nt)])), c
    if name == "halves_thirds":
        nh = n // 2
        return rng.permutation(np.concatenate([c // 2 + rng.integers(1, 65, nh), c // 3 - rng.integers(0, 64, n - nh)])), c
    m, e = max(1, n // 5), 16
    parts = [np.full(m, c // 2 + e), np.full(m, c // 4 + 2 * e), np.full(m, c // 4 + e),
             np.full(max(0, n - 3 * m), c // 4 - 2 * e)]
    return rng.permutation(np.concatenate(parts))[:n].astype(np.int64), c


def _spread(loads: np.ndarray) -> int:
    return int(loads.max() - loads.min()) if loads.size else 0


def run_mixes(n: int, big_n: int, *, repeats: int = 3, names: tuple[str, ...] = MIX_NAMES, seed: int = 0,
              informational: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time and judge the default planner on every mix (module docstring): ``{"rows": [...], "goals": [...],
    "skipped": [...]}``; rows carry ``mix``, ``program``, ``n``, ``bins``, ``lower_bound_l2``, ``excess_vs_l2_pct``,
    ``load_spread``, ``cpu_s``, ``ns_per_item``. ``big_n`` = 0 skips the second size (and its two verdicts).

    Raises:
        ValueError: ``n`` < 1, ``big_n`` < 0, an unknown mix name.
    """
    if n < 1 or big_n < 0:
        raise ValueError(f"n must be >= 1 and big_n >= 0, got n={n}, big_n={big_n}")
    unknown = [k for k in names if k not in MIX_NAMES]
    if unknown:
        raise ValueError(f"unknown mix {unknown[0]!r}; choose from: {', '.join(MIX_NAMES)}")
    sp = ref.seqpacker_module()
    version = str(getattr(sp, "__version__", "0.1.3"))
    strategies = [s for s in ref.SEQPACKER_STRATEGIES if s != "hk"] if sp is not None else []
    rows: list[dict[str, Any]] = []
    goals: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    if sp is None:
        skipped.append({"program": "seqpacker", "n": n, "reason": f"not installed ({ref.SEQPACKER_INSTALL}); "
                                                                 "its verdicts are not judged"})
    else:
        skipped.append({"program": f"seqpacker {version} hk", "n": n, "reason": "O(n * open packs); not in the mixes"})
    for name in names:
        x, cap = mix(name, n, seed=seed)
        l2 = lower_bound_l2(x, cap)
        fns: dict[str, Callable[[], Any]] = {
            "seqpack default": lambda: pack_lengths(x, cap, seed=seed),
            "seqpack best_fit_decreasing": lambda: pack_lengths(x, cap, PackingAlgorithm.best_fit_decreasing, seed=seed)}
        for s in strategies:
            fns[f"seqpacker {version} {s}"] = lambda s=s: ref.seqpacker_pack(sp, x, cap, s, seed=seed)
        log(f"  {name}: n={n:,}, C={cap}, L2={l2}; {len(fns)} programs round-robin x{repeats}")
        runs: dict[str, list[float]] = {k: [] for k in fns}
        res: dict[str, Any] = {}
        for _ in range(repeats):
            for k, fn in fns.items():
                res[k], t = timed(fn, 1)
                runs[k].append(t.cpu_s)
        by: dict[str, dict[str, Any]] = {}
        for k, r in res.items():
            if k.startswith("seqpack "):
                loads = np.asarray(r.bin_loads, np.int64)
            else:
                try:
                    loads = ref.check_flat_bins(*r, x, cap, program=k)
                except ref.PeerResultError as exc:
                    skipped.append({"program": k, "n": n, "reason": f"refused: {exc.fault}"})
                    continue
            cpu = float(np.median(runs[k]))
            by[k] = {"mix": name, "program": k, "n": n, "capacity": cap, "bins": int(loads.size), "lower_bound_l2": l2,
                     "excess_vs_l2_pct": round(100.0 * (loads.size - l2) / l2, 4), "load_spread": _spread(loads),
                     "cpu_s": cpu, "ns_per_item": round(1e9 * cpu / n, 1)}
        base = by["seqpack default"]
        if big_n:
            xb, capb = mix(name, big_n, seed=seed)
            plan, t = timed(lambda: pack_lengths(xb, capb, seed=seed), max(1, min(repeats, 2)))
            by["seqpack default @big"] = {"mix": name, "program": "seqpack default", "n": big_n, "capacity": capb,
                                          "bins": plan.num_bins, "lower_bound_l2": None, "excess_vs_l2_pct": None,
                                          "load_spread": plan.load_spread, "cpu_s": t.cpu_s,
                                          "ns_per_item": round(1e9 * t.cpu_s / big_n, 1)}
            del plan, xb
        rows.extend(by.values())
        print_table(f"planner mix {name}: n={n:,}, C={cap}, L2={l2} (CPU s, median of {repeats}, round-robin)",
                    ["program", "n", "bins", "excess % L2", "spread", "cpu s", "ns/item"],
                    [[r["program"], r["n"], r["bins"], r["excess_vs_l2_pct"], r["load_spread"], r["cpu_s"],
                      r["ns_per_item"]] for r in by.values()])
        goals.extend(_mix_goals(name, cap, base, by, informational))
    return {"rows": rows, "goals": goals, "skipped": skipped}


def _mix_goals(name: str, cap: int, base: dict[str, Any], by: dict[str, dict[str, Any]],
               informational: str | None) -> list[dict[str, Any]]:
    """The seven verdicts of one mix (module docstring)."""
    g = []
    peers = [r for k, r in by.items() if k not in ("seqpack default", "seqpack default @big")]
    fewest = min(peers, key=lambda r: r["bins"])
    g.append(verdict(f"{name}: packs <= every peer's", base["bins"] <= fewest["bins"],
                     f"{base['bins']} vs fewest {fewest['bins']} ({fewest['program']}; {len(peers)} peers)",
                     informational=informational))
    lim = base["lower_bound_l2"] * 1.0005
    g.append(verdict(f"{name}: packs <= L2 + 0.05 %", base["bins"] <= lim,
                     f"{base['bins']} vs L2 {base['lower_bound_l2']} (+{base['excess_vs_l2_pct']:.3f} %)",
                     informational=informational))
    g.append(verdict(f"{name}: load spread <= 1 % of C", base["load_spread"] <= 0.01 * cap,
                     f"{base['load_spread']} tokens (limit {0.01 * cap:.0f}; max - min over all packs)",
                     informational=informational))
    g.append(verdict(f"{name}: <= {NS_PER_ITEM_GOAL:.0f} ns per item at n={base['n']:,}",
                     base["ns_per_item"] <= NS_PER_ITEM_GOAL, f"{base['ns_per_item']:.0f} ns (CPU)",
                     informational=informational))
    bigr = by.get("seqpack default @big")
    if bigr:
        g.append(verdict(f"{name}: <= {NS_PER_ITEM_GOAL:.0f} ns per item at n={bigr['n']:,}",
                         bigr["ns_per_item"] <= NS_PER_ITEM_GOAL, f"{bigr['ns_per_item']:.0f} ns (CPU)",
                         informational=informational))
        ratio = bigr["ns_per_item"] / max(base["ns_per_item"], 1e-9)
        g.append(verdict(f"{name}: linear in n (ns per item at {bigr['n']:,} <= {LINEAR_GOAL}x at {base['n']:,})",
                         ratio <= LINEAR_GOAL, f"{bigr['ns_per_item']:.0f} / {base['ns_per_item']:.0f} ns = {ratio:.2f}x",
                         informational=informational))
    sp = [r for k, r in by.items() if k.startswith("seqpacker ")]
    label = f"{name}: >= 2x faster than seqpacker's fastest strategy of <= its packs (CPU, same run)"
    if not sp:
        g.append(verdict(label, False, "seqpacker not installed: not judged", informational=informational or "no peer"))
        return g
    g.append(seqpacker_speed_verdict(label, base, sp, informational))
    return g
