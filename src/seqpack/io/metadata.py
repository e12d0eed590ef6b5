"""``metadata.json`` of an offline packed dataset: what was packed, how, and from what.

The file is the last thing written (see :mod:`seqpack.io.writer`), so its presence marks a complete
dataset. Keys follow the field's names (Megatron-Bridge's packed metadata uses ``max_samples_per_bin``,
``dataset_max_seqlen`` and ``min_packed_seqlen``; we keep those names).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from seqpack.padding import compute_pad_multiple

__all__ = [
    "CACHE_DIR",
    "SHARD_FILE",
    "check_metadata",
    "FORMAT_VERSION",
    "is_packed_dataset",
    "METADATA_FILE",
    "REPORT_FILE",
    "REPORT_PNG",
    "PackedMetadata",
    "ShardInfo",
    "PackedDatasetError",
    "StalePackedDatasetError",
]

#: Version of the on-disk layout. Bump on any incompatible change of columns or metadata keys.
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
REPORT_FILE = "report.jsonl"
REPORT_PNG = "report.png"  # written by ``seqpack inspect`` (seqpack.io.summary.plot_report)
DATA_DIR = "data"
CACHE_DIR = ".cache"  # the reader's Arrow cache inside a dataset (seqpack.io.cache)


def is_packed_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a seqpack packed dataset folder: a folder holding a ``metadata.json`` file (the
    file a finished pack writes last; whether the dataset is whole is ``load_packed``'s check)."""
    return Path(path).is_dir() and (Path(path) / METADATA_FILE).is_file()


class PackedDatasetError(ValueError):
    """A packed-dataset directory is missing, incomplete, corrupt or of an unknown format."""


class StalePackedDatasetError(PackedDatasetError):
    """A packed dataset was built with settings that differ from what the caller expects (case B23)."""

    def __init__(self, path: str, diffs: dict[str, tuple[Any, Any]]):
        self.path = str(path)
        self.diffs = dict(diffs)
        lines = [f"  {k}: stored {stored!r}, expected {want!r}" for k, (stored, want) in diffs.items()]
        super().__init__(
            f"packed dataset {path} was built with different settings ({len(diffs)} key(s) differ):\n"
            + "\n".join(lines)
            + "\nFix: re-pack with the expected settings (seqpack pack ... --overwrite), or point to a "
            "dataset packed for this configuration."
        )


@dataclass
class ShardInfo:
    """One Parquet shard: file name relative to the dataset root, number of rows (packs)."""

    file: str
    num_rows: int
    num_bytes: int = 0
    sha256: str | None = None


