"""The figures of a reference-loop run: per-mode throughput, loss agreement, goals, train.json and charts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqpack_bench.timing import bar_chart, line_chart, print_table, verdict, write_json
from seqpack_bench.train.config import MIN_TIMED_STEPS, TrainConfig, _timed_steps_fix


@dataclass
class ModeRun:
    name: str
    model: Any
    opt: Any
    steps: list[np.ndarray]
    rows: list[Any] | None = None
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    real: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    loss_tokens: list[int] = field(default_factory=list)
    ids: list[list[str]] = field(default_factory=list)


def summarise(runs: list[ModeRun], cfg: TrainConfig, samples, lengths, n_steps, vocab, log,
               option_names: dict[str, str] | None) -> dict[str, Any]:
    from rich.console import Console

    fix_timed = _timed_steps_fix(option_names)
    by = {r.name: r for r in runs}
    w = max(0, min(cfg.warmup_steps, max(len(r.steps) for r in runs) - 1))
    out: dict[str, Any] = {}
    for r in runs:
        t = float(sum(r.times[w:]))
        real, slots = int(sum(r.real[w:])), int(sum(r.slots[w:]))
        out[r.name] = {
            "steps": len(r.losses), "losses": r.losses, "step_time_s": r.times, "real_tokens": real,
            "slot_tokens": slots, "loss_tokens": int(sum(r.loss_tokens)),
            "padding_fraction": round(1.0 - real / slots, 6) if slots else None,
            "time_s": t, "real_tokens_per_s": real / t if t else None, "slot_tokens_per_s": slots / t if t else None,
        }
    goals = []
    for r in runs:
        if r.name in ("padded", "padded_stream"):
            continue
        ref = by["padded_stream" if r.name == "streaming" else "padded"]
        o, ro = out[r.name], out[ref.name]
        same = len(r.ids) == len(ref.ids) and all(sorted(a) == sorted(b) for a, b in zip(r.ids, ref.ids))
        o["reference"] = ref.name
        o["same_samples_as_reference"] = bool(same)
        o["speedup_vs_reference"] = ro["time_s"] / o["time_s"] if o["time_s"] else None
        o["ideal_ratio"] = ro["slot_tokens"] / o["real_tokens"] if o["real_tokens"] else None
        o["fraction_of_ideal"] = (o["speedup_vs_reference"] / o["ideal_ratio"]) if o["ideal_ratio"] else None
        d = np.abs(np.array(r.losses) - np.array(ref.losses[: len(r.losses)]))
        o["max_abs_loss_delta"] = float(d.max()) if d.size else None
        o["loss_delta_step1"] = float(d[0]) if d.size else None
        loss_goal = verdict(f"{r.name}: loss curve = {ref.name} within {cfg.loss_tolerance:g} (token mean, same samples)",
                            bool(same) and o["max_abs_loss_delta"] <= cfg.loss_tolerance,
                            f"max |delta| {o['max_abs_loss_delta']:.2e} over {len(r.losses)} steps "
                            f"(step 1: {o['loss_delta_step1']:.2e})"
                            + ("" if same else "; the steps did not hold the same samples"))
        goals.append(loss_goal | {"kind": "loss"})
        label = f"{r.name}: speed-up >= 90% of ideal"
        timed = min(len(r.times), len(ref.times)) - w
        if timed < MIN_TIMED_STEPS or o["fraction_of_ideal"] is None:
            info = (f"not enough timed steps for a speed verdict ({timed} after {w} warm-up; need >= "
                    f"{MIN_TIMED_STEPS}: {fix_timed})")
            Console().print(f"[yellow]n/a[/]   {label}: {info}", highlight=False)
            goals.append({"goal": label, "pass": None, "info": info, "kind": "speed"})
        else:
            goals.append(verdict(label, o["fraction_of_ideal"] >= 0.9,
                                 f"{o['speedup_vs_reference']:.2f}x vs ideal {o['ideal_ratio']:.2f}x = "
                                 f"{100 * o['fraction_of_ideal']:.0f}% (informational: step times are noisy)")
                         | {"kind": "speed"})
    rows = []
    for r in runs:
        o = out[r.name]
        rows.append([r.name, o["steps"], o["real_tokens"], o["slot_tokens"], o["padding_fraction"],
                     o["real_tokens_per_s"], o["slot_tokens_per_s"], o.get("speedup_vs_reference"),
                     o.get("ideal_ratio"), o.get("fraction_of_ideal"), o.get("max_abs_loss_delta"), r.losses[-1]])
    print_table(f"train: {cfg.model}, {cfg.attn_implementation}, {cfg.dtype}, {cfg.device}; throughput after "
                f"{w} warm-up step(s) (token counts and rates: timed steps only)",
                ["mode", "steps (all)", "real tok (timed)", "slot tok (timed)", "pad frac", "real tok/s", "slot tok/s",
                 "speed-up",
                 "ideal", "of ideal", "max |dloss|", "last loss"], rows)
    payload = {
        "benchmark": "train",
        "config": {k: (list(v) if isinstance(v, (tuple, list)) else v) for k, v in asdict(cfg).items()},
        "data": {"samples": len(samples), "tokens": int(lengths.sum()), "steps": n_steps, "vocab_size": vocab},
        "loss": "token mean of cross entropy over each step's loss tokens (seqpack.loss.packed_cross_entropy)",
        "modes": out,
        "goals": goals,
    }
    if cfg.out_dir:
        od = Path(cfg.out_dir)
        written = [write_json(od / "train.json", payload)]
        written.append(line_chart(od / "train_loss.png", {r.name: r.losses for r in runs},
                                  title="loss per step (token mean, same samples per step)", xlabel="step",
                                  ylabel="loss (nats)"))
        names = [r.name for r in runs]
        written.append(bar_chart(od / "train_throughput.png", names, [out[m]["real_tokens_per_s"] for m in names],
                                 title="real tokens / s (higher is better)", ylabel="tokens/s",
                                 annotate=[f"{out[m]['real_tokens_per_s']:.0f}" for m in names]))
        for path in written:
            log(f"wrote {path}")
    return payload
