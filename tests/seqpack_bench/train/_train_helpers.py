"""Helpers of the seqpack_bench.train tests (tiny sizes, the app with its plugins, one-line errors)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[3]
GPU = REPO / "src" / "seqpack_bench" / "gpu"  # run.sh and bench_gpu.py
TINY = dict(hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, progress=False)


def _app():
    from seqpack.cli.app import app

    return app


CLI_TINY = ["--hidden-size", "32", "--intermediate-size", "64", "--num-layers", "1", "--no-progress"]


def _invoke(args):
    r = CliRunner().invoke(_app(), ["train", *args])
    assert "Traceback" not in r.output, r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def _one_line(r):
    # the error is one line (rich may soft-wrap nothing: soft_wrap=True in fail()) and the last output: a library
    # message with embedded line breaks would leave continuation lines after it
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    errors = [k for k, ln in enumerate(lines) if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0] == len(lines) - 1, r.output
    return lines[-1]


def _chat_file(path, n, *, answer_words=3):
    path.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": f"question {i} " * (i % 5 + 1)},
        {"role": "assistant", "content": f"answer {i} " * (i % 7 + answer_words)}]}) for i in range(n)) + "\n")
    return path


def _forbid_work(monkeypatch):
    import seqpack_bench.train as train_mod

    def boom(*a, **k):
        raise AssertionError("work started before the option check")

    monkeypatch.setattr(train_mod, "prepare_data", boom)
    monkeypatch.setattr(train_mod, "run_training", boom)


def _bench_gpu():
    import importlib

    return importlib.import_module("seqpack_bench.gpu.bench_gpu")
