"""Read an offline packed dataset back as a map-style dataset of :class:`~seqpack.packed.PackedSequence`.

Parquet is the stored (portable) format. For O(1) random access without holding the data in RAM,
each shard is converted once into an Arrow IPC file (the same idea as HF ``datasets``' Arrow cache)
and opened with ``pyarrow.memory_map``; rows are zero-copy numpy views into the mapped file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa

from seqpack.io.cache import ShardCache, ShardIdentity, check_shard, read_shard
from seqpack.io.fingerprint import verify_metadata
from seqpack.io.media import PackMedia
from seqpack.io.report_file import read_report
from seqpack.io.metadata import (
    REPORT_FILE,
    PackedDatasetError,
    PackedMetadata,
    StalePackedDatasetError,
)
from seqpack.packed import PackedSequence
from seqpack.packed.invariants import PackedSequenceError, stored_row_problem, token_range_problem

__all__ = ["PackedDataset", "load_packed", "EXPECT_KEYS", "MEDIA_EXPECT_KEYS"]

#: Keys accepted by ``load_packed(expect=...)`` (aliases: ``capacity`` -> ``seq_length``).
EXPECT_KEYS = (
    "seq_length",
    "capacity",
    "pad_to_multiple_of",
    "context_parallel_size",
    "effective_pad_multiple",
    "algorithm",
    "seed",
    "overlength",
    "train_on",
    "tokenizer",
    "tokenizer_hash",
    "chat_template_hash",
    "pad_token_id",
    "fingerprint",
    "format_version",
    "min_pixels",
    "max_pixels",
    "patch_size",
    "merge_size",
    "temporal_patch_size",
)
#: ``expect`` keys read from ``metadata.media`` (image processor settings; ``None`` for text-only data).
MEDIA_EXPECT_KEYS = ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size")


def _check_expect(path: Path, meta: PackedMetadata, expect: Mapping[str, Any]) -> None:
    unknown = [k for k in expect if k not in EXPECT_KEYS]
    if unknown:
        raise ValueError(f"load_packed(expect=...): unknown key(s) {unknown}; known keys: {list(EXPECT_KEYS)}")
    diffs: dict[str, tuple[Any, Any]] = {}
    for k, want in expect.items():
        if k == "capacity":
            stored = meta.seq_length
        elif k in MEDIA_EXPECT_KEYS:
            stored = (meta.media or {}).get(k)
        else:
            stored = getattr(meta, k)
        if hasattr(want, "value"):  # enums (e.g. PackingAlgorithm)
            want = want.value
        if stored != want:
            diffs[k] = (stored, want)
    if diffs:
        raise StalePackedDatasetError(str(path), diffs)


class _Shard:
    """Zero-copy views of one shard's columns (one Arrow chunk per column)."""

    def __init__(self, table: pa.Table):
        table = table.combine_chunks()
        self.table = table
        self.num_rows = table.num_rows
        self.cols: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded", "final_target_segments"):
            if name not in table.column_names:  # optional column (absent in hand-made shards)
                continue
            col = table.column(name)
            arr = col.chunk(0) if col.num_chunks else pa.array([], col.type)
            offsets = arr.offsets.to_numpy()
            values = arr.values.to_numpy(zero_copy_only=False)
            # .values ignores a slice offset of arr; offsets are absolute into .values
            self.cols[name] = (offsets, values)
        self.sample_ids = table.column("sample_ids")
        self.media = table.column("media") if "media" in table.column_names else None

    def get(self, name: str, i: int) -> np.ndarray:
        offsets, values = self.cols[name]
        return values[offsets[i] : offsets[i + 1]]


