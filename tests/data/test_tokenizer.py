"""Loading tokenizers (seqpack.data.tokenizer): the error type, and unknown names failing fast offline
and with an unreachable hub."""

from __future__ import annotations

import logging
import time

import pytest

from seqpack.data import TokenizerError, load_tokenizer


def test_tokenizer_error_is_a_value_error():
    assert issubclass(TokenizerError, ValueError) and issubclass(TokenizerError, RuntimeError)


def test_unknown_tokenizer_offline_fails_fast(monkeypatch, capfd):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError) as ei:
        load_tokenizer("bogus/model")
    assert time.perf_counter() - t0 < 10
    msg = str(ei.value)
    assert "'bogus/model'" in msg and "HF_HUB_OFFLINE=1" in msg and "Fix: pass 'qwen3'" in msg
    assert "Traceback" not in capfd.readouterr().err


def test_unknown_tokenizer_unreachable_hub_fails_fast(monkeypatch, capfd):
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError, match=r"hub cannot be used \(127\.0\.0\.1:9 unreachable"):
        load_tokenizer("bogus/model")
    assert time.perf_counter() - t0 < 10
    err = capfd.readouterr().err
    assert "Retrying" not in err and "Traceback" not in err


def test_hub_tokenizer_cache_first_then_one_quiet_online_attempt(monkeypatch):
    from seqpack.data import tokenizer as tk

    calls = []
    seen_levels = []

    class FakeAuto:
        @staticmethod
        def from_pretrained(name, **kw):
            calls.append(kw.get("local_files_only", False))
            seen_levels.append(logging.getLogger("huggingface_hub").level)
            raise OSError("not found")

    monkeypatch.setattr(tk, "_offline", lambda: None)
    monkeypatch.setattr(tk, "_hub_unreachable", lambda endpoint: None)
    with pytest.raises(TokenizerError, match="could not load tokenizer 'org/name' from the hub"):
        tk._load_hub_tokenizer(FakeAuto, "org/name", {})
    assert calls == [True, False] and seen_levels == [logging.CRITICAL] * 2
    calls.clear()
    with pytest.raises(TokenizerError, match=r"cannot be used \(local_files_only=True\)"):
        tk._load_hub_tokenizer(FakeAuto, "org/name", {"local_files_only": True})
    assert calls == [True]
    with pytest.raises(TokenizerError, match="tokenizer folder './nope' does not exist"):
        load_tokenizer("./nope")


@pytest.mark.parametrize("bad, kind", [(5, "int"), (None, "NoneType"), ([1], "list")])
def test_a_wrong_tokenizer_type_is_refused_naming_the_type(tmp_path, bad, kind):
    from pathlib import Path

    from seqpack.data import prepare
    from seqpack.pipeline import pack_dataset

    want = ("tokenizer must be a name ('qwen3'), a tokenizer folder, or a loaded transformers tokenizer; "
            f"got {kind}")
    src = Path(__file__).resolve().parents[2] / "src/seqpack/resources/sample_chat.jsonl"
    with pytest.raises(TypeError) as e:
        prepare(src, bad, seq_length=128)
    assert str(e.value) == want
    with pytest.raises(TypeError) as e:
        pack_dataset([src], tmp_path / "o", tokenizer=bad, seq_length=128)
    assert str(e.value) == want
    assert not (tmp_path / "o").exists()  # refused before any output is written
