"""Measured comparisons: seqpack against existing packers and a padded training baseline.

Modules (each benchmark checks ``out_dir`` first, then writes ``<name>.json`` plus PNG charts into it):

- :mod:`seqpack.bench.timing` -- medians of repeats, output-folder check, JSON/PNG writers, rich tables,
  PASS/MISS lines;
- :mod:`seqpack.bench.references` -- TRL ``pack_dataset``, LLaMA-Factory's greedy knapsack and Megatron-Bridge's
  first fit, run as installed (plus a re-implementation of LLaMA-Factory's for when it is absent);
- :mod:`seqpack.bench.algorithms` -- ``seqpack bench algorithms``;
- :mod:`seqpack.bench.prepare` -- ``seqpack bench prepare`` (tokenize + pack + write vs TRL);
- :mod:`seqpack.bench.stream` -- ``seqpack bench stream`` (runs ``benchmarks/bench_stream.py``, charts the
  figures it writes with ``--json``).

The training-throughput comparison is :mod:`seqpack.train` (``seqpack train --mode all``).
"""

from seqpack.bench.timing import (
    OutputDirError,
    Timing,
    bar_chart,
    ensure_out_dir,
    line_chart,
    print_table,
    timed,
    verdict,
    write_json,
)

__all__ = ["OutputDirError", "Timing", "bar_chart", "ensure_out_dir", "line_chart", "print_table", "timed", "verdict",
           "write_json"]
