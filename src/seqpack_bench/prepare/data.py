"""The data sets of ``seqpack bench prepare``: the demo files of ``../shared/data`` and a synthetic chat set;
the two errors the command maps to exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

class PrepareOptionError(ValueError):
    """A setting of the benchmark leaves nothing to run or pack (the command line exits 2)."""


class PrepareDataError(ValueError):
    """A data file could not be read or prepared by seqpack or by the TRL path (the command line exits 1);
    the message names the file, the side and the cause."""



#: Files of ../shared/data used (text-only records that both seqpack and the TRL path can read).
SHARED_FILES = (
    "llama-factory/alpaca_en_demo.json",
    "llama-factory/identity.json",
    "llama-factory/glaive_toolcall_en_demo.json",
    "fastchat/dummy_conversation.json",
)

_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which have not "
    "model data token sequence pack training batch length loss gradient attention layer memory "
    "python function return value list dict string number error file line index record sample "
    "please explain how why what when where could would should write short long answer question "
    "first second third next finally example result output input system user assistant tool call "
    "search weather city price order time date name email account update delete create report"
).split()


#: Synthetic chats each program prepares once, untimed, before the timed runs.
WARMUP_RECORDS = 50


def write_synthetic_chat(path: str | os.PathLike, records: int, *, seed: int = 0) -> Path:
    """Write ``records`` synthetic OpenAI-format chats (JSONL ``{"messages": [...]}``) to ``path``.

    Mix (deterministic for ``seed``): 30 % have a system prompt; 1-3 user/assistant exchanges
    (weights 60/25/15 %); user turns ~lognormal(median 40 words), assistant turns ~lognormal(median
    120 words), each capped at 1,500 words; words from a fixed 120-word list plus numbers. With the
    Qwen3 tokenizer that is a median of about 250 tokens per record with a long tail.

    Raises:
        ValueError: ``records < 1``.
    """
    if records < 1:
        raise ValueError(f"records must be >= 1, got {records}")
    rng = np.random.default_rng(seed)
    words = np.array(_WORDS)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def text(median: float) -> str:
        n = int(min(1500, max(1, rng.lognormal(np.log(median), 0.9))))
        w = words[rng.integers(0, len(words), n)].tolist()
        for j in rng.integers(0, n, max(1, n // 25)):
            w[int(j)] = str(int(rng.integers(0, 10_000)))
        return " ".join(w).capitalize() + "."

    with open(path, "w") as f:
        for i in range(records):
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": text(15)})
            for _ in range(int(rng.choice([1, 2, 3], p=[0.6, 0.25, 0.15]))):
                msgs.append({"role": "user", "content": text(40)})
                msgs.append({"role": "assistant", "content": text(120)})
            f.write(json.dumps({"id": f"synthetic-{i}", "messages": msgs}) + "\n")
    return path


def real_datasets(shared_data: str | os.PathLike) -> list[Path]:
    """The files of :data:`SHARED_FILES` that exist under ``shared_data`` (``../shared/data``)."""
    root = Path(shared_data)
    return [root / f for f in SHARED_FILES if (root / f).is_file()]


def check_shared_data(shared_data: str | os.PathLike, *, option: str = "--shared-data") -> list[Path]:
    """Check a real-data folder the user named explicitly; return the files of it that will run.

    Args:
        shared_data: the folder (``../shared/data`` layout: ``llama-factory/...``, ``fastchat/...``).
        option: how the caller names the setting in messages.

    Returns:
        :func:`real_datasets` of the folder (at least one file).

    Raises:
        ValueError: the folder does not exist, is a file, or holds none of :data:`SHARED_FILES`
            (the message names ``option``, the path and the files looked for).
    """
    root = Path(shared_data)
    if not root.exists():
        raise ValueError(f"{option} {root}: folder not found; pass the folder that holds llama-factory/ and "
                         "fastchat/ (by default ../shared/data beside the source checkout), or leave the option out")
    if not root.is_dir():
        raise ValueError(f"{option} {root}: this is a file, not a folder; pass the folder that holds "
                         "llama-factory/ and fastchat/")
    found = real_datasets(root)
    if not found:
        raise ValueError(f"{option} {root}: none of the files this benchmark reads is there (looked for "
                         f"{', '.join(SHARED_FILES)}); pass the folder that holds them, or leave the option out")
    return found


# ------------------------------------------------------------------------------------------ TRL path


def table_name(dataset: str) -> str:
    """Data-set name for tables and charts: the file name (``llama-factory/alpaca_en_demo.json`` ->
    ``alpaca_en_demo.json``; the files of :data:`SHARED_FILES` have distinct names); other names as is."""
    return dataset.rsplit("/", 1)[-1] if dataset.endswith((".json", ".jsonl")) else dataset
