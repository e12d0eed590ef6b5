"""``seqpack bench stream``: run the streaming-packer benchmark and record what it printed.

The benchmark itself is ``benchmarks/bench_stream.py`` (owned by the streaming module; it measures
``StreamingPacker`` throughput, efficiency vs offline packing and state size). This wrapper runs it
in a child process with the same interpreter, relays its output live, and writes ``stream.json``
(command, exit code, wall seconds, the full output, and every line carrying PASS/MISS verdicts as a
goal: ``pass`` is False when the line has any MISS).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from seqpack.bench.timing import write_json

__all__ = ["default_script", "run_stream"]


def default_script() -> Path:
    """``benchmarks/bench_stream.py`` of this source checkout (not shipped in the wheel)."""
    return Path(__file__).resolve().parents[3] / "benchmarks" / "bench_stream.py"


def run_stream(*, quick: bool = False, script: str | os.PathLike | None = None,
               out_dir: str | os.PathLike = "bench_results", echo: bool = True) -> dict[str, Any]:
    """Run ``bench_stream.py`` (``--quick`` when asked) and write ``stream.json``.

    Returns:
        payload with ``benchmark``, ``command``, ``returncode``, ``wall_s``, ``output``, ``goals``
        (``{"goal", "pass"}`` per PASS/MISS line).

    Raises:
        FileNotFoundError: the script does not exist (it ships in the source tree only).
    """
    path = Path(script) if script else default_script()
    if not path.is_file():
        raise FileNotFoundError(f"streaming benchmark not found at {path}; pass script=PATH (it ships in the "
                                "source tree, not in the wheel)")
    cmd = [sys.executable, str(path)] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    rc = proc.wait()
    output = "".join(lines)
    goals = []
    for line in lines:  # "PASS  <goal>" lines, or any line carrying PASS/MISS verdicts ("goal: ...: PASS; ...")
        s = line.strip()
        tags = re.findall(r"\b(PASS|MISS)\b", s)
        if not tags:
            continue
        text = s[4:].strip() if s.startswith(("PASS", "MISS")) else s
        goals.append({"goal": text, "pass": "MISS" not in tags})
    payload = {"benchmark": "stream", "command": " ".join(cmd), "returncode": rc,
               "wall_s": round(time.perf_counter() - t0, 3), "output": output, "goals": goals}
    write_json(Path(out_dir) / "stream.json", payload)
    return payload
