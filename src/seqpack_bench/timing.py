"""Shared measurement helpers of the benchmarks: medians of repeats, JSON and PNG writers, tables.

Every benchmark of :mod:`seqpack_bench` measures the programs it compares in the same process and
run, reports the **median** of ``repeats`` runs (wall clock from ``time.perf_counter`` and CPU time
of this process from ``time.process_time``; on a shared, noisy box the CPU figure is the steadier
one), and writes one JSON file plus PNG charts (matplotlib, ``Agg`` backend, no display needed).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = [
    "OutputDirError",
    "ensure_out_dir",
    "Timing",
    "timed",
    "machine_info",
    "write_json",
    "bar_chart",
    "line_chart",
    "print_table",
    "verdict",
]


@dataclass
class Timing:
    """Median wall and CPU seconds of ``repeats`` runs (plus every run, for the record).

    Attributes:
        wall_s: median wall-clock seconds.
        cpu_s: median CPU seconds of this process (all threads).
        repeats: number of runs.
        walls_s, cpus_s: every run, in order.
    """

    wall_s: float
    cpu_s: float
    repeats: int
    walls_s: list[float] = field(default_factory=list)
    cpus_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timed(fn: Callable[[], Any], repeats: int = 3, *, warmup: int = 0) -> tuple[Any, Timing]:
    """Run ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed.

    Returns:
        ``(result of the last timed run, Timing)``; medians over the timed runs.

    Raises:
        ValueError: ``repeats < 1`` or ``warmup < 0``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        fn()
    walls, cpus, res = [], [], None
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        res = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return res, Timing(statistics.median(walls), statistics.median(cpus), repeats, walls, cpus)


class OutputDirError(ValueError):
    """The output folder of a benchmark cannot be created or written (raised before any work)."""


