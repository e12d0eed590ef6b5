"""``PackJob``: every setting of an offline pack job, in one object, validated before any data is read.

Both engines (:mod:`seqpack.pipeline.local`, :mod:`seqpack.pipeline.ray`) build one with
:meth:`PackJob.create` and hand it to the stages (:mod:`seqpack.pipeline.stages`); the metadata
settings (and so the fingerprint) come from it (:meth:`PackJob.metadata_settings`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from seqpack.algorithms import MAX_CAPACITY_UNITS, PackingAlgorithm, resolve_algorithm
from seqpack.data.chat_template import TRAIN_ON
from seqpack.data.formats import FORMATS
from seqpack.data.length_policy import OVERLENGTH_POLICIES
from seqpack.data.media.images import PixelBoundsError, load_image_processor, processor_settings
from seqpack.data.media_root import MediaRoot, common_media_root
from seqpack.data.prepare import ON_ERROR
from seqpack.data.sources import dedupe_paths, expand_inputs, expand_named
from seqpack.data.tokenizer import check_tokenizer_type
from seqpack.io.metadata import FORMAT_VERSION
from seqpack.io.fingerprint import FINGERPRINT_SETTINGS
from seqpack.io.output_dir import check_inputs_outside, check_output_dir
from seqpack.padding import check_positive_int, check_seq_length, compute_pad_multiple
from seqpack.pipeline.packed_input import refuse_packed_input

__all__ = [
    "NothingToPackError",
    "PackConfigError",
    "PackJob",
    "dedupe_inputs",
    "processor_settings",
    "resolve_image_processor",
    "sample_data_path",
]


class PackConfigError(ValueError):
    """Invalid packing settings (the message names the config keys and the fix)."""


class NothingToPackError(ValueError):
    """Every input record was dropped or skipped; the message gives the counts per reason."""


def sample_data_path() -> Path:
    """Path of the embedded demo dataset ``seqpack/resources/sample_chat.jsonl`` (40 OpenAI-format
    chats written for seqpack: system prompts, multi-turn, tool calls with ``tools``)."""
    return Path(str(resources.files("seqpack") / "resources" / "sample_chat.jsonl"))


@dataclass(frozen=True)
class PackJob:
    """Every setting of one offline pack job (build it with :meth:`create`, which validates).

    Attributes:
        inputs: the expanded inputs (``Path`` objects, datasets, ``InMemoryRecords``), each file once.
        output: the dataset directory to create.
        tokenizer: tokenizer name/path or a loaded tokenizer (loaded by ``stages.open_tokenizer``).
        seq_length: pack capacity in tokens.
        algorithm: the planner's :class:`~seqpack.algorithms.PackingAlgorithm`.
        pad_to_multiple_of, context_parallel_size: as given (recorded in the metadata).
        pad_multiple: the one effective per-segment multiple (``compute_pad_multiple``) used by the
            planner, the row builder, the validator and the metadata (case B24: one pad multiple).
        overlength, on_error, train_on: data-preparation policies.
        format: a forced record format, or ``None`` to detect per record (``"auto"``).
        seed: planner seed.
        overwrite, rows_per_shard, validate: writer settings (replace, packs per shard, check rows).
        image_processor: the image processor given for image records, or ``None`` (transformers'
            Qwen2-VL defaults, built when the first image sample is met).
        num_proc: processes that prepare records in the local engine, or ``None`` (automatic:
            ``seqpack.data.workers.PreparePool``); not a metadata setting (same output for every value).
        media_dir, allow_any_media_path, media_root: the explicit media root or ``None`` (each data file's
            folder), the opt-out of its check, and the folder stored image paths are relative to
            (``seqpack.data.media_root``; in ``metadata.json`` outside the fingerprint).
    """

    inputs: tuple
    output: Path
    tokenizer: Any
    seq_length: int
    algorithm: PackingAlgorithm
    pad_to_multiple_of: int
    context_parallel_size: int
    pad_multiple: int
    overlength: str
    on_error: str
    train_on: str
    format: str | None
    seed: int
    overwrite: bool
    rows_per_shard: int
    validate: bool
    image_processor: Any = None
    num_proc: int | None = None
    media_dir: Path | None = None
    allow_any_media_path: bool = False
    media_root: Path | None = None

    @classmethod
    def create(
        cls,
        inputs: Any = None,
        output: str | os.PathLike = "packed",
        *,
        tokenizer: Any = "qwen3",
        seq_length: int = 4096,
        algorithm: Any = None,
        pad_to_multiple_of: int = 1,
        context_parallel_size: int = 1,
        overlength: str = "truncate",
        on_error: str = "raise",
        train_on: str = "assistant",
        seed: int = 0,
        format: str | None = "auto",
        overwrite: bool = False,
        rows_per_shard: int = 2048,
        validate: bool = True,
        image_processor: Any = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        num_proc: int | None = None,
        media_dir: str | os.PathLike | None = None,
        allow_any_media_path: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> "PackJob":
        """Validate every setting (in this order: capacity and pad multiple, algorithm, policies, output
        directory, image processor, inputs) and return the job. Arguments as
        :func:`seqpack.pipeline.pack_dataset` (``num_proc`` default ``None``: the cores available to
        this process once the input is large enough); ``log`` receives one line per repeated input file.

        Raises:
            PackConfigError: invalid settings (names the keywords; :func:`seqpack.pipeline.cli_text.cli_message` names the flags).
            TypeError: ``tokenizer`` is neither a name/path nor a loaded tokenizer.
            FileExistsError: ``output`` exists and ``overwrite`` is False, or an input lies inside it.
            FileNotFoundError / DataFormatError: a missing input, an empty glob, a directory.
        """
        m = _check_capacity(seq_length, pad_to_multiple_of, context_parallel_size)
        check_tokenizer_type(tokenizer)
        try:
            algo = resolve_algorithm(algorithm)
        except ValueError as e:
            raise PackConfigError(f"algorithm={algorithm!r}: {e}") from None
        _check_policies(overlength=overlength, on_error=on_error, train_on=train_on, format=format)
        num_proc = _check_num_proc(num_proc)
        output = check_output_dir(output, overwrite)
        proc = None
        if image_processor is not None or min_pixels is not None or max_pixels is not None:
            proc = resolve_image_processor(image_processor, min_pixels=min_pixels, max_pixels=max_pixels)
        try:
            media = MediaRoot.create(media_dir, allow_any_media_path)
        except ValueError as e:
            raise PackConfigError(str(e)) from None
        items = dedupe_inputs(_input_list(inputs), log)
        check_inputs_outside(output, items)
        return cls(
            inputs=tuple(items), output=output, tokenizer=tokenizer, seq_length=seq_length, algorithm=algo,
            pad_to_multiple_of=pad_to_multiple_of, context_parallel_size=context_parallel_size, pad_multiple=m,
            overlength=overlength, on_error=on_error, train_on=train_on,
            format=None if format in (None, "auto") else format, seed=seed, overwrite=overwrite,
            rows_per_shard=rows_per_shard, validate=validate, image_processor=proc, num_proc=num_proc,
            media_dir=media.root, allow_any_media_path=media.allow_any,
            media_root=common_media_root(media.root, items),
        )

    def metadata_settings(
        self, *, tokenizer_hash: str | None, chat_template_hash: str | None, pad_token_id: int
    ) -> dict[str, Any]:
        """The ``settings`` dict of ``metadata.json`` (every key enters the fingerprint), with the
        tokenizer facts found when it was loaded; its keys are :data:`seqpack.io.fingerprint.FINGERPRINT_SETTINGS`."""
        settings = {
            "format_version": FORMAT_VERSION,
            "seq_length": int(self.seq_length),
            "pad_to_multiple_of": int(self.pad_to_multiple_of),
            "context_parallel_size": int(self.context_parallel_size),
            "effective_pad_multiple": int(self.pad_multiple),
            "algorithm": self.algorithm.value,
            "seed": int(self.seed),
            "overlength": self.overlength,
            "train_on": self.train_on,
            "on_error": self.on_error,
            "format": self.format,
            "tokenizer_hash": tokenizer_hash,
            "chat_template_hash": chat_template_hash,
            "pad_token_id": pad_token_id,
        }
        assert tuple(settings) == FINGERPRINT_SETTINGS, "metadata_settings and FINGERPRINT_SETTINGS must list the same keys"
        return settings


def _check_capacity(seq_length: int, pad_to_multiple_of: int, context_parallel_size: int) -> int:
    """Check ``seq_length`` and the pad multiple; return the effective multiple.

    Checks (each error names the keyword): ``seq_length`` is an
    integer >= 1 that fits the int32 boundary arrays; the multiple ``compute_pad_multiple(
    pad_to_multiple_of, context_parallel_size)`` is valid; ``seq_length`` is divisible by it (case
    B23: a capacity the CP split cannot divide); ``seq_length / multiple`` is within
    :data:`seqpack.algorithms.MAX_CAPACITY_UNITS` (the planner keeps O(capacity) tables).

    Raises:
        PackConfigError: any of the above.
    """
    check_positive_int(seq_length, "seq_length", error=PackConfigError)
    if seq_length > np.iinfo(np.int32).max:
        raise PackConfigError(
            f"seq_length={seq_length} does not fit the int32 boundary arrays "
            f"(cu_seqlens); use at most {np.iinfo(np.int32).max}"
        )
    try:
        m = compute_pad_multiple(pad_to_multiple_of, context_parallel_size)
    except ValueError as e:
        raise PackConfigError(f"{e} (pad_to_multiple_of / context_parallel_size)") from None
    check_seq_length(
        seq_length, m, {"pad_to_multiple_of": pad_to_multiple_of, "context_parallel_size": context_parallel_size},
        error=PackConfigError,
    )
    if seq_length // m > MAX_CAPACITY_UNITS:
        need = -(-seq_length // MAX_CAPACITY_UNITS)
        raise PackConfigError(
            f"seq_length={seq_length} / pad multiple {m} = {seq_length // m} units exceeds the "
            f"planner's limit of {MAX_CAPACITY_UNITS} (seqpack.algorithms.MAX_CAPACITY_UNITS; the packing kernels "
            f"keep O(capacity) tables); lower seq_length to at most {MAX_CAPACITY_UNITS * m}, or raise "
            f"pad_to_multiple_of to a value >= {need} that divides seq_length"
        )
    return m


def _check_policies(**given: Any) -> None:
    """Check the data-preparation policies up front (before loading a tokenizer or reading data)."""
    allowed = {
        "overlength": OVERLENGTH_POLICIES,
        "on_error": ON_ERROR,
        "train_on": TRAIN_ON,
        "format": ("auto", None, *FORMATS),
    }
    for key, val in given.items():
        if val not in allowed[key]:
            choices = ", ".join(str(c) for c in allowed[key] if c is not None)
            raise PackConfigError(f"{key}={val!r} is not valid; choose one of: {choices}")


def _check_num_proc(num_proc: Any) -> int | None:
    """``num_proc`` as an int >= 1, or ``None`` (automatic: ``seqpack.data.workers.PreparePool``)."""
    if num_proc is None:
        return None
    if isinstance(num_proc, bool) or not isinstance(num_proc, (int, np.integer)) or num_proc < 1:
        raise PackConfigError(f"num_proc must be an integer >= 1, got {num_proc!r}")
    return int(num_proc)


def _input_list(inputs: Any) -> list[Any]:
    """``inputs`` as a list: ``None`` = the embedded demo data, one path/dataset = a one-item list."""
    if inputs is None:
        return [sample_data_path()]
    if isinstance(inputs, (str, os.PathLike)) or not isinstance(inputs, (list, tuple)):
        return [inputs]
    return list(inputs)


def dedupe_inputs(inputs: Sequence[Any], log: Callable[[str], None] | None = None) -> list[Any]:
    """Expand globs and drop repeated files, keeping the first occurrence (input order kept).

    The same file given twice, or a glob that overlaps an explicit path, would otherwise be read twice
    and every record packed twice (duplicate ``sample_ids``). Files are compared by
    ``os.path.realpath`` (symlinks and ``./a`` vs ``a`` resolve to the same file); in-memory
    datasets/records are never merged. Each dropped repeat is reported through ``log`` (else as a
    WARNING on the ``seqpack.data.sources`` logger), naming both files as they were given.

    Returns:
        the expanded inputs (``Path`` objects, datasets, record lists), without repeats.

    Raises:
        FileNotFoundError / DataFormatError: from ``seqpack.data.sources.expand_inputs`` (missing path,
            empty glob, directory); a seqpack packed dataset, its ``metadata.json`` or a shard of it
            (:func:`seqpack.pipeline.packed_input.refuse_packed_input`).
    """
    inputs = list(inputs)
    if inputs and all(isinstance(x, dict) for x in inputs):  # one list of in-memory records
        return expand_inputs(inputs)
    pairs = []  # (input, name as typed)
    for item in inputs:  # per item: repeats are seen here
        if isinstance(item, (str, os.PathLike)) and Path(item).is_dir():
            refuse_packed_input(item)  # before expand_inputs takes it for a datasets folder
        pairs += expand_named([item])
    for x, _ in pairs:
        refuse_packed_input(x)  # a shard or metadata.json, also when a glob matched it
    return dedupe_paths([x for x, _ in pairs], log, names=[n for _, n in pairs])


def resolve_image_processor(
    image_processor: Any = None, *, min_pixels: int | None = None, max_pixels: int | None = None
) -> Any:
    """Build the Qwen2-VL image processor for image-text records: ``seqpack.data.media.load_image_processor``
    with its errors as :class:`PackConfigError`.

    Args:
        image_processor: ``None`` (transformers' defaults), a ``preprocessor_config.json`` path (or a
            folder holding one), a settings dict, or a processor.
        min_pixels, max_pixels: override the processor's pixel bounds (``size.shortest_edge`` /
            ``size.longest_edge`` in transformers 5: the resized image's area in pixels stays in
            [min_pixels, max_pixels]).

    Raises:
        PackConfigError: the config file is missing/invalid, or the bounds are not 1 <= min <= max
            (names ``image_processor`` / ``min_pixels`` / ``max_pixels``).
    """
    try:
        return load_image_processor(image_processor, min_pixels=min_pixels, max_pixels=max_pixels)
    except PixelBoundsError as e:
        raise PackConfigError(str(e)) from None
    except (FileNotFoundError, json.JSONDecodeError, TypeError, ValueError) as e:
        raise PackConfigError(f"image_processor={image_processor}: {e}") from None
