"""The fixes a ``NothingToPackError`` offers: one per reason the records were refused for, written with
``pack_dataset`` keyword names (the CLI rewrites them as flags: :func:`seqpack.pipeline.cli_text.cli_error_text`)."""

from __future__ import annotations

from pathlib import Path

from seqpack.accounting import PrepareReport, SampleRecord
from seqpack.data.json_files import is_blank_file
from seqpack.pipeline.job import PackJob

__all__ = ["empty_input_text", "lost_to_truncation", "nothing_left_fixes"]


def empty_input_text(name: str) -> str:
    """An input file that gave no record, and why, for messages: ``"e/a.json is empty (0 records)"`` for a file
    of 0 bytes or only whitespace (``.json`` and ``.jsonl`` alike), ``"e/b.json holds an empty JSON array (0
    records)"``, ``"e/c.parquet holds no row (0 records)"``."""
    p = Path(name)
    try:
        blank = p.is_file() and is_blank_file(p)
    except OSError:
        blank = False
    if blank:
        return f"{name} is empty (0 records)"
    if p.suffix.lower() == ".json":
        return f"{name} holds an empty JSON array (0 records)"
    return f"{name} holds no row (0 records)"


def lost_to_truncation(entry: SampleRecord, seq_length: int) -> bool:
    """Whether ``entry`` is a record dropped for no trainable token because truncating it to
    ``seq_length`` cut its trained tokens (it had ``tokens_before > seq_length``, text and media alike),
    not one that had none to begin with."""
    return entry.status == "dropped" and entry.reason == "no_trainable_tokens" and (
        (entry.tokens_before or 0) > seq_length)


def nothing_left_fixes(job: PackJob, report: PrepareReport) -> list[str]:
    """The fixes that fit the reasons ``report``'s records were refused for (``report.by_reason()``);
    never empty.

    Example:
        >>> nothing_left_fixes(job, report)  # doctest: +SKIP
        ['records truncated to seq_length=1 kept no trainable token: raise seq_length=1, or set ...']
    """
    by_reason = report.by_reason()
    reasons = {r for per in by_reason.values() for r in per}
    fixes = [f"check format={job.format or 'auto'!r} against the records' keys"] if reasons & {
        "unknown_format", "missing_key"} else []
    dropped = set(by_reason.get("dropped", {}))
    if dropped & {"overlength", "overlength_media"}:
        fixes.append(f"for overlength drops raise seq_length={job.seq_length} or change overlength={job.overlength!r}")
    if "no_trainable_tokens" in dropped:
        untrained = [e for e in report.entries if e.status == "dropped" and e.reason == "no_trainable_tokens"]
        if any(lost_to_truncation(e, job.seq_length) for e in untrained):
            fixes.append(f"records truncated to seq_length={job.seq_length} kept no trainable token: raise "
                         f"seq_length={job.seq_length}, or set overlength='split' (keeps every token) or "
                         "overlength='drop'")
        if not all(lost_to_truncation(e, job.seq_length) for e in untrained):
            fixes.append(f"no token left to train on: check train_on={job.train_on!r} and the assistant turns")
    if "empty_sample" in dropped:
        fixes.append("records that render to no tokens: check their content and the chat template")
    if "skipped" in by_reason:
        fixes.append("fix the skipped records (each is named when packing with on_error='raise')")
    return fixes or ["read each record's reason in the report"]
