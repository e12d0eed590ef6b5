"""Every fenced snippet of README.md and docs/guide.md, run as written.

A section (a Markdown heading and the text up to the next heading) is one case: its ``python`` and
``bash`` blocks run in order in one temporary working directory and one Python namespace, as a reader
following along would run them. The directory holds ``data/chat.jsonl`` (a copy of the bundled demo
chats, ``seqpack.pipeline.sample_data_path()``) and ``data/chats-0.jsonl`` / ``data/chats-1.jsonl`` (its
two halves), which the snippets read. A ``bash`` line that ``.ci/run`` runs verbatim (the install and test
commands) is checked against ``.ci/run`` instead of being run here. Blocks of any other language
(``text``: the layout tree) are not code.

A snippet that trains (a ``Trainer(...)`` call, or ``packed_forward(model, ...)``) must also train: a
finite loss; on a model built by an earlier snippet, at most 10 lines and every parameter but at most one
changed; on a model it builds itself, every parameter but at most one has a gradient.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import seqpack
from seqpack.pipeline import sample_data_path

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/guide.md")
CI_LINES = {ln.strip() for ln in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()}
FENCE = re.compile(r"^```(\w*)\s*$")


def _sections(relpath: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(heading, [(language, code), ...]), ...]`` for the sections of ``relpath`` that hold code."""
    out: list[tuple[str, list[tuple[str, str]]]] = []
    heading, blocks, lang, code = "(top)", [], None, []
    for line in (REPO / relpath).read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if lang is None and m:
            lang, code = m.group(1), []
        elif lang is not None and line.strip() == "```":
            blocks.append((lang, "\n".join(code) + "\n"))
            lang = None
        elif lang is not None:
            code.append(line)
        elif line.startswith("#"):
            if any(b[0] in ("python", "bash") for b in blocks):
                out.append((heading, blocks))
            heading, blocks = line.lstrip("#").strip(), []
    assert lang is None, f"{relpath}: unclosed code fence"
    if any(b[0] in ("python", "bash") for b in blocks):
        out.append((heading, blocks))
    return out


CASES = [pytest.param(doc, heading, blocks, id=f"{doc}:{heading}",
                      marks=[pytest.mark.slow] if any("--engine ray" in c for _, c in blocks) else [])
         for doc in DOCS for heading, blocks in _sections(doc)]


def test_every_doc_has_snippets():
    assert {c.values[0] for c in CASES} == set(DOCS)
    for doc in DOCS:  # no code block without a language: it would be neither run nor marked as text
        fences = [FENCE.match(ln) for ln in (REPO / doc).read_text(encoding="utf-8").splitlines()]
        opening = [m.group(1) for m in fences if m][::2]
        assert all(opening), f"{doc}: a code block without a language"


def _commands(code: str) -> list[str]:
    """The logical lines of a bash block (continuations joined, comments and blank lines dropped)."""
    lines = code.replace("\\\n", " ").splitlines()
    return [c for c in (re.sub(r"\s+#.*$", "", ln).strip() for ln in lines) if c and not c.startswith("#")]


def _run_bash(code: str, cwd: Path) -> None:
    todo = []
    for cmd in _commands(code):
        if cmd in CI_LINES:
            continue  # .ci/run runs this exact line (install / test command)
        assert not cmd.startswith(("pip ", "python -m pytest")), f"{cmd!r}: not in .ci/run, so never run"
        todo.append(cmd)
    if not todo:
        return
    src = os.path.dirname(os.path.dirname(seqpack.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(todo)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{todo}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"


def _trains(code: str) -> bool:
    return "Trainer(" in code or "packed_forward(model" in code


def _check_trained(code: str, ns: dict, before: dict | None) -> None:
    import torch

    params = dict(ns["model"].named_parameters())
    if before is not None:
        assert len(code.strip().splitlines()) <= 10, "a training snippet stays within 10 lines"
        changed = sum(not torch.equal(before[n], p) for n, p in params.items())
        assert changed >= len(before) - 1
    else:
        assert sum(p.grad is not None for p in params.values()) >= len(params) - 1
    if "Trainer(" in code:
        assert math.isfinite(ns["result"].training_loss) and ns["result"].global_step == 2
    else:
        assert math.isfinite(ns["loss"].item())


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    text = sample_data_path().read_text(encoding="utf-8")
    (tmp_path / "data" / "chat.jsonl").write_text(text, encoding="utf-8")
    lines = text.splitlines(keepends=True)
    half = len(lines) // 2
    (tmp_path / "data" / "chats-0.jsonl").write_text("".join(lines[:half]), encoding="utf-8")
    (tmp_path / "data" / "chats-1.jsonl").write_text("".join(lines[half:]), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("doc,heading,blocks", CASES)
def test_doc_snippets_run_as_written(doc, heading, blocks, workdir):
    if any("--engine ray" in c for _, c in blocks):
        pytest.importorskip("ray")
    ns: dict = {"__name__": "__doc_snippet__"}
    for lang, code in blocks:
        if lang == "bash":
            _run_bash(code, workdir)
        elif lang == "python":
            model = ns.get("model")
            before = ({n: p.detach().clone() for n, p in model.named_parameters()}
                      if model is not None and _trains(code) else None)
            exec(compile(code, f"{doc} ({heading})", "exec"), ns)
            if _trains(code):
                _check_trained(code, ns, before)