@dataclass
class PackedMetadata:
    """Everything ``metadata.json`` records.

    Units: all lengths and counts of tokens are in tokens; ``packing_efficiency`` is real tokens /
    (``num_packs`` * ``seq_length``) in [0, 1]; ``packing_factor`` is samples per pack.

    Attributes:
        format_version: on-disk layout version (:data:`FORMAT_VERSION`).
        seqpack_version: version of seqpack that wrote the dataset.
        seq_length: capacity of every pack in tokens (``capacity``).
        pad_to_multiple_of: the user's multiple (Megatron-Bridge ``pad_seq_to_mult``).
        context_parallel_size: CP size the data was padded for.
        effective_pad_multiple: ``compute_pad_multiple(pad_to_multiple_of, context_parallel_size)``;
            every padded segment length is divisible by it.
        algorithm, seed: the packing algorithm (a ``PackingAlgorithm`` value) and its seed.
        overlength, train_on, on_error, format: the data-preparation policies used.
        tokenizer, tokenizer_hash, chat_template_hash: tokenizer name/path, sha256 of its files, sha256
            of its chat template.
        pad_token_id: id stored in alignment/tail padding slots.
        counts: ``records_read``, ``samples_packed``, ``tokens``, ``trainable_tokens``,
            ``padding_tokens`` and ``dropped``/``skipped``/``truncated``/``split``: ``{reason: n}``.
        num_packs, lower_bound: packs produced and the lower bound on the number of packs.
        packing_efficiency, packing_factor, max_samples_per_bin, dataset_max_seqlen,
        min_packed_seqlen: packing statistics (``min_packed_seqlen`` = fewest real tokens in a pack).
        fingerprint: sha256 of the inputs' contents + every setting above that changes the output.
        report_sha256: sha256 of ``report.jsonl``.
        metadata_sha256: sha256 of every other key (``seqpack.io.fingerprint.metadata_digest``), so
            ``load_packed(verify=True)`` finds an edit to any of them.
        inputs: ``[{path, bytes, sha256}]`` for every input.
        shards: the Parquet shards, in row order.
        columns: the column names stored per row.
        created_at: ``SOURCE_DATE_EPOCH`` as ISO-8601 UTC when it was set, else ``""`` (no wall clock:
            equal inputs give a byte-identical file; :func:`seqpack.io.writer.created_at`).
        media: ``None`` for text-only datasets; for image-text data: ``image_processor`` (the full
            JSON settings of the Qwen2-VL image processor used, enough to rebuild it with
            ``seqpack.data.media.load_image_processor``), ``min_pixels``, ``max_pixels``,
            ``patch_size``, ``merge_size``, ``temporal_patch_size``, the vision token ids
            (``image_pad_id``, ``vision_start_id``, ``vision_end_id``) and the counts ``images``,
            ``image_tokens``, ``samples_with_images``, and the media root the stored image paths are
            relative to: ``media_root`` (absolute) and ``media_root_relative`` (from the dataset folder),
            outside the fingerprint (``seqpack.io.media``). Pixels are not stored (the per-pack
            ``media`` column holds image paths and ``image_grid_thw``).
    """

    seq_length: int
    pad_to_multiple_of: int = 1
    context_parallel_size: int = 1
    effective_pad_multiple: int = 1
    algorithm: str = ""
    seed: int = 0
    overlength: str = "truncate"
    train_on: str = "assistant"
    on_error: str = "raise"
    format: str | None = None
    tokenizer: str | None = None
    tokenizer_hash: str | None = None
    chat_template_hash: str | None = None
    pad_token_id: int | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    num_packs: int = 0
    lower_bound: int = 0
    packing_efficiency: float = 0.0
    packing_factor: float = 0.0
    max_samples_per_bin: int = 0
    dataset_max_seqlen: int = 0
    min_packed_seqlen: int = 0
    fingerprint: str | None = None
    inputs: list[dict[str, Any]] = field(default_factory=list)
    shards: list[ShardInfo] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    seqpack_version: str = ""
    created_at: str = ""
    media: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    report_sha256: str | None = None
    metadata_sha256: str | None = None

    @property
    def capacity(self) -> int:
        """Alias of :attr:`seq_length` (the bin capacity in tokens)."""
        return self.seq_length

    def listed_files(self) -> set[str]:
        """The dataset's own files in ``data/``: its shards' paths relative to the dataset folder, as
        POSIX strings (``{"data/shard-00000.parquet", ...}``). Any other file in ``data/`` was not written
        by the packing run this metadata describes."""
        return {Path(s.file).as_posix() for s in self.shards}

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-able values, plus ``capacity`` (= ``seq_length``)."""
        d = asdict(self)
        d["capacity"] = self.seq_length
        return d

    def to_json(self) -> str:
        """The ``metadata.json`` text (indented, fields in declaration order, trailing newline)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=_json_default) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, path: str | Path = "<dict>") -> "PackedMetadata":
        """Build from a parsed ``metadata.json``; unknown keys go to ``extra``.

        Raises:
            PackedDatasetError: ``format_version`` missing or newer than this seqpack understands,
                a required key (``seq_length``) is missing, or a key fails the schema
                (seqpack.io.metadata.check_metadata: types, ranges, the pad multiple, shard paths inside ``data/``).
        """
        if not isinstance(d, dict):
            raise PackedDatasetError(f"{path}: metadata must be a JSON object, got {type(d).__name__}")
        version = d.get("format_version")
        if version is None:
            raise PackedDatasetError(f"{path}: no 'format_version'; this is not a seqpack packed dataset")
        if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise PackedDatasetError(
                f"{path}: format_version {version!r} is not supported by this seqpack "
                f"(supports 1..{FORMAT_VERSION}); upgrade seqpack or re-pack the data"
            )
        if "seq_length" not in d:
            raise PackedDatasetError(f"{path}: metadata has no 'seq_length'")
        check_metadata(d, path)
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        extra = dict(kwargs.pop("extra", {}) or {})
        extra.update({k: v for k, v in d.items() if k not in known and k != "capacity"})
        kwargs["shards"] = [ShardInfo(**s) for s in kwargs.get("shards", [])]
        return cls(**kwargs, extra=extra)

    @classmethod
    def read(cls, directory: str | Path) -> "PackedMetadata":
        """Read ``DIR/metadata.json``.

        Raises:
            PackedDatasetError: the file is missing (incomplete or interrupted write) or a directory, a
                symlink to a file outside ``DIR``, or not valid JSON.
        """
        p = Path(directory) / METADATA_FILE
        if not p.is_file():
            d = Path(directory)
            if d.is_dir() and (d / DATA_DIR).is_dir() and not [x for x in d.iterdir() if x.name != DATA_DIR]:
                fix = (f"it looks like an incomplete dataset; delete {d} and pack again, or pack into a new "
                       "directory: `seqpack pack ... --output NEW_DIR`")
            else:
                fix = ("pack into a new directory: `seqpack pack ... --output NEW_DIR` (seqpack pack never "
                       "replaces a directory that is not a packed dataset, even with --overwrite)")
            what = "is a directory, not a file" if p.is_dir() else "is missing"
            raise PackedDatasetError(
                f"{directory} is not a complete seqpack packed dataset: {METADATA_FILE} {what} "
                f"(a finished `seqpack pack` always writes it last). Fix: check the path, or {fix}."
            )
        real, root = p.resolve(), Path(directory).resolve()
        if not real.is_relative_to(root):
            raise PackedDatasetError(
                f"{p} is a symlink to {real}, outside the dataset folder; seqpack reads a dataset's "
                f"{METADATA_FILE} only from inside it. Fix: copy the file in (`cp --remove-destination {real} {p}`)")
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, huge integers, deep nesting
            raise PackedDatasetError(f"{p}: not valid JSON ({type(e).__name__}: {str(e)[:200]}); re-pack the data") from None
        return cls.from_dict(d, path=p)


