"""Padded vs packed training of a 0.61B-parameter Qwen3-like model on one GPU (run through ``run.sh``, or
``python -m seqpack_bench.gpu.bench_gpu``).

Model: ``Qwen3Config`` built in code (hidden 1024, 24 layers, 16 heads / 8 KV heads, head_dim 64,
MLP 3072, vocabulary 151,936, untied: 613,208,064 parameters, counted from this config on torch's meta
device: 311.2 M in the embedding + LM head, 302.0 M in the layers; ``gpu.json`` records the count
under ``model.parameters``), random init, fp32 master weights with
bf16 autocast (``--pure-bf16``: bf16 weights). Data: random-token samples with a seed-like SFT length
mix (lognormal, median 250 tokens, sigma 1, 2..2048 tokens, first 30 % of each sample untrained).
Steps: ``seqpack_bench.train.run_training`` with modes ``padded`` and ``packed`` on the same samples per
step (one pack of capacity 4096 per step), interleaved, ``--steps`` steps (default 100). The step plan is
``first_fit_shuffle`` (``TrainConfig`` default), so each padded step is an ordinary random batch of
about 10 samples. Prediction from the plan alone (CPU, no model): the first 100 steps hold 408,594 real
tokens and 1.22 M padded slots, an ideal ratio of about 2.98x (random batches of 10: 3.07x; a
length-sorted plan such as ``balanced_best_fit`` would give only 1.11x), so the >= 2x goal needs about
67 % of the ideal.
Attention: ``flash_attention_2`` (varlen, ``cu_seq_lens``) when ``flash_attn`` imports, else ``sdpa``
with seqpack's packed path (4-D block-diagonal mask).

Prints: median step time, real tokens/s per mode, the speed-up (padded time / packed time), the
ideal ratio (padded slots / real tokens), and the loss delta (step 1 = same weights, and max over all
steps). Goals: speed-up >= 2x and max loss delta < 1e-3. ``--dry-run``: tiny config on CPU, fp32,
sdpa, 3 steps (checks the script end to end without a GPU); there the speed line reads "n/a on CPU dry
run" and ``goals.speedup_ge_2x`` is ``null`` (the 2x goal is for the GPU run; the loss goal is checked).
A dry run always uses sdpa: an ``--attn`` other than auto / sdpa is noted and not used, and ``gpu.json``
records both (``attn_requested``, ``attn_implementation``). Warm-up: the first step of a dry run and
the first 3 steps of a GPU run are left out of the throughput (no option); fewer than 3 timed steps
give no speed verdict (raise ``--steps``).

Files written to ``--out`` (each printed as ``wrote <path>`` at the end): ``gpu.json`` (this summary),
and from ``seqpack_bench.train.run_training``: ``train.json`` (per-step losses and times of both modes),
``train_loss.png``, ``train_throughput.png``.

Exit status: 0 after a run (the goal lines are the verdict), 2 on a bad option (``--steps`` and
``--seq-length`` must be >= 1 and >= 2, ``--out`` must be a writable folder, checked before any work)
or a device / attention this machine cannot run, 3 with no CUDA device outside ``--dry-run``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from seqpack_bench._argtypes import int_at_least
from seqpack_bench.timing import OutputDirError, ensure_out_dir  # stdlib only: checked before torch loads
from seqpack_bench.train import TrainConfig, one_line, run_training, synthetic_samples, tiny_config


#: the GPU model (hidden, layers, heads, KV heads, MLP); vocabulary 151,936, untied: 613,208,064 parameters.
GPU_MODEL = dict(hidden_size=1024, num_layers=24, intermediate_size=3072, num_heads=16, num_kv_heads=8)
#: how run_training's messages name its settings here: only what this script has an option for (so a fix
#: never advises an option this script lacks, such as a warm-up option).
BENCH_OPTION_NAMES = {"steps": "--steps", "seq_length": "--seq-length", "attn_implementation": "--attn",
                      "out_dir": "--out"}


def count_parameters(size: dict, vocab: int) -> int:
    """Parameters of the tiny Qwen3 config of ``size`` + ``vocab`` (built on the meta device: no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    conf = tiny_config("qwen3", vocab_size=vocab, **size)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf)
    return int(sum(p.numel() for p in model.parameters()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="tiny config on CPU, few steps, always sdpa")
    ap.add_argument("--steps", type=int_at_least(1), default=None, help="steps per mode, >= 1 (default 100; dry run 3)")
    ap.add_argument("--attn", default="auto", choices=("auto", "flash_attention_2", "sdpa", "eager"),
                    help="auto (flash_attention_2 when flash_attn imports, else sdpa) | flash_attention_2 | sdpa | "
                         "eager; GPU run only (--dry-run always uses sdpa, with a note)")
    ap.add_argument("--seq-length", type=int_at_least(2), default=None,
                    help="pack capacity in tokens, >= 2 (default 4096; dry run 256)")
    ap.add_argument("--pure-bf16", action="store_true", help="bf16 weights instead of fp32 + bf16 autocast")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_results",
                    help="folder for gpu.json + PNGs (created and checked before any work)")
    args = ap.parse_args(argv)
    try:
        ensure_out_dir(args.out, option="--out")
    except OutputDirError as exc:
        ap.error(str(exc))

    import torch

    t_start = time.perf_counter()
    if args.dry_run:
        device, attn = "cpu", "sdpa"
        if args.attn not in ("auto", "sdpa"):
            print(f"note: --attn {args.attn} is not used: the dry run always uses sdpa on CPU (the GPU run uses "
                  f"--attn); gpu.json records attn_requested = {args.attn}")
        steps = 3 if args.steps is None else args.steps
        seq = 256 if args.seq_length is None else args.seq_length
        size = dict(hidden_size=64, num_layers=2, intermediate_size=128, num_heads=4, num_kv_heads=2)
        vocab, max_len, n, median = 1024, 128, 200, 40.0
        dtype, autocast = "float32", None
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --dry-run on CPU")
            return 3
        device = "cuda"
        attn = args.attn
        if attn == "auto":
            try:
                import flash_attn  # noqa: F401

                attn = "flash_attention_2"
            except Exception:  # noqa: BLE001 - fall back to sdpa
                attn = "sdpa"
        steps = 100 if args.steps is None else args.steps
        seq = 4096 if args.seq_length is None else args.seq_length
        size = dict(GPU_MODEL)
        vocab, max_len, median = 151_936, 2048, 250.0
        n = int(steps * seq / 300) + 200  # mean length ~ 390 tokens at this mix: enough packs for `steps`
        dtype, autocast = ("bfloat16", None) if args.pure_bf16 else ("float32", "bfloat16")
    # no sample longer than the capacity (a --seq-length below the length mix's cap trims the longest)
    samples = synthetic_samples(n, vocab_size=vocab, seed=0, max_length=min(max_len, seq), median=median)
    cfg = TrainConfig(modes=("padded", "packed"), steps=steps, seq_length=seq, model="tiny-qwen3",
                      attn_implementation=attn, device=device, dtype=dtype, autocast_dtype=autocast,
                      compact_vocab=False, vocab_size=vocab, lr=1e-4, warmup_steps=1 if args.dry_run else 3,
                      out_dir=args.out, progress=False, **size)
    written = []  # run_training's "wrote <path>" lines, printed at the end with gpu.json

    def log(line: str) -> None:
        if line.startswith("wrote "):
            written.append(line)
        else:
            print(line)

    try:
        res = run_training(samples, cfg, pad_token_id=0, log=log, option_names=BENCH_OPTION_NAMES)
    except ValueError as exc:  # a device / attention this machine cannot run: one line, no traceback
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    pd, pk = res["modes"]["padded"], res["modes"]["packed"]
    steps = res["data"]["steps"]  # steps actually run (fewer when the samples fill fewer packs)
    w = min(cfg.warmup_steps, max(0, steps - 1))
    med = {k: statistics.median(v["step_time_s"][w:] or v["step_time_s"]) for k, v in (("padded", pd), ("packed", pk))}
    summary = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
        "attn_requested": args.attn, "attn_implementation": attn, "dtype": dtype, "autocast": autocast, "steps": steps, "seq_length": seq,
        "model": size | {"vocab_size": vocab, "parameters": count_parameters(size, vocab)},
        "median_step_s": med,
        "real_tokens_per_s": {"padded": pd["real_tokens_per_s"], "packed": pk["real_tokens_per_s"]},
        "speedup": pk["speedup_vs_reference"], "ideal_ratio": pk["ideal_ratio"],
        "loss_delta_step1": pk["loss_delta_step1"], "max_loss_delta": pk["max_abs_loss_delta"],
        "wall_s": time.perf_counter() - t_start,
    }
    # the 2x goal is for the GPU run: a CPU dry run checks the script end to end, not the speed
    summary["goals"] = {"speedup_ge_2x": None if args.dry_run else bool(summary["speedup"] >= 2.0),
                        "max_loss_delta_lt_1e-3": bool(summary["max_loss_delta"] < 1e-3)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"device {summary['device']}, attn {attn}, {dtype}{' + autocast ' + autocast if autocast else ''}, "
          f"{steps} steps, capacity {seq}, model {summary['model']['parameters']:,} parameters")
    print(f"median step time: padded {med['padded']:.4f} s, packed {med['packed']:.4f} s")
    print(f"real tokens/s: padded {pd['real_tokens_per_s']:.0f}, packed {pk['real_tokens_per_s']:.0f}")
    print(f"speed-up packed/padded: {summary['speedup']:.2f}x (ideal {summary['ideal_ratio']:.2f}x)")
    print(f"loss delta: step 1 {summary['loss_delta_step1']:.2e}, max over {steps} steps {summary['max_loss_delta']:.2e}")
    speed_goal = summary["goals"]["speedup_ge_2x"]
    if speed_goal is None:
        print("n/a   speed-up >= 2x: n/a on CPU dry run (the 2x goal is for the GPU run)")
    else:
        print(f"{'PASS' if speed_goal else 'MISS'}  speed-up >= 2x")
    print(f"{'PASS' if summary['goals']['max_loss_delta_lt_1e-3'] else 'MISS'}  max loss delta < 1e-3")
    for line in written:
        print(line)
    print(f"wrote {Path(args.out) / 'gpu.json'} ({summary['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
