"""`seqpack pack`, `seqpack inspect`, `seqpack algorithms`.

User errors (bad settings, missing files, an existing output, a malformed record) print one readable
message and exit with code 2 (invalid settings) or 1 (data / file problems), without a traceback.
"""

from __future__ import annotations

import errno
import signal
import threading
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from seqpack.algorithms import DEFAULT_ALGORITHM, PackingAlgorithm
from seqpack.cli.app import (app, err_console as _err, fail as _fail, load_config, print_violations,
                             require_path_kind)
from seqpack.config import ConfigValidationError
from seqpack.data.llamafactory import is_dataset_info, read_dataset_info
from seqpack.data.procs import WorkerDiedError
from seqpack.data.tokenizer import TokenizerError

_out = Console()


def _user_error_code(exc: BaseException) -> int | None:
    """Exit code for a user error, or None for an unexpected exception (a bug: keep the traceback)."""
    from seqpack.pipeline import PackConfigError  # defers pyarrow (io writer) until a command runs

    if isinstance(exc, PackConfigError):
        return 2
    if isinstance(exc, ImportError) and "seqpack[ray]" in str(exc):  # optional engine not installed
        return 2
    if isinstance(exc, TokenizerError):  # unknown / unloadable tokenizer: a message, not a traceback
        return 1
    if isinstance(exc, WorkerDiedError):  # e.g. the out-of-memory killer: the message names the signal and fix
        return 1
    if isinstance(exc, (FileExistsError, FileNotFoundError, PermissionError, IsADirectoryError,
                        NotADirectoryError, ValueError)):
        return 1
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:  # an --output name too long, a full disk
        return 1
    return None