def _json_default(o: Any) -> Any:
    # numpy scalars / arrays, Paths
    if hasattr(o, "item") and callable(o.item) and getattr(o, "shape", None) == ():
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ---------------------------------------------------------------- the schema (pydantic, imported lazily)
# The schema of ``metadata.json`` (pydantic, imported lazily): every key a reader relies on has its type
# and range checked before a ``PackedMetadata`` is built, so a malformed or crafted file is one
# ``PackedDatasetError`` naming the keys, never a traceback from deep inside the reader.
# 
# Checked beyond types: sizes and counts are non-negative, ``seq_length``, the pad multiple and the CP
# size are >= 1 and ``effective_pad_multiple`` equals ``compute_pad_multiple(pad_to_multiple_of,
# context_parallel_size)``; shard and dataset hashes are letters and digits only (they name cache files); shard files are relative paths inside ``data/``
# (no ``..``, no absolute path, no other folder), so a reader and its Arrow cache never leave the dataset.

#: A shard's file name relative to the dataset root, as the writer names it.
SHARD_FILE = re.compile(rf"^{DATA_DIR}/[A-Za-z0-9][A-Za-z0-9._-]*\.parquet$")
_HASH = r"^[0-9A-Za-z]{1,128}$"  # a content hash: letters and digits only (it names cache files)

#: What the schema adds to the dataclass fields (names, types and defaults come from :class:`ShardInfo` /
#: :class:`PackedMetadata` themselves, so a new field is checked without being listed twice).
_SHARD_BOUNDS = {"num_rows": {"ge": 0}, "num_bytes": {"ge": 0}, "sha256": {"pattern": _HASH}}
_METADATA_BOUNDS = {
    **{k: {"ge": 1} for k in ("format_version", "seq_length", "pad_to_multiple_of", "context_parallel_size",
                              "effective_pad_multiple")},
    **{k: {"ge": 0} for k in ("pad_token_id", "num_packs", "lower_bound", "max_samples_per_bin",
                              "dataset_max_seqlen", "min_packed_seqlen", "packing_factor")},
    "packing_efficiency": {"ge": 0.0, "le": 1.0},
    **{k: {"pattern": _HASH} for k in ("fingerprint", "report_sha256", "metadata_sha256")},
}

