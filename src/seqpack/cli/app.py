"""The typer application and the console helpers every command module shares."""

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(
    name="seqpack",
    help="Sequence packing for LLM/VLM SFT: pack chat data, inspect packed datasets, validate configs.",
    no_args_is_help=True,
    add_completion=False,
)

#: stderr console for errors and progress bars.
err_console = Console(stderr=True)


def fail(msg: str, code: int = 2) -> None:
    """Print ``error: <msg>`` on stderr and exit with ``code`` (no traceback: a user error).

    ``msg`` is printed literally: text such as ``pip install "seqpack[ray]"`` or a list like
    ``[0, 5, 8]`` is escaped, never read as rich markup.
    """
    err_console.print(f"[bold red]error:[/bold red] {escape(str(msg))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
