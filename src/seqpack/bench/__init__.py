"""Measured comparisons: seqpack against existing packers and a padded training baseline.

Modules (each benchmark writes ``<name>.json`` plus PNG charts into ``out_dir``):

- :mod:`seqpack.bench.timing` -- medians of repeats, JSON/PNG writers, rich tables, PASS/MISS lines;
- :mod:`seqpack.bench.references` -- TRL ``pack_dataset`` and the LLaMA-Factory greedy-knapsack reference;
- :mod:`seqpack.bench.algorithms` -- ``seqpack bench algorithms``;
- :mod:`seqpack.bench.prepare` -- ``seqpack bench prepare`` (tokenize + pack + write vs TRL);
- :mod:`seqpack.bench.stream` -- ``seqpack bench stream`` (runs ``benchmarks/bench_stream.py``).

The training-throughput comparison is :mod:`seqpack.train` (``seqpack train --mode all``).
"""

from seqpack.bench.timing import Timing, bar_chart, line_chart, print_table, timed, verdict, write_json

__all__ = ["Timing", "bar_chart", "line_chart", "print_table", "timed", "verdict", "write_json"]