_MODEL = None


def _schema_type(tp: Any, shard_model: Any) -> Any:
    """The strict pydantic type of a dataclass annotation (``int`` takes no ``bool`` / ``str``)."""
    import types
    import typing

    from pydantic import StrictInt, StrictStr

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is int:
        return StrictInt
    if tp is str:
        return StrictStr
    if tp in (float, Any, type(None)):
        return tp
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_schema_type(a, shard_model) for a in args)]
    if origin is list:
        return list[shard_model] if args[0] is ShardInfo else list[_schema_type(args[0], shard_model)]
    if origin is dict:
        return dict[str, Any]
    raise TypeError(f"metadata schema: no rule for the annotation {tp!r}")


def _schema_fields(cls: type, bounds: dict[str, dict[str, Any]], shard_model: Any = None) -> dict[str, Any]:
    """``create_model`` field definitions for every field of the dataclass ``cls``, with ``bounds`` added."""
    import dataclasses
    import typing

    from pydantic import Field

    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = ...
        out[f.name] = (_schema_type(hints[f.name], shard_model), Field(default, **bounds.get(f.name, {})))
    return out


def _model():
    global _MODEL
    if _MODEL is not None:
        return _MODEL
    from pydantic import BaseModel, ConfigDict, StrictInt, create_model, field_validator, model_validator

    class _ShardChecks(BaseModel):
        model_config = ConfigDict(extra="forbid")

        @field_validator("file", check_fields=False)
        @classmethod
        def _inside(cls, v: str) -> str:
            if not SHARD_FILE.match(v) or ".." in v.split("/"):
                raise ValueError(f"shard file {v!r} is not a Parquet file inside {DATA_DIR}/ "
                                 f"(expected like {DATA_DIR}/shard-00000.parquet)")
            return v

    class _MetadataChecks(BaseModel):
        model_config = ConfigDict(extra="allow")

        @field_validator("media", check_fields=False)
        @classmethod
        def _media_root(cls, v: dict | None) -> dict | None:
            for key in ("media_root", "media_root_relative"):
                if v is not None and v.get(key) is not None and not (isinstance(v[key], str) and v[key]):
                    raise ValueError(f"media.{key} must be a non-empty path string, got {v[key]!r}")
            return v

        @model_validator(mode="after")
        def _consistent(self):
            m = compute_pad_multiple(self.pad_to_multiple_of, self.context_parallel_size)
            if self.effective_pad_multiple != m:
                raise ValueError(
                    f"effective_pad_multiple={self.effective_pad_multiple} but pad_to_multiple_of="
                    f"{self.pad_to_multiple_of} and context_parallel_size={self.context_parallel_size} give {m}")
            if self.capacity is not None and self.capacity != self.seq_length:
                raise ValueError(f"capacity={self.capacity} differs from seq_length={self.seq_length}")
            if self.seq_length % m:
                raise ValueError(f"seq_length={self.seq_length} is not a multiple of effective_pad_multiple={m}")
            files = [s.file for s in self.shards]
            if len(set(files)) != len(files):
                raise ValueError("a shard file is listed twice")
            return self

    shard = create_model("Shard", __base__=_ShardChecks, **_schema_fields(ShardInfo, _SHARD_BOUNDS))
    _MODEL = create_model("Metadata", __base__=_MetadataChecks, capacity=(StrictInt | None, None),
                          **_schema_fields(PackedMetadata, _METADATA_BOUNDS, shard))
    return _MODEL


def check_metadata(d: Any, path: Any = "<dict>") -> None:
    """Validate a parsed ``metadata.json`` against the schema (module docstring).

    Raises:
        PackedDatasetError: naming the file and every invalid key with what is wrong
            (``shards.0.file: ...``); the fix is to re-pack the data.
    """
    from pydantic import ValidationError

    try:
        _model().model_validate(d)
    except ValidationError as e:
        problems = []
        for err in e.errors()[:10]:
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            problems.append(f"{loc}: {err['msg']}")
        more = f" (and {e.error_count() - 10} more)" if e.error_count() > 10 else ""
        raise PackedDatasetError(
            f"{path}: metadata.json is not valid: " + "; ".join(problems) + more
            + ". It was edited or damaged; re-pack the data (seqpack pack ... --overwrite)") from None
