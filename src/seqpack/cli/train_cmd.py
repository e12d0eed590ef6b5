"""`seqpack train`: the reference loop (padded | packed | in_batch | streaming) on the same samples
(OWNER: bench helper). See :mod:`seqpack.train`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from seqpack.cli.app import app, fail as _fail

from seqpack.cli.app import err_console as _err  # noqa: E402




@app.command("train")
def train(
    mode: str = typer.Option("all", help="all, or a comma list of padded, packed, in_batch, streaming."),
    data: Optional[List[Path]] = typer.Option(None, "--data",
                                              help="Chat data files (default: ../shared/data alpaca demo, else the "
                                                   "embedded sample)."),
    steps: int = typer.Option(100, min=1, help="Optimizer steps per mode (one pack of samples per step)."),
    seq_length: int = typer.Option(512, "--seq-length", min=2, help="Pack capacity in tokens."),
    model: str = typer.Option("tiny-qwen3", help="tiny-qwen3 | tiny-llama | a local model folder."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer for --data (default: qwen3 for tiny models, "
                                                      "else the model folder)."),
    hidden_size: int = typer.Option(128, "--hidden-size", min=8),
    num_layers: int = typer.Option(2, "--num-layers", min=1),
    intermediate_size: int = typer.Option(512, "--intermediate-size", min=8),
    attn: str = typer.Option("sdpa", help="Attention implementation: sdpa | eager | flash_attention_2."),
    device: str = typer.Option("cpu"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16."),
    lr: float = typer.Option(1e-3),
    seed: int = typer.Option(0),
    algorithm: str = typer.Option("first_fit_shuffle",
                                  help="Packing algorithm of the step plan (first_fit_shuffle: packs hold random "
                                       "samples, so the padded baseline sees ordinary random batches)."),
    warmup_steps: int = typer.Option(2, "--warmup-steps", min=0, help="Steps left out of the throughput."),
    tolerance: float = typer.Option(1e-3, help="Max |loss delta| vs padded (nats, token mean)."),
    threads: int = typer.Option(1, "--threads", min=0,
                                help="torch CPU threads; 0 = torch's default. 1 (default) gives steady timings on a "
                                     "shared CPU box (no OpenMP threads waiting on each other)."),
    no_progress: bool = typer.Option(False, "--no-progress"),
    out: Path = typer.Option(Path("bench_results"), "--out", help="Folder for train.json and PNGs."),
) -> None:
    """Train one model per mode on the same samples; print loss agreement and speed-up vs padded."""
    from seqpack.train import MODES, TrainConfig, resolve_tokenizer, run_training

    modes = list(MODES) if mode == "all" else [m.strip() for m in mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        _fail(f"--mode {mode!r}: unknown mode(s) {bad}; use 'all' or a comma list of {', '.join(MODES)}")
    if dtype not in ("float32", "bfloat16"):
        _fail(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    cfg = TrainConfig(modes=modes, steps=steps, seq_length=seq_length, model=model, hidden_size=hidden_size,
                      num_layers=num_layers, intermediate_size=intermediate_size, attn_implementation=attn,
                      device=device, dtype=dtype, lr=lr, seed=seed, algorithm=algorithm,
                      warmup_steps=warmup_steps, loss_tolerance=tolerance, out_dir=str(out), num_threads=threads or None,
                      progress=not no_progress, tokenizer=tokenizer)
    samples, pad_id = None, 0
    if data:
        missing = [str(p) for p in data if not Path(p).exists()]
        if missing:
            _fail(f"--data: file(s) not found: {', '.join(missing)}", 1)
        from seqpack.data import load_tokenizer, prepare

        tok = load_tokenizer(resolve_tokenizer(cfg))
        samples, _ = prepare([str(p) for p in data], tok, seq_length=seq_length)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    try:
        run_training(samples, cfg, pad_token_id=pad_id)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc), 1)
    print(f"wrote {out / 'train.json'}")
