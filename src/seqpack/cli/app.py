"""The typer application and the console helpers every command module shares."""

import typer
from rich.console import Console
from rich.markup import escape

from seqpack import __version__

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