#: errors of the output's file system that are the user's to fix, not seqpack bugs
_DISK_ERRNOS = (errno.ENAMETOOLONG, errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _disk_full_text(exc: OSError, output: str) -> str:
    """A plain message for a full disk or quota (``ENOSPC``/``EDQUOT``) while packing into ``output``."""
    where = Path(output).expanduser().absolute().parent
    what = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on the device"
    return (f"{what} while writing {exc.filename or where}: seqpack keeps its temporary spill and the new "
            f"shards next to --output, in {where}, until the dataset is complete. "
            f"Nothing was written to {output}. Fix: free space there, or pass an --output on a "
            "larger disk.")


def _summary_table(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("key", style="bold")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, v)
    return t


@app.command("pack")
def pack(
    ctx: typer.Context,
    inputs: Optional[List[str]] = typer.Argument(
        None, help="JSON/JSONL/Parquet/Arrow files or globs, datasets save_to_disk folders, LLaMA-Factory "
        "dataset_info.json files. None: the embedded sample_chat.jsonl demo data."
    ),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", help="Dataset directory to create (required unless --config sets packed_dataset_path)."
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c",
        help="Packing config (.yaml/.yml/.json, or a recipe name), as `seqpack validate` reads it: seq_length, "
        "pad_to_multiple_of, context_parallel_size, algorithm, tokenizer, train_on and packed_dataset_path (as "
        "--output) fill the options; flags given on the command line override the file.",
    ),
    tokenizer: str = typer.Option("qwen3", help="Tokenizer name or local path ('qwen3' = embedded Qwen3)."),
    seq_length: int = typer.Option(4096, "--seq-length", help="Pack capacity in tokens."),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", help="Packing algorithm (see `seqpack algorithms`)."),
    pad_to_multiple_of: int = typer.Option(1, "--pad-to-multiple-of", help="Pad each segment to this multiple."),
    context_parallel_size: int = typer.Option(1, "--context-parallel-size", help="CP size (segments padded to 2*CP)."),
    overlength: str = typer.Option("truncate", help="Over-length policy: truncate | drop | split | error."),
    on_error: str = typer.Option("raise", "--on-error", help="Bad records: raise | skip."),
    train_on: str = typer.Option("assistant", "--train-on", help="Which tokens are trained (e.g. assistant)."),
    seed: int = typer.Option(0, help="Planner seed."),
    format: str = typer.Option("auto", "--format", help="Input format, or auto-detect per record."),
    dataset: Optional[str] = typer.Option(
        None, "--dataset", help="dataset_info.json inputs: the entries to read, comma-separated (default: all)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing packed dataset at --output."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    engine: str = typer.Option("local", "--engine", help='local | ray (needs: pip install "seqpack\\[ray]").'),
    num_cpus: Optional[int] = typer.Option(None, "--num-cpus", help="Ray engine: CPUs / tokenizer workers."),
    num_proc: Optional[int] = typer.Option(
        None, "--num-proc",
        help="Local engine: processes that render and tokenize records (default: the cores available, started "
             "after 2,048 records and 5 s in this process; 1 = this process).",
    ),
    planning: Optional[str] = typer.Option(
        None, "--planning",
        help="Ray engine: global (default; same packs as local) | per_shard (efficiency loss reported).",
    ),
    image_processor: Optional[Path] = typer.Option(
        None, "--image-processor",
        help="Image records: preprocessor_config.json (or its folder) of the Qwen2-VL-style model; default: "
             "transformers' Qwen2-VL defaults.",
    ),
    min_pixels: Optional[int] = typer.Option(None, "--min-pixels", help="Image records: least pixels per resized image."),
    max_pixels: Optional[int] = typer.Option(
        None, "--max-pixels", help="Image records: most pixels per resized image (fewer pixels, fewer image tokens)."
    ),
    media_dir: Optional[Path] = typer.Option(
        None, "--media-dir",
        help="Image records: the media root; image paths resolve against it (DIR/ref, then DIR/images/ref) and "
             "must stay inside it. Default: each data file's folder.",
    ),
    allow_any_media_path: bool = typer.Option(
        False, "--allow-any-media-path",
        help="Image records: read images wherever the records point ('../', absolute paths, symlinks out).",
    ),
) -> None:
    """Pack chat data into an offline packed dataset (Parquet shards + metadata.json + report.jsonl).

    With --config, the packing settings come from a config file or recipe (`seqpack recipe NAME -o
    my.yaml`); it is checked like `seqpack validate` before any data is read, and flags given on the
    command line override its values.
    """
    from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from seqpack.pipeline import cli_error_text, cli_message, get_engine  # defers pyarrow (io writer)

    from_config: dict = {}  # the options --config set (not overridden by a flag): errors name the file's keys
    if config is not None:
        given = {"output": output, "tokenizer": tokenizer, "seq_length": seq_length, "algorithm": algorithm,
                 "pad_to_multiple_of": pad_to_multiple_of, "context_parallel_size": context_parallel_size,
                 "train_on": train_on}
        from_config = _config_options(ctx, config, given)
        given.update(from_config)
        output, tokenizer, seq_length, algorithm = given["output"], given["tokenizer"], given["seq_length"], given["algorithm"]
        pad_to_multiple_of, context_parallel_size = given["pad_to_multiple_of"], given["context_parallel_size"]
        train_on = given["train_on"]
    if output is None:
        _fail("--output is required (or a --config that sets packed_dataset_path)", 2)
    try:
        pack_dataset = get_engine(engine)
    except ValueError as exc:
        _fail(cli_message(str(exc)), 2)
    except ImportError as exc:
        _fail(str(exc), 2)
    if engine != "ray" and (num_cpus is not None or planning is not None):
        _fail("--num-cpus and --planning apply to --engine ray only (the local engine plans over the whole "
              "dataset in one process: its packs are what --engine ray --planning global gives)", 2)
    if engine == "ray" and num_proc is not None:
        _fail("--num-proc applies to --engine local only (the Ray engine takes --num-cpus)", 2)
    engine_kw = {"num_cpus": num_cpus, "planning": planning or "global"} if engine == "ray" else {}
    if engine == "ray" and (image_processor is not None or min_pixels is not None or max_pixels is not None
                            or media_dir is not None or allow_any_media_path):
        _fail("--image-processor/--min-pixels/--max-pixels/--media-dir/--allow-any-media-path apply to --engine "
              "local only (image-text data is packed by the local engine)", 2)
    if engine != "ray":
        engine_kw = {"image_processor": image_processor, "min_pixels": min_pixels, "max_pixels": max_pixels,
                     "num_proc": num_proc, "media_dir": media_dir,
                     "allow_any_media_path": allow_any_media_path}

    progress = None if quiet else _lazy_progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=_err, transient=False,
    )
    restore = _terminate_like_interrupt()
    try:
        if dataset is not None:
            inputs = _select_datasets(inputs or [], dataset)
        try:
            res = pack_dataset(
                inputs or None, output, tokenizer=tokenizer, seq_length=seq_length, algorithm=algorithm,
                pad_to_multiple_of=pad_to_multiple_of, context_parallel_size=context_parallel_size,
                overlength=overlength, on_error=on_error, train_on=train_on, seed=seed, format=format,
                overwrite=overwrite, progress=progress, **engine_kw,
            )
        finally:
            if progress is not None and progress.live.is_started:  # (rich prints a blank line on every stop)
                progress.stop()
            restore()
    except Terminated:
        _fail(f"terminated (SIGTERM); nothing was written to {output}", 143)
    except KeyboardInterrupt:
        _fail(f"interrupted; nothing was written to {output}", 130)
    except Exception as exc:  # noqa: BLE001 - user errors become messages, bugs keep their traceback
        code = _user_error_code(exc)
        if code is None:
            raise
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            _fail(_disk_full_text(exc, output), code)
        _fail(cli_error_text(exc, config_keys=from_config, config_source=f"--config {config}"), code)
    from seqpack.io.summary import summary_rows  # defers pyarrow (io reader)

    _out.print(_summary_table(f"packed dataset: {res.output}", summary_rows(res.metadata, res.timings_s)))
    _print_entries(res.report.entries, res.output)


