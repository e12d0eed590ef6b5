"""`seqpack bench algorithms | prepare | stream`: measured comparisons (OWNER: bench helper).

Each command prints its tables and PASS/MISS lines and writes ``<name>.json`` plus PNG charts into
``--out`` (default ``bench_results/``). Bad settings exit with code 2 and one readable line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from seqpack.cli.app import app, fail as _fail

bench_app = typer.Typer(help="Measured comparisons with existing packers (JSON + PNG into --out).",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")

from seqpack.cli.app import err_console as _err  # noqa: E402




def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def _int_list(text: str, key: str) -> list[int]:
    try:
        vals = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{key} must be a comma list of integers, e.g. 100000,1000000; got {text!r}")
    if not vals or min(vals) < 1:
        _fail(f"{key} must list integers >= 1; got {text!r}")
    return vals


@bench_app.command("algorithms")
def algorithms(
    sizes: str = typer.Option("100000,1000000", help="Numbers of lengths, comma separated."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per program (median reported)."),
    capacity: int = typer.Option(4096, min=1, help="Tokens per pack."),
    max_reference_n: int = typer.Option(1_000_000, "--max-reference-n",
                                        help="Largest n for LLaMA-Factory's O(n^2) greedy knapsack."),
    max_bridge_n: int = typer.Option(100_000, "--max-bridge-n",
                                     help="Largest n for Megatron-Bridge's O(n * packs) first fit."),
    no_trl: bool = typer.Option(False, "--no-trl", help="Skip TRL."),
    quick: bool = typer.Option(False, "--quick", help="n=20,000 and 2 repeats (seconds)."),
    out: Path = typer.Option(Path("bench_results"), "--out", help="Folder for algorithms.json and PNGs."),
) -> None:
    """seqpack packing algorithms vs TRL pack_dataset (bfd, wrapped), LLaMA-Factory's greedy knapsack and
    Megatron-Bridge's first fit (decreasing, shuffle)."""
    from seqpack.bench.algorithms import QUICK_SIZES, run_algorithms

    ns = list(QUICK_SIZES) if quick else _int_list(sizes, "--sizes")
    run_algorithms(ns, capacity=capacity, repeats=min(repeats, 2) if quick else repeats, out_dir=out,
                   max_reference_n=max_reference_n, max_bridge_n=max_bridge_n, trl=not no_trl)
    print(f"wrote {out / 'algorithms.json'}")


@bench_app.command("prepare")
def prepare(
    records: int = typer.Option(100_000, min=0, help="Records of the synthetic chat set (0 = none)."),
    shared_data: Optional[Path] = typer.Option(None, "--shared-data",
                                               help="Real data folder (default ../shared/data beside the checkout)."),
    seq_length: int = typer.Option(4096, "--seq-length", min=1, help="Pack capacity in tokens."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per program on the real files (median)."),
    synthetic_repeats: Optional[int] = typer.Option(None, "--synthetic-repeats", min=1,
                                                    help="Timed runs on the synthetic set (default --repeats; 1 from 20,000 records)."),
    no_trl: bool = typer.Option(False, "--no-trl", help="Skip TRL."),
    quick: bool = typer.Option(False, "--quick", help="2,000 synthetic records, 1 repeat."),
    out: Path = typer.Option(Path("bench_results"), "--out", help="Folder for prepare.json and PNG."),
) -> None:
    """Tokenize + pack + write: seqpack pack_dataset vs TRL's SFT preparation + pack_dataset(bfd)."""
    from seqpack.bench.prepare import run_prepare

    if shared_data is None:
        shared_data = _repo_root().parent / "shared" / "data"
    if quick:
        records, repeats, synthetic_repeats = (2_000 if records == 100_000 else records), 1, 1
    try:
        run_prepare(shared_data=shared_data, records=records, seq_length=seq_length, repeats=repeats,
                    synthetic_repeats=synthetic_repeats, out_dir=out, trl=not no_trl)
    except ValueError as exc:  # nothing to run / bad settings
        _fail(str(exc), 2)
    print(f"wrote {out / 'prepare.json'}")


@bench_app.command("stream")
def stream(
    quick: bool = typer.Option(False, "--quick", help="Pass --quick to benchmarks/bench_stream.py."),
    script: Optional[Path] = typer.Option(None, help="Path of bench_stream.py (default: benchmarks/ of this checkout)."),
    out: Path = typer.Option(Path("bench_results"), "--out", help="Folder for stream.json."),
) -> None:
    """Run the streaming-packer benchmark (benchmarks/bench_stream.py), save stream.json, relay its exit code."""
    from seqpack.bench.stream import run_stream

    try:
        res = run_stream(quick=quick, script=script, out_dir=out)
    except FileNotFoundError as exc:
        _fail(str(exc), 1)
    raise typer.Exit(res["returncode"])
