"""Synthetic inputs shared by the streaming tests (imported as ``from _stream_data import ...``)."""

from __future__ import annotations

import numpy as np

from seqpack.sample import IGNORE_INDEX, Sample


def lognormal_lengths(n, cap, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.5, 0.9, n).astype(np.int64), 1, cap)


def keys_of(packs):
    return [int(k) for p in packs for k in p]


def make_samples(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = rng.integers(1, 1000, int(n)).astype(np.int32)
        labels = np.full(int(n), IGNORE_INDEX, np.int32)
        labels[:-1] = ids[1:]
        out.append(Sample(ids, labels, sample_id=f"s{i}", source="synthetic", index=i))
    return out
