"""The schema of ``metadata.json`` (pydantic, imported lazily): every key a reader relies on has its type
and range checked before a ``PackedMetadata`` is built, so a malformed or crafted file is one
``PackedDatasetError`` naming the keys, never a traceback from deep inside the reader.

Checked beyond types: sizes and counts are non-negative, ``seq_length``, the pad multiple and the CP
size are >= 1 and ``effective_pad_multiple`` equals ``compute_pad_multiple(pad_to_multiple_of,
context_parallel_size)``; shard and dataset hashes are letters and digits only (they name cache files); shard files are relative paths inside ``data/``
(no ``..``, no absolute path, no other folder), so a reader and its Arrow cache never leave the dataset.
"""

from __future__ import annotations

import re
from typing import Any

from seqpack.io.metadata import DATA_DIR, PackedDatasetError
from seqpack.padding import compute_pad_multiple

__all__ = ["SHARD_FILE", "check_metadata"]

#: A shard's file name relative to the dataset root, as the writer names it.
SHARD_FILE = re.compile(rf"^{DATA_DIR}/[A-Za-z0-9][A-Za-z0-9._-]*\.parquet$")
_HASH = r"^[0-9A-Za-z]{1,128}$"  # a content hash: letters and digits only (it names cache files)

_MODEL = None


def _model():
    global _MODEL
    if _MODEL is not None:
        return _MODEL
    from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, \
        model_validator

    NonNeg = Field(ge=0)

    class Shard(BaseModel):
        model_config = ConfigDict(extra="forbid")
        file: StrictStr
        num_rows: StrictInt = NonNeg
        num_bytes: StrictInt = NonNeg
        sha256: StrictStr | None = Field(default=None, pattern=_HASH)

        @field_validator("file")
        @classmethod
        def _inside(cls, v: str) -> str:
            if not SHARD_FILE.match(v) or ".." in v.split("/"):
                raise ValueError(f"shard file {v!r} is not a Parquet file inside {DATA_DIR}/ "
                                 f"(expected like {DATA_DIR}/shard-00000.parquet)")
            return v

    class Metadata(BaseModel):
        model_config = ConfigDict(extra="allow")
        format_version: StrictInt = Field(ge=1)
        seq_length: StrictInt = Field(ge=1)
        pad_to_multiple_of: StrictInt = Field(default=1, ge=1)
        context_parallel_size: StrictInt = Field(default=1, ge=1)
        effective_pad_multiple: StrictInt = Field(default=1, ge=1)
        algorithm: StrictStr = ""
        seed: StrictInt = 0
        overlength: StrictStr = "truncate"
        train_on: StrictStr = "assistant"
        on_error: StrictStr = "raise"
        format: StrictStr | None = None
        tokenizer: StrictStr | None = None
        tokenizer_hash: StrictStr | None = None
        chat_template_hash: StrictStr | None = None
        pad_token_id: StrictInt | None = Field(default=None, ge=0)
        counts: dict[str, Any] = {}
        num_packs: StrictInt = NonNeg
        lower_bound: StrictInt = NonNeg
        packing_efficiency: float = Field(default=0.0, ge=0.0, le=1.0)
        packing_factor: float = Field(default=0.0, ge=0.0)
        max_samples_per_bin: StrictInt = NonNeg
        dataset_max_seqlen: StrictInt = NonNeg
        min_packed_seqlen: StrictInt = NonNeg
        fingerprint: StrictStr | None = Field(default=None, pattern=_HASH)
        inputs: list[dict[str, Any]] = []
        shards: list[Shard] = []
        columns: list[StrictStr] = []
        seqpack_version: StrictStr = ""
        created_at: StrictStr = ""
        media: dict[str, Any] | None = None
        extra: dict[str, Any] = {}
        capacity: StrictInt | None = None

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

    _MODEL = Metadata
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
