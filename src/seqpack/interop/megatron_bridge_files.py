"""Megatron-Bridge packed Parquet files: export seqpack packs as shards + ``packing_metadata.json``, read them back.

Row conversion: :mod:`seqpack.interop.megatron_bridge`; the layout: ``docs/notes/megatron_bridge.md``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from seqpack.data import TokenizerError, load_tokenizer
from seqpack.interop.megatron_bridge import (
    BRIDGE_COLUMNS,
    BRIDGE_EXTRA_COLUMNS,
    BRIDGE_METADATA_FILE,
    bridge_pack_metadata,
    from_bridge_row,
    to_bridge_row,
)
from seqpack.io.output_dir import (
    check_location,
    remove_leftovers,
    replace_dir,
    temp_name,
)

__all__ = ["BridgeExport", "export_megatron_bridge", "read_megatron_bridge"]


def _pa():
    import pyarrow as pa  # deferred: pyarrow
    import pyarrow.parquet as pq

    return pa, pq


@dataclass
class BridgeExport:
    """What :func:`export_megatron_bridge` wrote.

    Attributes:
        files: the Parquet shards (``*.idx.parquet``, Bridge's naming), in row order.
        metadata_path: the ``packing_metadata.json`` list file.
        metadata: the dict appended to it (Bridge keys, see :func:`bridge_pack_metadata`).
        num_packs, num_segments: rows and segments written.
    """

    files: list[Path] = field(default_factory=list)
    metadata_path: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    num_packs: int = 0
    num_segments: int = 0


def _tokenizer_eos(name: Any) -> int | None:
    """EOS id of the tokenizer a dataset was packed with, when it loads offline (else None)."""
    if not name:
        return None
    try:
        eos = load_tokenizer(str(name), require_chat_template=False).eos_token_id
    except TokenizerError:
        return None
    return None if eos is None else int(eos)


def _resolve_source(source: Any, pack_size, pad_to_multiple_of, pad_token_id, eos_token_id):
    """Accept a seqpack dataset dir, a PackedDataset, or an iterable of packs; fill defaults from metadata."""
    meta = None
    if isinstance(source, (str, os.PathLike)):
        from seqpack.io import load_packed  # deferred: pyarrow

        source = load_packed(source)
    meta = getattr(source, "metadata", None)
    if meta is not None:
        pack_size = pack_size if pack_size is not None else meta.seq_length
        pad_to_multiple_of = pad_to_multiple_of if pad_to_multiple_of is not None else meta.effective_pad_multiple
        pad_token_id = pad_token_id if pad_token_id is not None else meta.pad_token_id
        eos_token_id = eos_token_id if eos_token_id is not None else _tokenizer_eos(meta.tokenizer)
    named = (("pack_size", pack_size), ("pad_token_id", pad_token_id), ("eos_token_id", eos_token_id))
    missing = [k for k, v in named if v is None]
    if missing:
        raise ValueError(
            f"export_megatron_bridge: {missing} unknown; pass them explicitly (eos_token_id = the eos_id of the "
            "tokenizer Megatron-Bridge is configured with; the others are read from metadata.json, and "
            "eos_token_id from its tokenizer when that loads offline, when exporting a seqpack dataset)"
        )
    mult = int(pad_to_multiple_of) if pad_to_multiple_of else None
    return source, int(pack_size), mult, int(pad_token_id), int(eos_token_id)


def export_megatron_bridge(
    source: Any,
    output_dir: str | os.PathLike,
    *,
    pack_size: int | None = None,
    pad_to_multiple_of: int | None = None,
    pad_token_id: int | None = None,
    eos_token_id: int | None = None,
    trailing_eos: str = "refuse",
    rows_per_file: int = 2048,
    row_group_size: int = 500,
    file_prefix: str = "shard",
    metadata_file: str = BRIDGE_METADATA_FILE,
    overwrite: bool = False,
) -> BridgeExport:
    """Write packs in Megatron-Bridge's packed Parquet layout (module docstring).

    Output: ``output_dir/{file_prefix}_{k:05d}.idx.parquet`` (zstd; point Bridge's
    ``packed_train_data_path`` at the directory or a glob) and ``output_dir/packing_metadata.json``
    (point ``packed_metadata_path`` at it; it is a list with one dict). Written into a temporary sibling
    directory and renamed into place, so an interrupted export never leaves a partial ``output_dir``.

    Args:
        source: a seqpack packed dataset directory, a :class:`~seqpack.io.PackedDataset`, or any iterable
            of ``PackedSequence``. For the first two, ``pack_size``, ``pad_to_multiple_of`` and
            ``pad_token_id`` default to the dataset's ``seq_length``, ``effective_pad_multiple`` and
            ``pad_token_id``.
        output_dir: target directory (must not exist unless ``overwrite``).
        pack_size: runtime pack size in tokens (Bridge ``packed_sequence_size``).
        pad_to_multiple_of: effective per-segment multiple; set Bridge's ``pad_seq_to_mult`` to exactly this.
        pad_token_id: seqpack's pad id (restored by :func:`read_megatron_bridge`).
        eos_token_id: Bridge's ``tokenizer.eos_id``: padding is stored as EOS, and every pack is checked
            to give Bridge's collate the same real lengths and trained labels
            (:func:`~seqpack.interop.megatron_bridge.bridge_real_length`). Default: the dataset
            tokenizer's EOS when it loads offline.
        trailing_eos: ``"refuse"`` or ``"as_final_target"`` (see
            :func:`~seqpack.interop.megatron_bridge.to_bridge_row`).
        rows_per_file: packs per Parquet file.
        row_group_size: packs per row group (Bridge's reader caches one row group at a time).

    Returns:
        :class:`BridgeExport`.

    Raises:
        FileExistsError: ``output_dir`` exists and ``overwrite`` is False, or holds files other than an
            earlier export's (named; ``overwrite`` replaces the folder atomically, never deleting other files).
        ValueError: missing settings, an unrepresentable pack (:func:`to_bridge_row`), or no packs.
    """
    pa, pq = _pa()
    source, pack_size, mult, pad_id, eos_id = _resolve_source(source, pack_size, pad_to_multiple_of, pad_token_id,
                                                              eos_token_id)
    if rows_per_file < 1:
        raise ValueError("rows_per_file must be >= 1")
    out = Path(output_dir)
    _check_bridge_output(out, overwrite, file_prefix, metadata_file)
    remove_leftovers(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(out, "tmp")
    tmp.mkdir()
    schema = pa.schema(
        [
            pa.field("input_ids", pa.list_(pa.int32())),
            pa.field("loss_mask", pa.list_(pa.uint8())),
            pa.field("seq_start_id", pa.list_(pa.int32())),
            pa.field("seq_lens", pa.list_(pa.int32())),
            pa.field("total_length", pa.int32()),
            pa.field("sample_ids", pa.list_(pa.string())),
            pa.field("pad_token_id", pa.int32()),
        ]
    )
    result = BridgeExport()
    runtime_lens: list[np.ndarray] = []
    buf: list[dict[str, Any]] = []
    names: list[str] = []

    def flush() -> None:
        if not buf:
            return
        table = pa.Table.from_pydict(
            {
                "input_ids": [r["input_ids"] for r in buf],
                "loss_mask": [r["loss_mask"] for r in buf],
                "seq_start_id": [r["seq_start_id"] for r in buf],
                "seq_lens": [r["seq_lens"] for r in buf],
                "total_length": [r["total_length"] for r in buf],
                "sample_ids": [r["sample_ids"] for r in buf],
                "pad_token_id": [r["pad_token_id"] for r in buf],
            },
            schema=schema,
        )
        name = f"{file_prefix}_{len(names):05d}.idx.parquet"
        pq.write_table(table, tmp / name, row_group_size=row_group_size, compression="zstd")
        names.append(name)
        buf.clear()

    try:
        for pack in source:
            row = to_bridge_row(pack, pad_token_id=pad_id, pad_to_multiple_of=mult, eos_token_id=eos_id,
                                trailing_eos=trailing_eos)
            rt = row.pop("runtime_lens")
            if int(rt.sum()) > pack_size:
                raise ValueError(
                    f"pack {result.num_packs} (samples {row['sample_ids'][:3]}...) has {int(rt.sum())} runtime "
                    f"tokens > pack_size {pack_size}; pass the pack size the data was packed for"
                )
            runtime_lens.append(rt)
            result.num_packs += 1
            result.num_segments += rt.size
            buf.append(row)
            if len(buf) >= rows_per_file:
                flush()
        flush()
        if result.num_packs == 0:
            raise ValueError("export_megatron_bridge: the source holds no packs")
        result.metadata = bridge_pack_metadata(runtime_lens, pack_size)
        (tmp / metadata_file).write_text(json.dumps([result.metadata], indent=2) + "\n", encoding="utf-8")
        _check_bridge_output(out, overwrite, file_prefix, metadata_file)  # nothing appeared meanwhile
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.files = [out / n for n in names]
    result.metadata_path = out / metadata_file
    return result


def _check_bridge_output(out: Path, overwrite: bool, file_prefix: str, metadata_file: str) -> None:
    """Refuse an output that must not be replaced: a file, an existing folder without ``overwrite``, or a
    folder holding anything but an earlier export's own files (named; never deleted)."""
    check_location(out)
    if not (out.exists() or out.is_symlink()):
        return
    if out.is_symlink() or not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder; choose another output directory")
    if not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True or choose another output directory")
    own = re.compile(rf"{re.escape(file_prefix)}_\d{{5}}\.idx\.parquet")
    strangers = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                       if not (p.is_file() and (p.name == metadata_file or own.fullmatch(p.name))))
    if strangers:
        shown = ", ".join(strangers[:10]) + (f" and {len(strangers) - 10} more" if len(strangers) > 10 else "")
        raise FileExistsError(
            f"{out} holds files a Megatron-Bridge export did not write ({shown}); overwrite=True replaces only "
            f"{file_prefix}_NNNNN.idx.parquet and {metadata_file} and never deletes other files. Move them out, "
            "or choose another output directory")


def _bridge_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".parquet", ".pq") and p.is_file())
        if not files:
            raise ValueError(f"no Parquet files (*.parquet, *.pq) in {path}")
        return files
    if not path.is_file():
        raise FileNotFoundError(f"Megatron-Bridge packed file {path} does not exist")
    return [path]


