"""Export to / import from Megatron-Bridge's packed Parquet layout.

The layout (Megatron-Bridge ``GPTSFTPackedParquetDataset`` and ``packing_utils.fill_packing_strategy``),
one row per pack:

==============  ==================  ==========================================================
column          Arrow type          meaning
==============  ==================  ==========================================================
``input_ids``   ``list<int32>``     the segments' **stored** token ids, concatenated, unshifted
``loss_mask``   ``list<uint8>``     per stored slot; already rolled by one: ``loss_mask[t]`` says
                                    "the logit at ``t`` is trained" (target ``input_ids[t+1]``)
``seq_start_id````list<int32>``     start offset of every segment in ``input_ids`` (first is 0)
==============  ==================  ==========================================================

At training time Bridge's collate cuts each stored segment ``[b, e)`` into ``tokens = ids[b:e-1]``,
``labels = ids[b+1:e]`` and ``loss_mask = loss_mask[b:e-1]`` (with ``answer_only_loss=True``): the
**runtime** segment is one token shorter than the stored one (case B12). The runtime segment lengths
are what goes into ``cu_seqlens`` and what must be divisible by ``pad_seq_to_mult`` (2·CP for THD CP);
the stored budget is one more.

Mapping to seqpack's row (per-segment shifted labels, ``packed-batch-spec.md``): a segment with real
length ``L`` and physical (padded) length ``P`` is stored as ``P + 1`` ids::

    stored ids   = input_ids[0:L] ++ [final target, or pad] ++ [pad] * (P - L)
    loss_mask    = (labels[0:L] != -100) ++ [0] * (P - L + 1)

so the runtime tokens are exactly seqpack's ``input_ids`` of the segment (padding included) and the
runtime labels/loss mask exactly seqpack's ``labels``. The row's tail padding (absorbed by the last
segment in seqpack) is not stored: Bridge pads every pack to the batch length at collate time; the
last segment keeps only its alignment padding (``round_up(L, multiple)``). Alignment padding is filled
with ``pad_token_id``: pass the tokenizer's EOS id to match Bridge's own pre-padding, whose collate
derives ``cu_seqlens_unpadded`` from the second EOS of a segment.

Extra columns make the import exact (Bridge reads only the three columns above and ignores them):
``seq_lens`` (``list<int32>``, real runtime length of every segment), ``total_length`` (``int32``, the
seqpack row width ``T``), ``sample_ids`` (``list<string>``) and ``pad_token_id`` (``int32``).

Because Bridge derives labels from the next stored id, a segment's explicit final target (case B12)
is also the runtime *token* of its first padding slot (when it has one); the importer writes
``pad_token_id`` back into every padding slot, so the round trip is exact.

The metadata file (``packing_metadata.json``) is Bridge's: a JSON **list** with one dict per packed
dataset, keys ``max_samples_per_bin``, ``dataset_max_seqlen``, ``min_packed_seqlen``,
``packing_factor``, ``packing_efficiency`` (percent, 2 decimals) and ``pack_size``; lengths are runtime
lengths (padding included), as Bridge computes them after pre-padding.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from seqpack.packed import PackedSequence, real_boundaries, segment_fields
from seqpack.sample import IGNORE_INDEX
from seqpack.padding import round_up

__all__ = [
    "BRIDGE_COLUMNS",
    "BRIDGE_METADATA_FILE",
    "BridgeExport",
    "to_bridge_row",
    "from_bridge_row",
    "bridge_pack_metadata",
    "export_megatron_bridge",
    "read_megatron_bridge",
]

#: Columns Megatron-Bridge requires (``REQUIRED_COLUMNS`` of its packed Parquet reader).
BRIDGE_COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
#: Default file name of the Bridge packing-metadata list written next to the shards.
BRIDGE_METADATA_FILE = "packing_metadata.json"
_EXTRA_COLUMNS = ("seq_lens", "total_length", "sample_ids", "pad_token_id")


def _pa():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def to_bridge_row(pack: Any, *, pad_token_id: int, pad_to_multiple_of: int | None = None) -> dict[str, Any]:
    """Convert one seqpack pack into one Megatron-Bridge packed row (see the module docstring).

    Args:
        pack: a :class:`~seqpack.packed.PackedSequence` (or duck-typed: ``input_ids``, ``labels``,
            ``cu_seqlens``, ``cu_seqlens_padded``, ``sample_ids``).
        pad_token_id: id written into alignment padding and into the stored slot after a segment's last
            real token when it has no final target.
        pad_to_multiple_of: the effective per-segment multiple the pack was built with
            (``metadata.effective_pad_multiple``); sets how much of the last segment's physical length is
            alignment padding (kept) rather than row tail (dropped). Default: the pack's own
            ``extra["pad_to_multiple_of"]`` (set by ``build_packed_sequence``), else 1.

    Returns:
        dict with ``input_ids`` int32 [sum(P_i + 1)], ``loss_mask`` uint8 [same], ``seq_start_id`` int32
        [N], ``seq_lens`` int32 [N] (real runtime lengths), ``total_length`` int (T), ``sample_ids``
        list[str], ``pad_token_id`` int, and ``runtime_lens`` int64 [N] (stored length - 1 of every segment; not a column).

    Raises:
        ValueError: a label inside a segment is neither -100 nor the next token (not representable:
            Bridge derives every label from the next stored id), naming the sample and slot.
    """
    if pad_to_multiple_of is None:
        pad_to_multiple_of = int((getattr(pack, "extra", None) or {}).get("pad_to_multiple_of") or 1)
    ids = np.asarray(pack.input_ids, dtype=np.int64)
    lab = np.asarray(pack.labels, dtype=np.int64)
    cu, cup, n = real_boundaries(pack)
    sample_ids = [str(s) for s in (getattr(pack, "sample_ids", None) or [f"segment-{i}" for i in range(n)])]
    T = int(cup[-1]) if n else 0
    real = np.diff(cu)
    phys = np.diff(cup)
    runtime = phys.copy()
    if n:
        runtime[-1] = min(int(phys[-1]), int(round_up(int(real[-1]), int(pad_to_multiple_of))))
    stored_total = int(runtime.sum()) + n
    out_ids = np.full(stored_total, int(pad_token_id), dtype=np.int64)
    out_mask = np.zeros(stored_total, dtype=np.uint8)
    starts = np.zeros(n, dtype=np.int64)
    pos = 0
    for i in range(n):
        b, L = int(cup[i]), int(real[i])
        seg_ids = ids[b : b + L]
        seg_lab = lab[b : b + L]
        # every trained label except the last real slot's must be the next token (invariant 7)
        if L > 1:
            inner = seg_lab[:-1]
            bad = np.nonzero((inner != IGNORE_INDEX) & (inner != seg_ids[1:]))[0]
            if bad.size:
                t = int(bad[0])
                raise ValueError(
                    f"sample {sample_ids[i]!r}: label {int(inner[t])} at segment slot {t} is not the next token "
                    f"{int(seg_ids[t + 1])}; Megatron-Bridge derives labels from the next stored id, so this "
                    "pack cannot be exported (the pack violates packed-batch-spec invariant 7; validate() it)."
                )
        starts[i] = pos
        out_ids[pos : pos + L] = seg_ids
        out_mask[pos : pos + L] = seg_lab != IGNORE_INDEX
        if L and seg_lab[-1] != IGNORE_INDEX:
            out_ids[pos + L] = seg_lab[-1]  # explicit final target (case B12)
        pos += int(runtime[i]) + 1
    if np.any(out_ids < 0) or (out_ids.size and out_ids.max() > np.iinfo(np.int32).max):
        raise ValueError(f"pack {sample_ids[:3]}...: token ids must be in [0, 2**31) to store as int32")
    return {
        "input_ids": out_ids.astype(np.int32),
        "loss_mask": out_mask,
        "seq_start_id": starts.astype(np.int32),
        "seq_lens": real.astype(np.int32),
        "total_length": T,
        "sample_ids": sample_ids,
        "pad_token_id": int(pad_token_id),
        "runtime_lens": runtime.astype(np.int64),
    }


def from_bridge_row(
    input_ids: Any,
    loss_mask: Any,
    seq_start_id: Any,
    *,
    seq_lens: Any = None,
    total_length: int | None = None,
    sample_ids: list[str] | None = None,
    pad_token_id: int = 0,
    where: str = "row",
):
    """Convert one Megatron-Bridge packed row back into a seqpack pack.

    Every stored segment ``[b, e)`` becomes a runtime segment of physical length ``e - b - 1`` with
    ``input_ids = ids[b:e-1]`` and ``labels[t] = ids[b+t+1] if loss_mask[b+t] else -100``.

    Args:
        input_ids, loss_mask: int [S] stored ids and rolled loss mask.
        seq_start_id: int [N] segment starts (first must be 0, strictly increasing).
        seq_lens: optional int [N] real runtime lengths (the ``seq_lens`` column written by
            :func:`to_bridge_row`). Without it the whole runtime segment counts as real: Bridge's layout
            does not record alignment padding, and lengths are never inferred from token values.
        total_length: optional row width ``T``; when larger than the runtime total, the last segment
            absorbs the difference as tail padding (``pad_token_id``, label -100).
        pad_token_id: token id for tail padding, and (when ``seq_lens`` is given) for every padding
            slot of a segment (the first may hold the previous slot's final target, see module doc).
        sample_ids: optional ids (default ``"{where}#seg{i}"``).
        pad_token_id: token id for tail padding.
        where: name of the row for error messages (file and row index).

    Returns:
        :class:`~seqpack.packed.PackedSequence` (built by ``PackedSequence.from_boundaries``).

    Raises:
        ValueError: malformed row (lengths differ, bad ``seq_start_id``, a stored segment shorter than 2,
            ``seq_lens`` out of range, ``total_length`` smaller than the runtime total), naming ``where``.
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    lm = np.asarray(loss_mask).astype(bool)
    st = np.asarray(seq_start_id, dtype=np.int64)
    S = ids.shape[0]
    if lm.shape[0] != S:
        raise ValueError(f"{where}: loss_mask has {lm.shape[0]} entries but input_ids has {S}")
    if st.size == 0 or st[0] != 0:
        raise ValueError(f"{where}: seq_start_id must start with 0, got {st[:5].tolist()}")
    bounds = np.append(st, S)
    stored = np.diff(bounds)
    if np.any(stored < 2):
        i = int(np.nonzero(stored < 2)[0][0])
        raise ValueError(
            f"{where}: segment {i} has stored length {int(stored[i])}; every stored segment needs >= 2 ids "
            "(runtime length = stored - 1 >= 1) and seq_start_id must be strictly increasing"
        )
    runtime = stored - 1
    n = runtime.shape[0]
    if seq_lens is None:
        real = runtime.copy()
    else:
        real = np.asarray(seq_lens, dtype=np.int64)
        if real.shape != runtime.shape or np.any(real < 1) or np.any(real > runtime):
            raise ValueError(
                f"{where}: seq_lens {real.tolist()[:8]} do not fit the runtime segment lengths "
                f"{runtime.tolist()[:8]} (need 1 <= seq_lens[i] <= stored length - 1)"
            )
    # gather runtime tokens and labels: all slots except each segment's last stored slot
    keep = np.ones(S, dtype=bool)
    keep[bounds[1:] - 1] = False
    tok = ids[keep]
    nxt = np.empty(S, dtype=np.int64)
    nxt[:-1] = ids[1:]
    nxt[-1] = IGNORE_INDEX
    lab = np.where(lm, nxt, IGNORE_INDEX)[keep]
    cup = np.concatenate([[0], np.cumsum(runtime)])
    cu = np.concatenate([[0], np.cumsum(real)])
    # slots past a segment's real length are padding: never labelled
    is_pad = segment_fields(cup, real)[1]
    lab[is_pad] = IGNORE_INDEX
    if seq_lens is not None:
        tok[is_pad] = int(pad_token_id)
    T_rt = int(cup[-1])
    if total_length is not None and int(total_length) != T_rt:
        if int(total_length) < T_rt:
            raise ValueError(f"{where}: total_length {total_length} < runtime total {T_rt}")
        extra = int(total_length) - T_rt
        tok = np.concatenate([tok, np.full(extra, int(pad_token_id), dtype=np.int64)])
        lab = np.concatenate([lab, np.full(extra, IGNORE_INDEX, dtype=np.int64)])
        cup[-1] = int(total_length)
    if sample_ids is None:
        sample_ids = [f"{where}#seg{i}" for i in range(n)]
    return PackedSequence.from_boundaries(
        tok, lab, cu.astype(np.int32), cup.astype(np.int32), sample_ids=list(sample_ids)
    )


def bridge_pack_metadata(runtime_lens_per_pack: Iterable[np.ndarray], pack_size: int) -> dict[str, Any]:
    """Megatron-Bridge's packing-metadata dict for one packed dataset.

    Same definitions as Bridge's ``create_packing_strategy``: ``dataset_max_seqlen`` = longest runtime
    segment, ``max_samples_per_bin`` = most segments in a pack, ``min_packed_seqlen`` = smallest sum of
    runtime lengths in a pack, ``packing_factor`` = segments / packs (2 decimals),
    ``packing_efficiency`` = 100 * sum(runtime lengths) / (packs * pack_size) (percent, 2 decimals).

    Args:
        runtime_lens_per_pack: one int array per pack (runtime segment lengths, padding included).
        pack_size: the runtime pack size (seqpack ``seq_length``).

    Raises:
        ValueError: no packs.
    """
    max_seg = 0
    max_n = 0
    min_total = None
    n_seg = 0
    total = 0
    n_packs = 0
    for r in runtime_lens_per_pack:
        r = np.asarray(r, dtype=np.int64)
        n_packs += 1
        n_seg += r.size
        s = int(r.sum())
        total += s
        max_seg = max(max_seg, int(r.max()) if r.size else 0)
        max_n = max(max_n, int(r.size))
        min_total = s if min_total is None else min(min_total, s)
    if n_packs == 0:
        raise ValueError("no packs to describe")
    return {
        "dataset_max_seqlen": max_seg,
        "max_samples_per_bin": max_n,
        "packing_factor": round(n_seg / n_packs, 2),
        "packing_efficiency": round(100.0 * total / (n_packs * int(pack_size)), 2),
        "pack_size": int(pack_size),
        "min_packed_seqlen": int(min_total),
    }


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


def _resolve_source(source: Any, pack_size, pad_to_multiple_of, pad_token_id):
    """Accept a seqpack dataset dir, a PackedDataset, or an iterable of packs; fill defaults from metadata."""
    meta = None
    if isinstance(source, (str, os.PathLike)):
        from seqpack.io import load_packed

        source = load_packed(source)
    meta = getattr(source, "metadata", None)
    if meta is not None:
        pack_size = pack_size if pack_size is not None else meta.seq_length
        pad_to_multiple_of = pad_to_multiple_of if pad_to_multiple_of is not None else meta.effective_pad_multiple
        pad_token_id = pad_token_id if pad_token_id is not None else meta.pad_token_id
    missing = [k for k, v in (("pack_size", pack_size), ("pad_token_id", pad_token_id)) if v is None]
    if missing:
        raise ValueError(
            f"export_megatron_bridge: {missing} unknown; pass them explicitly (they are read from "
            "metadata.json when exporting a seqpack dataset directory)"
        )
    return source, int(pack_size), (int(pad_to_multiple_of) if pad_to_multiple_of else None), int(pad_token_id)


def export_megatron_bridge(
    source: Any,
    output_dir: str | os.PathLike,
    *,
    pack_size: int | None = None,
    pad_to_multiple_of: int | None = None,
    pad_token_id: int | None = None,
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
        pad_to_multiple_of: effective per-segment multiple (Bridge ``pad_seq_to_mult``).
        pad_token_id: id for alignment padding (use the tokenizer's EOS id to match Bridge).
        rows_per_file: packs per Parquet file.
        row_group_size: packs per row group (Bridge's reader caches one row group at a time).

    Returns:
        :class:`BridgeExport`.

    Raises:
        FileExistsError: ``output_dir`` exists and ``overwrite`` is False.
        ValueError: missing settings, an unrepresentable pack (:func:`to_bridge_row`), or no packs.
    """
    pa, pq = _pa()
    source, pack_size, mult, pad_id = _resolve_source(source, pack_size, pad_to_multiple_of, pad_token_id)
    if rows_per_file < 1:
        raise ValueError("rows_per_file must be >= 1")
    out = Path(output_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True or choose another output directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
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
            row = to_bridge_row(pack, pad_token_id=pad_id, pad_to_multiple_of=mult)
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
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.files = [out / n for n in names]
    result.metadata_path = out / metadata_file
    return result


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
        cols = list(BRIDGE_COLUMNS) + [c for c in _EXTRA_COLUMNS if c in names]
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
