"""The comparison benchmarks and the reference training loop without installed entry points.

The same as the CLI commands (``seqpack bench ...``, ``seqpack train ...``) when the ``seqpack.cli`` entry
points of this distribution are not installed (e.g. ``PYTHONPATH=src`` in a source checkout)::

    python -m seqpack_bench.bench_compare bench algorithms            # 100,000 and 1,000,000 lengths
    python -m seqpack_bench.bench_compare bench prepare               # real data + 100,000 synthetic chats
    python -m seqpack_bench.bench_compare bench stream --quick        # seqpack_bench.bench_stream
    python -m seqpack_bench.bench_compare train --mode all            # padded vs packed vs in_batch vs streaming

Every command writes JSON + PNG into ``--out`` (default ``bench_results/``); ``--quick`` runs in seconds.
"""

from __future__ import annotations

import sys

import typer

from seqpack.cli.app import app, reflow_help
from seqpack_bench.cli.bench import bench_app
from seqpack_bench.cli.train import register as register_train


def ensure_commands(target: typer.Typer = app) -> typer.Typer:
    """Add ``bench`` and ``train`` to ``target`` unless its entry points already did."""
    groups = {g.name for g in target.registered_groups}
    commands = {c.name for c in target.registered_commands}
    if "bench" not in groups:
        target.add_typer(bench_app, name="bench")
    if "train" not in commands:
        register_train(target)
    reflow_help(target)
    return target


def main(argv: list[str] | None = None) -> None:
    """Run ``seqpack <argv>`` (default ``sys.argv[1:]``) with the commands of this package."""
    ensure_commands()(args=list(sys.argv[1:] if argv is None else argv), prog_name="seqpack")


if __name__ == "__main__":
    main()
