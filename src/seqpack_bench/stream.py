"""``seqpack bench stream``: run the streaming-packer benchmark, record what it printed, chart it.

The benchmark is :func:`seqpack_bench.bench_stream.run_benchmark` (``StreamingPacker`` throughput,
efficiency vs offline packing, state size), called in this process; its lines are relayed live and
recorded, and its figures and goals are taken from the structure it returns (never read back from the
text). Written into ``out_dir``:

- ``stream.json``: command, exit code (0 done, 1 the benchmark raised), wall seconds, the full output,
  the goals (one per verdict the benchmark reported, ``pass`` as it judged it) and the figures the
  benchmark returned (``throughput`` in samples/s, ``efficiency`` rows of packs above L1 in % per buffer
  size, ``state_dict`` bytes, ``rows`` rates; see :mod:`seqpack_bench.bench_stream`);
- ``stream_efficiency.png``: packs above the L1 bound (%) against the buffer size, one line per data
  mix, capacity and mode (``carry`` = the default carry-over, ``window`` = each buffer packed alone);
- ``stream_throughput.png``: samples/s of the streaming packer (numpy source, plain iterable) and of
  offline ``pack_lengths`` on the same lengths.

With ``quick``, every echoed verdict line ends with " (quick: informational)" and the goals are stored
with ``"informational": "quick: informational"`` (the goals are judged on the full run; ``output`` in the
JSON keeps the text as the benchmark printed it). A chart whose figures are missing (the benchmark failed
before that section) is not written; the reason is printed and stored in ``charts_skipped``.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

from seqpack_bench import bench_stream
from seqpack_bench.timing import bar_chart, ensure_out_dir, line_chart, write_json

__all__ = ["BUILTIN_COMMAND", "run_stream", "QUICK_NOTE"]

#: Printed after a ``--quick`` run (its verdict lines are labelled "(quick: informational)").
QUICK_NOTE = ("note: --quick verdicts are informational: the goals are judged on the full run "
              "(`seqpack bench stream`: 1,000,000 lengths for throughput, 500,000 per efficiency set, 3 repeats)")
#: ``command`` of ``stream.json`` for the built-in benchmark (the same run from a shell, without --quick).
BUILTIN_COMMAND = "python -m seqpack_bench.bench_stream"


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
        skipped.append("stream_efficiency.png: no efficiency figures (section 2) from the benchmark")
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
        skipped.append("stream_throughput.png: no throughput figures (section 1) from the benchmark")
    return written, skipped


class _Recorder(bench_stream.Echo):
    """Records the benchmark's lines and goals; echoes them (verdict lines labelled with ``quick``)."""

    def __init__(self, *, quick: bool, echo: bool) -> None:
        self.quick, self.echo = quick, echo
        self.lines: list[str] = []
        self.goals: list[dict[str, Any]] = []

    def line(self, text: str, *, verdict: bool = False) -> None:
        self.lines.append(text + "\n")
        if self.echo:
            print(text + (" (quick: informational)" if self.quick and verdict else ""), flush=True)

    def verdict(self, text: str, ok: bool) -> None:
        self.line(text, verdict=True)
        self.goals.append(_goal(text, ok, self.quick))


def _goal(line: str, ok: bool, quick: bool) -> dict[str, Any]:
    """``{"goal", "pass"}`` of a verdict line: its text without a leading PASS/MISS tag."""
    s = line.strip()
    text = s[4:].strip() if s.startswith(("PASS", "MISS")) else s
    return {"goal": text, "pass": ok, **({"informational": "quick: informational"} if quick else {})}


def _run_builtin(quick: bool, rec: _Recorder) -> tuple[int, dict[str, Any], str]:
    """The built-in benchmark in this process: (exit code, figures, command)."""
    figures: dict[str, Any] = {}
    try:
        bench_stream.run_benchmark(quick=quick, echo=rec, figures=figures)
        rc = 0
    except Exception:  # noqa: BLE001 - a failed benchmark is a result (exit 1), its sections done are kept
        traceback.print_exc()
        rc = 1
    return rc, figures, BUILTIN_COMMAND + (" --quick" if quick else "")


def run_stream(*, quick: bool = False, out_dir: str | os.PathLike = "bench_results",
               echo: bool = True) -> dict[str, Any]:
    """Run the streaming benchmark in this process; write ``stream.json`` and the PNG charts.

    Returns:
        payload with ``benchmark``, ``command``, ``returncode``, ``quick``, ``wall_s``, ``output``, ``goals``
        (``{"goal", "pass"}`` per verdict the benchmark reported, plus ``informational`` with ``quick``),
        ``figures`` (what the benchmark returned; ``{}`` when nothing), ``throughput`` and ``efficiency``
        (copied from ``figures``; ``{}`` / ``[]`` when absent), ``charts`` (PNG file names written) and
        ``charts_skipped`` (one reason per chart not written).

    Raises:
        OutputDirError: ``out_dir`` cannot be created or written (checked before the run).
    """
    out = ensure_out_dir(out_dir, option="out_dir")
    t0 = time.perf_counter()
    rec = _Recorder(quick=quick, echo=echo)
    rc, figures, command = _run_builtin(quick, rec)
    charts, charts_skipped = _charts(figures, out)
    for reason in charts_skipped:
        if echo:
            print(f"note: chart not written: {reason}", flush=True)
    if echo and quick and rec.goals:
        print(QUICK_NOTE, flush=True)
    payload = {"benchmark": "stream", "command": command, "returncode": rc, "quick": quick,
               "wall_s": round(time.perf_counter() - t0, 3), "output": "".join(rec.lines), "goals": rec.goals,
               "figures": figures, "throughput": figures.get("throughput") or {},
               "efficiency": figures.get("efficiency") or [], "charts": charts, "charts_skipped": charts_skipped}
    write_json(out / "stream.json", payload)
    return payload
