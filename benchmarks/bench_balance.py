"""DP work balance: seqpack.parallel.balance_packs vs plain round-robin.

Per optimizer step, each of ``--dp`` ranks runs ``--micro-batches`` packed rows. Figures per step
(full steps; the one remainder step with fillers is counted apart):

* token spread  = (max - min) / mean of the ranks' token counts (worst step and mean over steps);
* cost max/mean = slowest rank's attention cost (sum of len^2 over segments) / mean rank's cost
  (worst step and mean); ``time eff.`` = sum(mean) / sum(max) over steps (1.0 = nobody waits);
* over cap      = micro-batches (packs) above the token cap (the capacity).

Goals at 8 ranks: token spread <= 0.1 %, cost max/mean <= 1.05, zero micro-batches over cap
(judged on the worst full step). Data: the real SFT files in ../shared/data tokenized with the
Qwen3 chat template via ``seqpack.data.prepare`` (falls back to a whitespace-token approximation,
stated in the output, when that is unavailable), and a 100,000-sample lognormal mix.
Packs come from ``seqpack.algorithms.pack_lengths`` (default algorithm).

Run: ``python benchmarks/bench_balance.py [--dp 8] [--micro-batches 1 4 8] [--capacity 4096]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from seqpack.algorithms import pack_lengths  # noqa: E402
from seqpack.parallel.balance import balance_packs, pack_costs, round_robin_plan  # noqa: E402

TEXT_FILES = [
    "llama-factory/alpaca_en_demo.json",
    "llama-factory/glaive_toolcall_en_demo.json",
    "llama-factory/identity.json",
    "llama-factory/reason_tool_use_demo_50.jsonl",
    "fastchat/dummy_conversation.json",
]


def real_lengths(capacity: int) -> tuple[np.ndarray, str]:
    data = REPO.parent / "shared" / "data"
    files = [data / f for f in TEXT_FILES if (data / f).exists()]
    if not files:
        return np.zeros(0, np.int64), "absent"
    try:
        from seqpack.data import prepare

        samples, report = prepare([str(f) for f in files], "qwen3", seq_length=capacity, on_error="skip")
        return np.array([s.length for s in samples], dtype=np.int64), (
            f"qwen3 chat template via seqpack.data.prepare ({report.records_read} records, {len(samples)} samples)")
    except Exception as e:  # pragma: no cover - only when the data layer is unavailable
        lens = []
        for f in files:
            text = f.read_text()
            recs = [json.loads(x) for x in text.splitlines() if x.strip()] if f.suffix == ".jsonl" else json.loads(text)
            for r in recs:
                lens.append(min(capacity, max(1, int(len(json.dumps(r, ensure_ascii=False).split()) * 1.3))))
        return np.array(lens, np.int64), f"WHITESPACE APPROXIMATION (1.3 x words; prepare failed: {e!r:.80})"


def lognormal_mix(n: int, capacity: int, seed: int = 0) -> np.ndarray:
    """70% chat-like (median 300 tokens, sigma 0.8) + 30% document-like (median 2000, sigma 0.7)."""
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(300), 0.8, n)
    long = rng.lognormal(np.log(2000), 0.7, n)
    lens = np.where(rng.random(n) < 0.7, short, long)
    return np.clip(lens.astype(np.int64), 8, capacity)


def run(name: str, lengths: np.ndarray, capacity: int, dp: int, mbs: list[int], repeats: int) -> list[str]:
    plan = pack_lengths(lengths, capacity)
    tokens, cost = pack_costs(plan.bins, lengths)
    verdicts = []
    print(f"\n## {name}: {len(lengths)} samples -> {len(tokens)} packs (capacity {capacity}, "
          f"{plan.algorithm}, utilization {plan.utilization:.4f}), dp={dp}")
    print(f"{'mb':>3} {'method':<12} {'steps':>6} {'fill':>4} {'tok spread worst':>17} {'tok spread mean':>16} "
          f"{'cost max/mean worst':>20} {'cost max/mean mean':>19} {'time eff.':>9} {'over cap':>8} {'ms':>8}")
    for mb in mbs:
        if len(tokens) < dp * mb:
            print(f"{mb:>3} (fewer packs than one step: skipped)")
            continue
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            bal = balance_packs(tokens, cost, dp, mb, token_cap=capacity)
            times.append(time.perf_counter() - t0)
        rr = round_robin_plan(len(tokens), dp, mb)
        for label, p, ms in (("round-robin", rr, float("nan")), ("balanced", bal, 1000 * float(np.median(times)))):
            s = p.stats(tokens, cost, token_cap=capacity)
            print(f"{mb:>3} {label:<12} {int(s['steps']):>6} {int(s['fillers']):>4} "
                  f"{100 * s['token_spread_max']:>16.4f}% "
                  f"{100 * s['token_spread_mean']:>15.4f}% {s['cost_max_over_mean_worst']:>20.4f} "
                  f"{s['cost_max_over_mean_mean']:>19.4f} {s['cost_time_efficiency']:>9.4f} {int(s['over_cap']):>8} "
                  f"{ms:>8.1f}")
            if label == "balanced":
                ok_t = s["token_spread_max"] <= 1e-3
                ok_c = s["cost_max_over_mean_worst"] <= 1.05
                ok_o = s["over_cap"] == 0
                v = (f"{name} mb={mb}: token spread <= 0.1% {'PASS' if ok_t else 'MISS'} "
                     f"({100 * s['token_spread_max']:.4f}% worst, {100 * s['token_spread_mean']:.4f}% mean); "
                     f"cost max/mean <= 1.05 {'PASS' if ok_c else 'MISS'} ({s['cost_max_over_mean_worst']:.4f} worst, "
                     f"{s['cost_max_over_mean_mean']:.4f} mean); over cap 0 {'PASS' if ok_o else 'MISS'}")
                verdicts.append(v)
    return verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    verdicts = []
    lens, how = real_lengths(a.capacity)
    if lens.size:
        print(f"real data lengths: {how}")
        verdicts += run("real SFT files", lens, a.capacity, a.dp, a.micro_batches, a.repeats)
    else:
        print("real data: ../shared/data absent, skipped")
    verdicts += run("lognormal mix", lognormal_mix(a.samples, a.capacity), a.capacity, a.dp, a.micro_batches,
                    a.repeats)
    print("\n## verdicts (goal at dp=8, worst full step)")
    for v in verdicts:
        print(v)


if __name__ == "__main__":
    main()
