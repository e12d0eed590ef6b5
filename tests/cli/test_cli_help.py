"""Every `seqpack ... --help` page (the app, each command, each group, the plugins' commands) reads well at
80 and 120 columns: no line wider than the terminal, every word of the help texts whole on one line,
paragraphs reflowed rather than broken where the docstring's lines happened to end, and literal square
brackets (``seqpack[ray]``) shown."""

from __future__ import annotations

import importlib.util
import re

import click
import pytest
import typer
from typer.testing import CliRunner

from seqpack.cli import app
from seqpack.cli.app import reflow_text

WIDTHS = (80, 120)
#: box-drawing characters of rich's panels, replaced by spaces before the output is split into words
_BOX = re.compile(r"[\u2500-\u257f]")


def _commands() -> list[tuple[list[str], click.Command]]:
    """(argv prefix, command) of the app and of every command and group below it, depth first."""
    out = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        out.append((path, cmd))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()
NAMES = [" ".join(p) or "seqpack" for p, _ in COMMANDS]


def _texts(cmd: click.Command) -> list[str]:
    """The help texts a --help page shows: the command's (up to ``\\f``) and each visible parameter's."""
    texts = [(cmd.help or "").partition("\f")[0]]
    texts += [getattr(p, "help", None) or "" for p in cmd.params if not getattr(p, "hidden", False)]
    return [t for t in texts if t.strip()]


def _words(text: str) -> set[str]:
    return set(_BOX.sub(" ", text).split())


def _help(path: list[str], width: int) -> str:
    # COLUMNS, read by rich for each page; not TERMINAL_WIDTH, which typer reads once, on first use
    r = CliRunner(env={"COLUMNS": str(width), "NO_COLOR": "1"}).invoke(app, [*path, "--help"])
    assert r.exit_code == 0, r.output
    return r.output


def test_the_walk_finds_every_command_and_the_plugins():
    top = {p[0] for p, _ in COMMANDS if len(p) == 1}
    assert {"pack", "inspect", "algorithms", "validate", "recipe", "families"} <= top
    if importlib.util.find_spec("seqpack_bench") is not None:
        assert {"bench", "train"} <= top
        assert {"bench algorithms", "bench prepare", "bench stream"} <= set(NAMES)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path,cmd", COMMANDS, ids=NAMES)
def test_help_fits_the_terminal_and_keeps_every_word_whole(path, cmd, width):
    out = _help(path, width)
    wide = [line for line in out.splitlines() if len(line) > width]
    assert wide == [] and max(map(len, out.splitlines())) == width, f"lines wider than {width}: {wide}"
    shown = _words(out)
    for text in _texts(cmd):
        # a rich escape \[ prints as [: the word the user reads is the unescaped one
        missing = [w for w in text.replace("\\[", "[").split() if w not in shown]
        assert missing == [], f"words broken across lines or eaten as markup: {missing}\n{out}"


def _ragged(out: str, width: int) -> list[tuple[str, str]]:
    """Pairs of consecutive prose lines (the text between the usage line and the first panel) where the
    next line's first word would have fit on the line before: a line break kept from the source, which
    rich's greedy wrapping never makes. The prose is indented one column on each side."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:"))
    start = next(i for i in range(start, len(lines)) if not lines[i].strip())  # the usage may wrap
    stop = next((i for i, line in enumerate(lines) if line.startswith("\u256d")), len(lines))
    prose = [line.rstrip() for line in lines[start:stop]]
    return [(a, b) for a, b in zip(prose, prose[1:])
            if a and b and len(a) + 1 + len(b.split()[0]) <= width - 1 and not re.match(r"\s*([-*]|\d+[.)]) ", b)]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path,cmd", COMMANDS, ids=NAMES)
def test_help_prose_is_reflowed_to_the_width(path, cmd, width):
    out = _help(path, width)
    assert _ragged(out, width) == [], out


@pytest.mark.parametrize("width", WIDTHS)
def test_docstring_paragraphs_are_reflowed_not_cut_at_the_source_lines(width):
    out = _help(["validate"], width)
    # validate's docstring breaks its second paragraph after "packed_dataset_path" and "capacity,"
    lines = [line.strip() for line in out.splitlines()]
    assert "packed_dataset_path" not in lines and not any(line.endswith("too: capacity,") for line in lines)
    assert max(len(line) for line in out.splitlines()[:12]) > width - 12  # the text fills the width


@pytest.mark.parametrize("width", WIDTHS)
def test_literal_brackets_survive(width):
    # --engine's help: 'local | ray (needs: pip install "seqpack\\[ray]").' (escaped for rich)
    assert '"seqpack[ray]").' in _words(_help(["pack"], width))


def test_reflow_text_joins_paragraph_lines_and_keeps_lists_and_hidden_text():
    src = "First line\n  continued.\n\nSecond para\nwraps here.\n\n- item one\n  more\n- item two\n\f\nhidden\nlines"
    got = reflow_text(src)
    assert got == "First line continued.\n\nSecond para wraps here.\n\n- item one more\n- item two\f\nhidden\nlines"
    assert reflow_text(got) == got
    assert reflow_text("\bkept\nas is\n\nnext\npara") == "\bkept\nas is\n\nnext para"
