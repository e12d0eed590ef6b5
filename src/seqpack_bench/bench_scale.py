"""Scale figures: the planner on 10M lengths, and a synthetic chat corpus end to end on the local engine
and on a local Ray runtime with 2 CPUs.

Prints, per stage: wall time (median of repeats for the planner), peak RSS, packing efficiency.

Memory is measured from outside: every stage runs in a fresh subprocess and this script samples
``/proc/<pid>/status`` of that process **and all its descendants** (Ray's GCS, raylet and workers are
children of the driver) every 0.1 s. "summed RSS" adds VmRSS over processes, which counts Ray's
shared-memory object store once per process that maps it (an over-count); "private+shared-once" adds
RssAnon over processes plus the largest RssShmem once (the figure compared with the 4 GB goal).
``driver`` is the stage process alone (``ru_maxrss``; "private" = its peak RssAnon).

With ``--growth`` (default for full runs) the corpus is also packed at a quarter of its size, with the
same records per shard (so the same per-task memory and the same number of Ray workers), and the growth
of peak memory per record is printed next to the 8 bytes per record of the length array. At quick sizes
the Ray driver's write-stage buffers (Arrow/Ray prefetch, one Parquet shard of packs) are still filling
up, so part of the growth there is a plateau being reached, not a per-record cost.

Usage::

    python -m seqpack_bench.bench_scale --quick              # 10,000 records, 1M lengths, about 70 s (estimated)
    python -m seqpack_bench.bench_scale --quick --growth     # + the quarter-size corpus (RSS growth/record)
    python -m seqpack_bench.bench_scale                      # 1,000,000 records, 10M lengths (long)
    python -m seqpack_bench.bench_scale --records 200000 --no-ray

Linux only (reads ``/proc``). Needs ``seqpack[ray]`` for the Ray rows (skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from seqpack.algorithms import DEFAULT_ALGORITHM, pack_lengths
from seqpack_bench._argtypes import positive_int
from seqpack_bench._child import child_env, module_command

SEQ_LENGTH = 4096


# ------------------------------------------------------------------------------------ corpus


def _vocab(rng: np.random.Generator, n: int = 3000) -> list[str]:
    syll = ["ka", "to", "ri", "mun", "sel", "pa", "dor", "vi", "en", "lo", "tra", "qui", "ber", "son", "al", "ze"]
    words = set()
    while len(words) < n:
        k = int(rng.integers(1, 4))
        words.add("".join(syll[int(i)] for i in rng.integers(0, len(syll), k)))
    return sorted(words)


def write_corpus(root: Path, records: int, shards: int, seed: int = 0) -> list[Path]:
    """Write ``records`` OpenAI-format chats (``{"messages": [...]}``) into ``shards`` JSONL files.

    Turn lengths are log-normal (user ~40 words, assistant ~120 words, 1-3 turns, 20% with a system
    prompt), so token lengths span ~30 to a few thousand with a long tail (some are truncated at 4096).
    """
    rng = np.random.default_rng(seed)
    vocab = np.array(_vocab(rng))
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"chats-{k:03d}.jsonl" for k in range(shards)]
    per = [records // shards + (1 if k < records % shards else 0) for k in range(shards)]
    for path, n in zip(paths, per):
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(n):
                msgs = []
                if rng.random() < 0.2:
                    msgs.append({"role": "system", "content": " ".join(vocab[rng.integers(0, len(vocab), 12)])})
                for _t in range(int(rng.integers(1, 4))):
                    u = int(min(1500, max(1, rng.lognormal(3.4, 0.8))))
                    a = int(min(3000, max(1, rng.lognormal(4.5, 0.9))))
                    msgs.append({"role": "user", "content": " ".join(vocab[rng.integers(0, len(vocab), u)])})
                    msgs.append({"role": "assistant", "content": " ".join(vocab[rng.integers(0, len(vocab), a)])})
                f.write(json.dumps({"messages": msgs}) + "\n")
    return paths


# ------------------------------------------------------------------------------------ RSS sampling


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _mem(pid: int) -> tuple[int, int, int]:
    """``(VmRSS, RssAnon, RssShmem)`` of a process in bytes (0s if it is gone)."""
    vals = {"VmRSS:": 0, "RssAnon:": 0, "RssShmem:": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k = line.split(":", 1)[0] + ":"
                if k in vals:
                    vals[k] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return vals["VmRSS:"], vals["RssAnon:"], vals["RssShmem:"]


def tree_mem(pid: int) -> tuple[int, int, int]:
    """Over ``pid`` and its descendants: (sum of VmRSS, sum of RssAnon + the largest RssShmem, RssAnon of
    ``pid``). The second figure counts private memory once and shared memory (Ray's object store) once."""
    kids = _children_map()
    rss = anon = shm = 0
    own_anon = 0
    stack, seen = [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        r, a_, s_ = _mem(p)
        rss += r
        anon += a_
        shm = max(shm, s_)
        if p == pid:
            own_anon = a_
        stack.extend(kids.get(p, []))
    return rss, anon + shm, own_anon


def run_stage(args: list[str], timeout: float) -> dict:
    """Run ``python -m seqpack_bench.bench_scale --stage ... --result FILE`` in a subprocess; return the JSON it
    wrote plus the peak tree RSS."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = module_command("seqpack_bench.bench_scale", *args, "--result", str(out))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
    peak = [0, 0, 0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            for i, v in enumerate(tree_mem(proc.pid)):
                peak[i] = max(peak[i], v)
            stop.wait(0.1)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        stop.set()
        th.join()
    if proc.returncode != 0:
        raise RuntimeError(f"stage {args[:3]} failed (rc={proc.returncode}):\n{err[-3000:]}")
    res = json.loads(out.read_text())
    out.unlink()
    res["peak_tree_rss"], res["peak_tree_private"], res["peak_driver_anon"] = peak
    return res


# ------------------------------------------------------------------------------------ stages (child)


def stage_planner(n: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.0, 1.0, n), 1, SEQ_LENGTH).astype(np.int64)
    pack_lengths(lengths[:10_000], SEQ_LENGTH)  # warm-up (numba compile)
    times, plan = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        plan = pack_lengths(lengths, SEQ_LENGTH, DEFAULT_ALGORITHM, seed=0)
        times.append(time.perf_counter() - t)
    return {
        "n": n, "algorithm": str(getattr(plan.algorithm, "value", plan.algorithm)), "seconds": statistics.median(times),
        "times": times, "num_bins": plan.num_bins, "lower_bound": plan.lower_bound,
        "efficiency": float(plan.utilization), "length_array_bytes": int(lengths.nbytes),
    }


def stage_pack(engine: str, corpus: list[str], out: str) -> dict:
    # rows_per_shard=256: the writer buffers one Parquet shard of packs (256 x 4096 tokens), so its buffer
    # stays small next to the corpus and the growth figures show what scales with the number of records
    kw = dict(seq_length=SEQ_LENGTH, overlength="truncate", overwrite=True, validate=False, rows_per_shard=256)
    t = time.perf_counter()
    if engine == "local":
        from seqpack.pipeline import pack_dataset

        res = pack_dataset(corpus, out, **kw)
    else:
        from seqpack.pipeline import pack_dataset_ray

        res = pack_dataset_ray(corpus, out, num_cpus=2, object_store_memory=256 * 1024**2, **kw)
    wall = time.perf_counter() - t
    m = res.metadata
    return {
        "engine": engine, "seconds": wall, "timings": res.timings_s, "num_packs": m.num_packs,
        "lower_bound": m.lower_bound, "efficiency": m.packing_efficiency, "samples": m.counts["samples_packed"],
        "records": m.counts["records_read"], "tokens": m.counts["tokens"],
        "truncated": sum((m.counts.get("truncated") or {}).values()),
    }


# ------------------------------------------------------------------------------------ main


def _gb(b: float) -> str:
    return f"{b / 1024**3:.2f} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=positive_int, default=None,
                    help="records in the synthetic corpus, >= 1 (default 1,000,000; 10,000 with --quick)")
    ap.add_argument("--lengths", type=positive_int, default=None,
                    help="lengths through the planner, >= 1 (default 10,000,000; 1,000,000 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="10,000 records and 1M lengths unless --records/--lengths are given (about 70 s on 2 cores, "
                         "estimated from measured stage times: local engine 23 s, Ray 45 s)")
    ap.add_argument("--shard-records", type=positive_int, default=None,
                    help="records per JSONL shard (default 10,000; quick 1,250): one shard is one Ray task, "
                         "which holds its shard's samples while tokenizing")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray rows")
    growth = ap.add_mutually_exclusive_group()
    growth.add_argument("--no-growth", action="store_true", help="skip the quarter-size runs (RSS growth per record)")
    growth.add_argument("--growth", action="store_true", help="with --quick: also run the quarter-size corpus")
    ap.add_argument("--workdir", default=None, help="where the corpus and outputs go (default: a temp dir)")
    ap.add_argument("--stage", default=None, choices=("planner", "local", "ray"), help=argparse.SUPPRESS)
    ap.add_argument("--corpus", nargs="*", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=positive_int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.records is None:
        a.records = 10_000 if a.quick else 1_000_000
    if a.lengths is None:
        a.lengths = 1_000_000 if a.quick else 10_000_000

    if a.stage:  # child process
        if a.stage == "planner":
            res = stage_planner(a.lengths, a.repeats)
        else:
            res = stage_pack(a.stage, a.corpus, a.out)
        res["driver_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        Path(a.result).write_text(json.dumps(res))
        return

    # one input file is one Ray task, and a task holds its whole shard while tokenizing: fixed shard size
    shard_records = a.shard_records or (1_250 if a.quick else 10_000)
    if a.quick and not a.growth:
        a.no_growth = True  # keeps --quick short (the growth runs pack the corpus again)
    if not a.no_growth and a.records < 4:
        ap.error(f"argument --records: the growth runs pack a quarter of --records, so it must be >= 4 with "
                 f"them, got {a.records}; add --no-growth")
    have_ray = True
    try:
        import ray  # noqa: F401
    except ImportError:
        have_ray = False
    engines = ["local"] + (["ray"] if have_ray and not a.no_ray else [])
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="seqpack-bench-scale-"))
    timeout = 600 if a.quick else 6 * 3600
    t_all = time.perf_counter()
    print(f"seqpack bench_scale: seq_length={SEQ_LENGTH}, cpus={os.cpu_count()}, workdir={work}")
    try:
        # 1. planner
        p = run_stage(["--stage", "planner", "--lengths", str(a.lengths), "--repeats", str(1 if a.lengths > 5e6 else 3)],
                      timeout)
        print(f"\n[planner] {p['n']:,} lengths, {p['algorithm']}: {p['seconds']:.2f} s (median of {len(p['times'])}), "
              f"{p['n'] / p['seconds'] / 1e6:.2f} M lengths/s; {p['num_bins']:,} packs vs lower bound "
              f"{p['lower_bound']:,} ({p['num_bins'] / p['lower_bound']:.4f}x); efficiency {p['efficiency']:.4f}; "
              f"peak RSS {_gb(p['peak_tree_rss'])} (length array {_gb(p['length_array_bytes'])})")

        # 2. corpus end to end
        sizes = [a.records] if a.no_growth else [max(1, a.records // 4), a.records]
        rows = []
        for n in sizes:
            shards = -(-n // shard_records)
            t = time.perf_counter()
            corpus = write_corpus(work / f"corpus-{n}", n, shards)
            print(f"\n[corpus] {n:,} records in {shards} JSONL shards "
                  f"({sum(c.stat().st_size for c in corpus) / 1024**2:.1f} MiB, written in {time.perf_counter() - t:.1f} s)")
            for eng in engines:
                r = run_stage(["--stage", eng, "--corpus", *map(str, corpus), "--out", str(work / f"out-{eng}-{n}")],
                              timeout)
                r["n"] = n
                rows.append(r)
                tm = r["timings"]
                print(f"[{eng:5s}] {r['records']:,} records -> {r['samples']:,} samples ({r['truncated']} truncated), "
                      f"{r['tokens']:,} tokens -> {r['num_packs']:,} packs (lower bound {r['lower_bound']:,}); "
                      f"efficiency {r['efficiency']:.4f}; {r['seconds']:.1f} s (prepare {tm['prepare']:.1f}, plan "
                      f"{tm['plan']:.2f}, write {tm['write']:.1f}); {r['records'] / r['seconds']:,.0f} records/s; "
                      f"peak RSS {_gb(r['peak_tree_rss'])} summed over processes, {_gb(r['peak_tree_private'])} "
                      f"private+shared-once; driver {_gb(r['driver_maxrss'])} (private {_gb(r['peak_driver_anon'])})")
                shutil.rmtree(work / f"out-{eng}-{n}", ignore_errors=True)
        # 3. ratios measured in this run
        print("\n[summary]")
        big = [r for r in rows if r["n"] == a.records]
        by = {r["engine"]: r for r in big}
        if "ray" in by:
            print(f"  ray(2 CPUs) / local wall time at {a.records:,} records: {by['ray']['seconds'] / by['local']['seconds']:.2f}x; "
                  f"same efficiency: {by['ray']['efficiency'] == by['local']['efficiency']}")
        if len(sizes) == 2:
            for eng in engines:
                lo = next(r for r in rows if r["engine"] == eng and r["n"] == sizes[0])
                hi = next(r for r in rows if r["engine"] == eng and r["n"] == sizes[1])
                dn = hi["n"] - lo["n"]
                g = {k: (hi[k] - lo[k]) / dn for k in ("peak_tree_rss", "peak_tree_private", "driver_maxrss", "peak_driver_anon")}
                print(f"  {eng}: peak memory growth from {sizes[0]:,} to {sizes[1]:,} records, per record: "
                      f"{g['peak_tree_private']:,.0f} B private+shared-once ({g['peak_tree_rss']:,.0f} B summed RSS), "
                      f"driver {g['peak_driver_anon']:,.0f} B private ({g['driver_maxrss']:,.0f} B RSS); "
                      f"length array: 8 B/record")
        goal = 4 * 1024**3
        for r in big:
            print(f"  {r['engine']}: peak memory {_gb(r['peak_tree_private'])} (private+shared-once) at {a.records:,} records "
                  f"({'within' if r['peak_tree_private'] <= goal else 'ABOVE'} the 4 GB goal"
                  f"{'' if a.records >= 1_000_000 else ', goal is for 1M records'})")
        print(f"  total bench wall time {time.perf_counter() - t_all:.0f} s")
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
