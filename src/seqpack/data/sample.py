"""``Sample`` and the prepare step's accounting, under their data-pipeline import path.

The definitions live in :mod:`seqpack.sample` (``Sample``, ``IGNORE_INDEX``, ``shift_labels``, the label
conventions) and :mod:`seqpack.accounting` (``SampleRecord``, ``PrepareReport``); import them from there.
"""

from seqpack.accounting import PrepareReport, SampleRecord
from seqpack.sample import IGNORE_INDEX, Sample, shift_labels

__all__ = ["IGNORE_INDEX", "Sample", "shift_labels", "SampleRecord", "PrepareReport"]
