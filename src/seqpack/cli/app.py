"""The typer application and the console helpers every command module shares."""

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from seqpack import __version__
from seqpack.config import PackingConfig, list_recipes, load_recipe
from seqpack.config.errors import case_label

def _hide_flag_types() -> None:
    """Show on/off options (``--quiet``, ``--overwrite``, ``--help``) as plain flags in ``--help``.

    typer's rich help prints a type column for every option, ``<bool>`` for a flag too, which reads as
    if the flag took a value (``--quiet <bool>``); flags get an empty type column instead. Parsing is
    unchanged (a flag never takes a value).
    """
    from typer.core import TyperOption

    show = getattr(TyperOption, "display_type_rich", None)
    if show is None or getattr(show, "_seqpack_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and self.metavar is None else show(self, ctx)

    display_type_rich._seqpack_flags = True
    TyperOption.display_type_rich = display_type_rich


_hide_flag_types()

app = typer.Typer(
    name="seqpack",
    help="Sequence packing for LLM/VLM SFT: pack chat data, inspect packed datasets, validate configs.",
    no_args_is_help=True,
    add_completion=False,
)



def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"seqpack {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the seqpack version and exit."),
) -> None:
    """Sequence packing for LLM/VLM SFT: pack chat data, inspect packed datasets, validate configs."""


#: stderr console for errors and progress bars.
err_console = Console(stderr=True)


def fail(msg: str, code: int = 2) -> None:
    """Print ``error: <msg>`` on stderr and exit with ``code`` (no traceback: a user error).

    ``msg`` is printed literally: text such as ``pip install "seqpack[ray]"`` or a list like
    ``[0, 5, 8]`` is escaped, never read as rich markup.
    """
    err_console.print(f"[bold red]error:[/bold red] {escape(str(msg))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def load_config(config: Path) -> tuple[PackingConfig, str]:
    """The config a ``seqpack validate`` / ``seqpack pack --config`` argument names, and how to call it.

    ``config`` is a ``.yaml``/``.yml``/``.json`` file, or a recipe name (``seqpack recipe``) when no such
    file exists.

    Raises:
        FileNotFoundError: neither a file nor a recipe.
        ConfigValidationError: parse or schema problems (unknown keys, wrong types).
    """
    if not config.exists() and str(config) in list_recipes():
        return load_recipe(str(config)), f"recipe {config}"
    return PackingConfig.from_file(config), str(config)


def print_violations(console: Console, violations: list, source: str) -> None:
    """The table of config problems (rule, keys, problem, fix) ``seqpack validate`` prints, and the
    docs/cases.md label of each case met."""
    table = Table(title=escape(f"{len(violations)} problem{'s' if len(violations) != 1 else ''} in {source}"),
                  show_lines=True, expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("rule", no_wrap=True)
    table.add_column("keys", overflow="fold")
    table.add_column("problem", ratio=3, overflow="fold")
    table.add_column("fix", ratio=2, overflow="fold")
    for i, v in enumerate(violations, 1):
        rule = v.rule + (f"\n(case {v.case})" if v.case else "")
        table.add_row(str(i), escape(rule), escape("\n".join(v.keys)), escape(v.problem), escape(v.fix))
    console.print(table)
    for case in sorted({v.case for v in violations if v.case}):
        console.print(escape(f"{case_label(case)} (docs/cases.md)"), highlight=False)
