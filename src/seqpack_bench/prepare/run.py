"""``seqpack bench prepare``: tokenize + pack + write, seqpack against TRL's own preparation (what is compared
and how: docs/notes/seqpack_bench.prepare.md)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from seqpack.data.procs import available_cores
from seqpack.data.tokenizer import load_tokenizer
from seqpack_bench.prepare.compare import THINK_NOTE, compare_sides
from seqpack_bench.prepare.data import (SHARED_FILES, WARMUP_RECORDS, PrepareOptionError, real_datasets,
                                        table_name, write_synthetic_chat)
from seqpack_bench.prepare.bound import measure_bound, render_texts
from seqpack_bench.prepare.programs import seqpack_prepare_and_pack, trl_prepare_and_pack
from seqpack_bench.references import trl_available
from seqpack_bench.timing import Timing, bar_chart, ensure_out_dir, print_table, verdict, write_json

#: The preparation goal: seqpack's prepare stage within this factor of the ``encode_batch`` bound.
BOUND_FACTOR = 1.3


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[Any, Timing]:
    """Median wall and CPU seconds of ``repeats`` runs of ``fn()``; CPU counts this process and its
    finished child processes (worker processes of either program), from ``os.times()``."""
    import statistics
    import time

    walls, cpus, res = [], [], None
    for _ in range(repeats):
        c0, t0 = os.times(), time.perf_counter()
        res = fn()
        walls.append(time.perf_counter() - t0)
        c1 = os.times()
        cpus.append(sum(c1[:4]) - sum(c0[:4]))
    return res, Timing(statistics.median(walls), statistics.median(cpus), repeats, walls, cpus)

#: Printed after the verdicts of a ``--quick`` run.
QUICK_NOTE = ("note: --quick verdicts are informational (fixed start-up costs dominate 2,000 records): the >= 2x "
              "goal is judged on the full run (`seqpack bench prepare`: 100,000 synthetic records; real files, "
              "3 repeats)")


def run_prepare(
    *,
    shared_data: str | os.PathLike | None = None,
    records: int = 100_000,
    seq_length: int = 4096,
    repeats: int = 3,
    synthetic_repeats: int | None = None,
    out_dir: str | os.PathLike = "bench_results",
    tokenizer: Any = "qwen3",
    trl: bool = True,
    quick: bool = False,
    num_proc: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the comparison and write ``prepare.json`` + ``prepare_time.png``.

    After the table, one ``note:`` line per data set whose samples or tokens differ between the two
    sides (:func:`compare_sides`: seqpack's drop reasons and counts, TRL's cut rows, empty think
    blocks), then :data:`THINK_NOTE` when think blocks account for a difference.

    Args:
        shared_data: folder of the real data (``../shared/data``); ``None`` = synthetic only; a missing
            folder or file is logged as a note and listed in ``skipped``.
        records: records of the synthetic chat set (0 = none).
        seq_length: pack capacity in tokens.
        repeats: timed runs per program on the real files (median reported).
        synthetic_repeats: timed runs on the synthetic set (default: ``repeats``, but 1 from 20,000
            records on: the full default run then takes about 10 minutes on 2 cores, estimated from a full
            run whose timed runs summed to 8.6 minutes; the JSON records it).
        out_dir: folder for the JSON/PNG (and a scratch folder ``_prepare_work`` removed at the end).
        tokenizer: name/path for ``load_tokenizer`` or a loaded tokenizer (used by both sides).
        trl: include TRL (skipped with a recorded reason when not importable).
        num_proc: processes for both programs (seqpack's ``num_proc``, TRL's ``dataset_num_proc``) and
            threads of the bound; ``None`` = the cores available.
        quick: a ``--quick`` run: each verdict is printed and stored as "quick: informational", then
            :data:`QUICK_NOTE` (the goal is judged on the full run).
        log: one-line progress messages.

    Returns:
        the JSON payload: ``benchmark``, ``seq_length``, ``records``, ``datasets`` (one entry per data
        set with ``seqpack`` and ``trl`` blocks: packs, tokens, trainable_tokens, samples, efficiency,
        wall_s, cpu_s (CPU of worker processes included), seqpack ``prepare_s`` (its prepare stage, median);
        ``bound`` (:func:`~seqpack_bench.prepare.bound.measure_bound`) and ``bound_ratio`` = prepare_s / bound
        wall; ``speedup_wall``, ``speedup_cpu`` = TRL / seqpack, and ``comparison`` from
        :func:`compare_sides`), ``num_proc``, ``goals``, ``skipped``, ``notes`` (the printed note lines), ``quick``.
        Goals: per data set seqpack >= 2x TRL end to end; on the synthetic set (or the largest file) seqpack's
        prepare stage within :data:`BOUND_FACTOR` of the bound.

    Raises:
        PrepareOptionError: nothing to run (no real data and ``records == 0``), ``repeats < 1``, or a
            data set that seqpack packs to nothing at ``seq_length`` (message says to raise ``--seq-length``).
        PrepareDataError: a data file cannot be read or holds a malformed record (message names the file,
            the side and the cause).
        OutputDirError: ``out_dir`` cannot be created or written (checked before any work).
    """
    if repeats < 1:
        raise PrepareOptionError(f"repeats must be >= 1, got {repeats}")
    out_dir = ensure_out_dir(out_dir, option="out_dir")
    procs = int(num_proc) if num_proc else available_cores()
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    work = Path(tempfile.mkdtemp(prefix="_prepare_work", dir=out_dir))
    skipped: list[dict[str, Any]] = []
    try:
        files: list[tuple[str, Path, int]] = []
        if shared_data is not None and Path(shared_data).is_dir():
            files += [(f"{p.parent.name}/{p.name}", p, repeats) for p in real_datasets(shared_data)]
            for f in SHARED_FILES:
                if not (Path(shared_data) / f).is_file():
                    skipped.append({"dataset": f, "reason": f"file not found under {shared_data}"})
                    log(f"note: {Path(shared_data) / f} not found: skipped")
        elif shared_data is not None:
            skipped.append({"dataset": "shared data", "reason": f"folder not found: {shared_data}"})
            log(f"note: real-data folder {shared_data} not found: its data sets are skipped (synthetic data only)")
        if records > 0:
            syn = write_synthetic_chat(work / f"synthetic_chat_{records}.jsonl", records)
            syn_reps = synthetic_repeats or (1 if records >= 20_000 else repeats)
            files.append((f"synthetic_chat ({records:,} records)", syn, syn_reps))
        if not files:
            raise PrepareOptionError("nothing to benchmark: no shared data found and records == 0")
        has_trl = trl and trl_available()
        if trl and not has_trl:
            skipped.append({"dataset": "*", "reason": "trl/datasets not importable: TRL side skipped"})
        warm = write_synthetic_chat(work / "warmup_chat.jsonl", WARMUP_RECORDS, seed=1)
        log(f"{procs} processes per program (seqpack num_proc, TRL dataset_num_proc; bound: {procs} threads)")
        log(f"warm-up (untimed): {WARMUP_RECORDS} synthetic chats, each program once")
        try:
            seqpack_prepare_and_pack(warm, tok, seq_length, work / "seqpack_out", procs)
            if has_trl:
                trl_prepare_and_pack(warm, tok, seq_length, work / "trl_out.parquet", procs)
        except Exception as e:  # noqa: BLE001 - e.g. a seq_length too small for the warm-up chats
            log(f"note: warm-up skipped ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "the first timed run carries the one-time costs")
        entries: list[dict[str, Any]] = []
        goals: list[dict[str, Any]] = []
        think_ids = list(tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]) if has_trl else []
        judged = files[-1][0] if records > 0 else max(files, key=lambda f: f[1].stat().st_size)[0]
        for name, path, reps in files:
            log(f"{name}: seqpack x{reps}")
            prep_s: list[float] = []

            def run_seqpack() -> dict[str, Any]:
                r = seqpack_prepare_and_pack(path, tok, seq_length, work / "seqpack_out", procs)
                prep_s.append(r["timings_s"]["prepare"])
                return r

            sp, t_sp = _timed(run_seqpack, reps)
            entry: dict[str, Any] = {"dataset": name, "path": str(path), "repeats": reps,
                                     "seqpack": {**sp, "wall_s": t_sp.wall_s, "cpu_s": t_sp.cpu_s,
                                                 "prepare_s": sorted(prep_s)[len(prep_s) // 2]}}
            log(f"{name}: tokenizers encode_batch bound x{reps} ({procs} threads)")
            bound = measure_bound(render_texts(path, tok), tok, procs, work / "bound", repeats=reps)
            entry["bound"] = bound
            entry["bound_ratio"] = round(entry["seqpack"]["prepare_s"] / bound["wall_s"], 3)
            goals.append(verdict(
                f"{name}: seqpack preparation within {BOUND_FACTOR}x of tokenizers' encode_batch of the rendered "
                f"texts ({procs} processes / threads)", entry["bound_ratio"] <= BOUND_FACTOR,
                f"{entry['bound_ratio']:.2f}x: prepare stage {entry['seqpack']['prepare_s']:.2f} s vs bound "
                f"{bound['wall_s']:.2f} s ({bound['tokens']:,} tokens)",
                informational="quick: informational" if quick else (None if name == judged else "informational: "
                                                                     "judged on the largest data set")))
            if has_trl:
                log(f"{name}: TRL x{reps}")
                tr, t_tr = _timed(lambda: trl_prepare_and_pack(path, tok, seq_length, work / "trl_out.parquet", procs),
                                  reps)
                entry["trl"] = {**tr, "wall_s": t_tr.wall_s, "cpu_s": t_tr.cpu_s}
                entry["speedup_wall"] = round(t_tr.wall_s / t_sp.wall_s, 2)
                entry["speedup_cpu"] = round(t_tr.cpu_s / t_sp.cpu_s, 2)
                ok = entry["speedup_wall"] >= 2.0 and sp["efficiency"] >= tr["efficiency"]
                goals.append(verdict(
                    f"{name}: seqpack >= 2x faster end to end at >= packing efficiency", ok,
                    f"{entry['speedup_wall']:.2f}x wall ({entry['speedup_cpu']:.2f}x CPU); efficiency "
                    f"{sp['efficiency']:.4f} vs TRL {tr['efficiency']:.4f}; packs {sp['packs']} vs {tr['packs']}",
                    informational="quick: informational" if quick else None))
                entry["comparison"] = compare_sides(entry, seq_length=seq_length, seqpack_dir=work / "seqpack_out",
                                                    trl_file=work / "trl_out.parquet", think_ids=think_ids)
            entries.append(entry)
        rows = []
        for e in entries:  # one row per data set and program: the table fits a terminal, names stay whole
            short = table_name(e["dataset"])
            for prog, key in (("seqpack", "seqpack"), ("TRL", "trl")):
                r = e.get(key)
                if r is None:
                    continue
                rows.append([short, prog, r["samples"], r["tokens"], r["packs"], r["efficiency"], r["wall_s"], r["cpu_s"],
                             e.get("speedup_wall") if key == "seqpack" else None,
                             e.get("speedup_cpu") if key == "seqpack" else None])
        print_table(f"prepare: tokenize + pack + write, seq_length={seq_length}, {procs} processes (median of "
                    "repeats; CPU incl. worker processes; speed-up = TRL time / seqpack time)",
                    ["dataset", "program", "samples", "tokens", "packs", "efficiency", "wall s", "CPU s",
                     "speed-up wall", "speed-up CPU"], rows, text_columns=2)
        print_table(f"preparation vs the bound: seqpack's prepare stage (read + render + tokenize + labels) vs "
                    f"tokenizers' encode_batch of the already-rendered texts, {procs} processes / threads",
                    ["dataset", "tokens", "seqpack prepare s", "bound s", "prepare / bound"],
                    [[table_name(e["dataset"]), e["bound"]["tokens"], e["seqpack"]["prepare_s"], e["bound"]["wall_s"],
                      e["bound_ratio"]] for e in entries], text_columns=1)
        notes = [n for e in entries for n in e.get("comparison", {}).get("notes", [])]
        if any(e.get("comparison", {}).get("think_block_tokens") for e in entries):
            notes.append("note: " + THINK_NOTE)
        if quick and goals:
            notes.append(QUICK_NOTE)
        for line in notes:
            print(line)
        payload = {"benchmark": "prepare", "seq_length": seq_length, "records": records, "repeats": repeats,
                   "num_proc": procs,
                   "warmup": f"{WARMUP_RECORDS} synthetic chats, each program once, untimed",
                   "quick": quick, "tokenizer": str(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else
                   getattr(tok, "name_or_path", None), "datasets": entries, "goals": goals, "skipped": skipped,
                   "notes": notes}
        write_json(out_dir / "prepare.json", payload)
        labels, vals = [], []
        for e in entries:
            labels.append(f"{table_name(e['dataset'])}: seqpack")
            vals.append(e["seqpack"]["wall_s"])
            if "trl" in e:
                labels.append(f"{table_name(e['dataset'])}: TRL")
                vals.append(e["trl"]["wall_s"])
        bar_chart(out_dir / "prepare_time.png", labels, vals, title="tokenize + pack + write (wall s, median)",
                  ylabel="seconds", log=True, annotate=[f"{v:.3g}" for v in vals])
        return payload
    finally:
        shutil.rmtree(work, ignore_errors=True)
