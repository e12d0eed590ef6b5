"""``prepare``: chat records in, tokenized ``Sample``s and a full accounting report out."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

from seqpack.accounting import PrepareReport
from seqpack.data.chat_template import TRAIN_ON, TemplateMarkers
from seqpack.data.formats import FORMATS
from seqpack.data.json_files import jsonl_lines
from seqpack.data.length_policy import OVERLENGTH_POLICIES
from seqpack.data.llamafactory import LlamaFactorySource
from seqpack.data.media_root import MediaRoot
from seqpack.data.records import DataFormatError, RawRecord
from seqpack.data.sources import (
    InMemoryRecords,
    dataset_name,
    expand_inputs,
    is_dataset,
    iter_records,
)
from seqpack.data.tokenizer import resolve_tokenizer
from seqpack.padding import check_positive_int
from seqpack.data.workers import ChunkSettings, PreparePool
from seqpack.sample import Sample

__all__ = ["ON_ERROR", "UNLIMITED", "RecordCounts", "display_names", "prepare", "rename_source"]

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
    num_proc: int | None = 1,
    workers: PreparePool | None = None,
    keep_image_placeholders: bool = False,
    media_dir: str | os.PathLike | None = None,
    allow_any_media_path: bool = False,
    sink: Callable[[list[Sample]], None] | None = None,
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
            (``total``: :class:`RecordCounts`, exact for datasets, record lists, ``.jsonl`` files and a parsed
            ``.json`` array, estimated for ``.json`` files not yet parsed; ``None`` for an ``IterableDataset``).
        keep_untrainable: keep samples that have no trainable label (default: drop and report them).
        chat_template_kwargs: extra template variables for every render (e.g.
            ``{"enable_thinking": False}``).
        batch_size: records per batched tokenizer call.
        num_proc: processes that render and tokenize records (1 = this process; > 1 = that many
            worker processes, started for this call; ``None`` = the cores available, once the input is
            large enough: :class:`~seqpack.data.workers.PreparePool`). Output, report and errors are the
            same for every value.
        workers: a started :class:`~seqpack.data.workers.PreparePool` for ``tokenizer`` to use
            instead of ``num_proc`` (one pool for many calls).
        keep_image_placeholders: return image samples (LLaVA ``<image>`` records, ``media["images"]``
            set) with each ``<image>`` still one placeholder token, for a caller that expands them to the
            model's image-token runs itself (``seqpack.data.media.prepare_multimodal``, ``seqpack pack``).
            Default False: such a record is refused, since its token ids and length are not what the
            model is trained on.
        media_dir: the media root: image references resolve against it (``root/ref``, then
            ``root/images/ref``) and must lie inside it after resolving symlinks; default: each data file's
            folder (the current directory for record lists and datasets). See ``seqpack.data.media_root``.
        allow_any_media_path: read images wherever the records point (no media root check).
        sink: called with each batch of samples (input order, up to ``batch_size`` records' worth) as they
            are made, instead of keeping them: the returned sample list is then empty (bounded memory for
            a caller that stores them elsewhere, ``seqpack pack``'s disk spill).

    Returns:
        ``(samples, report)``: samples in input order (``Sample.labels`` shifted, ``sample_id``
        ``"<file name>:<index>"``, where files sharing a name are told apart by the shortest
        distinguishing path suffix, ``"a/x.json:0"`` and ``"b/x.json:0"``; a file listed twice, or
        matched by a path and an overlapping glob, is read once (logged); split fragments ``"<id>#part<k>"``, ``media={"images": [...]}``
        for records with images); ``report.records_read`` = records in the inputs, and every
        record that is not one unchanged sample has an entry (skipped, dropped, truncated, split).

    Raises:
        DataFormatError: bad input with ``on_error="raise"`` (names file, line/index and the fix); a
            record with images without ``keep_image_placeholders`` (always: a usage error, not a bad
            record; the message names the record and points to ``prepare_multimodal``).
        OverlengthError: ``overlength="error"`` and a sample is longer than ``seq_length``.
        FileNotFoundError: a path or glob matches nothing.
        TokenizerError: the tokenizer cannot be loaded or has no chat template.
        ValueError: an invalid option (``num_proc`` < 1, ``workers`` for another tokenizer, ``media_dir``
            not a folder).
        WorkerDiedError: a worker process died (e.g. killed by the out-of-memory killer) or could not start.
    """
    if overlength not in OVERLENGTH_POLICIES:
        raise ValueError(f"overlength={overlength!r} is not one of {OVERLENGTH_POLICIES}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error={on_error!r} is not one of {ON_ERROR}")
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on={train_on!r} is not one of {TRAIN_ON}")
    seq_length = check_positive_int(seq_length, "seq_length")
    if format is not None and format not in FORMATS:
        raise ValueError(f"format={format!r} is not one of {FORMATS} (or None to detect per record)")
    tokenizer = resolve_tokenizer(tokenizer)
    markers = TemplateMarkers.probe(tokenizer, chat_template_kwargs)

    items = expand_inputs(inputs)
    names = display_names(items)
    counts = RecordCounts(items)
    report = PrepareReport()
    samples: list[Sample] = []
    settings = ChunkSettings(markers, chat_template_kwargs, format, train_on, seq_length, overlength, keep_untrainable,
                             media=MediaRoot.create(media_dir, allow_any_media_path))
    pool = workers if workers is not None else PreparePool(num_proc, tokenizer)
    if pool.tokenizer is not tokenizer:
        raise ValueError("workers= holds another tokenizer than the one given to prepare")
    chunk = batch_size if pool.num_proc == 1 else min(batch_size, pool.chunk_records)
    pending: list[tuple] = []  # outcomes of rendered records awaiting their tokenizer batch

    def flush() -> None:
        start = len(samples)
        for outcome in pending:
            if outcome[0] == "late":
                raise outcome[1]
            if not keep_image_placeholders:
                _refuse_images(outcome[1])
            samples.extend(outcome[1])
            report.entries.extend(outcome[2])
            for s in outcome[1]:
                report.samples_out += 1
                report.tokens += s.length
                report.trainable_tokens += s.num_trainable
        pending.clear()
        if sink is not None and len(samples) > start:
            sink(samples[start:])
            del samples[start:]

    try:
        for i, (item, name) in enumerate(zip(items, names)):
            records = iter_records(item, on_count=lambda n, _i=i: counts.learn(_i, n))
            for outcomes in pool.map_chunks(settings, _chunks(records, name, chunk)):
                for outcome in outcomes:
                    report.records_read += 1
                    if outcome[0] == "bad":
                        if on_error == "raise" or outcome[2] is None:
                            raise outcome[1]
                        report.entries.append(outcome[2])
                        continue
                    pending.append(outcome)
                    if len(pending) >= batch_size:
                        flush()
                        if progress is not None:
                            progress("prepare", report.records_read, counts.total())
            flush()
            if progress is not None:
                progress("prepare", report.records_read, counts.total())
    finally:
        if workers is None:
            pool.close()
    return samples, report


