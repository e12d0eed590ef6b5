"""Small helpers shared by several test modules (imported as ``from _helpers import ...``)."""

from __future__ import annotations

import numpy as np

from seqpack.data import IGNORE_INDEX


def trained_runs(labels: np.ndarray) -> list[list[int]]:
    """Target token ids of each contiguous run of trained label slots (labels != -100)."""
    pos = np.flatnonzero(labels != IGNORE_INDEX)
    runs: list[list[int]] = []
    prev = None
    for p in pos:
        if prev is None or p != prev + 1:
            runs.append([])
        runs[-1].append(int(labels[p]))
        prev = p
    return runs
