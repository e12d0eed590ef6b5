"""Images for Qwen2-VL-style models: open by content, build the image processor, run it, count image
tokens, and concatenate per-segment media for a forward pass.

Images are opened by content, not extension (real data has ``.jpg`` files that are PNG or WebP), and
converted to RGB (transparent pixels composited on white).
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = [
    "ImageError", "PixelBoundsError", "collate_media", "load_image_processor", "num_image_tokens", "open_image",
    "process_images", "processor_settings",
]


class ImageError(ValueError):
    """An image that cannot be used: unreadable, truncated or corrupt (``reason`` ``"bad_media"``), or above
    PIL's pixel limit ``PIL.Image.MAX_IMAGE_PIXELS`` (``"image_too_large"``, a decompression bomb guard).

    Attributes:
        reason: the report key of a record skipped for it (``seqpack.accounting.SampleRecord.reason``).
    """

    def __init__(self, message: str, reason: str = "bad_media") -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        return (type(self), (str(self), self.reason))


class PixelBoundsError(ValueError):
    """``min_pixels`` / ``max_pixels`` that are not integers with 1 <= min_pixels <= max_pixels (the message
    names the argument)."""


def open_image(image: Any, *, background: tuple[int, int, int] = (255, 255, 255)):
    """Open an image by content and return it as an RGB ``PIL.Image.Image``.

    Args:
        image: a path (``str``/``Path``; the extension is ignored: PIL reads the header, so a
            ``.jpg`` that is really PNG or WebP opens fine), raw ``bytes``, a ``{"bytes", "path"}``
            dict (HF ``datasets`` Image column) or a PIL image.
        background: RGB colour that transparent pixels are composited onto (RGBA, LA, P with
            transparency); plain ``convert("RGB")`` would expose whatever colour hides under alpha 0.

    Returns:
        ``PIL.Image.Image`` in mode ``"RGB"``, fully loaded (the file is closed).

    Raises:
        FileNotFoundError: the path does not exist.
        ImageError: (a ``ValueError``) the content is not an image PIL can read, is truncated or corrupt
            (``reason="bad_media"``, names the path and PIL's message), or has more pixels than
            ``PIL.Image.MAX_IMAGE_PIXELS`` (``reason="image_too_large"``; PIL's warning level is refused
            too, before any pixel is decoded: a tiny file can declare a huge canvas).
    """
    import io
    import warnings

    from PIL import Image

    name = "<image object>"
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            image, name = image["bytes"], str(image.get("path") or "<bytes>")
        elif image.get("path") is not None:
            image = image["path"]
    if isinstance(image, Image.Image):
        img = image
    else:
        if isinstance(image, (bytes, bytearray)):
            fh: Any = io.BytesIO(image)
            name = name if name != "<image object>" else "<bytes>"
        else:
            name = os.fspath(image)
            if not os.path.exists(name):
                raise FileNotFoundError(f"image file not found: {name}")
            fh = name
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                img = Image.open(fh)
                try:
                    _check_pixels(img, name)
                except ImageError:
                    img.close()
                    raise
                img.load()
        except ImageError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            found = re.search(r"\((\d+) pixels\)", str(e))  # PIL: "Image size (N pixels) exceeds limit of ..."
            raise _too_large(name, f"{int(found.group(1))} pixels" if found else str(e)) from None
        except Exception as e:  # noqa: BLE001 - PIL's decoders raise OSError, SyntaxError, EOFError, ValueError...
            raise ImageError(f"cannot read image {name}: {type(e).__name__}: {e}; the file is not a complete image "
                             "in a format PIL supports (truncated, corrupt or another kind of file)") from e
    _check_pixels(img, name)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, background)
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    if img.mode != "RGB":
        return img.convert("RGB")
    return img


def _too_large(name: str, detail: str) -> ImageError:
    from PIL import Image

    return ImageError(
        f"image {name} is too large to decode safely ({detail}); seqpack refuses images over "
        f"PIL.Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS} pixels, a decompression bomb guard. Fix: resize "
        "the image, remove the record "
        "(on_error='skip' skips and reports it), or, if you trust the file, raise the limit from Python "
        "(`PIL.Image.MAX_IMAGE_PIXELS = N` before calling seqpack.pack_dataset; the CLI has no option for it)",
        reason="image_too_large")


def _check_pixels(img: Any, name: str) -> None:
    """Refuse an image whose declared size exceeds ``PIL.Image.MAX_IMAGE_PIXELS`` (``None``: no limit)."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    w, h = img.size
    if limit is not None and w * h > limit:
        raise _too_large(name, f"{w} x {h} = {w * h} pixels")


def load_image_processor(config: Any = None, *, min_pixels: int | None = None, max_pixels: int | None = None):
    """Build a Qwen2-VL image processor offline (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 all use this class).

    Args:
        config: ``None`` for transformers' defaults (patch 14, merge 2, temporal patch 2, pixels in
            [3136, 1003520]); a dict of processor settings; a path to a ``preprocessor_config.json`` (or a
            folder holding one), e.g. from a Qwen2.5-VL checkpoint; or a processor (returned as it is
            unless a bound is given). ``min_pixels``/``max_pixels`` in the settings are honoured. Nothing
            is downloaded. The settings must be the model's: Qwen3-VL / Qwen3.5 checkpoints use
            ``patch_size`` 16 (their processor is this same class), Qwen2-VL / Qwen2.5-VL 14;
            ``seqpack.hf.packed_forward`` refuses pixels whose patch size differs from the vision tower's.
        min_pixels, max_pixels: override the pixel bounds of ``config`` (``size.shortest_edge`` /
            ``size.longest_edge`` in transformers 5: each resized image's area in pixels stays in
            [min_pixels, max_pixels]; fewer pixels = fewer image tokens). The one home of these overrides
            (``seqpack pack --min-pixels/--max-pixels``, ``prepare_multimodal``).

    Returns:
        a transformers ``Qwen2VLImageProcessor`` (the PIL backend when torchvision is absent).

    Raises:
        FileNotFoundError: the path does not exist or the folder has no preprocessor_config.json.
        PixelBoundsError: a bound that is not an integer >= 1, or min_pixels > max_pixels (after applying
            the overrides to ``config``'s bounds).

    Example::

        proc = load_image_processor(max_pixels=64 * 28 * 28)   # at most 64 merged patches = 16 image tokens
    """
    for key, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise PixelBoundsError(f"{key} must be an integer >= 1, got {v!r}")
    proc = _build_processor(config)
    if min_pixels is None and max_pixels is None:
        return proc
    cfg = processor_settings(proc)
    size = dict(cfg.get("size") or {})
    if min_pixels is not None:
        size["shortest_edge"] = cfg["min_pixels"] = int(min_pixels)
    if max_pixels is not None:
        size["longest_edge"] = cfg["max_pixels"] = int(max_pixels)
    lo, hi = size.get("shortest_edge"), size.get("longest_edge")
    if lo is not None and hi is not None and lo > hi:
        both = min_pixels is not None and max_pixels is not None
        raise PixelBoundsError(
            f"min_pixels={lo} > max_pixels={hi}: min_pixels must not exceed max_pixels" if both else
            f"min_pixels={lo} > max_pixels={hi} after applying min_pixels / max_pixels to the image processor "
            "config; set both"
        )
    cfg["size"] = size
    return _build_processor(cfg)


def _build_processor(config: Any):
    """The processor of ``config`` (see :func:`load_image_processor`), without bound overrides."""
    cls = _processor_class()
    if config is None:
        return cls()
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / "preprocessor_config.json"
        if not path.is_file():
            raise FileNotFoundError(f"image processor config not found: {path} (expected preprocessor_config.json)")
        config = json.loads(path.read_text())
    if hasattr(config, "merge_size") and hasattr(config, "__call__"):
        return config  # already a processor
    drop = {"image_processor_type", "processor_class", "auto_map", "_processor_class"}
    return cls(**{k: v for k, v in dict(config).items() if k not in drop})


def processor_settings(proc: Any) -> dict[str, Any]:
    """JSON-safe settings of an image processor (``to_dict()``); ``load_image_processor`` of the result
    rebuilds an equivalent processor (same resize bounds, patch/merge sizes, normalisation)."""
    d = proc.to_dict() if hasattr(proc, "to_dict") else dict(proc)
    d = json.loads(json.dumps(d, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    size = d.get("size") or {}
    for key, alt in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if d.get(key) is None and isinstance(size, dict) and size.get(alt) is not None:
            d[key] = size[alt]
    return d


@lru_cache(maxsize=1)
def _processor_class():
    import importlib.util

    import transformers

    if importlib.util.find_spec("torchvision") is None and hasattr(transformers, "Qwen2VLImageProcessorPil"):
        return transformers.Qwen2VLImageProcessorPil
    return transformers.Qwen2VLImageProcessor


def process_images(images: Sequence[Any], image_processor) -> tuple[np.ndarray, np.ndarray]:
    """Run the image processor on a sample's images (opened with :func:`open_image`).

    Returns:
        ``(pixel_values, image_grid_thw)``: float32 ``[sum_i prod(grid_i), D]`` (``D = 3 *
        temporal_patch_size * patch_size**2``, rows in image order) and int64 ``[len(images), 3]``.
    """
    if len(images) == 0:
        return np.zeros((0, 0), np.float32), np.zeros((0, 3), np.int64)
    opened = [open_image(x) for x in images]
    out = image_processor(images=opened, return_tensors="np")
    pv = np.asarray(out["pixel_values"], dtype=np.float32)
    grid = np.asarray(out["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
    if grid.shape[0] != len(images) or pv.shape[0] != int(np.prod(grid, axis=1).sum()):
        raise RuntimeError(
            f"image processor returned {grid.shape[0]} grids / {pv.shape[0]} patch rows for {len(images)} images"
        )
    return pv, grid


def num_image_tokens(image_grid_thw: np.ndarray, merge_size: int) -> np.ndarray:
    """Image tokens per image: ``prod(grid_thw) // merge_size**2`` (Qwen2-VL's merger), int64 ``[k]``."""
    g = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
    return np.prod(g, axis=1) // (int(merge_size) ** 2)


def collate_media(media: Sequence[dict | None] | None) -> dict[str, np.ndarray] | None:
    """Concatenate per-segment media (``PackedSequence.media``) into one model input, pack order.

    Returns:
        ``{"pixel_values": float32 [P, D], "image_grid_thw": int64 [K, 3]}`` where image ``j``'s
        patch rows follow image ``j-1``'s, matching the order of the image-token runs in
        ``input_ids``; ``None`` when no segment has images.
    """
    if not media:
        return None
    with_images = [m for m in media if m and m.get("image_grid_thw") is not None and len(m["image_grid_thw"])]
    if not with_images:
        return None
    missing = [i for i, m in enumerate(with_images) if m.get("pixel_values") is None]
    if missing:
        raise ValueError(
            f"{len(missing)} segment(s) with images carry image_grid_thw but no pixel_values (e.g. images "
            f"{with_images[missing[0]].get('images')}). Offline packs store image paths, not pixels: open the "
            "dataset with seqpack.io.load_packed(path, load_media=True) so pixel_values are recomputed."
        )
    pv = [m["pixel_values"] for m in with_images]
    grids = [m["image_grid_thw"] for m in with_images]
    return {
        "pixel_values": np.concatenate([np.asarray(x, np.float32) for x in pv]),
        "image_grid_thw": np.concatenate([np.asarray(g, np.int64).reshape(-1, 3) for g in grids]),
    }
