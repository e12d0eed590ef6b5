"""`seqpack validate CONFIG` and `seqpack recipe [NAME]` (setup-time config checks and presets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.console import Console
from rich.table import Table

from seqpack.cli.app import app, err_console, fail, load_config, print_violations, require_path_kind
from seqpack.config import (
    ConfigValidationError,
    get_family,
    list_families,
    list_recipes,
    recipe_descriptions,
    recipe_text,
)


def _console() -> Console:
    # the terminal's width (COLUMNS, else 80 when piped): tables wrap their cells at word boundaries
    return Console(highlight=False)


@app.command("validate")
def validate_cmd(
    config: Path = typer.Argument(..., help="Packing config (.yaml/.yml/.json) or a recipe name."),
    packed_dir: Optional[Path] = typer.Argument(
        None, help="Packed dataset directory to check against the config (overrides packed_dataset_path).",
    ),
    output_format: str = typer.Option("table", "--format", "-f", help="table | json"),
    check_data: bool = typer.Option(
        True, "--check-data/--no-check-data",
        help="With PACKED_DIR or packed_dataset_path, also check the stored data was packed for this config "
        "(B23: stale packed data).",
    ),
) -> None:
    """Check a packing config against every setup-time rule; exit 0 when valid, 1 otherwise.

    A valid config prints one OK line on stdout; problems go to stderr, as a table on a terminal of 120
    columns or more, else as a numbered list (--format json prints the verdict on stdout either way).

    CONFIG may also be a recipe name (see `seqpack recipe`). With PACKED_DIR, or packed_dataset_path
    set in the config, the stored dataset's metadata is compared with the config too: capacity,
    effective pad multiple, CP size, train_on and tokenizer identity are violations; a different
    algorithm is only a note. --no-check-data skips the data check.
    """
    console = _console()
    if output_format not in ("table", "json"):
        fail(f"--format must be 'table' or 'json', got {output_format!r}")
    if packed_dir is not None and not check_data:
        fail("PACKED_DIR asks for a data check but --no-check-data turns it off; drop one of them")
    require_path_kind(config, "file", "config", "pass a packing config file (.yaml/.yml/.json) or a recipe name "
                      "(`seqpack recipe` lists them)", 1)
    if packed_dir is not None:
        require_path_kind(packed_dir, "folder", "PACKED_DIR", "pass the packed dataset folder (what `seqpack pack "
                          "--output` wrote), or omit it", 1)
    source = str(config)
    notes: list[str] = []
    data_path: Optional[str] = None
    try:
        cfg, source = load_config(config)
        violations = cfg.violations()
        if check_data:
            checked = cfg.check_packed_data(packed_dir)
            violations += checked.violations
            notes, data_path = checked.notes, checked.path
    except FileNotFoundError as e:
        fail(f"{e} (recipes: {', '.join(list_recipes())})", 1)
    except ConfigValidationError as e:
        cfg, violations = None, e.violations

    if output_format == "json":
        typer.echo(json.dumps({"source": source, "valid": not violations,
                               "effective_pad_multiple": cfg.effective_pad_multiple if cfg else None,
                               "packed_data": data_path, "notes": notes,
                               "violations": [v.to_dict() for v in violations]}, indent=2))
        raise typer.Exit(0 if not violations else 1)

    if not violations:
        console.print(
            f"[green]OK[/green] {escape(source)}: packing={cfg.packing.value}, seq_length={cfg.seq_length}, "
            f"effective_pad_multiple={cfg.effective_pad_multiple}, micro_batch_size={cfg.micro_batch_size}, "
            f"context_parallel_size={cfg.context_parallel_size}"
            + (f", model_family={escape(cfg.model_family)}" if cfg.model_family else "")
        )
        if data_path is not None:
            console.print(f"[green]OK[/green] packed data {escape(data_path)} fits this config")
        _print_notes(console, notes)
        raise typer.Exit(0)

    print_violations(err_console, violations, source)  # the problems are errors: stderr, the terminal's width
    _print_notes(err_console, notes)
    raise typer.Exit(1)


def _print_notes(console: Console, notes: list[str]) -> None:
    for n in notes:
        console.print(f"[yellow]note[/yellow]: {escape(n)}")


@app.command("recipe")
def recipe_cmd(
    name: Optional[str] = typer.Argument(None, help="Recipe name; omit to list the recipes."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the YAML to this file."),
) -> None:
    """Print a recipe's YAML (a validated PackingConfig preset), or list the recipes."""
    console = _console()
    if name is None:
        table = Table(title="seqpack recipes (seqpack recipe NAME prints one)")
        table.add_column("name", no_wrap=True)
        table.add_column("description")
        for n, d in recipe_descriptions().items():
            table.add_row(n, d)
        console.print(table)
        return
    if name not in list_recipes():
        fail(f"unknown recipe {name!r}; known: {', '.join(list_recipes())}", 1)
    text = recipe_text(name)
    if output is not None:
        from seqpack.io import check_output_file  # defers pyarrow (the seqpack.io package)

        try:
            check_output_file(output, "recipe file", f"{name}.yaml").write_text(text, encoding="utf-8")
        except OSError as exc:  # a folder, a missing folder, no permission: a message, not a traceback
            fail(str(exc) if exc.filename is None else f"cannot write {exc.filename}: {exc.strerror}", 1)
        console.print(f"wrote {output}")
        return
    typer.echo(text, nl=False)


@app.command("families")
def families_cmd(
    name: Optional[str] = typer.Argument(None, help="Family key or alias; omit to list every family."),
) -> None:
    """Show the model-family registry (packing modes, positions, attention kinds, MTP, opt-outs, sources)."""
    console = _console()
    if name is None:
        table = Table(title="seqpack model families (seqpack families NAME shows opt-outs and sources)")
        for col in ("family", "modality", "positions", "packing modes", "attention kinds", "MoE", "MTP"):
            table.add_column(col, no_wrap=col == "family", overflow="fold")  # fold: never cut a name to "…"
        for f in list_families():
            table.add_row(f.key, f.modality, f.position_type, ", ".join(f.packing_modes),
                          ", ".join(f.attention_kinds), "yes" if f.moe else "", "yes" if f.mtp else "")
        console.print(table)
        return
    try:
        f = get_family(name)
    except KeyError as e:
        fail(str(e.args[0]), 1)
    console.print(f"[bold]{f.key}[/bold] ({f.name}): {f.modality}, positions {f.position_type}, "
                  f"attention {', '.join(f.attention_kinds)}, MoE {'yes' if f.moe else 'no'}, "
                  f"MTP {'yes' if f.mtp else 'no'}")
    console.print(f"packing modes: {', '.join(f.packing_modes)}")
    if f.aliases:
        console.print(f"aliases: {', '.join(f.aliases)}")
    for o in f.opt_outs:
        console.print(escape(f"opt-out {', '.join(o.modes)}: {o.reason} [source: {o.source}]"))
    for s in f.sources:
        console.print(escape(f"source: {s}"))
