"""``seqpack bench prepare``: tokenize + pack + write, seqpack against TRL's own preparation.

What is compared and how: docs/notes/seqpack_bench.prepare.md. Modules: :mod:`~seqpack_bench.prepare.data`
(data sets, errors), :mod:`~seqpack_bench.prepare.programs` (the TRL and seqpack sides),
:mod:`~seqpack_bench.prepare.compare` (why they differ), :mod:`~seqpack_bench.prepare.run` (:func:`run_prepare`).
"""

from seqpack_bench.prepare.compare import THINK_NOTE, compare_sides
from seqpack_bench.prepare.data import (SHARED_FILES, WARMUP_RECORDS, PrepareDataError, PrepareOptionError,
                                        check_shared_data, real_datasets, table_name, write_synthetic_chat)
from seqpack_bench.prepare.programs import seqpack_prepare_and_pack, trl_prepare_and_pack
from seqpack_bench.prepare.run import QUICK_NOTE, run_prepare

__all__ = [
    "PrepareOptionError",
    "PrepareDataError",
    "THINK_NOTE",
    "QUICK_NOTE",
    "WARMUP_RECORDS",
    "write_synthetic_chat",
    "real_datasets",
    "check_shared_data",
    "trl_prepare_and_pack",
    "seqpack_prepare_and_pack",
    "run_prepare",
    "compare_sides",
    "table_name",
    "SHARED_FILES",
]
