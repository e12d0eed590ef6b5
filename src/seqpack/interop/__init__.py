"""Interoperability: convert seqpack packs to and from the packed formats other frameworks read.

* :mod:`seqpack.interop.megatron_bridge` -- Megatron-Bridge packed Parquet (``input_ids``, ``loss_mask``,
  ``seq_start_id`` + ``packing_metadata.json``, files in ``megatron_bridge_files``); runtime length =
  stored length - 1 (case B12).
* :mod:`seqpack.interop.torchtune` -- torchtune packed samples (``tokens``, unshifted ``labels``,
  ``input_pos``, ``seq_lens``).
* :mod:`seqpack.interop.hf_datasets` -- a Hugging Face ``datasets.Dataset`` with one row per pack, in the
  columns HF ``Trainer`` and TRL read (unshifted ``labels``, ``shift_labels``, physical ``seq_lengths``).

Every exporter has an importer, and export -> import gives back the same packs token by token.
Nothing here imports torch or megatron at module import time.
"""

from seqpack.interop.hf_datasets import HF_COLUMNS, from_hf_dataset, to_hf_dataset
from seqpack.interop.megatron_bridge import (
    BRIDGE_COLUMNS,
    BRIDGE_METADATA_FILE,
    bridge_pack_metadata,
    from_bridge_row,
    to_bridge_row,
)
from seqpack.interop.megatron_bridge_files import BridgeExport, export_megatron_bridge, read_megatron_bridge
from seqpack.interop.torchtune import from_torchtune, to_torchtune

__all__ = [
    "BRIDGE_COLUMNS",
    "BRIDGE_METADATA_FILE",
    "BridgeExport",
    "HF_COLUMNS",
    "bridge_pack_metadata",
    "export_megatron_bridge",
    "from_bridge_row",
    "from_hf_dataset",
    "from_torchtune",
    "read_megatron_bridge",
    "to_bridge_row",
    "to_hf_dataset",
    "to_torchtune",
]
