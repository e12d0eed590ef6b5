"""The reference training loop: the same samples trained padded, packed, in-batch packed and streamed.

``seqpack train --mode all`` (or :func:`run_training`) trains one HF causal LM per mode from the same
initial weights on the same samples per step and compares loss curves and throughput. What is compared,
how and with which goals: docs/notes/seqpack_bench.train.md.

Modules: :mod:`~seqpack_bench.train.config` (:class:`TrainConfig`, bounds, option names),
:mod:`~seqpack_bench.train.checks` (machine and output checks before any work), :mod:`~seqpack_bench.train.data`
(data files, tokenizer, synthetic samples), :mod:`~seqpack_bench.train.model` (tiny configs, vocabulary
compaction), :mod:`~seqpack_bench.train.loop` (:func:`run_training`), :mod:`~seqpack_bench.train.summary`
(figures, goals, ``train.json`` and charts).
"""

from seqpack_bench.train.checks import check_out_dir, check_runtime
from seqpack_bench.train.config import (CLI_OPTION_NAMES, MAX_SEQ_LENGTH, MIN_TIMED_STEPS, MODES, WEIGHT_FILES,
                                        TrainConfig, one_line)
from seqpack_bench.train.data import (default_data, expand_data_paths, load_train_tokenizer, prepare_data,
                                      resolve_tokenizer, summarize_prepare_report, synthetic_samples)
from seqpack_bench.train.loop import plan_steps, run_training
from seqpack_bench.train.model import build_model, compact_vocabulary, tiny_config

__all__ = [
    "MODES",
    "TrainConfig",
    "tiny_config",
    "build_model",
    "compact_vocabulary",
    "plan_steps",
    "synthetic_samples",
    "default_data",
    "resolve_tokenizer",
    "load_train_tokenizer",
    "expand_data_paths",
    "prepare_data",
    "summarize_prepare_report",
    "check_out_dir",
    "check_runtime",
    "CLI_OPTION_NAMES",
    "MIN_TIMED_STEPS",
    "MAX_SEQ_LENGTH",
    "WEIGHT_FILES",
    "one_line",
    "run_training",
]
