"""``prepare``: chat records in, tokenized ``Sample``s and a full accounting report out."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from seqpack.data.chat_template import TRAIN_ON, TemplateMarkers, encode_texts, render_conversation
from seqpack.data.formats import FORMATS, normalize_record
from seqpack.data.length_policy import OVERLENGTH_POLICIES, apply_overlength
from seqpack.data.records import Conversation, DataFormatError, RawRecord
from seqpack.sample import Sample
from seqpack.accounting import PrepareReport, SampleRecord
from seqpack.data.sources import InMemoryRecords, dataset_name, expand_inputs, is_dataset, iter_records
from seqpack.data.tokenizer import TokenizerError, load_tokenizer

__all__ = ["ON_ERROR", "UNLIMITED", "display_names", "prepare", "rename_source"]

#: ``on_error`` values: ``"raise"`` on the first bad record, or ``"skip"`` and report it.
ON_ERROR = ("raise", "skip")

#: ``seq_length`` for an unlimited-length pass (image samples are cut only after their expansion).
UNLIMITED = 2**31 - 1

ProgressFn = Callable[[str, int, "int | None"], None]


def prepare(
    inputs: Any,
    tokenizer: Any,
    *,
    seq_length: int,
    overlength: str = "truncate",
    on_error: str = "raise",
    train_on: str = "assistant",
    format: str | None = None,
    progress: ProgressFn | None = None,
    keep_untrainable: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    batch_size: int = 1024,
) -> tuple[list[Sample], PrepareReport]:
    """Read chat records, render them with the tokenizer's chat template and tokenize them.

    Args:
        inputs: a path (``.json`` array, ``.jsonl``, ``.parquet``), a glob, an HF
            ``datasets.Dataset``, or a list of those (read in order); or a list of record dicts
            (source name ``"records"``, image paths relative to the cwd).
        tokenizer: a fast ``transformers`` tokenizer with a chat template, or a name for
            ``load_tokenizer`` (``"qwen3"`` = embedded Qwen3 tokenizer, a folder or a hub id).
        seq_length: capacity in tokens; no returned sample is longer.
        overlength: ``"truncate"`` (default) | ``"drop"`` | ``"split"`` (pretraining-style, opt-in)
            | ``"error"``; see ``seqpack.data.length_policy``.
        on_error: ``"raise"`` (default) raises ``DataFormatError`` on the first bad record;
            ``"skip"`` lists it in the report (status ``"skipped"``) and goes on. A file that is not
            valid JSON as a whole always raises (its records cannot be counted).
        train_on: ``"assistant"`` (labels on assistant turns only) or ``"all"``.
        format: force ``"alpaca"``, ``"sharegpt"``, ``"openai"`` or ``"llava"``; ``None`` detects
            per record.
        progress: optional ``callback(stage, done, total)``; stage ``"prepare"`` counts records
            (``total`` is known for datasets, ``None`` for files).
        keep_untrainable: keep samples that have no trainable label (default: drop and report them).
        chat_template_kwargs: extra template variables for every render (e.g.
            ``{"enable_thinking": False}``).
        batch_size: records per batched tokenizer call.

    Returns:
        ``(samples, report)``: samples in input order (``Sample.labels`` shifted, ``sample_id``
        ``"<file name>:<index>"``, where files sharing a name are told apart by the shortest
        distinguishing path suffix, ``"a/x.json:0"`` and ``"b/x.json:0"``; a file listed twice, or
        matched by a path and an overlapping glob, is read once (logged); split fragments ``"<id>#part<k>"``, ``media={"images": [...]}``
        for records with images); ``report.records_read`` = records in the inputs, and every
        record that is not one unchanged sample has an entry (skipped, dropped, truncated, split).

    Raises:
        DataFormatError: bad input with ``on_error="raise"`` (names file, line/index and the fix).
        OverlengthError: ``overlength="error"`` and a sample is longer than ``seq_length``.
        FileNotFoundError: a path or glob matches nothing.
        TokenizerError: the tokenizer cannot be loaded or has no chat template.
        ValueError: an invalid option.
    """
    if overlength not in OVERLENGTH_POLICIES:
        raise ValueError(f"overlength={overlength!r} is not one of {OVERLENGTH_POLICIES}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error={on_error!r} is not one of {ON_ERROR}")
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on={train_on!r} is not one of {TRAIN_ON}")
    if int(seq_length) < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    seq_length = int(seq_length)
    if format is not None and format not in FORMATS:
        raise ValueError(f"format={format!r} is not one of {FORMATS} (or None to detect per record)")
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, so chat records cannot "
            "be rendered. Fix: use an instruct/chat model's tokenizer or set tokenizer.chat_template."
        )
    markers = TemplateMarkers.probe(tokenizer, chat_template_kwargs)

    items = expand_inputs(inputs)
    names = display_names(items)
    total = _total_records(items)
    report = PrepareReport()
    samples: list[Sample] = []
    pending: list[tuple[Conversation, str, str, list[tuple[int, int]]]] = []

    def flush() -> None:
        if not pending:
            return
        encoded = encode_texts(tokenizer, [p[2] for p in pending], [p[3] for p in pending], train_on)
        for (conv, sid, _, _), (ids, tr) in zip(pending, encoded):
            media = {"images": list(conv.images)} if conv.images else None
            meta: dict[str, Any] = {"format": conv.format}
            if conv.id is not None:
                meta["record_id"] = conv.id
            out, entries = apply_overlength(
                ids,
                tr,
                seq_length=seq_length,
                overlength=overlength,
                sample_id=sid,
                source=conv.source,
                index=conv.index,
                media=media,
                meta=meta,
                keep_untrainable=keep_untrainable,
            )
            samples.extend(out)
            report.entries.extend(entries)
            for s in out:
                report.samples_out += 1
                report.tokens += s.length
                report.trainable_tokens += s.num_trainable
        pending.clear()

    for item, name in zip(items, names):
        for raw in iter_records(item):
            report.records_read += 1
            sid = f"{name}:{raw.index}"
            try:
                conv = normalize_record(raw, format)
                text, spans = render_conversation(conv, tokenizer, markers, chat_template_kwargs)
            except DataFormatError as e:
                if on_error == "raise":
                    raise
                report.entries.append(_skip_entry(raw, sid, e))
                continue
            pending.append((conv, sid, text, spans))
            if len(pending) >= batch_size:
                flush()
                if progress is not None:
                    progress("prepare", report.records_read, total)
        flush()
        if progress is not None:
            progress("prepare", report.records_read, total)
    return samples, report


def _skip_entry(raw: RawRecord, sid: str, e: DataFormatError) -> SampleRecord:
    detail = str(e)
    return SampleRecord(sid, raw.source, raw.index, "skipped", e.reason, detail)


def display_names(items: list[Any]) -> list[str]:
    """Provenance prefix of the sample ids, one per input (``items`` from ``expand_inputs``, where a
    file reached twice is already listed once).

    A file is named by its file name; files sharing a file name (``a/x.json``, ``b/x.json``) by the
    shortest suffix of their absolute paths that tells them apart (``"a/x.json"``, ``"b/x.json"``). A
    dataset is named by its name, suffixed ``[k]`` (k = 0, 1, ... in input order) where several inputs
    share it. The returned names are unique, so sample ids ``"<name>:<index>"`` are unique.
    """
    is_file = [not (is_dataset(it) or isinstance(it, InMemoryRecords)) for it in items]
    base = [
        Path(it).name if f else it.name if isinstance(it, InMemoryRecords) else dataset_name(it)
        for it, f in zip(items, is_file)
    ]
    counts = Counter(base)
    out = list(base)
    clashing_files = [i for i, b in enumerate(base) if is_file[i] and counts[b] > 1]
    if clashing_files:
        parts = {i: Path(os.path.abspath(items[i])).parts for i in clashing_files}
        for i in clashing_files:
            others = [parts[j] for j in clashing_files if j != i and base[j] == base[i]]
            n = 1
            while n < len(parts[i]) and any(o[-n:] == parts[i][-n:] for o in others):
                n += 1
            out[i] = "/".join(parts[i][-n:]) if n < len(parts[i]) else str(Path(*parts[i]))
    # datasets sharing a name (and any name still equal to another input's): suffix [k]
    counts = Counter(out)
    seen: Counter = Counter()
    for i, name in enumerate(list(out)):
        if counts[name] > 1:
            out[i] = f"{name}[{seen[name]}]"
            seen[name] += 1
    return out


def rename_source(records: Any, old: str, new: str) -> None:
    """Rewrite the id prefix ``"<old>:"`` to ``"<new>:"`` in place on ``Sample`` s / report entries.

    ``prepare`` of one input names it by :func:`display_names` of that input alone (its file name);
    an engine that prepares a multi-file job one file at a time renames the ids to the display name
    from the whole input list (which may carry a distinguishing path suffix), so the ids equal those
    of one ``prepare`` call on every input. Objects whose ``sample_id`` has another prefix are left as
    they are.
    """
    if old == new:
        return
    head = old + ":"
    for x in records:
        sid = str(x.sample_id)
        if sid.startswith(head):
            x.sample_id = new + sid[len(old):]


def _total_records(items: list[Any]) -> int | None:
    total = 0
    for it in items:
        if isinstance(it, InMemoryRecords):
            total += len(it)
            continue
        if not is_dataset(it):
            return None
        try:
            total += len(it)
        except TypeError:  # IterableDataset
            return None
    return total
