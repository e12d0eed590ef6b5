"""seqpack command line (typer + rich). Each command group lives in its own module."""

from seqpack.cli.app import app


def _register() -> None:
    # Importing a module registers its commands on ``app``.
    from seqpack.cli import pack_cmd  # noqa: F401
    from seqpack.cli import config_cmd  # noqa: F401
    from seqpack.cli import bench_cmd  # noqa: F401
    from seqpack.cli import train_cmd  # noqa: F401


_register()


def main() -> None:  # console-script entry point
    app()
