"""seqpack command line (typer + rich). Each command group lives in its own module."""

from __future__ import annotations

import logging
import sys
from importlib.metadata import entry_points

import typer

# Importing a command module registers its commands on ``app``, in `seqpack --help` order (pack_cmd
# first); the plugins' commands follow (``load_plugins`` below).
from seqpack.cli import pack_cmd, config_cmd  # noqa: F401  # isort: skip
from seqpack.cli.allocator import prefer_system_allocator
from seqpack.cli.app import app, reflow_help

#: entry-point group of command plugins (see :func:`load_plugins`).
PLUGIN_GROUP = "seqpack.cli"


def load_plugins(target: typer.Typer = app, group: str = PLUGIN_GROUP) -> list[str]:
    """Add the commands of installed plugins to ``target`` (the ``seqpack`` app).

    A distribution declares a plugin in its pyproject.toml::

        [project.entry-points."seqpack.cli"]
        bench = "some_package.cli:bench_app"         # a typer.Typer: added as the group `seqpack bench`
        train = "some_package.cli:register_train"    # a callable: called as register_train(app)

    The object an entry point names is either a ``typer.Typer`` (added as a sub-app under the entry
    point's name, ``app.add_typer(obj, name=<name>)``) or a callable taking the app (it adds commands
    itself, e.g. ``app.command("train")(fn)``). Plugins are loaded in entry-point name order, when
    ``seqpack.cli`` is imported. seqpack imports no plugin by name: the measurement package of this
    repository registers ``bench`` and ``train`` this way. A plugin that fails to load or register
    (ImportError, any exception, an object of another type) is skipped with one line on stderr,
    ``warning: seqpack CLI plugin '<name>' (<module:attr>) not loaded: <Error>: <message>``, so the
    other commands (``seqpack pack``, ...) keep working.

    Returns:
        the names of the plugins added.
    """
    added = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            obj = ep.load()
            if isinstance(obj, typer.Typer):
                target.add_typer(obj, name=ep.name)
            elif callable(obj):
                obj(target)
            else:
                raise TypeError(f"{ep.value} is a {type(obj).__name__}, not a typer.Typer or a callable(app)")
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the other commands
            print(f"warning: seqpack CLI plugin {ep.name!r} ({ep.value}) not loaded: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        added.append(ep.name)
    return added


class _NoTorchNotice:
    """A ``logging`` filter dropping transformers' import-time notice "PyTorch was not found. Models won't
    be available ...": the CLI's packing needs only the tokenizer, so on a minimal install (no torch) the
    notice is noise on every run. Nothing else transformers logs is touched."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


logging.getLogger("transformers").addFilter(_NoTorchNotice())  # before a plugin or command imports it
load_plugins(app)
reflow_help(app)  # after the plugins: their help is reflowed too


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app on ``argv`` (default: ``sys.argv[1:]``), with Arrow on the
    C library's allocator unless ``ARROW_DEFAULT_MEMORY_POOL`` is set (:func:`prefer_system_allocator`:
    a lower peak memory when writing packs)."""
    prefer_system_allocator()
    _warnings_on_stderr()
    app(args=argv)


def _warnings_on_stderr() -> None:
    """seqpack's own WARNING log records (e.g. an input file listed twice) as ``warning: <message>`` lines
    on stderr, shown with ``--quiet`` too."""
    log = logging.getLogger("seqpack")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        handler.setLevel(logging.WARNING)
        log.addHandler(handler)
