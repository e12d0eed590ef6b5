"""The bound of ``seqpack bench prepare``: the ``tokenizers`` library's own batch encoding
(``Tokenizer.encode_batch``) of the already-rendered texts, on as many threads as the compared programs
have processes.

The texts are rendered untimed in the parent, exactly as seqpack renders them (its chat template
rendering and record normalisation, every record that prepares), and written to a scratch file. A fresh
interpreter (``python -m seqpack_bench.prepare.bound``, environment ``RAYON_NUM_THREADS=<threads>``, so
the Rust thread pool has that size whatever this process did before) loads the same tokenizer from its
serialized JSON, encodes 64 texts untimed (thread-pool start), then times ``encode_batch`` of all texts
``repeats`` times and writes the median wall seconds to a JSON file. Nothing else (reading, rendering,
masks, packing, writing) is in the bound, so a program can only come near it, never beat it.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from seqpack.data.chat_template import TemplateMarkers, render_conversation
from seqpack.data.formats import normalize_record
from seqpack.data.sources import iter_records
from seqpack_bench._child import child_env, module_command

__all__ = ["measure_bound", "render_texts"]


def render_texts(path: str | os.PathLike, tokenizer: Any) -> list[str]:
    """Every record of ``path`` that seqpack renders, as the rendered chat text (untimed)."""
    markers = TemplateMarkers.probe(tokenizer)
    texts = []
    for raw in iter_records(path):
        try:
            texts.append(render_conversation(normalize_record(raw, None), tokenizer, markers)[0])
        except Exception:  # noqa: BLE001 - a record seqpack skips is not tokenized by it either
            continue
    return texts


def measure_bound(texts: list[str], tokenizer: Any, threads: int, work: str | os.PathLike, *, repeats: int = 1,
                  timeout_s: float = 3600) -> dict[str, Any]:
    """Median wall seconds of ``encode_batch(texts)`` on ``threads`` threads, in a fresh interpreter.

    Returns:
        ``{"wall_s", "walls_s", "tokens", "texts", "threads"}``.

    Raises:
        RuntimeError: the child failed (its stderr tail in the message).
    """
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    tfile, jfile, rfile = work / "bound_texts.pkl", work / "bound_tokenizer.json", work / "bound_result.json"
    tfile.write_bytes(pickle.dumps(texts, protocol=pickle.HIGHEST_PROTOCOL))
    jfile.write_text(tokenizer.backend_tokenizer.to_str())
    env = dict(child_env(), RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    cmd = module_command("seqpack_bench.prepare.bound", "--texts", str(tfile), "--tokenizer-json", str(jfile),
                         "--repeats", str(repeats), "--result", str(rfile))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"bound child failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    res = json.loads(rfile.read_text())
    return {**res, "threads": threads}


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", required=True)
    ap.add_argument("--tokenizer-json", required=True)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--result", required=True)
    a = ap.parse_args(argv)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer_json)
    texts = pickle.loads(Path(a.texts).read_bytes())
    tok.encode_batch(texts[:64], add_special_tokens=False)  # thread-pool start, untimed
    walls, tokens = [], 0
    for _ in range(max(1, a.repeats)):
        t0 = time.perf_counter()
        encs = tok.encode_batch(texts, add_special_tokens=False)
        walls.append(time.perf_counter() - t0)
        tokens = sum(len(e.ids) for e in encs)
        del encs
    Path(a.result).write_text(json.dumps({"wall_s": statistics.median(walls), "walls_s": walls, "tokens": tokens,
                                          "texts": len(texts)}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
