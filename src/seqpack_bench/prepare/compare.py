"""Why the two sides of ``seqpack bench prepare`` differ: samples kept and tokens counted, per data set."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from seqpack_bench.prepare.data import table_name

#: Why the two sides count different tokens on multi-turn chats (checked record by record on the four
#: demo files of ../shared/data: apart from these blocks, both sides render every record to the same text).
THINK_NOTE = ("why tokens differ: TRL's qwen3_training.jinja writes an empty think block "
              "'<think>\\n\\n</think>\\n\\n' (4 tokens) into every assistant turn, the model's chat template "
              "(used by seqpack) only into the turns after the last user message; trainable tokens also differ "
              "because TRL's assistant mask covers those blocks and the '\\n' after each <|im_end|>")



def _count_run(ids: np.ndarray, pattern: Sequence[int]) -> int:
    """Occurrences of the token run ``pattern`` in the 1-D id array ``ids``."""
    k = len(pattern)
    if k == 0 or ids.shape[0] < k:
        return 0
    hit = np.ones(ids.shape[0] - k + 1, dtype=bool)
    for j, t in enumerate(pattern):
        hit &= ids[j:ids.shape[0] - k + 1 + j] == t
    return int(hit.sum())


def _flat(files: Sequence[Path], column: str) -> np.ndarray:
    """One list column of Parquet files, flattened to a 1-D numpy array."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parts = [pc.list_flatten(pq.read_table(f, columns=[column]).column(column)).to_numpy(zero_copy_only=False)
             for f in files]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _fmt_reasons(reasons: dict[str, int]) -> str:
    return ", ".join(f"{r}: {c:,}" for r, c in reasons.items())


def compare_sides(entry: dict[str, Any], *, seq_length: int, seqpack_dir: Path, trl_file: Path,
                  think_ids: Sequence[int]) -> dict[str, Any]:
    """Say why seqpack and TRL prepared different samples or tokens from the same file.

    Read from what each side wrote (outside the timed runs): seqpack's report (records dropped or
    skipped, with reasons and examples), TRL's packed rows (samples exactly ``seq_length`` tokens long,
    i.e. cut by ``pack_dataset``'s truncation or that long already, and samples with no trainable
    token), and on both sides the number of empty think blocks ``think_ids`` (the rendered
    ``<think>\\n\\n</think>\\n\\n``), which TRL's training template writes into every assistant turn.

    Args:
        entry: a data-set entry of :func:`run_prepare` with ``seqpack`` and ``trl`` blocks.
        seqpack_dir: seqpack's output folder (``data/*.parquet`` shards).
        trl_file: TRL's ``to_parquet`` file (``input_ids``, ``labels``, ``seq_lengths`` per pack).
        think_ids: token ids of an empty think block.

    Returns:
        ``{"samples": {"seqpack", "trl"}, "tokens": {"seqpack", "trl"}, "seqpack_report",
        "seqpack_report_examples", "trl_samples_at_seq_length", "trl_samples_without_trainable_tokens",
        "think_blocks": {"seqpack", "trl"}, "think_block_tokens", "notes"}``; ``notes`` holds one line per
        difference (empty when both sides agree on samples and tokens).
    """
    sp, tr = entry["seqpack"], entry["trl"]
    short = table_name(entry["dataset"])
    seq_lens = _flat([trl_file], "seq_lengths").astype(np.int64)
    trained = (_flat([trl_file], "labels") != -100).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]) if seq_lens.size else np.zeros(0, np.int64)
    per_sample = np.add.reduceat(trained, starts) if seq_lens.size else np.zeros(0, np.int64)
    at_cap = int((seq_lens == seq_length).sum())
    no_train = int((per_sample == 0).sum())
    think = {"seqpack": _count_run(_flat(sorted((seqpack_dir / "data").glob("*.parquet")), "input_ids"), think_ids),
             "trl": _count_run(_flat([trl_file], "input_ids"), think_ids)}
    think_tokens = len(think_ids) * (think["trl"] - think["seqpack"])
    report = sp.get("report", {})
    notes = []
    if sp["samples"] != tr["samples"]:
        lost = {st: r for st, r in report.items() if st in ("dropped", "skipped")}
        why = "; ".join(f"{st} {sum(r.values()):,} ({_fmt_reasons(r)})" for st, r in lost.items())
        line = (f"note: {short}: samples differ: seqpack {sp['samples']:,}, TRL {tr['samples']:,}; seqpack's report: "
                + (why or "nothing dropped or skipped"))
        if sp.get("report_examples"):
            ex = sp["report_examples"][0]
            line += f" (e.g. {ex['sample_id']}: {ex['detail']})"
        line += (f"; TRL's pack_dataset keeps rows over {seq_length:,} tokens, cut to their first {seq_length:,} "
                 f"(TRL samples exactly {seq_length:,} tokens long: {at_cap:,}; with no trainable token: {no_train:,})")
        notes.append(line)
    diff = tr["tokens"] - sp["tokens"]
    if diff:
        line = (f"note: {short}: tokens differ: seqpack {sp['tokens']:,}, TRL {tr['tokens']:,} ({diff:+,}); "
                f"empty think blocks: seqpack {think['seqpack']:,}, TRL {think['trl']:,} = {think_tokens:+,} tokens")
        rest = diff - think_tokens
        if rest and tr["samples"] > sp["samples"]:
            line += f"; the other {rest:+,} are in the samples TRL keeps and seqpack drops"
        elif rest:
            line += f"; {rest:+,} not explained by think blocks"
        notes.append(line)
    return {"samples": {"seqpack": sp["samples"], "trl": tr["samples"]},
            "tokens": {"seqpack": sp["tokens"], "trl": tr["tokens"]},
            "seqpack_report": report, "seqpack_report_examples": sp.get("report_examples", []),
            "trl_samples_at_seq_length": at_cap, "trl_samples_without_trainable_tokens": no_train,
            "think_blocks": think, "think_block_tokens": think_tokens, "notes": notes}


# ------------------------------------------------------------------------------------------ driver