def ensure_out_dir(path: str | os.PathLike, *, option: str = "--out") -> Path:
    """Create the output folder ``path`` (with parents) and check that a file can be written in it.

    Every benchmark calls this **before** it measures anything, so a bad folder fails in one line
    instead of a traceback after minutes of work. It is the one output-folder check of the project:
    ``seqpack_bench.train.check_out_dir`` (``seqpack train``) and ``seqpack_bench.gpu.bench_gpu`` call it too.

    Args:
        path: the folder for the JSON and PNG files.
        option: how the caller names the setting in messages (``"--out"`` on the command line,
            ``"out_dir"`` from Python).

    Returns:
        ``Path(path)``, now an existing, writable folder.

    Raises:
        OutputDirError: ``path`` is empty (``""`` or blanks: it would mean the current folder, which
            ``--out ""`` / ``--out=`` never intends; pass a ``str``, since ``Path("")`` is already
            ``Path(".")``), is a file, one of its parents is a file, or the folder cannot be created or
            written (permissions, read-only file system); the message names ``option``, the path and
            the fix.
    """
    if isinstance(path, (str, bytes)) and not path.strip():
        raise OutputDirError(f"{option} is empty ({path!r}); pass the folder for the results, e.g. {option} "
                             "bench_results, or leave the option out for its default folder")
    p = Path(path)
    fix = f"pass {option} with a writable folder (it is created if missing)"
    if p.exists() and not p.is_dir():
        raise OutputDirError(f"{option} {p}: this is a file, not a folder; {fix}")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((a for a in p.parents if a.exists() and not a.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker else "a part of the path is a file"
        raise OutputDirError(f"{option} {p}: cannot create this folder ({why}); {fix}") from None
    except OSError as exc:
        raise OutputDirError(f"{option} {p}: cannot create this folder ({exc.strerror or exc}); {fix}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".seqpack_write_check_", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputDirError(f"{option} {p}: cannot write in this folder ({exc.strerror or exc}); {fix}") from None
    return p


def machine_info() -> dict[str, Any]:
    """Where and when a figure was measured: host CPU count, platform, Python, UTC timestamp."""
    info: dict[str, Any] = {
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - not on every OS
        pass
    return info


def _clean(obj: Any) -> Any:
    """JSON-safe copy: numpy scalars/arrays to Python, NaN/inf to None, paths to str."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Timing):
        return obj.to_dict()
    if np is not None:
        if isinstance(obj, np.ndarray):
            return _clean(obj.tolist())
        if isinstance(obj, np.generic):
            obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (with a ``machine`` block added if absent) as indented JSON; returns the path.

    numpy values become plain numbers, non-finite floats become ``null``. Parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dict(payload)
    data.setdefault("machine", machine_info())
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def bar_chart(path: str | os.PathLike, labels: Sequence[str], values: Sequence[float], *, title: str,
              ylabel: str, annotate: Sequence[str] | None = None, log: bool = False,
              colors: Sequence[str | None] | None = None, horizontal: bool | None = None) -> Path:
    """Write a PNG bar chart (one bar per label; ``annotate`` = text at the end of each bar).

    Bars are blue when their label contains "seqpack", grey otherwise; ``colors`` (one matplotlib
    colour or ``None`` per bar) overrides that per bar, e.g. to set apart a result that is not
    comparable.

    Args:
        ylabel: the value axis title (the x axis of a horizontal chart).
        log: logarithmic value axis.
        horizontal: one bar per row, labels written level on the left, the figure as tall as the
            bars need (readable with many bars and long labels); ``None`` (default) = horizontal from
            7 bars on, vertical columns for fewer.
    """
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(labels)
    vals = [float(v) if v is not None else 0.0 for v in values]
    default = ["#4c72b0" if "seqpack" in str(lb) else "#999999" for lb in labels]
    cols = [c or d for c, d in zip(colors, default)] if colors is not None else default
    if horizontal is None:
        horizontal = n > 6
    if horizontal:
        lines = max([str(lb).count("\n") + 1 for lb in labels] or [1])
        row_in = 0.16 * lines + 0.14  # inches per bar: label lines plus a gap
        longest = max([len(part) for lb in labels for part in str(lb).split("\n")] or [10])
        fig, ax = plt.subplots(figsize=(max(8.0, 4.5 + 0.07 * longest), max(2.8, 1.5 + row_in * n)))
        bars = ax.barh(range(n), vals, color=cols, height=0.7)
        ax.set_yticks(range(n))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()  # first label on top, as in the tables
        ax.set_xlabel(ylabel)
        if log:
            ax.set_xscale("log")
        for b, txt in zip(bars, annotate or []):
            ax.annotate(txt, (b.get_width(), b.get_y() + b.get_height() / 2), xytext=(3, 0),
                        textcoords="offset points", ha="left", va="center", fontsize=7)
        lo, hi = ax.get_xlim()  # room on the right for the annotations
        ax.set_xlim(lo, hi * 4 if log else hi * 1.12)
        ax.grid(axis="x", alpha=0.3)
    else:
        longest = max([len(part) for lb in labels for part in str(lb).split("\n")] or [10])
        fig, ax = plt.subplots(figsize=(max(5.0, max(0.9, 0.075 * longest) * n + 2), 4.0))
        bars = ax.bar(range(n), vals, color=cols)
        ax.set_xticks(range(n))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        for b, txt in zip(bars, annotate or []):
            ax.annotate(txt, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
    # title centred on the figure, wrapped to its width (about 11 characters per inch at size 10): never cut off
    width_chars = max(30, int(fig.get_size_inches()[0] * 11))
    fig.suptitle("\n".join(textwrap.fill(part, width_chars) for part in title.split("\n")), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def line_chart(path: str | os.PathLike, series: dict[str, Sequence[float]], *, title: str, xlabel: str,
               ylabel: str, x: Sequence[float] | None = None, logx: bool = False, logy: bool = False,
               linestyles: Sequence[str] | None = None, colors: Sequence[str] | None = None) -> Path:
    """Write a PNG line chart with one line per ``series`` entry.

    Args:
        x: x values shared by every series (default 1, 2, ...; each series must have ``len(x)`` points).
        logx, logy: logarithmic axes (non-positive values are not drawn on a log axis).
        linestyles, colors: one matplotlib line style / colour per series (default: cycle through
            ``- -- : -.`` and matplotlib's colour cycle).
    """
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    styles = ["-", "--", ":", "-."]
    for k, (name, ys) in enumerate(series.items()):
        xs = list(x) if x is not None else list(range(1, len(ys) + 1))
        ax.plot(xs, list(ys), linestyles[k] if linestyles else styles[k % len(styles)], label=name, linewidth=1.2,
                marker="o" if x is not None else None, markersize=3, color=colors[k] if colors else None)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if x is not None:
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{v:,.0f}" if float(v).is_integer() else f"{v:g}" for v in x])
        ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], console: Any = None, *,
                text_columns: int = 1) -> None:
    """Print a rich table (numbers right-aligned; floats shown with 4 significant digits).

    No cell is cut to ``…``: every column folds onto further lines when the console is narrow, and
    the first column (the names) keeps at least the width of its longest cell (up to 44 characters).
    The first ``text_columns`` columns are left-aligned, the others right-aligned.
    """
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and CI: keep wide tables readable
            console = Console(width=max(console.width, 180))
    t = Table(title=title, title_justify="left")
    cells = [[_fmt(v) for v in r] for r in rows]
    first = min(44, max([len(str(columns[0]))] + [len(r[0]) for r in cells if r]))
    for k, c in enumerate(columns):
        t.add_column(str(c), justify="left" if k < text_columns else "right", overflow="fold",
                     min_width=first if k == 0 else None)
    for r in cells:
        t.add_row(*r)
    console.print(t)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v)


def verdict(label: str, ok: bool, info: str, console: Any = None, *,
            informational: str | None = None) -> dict[str, Any]:
    """Print ``PASS``/``MISS`` for a goal and return it as a dict (``goal``, ``pass``, ``info``).

    Args:
        informational: a reason the verdict does not judge the goal (e.g. ``"quick: informational"``
            for a ``--quick`` run, whose small sizes are dominated by fixed start-up costs). It is
            printed after the tag (``MISS (quick: informational)  <label>: <info>``, in yellow rather
            than red/green) and stored as ``informational`` in the returned dict.
    """
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    tag = "PASS" if ok else "MISS"
    colour = "yellow" if informational else ("green" if ok else "red")
    extra = f" ({informational})" if informational else ""
    console.print(f"[{colour}]{tag}{escape(extra)}[/]  {escape(label)}: {escape(info)}", highlight=False)
    out: dict[str, Any] = {"goal": label, "pass": bool(ok), "info": info}
    if informational:
        out["informational"] = informational
    return out