def _lazy_progress(*columns, **kwargs):  # noqa: ANN002, ANN003 - rich.progress.Progress's arguments
    """A rich ``Progress`` that starts with its first bar: a run that fails before any bar (a bad record,
    a setting) prints its error without the empty line a started display leaves on a non-terminal."""
    from rich.progress import Progress

    class LazyProgress(Progress):
        def add_task(self, *args, **kw):  # noqa: ANN002, ANN003 - rich's signature
            if not self.live.is_started:
                self.start()
            return super().add_task(*args, **kw)

    return LazyProgress(*columns, **kwargs)


def _config_options(ctx: typer.Context, config: Path, given: dict) -> dict:
    """The pack options ``config`` sets (``PackingConfig.pack_options``), less those given as flags.

    The config is loaded and checked as ``seqpack validate`` does; any problem (unknown key, wrong type,
    a rule, a key that contradicts offline packing) prints the same list of problems on stderr and exits with 2,
    before any data is read.
    """
    require_path_kind(config, "file", "--config", "pass a packing config file (.yaml/.yml/.json) or a recipe name "
                      "(`seqpack recipe` lists them)", 2)
    source = str(config)
    try:
        cfg, source = load_config(config)
        violations = cfg.violations()
        opts = cfg.pack_options(source=source) if not violations else {}
    except FileNotFoundError as exc:
        _fail(f"--config: {exc}", 2)
    except ConfigValidationError as exc:
        violations = exc.violations
    if violations:
        print_violations(_err, violations, source)
        _fail(f"--config {config} is not a valid packing config (its problems are listed above; `seqpack validate "
              f"{config}` checks it)", 2)
    # by name: typer may bring its own copy of click's ParameterSource enum
    explicit = {k for k in given if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"}
    return {k: v for k, v in opts.items() if k not in explicit}


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, Kubernetes, ``timeout`` and ``docker stop`` send) during ``seqpack pack``."""


def _terminate_like_interrupt():
    """Make SIGTERM unwind like Ctrl-C (temp folders, spills and workers are cleaned up on the way out);
    returns the function that puts the previous handler back. A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_sigterm(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _select_datasets(inputs: list, dataset: str) -> list:
    """Each ``dataset_info.json`` input replaced by the sources of its entries named in ``dataset``."""
    if not any(is_dataset_info(i) for i in inputs):
        _fail("--dataset selects entries of a LLaMA-Factory dataset_info.json input; no input is one", 2)
    return [s for i in inputs for s in (read_dataset_info(i, dataset) if is_dataset_info(i) else [i])]


def _print_entries(entries, output: Path, limit: int = 5) -> None:
    """Show the first ``limit`` report entries (records not packed as-is) and where the full list is."""
    from dataclasses import asdict, is_dataclass

    entries = [asdict(e) if is_dataclass(e) else dict(e) for e in entries]
    if not entries:
        return
    t = Table(title=f"records not packed as-is (first {min(limit, len(entries))} of {len(entries)})",
              title_justify="left")
    for col in ("sample_id", "status", "reason", "detail"):
        t.add_column(col, overflow="fold")
    for e in entries[:limit]:
        detail = str(e.get("detail") or "")
        t.add_row(str(e.get("sample_id")), str(e.get("status")), str(e.get("reason")),
                  detail if len(detail) <= 90 else detail[:87] + "...")
    _out.print(t)
    _out.print(f"full list: {output / 'report.jsonl'}", highlight=False)


@app.command("inspect")
def inspect(
    path: Path = typer.Argument(..., help="Packed dataset directory."),
    plot: Optional[str] = typer.Option(None, "--plot", metavar="PATH",  # str: keeps a trailing "/" (a folder)
                                       help="Where to write the PNG (default DIR/report.png)."),
    no_plot: bool = typer.Option(False, "--no-plot", help="Only print the summary."),
    as_json: bool = typer.Option(False, "--json", help="Print metadata.json (after the checks, report.jsonl read "
                                 "too) and nothing else."),
    verify: bool = typer.Option(
        False, "--verify", help="Also check every shard's sha256 against metadata.json, metadata.json / "
        "report.jsonl against their recorded hashes, and every pack's invariants (reads every shard)."
    ),
) -> None:
    """Print a packed dataset's metadata summary and write report.png (length and pack-fill histograms)."""
    from seqpack.io import load_packed  # defers pyarrow until the command runs
    from seqpack.io.summary import plot_path, plot_report, summary_rows

    require_path_kind(path, "folder", "packed dataset", "pass the folder `seqpack pack --output` wrote", 1)
    try:
        if plot is not None and not no_plot and not as_json:  # a bad --plot fails before any shard is read
            plot_path(plot)
        ds = load_packed(path, verify=verify)
        if verify:
            packs = ds.validate_rows()
            if not as_json:
                _out.print(f"verified sha256 of {len(ds.metadata.shards)} shard(s), metadata.json and report.jsonl, "
                           f"and the invariants of {packs} pack(s)", highlight=False)
        entries = ds.report()  # a damaged report fails before anything is printed, --json too
        if as_json:  # metadata.json as it is: its counts are the ones the summary prints
            typer.echo(ds.metadata.to_json(), nl=False)
            return
        _out.print(_summary_table(f"packed dataset: {path}", summary_rows(ds.metadata)))
        _print_entries(entries, Path(path))
        if not no_plot:
            try:
                png = plot_report(ds, plot)
            except OSError as exc:  # a read-only dataset, a file system refusing new files (/proc), a full disk
                why = "no permission (a read-only dataset?)" if isinstance(exc, PermissionError) else (
                    exc.strerror or str(exc))
                _fail(f"cannot write the plot {exc.filename or plot or Path(path) / 'report.png'}: {why}; pass "
                      "--plot PATH to write it elsewhere, or --no-plot", 1)
            _out.print(f"wrote {png}")
    except Exception as exc:  # noqa: BLE001
        code = _user_error_code(exc)
        if code is None:
            raise
        _fail(str(exc), code)


@app.command("algorithms")
def algorithms() -> None:
    """List the packing algorithms, one line each (the default is marked)."""
    default = PackingAlgorithm(DEFAULT_ALGORITHM)
    width = max(len(a.value) for a in PackingAlgorithm) + len(" (default)")
    for a in PackingAlgorithm:
        name = a.value + (" (default)" if a == default else "")
        doc = _describe(a).replace("``", "")
        typer.echo(f"{name:<{width}}  {doc}".rstrip())


def _describe(a) -> str:
    """One-line description of a ``PackingAlgorithm``: its ``description`` attribute when it has one,
    else its bullet in the enum's docstring (``* ``member`` [(default)]: text`` + indented lines)."""
    v = getattr(a, "description", None)
    if isinstance(v, str) and v.strip():
        return " ".join(v.split())
    import re

    lines = (type(a).__doc__ or "").splitlines()
    for k, line in enumerate(lines):
        mb = re.match(r"^(\s*)[*-]\s+``(\w+)``(?:\s*\(default\))?\s*:\s*(.*)$", line)
        if mb and mb.group(2) == a.value:
            text, indent = mb.group(3).strip(), len(mb.group(1))
            for cont in lines[k + 1 :]:
                stripped = cont.strip()
                if not stripped or stripped.startswith(("* ", "- ")) or len(cont) - len(cont.lstrip()) <= indent:
                    break
                text += " " + stripped
            return text
    return ""
