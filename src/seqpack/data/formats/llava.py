"""``llava``: the text side of LLaVA-style records: any other format plus ``image`` / ``images`` (a path
or a list of paths). ``<image>`` placeholders stay in the text; the image references are resolved
(relative to the data file's folder, then its ``images/`` folder, as in lmms-finetune) and kept in
``Conversation.images`` in placeholder order. Pixels are loaded elsewhere (``seqpack.data.media``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seqpack.data.formats._common import _Ctx
from seqpack.data.records import IMAGE_PLACEHOLDER

__all__ = ["has_images", "record_images"]


def has_images(rec: dict) -> bool:
    """Whether the record has a non-empty ``images`` / ``image`` field."""
    return not _empty_images(rec)


def _empty_images(rec: dict) -> bool:
    for key in ("images", "image"):
        v = rec.get(key)
        if v is None:
            continue
        if isinstance(v, (list, tuple)) and len(v) == 0:
            continue
        if isinstance(v, str) and v == "":
            continue
        return False
    return True


def record_images(rec: dict, msgs: list[dict], ctx: _Ctx) -> list[Any]:
    """The record's image references in placeholder order (paths resolved; objects kept as given).

    Raises:
        DataFormatError: both an images column and image parts, placeholder count != image count, or a
            missing image file.
    """
    refs: list[Any] = []
    for key in ("images", "image"):
        v = rec.get(key)
        if v is None or (isinstance(v, str) and v == ""):
            continue
        refs.extend(v if isinstance(v, (list, tuple)) else [v])
    if refs and ctx.inline_images:
        raise ctx.err(
            "the record has both an image/images column and image parts inside messages.",
            "image_placeholder_mismatch",
            "use one way to give images: either the images column with '<image>' placeholders, or image parts.",
        )
    refs = refs or list(ctx.inline_images)
    n_ph = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in msgs)
    if not refs:
        return []
    if n_ph != len(refs):
        raise ctx.err(
            f"{len(refs)} image(s) but {n_ph} '{IMAGE_PLACEHOLDER}' placeholder(s) in the text.",
            "image_placeholder_mismatch",
            f"put exactly one '{IMAGE_PLACEHOLDER}' in the text for each image, in order.",
        )
    out: list[Any] = []
    for r in refs:
        if isinstance(r, dict) and isinstance(r.get("path"), str) and not r.get("bytes"):
            r = r["path"]
        if isinstance(r, (str, os.PathLike)):
            out.append(_resolve_image(os.fspath(r), ctx))
        else:
            out.append(r)  # PIL image or {bytes, path} from a datasets Image column
    return out


def _resolve_image(ref: str, ctx: _Ctx) -> str:
    if ref.startswith(("data:", "http://", "https://", "s3://", "gs://", "hf://")):
        return ref  # URLs and data URIs are kept as given (loaded by the media stage)
    base = ctx.raw.base_dir
    candidates = [Path(ref)] if Path(ref).is_absolute() or base is None else [base / ref, base / "images" / ref]
    if base is None and not Path(ref).is_absolute():
        candidates = [Path(ref).resolve()]
    for c in candidates:
        if c.is_file():
            return str(c)
    raise ctx.err(
        f"image {ref!r} not found (looked at {', '.join(str(c) for c in candidates)}).",
        "missing_image",
        "make image paths relative to the data file's folder (or its images/ folder) or absolute.",
    )
