"""Where the benchmarks look for the real demo data: ``../shared/data`` beside the source checkout."""

from __future__ import annotations

from pathlib import Path

#: the repository root of this source checkout (``src/seqpack_bench/paths.py`` -> ``parents[2]``).
REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """``<checkout>/../shared/data`` (the demo files of ``seqpack bench prepare``, ``seqpack train`` and
    ``bench_balance``). The folder may be absent (an installed wheel, another machine); callers check."""
    return REPO_ROOT.parent / "shared" / "data"
