"""``llava``: the text side of LLaVA-style records: any other format plus ``image`` / ``images`` (a path
or a list of paths). ``<image>`` placeholders stay in the text; the image references are resolved
(relative to the media root, by default the data file's folder, then its ``images/`` folder, as in
lmms-finetune; a file outside the root is refused, ``seqpack.data.media_root``) and kept in
``Conversation.images`` in placeholder order. Pixels are loaded elsewhere (``seqpack.data.media``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seqpack.data.formats._common import _Ctx
from seqpack.data.media_root import MEDIA_FIX, inside_root, is_url
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
        DataFormatError: both an images column and image parts, placeholder count != image count, a
            missing image file (``"missing_image"``), or one outside the media root (``"media_outside_root"``).
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
        given = [k for k in ("images", "image") if k in rec]
        if given and n_ph:  # an emptied image column: the placeholders would be trained on as literal text
            raise ctx.err(
                f"'{given[0]}' is {_json_empty(rec[given[0]])} but the text has {n_ph} '{IMAGE_PLACEHOLDER}' "
                "placeholder(s).",
                "image_placeholder_mismatch",
                f"give the image path(s), one per '{IMAGE_PLACEHOLDER}', or remove the placeholders (and the empty "
                f"'{given[0]}') for a text-only record.",
            )
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


def _json_empty(v: Any) -> str:
    return "null" if v is None else "an empty list" if isinstance(v, (list, tuple)) else "an empty string"


def _resolve_image(ref: str, ctx: _Ctx) -> str:
    """The absolute path of an image reference: tried as ``root/ref`` then ``root/images/ref`` (an absolute
    ``ref`` as itself), the first existing file inside the media root wins
    (``seqpack.data.media_root``); URLs and data URIs are kept as given (loaded by the media stage)."""
    if is_url(ref):
        return ref
    policy = ctx.media
    root = policy.for_record(ctx.raw.base_dir)
    p = Path(ref)
    candidates = [p] if p.is_absolute() else [root / ref, root / "images" / ref]
    outside = None
    for c in candidates:
        if not c.is_file():
            continue
        if policy.allow_any or inside_root(c, root):
            return str(c)
        outside = outside or c
    if outside is not None:
        raise ctx.err(
            f"image {ref!r} resolves to {os.path.realpath(outside)}, outside the media root {root}; seqpack reads "
            "images only inside the media root (a '../' path, an absolute path elsewhere or a symlink out).",
            "media_outside_root",
            MEDIA_FIX + "; on_error='skip' skips and reports the record.",
        )
    folders = [c for c in candidates if c.is_dir()]
    if folders:
        raise ctx.err(
            f"image {ref!r} is a folder ({folders[0]}), not an image file.",
            "missing_image",
            "give the path of one image file per placeholder (a list of paths for several images).",
        )
    raise ctx.err(
        f"image {ref!r} not found (looked at {', '.join(str(c) for c in candidates)}).",
        "missing_image",
        f"make image paths relative to the media root {root} (or its images/ folder), or name the folder "
        "holding the images with media_dir=DIR.",
    )
