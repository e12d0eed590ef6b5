"""seqpack: sequence packing for LLM and VLM supervised fine-tuning.

The names below are importable from ``seqpack`` directly; each is imported on first use, so ``import
seqpack`` pulls in neither numba (the algorithms) nor transformers, pyarrow or torch: a preparation worker
process, which imports ``seqpack.data`` only, does not pay for numba.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "PackingAlgorithm": "seqpack.algorithms",
    "PackingPlan": "seqpack.algorithms",
    "pack_lengths": "seqpack.algorithms",
    "compute_pad_multiple": "seqpack.padding",
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

__all__ = ["__version__", *_LAZY]


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
