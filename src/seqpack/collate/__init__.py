"""The torch data path: datasets and collators that turn samples or packs into training batches.

All top-level and picklable (``DataLoader(num_workers>0)`` works), all usable as the ``data_collator``
of ``transformers.Trainer``; every packed row is built by :mod:`seqpack.packed.build` and its attention
inputs by :mod:`seqpack.packed.masks`. Formats and tail layouts: ``docs/notes/collate.md``.

- :class:`PackedRowsDataset` (``dataset.py``) -- map-style dataset over a packed directory or rows.
- :class:`PaddedCollator` (``padded.py``) -- the unpacked baseline, right-padded ``[B, S]``.
- :class:`PackedCollator` (``packed.py``) -- offline packs -> one THD row (offset boundaries).
- :class:`InBatchPackingCollator` (``in_batch.py``) -- a micro-batch of samples packed at collate time.
- :func:`to_hf_inputs` -- a THD batch -> an HF causal LM's forward kwargs (:mod:`seqpack.adapters`).
"""

from seqpack.adapters import MEDIA_KEYS, to_hf_inputs
from seqpack.collate.dataset import PackedRowsDataset
from seqpack.collate.in_batch import InBatchPackingCollator
from seqpack.collate.output import FORMATS, HF_ATTN
from seqpack.collate.packed import PackedCollator
from seqpack.collate.padded import PaddedCollator

__all__ = [
    "FORMATS",
    "HF_ATTN",
    "MEDIA_KEYS",
    "PackedRowsDataset",
    "PaddedCollator",
    "PackedCollator",
    "InBatchPackingCollator",
    "to_hf_inputs",
]
