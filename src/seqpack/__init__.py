"""seqpack: sequence packing for LLM and VLM supervised fine-tuning.

The names below are importable from ``seqpack`` directly. The algorithms are imported eagerly (numpy +
numba only); the data pipeline and the packed-dataset reader are imported on first use, so
``import seqpack`` does not pull in transformers, pyarrow or torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from seqpack.algorithms import PackingAlgorithm, PackingPlan, pack_lengths  # noqa: E402
from seqpack.padding import compute_pad_multiple  # noqa: E402

_LAZY = {
    "pack_dataset": "seqpack.pipeline",
    "PackResult": "seqpack.pipeline",
    "load_packed": "seqpack.io",
    "write_packed": "seqpack.io",
    "PackedDataset": "seqpack.io",
    "PackedSequence": "seqpack.packed",
    "build_packed_sequence": "seqpack.packed",
    "prepare": "seqpack.data",
    "load_tokenizer": "seqpack.data",
    "Sample": "seqpack.sample",
    "PackingConfig": "seqpack.config",
}

__all__ = [
    "PackingAlgorithm",
    "PackingPlan",
    "pack_lengths",
    "compute_pad_multiple",
    "__version__",
    *_LAZY,
]


#: Subpackages reachable as attributes (``seqpack.data.prepare`` after a plain ``import seqpack``).
_SUBMODULES = {
    "accounting", "adapters", "algorithms", "collate", "config", "data", "hf", "interop",
    "io", "loss", "moe", "mtp", "packed", "padding", "parallel", "pipeline", "sample", "stream",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"seqpack.{name}")
        globals()[name] = module
        return module
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'seqpack' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
