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


def llava_record(image, user: str = "<image>What is this?", answer: str = "A red square.") -> dict:
    """A LLaVA-style record (``conversations`` human/gpt turns) with ``image`` set unless it is None."""
    r = {"conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": answer}]}
    if image is not None:
        r["image"] = image
    return r
