"""The reference loop: every mode trained on the same samples, step by step (:func:`run_training`).

What is compared and how: docs/notes/seqpack_bench.train.md.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.algorithms import DEFAULT_ALGORITHM, pack_lengths
from seqpack.packed import build_packed_sequence
from seqpack_bench.train.checks import check_out_dir, check_runtime
from seqpack_bench.train.config import MIN_TIMED_STEPS, TINY_MODELS, TrainConfig, _namer, _settable, _timed_steps_fix
from seqpack_bench.train.data import default_data, prepare_data
from seqpack_bench.train.model import build_model, compact_vocabulary
from seqpack_bench.train.summary import ModeRun, summarise


def plan_steps(lengths: np.ndarray, seq_length: int, *, algorithm: str | None = None, seed: int = 0) -> list[np.ndarray]:
    """Step plan = packing plan: ``pack_lengths(lengths, seq_length)`` bins (int64 index arrays, pack order)."""
    plan = pack_lengths(np.asarray(lengths, np.int64), seq_length, algorithm or DEFAULT_ALGORITHM, seed=seed)
    return [np.asarray(b, np.int64) for b in plan.bins]


# ---------------------------------------------------------------------------------------------- steps
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step_inputs(mode: str, samples: Sequence[Any], row: Any, pad_id: int):
    """Collate one step. Returns ``(kind, batch, slots)``; kind ``"padded"`` or ``"thd"``."""
    from seqpack.collate import InBatchPackingCollator, PackedCollator, PaddedCollator

    if mode in ("padded", "padded_stream"):
        b = PaddedCollator(pad_id, format="shifted")(samples)
        return "padded", b, int(b["input_ids"].numel())
    if mode == "in_batch":
        b = InBatchPackingCollator(pad_id, format="thd")(samples)
    else:  # packed / streaming: a pre-built PackedSequence row
        b = PackedCollator(format="thd")([row])
    return "thd", b, int(b["input_ids"].shape[-1])


def _batch_sample_ids(kind: str, batch: dict, samples: Sequence[Any]) -> list[str]:
    """Sample ids of what the step actually consumed (THD batches carry ``sample_ids``)."""
    if kind == "thd":
        return [str(x) for x in batch["sample_ids"]]
    return [str(s.sample_id) for s in samples]


def _forward_loss(model, kind: str, batch: dict, device: str):
    """Token-mean loss of one step (fp32 scalar) and its loss-token count."""
    from seqpack.hf import packed_forward
    from seqpack.loss import packed_cross_entropy

    if kind == "padded":
        out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                    position_ids=batch["position_ids"].to(device), use_cache=False)
    else:
        out = packed_forward(model, batch, compute_loss=False)
    loss_sum, count = packed_cross_entropy(out.logits, batch["labels"])
    return loss_sum / count.clamp(min=1), int(count)


def run_training(samples: Sequence[Any] | None = None, cfg: TrainConfig | None = None, *, pad_token_id: int = 0,
                 log: Callable[[str], None] = print,
                 option_names: dict[str, str] | None = None) -> dict[str, Any]:
    """Train every mode of ``cfg.modes`` on the same samples and compare loss and throughput.

    Args:
        samples: ``Sample`` objects (``None``: :func:`default_data` through ``seqpack.data.prepare``
            with the embedded Qwen3 tokenizer; then ``pad_token_id`` comes from the tokenizer).
        cfg: :class:`TrainConfig` (default settings when ``None``).
        pad_token_id: id of padding slots (ignored when ``samples`` is None).
        log: one-line messages (data summary, warnings, steps actually run, a note when ``modes`` is
            ``("padded",)`` alone: nothing to compare, so no loss check and no speed-up; and one
            ``wrote <path>`` line per file written: ``train.json``, ``train_loss.png``,
            ``train_throughput.png``).
        option_names: how messages name config fields (``seqpack train`` passes :data:`CLI_OPTION_NAMES`).
            When given, a fix only advises fields it names (a caller without a ``warmup_steps`` option
            is told to raise ``steps``, not to lower ``warmup_steps``).

    Before any data is read or model built: :meth:`TrainConfig.validate`, :func:`check_runtime`
    (model, device, attention) and :func:`check_out_dir`.

    Returns:
        the ``train.json`` payload: ``config``, ``data`` (samples, tokens, steps), ``modes`` (per mode:
        ``losses``, ``step_time_s``, ``real_tokens``, ``slot_tokens``, ``padding_fraction``,
        ``real_tokens_per_s``, ``slot_tokens_per_s``, ``reference``, ``speedup_vs_reference``,
        ``ideal_ratio``, ``fraction_of_ideal``, ``max_abs_loss_delta``), ``goals`` (each ``goal``,
        ``pass`` (``None`` = no verdict), ``info``, ``kind``: ``"loss"`` = correctness check,
        ``"speed"`` = informational).

    Raises:
        ValueError: an invalid config field, a device / attention this machine cannot run, an
            unwritable ``out_dir``, no samples, or a sample longer than ``seq_length``.
        FileNotFoundError: ``model`` is neither a tiny name nor an existing folder, or the folder has no
            ``config.json`` or no weights.
    """
    import torch

    cfg = cfg or TrainConfig()
    cfg.validate(option_names)
    check_runtime(cfg, option_names=option_names)
    check_out_dir(cfg.out_dir, option_names=option_names)
    if not cfg.num_threads:
        return _run_training(samples, cfg, pad_token_id, log, option_names)
    before = torch.get_num_threads()
    torch.set_num_threads(int(cfg.num_threads))
    try:
        return _run_training(samples, cfg, pad_token_id, log, option_names)
    finally:
        torch.set_num_threads(before)


def _new_run(base: Any, cfg: TrainConfig, name: str, steps: list[np.ndarray], rows=None) -> ModeRun:
    """One mode's run: its own copy of the ``base`` model and an AdamW optimizer (``cfg.lr``, no weight decay)."""
    import torch

    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    return ModeRun(name, model, opt, steps, rows)


