"""`seqpack train`: the reference loop (padded | packed | in_batch | streaming) on the same samples.

:func:`register` adds the command to ``seqpack``'s app (the ``seqpack.cli`` entry point "train"); the
loop itself is :mod:`seqpack_bench.train`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import List, Optional

import typer

from seqpack._torch import missing_torch_message
from seqpack.cli.app import fail
from seqpack_bench import train as _train

# the attention implementations `--attn` accepts: seqpack.collate.HF_ATTN, each with where it runs (a test
# checks that this help and check_runtime agree)
ATTN_HELP = {
    "sdpa": "default, CPU and GPU",
    "eager": "CPU and GPU, slow",
    "flex_attention": "CUDA only: no backward pass on CPU",
    "flash_attention_2": "CUDA + the flash-attn package",
    "flash_attention_3": "CUDA (Hopper) + flash-attn 3's flash_attn_interface",
}


def _fail(msg: object, code: int = 2) -> None:
    """:func:`seqpack.cli.app.fail` with the message on one line (library messages embed line breaks)."""
    fail(_train.one_line(msg), code)


def train(
    ctx: typer.Context,
    mode: str = typer.Option("all", help="all, or a comma list of padded, packed, in_batch, streaming "
                                         "(padded is added as the reference of packed/in_batch; streaming is "
                                         "compared with its own padded twin, padded_stream). padded alone trains "
                                         "only the baseline: a note says so, and there is no loss check or "
                                         "speed-up (exit 0)."),
    data: Optional[List[Path]] = typer.Option(None, "--data", metavar="FILE|GLOB",
                                              help="A chat data file or a quoted glob such as 'data/*.jsonl'; repeat "
                                                   "--data for several (--data a.jsonl --data b.jsonl). Default: "
                                                   "../shared/data alpaca demo, else the embedded sample. Records "
                                                   "with images are trained as text (images ignored, with a warning)."),
    steps: int = typer.Option(100, min=1, help="Optimizer steps per mode (one pack of samples per step; fewer, "
                                               "with a message, when the data gives fewer packs)."),
    seq_length: int = typer.Option(512, "--seq-length", min=2,
                                   help="Pack capacity in tokens (2 .. 16777216, the packing kernels' limit)."),
    model: str = typer.Option("tiny-qwen3", help="tiny-qwen3 | tiny-llama | a local model folder with config.json, "
                                                 "weights (model.safetensors, pytorch_model.bin or a *.index.json "
                                                 "shard index) and, without --tokenizer, tokenizer files."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer for the data (default: qwen3 for tiny models, "
                                                      "else the model folder); loaded before the data is read."),
    hidden_size: int = typer.Option(128, "--hidden-size", min=8,
                                    help="Tiny models: a multiple of --num-heads with an even head size "
                                         "(hidden / heads)."),
    num_layers: int = typer.Option(2, "--num-layers", min=1),
    intermediate_size: int = typer.Option(512, "--intermediate-size", min=8),
    num_heads: int = typer.Option(4, "--num-heads", min=1, help="Tiny models: attention heads."),
    num_kv_heads: int = typer.Option(2, "--num-kv-heads", min=1,
                                     help="Tiny models: key/value heads (--num-heads must be a multiple)."),
    attn: str = typer.Option("sdpa", help="Attention implementation: "
                                          + " | ".join(f"{k} ({v})" for k, v in ATTN_HELP.items()) + "."),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N (cuda needs a CUDA build of torch)."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16."),
    lr: float = typer.Option(1e-3, help="AdamW learning rate (> 0)."),
    seed: int = typer.Option(0),
    algorithm: str = typer.Option("first_fit_shuffle",
                                  help="Packing algorithm of the step plan (first_fit_shuffle: packs hold random "
                                       "samples, so the padded baseline sees ordinary random batches)."),
    warmup_steps: int = typer.Option(2, "--warmup-steps", min=0, help="Steps left out of the throughput."),
    tolerance: float = typer.Option(1e-3, min=0.0,
                                    help="Max |loss delta| vs padded (nats, token mean, finite, >= 0). A loss check "
                                         "that fails makes the command exit 1."),
    threads: int = typer.Option(1, "--threads", min=0,
                                help="torch CPU threads; 0 = torch's default. 1 (default) gives steady timings on a "
                                     "shared CPU box (no OpenMP threads waiting on each other)."),
    no_progress: bool = typer.Option(False, "--no-progress"),
    out: str = typer.Option("bench_results", "--out", help="Folder for train.json, train_loss.png and "
                                                           "train_throughput.png (must not be blank; created and checked "
                                                           "before any work; each file written is printed)."),
) -> None:
    """Train one model per mode on the same samples; print loss agreement and speed-up vs padded.

    Exit status: 0 when every loss-agreement check passes (PASS lines "loss curve = ..."), 1 when one
    fails (a correctness failure: packing changed what the model learns) or on a data error, 2 on a
    bad option (checked before any data is read: values, --out, --model folder, device, attention,
    tokenizer). The speed verdicts ("speed-up >= 90% of ideal") are informational: step times on a
    shared machine are noisy, so a MISS there does not change the exit status, and with fewer than 3
    timed steps (after --warmup-steps) no speed verdict is given.
    """
    names = _train.CLI_OPTION_NAMES  # _train.<name> is looked up at call time (tests replace some of them)
    if ctx.args:
        _fail(f"unexpected argument(s) {' '.join(map(repr, ctx.args))}: seqpack train takes no positional arguments. "
              "Fix: repeat --data for several files (--data a.jsonl --data b.jsonl), or pass one quoted glob "
              "(--data 'data/*.jsonl')")
    if not out.strip():
        _fail("--out is empty; pass the folder for train.json and the PNGs, e.g. --out bench_results")
    # empty / unknown --mode and a bad --dtype are refused by TrainConfig.validate, naming the options
    modes = list(_train.MODES) if mode.strip() == "all" else [m.strip() for m in mode.split(",") if m.strip()]
    if importlib.util.find_spec("torch") is None:
        _fail(missing_torch_message("seqpack train"))
    try:
        cfg = _train.TrainConfig(modes=modes, steps=steps, seq_length=seq_length, model=model,
                                 hidden_size=hidden_size, num_layers=num_layers, intermediate_size=intermediate_size,
                                 num_heads=num_heads, num_kv_heads=num_kv_heads, attn_implementation=attn,
                                 device=device, dtype=dtype, lr=lr, seed=seed, algorithm=algorithm,
                                 warmup_steps=warmup_steps, loss_tolerance=tolerance, out_dir=out,
                                 num_threads=threads or None, progress=not no_progress, tokenizer=tokenizer,
                                 option_names=names)  # validated here, messages naming the options
        _train.check_out_dir(out, option_names=names)  # before any work: an unwritable --out fails now
        _train.check_runtime(cfg, option_names=names)  # --model folder, --device, --attn on this machine
        tok = _train.load_train_tokenizer(cfg, option_names=names)  # --tokenizer (or the --model folder's)
    except (ValueError, OSError) as exc:
        _fail(exc)
    # data errors (exit 1): DataFormatError / TokenizerError are ValueErrors naming the file and line
    try:
        if data:
            files = [str(p) for p in _train.expand_data_paths(data, option_names=names)]
        else:
            files = [str(_train.default_data())]
            print(f"data: {files[0]}")
        samples, pad_id, _ = _train.prepare_data(files, cfg, option_names=names, tokenizer=tok)
    except (ValueError, OSError) as exc:
        msg = str(exc)
        _fail(msg if msg.startswith(("--", "no samples")) else f"--data: {msg}", 1)
    try:  # prints one "wrote <path>" line per file written
        res = _train.run_training(samples, cfg, pad_token_id=pad_id, option_names=names)
    except (ValueError, OSError) as exc:  # e.g. weights that from_pretrained cannot read
        _fail(exc, 1)
    failed = [g for g in res["goals"] if g.get("kind") == "loss" and g.get("pass") is False]
    if failed:
        _fail(f"{len(failed)} loss-agreement check(s) failed (a correctness failure, not a speed one): "
              + "; ".join(f"{g['goal']}: {g['info']}" for g in failed), 1)


def register(app: typer.Typer) -> None:
    """Add ``train`` to ``app`` (the ``seqpack.cli`` entry point "train" names this function)."""
    app.command("train", context_settings={"allow_extra_args": True})(train)
