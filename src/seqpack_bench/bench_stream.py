"""Benchmark of seqpack.stream.StreamingPacker: throughput, packing efficiency, state size.

Usage::

    python benchmarks/bench_stream.py            # full: 1,000,000 samples, 3 repeats (measured: 20 s on 2 cores)
    python benchmarks/bench_stream.py --quick    # measured: 10 s on 2 cores

What it prints (all measured in this run; medians of ``--repeats``):

1. Throughput of the packer on length-only samples (a numpy array of lengths = map-style source,
   ``output="indices"``, buffer 10,000, capacity 4096): samples/s, the share spent inside the packing
   algorithm, and the ratio to packing the same lengths offline in one ``pack_lengths`` call.
   Goal: >= 1,000,000 samples/s.
2. Packing efficiency: packs above the L1 bound ``ceil(sum(lengths) / capacity)`` for buffers of
   100, 1,000 and 10,000 on a lognormal SFT mix and a bimodal text+image mix at capacities 4096 and
   8192; "window" = pack each buffer independently (``carry_fill=0``, what most streaming packers
   do), "carry" = the default carry-over of under-filled packs; "offline" = ``pack_lengths`` over
   the whole data set. Goal: carry with buffer 1,000 <= L1 + 0.1 %.
3. Size of ``state_dict()`` (pickle and ``torch.save`` bytes) for buffer 10,000.
4. End-to-end rows/s from ``Sample`` objects to ``PackedSequence`` rows, and the cost of one
   ``state_dict()`` call with buffer 10,000.

Every goal is printed as PASS or MISS. ``--json PATH`` also writes the figures as JSON (rewritten after
each section, so a run that fails keeps the sections done): ``throughput`` (samples/s: ``stream_numpy_source``,
``stream_iterable``, ``offline_pack_lengths``; plus ``algorithm_share``), ``efficiency`` (one entry per mix and
capacity: ``mix``, ``capacity``, ``l1``, ``offline_pct``, ``offline_bfd_pct``, ``buffers`` = list of ``buffer``,
``window_pct``, ``carry_pct``, ``max_wait``; percentages = packs above L1 in %), ``state_dict`` (bytes) and
``rows`` (samples/s, rows/s, microseconds per ``state_dict()`` call), ``goals`` (name -> true/false) and the
sizes used. ``seqpack bench stream`` draws its charts from this file; the printed text is unchanged.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _argtypes (already sys.path[0] when run as a script)

from _argtypes import positive_int  # noqa: E402

# seqpack.stream imports torch (~1.5 s): each bench function imports what it needs, so --help and argument
# errors answer at once


#: goal of section 1 (samples per second of the packer on a numpy source)
THROUGHPUT_GOAL = 1_000_000


def lognormal_mix(n: int, cap: int, seed: int = 1) -> np.ndarray:
    """SFT-like: lognormal token counts (median ~400, long tail), clipped to [8, cap]."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.0, 1.0, n).astype(np.int64), 8, cap)


def bimodal_mix(n: int, cap: int, seed: int = 1) -> np.ndarray:
    """Text+image: 60 % short text chats (lognormal, median ~200) and 40 % image samples (~1,400)."""
    rng = np.random.default_rng(seed)
    text = rng.lognormal(5.3, 0.8, n)
    image = rng.normal(1400, 350, n)
    return np.clip(np.where(rng.random(n) < 0.6, text, image).astype(np.int64), 8, cap)


def count_packs(packer) -> int:
    n = 0
    for _ in packer:
        n += 1
    return n


