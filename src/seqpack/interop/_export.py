"""The one write path of the ``save_to_disk`` exporters (:func:`~seqpack.interop.axolotl.export_axolotl`,
:func:`~seqpack.interop.llamafactory.export_llamafactory`): the source opened the same way, the output
location checked before any data is read, and the folder published atomically.

The rows are written into a hidden sibling ``.NAME.tmp-<pid>-<id>`` and renamed onto ``output_dir``
only when ``save_to_disk`` has finished (:func:`seqpack.io.output_dir.publish_dir`), so a killed export
leaves no partial folder at ``output_dir``; the next export to the same path removes the leftover
(:func:`seqpack.io.output_dir.remove_leftovers`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from seqpack.io.output_dir import (
    check_output_dir,
    publish_dir,
    remove_leftovers,
    temp_name,
)

__all__ = ["open_source", "save_dataset"]


def open_source(source: Any) -> Any:
    """A packed dataset directory is opened with :func:`seqpack.io.load_packed`; anything else (a
    :class:`~seqpack.io.PackedDataset`, an iterable of ``PackedSequence``) is returned as is."""
    if isinstance(source, (str, os.PathLike)):
        from seqpack.io import load_packed

        return load_packed(source)
    return source


def save_dataset(build: Callable[[], Any], output_dir: str | os.PathLike) -> Path:
    """Check ``output_dir``, call ``build()`` (returns a ``datasets.Dataset``), ``save_to_disk`` it into a
    temp sibling and rename that onto ``output_dir``.

    Raises:
        FileExistsError: ``output_dir`` exists (or appeared while writing).
        NotADirectoryError, PermissionError: the output's parent is a file / not writable (before
            ``build`` runs, so no work is lost).
    """
    out = Path(output_dir)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} exists; remove it or choose another output_dir")
    check_output_dir(out, overwrite=False)
    remove_leftovers(out)
    ds = build()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(out, "tmp")
    try:
        ds.save_to_disk(str(tmp))
        publish_dir(tmp, out, overwrite=False)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
