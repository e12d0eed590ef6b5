"""Peak memory of ``seqpack pack`` (local engine, embedded Qwen3 tokenizer, seq_length 4096) on large
records and on many tiny records.

Every case is one ``python -m seqpack pack`` subprocess; its peak resident set is read from the kernel
(``VmHWM`` of that process, written by it at exit: :func:`peak_rss`). The figure judged is the peak minus the peak of a
baseline run on one short record (imports, tokenizer, Parquet writer), measured in the same run: the lower of two
baseline runs, the first also warming the caches a first run fills (so the baseline is not inflated by them):

* large records: one alpaca record of ``MB`` megabytes (mixed prose, numbers and code-like lines) among 4
  short ones, per over-length policy; goal ``<= 20x`` the record's size in bytes;
* tiny records: ``n`` ``hi``/``ok`` alpaca pairs in one JSONL file; goal ``<= 512`` bytes per record.

Usage: ``seqpack bench memory [--quick]`` (``run_memory``); results in ``memory.json``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from seqpack_bench._child import child_env

__all__ = ["LARGE_GOAL_X", "TINY_GOAL_BYTES", "build_inputs", "large_text", "peak_rss", "run_memory", "verdicts"]

#: goal: peak memory above the baseline <= this many times a large record's size
LARGE_GOAL_X = 20.0
#: goal: peak memory above the baseline <= this many bytes per tiny record
TINY_GOAL_BYTES = 512.0
#: over-length policies run on each large record (``seqpack.data.length_policy``)
POLICIES = ("truncate", "drop", "split")
FULL = {"large_mb": (5.0, 20.0), "tiny": (1_000_000,)}
QUICK = {"large_mb": (1.0,), "tiny": (20_000,)}

_WORDS = ("the packing of sequences into rows keeps each sample's boundaries while the model trains on "
          "every token with restarting positions and labels shifted per segment").split()


def large_text(nbytes: int, seed: int = 0) -> str:
    """About ``nbytes`` characters (ASCII, so bytes) of lines mixing prose, numbers and code-like text."""
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < nbytes:
        kind = rng.random()
        if kind < 0.6:
            line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 24))).capitalize() + "."
        elif kind < 0.8:
            line = ", ".join(str(rng.randint(0, 10**rng.randint(1, 7))) for _ in range(rng.randint(3, 12)))
        else:
            line = f"    x_{rng.randint(0, 999)} = f(y[{rng.randint(0, 99)}], z={rng.random():.4f})  # {rng.choice(_WORDS)}"
        out.append(line + "\n")
        n += len(line) + 1
    return "".join(out)[:nbytes]


def _short(i: int) -> dict[str, str]:
    return {"instruction": f"Name a prime number above {i}.", "input": "", "output": f"{i * 6 + 1} may be one."}


def build_inputs(folder: Path, large_mb: Sequence[float], tiny: Sequence[int]) -> dict[str, Any]:
    """Write the inputs into ``folder``: ``baseline.jsonl`` (one short record), ``large-<MB>mb.jsonl``
    (4 short records and one of ``MB`` megabytes, third) and ``tiny-<n>.jsonl``. Returns
    ``{"baseline": path, "large": {mb: (path, record bytes)}, "tiny": {n: path}}``."""
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "baseline.jsonl"
    base.write_text(json.dumps(_short(0)) + "\n", encoding="utf-8")
    large: dict[float, tuple[Path, int]] = {}
    for mb in large_mb:
        rec = {"instruction": "Write it all out.", "input": "", "output": large_text(int(mb * 1e6))}
        line = json.dumps(rec)
        path = folder / f"large-{mb:g}mb.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for r in (_short(1), _short(2)):
                f.write(json.dumps(r) + "\n")
            f.write(line + "\n")
            for r in (_short(3), _short(4)):
                f.write(json.dumps(r) + "\n")
        large[mb] = (path, len(line.encode("utf-8")))
    tinies: dict[int, Path] = {}
    for n in tiny:
        path = folder / f"tiny-{n}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            f.writelines('{"instruction": "hi", "input": "", "output": "ok"}\n' for _ in range(n))
        tinies[n] = path
    return {"baseline": base, "large": large, "tiny": tinies}


# The child writes its own VmHWM (peak RSS of its address space since exec) at exit. The kernel's
# ru_maxrss of a child is not used: it starts at the parent's RSS when the child was forked (Linux
# records the pre-exec high-water mark), so a child of a large parent would read large.
_WRAPPER = """
import atexit, runpy, sys
out = sys.argv[1]
def _report():
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(out, "w") as f:
        f.write(str(hwm * 1024))
