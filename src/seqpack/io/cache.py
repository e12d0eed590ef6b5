"""The shards of an open packed dataset and their Arrow IPC cache.

Rules:

- Each shard's identity (real path, ``st_dev``, ``st_ino``, ``st_size``, ``st_mtime_ns`` and the sha256
  ``metadata.json`` records for it) is taken when ``load_packed`` checks the shard (:func:`check_shard`).
  When the shard is first read later (lazily, possibly in a DataLoader worker), the file at its path
  must still be that file (:func:`open_shard`); a dataset replaced in place (``seqpack pack --overwrite``)
  or a shard swapped since is a :class:`PackedDatasetError` asking to reopen the dataset, never rows of
  another dataset under the old length.
- A cache file records the identity of the shard it was built from in its Arrow schema metadata
  (``seqpack.source``). It is served only for exactly that shard (and with the recorded row count and
  the reader's columns); otherwise it is rebuilt from the Parquet shard. A cache that cannot be read is
  rebuilt with a one-line warning. Cache names (which come from ``metadata.json``) therefore choose a
  file, never its content.
- The cache goes to ``cache_dir`` if given, else to the dataset's own ``.cache`` folder. A ``.cache``
  that is a symlink (or not a folder) is not followed, and a dataset folder seqpack cannot write falls
  back to this user's private temp cache (``output_dir.private_cache_root``), one sub-folder per dataset
  real path.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import uuid
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from seqpack.io.fingerprint import sha256_file
from seqpack.io.metadata import CACHE_DIR, PackedDatasetError

__all__ = ["CACHE_DIR", "SHARD_COLUMNS", "ShardIdentity", "ShardCache", "check_shard", "is_packed_shard", "open_shard",
           "private_cache_root", "read_shard"]

_SOURCE_KEY = b"seqpack.source"
#: The columns the reader needs of every shard (a Parquet file holding them all is packed rows, not records).
SHARD_COLUMNS = ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded", "sample_ids")
_CACHE_ERRORS = (pa.ArrowException, OSError, KeyError, ValueError, TypeError, IndexError)


@dataclass(frozen=True)
class ShardIdentity:
    """Which file a shard is: ``realpath``, ``st_dev``, ``st_ino``, ``st_size`` (bytes), ``st_mtime_ns``
    (ns), ``num_rows`` and ``sha256`` (hex, as ``metadata.json`` records it; ``None`` if absent)."""

    realpath: str
    st_dev: int
    st_ino: int
    st_size: int
    st_mtime_ns: int
    num_rows: int
    sha256: str | None

    @classmethod
    def of(cls, path: Path, st: os.stat_result, num_rows: int, sha256: str | None) -> "ShardIdentity":
        return cls(os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, int(num_rows), sha256)

    def same_file(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
            self.st_dev, self.st_ino, self.st_size, self.st_mtime_ns)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()


def is_packed_shard(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Parquet file with every column the reader needs of a packed shard
    (:data:`SHARD_COLUMNS`): packed rows, not records. Reads the footer only; a file that is not readable
    Parquet is not a shard."""
    try:
        names = pq.read_schema(path).names
    except (pa.ArrowException, OSError):
        return False
    return set(SHARD_COLUMNS) <= set(names)


def _unreadable(dataset: Path, name: str, e: BaseException) -> PackedDatasetError:
    return PackedDatasetError(
        f"{dataset}: shard {name} is not a readable Parquet file ({type(e).__name__}: {str(e)[:200]}); it was "
        "damaged or replaced after packing. Fix: restore the file, or re-pack the data")


