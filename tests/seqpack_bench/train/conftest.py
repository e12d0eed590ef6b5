"""Fixtures of the seqpack_bench.train tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_training(monkeypatch):
    """Replace seqpack_bench.train.run_training (the CLI looks it up on the package at call time); records its calls."""
    import seqpack_bench.train as train_mod

    calls = []
    goals = []

    def fake(samples, cfg, **kw):
        calls.append((samples, cfg, kw))
        return {"goals": list(goals)}

    monkeypatch.setattr(train_mod, "run_training", fake)
    return calls, goals
