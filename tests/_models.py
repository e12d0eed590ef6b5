"""Inputs shared by the model-facing test modules (test_adapters, test_hf, test_moe).

Imported as ``from _models import ...`` (tests/ is on ``sys.path`` under pytest's rootdir layout,
as for ``_helpers``).
"""

from __future__ import annotations

import numpy as np

from seqpack.sample import Sample, shift_labels


def random_samples(lengths, *, vocab: int, seed: int = 0, prefix: str = "s") -> list[Sample]:
    """One fully trained :class:`Sample` per length: ids drawn uniformly in ``[1, vocab)`` (0 stays
    free for padding) with a seeded RNG, labels shifted inside the sample, ids ``f"{prefix}{i}"``."""
    rng = np.random.default_rng(seed)
    out = []
    for i, L in enumerate(lengths):
        ids = rng.integers(1, vocab, L)
        out.append(Sample(ids, shift_labels(ids, np.ones(L, bool)), sample_id=f"{prefix}{i}"))
    return out