def check_shard(dataset: Path, name: str, *, num_bytes: int, num_rows: int, sha256: str | None,
                verify: bool) -> ShardIdentity:
    """Check one shard at ``dataset/name`` against ``metadata.json`` and return its identity.

    Checks (on one open file handle, so the identity is of the file checked): inside the dataset folder,
    a regular file, ``num_bytes`` bytes (if non-zero), ``num_rows`` rows in its Parquet footer and, with
    ``verify``, the recorded ``sha256``.

    Raises:
        PackedDatasetError: the check that failed, naming the shard and the fix.
    """
    f = dataset / name
    real = f.resolve()
    if not real.is_relative_to(dataset.resolve()):
        raise PackedDatasetError(
            f"{dataset}: shard {name} resolves to {real}, outside the dataset folder (a symlink?); "
            "seqpack reads shards only inside the dataset. Re-pack the data")
    if not f.is_file():
        raise PackedDatasetError(f"{dataset}: {_shard_missing(dataset, name)}; re-pack the data")
    with open(f, "rb") as fh:
        st = os.fstat(fh.fileno())
        if num_bytes and st.st_size != num_bytes:
            raise PackedDatasetError(
                f"{dataset}: shard {name} has {st.st_size} bytes, metadata.json says {num_bytes}; "
                "the file was modified or truncated, re-pack the data")
        if verify:
            if not sha256:
                raise PackedDatasetError(f"{dataset}: shard {name} has no sha256 in metadata.json; cannot verify it")
            got = sha256_file(fh)
            if got != sha256:
                raise PackedDatasetError(
                    f"{dataset}: shard {name} has sha256 {got[:16]}..., metadata.json says {sha256[:16]}...; "
                    "the file was modified or corrupted, re-pack the data")
            fh.seek(0)
        try:
            rows = pq.ParquetFile(fh).metadata.num_rows
        except (pa.ArrowException, OSError) as e:
            raise _unreadable(dataset, name, e) from None
    if rows != num_rows:
        raise PackedDatasetError(f"{dataset}: shard {name} has {rows} rows, metadata.json says {num_rows}")
    return ShardIdentity.of(f, st, rows, sha256)


def _shard_missing(dataset: Path, name: str) -> str:
    """Why shard ``name`` (listed in ``metadata.json``) is not a file in ``dataset``: a folder on its path is a
    file (``data`` replaced by a file), the shard is a directory, or it is missing."""
    for folder in reversed(Path(name).parents[:-1]):  # "data" for "data/shard-00000.parquet"
        if (dataset / folder).exists() and not (dataset / folder).is_dir():
            return f"{folder.as_posix()} is a file, not the shard folder (shard {name} listed in metadata.json is in it)"
    if (dataset / name).is_dir():
        return f"shard {name} listed in metadata.json is a directory, not a file"
    return f"shard {name} listed in metadata.json is missing"


def open_shard(dataset: Path, name: str, ident: ShardIdentity) -> BinaryIO:
    """Open shard ``name`` for reading, refusing a file that is not the one checked at load (``ident``).

    Raises:
        PackedDatasetError: the file at the shard's path is gone or is another file: the dataset was
            replaced (e.g. ``seqpack pack --overwrite``) or altered since it was opened.
    """
    try:
        fh = open(dataset / name, "rb")
    except OSError as e:
        raise _replaced(dataset, name, f"it can no longer be opened ({e.strerror})") from None
    st = os.fstat(fh.fileno())
    if not ident.same_file(st):
        fh.close()
        raise _replaced(dataset, name, "another file is now at its path")
    return fh


def _replaced(dataset: Path, name: str, why: str) -> PackedDatasetError:
    return PackedDatasetError(
        f"{dataset}: shard {name} is not the file checked when the dataset was opened ({why}): the dataset was "
        "replaced (e.g. by `seqpack pack --overwrite`) or altered since it was opened. Fix: reopen it with "
        "load_packed (and rebuild anything that relies on its length)")


def read_shard(dataset: Path, name: str, ident: ShardIdentity) -> pa.Table:
    """The whole shard as a ``pyarrow.Table`` read from the file checked at load (:func:`open_shard`).

    Raises:
        PackedDatasetError: the shard was replaced since load, or it is not readable Parquet.
    """
    with open_shard(dataset, name, ident) as fh:
        try:
            return pq.read_table(fh)
        except (pa.ArrowException, OSError) as e:
            raise _unreadable(dataset, name, e) from None