atexit.register(_report)
if sys.argv[2] == "-c":
    code, sys.argv = sys.argv[3], ["-c", *sys.argv[4:]]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def peak_rss(args: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, float, int, str]:
    """Run ``python -m MODULE ARGS...`` (``args = [MODULE, *ARGS]``, or ``["-c", CODE, *ARGS]``) in a
    fresh interpreter; return ``(its peak RSS in bytes, wall seconds, exit status, stderr tail)``.

    The peak is the child's ``VmHWM`` at exit (``/proc/self/status``; Linux), 0 when it did not exit
    normally (killed)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="seqpack-peak-") as tmp, tempfile.TemporaryFile() as err:
        result = Path(tmp) / "hwm"
        p = subprocess.run([sys.executable, "-c", _WRAPPER, str(result), *args], stdout=subprocess.DEVNULL,
                           stderr=err, env=env)
        err.seek(0)
        tail = err.read()[-2000:].decode("utf-8", "replace")
        peak = int(result.read_text()) if result.is_file() else 0
    return peak, time.perf_counter() - t0, p.returncode, tail


def _pack(path: Path, out: Path, overlength: str) -> list[str]:
    return ["seqpack", "pack", str(path), "-o", str(out), "--seq-length", "4096",
            "--overlength", overlength, "--overwrite", "--quiet"]


def verdicts(result: dict[str, Any]) -> list[str]:
    """The PASS/MISS lines of a ``run_memory`` result."""
    lines = []
    for row in result["large"]:
        ok = row["ratio"] <= LARGE_GOAL_X
        lines.append(f"{'PASS' if ok else 'MISS'}: {row['mb']:g} MB record, overlength={row['policy']}: "
                     f"{row['ratio']:.1f}x its size (goal <= {LARGE_GOAL_X:g}x)")
    for row in result["tiny"]:
        ok = row["bytes_per_record"] <= TINY_GOAL_BYTES
        lines.append(f"{'PASS' if ok else 'MISS'}: {row['records']:,} tiny records: {row['bytes_per_record']:.0f} B "
                     f"per record (goal <= {TINY_GOAL_BYTES:g} B)")
    return lines


def run_memory(*, large_mb: Sequence[float], tiny: Sequence[int], out_dir: Path, quick: bool = False,
               policies: Sequence[str] = POLICIES, say: Any = print) -> dict[str, Any]:
    """Build the inputs in a temp folder, run every case in a subprocess, print the table and the
    verdicts, and write ``out_dir/memory.json``.

    Returns:
        ``{"baseline_mb", "large": [{"mb", "policy", "record_bytes", "peak_mb", "above_mb", "ratio",
        "seconds"}], "tiny": [{"records", "peak_mb", "above_mb", "bytes_per_record", "seconds"}],
        "verdicts", "quick", "date"}``.

    Raises:
        RuntimeError: a ``seqpack pack`` run failed (its stderr tail in the message).
    """
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="seqpack-bench-memory-") as tmp:
        root = Path(tmp)
        inputs = build_inputs(root / "in", large_mb, tiny)

        def measure(path: Path, overlength: str = "truncate") -> tuple[int, float]:
            peak, secs, rc, tail = peak_rss(_pack(path, root / "out", overlength), env)
            if rc != 0:
                raise RuntimeError(f"seqpack pack {path.name} --overlength {overlength} failed (exit {rc}): {tail}")
            return peak, secs

        bases = [measure(inputs["baseline"])[0] for _ in range(2)]
        base = min(bases)
        say(f"baseline (1 short record, lower of 2 runs): peak {base / 2**20:.0f} MB "
            f"({', '.join(f'{b / 2**20:.0f}' for b in bases)})")
        large = []
        for mb, (path, nbytes) in inputs["large"].items():
            for pol in policies:
                peak, secs = measure(path, pol)
                above = max(0, peak - base)
                large.append({"mb": mb, "policy": pol, "record_bytes": nbytes, "peak_mb": round(peak / 2**20, 1),
                              "above_mb": round(above / 2**20, 1), "ratio": round(above / nbytes, 2),
                              "seconds": round(secs, 1)})
                say(f"{mb:g} MB record, overlength={pol}: peak {peak / 2**20:.0f} MB, +{above / 2**20:.0f} MB above "
                    f"baseline = {above / nbytes:.1f}x the record ({secs:.0f} s)")
        tinies = []
        for n, path in inputs["tiny"].items():
            peak, secs = measure(path)
            above = max(0, peak - base)
            tinies.append({"records": n, "peak_mb": round(peak / 2**20, 1), "above_mb": round(above / 2**20, 1),
                           "bytes_per_record": round(above / n, 1), "seconds": round(secs, 1)})
            say(f"{n:,} tiny records: peak {peak / 2**20:.0f} MB, +{above / 2**20:.0f} MB above baseline = "
                f"{above / n:.0f} B per record ({secs:.0f} s)")
    result = {"baseline_mb": round(base / 2**20, 1), "large": large, "tiny": tinies, "quick": quick,
              "date": time.strftime("%Y-%m-%d")}
    result["verdicts"] = verdicts(result)
    for line in result["verdicts"]:
        say(line + (" (quick: informational)" if quick else ""))
    (out_dir / "memory.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