def bench_throughput(n: int, repeats: int) -> dict:
    """Section 1; returns ``{"stream_numpy_source", "stream_iterable", "offline_pack_lengths"}`` (samples/s)
    and ``algorithm_share`` (fraction of the packer's time inside the packing algorithm)."""
    from seqpack.algorithms import pack_lengths
    from seqpack.stream import STREAM_DEFAULT_ALGORITHM, StreamingPacker

    cap, buf = 4096, 10_000
    lens = lognormal_mix(n, cap)
    algo_time = [0.0]

    def timed_bfd(lengths, capacity, seed):
        t = time.perf_counter()
        bins = pack_lengths(lengths, capacity, STREAM_DEFAULT_ALGORITHM, seed=seed, shuffle_packs=False).bins
        algo_time[0] += time.perf_counter() - t
        return bins

    # warm-up (numba JIT / cache load)
    count_packs(StreamingPacker(lens[:20_000], cap, packing_buffer_size=buf, output="indices"))
    pack_lengths(lens[:20_000], cap, STREAM_DEFAULT_ALGORITHM)

    rows = {"map": [], "iterable": [], "offline": [], "algo_share": []}
    ints = lens.tolist()
    for _ in range(repeats):
        t = time.perf_counter()
        count_packs(StreamingPacker(lens, cap, packing_buffer_size=buf, output="indices"))
        rows["map"].append(time.perf_counter() - t)
        algo_time[0] = 0.0
        t = time.perf_counter()
        count_packs(StreamingPacker(lens, cap, packing_buffer_size=buf, output="indices", algorithm=timed_bfd))
        rows["algo_share"].append(algo_time[0] / (time.perf_counter() - t))
        t = time.perf_counter()
        count_packs(StreamingPacker(iter_source(ints), cap, packing_buffer_size=buf, output="indices"))
        rows["iterable"].append(time.perf_counter() - t)
        t = time.perf_counter()
        pack_lengths(lens, cap, STREAM_DEFAULT_ALGORITHM)
        rows["offline"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in rows.items()}
    rate = n / med["map"]
    print(f"\n== 1. throughput: {n:,} length-only samples, buffer {buf:,}, capacity {cap}, median of {repeats}")
    print(f"  map-style numpy source : {rate:14,.0f} samples/s  ({1e9 / rate:6.1f} ns/sample)")
    print(f"  plain iterable of ints : {n / med['iterable']:14,.0f} samples/s")
    print(f"  share inside algorithm : {100 * med['algo_share']:.1f} %  (packer overhead "
          f"{1e9 * med['map'] * (1 - med['algo_share']) / n:.1f} ns/sample)")
    print(f"  offline pack_lengths   : {n / med['offline']:14,.0f} samples/s  (streaming / offline time = "
          f"{med['map'] / med['offline']:.2f})")
    print(f"  goal >= {THROUGHPUT_GOAL:,} samples/s: {'PASS' if rate >= THROUGHPUT_GOAL else 'MISS'}")
    return {"stream_numpy_source": rate, "stream_iterable": n / med["iterable"],
            "offline_pack_lengths": n / med["offline"], "algorithm_share": med["algo_share"]}


