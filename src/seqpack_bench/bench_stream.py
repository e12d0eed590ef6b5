"""Benchmark of seqpack.stream.StreamingPacker: throughput, packing efficiency, state size.

Usage::

    python -m seqpack_bench.bench_stream            # full: 1,000,000 samples, 3 repeats (measured: 20 s on 2 cores)
    python -m seqpack_bench.bench_stream --quick    # measured: 10 s on 2 cores

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

Every goal is printed as PASS or MISS. :func:`run_benchmark` returns the figures (``seqpack bench stream``
calls it in-process); ``--json PATH`` also writes them as JSON (rewritten after each section, so a run that
fails keeps the sections done): ``throughput`` (samples/s: ``stream_numpy_source``,
``stream_iterable``, ``offline_pack_lengths``; plus ``algorithm_share``), ``efficiency`` (one entry per mix and
capacity: ``mix``, ``capacity``, ``l1``, ``offline_pct``, ``offline_bfd_pct``, ``buffers`` = list of ``buffer``,
``window_pct``, ``carry_pct``, ``max_wait``; percentages = packs above L1 in %), ``state_dict`` (bytes) and
``rows`` (samples/s, rows/s, microseconds per ``state_dict()`` call), ``goals`` (name -> true/false) and the
sizes used. Where the printed lines go is an :class:`Echo` (``print`` by default).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from seqpack.algorithms import DEFAULT_ALGORITHM, pack_lengths
from seqpack.sample import Sample
from seqpack.stream import STREAM_DEFAULT_ALGORITHM
from seqpack_bench._argtypes import positive_int

# StreamingPacker (seqpack.stream.packer) imports torch (~1.5 s): the bench functions import it, so --help and
# argument errors answer at once


#: goal of section 1 (samples per second of the packer on a numpy source)
THROUGHPUT_GOAL = 1_000_000


class Echo:
    """Where the benchmark's lines go: printed as they come (the default).

    :meth:`verdict` receives every line that carries PASS/MISS verdicts, with ``ok`` = no MISS in it;
    ``seqpack bench stream`` passes a subclass that records the lines and the goals.
    """

    def line(self, text: str) -> None:
        """One printed line (``text`` may start with a blank line: ``"\\n== 2. ..."``)."""
        print(text, flush=True)

    def verdict(self, text: str, ok: bool) -> None:
        """A line with PASS/MISS verdicts; ``ok`` is False when any of them is MISS."""
        self.line(text)


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


def bench_throughput(n: int, repeats: int, echo: Echo) -> dict:
    """Section 1; returns ``{"stream_numpy_source", "stream_iterable", "offline_pack_lengths"}`` (samples/s)
    and ``algorithm_share`` (fraction of the packer's time inside the packing algorithm)."""
    from seqpack.stream.packer import StreamingPacker  # imports torch

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
    echo.line(f"\n== 1. throughput: {n:,} length-only samples, buffer {buf:,}, capacity {cap}, median of {repeats}")
    echo.line(f"  map-style numpy source : {rate:14,.0f} samples/s  ({1e9 / rate:6.1f} ns/sample)")
    echo.line(f"  plain iterable of ints : {n / med['iterable']:14,.0f} samples/s")
    echo.line(f"  share inside algorithm : {100 * med['algo_share']:.1f} %  (packer overhead "
          f"{1e9 * med['map'] * (1 - med['algo_share']) / n:.1f} ns/sample)")
    echo.line(f"  offline pack_lengths   : {n / med['offline']:14,.0f} samples/s  (streaming / offline time = "
          f"{med['map'] / med['offline']:.2f})")
    echo.verdict(f"  goal >= {THROUGHPUT_GOAL:,} samples/s: {'PASS' if rate >= THROUGHPUT_GOAL else 'MISS'}",
                 rate >= THROUGHPUT_GOAL)
    return {"stream_numpy_source": rate, "stream_iterable": n / med["iterable"],
            "offline_pack_lengths": n / med["offline"], "algorithm_share": med["algo_share"]}


class iter_source:
    """A re-iterable plain iterable (no __getitem__): the packer must read it in order."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def bench_efficiency(n: int, echo: Echo) -> tuple[bool, list]:
    """Section 2; returns (goal met for every set, one figures entry per mix and capacity)."""
    from seqpack.stream.packer import StreamingPacker  # imports torch

    echo.line(f"\n== 2. efficiency: packs above L1 (%), {n:,} samples per data set")
    echo.line(f"  {'mix':10} {'cap':>5} {'L1':>7} {'offline':>8} {'offl-BFD':>8} | " + " | ".join(
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
            echo.line(f"  {name:10} {cap:5d} {l1:7d} {100 * (off / l1 - 1):8.3f} {100 * (off_bfd / l1 - 1):8.3f} | "
                  + " | ".join(cells))
            rows.append({"mix": name, "capacity": cap, "l1": l1, "offline_pct": 100 * (off / l1 - 1),
                         "offline_bfd_pct": 100 * (off_bfd / l1 - 1), "buffers": per_buffer})
            verdicts.append(f"{name} cap {cap}: {'PASS' if goal else 'MISS'}")
            all_ok &= bool(goal)
    echo.line("  (wait = most rounds a sample was carried; window = pack each buffer alone, carry = default)")
    echo.verdict("  goal: buffer 1,000 with carry-over <= L1 + 0.1 %: " + "; ".join(verdicts), all_ok)
    return all_ok, rows


def bench_state_size(echo: Echo) -> dict:
    """Section 3; returns ``{"sample_keys", "pickle_bytes", "torch_save_bytes"}``."""
    import torch

    from seqpack.stream.packer import StreamingPacker

    lens = lognormal_mix(50_000, 4096)
    p = StreamingPacker(lens, 4096, packing_buffer_size=10_000, output="indices")
    it = iter(p)
    for _ in range(50):
        next(it)
    state = p.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    n_keys = len(state["buffer_keys"]) + len(state["pending_keys"])
    echo.line("\n== 3. state_dict size, buffer 10,000 (after 50 packs)")
    size = {"sample_keys": n_keys, "pickle_bytes": len(pickle.dumps(state)), "torch_save_bytes": len(buf.getvalue())}
    echo.line(f"  {n_keys:,} sample keys held; pickle {size['pickle_bytes']:,} B; torch.save {size['torch_save_bytes']:,} B")
    return size


def bench_rows(n: int, echo: Echo) -> dict:
    """Sample objects -> PackedSequence rows (includes build_packed_sequence), and state_dict cost.

    Returns ``{"samples", "rows", "samples_per_s", "rows_per_s", "state_dict_us"}``."""
    from seqpack.stream.packer import StreamingPacker  # imports torch

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
    echo.line(f"\n== 4. rows: {n:,} Sample objects -> {rows:,} PackedSequence rows (cap {cap}, buffer 1,000, multiple 8)")
    echo.line(f"  {n / dt:,.0f} samples/s, {rows / dt:,.0f} rows/s (build_packed_sequence included)")
    echo.line(f"  state_dict() with buffer 10,000: {1e6 * sd:,.0f} us per call (StatefulDataLoader calls it per batch "
          "in each worker unless snapshot_every_n_steps is raised)")
    return {"samples": n, "rows": rows, "samples_per_s": n / dt, "rows_per_s": rows / dt, "state_dict_us": 1e6 * sd}


def sizes(*, quick: bool = False, n: int | None = None, repeats: int | None = None,
          efficiency_n: int | None = None) -> dict[str, int]:
    """The sizes of a run: explicit values win over ``quick``'s (1,000,000 / 3 / 500,000 / 100,000 full;
    300,000 / 2 / 150,000 / 20,000 quick). Keys: ``throughput_n``, ``repeats``, ``efficiency_n``, ``rows_n``."""
    return {"throughput_n": n if n is not None else (300_000 if quick else 1_000_000),
            "repeats": repeats if repeats is not None else (2 if quick else 3),
            "efficiency_n": efficiency_n if efficiency_n is not None else (150_000 if quick else 500_000),
            "rows_n": 20_000 if quick else 100_000}


def run_benchmark(*, quick: bool = False, n: int | None = None, repeats: int | None = None,
                  efficiency_n: int | None = None, echo: Echo | None = None,
                  figures: dict[str, Any] | None = None,
                  on_section: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the four sections in this process; print through ``echo`` and return the figures.

    Args:
        quick, n, repeats, efficiency_n: the sizes (:func:`sizes`; ``n`` and ``efficiency_n`` are sample
            counts >= 1, ``repeats`` >= 1).
        echo: where the lines go (default :class:`Echo`: printed).
        figures: the dict to fill (default a new one); after an exception it holds the sections done.
        on_section: called with ``figures`` once before the run and after each section (``--json`` writes
            the file there).

    Returns:
        ``figures``: ``sizes``, ``goals`` (``throughput_ge_1M_per_s``, ``carry_buffer_1000_le_l1_plus_0.1pct``:
        bool), ``throughput`` (samples/s), ``efficiency`` (list per mix and capacity, % above L1),
        ``state_dict`` (bytes), ``rows`` (rates); the module docstring lists every key.
    """
    echo = echo or Echo()
    figures = {} if figures is None else figures
    figures.update(sizes=sizes(quick=quick, n=n, repeats=repeats, efficiency_n=efficiency_n), goals={})
    size = figures["sizes"]
    save = on_section or (lambda _f: None)
    save(figures)
    import seqpack.stream.packer  # noqa: F401 - loads torch (~1.5 s) before the total clock starts

    t0 = time.perf_counter()
    figures["throughput"] = bench_throughput(size["throughput_n"], size["repeats"], echo)
    ok1 = figures["goals"]["throughput_ge_1M_per_s"] = figures["throughput"]["stream_numpy_source"] >= THROUGHPUT_GOAL
    save(figures)
    ok2, figures["efficiency"] = bench_efficiency(size["efficiency_n"], echo)
    figures["goals"]["carry_buffer_1000_le_l1_plus_0.1pct"] = ok2
    save(figures)
    figures["state_dict"] = bench_state_size(echo)
    save(figures)
    figures["rows"] = bench_rows(size["rows_n"], echo)
    save(figures)
    echo.verdict(f"\nsummary: throughput {'PASS' if ok1 else 'MISS'}, efficiency {'PASS' if ok2 else 'MISS'} "
                 f"({time.perf_counter() - t0:.0f} s)", ok1 and ok2)
    return figures


def write_figures(path: str | os.PathLike, figures: dict[str, Any]) -> None:
    """Write ``figures`` to ``path`` as JSON, whole file or none (a reader never sees half a document)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(figures, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv=None) -> None:
    """``python -m seqpack_bench.bench_stream [--quick] [--n N] [--repeats R] [--efficiency-n N] [--json PATH]``."""
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
    run_benchmark(quick=args.quick, n=args.n, repeats=args.repeats, efficiency_n=args.efficiency_n,
                  on_section=(lambda f: write_figures(args.json, f)) if args.json else None)


if __name__ == "__main__":
    main()
