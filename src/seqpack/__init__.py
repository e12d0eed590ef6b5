"""seqpack: sequence packing for LLM and VLM supervised fine-tuning."""

__version__ = "0.1.0"

from seqpack.algorithms import PackingAlgorithm, PackingPlan, pack_lengths  # noqa: E402,F401
from seqpack.padding import compute_pad_multiple  # noqa: E402,F401

__all__ = ["PackingAlgorithm", "PackingPlan", "pack_lengths", "compute_pad_multiple", "__version__"]
