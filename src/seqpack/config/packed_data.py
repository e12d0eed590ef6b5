"""Does a stored packed dataset fit a config? (case B23: stale packed data)

:func:`check_packed_data` reads a packed dataset's metadata only and compares the settings that
change the rows' tensor contract (``PackingConfig.packed_data_expectations``) and the tokenizer identity
(:func:`seqpack.config.tokenizers.compare_tokenizer`) with the config's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqpack.config.errors import ConfigValidationError, Violation
from seqpack.config.tokenizers import compare_tokenizer
from seqpack.padding import compute_pad_multiple

__all__ = ["PackedDataCheck", "check_packed_data"]


@dataclass(frozen=True)
class PackedDataCheck:
    """Result of :meth:`PackingConfig.check_packed_data`.

    Attributes:
        path: the packed dataset directory checked (None: no path given or configured).
        violations: ``[]`` or one ``stale_packed_data`` / ``packed_data_unreadable`` violation.
        notes: differences that do not make the data stale, and how the tokenizer was compared.
    """

    path: str | None
    violations: list[Violation]
    notes: list[str]


def check_packed_data(cfg: Any, path: str | Path | None = None) -> PackedDataCheck:
    """``PackingConfig.check_packed_data`` (documented there) for the config ``cfg``.

    ``cfg`` is a :class:`~seqpack.config.PackingConfig` (its fields, ``effective_pad_multiple`` and
    ``packed_data_expectations()`` are read); ``path`` defaults to ``cfg.packed_dataset_path``.
    """
    p = path if path is not None else cfg.packed_dataset_path
    if p is None:
        return PackedDataCheck(None, [], [])
    p = str(p)
    # seqpack.io imports pyarrow (any seqpack.io.* import runs its __init__): deferred so that loading
    # and validating a config (and `import seqpack`) stays light
    from seqpack.io import PackedDatasetError, PackedMetadata, StalePackedDatasetError, load_packed

    try:
        try:
            meta = load_packed(p, expect=cfg.packed_data_expectations(), memory_map=False).metadata
            diffs: dict[str, tuple[Any, Any]] = {}
        except StalePackedDatasetError as e:
            diffs = dict(e.diffs)
            meta = PackedMetadata.read(p)
    except (PackedDatasetError, OSError) as e:
        return PackedDataCheck(p, [Violation("packed_data_unreadable", ("packed_dataset_path",), str(e),
                                             "run `seqpack pack` for this config, or fix packed_dataset_path")],
                               [])
    problems = [f"{k}: stored {s!r} vs config {w!r}" for k, (s, w) in diffs.items()]
    keys = list(diffs)
    notes: list[str] = []
    if meta.algorithm and meta.algorithm != cfg.algorithm:
        notes.append(f"algorithm: stored {meta.algorithm!r} vs config {cfg.algorithm!r}; this changes which "
                     "samples share a row, not the row format, so the data is not stale")
    if meta.pad_to_multiple_of != cfg.pad_to_multiple_of and "effective_pad_multiple" not in diffs:
        notes.append(f"pad_to_multiple_of: stored {meta.pad_to_multiple_of} vs config {cfg.pad_to_multiple_of}, "
                     f"same effective pad multiple {cfg.effective_pad_multiple}; not stale")
    if cfg.tokenizer is not None:
        cmp = compare_tokenizer(cfg.tokenizer, meta.tokenizer, meta.tokenizer_hash, meta.chat_template_hash)
        if cmp.same is False:
            problems.append(cmp.detail)
            keys.append("tokenizer")
        else:
            notes.append(cmp.detail)
    if not problems:
        return PackedDataCheck(p, [], notes)
    fix = ("re-pack with this config (seqpack pack ... --overwrite) or point packed_dataset_path at data "
           "packed for it")
    if "tokenizer" in keys:
        fix += (f"; if it is the same tokenizer, set tokenizer: to the name or local folder used for packing "
                f"({meta.tokenizer!r}) so the hashes can be compared")
    return PackedDataCheck(p, [Violation("stale_packed_data", ("packed_dataset_path", *keys),
                                         f"{p} was packed with other settings ({'; '.join(problems)})",
                                         fix, case="B23")], notes)


def pack_options(cfg: Any, *, source: str | None = None) -> dict[str, Any]:
    """:meth:`seqpack.config.PackingConfig.pack_options` (documented there)."""
    found = []
    if getattr(cfg.packing, "value", cfg.packing) != "offline":
        found.append(Violation(
            "pack_config", ("packing",),
            f"packing is {cfg.packing.value!r}: this config packs at training time (or not at all), "
            "while `seqpack pack` / pack_dataset write an offline packed dataset",
            "set `packing: offline` to pack ahead of training, or use the config with the collator / "
            "seqpack.stream it was written for"))
    if cfg.packing_buffer_size is not None:
        found.append(Violation(
            "pack_config", ("packing_buffer_size",),
            "packing_buffer_size is a streaming setting; offline packing plans over the whole dataset",
            "remove packing_buffer_size"))
    if found:
        raise ConfigValidationError(found, source=source)
    own = compute_pad_multiple(cfg.pad_to_multiple_of, cfg.context_parallel_size)
    opts: dict[str, Any] = {
        "seq_length": cfg.seq_length,
        "pad_to_multiple_of": cfg.pad_to_multiple_of if own == cfg.effective_pad_multiple
        else cfg.effective_pad_multiple,
        "context_parallel_size": cfg.context_parallel_size,
        "algorithm": cfg.algorithm,
    }
    for key, value in (("tokenizer", cfg.tokenizer), ("train_on", cfg.train_on),
                       ("output", cfg.packed_dataset_path)):
        if value is not None:
            opts[key] = value
    return opts
