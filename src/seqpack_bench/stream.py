"""``seqpack bench stream``: run the streaming-packer benchmark, record what it printed, chart it.

The benchmark itself is ``benchmarks/bench_stream.py`` (owned by the streaming module; it measures
``StreamingPacker`` throughput, efficiency vs offline packing and state size). This wrapper runs it
in a child process with the same interpreter, relays its output live, and writes into ``out_dir``:

- ``stream.json``: command, exit code, wall seconds, the full output, every line carrying PASS/MISS
  verdicts as a goal (``pass`` is False when the line has any MISS), and the figures the script wrote
  with ``--json`` (``throughput`` in samples/s, ``efficiency`` rows of packs above L1 in % per buffer
  size, ``state_dict`` bytes, ``rows`` rates; see the script's docstring);
- ``stream_efficiency.png``: packs above the L1 bound (%) against the buffer size, one line per data
  mix, capacity and mode (``carry`` = the default carry-over, ``window`` = each buffer packed alone);
- ``stream_throughput.png``: samples/s of the streaming packer (numpy source, plain iterable) and of
  offline ``pack_lengths`` on the same lengths.

With ``quick``, every echoed line that carries a PASS/MISS verdict ends with " (quick: informational)"
and the goals are stored with ``"informational": "quick: informational"`` (the goals are judged on the
full run; ``output`` in the JSON keeps the script's text as printed by it).

A chart whose figures the script did not write (it failed before that section, or a ``script`` without
the ``--json`` option) is not written; the reason is printed and stored in ``charts_skipped``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from seqpack.bench.timing import bar_chart, ensure_out_dir, line_chart, write_json

__all__ = ["default_script", "parse_stream_output", "run_stream", "QUICK_NOTE"]

#: Printed after a ``--quick`` run (its verdict lines are labelled "(quick: informational)").
QUICK_NOTE = ("note: --quick verdicts are informational: the goals are judged on the full run "
              "(`seqpack bench stream`: 1,000,000 lengths for throughput, 500,000 per efficiency set, 3 repeats)")
_VERDICT_RE = re.compile(r"\b(PASS|MISS)\b")

_BUFFER_RE = re.compile(r"B=(\d[\d,]*)")
_EFF_ROW_RE = re.compile(r"^\s*(\w+)\s+(\d+)\s+(\d+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s*\|(.*)$")
_RATE_RE = re.compile(r"^\s*(map-style numpy source|plain iterable of ints|offline pack_lengths)\s*:\s*([\d,]+)\s+samples/s")
_RATE_KEYS = {"map-style numpy source": "stream_numpy_source", "plain iterable of ints": "stream_iterable",
              "offline pack_lengths": "offline_pack_lengths"}


def default_script() -> Path:
    """``benchmarks/bench_stream.py`` of this source checkout (not shipped in the wheel)."""
    return Path(__file__).resolve().parents[3] / "benchmarks" / "bench_stream.py"


def parse_stream_output(output: str) -> dict[str, Any]:
    """Read the figures back from the text ``bench_stream.py`` prints (e.g. a saved log).

    :func:`run_stream` does not use this: it reads the JSON file the script writes with ``--json``
    (full precision, no dependence on the text layout). The printed figures are rounded (3 decimals
    for percentages, whole samples/s).

    Section 1 lines ``<name> : <N> samples/s`` give ``throughput`` (samples per second, float):
    keys ``stream_numpy_source``, ``stream_iterable``, ``offline_pack_lengths`` (those found).
    Section 2 (header ``B=<size> window carry wait`` per buffer, then one row per mix and capacity:
    ``mix cap L1 offline offl-BFD | window carry wait | ...``) gives ``efficiency``: a list of
    ``{"mix", "capacity", "l1", "offline_pct", "offline_bfd_pct", "buffers": [{"buffer", "window_pct",
    "carry_pct", "max_wait"}]}``, percentages = packs above L1 in %.

    Returns:
        ``{"throughput": {...}, "efficiency": [...]}``; empty when the output holds no such lines.
    """
    throughput: dict[str, float] = {}
    efficiency: list[dict[str, Any]] = []
    buffers: list[int] = []
    for line in output.splitlines():
        m = _RATE_RE.match(line)
        if m:
            throughput[_RATE_KEYS[m.group(1)]] = float(m.group(2).replace(",", ""))
            continue
        if "window" in line and "carry" in line and "B=" in line:
            buffers = [int(b.replace(",", "")) for b in _BUFFER_RE.findall(line)]
            continue
        m = _EFF_ROW_RE.match(line)
        if not (m and buffers):
            continue
        cells = [c.split() for c in m.group(6).split("|")]
        if len(cells) != len(buffers) or any(len(c) != 3 for c in cells):
            continue
        try:
            per_buffer = [{"buffer": b, "window_pct": float(c[0]), "carry_pct": float(c[1]), "max_wait": int(c[2])}
                          for b, c in zip(buffers, cells)]
        except ValueError:
            continue
        efficiency.append({"mix": m.group(1), "capacity": int(m.group(2)), "l1": int(m.group(3)),
                           "offline_pct": float(m.group(4)), "offline_bfd_pct": float(m.group(5)),
                           "buffers": per_buffer})
    return {"throughput": throughput, "efficiency": efficiency}


def _charts(figures: dict[str, Any], out_dir: Path) -> tuple[list[str], list[str]]:
    """Write the PNGs that ``figures`` allow; returns (written file names, reasons for skipped charts)."""
    written, skipped = [], []
    eff = figures.get("efficiency") or []
    if eff:
        xs = [b["buffer"] for b in eff[0]["buffers"]]
        series: dict[str, list[float]] = {}
        styles, colors = [], []
        palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
        for k, row in enumerate(r for r in eff if [b["buffer"] for b in r["buffers"]] == xs):
            for mode, style in (("carry", "-"), ("window", "--")):
                # a log axis cannot show 0 %: exact packings are drawn at a floor of 0.001 %
                series[f"{row['mix']} C={row['capacity']} {mode}"] = [max(b[f"{mode}_pct"], 1e-3)
                                                                      for b in row["buffers"]]
                styles.append(style)
                colors.append(palette[k % len(palette)])
        line_chart(out_dir / "stream_efficiency.png", series, x=xs, logx=True, logy=True, linestyles=styles,
                   colors=colors,
                   title="StreamingPacker: packs above the L1 bound\n"
                         "solid = carry-over (default), dashed = each buffer packed alone",
                   xlabel="packing_buffer_size (samples)", ylabel="% packs above L1 (log; 0 drawn at 0.001)")
        written.append("stream_efficiency.png")
    else:
        skipped.append("stream_efficiency.png: no efficiency figures (section 2) in the benchmark's --json file")
    tp = figures.get("throughput") or {}
    if tp:
        names = {"stream_numpy_source": "seqpack StreamingPacker\n(numpy source)",
                 "stream_iterable": "seqpack StreamingPacker\n(plain iterable)",
                 "offline_pack_lengths": "seqpack pack_lengths\n(offline, one call)"}
        keys = [k for k in names if k in tp]
        bar_chart(out_dir / "stream_throughput.png", [names[k] for k in keys], [tp[k] / 1e6 for k in keys],
                  title="Packing throughput (median)\nlength-only samples, buffer 10,000, capacity 4096",
                  ylabel="million samples per second", annotate=[f"{tp[k] / 1e6:.2f} M/s" for k in keys])
        written.append("stream_throughput.png")
    else:
        skipped.append("stream_throughput.png: no throughput figures (section 1) in the benchmark's --json file")
    return written, skipped


def run_stream(*, quick: bool = False, script: str | os.PathLike | None = None,
               out_dir: str | os.PathLike = "bench_results", echo: bool = True) -> dict[str, Any]:
    """Run ``bench_stream.py`` (``--quick`` when asked, ``--json`` into a temporary file); write
    ``stream.json`` and the PNG charts.

    Returns:
        payload with ``benchmark``, ``command``, ``returncode``, ``quick``, ``wall_s``, ``output``, ``goals``
        (``{"goal", "pass"}`` per PASS/MISS line, plus ``informational`` with ``quick``), ``figures`` (what
        the script wrote with ``--json``; ``{}`` when it wrote nothing), ``throughput`` and ``efficiency``
        (copied from ``figures``, as earlier versions stored them; ``{}`` / ``[]`` when absent), ``charts``
        (PNG file names written) and ``charts_skipped`` (one reason per chart not written).

    Raises:
        FileNotFoundError: the script does not exist (it ships in the source tree only).
        OutputDirError: ``out_dir`` cannot be created or written (checked before the run).
    """
    path = Path(script) if script else default_script()
    if not path.is_file():
        raise FileNotFoundError(f"streaming benchmark not found at {path}; pass script=PATH (it ships in the "
                                "source tree, not in the wheel)")
    out = ensure_out_dir(out_dir, option="out_dir")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="seqpack-bench-stream-") as tmp:
        figures_path = Path(tmp) / "figures.json"
        cmd = [sys.executable, str(path)] + (["--quick"] if quick else []) + ["--json", str(figures_path)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if echo:
                if quick and _VERDICT_RE.search(line):
                    print(line.rstrip("\n") + " (quick: informational)", flush=True)
                else:
                    print(line, end="", flush=True)
        rc = proc.wait()
        figures = json.loads(figures_path.read_text()) if figures_path.is_file() else {}
    output = "".join(lines)
    goals = []
    for line in lines:  # "PASS  <goal>" lines, or any line carrying PASS/MISS verdicts ("goal: ...: PASS; ...")
        s = line.strip()
        tags = re.findall(r"\b(PASS|MISS)\b", s)
        if not tags:
            continue
        text = s[4:].strip() if s.startswith(("PASS", "MISS")) else s
        goals.append({"goal": text, "pass": "MISS" not in tags,
                      **({"informational": "quick: informational"} if quick else {})})
    charts, charts_skipped = _charts(figures, out)
    for reason in charts_skipped:
        if echo:
            print(f"note: chart not written: {reason}", flush=True)
    if echo and quick and goals:
        print(QUICK_NOTE, flush=True)
    payload = {"benchmark": "stream", "command": " ".join(cmd), "returncode": rc, "quick": quick,
               "wall_s": round(time.perf_counter() - t0, 3), "output": output, "goals": goals, "figures": figures,
               "throughput": figures.get("throughput") or {}, "efficiency": figures.get("efficiency") or [],
               "charts": charts, "charts_skipped": charts_skipped}
    write_json(out / "stream.json", payload)
    return payload
