"""Image-text packs read back: the per-segment ``media`` entries of a stored pack and, on request, their
``pixel_values`` recomputed from the image files (used by :class:`seqpack.io.PackedDataset`).

Stored image paths are relative to the pack's media root (``seqpack.data.media_root``). The root is
recorded in ``metadata.json`` (``media.media_root``, absolute, and ``media.media_root_relative``, from the
dataset folder) outside the fingerprint; a reader takes ``media_dir=`` when given, else the recorded
absolute root when it exists, else the recorded root relative to the dataset folder (data and pack
moved together). Stored paths are checked (:func:`seqpack.data.media_root.resolve_stored_image`)
before any file is opened.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from seqpack.data.media import load_image_processor, process_images
from seqpack.data.media_root import resolve_stored_image
from seqpack.io.metadata import PackedDatasetError

__all__ = ["PackMedia", "find_media_root", "image_processor_from_metadata", "media_root_metadata", "segment_media"]


def media_root_metadata(media_root: str | os.PathLike, output: str | os.PathLike) -> dict[str, str]:
    """The ``metadata.json`` ``media`` keys naming a pack's media root: ``media_root`` (absolute) and
    ``media_root_relative`` (from the dataset folder ``output``, POSIX separators)."""
    root = os.path.abspath(media_root)
    rel = os.path.relpath(root, os.path.abspath(output))
    return {"media_root": root, "media_root_relative": PurePosixPath(*Path(rel).parts).as_posix()}


def find_media_root(path: Path, media: Mapping[str, Any] | None, media_dir: str | os.PathLike | None = None
                    ) -> Path | None:
    """The folder a dataset's stored image paths resolve against (module docstring): ``media_dir``, else
    ``media_root`` when it is a folder, else ``path / media_root_relative`` when that is one (data and pack
    moved together), else ``media_root``; ``None`` when neither is recorded (packs from older seqpack
    versions store absolute paths).

    Raises:
        PackedDatasetError: ``media_dir`` is not an existing folder.
    """
    if media_dir is not None:
        if not Path(media_dir).is_dir():
            raise PackedDatasetError(f"{path}: media_dir={str(media_dir)!r} is not an existing folder; give the folder "
                                     "the pack's image paths are relative to (the data's media root)")
        return Path(os.path.abspath(media_dir))
    media = media or {}
    rel, root = media.get("media_root_relative"), media.get("media_root")
    root = Path(root) if isinstance(root, str) and root else None
    if (root is None or not root.is_dir()) and isinstance(rel, str) and rel and (path / rel).is_dir():
        return Path(os.path.abspath(path / rel))
    return root


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
                  merge_size: int, processor: Callable[[], Any] | None = None, root: Path | None = None,
                  allow_any: bool = False, row: str | None = None) -> list[Any] | None:
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
        root: the media root the stored image paths resolve against (:func:`find_media_root`).
        allow_any: accept stored paths that are absolute or resolve outside ``root``.
        row: where the pack is stored, for error messages (e.g. ``"row 3 of shard data/shard-00000.parquet"``).

    Returns:
        one entry per segment (``None`` for text-only ones) with ``images`` (absolute paths), ``image_grid_thw`` (int64
        ``[k, 3]``), ``image_tokens`` (int64 ``[k]``) and, with ``processor``, ``pixel_values``; ``None``
        when ``raw`` is empty or no segment has images.

    Raises:
        PackedDatasetError: a stored image path that is absolute, climbs out with ``..`` or resolves outside
            the media root (names the pack, its shard row and the fix); an image file is missing or
            unreadable, or its recomputed grid differs from the stored one (the file changed since packing).
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
        try:
            images = [resolve_stored_image(x, root, allow_any=allow_any) for x in m["images"]]
        except ValueError as e:
            raise PackedDatasetError(
                f"{path}: pack {i}{f' ({row})' if row else ''}, segment {j}: {e}. The shard or metadata.json was "
                "altered, or the pack was written by an older seqpack (absolute paths): re-pack the data, give "
                "media_dir= (the folder holding the images), or pass allow_any_media_path=True to load_packed if "
                "you trust this dataset") from None
        seg = {
            "images": images,
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
                    f"{path}: pack {i}, segment {j} (sample {sid!r}): {e}; the stored image paths are relative to "
                    f"the media root {root}: keep the images there, or pass media_dir= (the folder that now holds "
                    "them) to load_packed"
                ) from e
            if not np.array_equal(g2, grid):
                raise PackedDatasetError(
                    f"{path}: pack {i}, segment {j}: image grids {g2.tolist()} differ from the stored "
                    f"{grid.tolist()}: an image file changed since packing; re-pack the data"
                )
            seg["pixel_values"] = pv
        out.append(seg)
    return out if any(x is not None for x in out) else None


class PackMedia:
    """The image side of a :class:`seqpack.io.PackedDataset`: where its stored image paths resolve
    (:func:`find_media_root`), the image processor (rebuilt once, on first use) and each pack's
    ``media`` entries (:func:`segment_media`). Picklable (the processor is rebuilt in each worker).

    Args:
        path: the dataset directory.
        media: ``metadata.media`` (``None`` for text-only data).
        load_media: recompute ``pixel_values`` on access.
        media_dir, allow_any: as ``load_packed(media_dir=, allow_any_media_path=)``.

    Raises:
        PackedDatasetError: ``media_dir`` is not a folder.
    """

    def __init__(self, path: Path, media: Mapping[str, Any] | None, *, load_media: bool = False,
                 media_dir: str | os.PathLike | None = None, allow_any: bool = False) -> None:
        self.path = Path(path)
        self.meta = dict(media or {})
        self.load_media = bool(load_media)
        self.root = find_media_root(self.path, media, media_dir)
        self.allow_any = bool(allow_any)
        self.merge_size = int(self.meta.get("merge_size") or 2)
        self._processor: Any = None

    def processor(self):
        """The image processor of ``metadata.media["image_processor"]`` (cached; :func:`image_processor_from_metadata`)."""
        if self._processor is None:
            self._processor = image_processor_from_metadata(self.path, self.meta or None)
        return self._processor

    def segments(self, i: int, raw: Sequence[Any] | None, sample_ids: Sequence[Any], row: Callable[[], str]):
        """:func:`segment_media` of pack ``i`` (``row()`` names its shard row, called only for a pack with media)."""
        if not raw:
            return None
        return segment_media(self.path, i, raw, sample_ids, merge_size=self.merge_size,
                             processor=self.processor if self.load_media else None, root=self.root,
                             allow_any=self.allow_any, row=row())

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_processor": None}
