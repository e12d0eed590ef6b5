"""`seqpack bench algorithms | prepare | stream | balance | memory`: measured comparisons (a typer sub-app,
``bench_app``).

Each command checks ``--out`` first (created if missing; default ``./bench_results``; an empty ``--out``
is refused), prints its tables and PASS/MISS lines and writes ``<name>.json`` plus PNG charts there.
Exit codes, as in ``seqpack train``: 2 for a bad option (one readable line naming it, before any work),
1 for a data error found while running (``bench prepare``: a malformed file in the data folder),
otherwise 0 (a MISS verdict is a measured result, not a failure); ``bench stream`` exits 1 when the
benchmark (``seqpack_bench.bench_stream``, run in-process) fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from seqpack.cli.app import fail as _fail
from seqpack_bench import algorithms as _algorithms
from seqpack_bench import bench_balance as _balance
from seqpack_bench import bench_memory as _memory
from seqpack_bench import prepare as _prepare
from seqpack_bench import stream as _stream
from seqpack_bench.algorithms_mixes import MIX_NAMES
from seqpack_bench.paths import shared_data_dir
from seqpack_bench.timing import OutputDirError, ensure_out_dir

#: the ``bench`` command group (added to ``seqpack``'s app through the ``seqpack.cli`` entry point "bench").
bench_app = typer.Typer(
    help="Measured comparisons with existing packers. Each command writes <name>.json and PNG charts into "
         "--out (default ./bench_results, created if missing); --quick runs a small version (see each --help).",
    no_args_is_help=True)


def _int_list(text: str, key: str) -> list[int]:
    try:
        vals = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{key} must be a comma list of integers, e.g. 100000,1000000; got {text!r}")
    if not vals or min(vals) < 1:
        _fail(f"{key} must list integers >= 1; got {text!r}")
    return vals


def _out_dir(out: str) -> Path:
    """Create and check ``--out`` before any work (one-line error naming --out otherwise).

    ``--out`` is taken as text: typer would turn ``--out ""`` into ``Path(".")``, the current folder."""
    try:
        return ensure_out_dir(out, option="--out")
    except OutputDirError as exc:
        _fail(str(exc), 2)


_ALGORITHMS_HELP = (
    "seqpack packing algorithms vs TRL pack_dataset (bfd, wrapped), LLaMA-Factory's greedy knapsack and "
    "Megatron-Bridge's first fit (decreasing, shuffle), on the same lognormal SFT lengths; with seqpacker "
    "installed (bash ../shared/tools/install-seqpacker.sh; a benchmark peer, not a dependency), every seqpacker "
    "strategy too, timed round-robin with seqpack, each result checked (every index exactly once, no pack over "
    "capacity) or refused, and per size a verdict: seqpack's default vs the fastest seqpacker strategy of equal or "
    "fewer packs (PASS at >= 2x, CPU).\n\n"
    "Full default (100,000 and 1,000,000 lengths, 3 repeats; Megatron-Bridge only at 100,000): 2 min 19 s "
    "on 2 cores, peak memory 7.1 GB, TRL at 1,000,000 (measured 2026-11-29; Megatron-Bridge's pure-Python first "
    "fit takes 1.7 min of it, more on a busy box). --quick (20,000 lengths, 2 repeats): about 25 s.\n\n"
    "Then the planner mixes (--mixes; lognormal exp(N(6.2, s)) for s 0.5-1.2 at C 4096 and 8192, uniform, "
    "bimodal, C/2-C/3, FFD 11/9): per mix seqpack's default vs its BFD and every seqpacker strategy but hk at "
    "--mix-n 1,000,000 lengths (round-robin, 3 repeats) and the default alone at --mix-big-n 10,000,000, seven "
    "PASS/MISS lines each (packs <= every peer, <= L2 + 0.05 %, spread <= 1 % of C, <= 100 ns per item at both "
    "sizes, linear in n, >= 2x seqpacker's fastest strategy of <= its packs). Mixes alone (--sizes 100000 --no-trl "
    "--max-bridge-n 0 --max-reference-n 0): 11 min wall, peak memory 1.4 GB on 2 cores at load 13 (measured "
    "2026-12-02); --mix-big-n 0 drops the 10M runs, --mixes none the whole part.\n\n"
    "Results: algorithms.json, algorithms_time.png and algorithms_bins.png in --out (default ./bench_results). "
    "TRL wrapped cuts samples: it is marked \"(cuts samples)\" in the table and charts and is not a packing "
    "result. Baselines not run (--max-bridge-n, --max-reference-n, --max-seqpacker-hk-n, not installed) are printed "
    "as \"skipped:\" lines after the tables, refused peer results as \"refused:\" lines. --quick verdicts are informational: the goals are judged on the full run.\n\n"
    "Exit codes: 2 bad option (before any work), otherwise 0 (MISS verdicts included)."
)

_PREPARE_HELP = (
    "Tokenize + pack + write: seqpack pack_dataset vs TRL's SFT preparation + pack_dataset(bfd), on the real "
    "demo files (../shared/data) and a synthetic chat set, both with --num-proc processes, and the bound: "
    "tokenizers' own encode_batch of the already-rendered texts on as many threads (PASS when seqpack's prepare "
    "stage is within 1.3x of it on the synthetic set, and when seqpack is >= 2x faster than TRL).\n\n"
    "Full default (100,000 synthetic chats, 1 run, plus the 4 real demo files, 3 repeats): about 10 minutes on "
    "2 cores (estimated: the timed runs of a full run summed to 8.6 minutes, 5.8 of them TRL's). --quick (2,000 "
    "synthetic chats, 1 repeat): about 25 s.\n\n"
    "Results: prepare.json and prepare_time.png in --out (default ./bench_results). After the table, a note "
    "per data set whose samples or tokens differ between seqpack and TRL says why. --quick verdicts are "
    "informational: the >= 2x goal is judged on the full run (100,000 records).\n\n"
    "Exit codes: 2 bad option (--out, --shared-data, or a --seq-length that leaves nothing to pack), 1 data "
    "error (a malformed file in the data folder, named), otherwise 0 (MISS verdicts included)."
)

_STREAM_HELP = (
    "Run the streaming-packer benchmark (python -m seqpack_bench.bench_stream, in this process), relay its "
    "output, save stream.json and chart it.\n\n"
    "Full default (1,000,000 lengths for throughput, 3 repeats; 500,000 per efficiency set): about 20 s on 2 "
    "cores. --quick (300,000 and 150,000, 2 repeats): about 10 s.\n\n"
    "Results: stream.json, stream_efficiency.png (packs above the L1 bound per buffer size) and "
    "stream_throughput.png in --out (default ./bench_results). With --quick its PASS/MISS lines are marked "
    "\"(quick: informational)\": the goals are judged on the full run.\n\n"
    "Exit codes: 2 bad --out (before any work), 1 the benchmark failed, otherwise 0 (MISS verdicts included)."
)


@bench_app.command("algorithms", help=_ALGORITHMS_HELP)
def algorithms(
    sizes: str = typer.Option("100000,1000000", help="Numbers of lengths, comma separated."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per program (median reported)."),
    capacity: int = typer.Option(4096, min=1, help="Tokens per pack."),
    max_reference_n: int = typer.Option(1_000_000, "--max-reference-n",
                                        help="Largest n for LLaMA-Factory's O(n^2) greedy knapsack (>= 0; 0 = "
                                             "never run it)."),
    max_bridge_n: int = typer.Option(100_000, "--max-bridge-n",
                                     help="Largest n for Megatron-Bridge's O(n * packs) first fit (>= 0; 0 = never "
                                          "run it)."),
    max_seqpacker_hk_n: int = typer.Option(200_000, "--max-seqpacker-hk-n",
                                           help="Largest n for seqpacker's O(n * open packs) Harmonic-K strategy hk "
                                                "(>= 0; 0 = never run it)."),
    no_trl: bool = typer.Option(False, "--no-trl", help="Skip TRL."),
    quick: bool = typer.Option(False, "--quick",
                               help="20,000 lengths, at most 2 repeats, every program (replaces --sizes): "
                                    "about 25 s on 2 cores."),
    out: str = typer.Option("bench_results", "--out", metavar="FOLDER",
                             help="Folder for algorithms.json, algorithms_time.png and algorithms_bins.png "
                                  "(created if missing; must not be blank)."),
    mixes: str = typer.Option("all", "--mixes",
                              help="Planner mixes judged after the tables, comma separated, 'all' or 'none': "
                                   + ", ".join(MIX_NAMES) + "."),
    mix_n: int = typer.Option(1_000_000, "--mix-n", min=1, help="Lengths per planner mix (--quick: 20,000)."),
    mix_big_n: int = typer.Option(10_000_000, "--mix-big-n", min=0,
                                  help="Second, larger size per mix for the linearity and ns-per-item verdicts "
                                       "(0 = skip; --quick: 0)."),
) -> None:
    """`seqpack bench algorithms` (help text: ``_ALGORITHMS_HELP``): :func:`~seqpack_bench.algorithms.run_algorithms`."""
    ns = list(_algorithms.QUICK_SIZES) if quick else _int_list(sizes, "--sizes")
    names = {"all": MIX_NAMES, "none": ()}.get(mixes.strip().lower())
    if names is None:
        names = tuple(m.strip() for m in mixes.split(",") if m.strip())
        bad = [m for m in names if m not in MIX_NAMES]
        if bad:
            _fail(f"--mixes: unknown mix {bad[0]!r}; choose from: {', '.join(MIX_NAMES)}, or 'all' / 'none'")
    for key, val in (("--max-reference-n", max_reference_n), ("--max-bridge-n", max_bridge_n),
                     ("--max-seqpacker-hk-n", max_seqpacker_hk_n)):
        if val < 0:
            _fail(f"{key} must be >= 0 (0 = never run that baseline); got {val}")
    out_dir = _out_dir(out)
    _algorithms.run_algorithms(ns, capacity=capacity, repeats=min(repeats, 2) if quick else repeats, out_dir=out_dir,
                   max_reference_n=max_reference_n, max_bridge_n=max_bridge_n,
                   max_seqpacker_hk_n=max_seqpacker_hk_n, trl=not no_trl, quick=quick, mixes=names,
                   mix_n=20_000 if quick else mix_n, mix_big_n=0 if quick else mix_big_n)
    print(f"wrote {out_dir / 'algorithms.json'}, {out_dir / 'algorithms_time.png'}, "
          f"{out_dir / 'algorithms_bins.png'}")


@bench_app.command("prepare", help=_PREPARE_HELP)
def prepare(
    records: int = typer.Option(100_000, min=0, help="Records of the synthetic chat set (0 = none)."),
    shared_data: Optional[Path] = typer.Option(
        None, "--shared-data",
        help="Real data folder (must exist and hold llama-factory/ or fastchat/ files). Default: ../shared/data "
             "beside the checkout, skipped with a note when absent."),
    seq_length: int = typer.Option(4096, "--seq-length", min=1, help="Pack capacity in tokens."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per program on the real files (median)."),
    synthetic_repeats: Optional[int] = typer.Option(None, "--synthetic-repeats", min=1,
                                                    help="Timed runs on the synthetic set (default --repeats; 1 from 20,000 records)."),
    no_trl: bool = typer.Option(False, "--no-trl", help="Skip TRL."),
    num_proc: Optional[int] = typer.Option(
        None, "--num-proc", help="Processes of both programs (seqpack num_proc, TRL dataset_num_proc) and threads "
                                 "of the tokenizers bound (>= 1; default: the cores available)."),
    quick: bool = typer.Option(False, "--quick",
                               help="2,000 synthetic records (unless --records is given) plus the real files, "
                                    "1 repeat: about 25 s on 2 cores."),
    out: str = typer.Option("bench_results", "--out", metavar="FOLDER",
                             help="Folder for prepare.json and prepare_time.png (created if missing; must not be blank)."),
) -> None:
    """`seqpack bench prepare` (help: ``_PREPARE_HELP``); runs :func:`seqpack_bench.prepare.run_prepare`."""
    if shared_data is not None:  # named explicitly: it must be there
        try:
            _prepare.check_shared_data(shared_data, option="--shared-data")
        except ValueError as exc:
            _fail(str(exc), 2)
    else:
        shared_data = shared_data_dir()
    if quick:
        records, repeats, synthetic_repeats = (2_000 if records == 100_000 else records), 1, 1
    if num_proc is not None and num_proc < 1:
        _fail(f"--num-proc must be >= 1; got {num_proc}")
    out_dir = _out_dir(out)
    try:
        _prepare.run_prepare(shared_data=shared_data, records=records, seq_length=seq_length, repeats=repeats,
                    synthetic_repeats=synthetic_repeats, out_dir=out_dir, trl=not no_trl, quick=quick,
                    num_proc=num_proc)
    except _prepare.PrepareOptionError as exc:  # nothing to run / nothing left to pack at --seq-length
        _fail(str(exc), 2)
    except _prepare.PrepareDataError as exc:  # a malformed or unreadable data file (named in the message)
        _fail(str(exc), 1)
    print(f"wrote {out_dir / 'prepare.json'}, {out_dir / 'prepare_time.png'}")


@bench_app.command("stream", help=_STREAM_HELP)
def stream(
    quick: bool = typer.Option(False, "--quick",
                               help="The benchmark's quick sizes (300,000 lengths for throughput, 150,000 per "
                                    "efficiency set, 2 repeats): about 10 s on 2 cores."),
    out: str = typer.Option("bench_results", "--out", metavar="FOLDER",
                             help="Folder for stream.json, stream_efficiency.png and stream_throughput.png "
                                  "(created if missing; must not be blank)."),
) -> None:
    """`seqpack bench stream` (help: ``_STREAM_HELP``); runs :func:`seqpack_bench.stream.run_stream`."""
    out_dir = _out_dir(out)
    res = _stream.run_stream(quick=quick, out_dir=out_dir)
    print("wrote " + ", ".join(str(out_dir / n) for n in ["stream.json", *res["charts"]]))
    raise typer.Exit(res["returncode"])


_BALANCE_HELP = (
    "DP balance: seqpack.parallel.balance_samples on lengths drawn as exp(N(6.2, 0.9)) tokens clipped to "
    "[8, 4096], capacity 4096, dp 8, for 10,000 and 100,000 samples x 1 and 4 micro-batches per rank. Prints, "
    "per row, wall and CPU seconds (median of --repeats; the time goal is judged on CPU seconds, which equal "
    "wall seconds on an idle core), worst and mean token spread over full steps ((max - min) / mean of the "
    "ranks' tokens in a step), worst and mean attention-cost max/mean, micro-batches over the cap; then "
    "PASS/MISS lines: time <= 1 s, worst token spread <= 0.1 %, 0 over the cap, and one per seed (PASS when "
    "all its rows meet every goal).\n\n"
    "Full default (3 repeats, one seed): about 6 CPU-s (21 s wall on a busy 2-core box, measured 2026-12-02); "
    "each further --seed adds as much. --quick (2,000 and 10,000 samples, 1 repeat): about 4 CPU-s with "
    "start-up (measured 2026-12-02); its verdicts are informational.\n\n"
    "Results: balance.json in --out (default ./bench_results).\n\n"
    "Exit codes: 2 bad option (before any work), otherwise 0 (MISS verdicts included)."
)


@bench_app.command("balance", help=_BALANCE_HELP)
def balance(
    sizes: str = typer.Option("10000,100000", help="Sample counts, comma separated."),
    micro_batches: str = typer.Option("1,4", "--micro-batches", help="Micro-batches per rank, comma separated."),
    dp: int = typer.Option(8, min=1, help="Data-parallel ranks."),
    capacity: int = typer.Option(4096, min=8, help="Tokens per micro-batch (pack)."),
    repeats: int = typer.Option(3, min=1, help="Timed runs per row (median reported)."),
    seed: str = typer.Option("0", help="Seeds of the lengths and of balance_samples, comma separated (e.g. "
                                       "0,1,2,3,4): every row is run per seed, with one PASS/MISS line per seed."),
    quick: bool = typer.Option(False, "--quick", help="2,000 and 10,000 samples (replaces --sizes), 1 repeat."),
    out: str = typer.Option("bench_results", "--out", metavar="FOLDER",
                             help="Folder for balance.json (created if missing)."),
) -> None:
    """`seqpack bench balance` (help: ``_BALANCE_HELP``); runs :func:`seqpack_bench.bench_balance.run_grid`."""
    ns = list(_balance.QUICK_SIZES) if quick else _int_list(sizes, "--sizes")
    mbs = _int_list(micro_batches, "--micro-batches")
    seeds = [x.strip() for x in seed.split(",") if x.strip()]
    if not seeds or not all(x.isdigit() for x in seeds):
        _fail(f"--seed must be a comma list of integers >= 0, e.g. 0,1,2,3,4; got {seed!r}")
    seeds = [int(x) for x in seeds]
    out_dir = _out_dir(out)
    _balance.run_grid(ns, mbs, dp=dp, capacity=capacity, repeats=1 if quick else repeats, seed=seeds, quick=quick,
                      out_dir=out_dir)
    print(f"wrote {out_dir / 'balance.json'}")


_MEMORY_HELP = (
    "Peak memory of `seqpack pack` (local engine, embedded Qwen3 tokenizer, seq_length 4096), each case in a "
    "subprocess (peak RSS of that process), minus a baseline run on one short record: one large alpaca record "
    "(--large-mb, among 4 short ones) per over-length policy (truncate, drop, split), goal <= 20x the record's "
    "size; many tiny records (--tiny), goal <= 512 B per record.\n\n"
    "Full default (5 and 20 MB records, 1,000,000 tiny records): tens of minutes on 2 cores (the tiny set's "
    "tokenization dominates). --quick (a 1 MB record, 20,000 tiny records): about 3 minutes.\n\n"
    "Results: memory.json in --out (default ./bench_results). --quick verdicts are informational: the goals are "
    "judged on the full run.\n\n"
    "Exit codes: 2 bad option (before any work), 1 a pack run failed, otherwise 0 (MISS verdicts included)."
)


def _float_list(text: str, key: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{key} must be a comma list of numbers, e.g. 5,20; got {text!r}")
    if not vals or min(vals) <= 0:
        _fail(f"{key} must list numbers > 0; got {text!r}")
    return vals


@bench_app.command("memory", help=_MEMORY_HELP)
def memory(
    large_mb: str = typer.Option("5,20", "--large-mb", help="Sizes of the large record in MB, comma separated."),
    tiny: str = typer.Option("1000000", "--tiny", help="Numbers of tiny records, comma separated."),
    quick: bool = typer.Option(False, "--quick", help="A 1 MB record and 20,000 tiny records (replaces --large-mb "
                                                       "and --tiny): about 3 minutes on 2 cores."),
    out: str = typer.Option("bench_results", "--out", metavar="FOLDER",
                             help="Folder for memory.json (created if missing; must not be blank)."),
) -> None:
    """`seqpack bench memory` (help: ``_MEMORY_HELP``); runs :func:`seqpack_bench.bench_memory.run_memory`."""
    sizes = list(_memory.QUICK["large_mb"]) if quick else _float_list(large_mb, "--large-mb")
    counts = list(_memory.QUICK["tiny"]) if quick else _int_list(tiny, "--tiny")
    out_dir = _out_dir(out)
    try:
        _memory.run_memory(large_mb=sizes, tiny=counts, out_dir=out_dir, quick=quick)
    except RuntimeError as exc:
        _fail(str(exc), 1)
    print(f"wrote {out_dir / 'memory.json'}")
