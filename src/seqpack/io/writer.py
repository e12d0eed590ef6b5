"""Atomic writer of an offline packed dataset (a directory of Parquet shards + ``metadata.json``).

Layout of ``DIR``::

    DIR/metadata.json            written last; its presence marks a complete dataset
    DIR/report.jsonl             one line per input record that was dropped/skipped/truncated/split
    DIR/data/shard-00000.parquet one row per pack (columns: :data:`COLUMNS`)

Atomicity: everything is written into a temporary sibling directory ``.DIR.tmp-<id>``, every file is
fsync'ed, ``metadata.json`` is written last, and the temporary directory is renamed onto ``DIR`` (an
``os.rename`` within one directory is atomic on POSIX). An interrupted run leaves only the hidden temp
directory, never a ``DIR`` that looks complete. An existing dataset is replaced only with
``overwrite=True``; a non-empty directory that is not a seqpack dataset is never deleted.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from seqpack import __version__
from seqpack.io.fingerprint import metadata_digest, sha256_file
from seqpack.io.metadata import check_metadata
from seqpack.io.report_file import write_report
from seqpack.io.output_dir import check_output_dir, fsync_dir, fsync_file, publish_dir, temp_name
from seqpack.io.output_lock import lock_output
from seqpack.io.metadata import (
    DATA_DIR,
    FORMAT_VERSION,
    METADATA_FILE,
    REPORT_FILE,
    PackedMetadata,
    ShardInfo,
)

__all__ = ["COLUMNS", "SCHEMA", "PackedWriter", "write_packed", "check_output_dir"]

#: Arrow schema of one row (one pack). ``labels`` are shifted per segment (packed-batch-spec.md);
#: ``cu_seqlens`` are logical (real-token) boundaries, ``cu_seqlens_padded`` physical ones (last == T);
#: ``num_tokens`` = real tokens in the pack, ``num_trainable`` = labels != -100;
#: ``final_target_segments`` = indices of the segments whose last real slot carries an explicit final
#: target (a truncated sample keeps the first dropped token, case B12). Storing it lets the reader tell
#: such a label from one that crosses into the next segment (case B03), which ``validate()`` rejects.
#: ``media`` (nullable JSON string): ``null`` for a pack without images, else a JSON list with one entry
#: per segment in pack order: ``null`` (text-only segment) or ``{"images": [path, ...],
#: "image_grid_thw": [[t, h, w], ...], "image_tokens": [n, ...]}``, images in placeholder order. Pixels
#: are never stored (``load_packed(..., load_media=True)`` recomputes them).
SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("labels", pa.list_(pa.int32())),
        pa.field("cu_seqlens", pa.list_(pa.int32())),
        pa.field("cu_seqlens_padded", pa.list_(pa.int32())),
        pa.field("final_target_segments", pa.list_(pa.int32())),
        pa.field("sample_ids", pa.list_(pa.string())),
        pa.field("num_tokens", pa.int32()),
        pa.field("num_trainable", pa.int32()),
        pa.field("media", pa.string()),
    ]
)
COLUMNS = tuple(SCHEMA.names)

_INT32_MAX = np.iinfo(np.int32).max
_MAX_SHARD_TOKENS = 1 << 28  # tokens per shard; keeps list offsets far below 2**31


def _row_arrays(row: Any) -> dict[str, Any]:
    """Extract the stored columns from a :class:`~seqpack.packed.PackedSequence`."""
    ids = np.asarray(row.input_ids)
    labels = np.asarray(row.labels)
    cu = np.asarray(row.cu_seqlens)
    cup = np.asarray(row.cu_seqlens_padded)
    n = int(getattr(row, "num_segments", 0) or (len(cu) - 1))
    cu, cup = cu[: n + 1], cup[: n + 1]  # static-shape padded boundaries are trimmed by the true N
    if ids.ndim != 1 or labels.shape != ids.shape:
        raise ValueError(f"row input_ids/labels must be 1-D of equal length, got {ids.shape}, {labels.shape}")
    if len(cup) == 0 or int(cup[-1]) != ids.shape[0]:
        raise ValueError(f"row cu_seqlens_padded must end at T={ids.shape[0]}, got {cup.tolist()}")
    if ids.size and (int(ids.max()) > _INT32_MAX or int(ids.min()) < 0):
        raise ValueError("token ids must fit in int32 and be >= 0")
    sample_ids = [str(s) for s in (row.sample_ids or [])]
    if len(sample_ids) != n:
        raise ValueError(f"row has {n} segments but {len(sample_ids)} sample_ids")
    hft = (getattr(row, "extra", None) or {}).get("has_final_target")
    if hft is None:  # duck-typed row without the flag: a non -100 last real label is a final target
        hft = labels[cu[1:] - 1] != -100 if n else np.zeros(0, dtype=bool)
    final_segments = np.flatnonzero(np.asarray(hft, dtype=bool)[:n]).astype(np.int32)
    media = _media_json(getattr(row, "media", None), n, sample_ids)
    return {
        "input_ids": ids.astype(np.int32, copy=False),
        "labels": labels.astype(np.int32, copy=False),
        "cu_seqlens": cu.astype(np.int32, copy=False),
        "cu_seqlens_padded": cup.astype(np.int32, copy=False),
        "final_target_segments": final_segments,
        "sample_ids": sample_ids,
        "num_tokens": int(cu[-1]),
        "num_trainable": int(np.count_nonzero(labels != -100)),
        "media": media,
    }


def _media_json(media: Any, n: int, sample_ids: list[str]) -> str | None:
    """The ``media`` column of one row: references only (paths, grids, token counts), never pixels.

    Raises:
        ValueError: wrong number of entries, an image that is not a path/URL string, or images without
            ``image_grid_thw`` (placeholders never expanded: the row's lengths would leave out the image
            tokens).
    """
    if media is None or not any(m for m in media[:n]):
        return None
    if len(media) < n:
        raise ValueError(f"row has {n} segments but {len(media)} media entries")
    out: list[Any] = []
    for j in range(n):
        m = media[j]
        images = list((m or {}).get("images") or [])
        if not images:
            out.append(None)
            continue
        sid = sample_ids[j]
        bad = [type(x).__name__ for x in images if not isinstance(x, (str, os.PathLike))]
        if bad:
            raise ValueError(
                f"segment {j} (sample {sid!r}) has in-memory image(s) ({', '.join(bad)}); a packed dataset stores "
                "image paths, not pixels. Save the images to files and reference them by path"
            )
        grid = m.get("image_grid_thw")
        if grid is None:
            raise ValueError(
                f"segment {j} (sample {sid!r}) has images but no image_grid_thw: its <image> placeholders were "
                "not expanded to image tokens, so its length leaves them out. Pack image-text data with "
                "seqpack.pipeline.pack_dataset / `seqpack pack` (local engine)"
            )
        grid = np.asarray(grid, dtype=np.int64).reshape(-1, 3)
        if grid.shape[0] != len(images):
            raise ValueError(f"segment {j} (sample {sid!r}): {len(images)} images but {grid.shape[0]} image grids")
        ntok = m.get("image_tokens")
        out.append({
            "images": [os.fspath(x) for x in images],
            "image_grid_thw": grid.tolist(),
            "image_tokens": [int(x) for x in np.asarray(ntok).reshape(-1)] if ntok is not None else None,
        })
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _list_array(arrs: list[np.ndarray]) -> pa.ListArray:
    lengths = np.fromiter((len(a) for a in arrs), dtype=np.int64, count=len(arrs))
    offsets = np.zeros(len(arrs) + 1, dtype=np.int32)
    if np.sum(lengths) > _INT32_MAX:
        raise ValueError("shard too large for 32-bit list offsets; lower rows_per_shard")
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrs).astype(np.int32, copy=False) if arrs else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))


class PackedWriter:
    """Stream packs into Parquet shards inside a temp dir, then publish atomically.

    Use as a context manager; leaving the block with an exception deletes the temp dir (the target is
    untouched). :meth:`finalize` must be called to publish.

    Args:
        output: target directory.
        overwrite: replace an existing seqpack dataset at ``output``.
        rows_per_shard: packs per Parquet shard (>= 1); a shard also closes at 2**28 tokens.
        row_group_size: packs per Parquet row group.
        compression: Parquet codec (``"zstd"``, ``"snappy"``, ``"none"``...).

    Raises:
        FileExistsError, PermissionError: see :func:`check_output_dir`; ``OutputBusyError`` (a
            FileExistsError): another run holds the output's lock.
    """

    def __init__(
        self,
        output: str | os.PathLike,
        *,
        overwrite: bool = False,
        rows_per_shard: int = 2048,
        row_group_size: int = 128,
        compression: str = "zstd",
    ) -> None:
        if rows_per_shard < 1 or row_group_size < 1:
            raise ValueError("rows_per_shard and row_group_size must be >= 1")
        self.output = Path(output)
        self.overwrite = overwrite
        check_output_dir(self.output, overwrite)
        self.rows_per_shard = int(rows_per_shard)
        self.row_group_size = int(row_group_size)
        self.compression = compression
        self._lock = lock_output(self.output)  # until published or aborted (makes the parent, removes leftovers)
        self.tmp = temp_name(self.output, "tmp")
        try:
            (self.tmp / DATA_DIR).mkdir(parents=True)
        except BaseException:
            self._lock.release()
            raise
        self._buf: dict[str, list] = {c: [] for c in COLUMNS}  # rows of the row group being filled
        self._shard: pq.ParquetWriter | None = None  # the open shard (rows written as row groups)
        self._shard_rows = 0
        self._shard_tokens = 0
        self.shards: list[ShardInfo] = []
        self.num_rows = 0
        self._done = False

    # -- rows -----------------------------------------------------------------------------------
    def write(self, row: Any) -> None:
        """Append one pack (a :class:`~seqpack.packed.PackedSequence` or duck-typed equivalent).

        Memory: one row group (``row_group_size`` packs) is held at a time; each full group is written
        to the open shard, so a shard's bytes equal those of one ``pyarrow.parquet.write_table`` of all
        its rows with the same ``row_group_size``.
        """
        if self._done:
            raise RuntimeError("writer already finalized or aborted")
        cols = _row_arrays(row)
        for k, v in cols.items():
            self._buf[k].append(v)
        self.num_rows += 1
        self._shard_rows += 1
        self._shard_tokens += len(cols["input_ids"])
        if len(self._buf["input_ids"]) >= self.row_group_size:
            self._write_group()
        # a shard closes at rows_per_shard rows, or earlier for very long rows (32-bit list offsets)
        if self._shard_rows >= self.rows_per_shard or self._shard_tokens >= _MAX_SHARD_TOKENS:
            self._flush()

    def write_all(self, rows: Iterable[Any]) -> None:
        """:meth:`write` every row of ``rows`` in order (errors as :meth:`write`)."""
        for r in rows:
            self.write(r)

    def _shard_name(self) -> str:
        return f"{DATA_DIR}/shard-{len(self.shards):05d}.parquet"

    def _write_group(self) -> None:
        """Write the buffered rows as one row group of the open shard (opened on first use)."""
        if not self._buf["input_ids"]:
            return
        table = pa.Table.from_arrays(
            [
                _list_array(self._buf["input_ids"]),
                _list_array(self._buf["labels"]),
                _list_array(self._buf["cu_seqlens"]),
                _list_array(self._buf["cu_seqlens_padded"]),
                _list_array(self._buf["final_target_segments"]),
                pa.array(self._buf["sample_ids"], pa.list_(pa.string())),
                pa.array(self._buf["num_tokens"], pa.int32()),
                pa.array(self._buf["num_trainable"], pa.int32()),
                pa.array(self._buf["media"], pa.string()),
            ],
            schema=SCHEMA,
        )
        self._buf = {c: [] for c in COLUMNS}
        if self._shard is None:
            self._shard = pq.ParquetWriter(self.tmp / self._shard_name(), SCHEMA, compression=self.compression)
        self._shard.write_table(table, row_group_size=self.row_group_size)

    def _flush(self) -> None:
        """Close the open shard (its last, partial row group first) and record it in :attr:`shards`."""
        self._write_group()
        if self._shard is None:
            return
        self._shard.close()
        self._shard = None
        name = self._shard_name()
        path = self.tmp / name
        fsync_file(path)
        self.shards.append(
            ShardInfo(file=name, num_rows=self._shard_rows, num_bytes=path.stat().st_size, sha256=sha256_file(path))
        )
        self._shard_rows = 0
        self._shard_tokens = 0

    # -- publish --------------------------------------------------------------------------------
    def finalize(self, metadata: PackedMetadata, report_entries: Iterable[Any] = ()) -> PackedMetadata:
        """Flush, write ``report.jsonl`` then ``metadata.json``, fsync, and rename onto ``output``.

        Fills ``metadata.shards``, ``columns``, ``num_packs``, ``format_version``, ``seqpack_version``
        and ``created_at``.

        Raises:
            ValueError: ``metadata.num_packs`` was set (> 0) and differs from the rows written.
            PackedDatasetError: the metadata fails the schema a reader checks (seqpack.io.metadata.check_metadata).
            FileExistsError: the target appeared meanwhile and ``overwrite`` is False.
        """
        if self._done:
            raise RuntimeError("writer already finalized or aborted")
        try:
            self._flush()
            if metadata.num_packs and metadata.num_packs != self.num_rows:
                raise ValueError(f"metadata.num_packs={metadata.num_packs} but {self.num_rows} rows were written")
            metadata.num_packs = self.num_rows
            metadata.shards = list(self.shards)
            metadata.columns = list(COLUMNS)
            metadata.format_version = FORMAT_VERSION
            metadata.seqpack_version = __version__
            metadata.created_at = created_at()
            check_metadata(metadata.to_dict(), "the metadata to write")  # what a reader will check, refused now
            metadata.report_sha256 = write_report(self.tmp / REPORT_FILE, report_entries)
            metadata.metadata_sha256 = metadata_digest(metadata)
            meta_tmp = self.tmp / (METADATA_FILE + ".partial")
            with open(meta_tmp, "w", encoding="utf-8") as f:
                f.write(metadata.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(meta_tmp, self.tmp / METADATA_FILE)
            fsync_dir(self.tmp / DATA_DIR)
            fsync_dir(self.tmp)
            publish_dir(self.tmp, self.output, self.overwrite)
        except BaseException:
            self.abort()
            raise
        self._done = True
        self._lock.release()
        return metadata

    def abort(self) -> None:
        """Delete the temp directory (the target is left untouched)."""
        self._done = True
        shard, self._shard = self._shard, None
        if shard is not None:
            try:
                shard.close()
            except Exception:  # noqa: BLE001 - the file is deleted with the temp dir either way
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._lock.release()

    def __enter__(self) -> "PackedWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            if not self._done:
                self.abort()


def created_at() -> str:
    """The ``created_at`` of a dataset written now: ``SOURCE_DATE_EPOCH`` (seconds since the epoch, the
    reproducible-builds convention) as ISO-8601 UTC when set, else ``""``. No wall clock, so equal inputs
    and settings give a byte-identical ``metadata.json``; the folder's mtime tells when it was written.

    Raises:
        ValueError: ``SOURCE_DATE_EPOCH`` is set but not an integer.
    """
    raw = os.environ.get("SOURCE_DATE_EPOCH")
    if raw is None or raw.strip() == "":
        return ""
    try:
        t = int(raw)
    except ValueError:
        raise ValueError(f"SOURCE_DATE_EPOCH={raw!r} is not an integer number of seconds since 1970-01-01 UTC") from None
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def write_packed(
    rows: Iterable[Any],
    output: str | os.PathLike,
    metadata: PackedMetadata,
    *,
    report_entries: Iterable[Any] = (),
    overwrite: bool = False,
    rows_per_shard: int = 2048,
    row_group_size: int = 128,
    compression: str = "zstd",
) -> PackedMetadata:
    """Write packs to ``output`` atomically (see module docstring) and return the final metadata.

    Args:
        rows: :class:`~seqpack.packed.PackedSequence` rows (any iterable; consumed once).
        output: target directory.
        metadata: filled-in :class:`PackedMetadata` (shards/columns/num_packs are set here).
        report_entries: :class:`~seqpack.accounting.SampleRecord` (or dicts) for ``report.jsonl``.
        overwrite: replace an existing seqpack dataset.

    Raises:
        FileExistsError: see :func:`check_output_dir`.
        ValueError: a row violates the stored-column contract (int32 ids, ``cu_seqlens_padded[-1] == T``,
            one sample id per segment).
    """
    with PackedWriter(
        output,
        overwrite=overwrite,
        rows_per_shard=rows_per_shard,
        row_group_size=row_group_size,
        compression=compression,
    ) as w:
        w.write_all(rows)
        return w.finalize(metadata, report_entries)

