"""Benchmark of seqpack.algorithms: pack count vs lower bounds, load balance and speed.

Usage:
    python -m seqpack_bench.bench_algorithms            # n = 1,000,000 lognormal (+ other mixes)
    python -m seqpack_bench.bench_algorithms --quick    # n = 100,000 (measured: 13 s on 2 cores)
    python -m seqpack_bench.bench_algorithms --n 300000 \
        --algorithms balanced_best_fit,first_fit_decreasing --instances lognormal,uniform

Prints one table per instance: algorithm, n, bins, L1 = ceil(sum/C), the Martello–Toth bound L2,
excess % over L2, utilization (real tokens / (bins*C)), load spread (max - min pack load, tokens),
seconds (median of 3 runs of ``pack_lengths`` on one core, bin index lists included; wall
clock and CPU time of this process, the CPU figure is robust to a busy machine and is the one the
speed target is judged on). Then the targets with PASS/MISS. TRL's ``pack_dataset(strategy="bfd")`` is timed on the
lognormal instance when ``trl`` is importable (``--no-trl`` skips it).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # before numba loads: one-core timings

import numpy as np  # noqa: E402

from seqpack.algorithms import (  # noqa: E402
    DEFAULT_ALGORITHM,
    PackingAlgorithm,
    lower_bound_l1,
    lower_bound_l2,
    pack_lengths,
)
from seqpack_bench._argtypes import comma_choices, positive_int  # noqa: E402
from seqpack_bench.timing import timed  # noqa: E402 - medians of wall and CPU seconds of repeats

C = 4096
#: Instance names of :func:`instances`, in the order they are built and printed.
INSTANCE_NAMES = ("lognormal", "uniform", "bimodal", "halves_thirds", "ffd_11_9")


def lognormal(n, rng, median=250.0, sigma=1.0, cap=C):
    """SFT-like lengths: lognormal with the given median, rounded, clipped to [1, cap]."""
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, cap).astype(np.int64)


def instances(n, seed=0):
    rng = np.random.default_rng(seed)
    out = {"lognormal": lognormal(n, rng)}
    out["uniform"] = rng.integers(1, C + 1, n).astype(np.int64)
    nt = int(n * 0.6)
    out["bimodal"] = rng.permutation(
        np.concatenate([lognormal(nt, rng), rng.integers(1000, 3001, n - nt)])
    ).astype(np.int64)
    nh = n // 2
    out["halves_thirds"] = rng.permutation(
        np.concatenate([C // 2 + rng.integers(1, 65, nh), C // 3 - rng.integers(0, 64, n - nh)])
    ).astype(np.int64)
    # Classic FFD = 11/9 OPT instance: m of C/2+e, m of C/4+2e, m of C/4+e, 2m of C/4-2e (OPT 1.5m)
    m = max(1, n // 5)
    e = 16
    parts = [np.full(m, C // 2 + e), np.full(m, C // 4 + 2 * e), np.full(m, C // 4 + e),
             np.full(2 * m, C // 4 - 2 * e)]
    out["ffd_11_9"] = rng.permutation(np.concatenate(parts)).astype(np.int64)
    return out


def trl_bfd_seconds(lengths, repeats):
    """TRL's BFD on a pyarrow table of dummy sequences of these lengths (None if unavailable)."""
    try:
        import pyarrow as pa
        from datasets import Dataset
        from trl.data_utils import pack_dataset
    except Exception:  # noqa: BLE001 - optional comparison
        return None
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = pa.array(np.zeros(int(offsets[-1]), np.int32))
    col = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    ds = Dataset(pa.table({"input_ids": col}))
    try:
        import datasets

        datasets.disable_progress_bars()
        res, t = timed(lambda: pack_dataset(ds, C, strategy="bfd"), repeats)
    except Exception as exc:  # noqa: BLE001
        print(f"  (TRL pack_dataset failed: {exc})")
        return None
    return len(res), t.wall_s, t.cpu_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=positive_int, default=None,
                    help="items per instance, >= 1 (default 1,000,000; 100,000 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="n=100,000 unless --n is given, 1 repeat for non-default algorithms")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed runs, median reported (default 3)")
    ap.add_argument("--algorithms", type=comma_choices(a.value for a in PackingAlgorithm), default=None,
                    help="comma list of algorithm names, or 'all' (default)")
    ap.add_argument("--instances", type=comma_choices(INSTANCE_NAMES), default=None,
                    help=f"comma list of {', '.join(INSTANCE_NAMES)}, or 'all' (default)")
    ap.add_argument("--no-trl", action="store_true")
    args = ap.parse_args(argv)
    n = args.n if args.n is not None else (100_000 if args.quick else 1_000_000)
    algos = list(PackingAlgorithm) if args.algorithms is None else [PackingAlgorithm(a) for a in args.algorithms]
    insts = instances(n)
    assert tuple(insts) == INSTANCE_NAMES
    if args.instances is not None:
        insts = {k: insts[k] for k in args.instances}

    pack_lengths(np.array([1, 2, 3]), 8, DEFAULT_ALGORITHM)  # JIT warm-up (cached on disk)
    for a in algos:
        pack_lengths(np.array([5, 4, 3, 2]), 8, a)

    checks = []
    hdr = f"{'algorithm':32s} {'n':>9s} {'bins':>8s} {'L1':>8s} {'L2':>8s} {'excess%L2':>9s} " \
          f"{'util':>7s} {'spread':>7s} {'sec':>7s} {'cpu_s':>7s}"
    for name, x in insts.items():
        l1, l2 = lower_bound_l1(x, C), lower_bound_l2(x, C)
        print(f"\n== {name}: n={x.size:,}  C={C}  sum={int(x.sum()):,}  L1={l1}  L2={l2}")
        print(hdr)
        res = {}
        for a in algos:
            reps = args.repeats if (a is DEFAULT_ALGORITHM or not args.quick) else 1
            plan, t = timed(lambda: pack_lengths(x, C, a, seed=0), reps)
            sec, cpu = t.wall_s, t.cpu_s
            res[a] = (plan, cpu)
            exc = 100.0 * (plan.num_bins - l2) / l2
            print(f"{a.value:32s} {x.size:9d} {plan.num_bins:8d} {l1:8d} {l2:8d} {exc:9.4f} "
                  f"{plan.utilization:7.4f} {plan.load_spread:7d} {sec:7.3f} {cpu:7.3f}")
        if name == "lognormal" and not args.no_trl and x.size <= 1_000_000:
            t = trl_bfd_seconds(x, 1)
            if t is not None:
                print(f"{'trl.pack_dataset(bfd)':32s} {x.size:9d} {t[0]:8d} {l1:8d} {l2:8d} "
                      f"{100.0 * (t[0] - l2) / l2:9.4f} {'':>7s} {'':>7s} {t[1]:7.3f} {t[2]:7.3f}")
                if DEFAULT_ALGORITHM in res:
                    print(f"  TRL bfd / seqpack default time ratio (CPU): {t[2] / res[DEFAULT_ALGORITHM][1]:.1f}x")
        if DEFAULT_ALGORITHM in res:
            d, dsec = res[DEFAULT_ALGORITHM]
            if name == "lognormal":
                checks.append((f"{name}: default bins <= L1 + 0.01%", d.num_bins <= l1 * 1.0001,
                               f"{d.num_bins} vs L1 {l1} (+{d.num_bins - l1})"))
                checks.append((f"{name}: default load spread <= 1% of C", d.load_spread <= 0.01 * C,
                               f"{d.load_spread} tokens"))
                if x.size == 1_000_000:
                    checks.append((f"{name}: default <= 0.2 CPU-s for 1M", dsec <= 0.2,
                                   f"{dsec:.3f} s ({x.size / dsec / 1e6:.1f}M samples/s)"))
                else:
                    checks.append((f"{name}: default >= 5M samples/s (CPU)", x.size / dsec >= 5e6,
                                   f"{x.size / dsec / 1e6:.1f}M samples/s (n={x.size:,})"))
                rb = PackingAlgorithm.randomized_best_fit
                if rb in res:
                    extra = 100.0 * (res[rb][0].num_bins - d.num_bins) / d.num_bins
                    checks.append((f"{name}: randomized_best_fit <= +0.15% bins", extra <= 0.15,
                                   f"+{extra:.4f}%"))
            else:
                checks.append((f"{name}: default bins <= L2 + 0.05%", d.num_bins <= l2 * 1.0005,
                               f"{d.num_bins} vs L2 {l2} (+{d.num_bins - l2})"))
            ffd = PackingAlgorithm.first_fit_decreasing
            if ffd in res:
                checks.append((f"{name}: default bins <= FFD bins",
                               d.num_bins <= res[ffd][0].num_bins,
                               f"{d.num_bins} vs {res[ffd][0].num_bins} (winner {d.detail.get('winner')})"))
    print("\n== targets")
    for label, ok, info in checks:
        print(f"{'PASS' if ok else 'MISS'}  {label:48s} {info}")


if __name__ == "__main__":
    main()