def _refuse_images(samples: list[Sample]) -> None:
    """Raise :class:`DataFormatError` for the first sample that has images (see ``prepare``), naming the
    sample's source (the file path as given, or the dataset name) and record index."""
    for smp in samples:
        if (smp.media or {}).get("images"):
            raise DataFormatError(
                f"has images ({len(smp.media['images'])}; sample {smp.sample_id}); prepare() tokenizes text only "
                "and would keep each <image> as a literal placeholder token instead of the model's image "
                "tokens.", source=smp.source, index=smp.index, reason="bad_input",
                fix="use seqpack.data.media.prepare_multimodal(inputs, tokenizer, seq_length=..., "
                "image_processor=...) for image-text records, or `seqpack pack` (it expands images).",
            )


def _chunks(records: Iterator[RawRecord], name: str, size: int) -> Iterator[list[tuple[RawRecord, str]]]:
    """Consecutive runs of ``size`` ``(record, sample id)`` pairs."""
    chunk: list[tuple[RawRecord, str]] = []
    for raw in records:
        chunk.append((raw, f"{name}:{raw.index}"))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def display_names(items: list[Any]) -> list[str]:
    """Provenance prefix of the sample ids, one per input (``items`` from ``expand_inputs``, where a
    file reached twice is already listed once).

    A file is named by its file name; files sharing a file name (``a/x.json``, ``b/x.json``) by the
    shortest suffix of their absolute paths that tells them apart (``"a/x.json"``, ``"b/x.json"``). A
    dataset is named by its name, suffixed ``[k]`` (k = 0, 1, ... in input order) where several inputs
    share it. The returned names are unique, so sample ids ``"<name>:<index>"`` are unique.
    """
    is_file = [not (is_dataset(it) or isinstance(it, (InMemoryRecords, LlamaFactorySource))) for it in items]
    base = [
        Path(it).name if f else it.name if isinstance(it, (InMemoryRecords, LlamaFactorySource)) else dataset_name(it)
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


class RecordCounts:
    """Progress totals: the number of records in a list of inputs, known or estimated.

    Counted when cheap at construction: lengths of datasets and record lists, non-blank lines of
    ``.jsonl`` files (one read pass, no parsing). A ``.json`` array is counted when it is parsed
    (:meth:`learn`, from ``iter_records(on_count=...)``); until then it is estimated from its size in bytes
    at the records per byte of the ``.json`` files already parsed. :meth:`total` is ``None`` while some
    input can be neither counted nor estimated (an ``IterableDataset``, or no ``.json`` file parsed yet).
    """

    def __init__(self, items: list[Any]) -> None:
        self.counts: list[int | None] = [_cheap_count(it) for it in items]
        self.sizes = [os.path.getsize(it) if c is None and _is_json_file(it) else None
                      for it, c in zip(items, self.counts)]

    def learn(self, i: int, n: int) -> None:
        """Input ``i`` holds ``n`` records."""
        self.counts[i] = int(n)

    def total(self) -> int | None:
        """Records in all inputs (estimated for ``.json`` files not yet parsed), or ``None``."""
        known = sum(c for c in self.counts if c is not None)
        missing = [i for i, c in enumerate(self.counts) if c is None]
        if not missing:
            return known
        parsed = [(c, b) for c, b in zip(self.counts, self.sizes) if c is not None and b]
        if any(self.sizes[i] is None for i in missing) or not parsed:
            return None
        per_byte = sum(c for c, _ in parsed) / sum(b for _, b in parsed)
        return known + sum(round(self.sizes[i] * per_byte) for i in missing)


def _is_json_file(it: Any) -> bool:
    return isinstance(it, (str, os.PathLike)) and str(it).lower().endswith(".json") and os.path.isfile(it)


def _cheap_count(it: Any) -> int | None:
    """Records of one input when known without parsing it (see :class:`RecordCounts`), else ``None``."""
    if isinstance(it, InMemoryRecords):
        return len(it)
    if isinstance(it, (str, os.PathLike)):
        if str(it).lower().endswith(".jsonl") and os.path.isfile(it):
            with open(it, "rb") as f:
                return sum(1 for _, line in jsonl_lines(f) if line.strip())
        return None
    if not is_dataset(it):
        return None
    try:
        return len(it)
    except TypeError:  # IterableDataset
        return None
