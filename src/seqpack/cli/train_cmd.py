"""`seqpack train`: the reference loop (padded | packed | in_batch | streaming) on the same samples
(OWNER: bench helper). See :mod:`seqpack.train`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from seqpack.cli.app import app, fail as _fail


@app.command("train")
def train(
    mode: str = typer.Option("all", help="all, or a comma list of padded, packed, in_batch, streaming "
                                         "(padded is added as the reference of packed/in_batch; streaming is "
                                         "compared with its own padded twin, padded_stream)."),
    data: Optional[List[Path]] = typer.Option(None, "--data",
                                              help="Chat data files or quoted globs such as 'data/*.jsonl' (default: "
                                                   "../shared/data alpaca demo, else the embedded sample). Records "
                                                   "with images are trained as text (images ignored, with a warning)."),
    steps: int = typer.Option(100, min=1, help="Optimizer steps per mode (one pack of samples per step; fewer, "
                                               "with a message, when the data gives fewer packs)."),
    seq_length: int = typer.Option(512, "--seq-length", min=2, help="Pack capacity in tokens."),
    model: str = typer.Option("tiny-qwen3", help="tiny-qwen3 | tiny-llama | a local model folder."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer for --data (default: qwen3 for tiny models, "
                                                      "else the model folder)."),
    hidden_size: int = typer.Option(128, "--hidden-size", min=8),
    num_layers: int = typer.Option(2, "--num-layers", min=1),
    intermediate_size: int = typer.Option(512, "--intermediate-size", min=8),
    attn: str = typer.Option("sdpa", help="Attention implementation: sdpa | eager | flash_attention_2 "
                                          "(CUDA + flash-attn)."),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N (cuda needs a CUDA build of torch)."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16."),
    lr: float = typer.Option(1e-3, help="AdamW learning rate (> 0)."),
    seed: int = typer.Option(0),
    algorithm: str = typer.Option("first_fit_shuffle",
                                  help="Packing algorithm of the step plan (first_fit_shuffle: packs hold random "
                                       "samples, so the padded baseline sees ordinary random batches)."),
    warmup_steps: int = typer.Option(2, "--warmup-steps", min=0, help="Steps left out of the throughput."),
    tolerance: float = typer.Option(1e-3, min=0.0,
                                    help="Max |loss delta| vs padded (nats, token mean, >= 0). A loss check that "
                                         "fails makes the command exit 1."),
    threads: int = typer.Option(1, "--threads", min=0,
                                help="torch CPU threads; 0 = torch's default. 1 (default) gives steady timings on a "
                                     "shared CPU box (no OpenMP threads waiting on each other)."),
    no_progress: bool = typer.Option(False, "--no-progress"),
    out: Path = typer.Option(Path("bench_results"), "--out", help="Folder for train.json and PNGs (created and "
                                                                   "checked before any work)."),
) -> None:
    """Train one model per mode on the same samples; print loss agreement and speed-up vs padded.

    Exit status: 0 when every loss-agreement check passes (PASS lines "loss curve = ..."), 1 when one
    fails (a correctness failure: packing changed what the model learns) or on a data error, 2 on a
    bad option. The speed verdicts ("speed-up >= 90% of ideal") are informational: step times on a
    shared machine are noisy, so a MISS there does not change the exit status, and with fewer than 3
    timed steps (after --warmup-steps) no speed verdict is given.
    """
    from seqpack.train import (CLI_OPTION_NAMES, MODES, TrainConfig, check_out_dir, check_runtime, expand_data_paths,
                               prepare_data, run_training)

    names = CLI_OPTION_NAMES
    if mode.strip() == "all":
        modes = list(MODES)
    else:
        modes = [m.strip() for m in mode.split(",") if m.strip()]
        if not modes:
            _fail(f"--mode is empty ({mode!r}); use 'all' or a comma list of {', '.join(MODES)}")
        bad = [m for m in modes if m not in MODES]
        if bad:
            _fail(f"--mode {mode!r}: unknown mode(s) {', '.join(bad)}; use 'all' or a comma list of {', '.join(MODES)}")
    if dtype not in ("float32", "bfloat16"):
        _fail(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    try:
        cfg = TrainConfig(modes=modes, steps=steps, seq_length=seq_length, model=model, hidden_size=hidden_size,
                          num_layers=num_layers, intermediate_size=intermediate_size, attn_implementation=attn,
                          device=device, dtype=dtype, lr=lr, seed=seed, algorithm=algorithm,
                          warmup_steps=warmup_steps, loss_tolerance=tolerance, out_dir=str(out),
                          num_threads=threads or None, progress=not no_progress, tokenizer=tokenizer)
        cfg.validate(names)
        check_out_dir(out, option_names=names)  # before any work: an unwritable --out fails now, not after the run
        check_runtime(cfg, option_names=names)  # --model, --device, --attn on this machine
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    samples, pad_id = None, 0
    if data:
        try:
            files = expand_data_paths(data, option_names=names)
            samples, pad_id, _ = prepare_data([str(p) for p in files], cfg, option_names=names)
        except (ValueError, OSError) as exc:  # DataFormatError / TokenizerError are ValueErrors with file + line
            msg = str(exc)
            _fail(msg if msg.startswith(("--", "no samples")) else f"--data: {msg}", 1)
    try:
        res = run_training(samples, cfg, pad_token_id=pad_id, option_names=names)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc), 1)
    print(f"wrote {out / 'train.json'}")
    failed = [g for g in res["goals"] if g.get("kind") == "loss" and g.get("pass") is False]
    if failed:
        _fail(f"{len(failed)} loss-agreement check(s) failed (a correctness failure, not a speed one): "
              + "; ".join(f"{g['goal']}: {g['info']}" for g in failed), 1)
