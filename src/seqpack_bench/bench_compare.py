"""Thin wrapper: the comparison benchmarks and the reference training loop from a source checkout.

Same as the CLI commands (``seqpack bench ...``, ``seqpack train ...``), runnable without installing::

    python benchmarks/bench_compare.py bench algorithms            # 100,000 and 1,000,000 lengths
    python benchmarks/bench_compare.py bench prepare               # real data + 100,000 synthetic chats
    python benchmarks/bench_compare.py bench stream --quick        # benchmarks/bench_stream.py
    python benchmarks/bench_compare.py train --mode all            # padded vs packed vs in_batch vs streaming

Every command writes JSON + PNG into ``--out`` (default ``bench_results/``); ``--quick`` runs in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv: list[str] | None = None) -> None:
    import seqpack.cli.bench_cmd  # noqa: F401 - registers `bench`
    import seqpack.cli.train_cmd  # noqa: F401 - registers `train`
    from seqpack.cli.app import app

    app(args=list(sys.argv[1:] if argv is None else argv), prog_name="seqpack")


if __name__ == "__main__":
    main()
