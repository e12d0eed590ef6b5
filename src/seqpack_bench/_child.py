"""Run a module of this package in a fresh interpreter: ``python -m seqpack_bench.<name> ... --result FILE``.

Benchmarks that measure a process from outside (peak memory) run their stage this way and read its
figures back from the JSON file it writes, never from its printed text.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import seqpack

import seqpack_bench


def module_command(module: str, *args: str) -> list[str]:
    """``[python, "-m", module, *args]`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def child_env() -> dict[str, str]:
    """``os.environ`` with the folders holding ``seqpack_bench`` and ``seqpack`` first on ``PYTHONPATH``, so
    the child imports the same code as this process (a source checkout or an installed wheel alike)."""
    roots = dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (seqpack_bench, seqpack))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in roots]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*roots, *rest]))
