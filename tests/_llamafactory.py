"""Import the real LLaMA-Factory (0.9.5, installed --no-deps by .ci/run) for the tests.

``llamafactory.data`` imports ``torchaudio`` at module level (``mm_plugin.py``) and PyPI has no torchaudio
wheel for torch 2.13, so an empty ``torchaudio`` module stands in while llamafactory is imported; the code
the tests run (dataset_info parser, format converters, the SFT collator on text rows) never calls it.
transformers' torchaudio probe is evaluated (and cached, False) before the stand-in exists, and the
stand-in is removed from ``sys.modules`` afterwards.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import pytest


def llamafactory_data():
    """``llamafactory.data`` (parser, converter, collator modules imported), or skip when absent."""
    if importlib.util.find_spec("llamafactory") is None:
        pytest.skip("llamafactory not installed (.ci/run installs llamafactory==0.9.5 --no-deps)")
    pytest.importorskip("peft", reason="llamafactory.data imports peft (.ci/run installs peft==0.20.0 --no-deps)")
    from transformers.utils import import_utils

    import_utils.is_torchaudio_available()  # cached before the stand-in exists
    stub = importlib.util.find_spec("torchaudio") is None
    if stub:
        m = types.ModuleType("torchaudio")
        m.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        sys.modules["torchaudio"] = m
    try:
        import llamafactory.data.collator
        import llamafactory.data.converter
        import llamafactory.data.parser
    finally:
        if stub:
            sys.modules.pop("torchaudio", None)
    return llamafactory.data