def _run_training(samples, cfg: TrainConfig, pad_token_id: int, log: Callable[[str], None],
                  option_names: dict[str, str] | None) -> dict[str, Any]:
    import torch

    n = _namer(option_names)
    modes = list(dict.fromkeys(cfg.modes))
    if "padded" not in modes and ({"packed", "in_batch"} & set(modes)):
        modes.insert(0, "padded")  # their reference; streaming brings its own (padded_stream)
    notes = []  # logged after the overview line
    if modes == ["padded"]:
        notes.append(f"note: {n('modes')} padded alone trains only the baseline (unpacked, padded): no loss-agreement check "
                     f"and no speed-up (add packed, in_batch or streaming to {n('modes')} to compare)")
    if samples is None:
        data = default_data()
        log(f"data: {data}")
        samples, pad_token_id, _ = prepare_data([data], cfg, option_names=option_names, log=log)
    samples = list(samples)[: cfg.max_samples]
    if not samples:
        raise ValueError("no samples to train on")
    too_long = [s.sample_id for s in samples if s.length > cfg.seq_length]
    if too_long:
        raise ValueError(f"{len(too_long)} sample(s) longer than {n('seq_length')} {cfg.seq_length} (first: "
                         f"{too_long[0]}); prepare them with the same seq_length (overlength='truncate')")
    with_images = sum(1 for s in samples if s.media and s.media.get("images"))
    if with_images:
        log(f"warning: {with_images} of {len(samples)} samples have images; seqpack train trains text-only models, "
            "so the images are ignored and their placeholder text (e.g. <image>) is trained as ordinary tokens "
            "(the mode comparison still holds: every mode sees the same tokens)")
    vocab = None
    if cfg.model in TINY_MODELS:
        if cfg.compact_vocab:
            samples, vocab, pad_token_id = compact_vocabulary(samples, pad_token_id)
        else:
            vocab = int(max(int(np.max(s.input_ids)) for s in samples) + 1)
            vocab = max(vocab, pad_token_id + 1, cfg.vocab_size or 0)
    lengths = np.array([s.length for s in samples], np.int64)
    plan = plan_steps(lengths, cfg.seq_length, algorithm=cfg.algorithm, seed=cfg.seed)
    n_steps = len(plan) if cfg.steps is None else min(cfg.steps, len(plan))
    if cfg.steps is not None and n_steps < cfg.steps:
        notes.append(f"{n('steps')} {cfg.steps}: the {len(samples)} samples fill only {len(plan)} pack(s) of <= "
                     f"{cfg.seq_length} tokens, so {n_steps} step(s) are run per mode (more data or a smaller "
                     f"{n('seq_length')} gives more packs)")
    plan = plan[:n_steps]

    base = build_model(cfg, vocab)
    rows_in = base.get_input_embeddings().num_embeddings
    top = max(int(np.max(s.input_ids)) for s in samples)
    if max(top, pad_token_id) >= rows_in:
        raise ValueError(f"token id {max(top, pad_token_id)} (data or pad id) is past the model's {rows_in:,} "
                         f"embedding rows ({n('model')} {cfg.model}). Fix: prepare the data with the model's own "
                         f"tokenizer ({n('tokenizer')})")
    runs: list[ModeRun] = []

    for m in modes:
        if m == "streaming":
            from seqpack.stream.packer import StreamingPacker  # imports torch

            packer = StreamingPacker(samples, cfg.seq_length, packing_buffer_size=min(cfg.packing_buffer_size,
                                     len(samples)), pad_token_id=pad_token_id, seed=cfg.seed, output="packed")
            index = {s.sample_id: i for i, s in enumerate(samples)}
            rows, steps = [], []
            for row in packer:  # the packer's own packs, in its order (built before the timed loop)
                rows.append(row)
                steps.append(np.array([index[str(sid)] for sid in row.sample_ids], np.int64))
                if len(rows) == n_steps:
                    break
            if len(rows) < n_steps:
                notes.append(f"streaming: the packer made only {len(rows)} pack(s), so streaming and padded_stream "
                             f"run {len(rows)} step(s) (the other modes {n_steps})")
            runs.append(_new_run(base, cfg, "streaming", steps, rows))
            runs.append(_new_run(base, cfg, "padded_stream", steps))
        elif m == "packed":
            rows = [build_packed_sequence([samples[int(i)] for i in b], pad_token_id=pad_token_id) for b in plan]
            runs.append(_new_run(base, cfg, "packed", plan, rows))
        else:
            runs.append(_new_run(base, cfg, m, plan))
    del base
    longest = max(len(r.steps) for r in runs)
    if cfg.warmup_steps >= longest:
        warm = (f"{n('warmup_steps')} {cfg.warmup_steps}" if _settable(option_names, "warmup_steps")
                else f"the warm-up of {cfg.warmup_steps} step(s)")
        notes.append(f"{warm} is not below the {longest} step(s) run: only the first "
                     f"{longest - 1} step(s) are left out of the throughput (a speed verdict needs "
                     f"{MIN_TIMED_STEPS} timed steps: {_timed_steps_fix(option_names)})")
    total = sum(len(r.steps) for r in runs)
    log(f"{len(samples)} samples, {int(lengths.sum()):,} tokens; {n_steps} steps of <= {cfg.seq_length} tokens; "
        f"modes: {', '.join(r.name for r in runs)}; model {cfg.model} (vocab {vocab or 'model'}), "
        f"{cfg.attn_implementation}, {cfg.dtype}, {cfg.device}")
    for note in notes:
        log(note)

    from contextlib import nullcontext

    if cfg.progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        prog = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                        TimeElapsedColumn(), transient=False)
    else:
        prog = None
    amp = (torch.autocast(device_type=cfg.device.split(":")[0], dtype=getattr(torch, cfg.autocast_dtype))
           if cfg.autocast_dtype else nullcontext())
    with (prog if prog is not None else nullcontext()):
        task = prog.add_task("", total=total) if prog else None
        for k in range(max(len(r.steps) for r in runs)):
            order = runs[k % len(runs):] + runs[: k % len(runs)]  # rotate: no mode always runs first
            for r in order:
                if k >= len(r.steps):
                    continue
                ss = [samples[int(i)] for i in r.steps[k]]
                _sync(cfg.device)
                t0 = time.perf_counter()
                kind, batch, slots = _step_inputs(r.name, ss, r.rows[k] if r.rows else None, pad_token_id)
                with amp:
                    loss, count = _forward_loss(r.model, kind, batch, cfg.device)
                loss.backward()
                r.opt.step()
                r.opt.zero_grad(set_to_none=True)
                _sync(cfg.device)
                r.times.append(time.perf_counter() - t0)
                r.losses.append(float(loss.detach()))
                r.real.append(int(sum(s.length for s in ss)))
                r.slots.append(slots)
                r.loss_tokens.append(count)
                r.ids.append(_batch_sample_ids(kind, batch, ss))
                if prog:
                    prog.update(task, advance=1, description=(
                        f"{r.name:>13s} step {k + 1} loss {r.losses[-1]:.4f} "
                        f"{r.real[-1] / r.times[-1]:,.0f} real tok/s, pad {1 - r.real[-1] / r.slots[-1]:.1%}"))
    return summarise(runs, cfg, samples, lengths, n_steps, vocab, log, option_names)
