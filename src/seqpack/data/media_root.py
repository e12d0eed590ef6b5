"""Where image files may be read from: the media root (``docs/notes/media.md``).

Image references in records and image paths stored in packs come from outside (a downloaded data set, a
pack copied from another machine), so a reference is read only when the file it names lies inside the
*media root* after resolving symlinks (``os.path.realpath``): ``../`` escapes, absolute paths elsewhere
and symlinks pointing out are refused. The root is the folder given as ``media_dir`` (``--media-dir``),
else the data file's folder (``RawRecord.base_dir``; the current directory for in-memory records).
``allow_any_media_path=True`` (``--allow-any-media-path``) turns the check off.

Packs store each image path relative to the pack's media root (POSIX separators), so moving the data
and its images together keeps a pack readable (:func:`stored_image_path`, :func:`resolve_stored_image`).
This module is the one home of these rules: the record normaliser (``seqpack.data.formats.llava``), the
offline job (``seqpack.pipeline``) and the reader (``seqpack.io.media``) all call it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

__all__ = ["MEDIA_FIX", "URL_PREFIXES", "MediaRoot", "common_media_root", "inside_root", "is_url",
           "resolve_stored_image", "stored_image_path"]

#: Image references kept as given (not local files; never confined, loaded by the media stage).
URL_PREFIXES = ("data:", "http://", "https://", "s3://", "gs://", "hf://")

#: The fix named by every refusal of an image outside the root.
MEDIA_FIX = ("keep the images inside the media root, name the folder that holds them with media_dir=DIR, "
             "or pass allow_any_media_path=True if you trust the data to read images wherever it points")


def is_url(ref: Any) -> bool:
    """Whether ``ref`` is a URL / data URI string (:data:`URL_PREFIXES`), not a local path."""
    return isinstance(ref, str) and ref.startswith(URL_PREFIXES)


def inside_root(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether ``path`` lies inside ``root`` (or is it) once both are resolved with ``os.path.realpath``
    (symlinks followed, ``..`` collapsed): the one confinement test."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


@dataclass(frozen=True)
class MediaRoot:
    """The confinement policy for image references while records are read.

    Attributes:
        root: the explicit media root (absolute), or ``None``: each record's data folder
            (``RawRecord.base_dir``; the current directory for records without a file).
        allow_any: read images wherever they point (no confinement).
    """

    root: Path | None = None
    allow_any: bool = False

    @classmethod
    def create(cls, media_dir: str | os.PathLike | None = None, allow_any: bool = False) -> "MediaRoot":
        """Check ``media_dir`` and build the policy.

        Raises:
            ValueError: ``media_dir`` is not an existing folder (names it and the fix).
        """
        if media_dir is None:
            return cls(None, bool(allow_any))
        p = Path(media_dir).expanduser()
        if not p.is_dir():
            raise ValueError(f"media_dir={str(media_dir)!r} is not an existing folder; give the folder that "
                             "holds the images the records refer to")
        return cls(Path(os.path.abspath(p)), bool(allow_any))

    def for_record(self, base_dir: Path | None) -> Path:
        """The root that confines a record read from a file in ``base_dir`` (``None``: no file)."""
        if self.root is not None:
            return self.root
        return Path(base_dir) if base_dir is not None else Path.cwd()


def common_media_root(media_dir: str | os.PathLike | None, inputs: Iterable[Any]) -> Path:
    """The one root a pack's image paths are stored relative to: ``media_dir`` when given, else the deepest
    folder holding the folders of all file ``inputs`` (``os.path.commonpath``; a datasets folder counts as
    itself, a LLaMA-Factory source as its ``dataset_info.json`` folder, an in-memory input as the current
    directory): the roots records are confined to by default. Deterministic before any record is read."""
    if media_dir is not None:
        return Path(os.path.abspath(Path(media_dir).expanduser()))
    roots = []
    for item in inputs:
        p = getattr(item, "info_path", item)  # a LLaMA-Factory source: its dataset_info.json's folder
        if isinstance(p, (str, os.PathLike)):
            p = Path(p).resolve()
            roots.append(str(p if p.is_dir() else p.parent))
        else:
            roots.append(str(Path.cwd()))
    return Path(os.path.commonpath(roots)) if roots else Path.cwd()


def stored_image_path(path: str, root: str | os.PathLike | None) -> str:
    """The form a pack stores an image path in: relative to ``root`` with POSIX separators when the file
    lies inside it (lexically, else after ``realpath``); absolute otherwise (only possible with
    ``allow_any_media_path``); URLs and ``root=None`` unchanged.

    Args:
        path: the image file (absolute, or relative to the current directory).
        root: the pack's media root (:func:`common_media_root`).
    """
    if root is None or is_url(path):
        return path
    # lexical form first (keeps a symlink's own name); a path with '..' only in its real form, since
    # collapsing '..' lexically after a symlinked folder names another file
    forms = [(os.path.realpath(path), os.path.realpath(root))]
    if ".." not in Path(path).parts:
        forms.insert(0, (os.path.abspath(path), os.path.abspath(root)))
    for p, r in forms:
        rel = os.path.relpath(p, r)
        if rel != ".." and not rel.startswith(".." + os.sep) and not os.path.isabs(rel):
            return PurePosixPath(*Path(rel).parts).as_posix()
    return os.path.abspath(path)


def resolve_stored_image(stored: Any, root: str | os.PathLike | None, *, allow_any: bool = False) -> str:
    """The file a pack's stored image path names, checked like a record's reference.

    Args:
        stored: the path from the ``media`` column (relative POSIX path; absolute only in packs written
            with ``allow_any_media_path`` or by older seqpack versions).
        root: the media root (``load_packed(media_dir=)``, else the one recorded in ``metadata.json``).
        allow_any: accept any path (absolute, ``..``, resolving outside ``root``): no check.

    Returns:
        the absolute path (URLs unchanged).

    Raises:
        ValueError: not a string, empty, absolute, escaping with ``..``, or resolving outside ``root``
            (a symlink out); the message says why, the caller names the row.
    """
    if not isinstance(stored, str) or not stored:
        raise ValueError(f"stored image path {stored!r} is not a non-empty string")
    if is_url(stored):
        return stored
    p = Path(stored)
    if allow_any:
        return os.path.abspath(p if p.is_absolute() or root is None else Path(root) / p)
    if p.is_absolute() or PurePosixPath(stored).is_absolute() or "\\" in stored or ":" in stored.split("/")[0]:
        raise ValueError(
            f"stored image path {stored!r} is absolute; packs store paths relative to the media root. Re-pack "
            "the data, or pass allow_any_media_path=True to load_packed if you trust this dataset")
    if ".." in PurePosixPath(stored).parts:
        raise ValueError(f"stored image path {stored!r} climbs out of the media root with '..'")
    if root is None:
        raise ValueError(f"stored image path {stored!r} is relative but no media root is known; pass "
                         "media_dir= (the folder holding the images) to load_packed")
    full = os.path.join(os.path.abspath(root), *PurePosixPath(stored).parts)
    if not inside_root(full, root):
        raise ValueError(f"stored image path {stored!r} resolves to {os.path.realpath(full)}, outside the media "
                         f"root {root} (a symlink out?)")
    return full
