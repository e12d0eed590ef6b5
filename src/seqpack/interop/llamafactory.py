"""Export packs in LLaMA-Factory's ``neat_packing`` layout, a ``datasets`` folder its ``tokenized_path``
loads (reading LLaMA-Factory's ``dataset_info.json`` is :mod:`seqpack.data.llamafactory`).

The layout is the one ``llamafactory.data.processor.supervised.PackedSupervisedDatasetProcessor`` writes
with ``neat_packing: true`` (LLaMA-Factory 0.9.5), one row per pack:

* ``input_ids``: the pack's tokens, padded with ``pad_token_id`` to ``row_length``;
* ``attention_mask``: segment ids ``1..N`` on real tokens, ``0`` on padding (segment alignment padding
  and the row's tail); ``SFTDataCollatorWith4DAttentionMask`` turns it into the block-diagonal causal
  4-D mask (``prepare_4d_attention_mask``), or, with flash-attention, drops the 0 slots and lets
  transformers find the boundaries from ``position_ids``;
* ``position_ids``: restart at 0 per segment (seqpack's, counting through a segment's own padding),
  ``0`` on the tail;
* ``labels``: unshifted (HF convention: the model shifts), -100 on prompt, padding and at every
  segment's first slot, from :func:`seqpack.sample.unshift_labels`;
* ``images`` / ``videos`` / ``audios``: ``None`` (text packs only) and ``packing_params``
  (``sequence_boundaries`` = physical boundaries with the tail as a last sub-sequence,
  ``right_padding_length``), as LLaMA-Factory writes them.

Train with ``tokenized_path: <export dir>``, ``packing: true``, ``neat_packing: true`` (LLaMA-Factory
then builds the 4-D mask for eager / sdpa).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from seqpack.interop._export import open_source, save_dataset
from seqpack.packed import real_boundaries
from seqpack.sample import IGNORE_INDEX, unshift_labels

__all__ = ["LLAMAFACTORY_COLUMNS", "export_llamafactory", "to_llamafactory_row"]

LLAMAFACTORY_COLUMNS = ("input_ids", "attention_mask", "position_ids", "labels", "images", "videos", "audios",
                        "packing_params")
_NO_MEDIA = 2**32  # llamafactory's MAX_SU_SEQ_IDX: "no media item" in packing_params


def to_llamafactory_row(pack: Any, *, row_length: int | None = None, pad_token_id: int = 0,
                        final_target: str = "error") -> dict[str, Any]:
    """One pack as a LLaMA-Factory ``neat_packing`` row (module docstring).

    Args:
        pack: a text-only :class:`~seqpack.packed.PackedSequence`.
        row_length: row width ``W`` (>= the pack's ``T``); default ``T``.
        pad_token_id: token id of the tail padding.
        final_target: ``"error"`` or ``"drop"`` for a target on a segment's last physical slot, which
            unshifted labels cannot hold (:func:`seqpack.sample.unshift_labels`).

    Returns:
        dict of :data:`LLAMAFACTORY_COLUMNS`: ``input_ids``, ``attention_mask``, ``position_ids``,
        ``labels`` int64 ``[W]``; ``images``/``videos``/``audios`` ``None``; ``packing_params`` dict.

    Raises:
        ValueError: an image pack, ``row_length < T``, or an unrepresentable final target.
    """
    if any(m for m in (getattr(pack, "media", None) or [])):
        raise ValueError("to_llamafactory_row: image packs are not exported (LLaMA-Factory re-processes images "
                         "with its mm_plugin); export text packs, or train image data with seqpack's collators")
    _, cup, _ = real_boundaries(pack)
    T = int(cup[-1])
    W = T if row_length is None else int(row_length)
    if W < T:
        raise ValueError(f"row_length={W} is shorter than the pack ({T} tokens)")
    seg = np.asarray(pack.seq_idx, dtype=np.int64) + 1
    seg[np.asarray(pack.padding_mask, dtype=bool)] = 0
    labels = unshift_labels(np.asarray(pack.labels), cup, final_target=final_target,
                            sample_ids=getattr(pack, "sample_ids", None))
    tail = W - T

    def pad(x: np.ndarray, value: int) -> list[int]:
        return np.concatenate([np.asarray(x, dtype=np.int64), np.full(tail, value, np.int64)]).tolist()

    bounds = [int(b) for b in cup] + ([W] if tail else [])
    return {
        "input_ids": pad(pack.input_ids, pad_token_id),
        "attention_mask": pad(seg, 0),
        "position_ids": pad(pack.position_ids, 0),
        "labels": pad(labels, IGNORE_INDEX),
        "images": None,
        "videos": None,
        "audios": None,
        "packing_params": {"sequence_boundaries": bounds, "image_subseq_ids": [_NO_MEDIA],
                           "video_subseq_ids": [_NO_MEDIA], "audio_subseq_ids": [_NO_MEDIA],
                           "right_padding_length": tail},
    }


def export_llamafactory(source: Any, output_dir: str | os.PathLike, *, row_length: int | None = None,
                        pad_token_id: int | None = None, final_target: str = "error") -> Path:
    """Write packs as a ``datasets`` ``save_to_disk`` folder in LLaMA-Factory's ``neat_packing`` layout.

    Args:
        source: a seqpack packed dataset directory, a :class:`~seqpack.io.PackedDataset`, or an iterable
            of text ``PackedSequence`` s.
        output_dir: the folder to write (point LLaMA-Factory's ``tokenized_path`` at it); must not exist.
            Written into a hidden temp sibling and renamed into place when complete
            (:func:`seqpack.interop._export.save_dataset`): a killed export leaves no partial folder.
        row_length: every row's width; default the data's ``seq_length`` (an iterable: the longest pack).
        pad_token_id: tail padding id; default the data's ``pad_token_id`` (an iterable: 0).
        final_target: as :func:`to_llamafactory_row`.

    Memory: every row is built in memory before ``save_to_disk``: 163 bytes per token of Python objects
    (tracemalloc, 100 packs of 4000 tokens) plus the Arrow table; export a large dataset in parts.

    Returns:
        ``output_dir`` as a ``Path``.

    Raises:
        FileExistsError: ``output_dir`` exists. NotADirectoryError, PermissionError: its parent is a file / not
            writable (checked before any row is built). ValueError: as :func:`to_llamafactory_row`.
    """
    import datasets

    def build() -> Any:
        src = open_source(source)
        meta = getattr(src, "metadata", None)
        packs = list(src)
        width = row_length
        if width is None:
            width = int(meta.seq_length) if meta is not None else max(int(p.cu_seqlens_padded[-1]) for p in packs)
        pad = pad_token_id
        if pad is None:
            pad = int(meta.pad_token_id) if meta is not None and meta.pad_token_id is not None else 0
        return datasets.Dataset.from_list(
            [to_llamafactory_row(p, row_length=width, pad_token_id=pad, final_target=final_target) for p in packs])

    return save_dataset(build, output_dir)