def read_megatron_bridge(
    path: str | os.PathLike,
    *,
    seq_length: int | None = None,
    pad_token_id: int | None = None,
) -> Iterator[Any]:
    """Iterate a Megatron-Bridge packed Parquet file (or directory of them, sorted) as seqpack packs.

    Files written by :func:`export_megatron_bridge` round-trip exactly (their ``seq_lens`` /
    ``total_length`` / ``sample_ids`` columns are used). Files written by Bridge itself carry only the
    three required columns: every runtime segment then counts as real, and sample ids are
    ``"{file}:{row}#seg{i}"``.

    Args:
        path: a ``.parquet`` / ``.idx.parquet`` file or a directory of them.
        seq_length: pad every row to this width (tail absorbed by the last segment), like Bridge's
            ``pad_to_max_length``; default: the stored ``total_length`` or the runtime total.
        pad_token_id: token id for padding slots; default: the stored ``pad_token_id`` column, else 0.

    Yields:
        :class:`~seqpack.packed.PackedSequence`, one per row, in file then row order.

    Raises:
        ValueError: a file lacks a required column, or a row is malformed (names file and row).
    """
    _, pq = _pa()
    for f in _bridge_files(Path(path)):
        pf = pq.ParquetFile(f)
        names = set(pf.schema_arrow.names)
        missing = [c for c in BRIDGE_COLUMNS if c not in names]
        if missing:
            raise ValueError(f"{f}: missing required Megatron-Bridge column(s) {missing}; found {sorted(names)}")
        cols = list(BRIDGE_COLUMNS) + [c for c in BRIDGE_EXTRA_COLUMNS if c in names]
        row_no = 0
        for rg in range(pf.num_row_groups):
            t = pf.read_row_group(rg, columns=cols)
            data = {c: t.column(c).to_pylist() for c in cols}
            for j in range(t.num_rows):
                total = data["total_length"][j] if "total_length" in data else None
                if seq_length is not None:
                    total = int(seq_length)
                yield from_bridge_row(
                    data["input_ids"][j],
                    data["loss_mask"][j],
                    data["seq_start_id"][j],
                    seq_lens=data["seq_lens"][j] if "seq_lens" in data else None,
                    total_length=total,
                    sample_ids=data["sample_ids"][j] if "sample_ids" in data else None,
                    pad_token_id=data["pad_token_id"][j] if "pad_token_id" in data and pad_token_id is None else (pad_token_id or 0),
                    where=f"{f.name}:{row_no}",
                )
                row_no += 1
