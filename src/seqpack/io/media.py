"""Image-text packs read back: the per-segment ``media`` entries of a stored pack and, on request, their
``pixel_values`` recomputed from the image files (used by :class:`seqpack.io.PackedDataset`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from seqpack.data.media import load_image_processor, process_images
from seqpack.io.metadata import PackedDatasetError

__all__ = ["image_processor_from_metadata", "segment_media"]


def image_processor_from_metadata(path: Path, media: Mapping[str, Any] | None):
    """The image processor rebuilt from ``media["image_processor"]`` (``metadata.media`` of ``path``).

    Raises:
        PackedDatasetError: ``media`` is ``None`` or has no ``image_processor`` (no images in the dataset).
    """
    cfg = (media or {}).get("image_processor")
    if cfg is None:
        raise PackedDatasetError(f"{path}: the dataset holds no images (metadata.json has no media)")
    return load_image_processor(cfg)


def segment_media(path: Path, i: int, raw: Sequence[Any] | None, sample_ids: Sequence[Any], *,
                  merge_size: int, processor: Callable[[], Any] | None = None) -> list[Any] | None:
    """The ``PackedSequence.media`` list of pack ``i`` from its stored ``media`` column value ``raw``.

    Args:
        path: the dataset directory (for error messages).
        i: the pack index (for error messages).
        raw: the decoded ``media`` column: one entry per segment, falsy for a text-only segment.
        sample_ids: the pack's sample ids, one per segment (for error messages).
        merge_size: the processor's merge size; ``image_tokens = prod(grid) // merge_size**2`` when
            the entry does not store them.
        processor: ``None``: no pixels; else a callable returning the image processor, called only for
            segments with images, whose ``pixel_values`` (float32 ``[sum prod(grid), D]``) are recomputed.

    Returns:
        one entry per segment (``None`` for text-only ones) with ``images``, ``image_grid_thw`` (int64
        ``[k, 3]``), ``image_tokens`` (int64 ``[k]``) and, with ``processor``, ``pixel_values``; ``None``
        when ``raw`` is empty or no segment has images.

    Raises:
        PackedDatasetError: an image file is missing or unreadable, or its recomputed grid differs from
            the stored one (the file changed since packing).
    """
    if not raw:
        return None
    out: list[Any] = []
    for j, m in enumerate(raw):
        if not m:
            out.append(None)
            continue
        grid = np.asarray(m["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
        ntok = m.get("image_tokens")
        seg = {
            "images": list(m["images"]),
            "image_grid_thw": grid,
            "image_tokens": (np.asarray(ntok, dtype=np.int64) if ntok is not None
                             else np.prod(grid, axis=1) // merge_size**2),
        }
        if processor is not None:
            try:
                pv, g2 = process_images(seg["images"], processor())
            except (FileNotFoundError, ValueError) as e:
                sid = sample_ids[j] if j < len(sample_ids) else j
                raise PackedDatasetError(
                    f"{path}: pack {i}, segment {j} (sample {sid!r}): {e}; the image files must stay "
                    "where they were when the data was packed (paths are stored in the media column)"
                ) from e
            if not np.array_equal(g2, grid):
                raise PackedDatasetError(
                    f"{path}: pack {i}, segment {j}: image grids {g2.tolist()} differ from the stored "
                    f"{grid.tolist()}: an image file changed since packing; re-pack the data"
                )
            seg["pixel_values"] = pv
        out.append(seg)
    return out if any(x is not None for x in out) else None
