"""The typer application and the console helpers every command module shares."""

import inspect
import re
import shlex
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

#: a line that starts a list item in help text (kept on its own line by :func:`reflow_text`)
_ITEM = re.compile(r"([-*\u2022]|\d+[.)])\s")


def reflow_text(text: str) -> str:
    """``text`` (a docstring or ``help=``) with each paragraph on one line, for rich to wrap to the terminal.

    typer's rich help keeps the single line breaks of a docstring's later paragraphs, so a docstring wrapped
    at 100 columns prints as long lines broken mid-sentence on a narrower or wider terminal. Paragraphs
    (split at blank lines) are joined into one line each; a paragraph that starts with ``\\b`` and the
    lines that start a list item (``- ``, ``* ``, ``1. ``) keep their line breaks; anything after ``\\f``
    (hidden from ``--help``) is kept as it is. Idempotent.

    Example::

        reflow_text("Check a config.\\n\\nWith PACKED_DIR, the\\nmetadata is compared.")
        # 'Check a config.\\n\\nWith PACKED_DIR, the metadata is compared.'
    """
    shown, sep, hidden = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for para in re.split(r"\n[ \t]*\n", shown.strip("\n")):
        if para.startswith("\b"):
            paragraphs.append(para)
            continue
        lines: list[str] = []
        for line in para.splitlines():
            if lines and not _ITEM.match(line.strip()):
                lines[-1] = f"{lines[-1]} {line.strip()}"
            else:
                lines.append(line.rstrip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs) + sep + hidden


def reflow_help(target: typer.Typer) -> None:
    """Give every command and group of ``target`` (the app, its groups, recursively) the help text typer
    would show, reflowed by :func:`reflow_text`; call it once the commands are registered (plugins too).

    The text goes where typer looks first: ``CommandInfo.help`` of a command (its docstring when unset),
    the ``add_typer`` help of a group, and the callback help of ``target`` itself.
    """
    from typer.main import solve_typer_info_help
    from typer.models import TyperInfo

    for info in target.registered_commands:
        text = info.help if info.help is not None else inspect.getdoc(info.callback)
        if text:
            info.help = reflow_text(text)
    for group in target.registered_groups:
        text = solve_typer_info_help(group)
        if text:
            group.help = reflow_text(text)
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)
    if target.registered_callback is not None:
        text = solve_typer_info_help(TyperInfo(typer_instance=target))
        if text:
            target.registered_callback.help = reflow_text(text)
    elif isinstance(target.info.help, str):
        target.info.help = reflow_text(target.info.help)


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


def path_kind_problem(path: Path, want: str, what: str, fix: str) -> str | None:
    """The message for ``path`` passed where a file (``want="file"``) or a folder (``want="folder"``) is
    expected, when it is an existing path of the other kind; None when it is of the right kind or missing
    (each command reports a missing path in its own words).

    The message says plainly which kind ``path`` is, then names the command that reads it when that is
    clear: a folder holding ``metadata.json`` (a packed dataset) -> ``seqpack inspect DIR --verify``; a
    ``.yaml``/``.yml``/``.json`` file given as a folder -> ``seqpack validate FILE``; a packed dataset's
    ``metadata.json`` given as the dataset -> its folder. ``fix`` (what to pass instead) ends it.

    Example::

        path_kind_problem(Path("packed"), "file", "CONFIG", "pass a .yaml/.yml/.json config file")
        # 'CONFIG packed is a folder, not a file. It holds a packed dataset (metadata.json): to check it,
        #  run `seqpack inspect packed --verify`. Fix: pass a .yaml/.yml/.json config file'
    """
    from seqpack.io import METADATA_FILE, is_packed_dataset  # defers pyarrow (the seqpack.io package)

    q = shlex.quote(str(path))
    if want == "file" and path.is_dir():
        hint = (f" It holds a packed dataset ({METADATA_FILE}): to check it, run `seqpack inspect {q} --verify`."
                if is_packed_dataset(path) else "")
        return f"{what} {path} is a folder, not a file.{hint} Fix: {fix}"
    if want == "folder" and path.exists() and not path.is_dir():
        if path.name == METADATA_FILE:
            hint = f" It is a packed dataset's {METADATA_FILE}; the dataset is its folder, {path.parent}."
        elif path.suffix.lower() in (".yaml", ".yml", ".json"):
            hint = f" To check a packing config file, run `seqpack validate {q}`."
        else:
            hint = ""
        return f"{what} {path} is a file, not a folder.{hint} Fix: {fix}"
    return None


def require_path_kind(path: Path, want: str, what: str, fix: str, code: int) -> None:
    """:func:`fail` with :func:`path_kind_problem`'s message (exit ``code``) when ``path`` is an existing
    path of the wrong kind; returns otherwise."""
    msg = path_kind_problem(path, want, what, fix)
    if msg is not None:
        fail(msg, code)


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
    """The config problems (rule, keys, problem, fix) ``seqpack validate`` and ``seqpack pack --config``
    print, and the docs/cases.md label of each case met: a table on a console of 120 columns or more, else
    one numbered entry per problem wrapped at word boundaries to the console's width (a table's cells would
    break words at 80 columns)."""
    title = f"{len(violations)} problem{'s' if len(violations) != 1 else ''} in {source}"
    if console.width < 120:
        import textwrap

        def wrapped(label: str, text: str) -> str:
            return textwrap.fill(text, width=max(40, console.width - 1), initial_indent=f"   {label}: ",
                                 subsequent_indent="   " + " " * (len(label) + 2), break_long_words=False,
                                 break_on_hyphens=False)

        lines = [textwrap.fill(title, width=max(40, console.width - 1), break_long_words=False)]
        for i, v in enumerate(violations, 1):
            case = f" (case {v.case})" if v.case else ""
            lines += [f"{i}. {v.rule}{case}", wrapped("keys", ", ".join(v.keys)), wrapped("problem", v.problem),
                      wrapped("fix", v.fix)]
        lines += [textwrap.fill(f"{case_label(case)} (docs/cases.md)", width=max(40, console.width - 1),
                                subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
                  for case in sorted({v.case for v in violations if v.case})]
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(title=escape(title),
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
