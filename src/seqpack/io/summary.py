"""Summary of a packed dataset for people (``seqpack pack`` / ``seqpack inspect``): the summary rows built
from its metadata, and the ``report.png`` plot (the per-record accounting is ``report.jsonl``, written by
``seqpack.io.writer``; the in-memory one is ``seqpack.accounting.PrepareReport``).

``report.png`` has two panels: the histogram of real sample (segment) lengths and the histogram of pack
fill (real tokens / ``seq_length``). Drawn with matplotlib's Agg canvas directly (no ``pyplot``, no
global backend switch), so it works headless and never changes the caller's matplotlib state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from seqpack.io.metadata import REPORT_PNG
from seqpack.io.output_dir import check_output_file
from seqpack.io.reader import PackedDataset, load_packed

__all__ = ["summary_rows", "plot_path", "plot_report", "REPORT_PNG"]


def plot_path(out_path: str | os.PathLike) -> Path:
    """The file :func:`plot_report` writes for ``out_path``, checked before any work: a path without a
    suffix gets ``.png``; a suffix must be an image format matplotlib writes (``png``, ``pdf``, ``svg`` ...).

    Raises:
        ValueError: the suffix is not such a format (e.g. ``.jsonl``).
        IsADirectoryError, NotADirectoryError, FileNotFoundError, PermissionError: the path is a folder,
            its parent is a file or missing, or it is not writable
            (:func:`seqpack.io.output_dir.check_output_file`; nothing is created).
    """
    from matplotlib.backend_bases import FigureCanvasBase

    out = Path(out_path).expanduser()
    if os.fspath(out_path).endswith(("/", os.sep)):  # a folder: refused, not turned into "<folder>.png"
        check_output_file(out_path, "plot", REPORT_PNG)
    out = check_output_file(out if out.suffix or out.is_dir() else out.with_name(out.name + ".png"), "plot", REPORT_PNG)
    kinds = FigureCanvasBase.get_supported_filetypes()
    if out.suffix[1:].lower() not in kinds:
        raise ValueError(f"cannot write the plot {out}: {out.suffix!r} is not an image format matplotlib "
                         f"writes; use .png (or one of {', '.join('.' + k for k in sorted(kinds))})")
    return out


def _fmt_reasons(d: Any) -> str:
    if not d:
        return "0"
    total = sum(int(v) for v in d.values())
    return f"{total} (" + ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) + ")"


def summary_rows(metadata: Any, timings_s: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """Rows ``(label, value)`` summarising a :class:`~seqpack.io.PackedMetadata` (for a rich table).

    Includes records read, samples packed, dropped/skipped/truncated/split per reason, tokens, packs
    vs lower bound, packing efficiency and factor, the settings that matter for reuse, and for
    image-text datasets the image counts and image processor bounds.
    """
    m = metadata
    c = m.counts or {}
    rows: list[tuple[str, str]] = [
        ("records read", f"{c.get('records_read', 0):,}"),
        ("samples packed", f"{c.get('samples_packed', 0):,}"),
    ]
    for status in ("dropped", "skipped", "truncated", "split"):
        rows.append((status, _fmt_reasons(c.get(status))))
    gap = m.num_packs - m.lower_bound
    rows += [
        ("tokens (real)", f"{c.get('tokens', 0):,}"),
        ("trainable tokens", f"{c.get('trainable_tokens', 0):,}"),
        ("packs / lower bound", f"{m.num_packs:,} / {m.lower_bound:,}" + (" (optimal)" if gap == 0 else f" (+{gap})")),
        ("packing efficiency", f"{100 * m.packing_efficiency:.2f}% of {m.num_packs:,} x {m.seq_length:,} slots"),
        ("packing factor", f"{m.packing_factor:.2f} samples/pack (max {m.max_samples_per_bin})"),
        ("longest sample / emptiest pack", f"{m.dataset_max_seqlen:,} / {m.min_packed_seqlen:,} tokens"),
        ("seq_length", f"{m.seq_length:,}"),
        ("pad multiple", f"{m.effective_pad_multiple} (pad_to_multiple_of={m.pad_to_multiple_of}, "
                         f"context_parallel_size={m.context_parallel_size})"),
        ("algorithm / seed", f"{m.algorithm} / {m.seed}"),
        ("policies", f"overlength={m.overlength}, train_on={m.train_on}, on_error={m.on_error}"),
        ("tokenizer", f"{m.tokenizer} ({(m.tokenizer_hash or '?')[:12]})"),
        ("fingerprint", (m.fingerprint or "?")[:16]),
    ]
    media = getattr(m, "media", None)
    if media:
        rows.append(("images", f"{c.get('images', media.get('images', 0)):,} in "
                               f"{c.get('samples_with_images', media.get('samples_with_images', 0)):,} samples, "
                               f"{c.get('image_tokens', media.get('image_tokens', 0)):,} image tokens"))
        rows.append(("image processor", f"pixels {media.get('min_pixels')}..{media.get('max_pixels')}, "
                                        f"patch {media.get('patch_size')}, merge {media.get('merge_size')}"))
    if timings_s:
        rows.append(("time", ", ".join(f"{k} {v:.2f}s" for k, v in timings_s.items())))
    return rows


def plot_report(dataset: Any, out_path: str | os.PathLike | None = None, *, bins: int = 50) -> Path:
    """Write ``report.png``: sample-length histogram and pack-fill histogram.

    Args:
        dataset: a :class:`~seqpack.io.PackedDataset` or a dataset directory.
        out_path: PNG path (default ``<dataset dir>/report.png``).
        bins: histogram bin count.

    Returns:
        The PNG path.

    Raises:
        seqpack.io.PackedDatasetError: the directory is not a complete packed dataset.
        ValueError, IsADirectoryError, NotADirectoryError, FileNotFoundError, PermissionError: ``out_path``
            cannot be the plot (:func:`plot_path`; nothing is created).
        OSError: the PNG cannot be written (e.g. read-only directory: pass ``out_path``).

    A path without a suffix gets ``.png`` (what is written is what is returned).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ds = dataset if isinstance(dataset, PackedDataset) else load_packed(dataset)
    out = plot_path(out_path) if out_path is not None else ds.path / REPORT_PNG
    m = ds.metadata
    lengths = ds.segment_lengths()
    fill = ds.column("num_tokens") / float(m.seq_length) if len(ds) else np.zeros(0)

    fig = Figure(figsize=(11, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.hist(lengths, bins=bins, range=(0, m.seq_length), color="#4c72b0")
    ax1.axvline(m.seq_length, color="k", lw=1, ls="--")
    ax1.set_xlabel("sample length (real tokens)")
    ax1.set_ylabel("samples")
    ax1.set_title(f"{lengths.size:,} samples, max {int(lengths.max()) if lengths.size else 0:,}")
    ax2.hist(fill * 100.0, bins=bins, range=(0, 100), color="#55a868")
    ax2.set_xlabel("pack fill (% of seq_length, real tokens)")
    ax2.set_ylabel("packs")
    ax2.set_title(
        f"{m.num_packs:,} packs (lower bound {m.lower_bound:,}), efficiency {100 * m.packing_efficiency:.1f}%"
    )
    fig.suptitle(f"{ds.path.name}: seq_length {m.seq_length}, {m.algorithm}")
    fig.tight_layout()
    fig.savefig(out)
    return out
