"""Collate speed and loss memory.

1. Time to build one training batch of 8 x 4096 tokens (goal <= 2 ms), median of repeats:
   - ``PackedCollator`` over 8 offline packs of T = 4096 (flattened into one [1, 32768] THD row),
   - ``InBatchPackingCollator`` packing the same samples at collate time,
   against baselines measured in the same run: ``PaddedCollator`` (right-padded [B, S]) and
   transformers' ``DataCollatorWithFlattening`` on the same samples.
2. Peak memory of the loss at T = 8192 with the Qwen3 vocabulary (151,936): naive
   ``F.cross_entropy(hidden @ W.T)`` forward+backward against ``seqpack.loss.chunked_cross_entropy``.
   Measured as the peak-RSS delta (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after the step minus
   after allocating inputs and weights) of a fresh subprocess per case, so nothing else in the process
   contributes. The naive case at T = 8192 needs ~15-20 GB; by default it is measured at T = 1024 and
   2048 and the T = 8192 figure is extrapolated linearly (its [T, V] tensors scale with T); pass
   ``--naive-8192`` to measure it directly on a machine with the memory.

Run: ``python -m seqpack_bench.bench_collate [--repeats 200] [--skip-memory] [--naive-8192]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from seqpack.packed import build_packed_sequence
from seqpack.sample import Sample
from seqpack_bench._argtypes import positive_int
from seqpack_bench._child import child_env, module_command
from seqpack_bench.timing import timed

VOCAB = 151_936


def _samples_for_rows(rows: int = 8, T: int = 4096, seed: int = 0):
    rng = np.random.default_rng(seed)
    packs = []
    for r in range(rows):
        lens, left = [], T
        while left > 0:
            L = int(min(left, max(16, rng.lognormal(5.8, 0.7))))
            L -= L % 8 if left - L >= 8 else 0
            L = max(1, min(L, left))
            lens.append(L)
            left -= L
        pack = []
        for i, L in enumerate(lens):
            ids = rng.integers(0, VOCAB, L).astype(np.int32)
            lab = np.r_[ids[1:], -100].astype(np.int32)
            pack.append(Sample(ids, lab, sample_id=f"r{r}s{i}"))
        packs.append(pack)
    return packs


def _time(fn, repeats):
    """Median wall milliseconds of ``repeats`` calls after 5 untimed ones."""
    return timed(fn, repeats, warmup=5)[1].wall_s * 1e3


def bench_collate(repeats: int) -> None:
    from transformers import DataCollatorWithFlattening

    from seqpack.collate import InBatchPackingCollator, PackedCollator, PaddedCollator

    packs = _samples_for_rows()
    rows = [build_packed_sequence(p, pad_token_id=0, seq_length=4096, pad_to_max_length=True) for p in packs]
    flat = [s for p in packs for s in p]
    n_tok = sum(s.length for s in flat)
    pc = PackedCollator()
    ib = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=1)
    ib8 = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8)
    pad = PaddedCollator(pad_token_id=0)
    hf_feats = [{"input_ids": s.input_ids.tolist(), "labels": s.labels.tolist()} for s in flat]
    hf = DataCollatorWithFlattening(return_tensors="pt")
    assert pc(rows)["input_ids"].shape == (1, 8 * 4096)
    res = {
        "PackedCollator (8 offline packs x 4096 -> [1, 32768])": _time(lambda: pc(rows), repeats),
        f"InBatchPackingCollator ({len(flat)} samples, {n_tok} tokens, multiple 1)": _time(lambda: ib(flat), repeats),
        f"InBatchPackingCollator ({len(flat)} samples, multiple 8)": _time(lambda: ib8(flat), repeats),
        f"baseline PaddedCollator ({len(flat)} samples -> [B, S])": _time(lambda: pad(flat), max(10, repeats // 10)),
        f"baseline HF DataCollatorWithFlattening ({len(flat)} samples)": _time(lambda: hf(hf_feats),
                                                                               max(10, repeats // 10)),
    }
    print(f"## collate: one batch of 8 x 4096 tokens (median of {repeats} repeats, goal <= 2 ms)")
    base = res[next(k for k in res if k.startswith("baseline HF"))]
    for k, v in res.items():
        print(f"{k:75s} {v:9.3f} ms   ({base / v:6.1f}x vs HF flattening)")


def memory_case(T: int, mode: str, H: int = 128, chunk: int = 1024) -> dict:
    """One loss case, run in a fresh process (:func:`_mem_case`): ``{"peak_delta": bytes, "seconds", "loss"}``.

    ``peak_delta`` = peak RSS after forward+backward minus peak RSS after allocating the inputs and weights.
    """
    import resource
    import time

    import torch
    import torch.nn.functional as F

    from seqpack.loss import chunked_cross_entropy

    torch.manual_seed(0)
    hidden = torch.randn(T, H, requires_grad=True)
    weight = (torch.randn(VOCAB, H) * 0.02).requires_grad_()
    labels = torch.randint(0, VOCAB, (T,))

    def rss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    base = rss()
    t0 = time.perf_counter()
    if mode == "naive":
        loss = F.cross_entropy((hidden @ weight.t()).float(), labels, reduction="sum")
    else:
        loss, _ = chunked_cross_entropy(hidden, weight, labels, chunk_size=chunk)
    loss.backward()
    return {"peak_delta": rss() - base, "seconds": time.perf_counter() - t0, "loss": float(loss)}


def _mem_case(T, mode, H=128, chunk=1024):
    """:func:`memory_case` in a fresh ``python -m seqpack_bench.bench_collate --memory-case ...`` process (so
    nothing else in the process contributes); its figures come back in a JSON file."""
    with tempfile.TemporaryDirectory(prefix="seqpack-bench-collate-") as tmp:
        result = Path(tmp) / "case.json"
        cmd = module_command("seqpack_bench.bench_collate", "--memory-case", str(T), mode, "--hidden", str(H),
                             "--chunk", str(chunk), "--result", str(result))
        subprocess.run(cmd, capture_output=True, text=True, check=True, env=child_env())
        return json.loads(result.read_text())


def bench_memory(naive_8192: bool) -> None:
    H = 128
    print(f"\n## loss peak memory, V = {VOCAB}, H = {H}, fp32 forward+backward "
          "(peak-RSS delta of a fresh subprocess)")
    naive = {}
    for T in ([1024, 2048, 8192] if naive_8192 else [1024, 2048]):
        r = _mem_case(T, "naive", H)
        naive[T] = r["peak_delta"]
        print(f"naive   T={T:5d}: {r['peak_delta'] / 2**30:7.2f} GiB  ({r['seconds']:.1f} s)")
    if 8192 not in naive:
        slope = (naive[2048] - naive[1024]) / 1024
        naive[8192] = naive[2048] + slope * (8192 - 2048)
        print(f"naive   T= 8192: {naive[8192] / 2**30:7.2f} GiB  (linear extrapolation from T=1024/2048; "
              f"one [T, V] fp32 tensor alone = {8192 * VOCAB * 4 / 2**30:.2f} GiB)")
    for chunk in (1024, 256):
        r = _mem_case(8192, "chunked", H, chunk)
        print(f"chunked T= 8192, chunk {chunk:4d}: {r['peak_delta'] / 2**30:7.2f} GiB  ({r['seconds']:.1f} s)  "
              f"-> {naive[8192] / max(r['peak_delta'], 1):.1f}x less than naive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive_int, default=200,
                    help="timed collate calls, median reported (>= 1, default 200; "
                         "baselines use max(10, repeats // 10))")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--naive-8192", action="store_true", help="measure the naive loss at T=8192 (~15-20 GB)")
    # the child process of _mem_case: one memory case, figures written to --result
    ap.add_argument("--memory-case", nargs=2, metavar=("T", "MODE"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--hidden", type=positive_int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--chunk", type=positive_int, default=1024, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.memory_case:
        res = memory_case(int(a.memory_case[0]), a.memory_case[1], a.hidden, a.chunk)
        Path(a.result).write_text(json.dumps(res))
        return
    bench_collate(a.repeats)
    if not a.skip_memory:
        bench_memory(a.naive_8192)


if __name__ == "__main__":
    main()
