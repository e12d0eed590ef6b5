"""seqpack_bench: measurement and the reference training loop of seqpack (imports seqpack; seqpack never
imports it).

Commands (added to ``seqpack`` through the ``seqpack.cli`` entry points, :mod:`seqpack_bench.cli`):
``seqpack bench algorithms | prepare | stream`` and ``seqpack train``. Each benchmark checks ``out_dir``
first, then writes ``<name>.json`` plus PNG charts into it.

- :mod:`seqpack_bench.timing` -- medians of repeats, output-folder check, JSON/PNG writers, rich tables,
  PASS/MISS lines;
- :mod:`seqpack_bench.references` -- TRL ``pack_dataset``, LLaMA-Factory's greedy knapsack and
  Megatron-Bridge's first fit, run as installed (plus a re-implementation of LLaMA-Factory's for when it
  is absent);
- :mod:`seqpack_bench.algorithms` -- ``seqpack bench algorithms``;
- :mod:`seqpack_bench.prepare` -- ``seqpack bench prepare`` (tokenize + pack + write vs TRL);
- :mod:`seqpack_bench.stream` -- ``seqpack bench stream`` (runs :mod:`seqpack_bench.bench_stream` in-process
  and charts the figures it returns);
- :mod:`seqpack_bench.train` -- the reference loop, ``seqpack train --mode all`` (training throughput);
- standalone benchmarks, ``python -m seqpack_bench.<name>``: ``bench_algorithms`` (packs vs lower bounds),
  ``bench_balance`` (data-parallel balance), ``bench_collate`` (collate speed, loss memory),
  ``bench_scale`` (10M lengths, 1M records, Ray), ``bench_stream`` (the streaming packer),
  ``bench_compare`` (the commands above without installed entry points), ``gpu.bench_gpu`` (padded vs
  packed on one GPU; ``bash src/seqpack_bench/gpu/run.sh``).
"""

from seqpack_bench.timing import (
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