class PackedDataset:
    """Map-style dataset over a packed directory: ``ds[i]`` is a :class:`~seqpack.packed.PackedSequence`.

    Works directly as a ``torch.utils.data.Dataset`` (``__getitem__`` + ``__len__``; picklable for
    DataLoader workers: the memory maps are reopened in each worker).

    Image-text packs: ``ds[i].media`` lists one entry per segment (``None`` for text-only ones) with
    ``images`` (absolute paths under ``media.root``), ``image_grid_thw`` (int64 ``[k, 3]``), ``image_tokens``
    (int64 ``[k]``) and ``mrope_position_ids`` (int64 ``[3, L]``); ``ds[i].extra["mrope_position_ids"]``
    holds the row's (int64 ``[3, T]``, restarting per segment). With ``load_media=True`` each entry also
    gets ``pixel_values`` (float32 ``[sum prod(grid), D]``), recomputed from the image files with the
    image processor settings stored in ``metadata.json`` (cost: opening + resizing every image of the
    pack, per access); ``seqpack.data.media.collate_media`` or the collators concatenate them in order.

    Attributes:
        path: dataset directory.
        metadata: the :class:`PackedMetadata` read from ``metadata.json``.
        media: the :class:`seqpack.io.media.PackMedia` (``media.root``: where image paths resolve).
    """

    def __init__(self, path: str | os.PathLike, metadata: PackedMetadata, *, memory_map: bool = True,
                 cache_dir: str | os.PathLike | None = None, load_media: bool = False,
                 media_dir: str | os.PathLike | None = None, allow_any_media_path: bool = False,
                 identities: list[ShardIdentity] | None = None) -> None:
        self.path = Path(path)
        self.load_media = bool(load_media)
        self.media = PackMedia(self.path, metadata.media, load_media=load_media, media_dir=media_dir,
                               allow_any=allow_any_media_path)
        self.metadata = metadata
        self.memory_map = memory_map
        self._cache = ShardCache(self.path, Path(cache_dir) if cache_dir is not None else None)
        # each shard's file as checked at load: a later first read refuses another file at that path
        self._identities = identities if identities is not None else [
            check_shard(self.path, s.file, num_bytes=s.num_bytes, num_rows=s.num_rows, sha256=s.sha256, verify=False)
            for s in metadata.shards]
        counts = [s.num_rows for s in metadata.shards]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._shards: list[_Shard | None] = [None] * len(metadata.shards)
        self._rebuild_cache = False  # load_packed(verify=True): rebuild each shard's Arrow cache once
        self._rebuilt: set[int] = set()

    # -- sizes / metadata --------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def capacity(self) -> int:
        """The bin capacity in tokens (``metadata.seq_length``)."""
        return self.metadata.seq_length

    def report(self) -> list[dict[str, Any]]:
        """The per-record report (``report.jsonl``): one dict per dropped/skipped/truncated/split record
        (:func:`seqpack.io.report_file.read_report`; ``[]`` when the file is absent).

        Raises:
            PackedDatasetError: a line of ``report.jsonl`` is not a report entry (names the line and the fix).
        """
        return read_report(self.path / REPORT_FILE)

    # -- access ------------------------------------------------------------------------------
    def _shard(self, k: int) -> _Shard:
        s = self._shards[k]
        if s is None:
            s = _Shard(self._open_table(k))
            self._shards[k] = s
        return s

    @property
    def cache_dir(self) -> Path | None:
        """Where the Arrow cache files go (``None``: the dataset's own ``.cache`` folder)."""
        return self._cache.cache_dir

    def _open_table(self, k: int) -> pa.Table:
        name = self.metadata.shards[k].file
        if not self.memory_map:
            return read_shard(self.path, name, self._identities[k])
        rebuild = self._rebuild_cache and k not in self._rebuilt  # verified Parquet: no cache from before
        table = self._cache.table(name, self._identities[k], rebuild=rebuild)
        self._rebuilt.add(k)
        return table

    def _locate(self, i: int) -> tuple[int, int]:
        n = len(self)
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"PackedDataset indices must be integers, got {type(i).__name__}")
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for packed dataset of {n} packs")
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        return k, i - int(self._starts[k])

    def columns(self, i: int) -> dict[str, Any]:
        """The stored columns of pack ``i`` as numpy int32 views (+ ``sample_ids`` list)."""
        k, j = self._locate(i)
        s = self._shard(k)
        out: dict[str, Any] = {name: s.get(name, j) for name in s.cols}
        out["sample_ids"] = s.sample_ids[j].as_py()
        raw = s.media[j].as_py() if s.media is not None else None
        try:
            out["media"] = json.loads(raw) if raw else None
        except ValueError as exc:
            raise PackedDatasetError(f"{self.path}: pack {i} ({self._row(i)}) has a media column that is not JSON "
                                     f"({exc}). The shard was altered or damaged; re-pack the data") from None
        return out

    def image_processor(self):
        """The image processor rebuilt from ``metadata.media["image_processor"]`` (cached); raises
        ``PackedDatasetError`` for a dataset without images."""
        return self.media.processor()

    def _row(self, i: int) -> str:
        k, j = self._locate(i)
        return f"row {j} of shard {self.metadata.shards[k].file}"

    def _check_row(self, i: int, c: Mapping[str, Any]) -> None:
        """Refuse a stored row whose boundary arrays cannot describe it or whose token ids are negative (crafted
        or damaged shard), naming the shard and row, before any array is indexed with them
        (:func:`seqpack.packed.invariants.stored_row_problem`, :func:`~seqpack.packed.invariants.token_range_problem`)."""
        problem = (stored_row_problem(c["cu_seqlens"], c["cu_seqlens_padded"], len(c["input_ids"]),
                                      len(c["labels"]), len(c["sample_ids"]), c.get("final_target_segments", ()))
                   or token_range_problem(c["input_ids"], c["labels"]))
        if problem is not None:
            raise PackedDatasetError(f"{self.path}: pack {i} ({self._row(i)}) is not a valid packed row: {problem}. "
                                     "The shard was altered or damaged; re-pack the data")

    def __getitem__(self, i: int):
        """Return pack ``i`` as a :class:`~seqpack.packed.PackedSequence` (every derived field rebuilt
        from the stored boundaries, M-RoPE tables included, by ``PackedSequence.from_boundaries``)."""
        c = self.columns(i)
        self._check_row(i, c)
        m = self.metadata
        has_final_target = None
        if "final_target_segments" in c:
            has_final_target = np.zeros(len(c["cu_seqlens"]) - 1, dtype=bool)
            has_final_target[np.asarray(c["final_target_segments"], dtype=np.int64)] = True
        media = self.media.segments(int(i), c.get("media"), c["sample_ids"], lambda: self._row(i))
        extra: dict[str, Any] = {
            "pad_to_multiple_of": m.effective_pad_multiple,
            "seq_length": m.seq_length,
            "pad_token_id": m.pad_token_id,
        }
        return PackedSequence.from_boundaries(
            c["input_ids"],
            c["labels"],
            np.array(c["cu_seqlens"]),  # small: writable copies (torch.from_numpy warns on read-only maps)
            np.array(c["cu_seqlens_padded"]),
            sample_ids=c["sample_ids"],
            media=media,
            has_final_target=has_final_target,
            extra=extra,
            # the builder computes each image segment's M-RoPE table and the row's (extra["mrope_position_ids"])
            image_pad_id=(m.media or {}).get("image_pad_id"),
            merge_size=self.media.merge_size,
        )

    def validate_rows(self, vocab_size: int | None = None) -> int:
        """Read every pack and check all invariants of ``packed-batch-spec.md`` on it
        (:func:`seqpack.packed.invariants.validate` with the dataset's ``seq_length``, pad multiple and CP
        size). Hashes only prove a file is the one recorded; this proves its rows are usable, also for a
        dataset whose hashes someone recomputed. O(total tokens); ``seqpack inspect --verify`` calls it.

        Args:
            vocab_size: the embedding's vocabulary size (``len(tokenizer)``); every token id and label must
                lie below it. None checks only that ids are not negative.

        Returns:
            The number of packs checked.

        Raises:
            PackedDatasetError: the first bad pack, naming its shard, row and the broken invariant.
        """
        m = self.metadata
        for i in range(len(self)):
            try:
                self[i].validate(capacity=m.seq_length, context_parallel_size=m.context_parallel_size,
                                 multiple=m.effective_pad_multiple, vocab_size=vocab_size)
            except PackedSequenceError as exc:
                raise PackedDatasetError(f"{self.path}: pack {i} ({self._row(i)}) is not a valid packed row: {exc}. "
                                         "The shard was altered or damaged; re-pack the data") from None
        return len(self)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def column(self, name: str) -> np.ndarray:
        """A scalar column (``num_tokens`` or ``num_trainable``) over all packs, int64 ``[num_packs]``."""
        parts = []
        for k in range(len(self.metadata.shards)):
            parts.append(self._shard(k).table.column(name).to_numpy())
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def segment_lengths(self) -> np.ndarray:
        """Real length of every packed segment (all packs, pack order), int64."""
        parts = []
        for k in range(len(self.metadata.shards)):
            offsets, values = self._shard(k).cols["cu_seqlens"]
            for j in range(len(offsets) - 1):
                parts.append(np.diff(values[offsets[j] : offsets[j + 1]]))
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    # -- pickling (DataLoader workers) -------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_shards": [None] * len(self._shards)}

    def __repr__(self) -> str:
        m = self.metadata
        return (f"PackedDataset(path={str(self.path)!r}, num_packs={len(self)}, seq_length={m.seq_length}, "
                f"context_parallel_size={m.context_parallel_size}, pad_multiple={m.effective_pad_multiple})")