class iter_source:
    """A re-iterable plain iterable (no __getitem__): the packer must read it in order."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def bench_efficiency(n: int) -> tuple[bool, list]:
    """Section 2; returns (goal met for every set, one figures entry per mix and capacity)."""
    from seqpack.algorithms import DEFAULT_ALGORITHM, pack_lengths
    from seqpack.stream import STREAM_DEFAULT_ALGORITHM, StreamingPacker

    print(f"\n== 2. efficiency: packs above L1 (%), {n:,} samples per data set")
    print(f"  {'mix':10} {'cap':>5} {'L1':>7} {'offline':>8} {'offl-BFD':>8} | " + " | ".join(
        f"B={b:<6} window  carry  wait" for b in (100, 1000, 10_000)))
    all_ok = True
    verdicts, rows = [], []
    for name, gen in (("lognormal", lognormal_mix), ("bimodal", bimodal_mix)):
        for cap in (4096, 8192):
            lens = gen(n, cap)
            l1 = -(-int(lens.sum()) // cap)
            off = pack_lengths(lens, cap, DEFAULT_ALGORITHM).num_bins
            off_bfd = pack_lengths(lens, cap, STREAM_DEFAULT_ALGORITHM).num_bins
            cells, per_buffer = [], []
            goal = None
            for b in (100, 1000, 10_000):
                win = count_packs(StreamingPacker(lens, cap, packing_buffer_size=b, output="indices", carry_fill=0))
                p = StreamingPacker(lens, cap, packing_buffer_size=b, output="indices")
                car = count_packs(p)
                cells.append(f"{100 * (win / l1 - 1):13.3f} {100 * (car / l1 - 1):6.3f} {p.stats['max_wait']:5d}")
                per_buffer.append({"buffer": b, "window_pct": 100 * (win / l1 - 1), "carry_pct": 100 * (car / l1 - 1),
                                   "max_wait": int(p.stats["max_wait"])})
                if b == 1000:
                    goal = car <= l1 * 1.001
            print(f"  {name:10} {cap:5d} {l1:7d} {100 * (off / l1 - 1):8.3f} {100 * (off_bfd / l1 - 1):8.3f} | "
                  + " | ".join(cells))
            rows.append({"mix": name, "capacity": cap, "l1": l1, "offline_pct": 100 * (off / l1 - 1),
                         "offline_bfd_pct": 100 * (off_bfd / l1 - 1), "buffers": per_buffer})
            verdicts.append(f"{name} cap {cap}: {'PASS' if goal else 'MISS'}")
            all_ok &= bool(goal)
    print("  (wait = most rounds a sample was carried; window = pack each buffer alone, carry = default)")
    print("  goal: buffer 1,000 with carry-over <= L1 + 0.1 %: " + "; ".join(verdicts))
    return all_ok, rows


def bench_state_size() -> dict:
    """Section 3; returns ``{"sample_keys", "pickle_bytes", "torch_save_bytes"}``."""
    import torch

    from seqpack.stream import StreamingPacker

    lens = lognormal_mix(50_000, 4096)
    p = StreamingPacker(lens, 4096, packing_buffer_size=10_000, output="indices")
    it = iter(p)
    for _ in range(50):
        next(it)
    state = p.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    n_keys = len(state["buffer_keys"]) + len(state["pending_keys"])
    print("\n== 3. state_dict size, buffer 10,000 (after 50 packs)")
    size = {"sample_keys": n_keys, "pickle_bytes": len(pickle.dumps(state)), "torch_save_bytes": len(buf.getvalue())}
    print(f"  {n_keys:,} sample keys held; pickle {size['pickle_bytes']:,} B; torch.save {size['torch_save_bytes']:,} B")
    return size


def bench_rows(n: int) -> dict:
    """Sample objects -> PackedSequence rows (includes build_packed_sequence), and state_dict cost.

    Returns ``{"samples", "rows", "samples_per_s", "rows_per_s", "state_dict_us"}``."""
    from seqpack.data.sample import Sample
    from seqpack.stream import StreamingPacker

    cap = 4096
    lens = lognormal_mix(n, cap, seed=3)
    rng = np.random.default_rng(0)
    samples = []
    for i, L in enumerate(lens.tolist()):
        ids = rng.integers(1, 30000, L).astype(np.int32)
        lab = np.full(L, -100, np.int32)
        lab[:-1] = ids[1:]
        samples.append(Sample(ids, lab, sample_id=str(i)))
    t = time.perf_counter()
    rows = count_packs(StreamingPacker(samples, cap, packing_buffer_size=1000, pad_to_multiple_of=8, output="packed"))
    dt = time.perf_counter() - t
    p = StreamingPacker(lognormal_mix(50_000, cap), cap, packing_buffer_size=10_000, output="indices")
    it = iter(p)
    next(it)
    reps = 200
    t = time.perf_counter()
    for _ in range(reps):
        p.state_dict()
    sd = (time.perf_counter() - t) / reps
    print(f"\n== 4. rows: {n:,} Sample objects -> {rows:,} PackedSequence rows (cap {cap}, buffer 1,000, multiple 8)")
    print(f"  {n / dt:,.0f} samples/s, {rows / dt:,.0f} rows/s (build_packed_sequence included)")
    print(f"  state_dict() with buffer 10,000: {1e6 * sd:,.0f} us per call (StatefulDataLoader calls it per batch "
          "in each worker unless snapshot_every_n_steps is raised)")
    return {"samples": n, "rows": rows, "samples_per_s": n / dt, "rows_per_s": rows / dt, "state_dict_us": 1e6 * sd}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about 10 s on 2 cores)")
    ap.add_argument("--n", type=positive_int, default=None,
                    help="samples for the throughput run, >= 1 (default 1,000,000; 300,000 with --quick)")
    ap.add_argument("--repeats", type=positive_int, default=None,
                    help="timed runs of the throughput section, median reported (>= 1, default 3; 2 with --quick)")
    ap.add_argument("--efficiency-n", type=positive_int, default=None,
                    help="samples per data set of the efficiency section, >= 1 (default 500,000; 150,000 with --quick)")
    ap.add_argument("--json", metavar="PATH", default=None,
                    help="also write the figures to PATH as JSON (rewritten after each section)")
    args = ap.parse_args(argv)
    n_tp = args.n if args.n is not None else (300_000 if args.quick else 1_000_000)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    n_eff = args.efficiency_n if args.efficiency_n is not None else (150_000 if args.quick else 500_000)
    n_rows = 20_000 if args.quick else 100_000
    figures = {"sizes": {"throughput_n": n_tp, "repeats": repeats, "efficiency_n": n_eff, "rows_n": n_rows},
               "goals": {}}

    def save() -> None:  # whole file or none: a reader never sees half a JSON document
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(figures, indent=1) + "\n")
            os.replace(tmp, path)

    save()
    import seqpack.stream  # noqa: F401 - load torch before the total clock starts (as the module-level import did)

    t0 = time.perf_counter()
    figures["throughput"] = bench_throughput(n_tp, repeats)
    ok1 = figures["goals"]["throughput_ge_1M_per_s"] = figures["throughput"]["stream_numpy_source"] >= THROUGHPUT_GOAL
    save()
    ok2, figures["efficiency"] = bench_efficiency(n_eff)
    figures["goals"]["carry_buffer_1000_le_l1_plus_0.1pct"] = ok2
    save()
    figures["state_dict"] = bench_state_size()
    save()
    figures["rows"] = bench_rows(n_rows)
    save()
    print(f"\nsummary: throughput {'PASS' if ok1 else 'MISS'}, efficiency {'PASS' if ok2 else 'MISS'} "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