class ShardCache:
    """Where and how one dataset's shards are cached as memory-mappable Arrow IPC files (picklable)."""

    def __init__(self, dataset: Path, cache_dir: Path | None) -> None:
        self.dataset = dataset
        self.cache_dir = cache_dir
        self._checked = cache_dir is not None

    def _check_own(self) -> None:
        """Decide, on first use, whether the dataset's own ``.cache`` may be used: not if it is a symlink
        (never followed: the cache would be written outside the dataset) or not a folder."""
        self._checked = True
        own = self.dataset / CACHE_DIR
        try:
            st = os.lstat(own)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            self.cache_dir = self._private()
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
            warnings.warn(f"seqpack: {own} is {kind}; not following it (the cache would be written outside the "
                          f"dataset): caching in {self.cache_dir} (pass cache_dir= to choose)", stacklevel=5)

    def _private(self) -> Path:
        key = hashlib.sha256(os.fsencode(os.path.realpath(self.dataset))).hexdigest()[:16]
        return private_cache_root() / key

    def path(self, name: str, ident: ShardIdentity) -> Path:
        base = self.cache_dir if self.cache_dir is not None else self.dataset / CACHE_DIR
        return base / f"{Path(name).stem}-{(ident.sha256 or str(ident.st_size))[:16]}.arrow"

    def table(self, name: str, ident: ShardIdentity, *, rebuild: bool) -> pa.Table:
        """The memory-mapped table of shard ``name``: the cache file if it was built from exactly this
        shard (``ident``) and reads back whole, else (or with ``rebuild``) rebuilt from the Parquet shard.

        Raises:
            PackedDatasetError: as :func:`read_shard`.
        """
        if not self._checked:
            self._check_own()
        cache = self.path(name, ident)
        if not rebuild:
            table = self._reuse(cache, name, ident)
            if table is not None:
                return table
        try:
            self._build(name, ident, cache)
        except OSError:
            if self.cache_dir is not None and self.cache_dir.is_relative_to(private_cache_root()):
                raise
            # a dataset (or cache_dir) seqpack cannot write: this user's private temp cache
            self.cache_dir = self._private()
            cache = self.path(name, ident)
            table = None if rebuild else self._reuse(cache, name, ident)
            if table is not None:
                return table
            self._build(name, ident, cache)
        return self._open(cache)

    @staticmethod
    def _open(cache: Path) -> pa.Table:
        return pa.ipc.open_file(pa.memory_map(str(cache), "r")).read_all()

    def _reuse(self, cache: Path, name: str, ident: ShardIdentity) -> pa.Table | None:
        if not cache.is_file():
            return None
        try:
            table = self._open(cache)
            source = (table.schema.metadata or {}).get(_SOURCE_KEY)
            if source != ident.to_bytes():
                return None  # built from another shard (or by an older seqpack): rebuild, nothing is wrong
            missing = [c for c in SHARD_COLUMNS if c not in table.column_names]
            if missing or table.num_rows != ident.num_rows:
                raise ValueError(f"missing columns {missing}" if missing else
                                 f"{table.num_rows} rows, the shard has {ident.num_rows}")
            return table
        except _CACHE_ERRORS as e:
            warnings.warn(f"seqpack: the Arrow cache {cache} of shard {name} is damaged ({type(e).__name__}: "
                          f"{str(e)[:120]}); rebuilding it from the Parquet shard", stacklevel=4)
            return None

    def _build(self, name: str, ident: ShardIdentity, cache: Path) -> None:
        table = read_shard(self.dataset, name, ident).combine_chunks()
        cache.parent.mkdir(parents=True, exist_ok=True)
        meta: dict[Any, Any] = dict(table.schema.metadata or {})
        meta[_SOURCE_KEY] = ident.to_bytes()
        table = table.replace_schema_metadata(meta)
        tmp = cache.with_name(cache.name + f".tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        try:
            with pa.OSFile(str(tmp), "wb") as sink:
                with pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table)
            os.replace(tmp, cache)
        finally:
            if tmp.exists():
                tmp.unlink()


def private_cache_root() -> Path:
    """This user's Arrow cache folder in the temp dir (``seqpack-arrow-cache-<uid>``, mode 0700), for
    datasets in read-only folders.

    Raises:
        PackedDatasetError: the folder exists but belongs to another user, is a symlink, or others can
            write to it (another local user could plant cache files that would be served as rows).
    """
    uid = os.getuid() if hasattr(os, "getuid") else 0
    root = Path(tempfile.gettempdir()) / f"seqpack-arrow-cache-{uid}"
    root.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != uid) \
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PackedDatasetError(
            f"the Arrow cache folder {root} is not private to this user (owner uid {st.st_uid}, mode "
            f"{stat.filemode(st.st_mode)}); remove it, or pass cache_dir= a folder only you can write")
    return root