def load_packed(
    path: str | os.PathLike,
    expect: Mapping[str, Any] | None = None,
    *,
    memory_map: bool = True,
    cache_dir: str | os.PathLike | None = None,
    verify: bool = False,
    load_media: bool = False,
    media_dir: str | os.PathLike | None = None,
    allow_any_media_path: bool = False,
) -> PackedDataset:
    """Open a packed dataset written by :func:`seqpack.io.write_packed` / ``seqpack pack``.

    Checks: ``metadata.json`` present (inside the folder, not a symlink out of it), schema-valid and of a
    supported ``format_version``; every shard listed in it inside the folder, present, of the recorded
    size, readable Parquet with the recorded row count; the row counts add up to ``num_packs``; then
    every ``expect`` key equals the stored value. Each shard's file identity (device, inode, size,
    mtime) is recorded: shards are read lazily, and one that is no longer that file when first read
    (the dataset was replaced in place, e.g. by ``seqpack pack --overwrite``) raises
    ``PackedDatasetError`` instead of serving another dataset's rows (``seqpack.io.cache``).

    Args:
        path: dataset directory.
        expect: settings the caller trains with, e.g. ``{"capacity": 4096, "context_parallel_size": 2,
            "pad_to_multiple_of": 8, "tokenizer_hash": ...}`` (keys: :data:`EXPECT_KEYS`; the image
            processor keys ``min_pixels``, ``max_pixels``, ``patch_size``, ``merge_size``,
            ``temporal_patch_size`` compare with ``metadata.media``, ``None`` for text-only data).
        memory_map: access rows through a memory-mapped Arrow IPC cache (default) instead of loading
            the Parquet shards into RAM. A cache file is served only for the shard file it was built
            from (recorded in it); otherwise, or when it is damaged (with a warning), it is rebuilt.
        cache_dir: where the Arrow cache goes (default ``path/.cache``; this user's private temp folder
            ``seqpack-arrow-cache-<uid>`` if ``path`` is read-only or its ``.cache`` is a symlink, which
            is never followed).
        verify: also hash every shard and compare with the sha256 recorded in ``metadata.json``
            (detects same-size corruption), and check ``metadata.json`` and ``report.jsonl`` against the
            fingerprint, ``metadata_sha256`` and ``report_sha256`` (``seqpack.io.fingerprint.verify_metadata``).
            Cost: reads and hashes every shard once in full (hashlib
            sha256 measured 0.95-1.9 GB/s on one core of the 2-core dev box, 256 MiB in memory; disk
            reads come on top), so it is off by default; ``seqpack inspect --verify`` turns it on.
        load_media: image-text datasets: recompute ``pixel_values`` for every segment's images on
            access (see :class:`PackedDataset`); the image files must exist under the media root.
        media_dir, allow_any_media_path: the folder stored image paths resolve against (default: the one
            in ``metadata.json``) and the opt-out of their checks (``seqpack.io.media``).

    Returns:
        :class:`PackedDataset`; ``ds[i]`` is a ``PackedSequence`` whose ``input_ids``/``labels`` have
        length T = ``cu_seqlens_padded[-1]`` <= ``metadata.seq_length``.

    Raises:
        PackedDatasetError: missing/incomplete directory, ``metadata.json`` malformed or a symlink out
            of the folder, unknown format, missing, unreadable or altered shard (size, row count, or
            with ``verify=True`` its sha256), ``load_media=True`` on a dataset without images; later,
            on first access to a shard, that shard was replaced since loading (reopen the dataset).
        StalePackedDatasetError: some ``expect`` key differs; the message names every differing key
            with the stored and expected value (case B23: data packed for CP=1 reused with CP=2).
        ValueError: an unknown ``expect`` key.
    """
    p = Path(path)
    if not p.is_dir():
        what = "is a file, not a folder" if p.exists() else "does not exist"
        raise PackedDatasetError(f"packed dataset {p} {what}; pass the folder `seqpack pack` (or pack_dataset) wrote")
    meta = PackedMetadata.read(p)
    if verify:
        verify_metadata(p, meta)
    idents = [check_shard(p, s.file, num_bytes=s.num_bytes, num_rows=s.num_rows, sha256=s.sha256, verify=verify)
              for s in meta.shards]
    total = sum(i.num_rows for i in idents)
    if total != meta.num_packs:
        raise PackedDatasetError(f"{p}: shards hold {total} packs, metadata.json says num_packs={meta.num_packs}")
    if expect:
        _check_expect(p, meta, expect)
    if load_media and not meta.media:
        raise PackedDatasetError(f"{p}: load_media=True but the dataset holds no images (metadata.json has no media)")
    ds = PackedDataset(p, meta, memory_map=memory_map, cache_dir=cache_dir, load_media=load_media,
                       media_dir=media_dir, allow_any_media_path=allow_any_media_path, identities=idents)
    ds._rebuild_cache = bool(verify)
    return ds
