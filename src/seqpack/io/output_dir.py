"""The output directory of a packed dataset: refuse what must not be written, clean up after killed
writers, fsync, and publish the finished temp directory atomically.

Rules:

- The output location is checked before any data is read (:func:`check_output_dir`): its parent must be
  a directory seqpack can create entries in, the output must not be a file or a mount point (a dataset
  is published by renaming a finished folder onto the output path), nor ``-`` (stdout: a dataset is a folder).
- An existing dataset is replaced only with ``overwrite=True``, and only if the folder holds nothing but
  what seqpack writes (:data:`SEQPACK_ENTRIES`, and in ``data/`` the shards its ``metadata.json`` lists);
  any other file is named in the refusal and never deleted, nor is a non-empty folder that is no seqpack dataset.
- Publishing is atomic from the reader's view: on Linux the finished folder and the old dataset are
  swapped with one ``renameat2(RENAME_EXCHANGE)`` call, so the output path holds the old or the new
  dataset at every instant. Elsewhere (or on a file system without it) the old dataset is renamed aside to
  ``.NAME.old-<pid>-<id>`` first; if the process dies between the two renames, the next run restores it.
- Leftovers of killed runs (``.NAME.tmp-<pid>-*`` write folders, ``.NAME.spill-<pid>-*`` sample spills,
  ``.NAME.old-<pid>-*`` replaced datasets) whose process is gone are removed by the next run for the same
  output (:func:`remove_leftovers`, called only by the holder of the output's lock, seqpack.io.output_lock).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable

from seqpack.io.metadata import (CACHE_DIR, DATA_DIR, METADATA_FILE, REPORT_FILE, REPORT_PNG, PackedDatasetError,
                                 PackedMetadata, is_packed_dataset)

__all__ = [
    "LEFTOVER_KINDS",
    "SEQPACK_ENTRIES",
    "check_inputs_outside",
    "check_location",
    "check_output_dir",
    "check_output_file",
    "fsync_dir",
    "fsync_file",
    "publish_dir",
    "remove_leftovers",
    "replace_dir",
    "stranger_entries",
    "temp_name",
]

#: What seqpack writes at the top of a dataset folder (``report.png``: ``seqpack inspect``'s plot;
#: ``.cache``: the reader's Arrow cache).
SEQPACK_ENTRIES = (METADATA_FILE, REPORT_FILE, REPORT_PNG, DATA_DIR, CACHE_DIR)

#: A shard as the writer names it (``data/shard-00000.parquet``).
_OWN_SHARD = re.compile(r"shard-\d{5,}\.parquet")
#: A file of the reader's Arrow cache: ``<shard stem>-<key>.arrow`` (+ the reader's ``.json`` side files),
#: or one being written (``.tmp-<pid>-<id>``).
_OWN_CACHE_FILE = re.compile(r"shard-\d{5,}-[0-9A-Za-z]+\.(arrow|json)(\.tmp-\d+-[0-9a-f]+)?")

#: Hidden sibling folders a run creates beside the output: ``.NAME.<kind>-<pid>-<id>``.
LEFTOVER_KINDS = ("tmp", "spill", "old")


def fsync_file(path: Path) -> None:
    """``fsync`` a file (its data reaches the disk before the rename that publishes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """``fsync`` a directory (its entries, e.g. a rename, reach the disk); ignored where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def temp_name(output: str | os.PathLike, kind: str) -> Path:
    """The hidden sibling ``.NAME.<kind>-<pid>-<id>`` of ``output`` for this process (``kind`` in
    :data:`LEFTOVER_KINDS`); :func:`remove_leftovers` recognises it once the process is gone."""
    if kind not in LEFTOVER_KINDS:
        raise ValueError(f"kind must be one of {LEFTOVER_KINDS}, got {kind!r}")
    out = Path(output)
    return out.parent / f".{out.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def stranger_entries(output: str | os.PathLike) -> list[str]:
    """Paths (relative to ``output``) inside a dataset folder that seqpack did not write, e.g.
    ``["NOTES.md", "data/extra.bin"]``.

    seqpack writes :data:`SEQPACK_ENTRIES` at the top (plain files and folders, never links), in ``data/``
    the shards ``metadata.json`` lists (``PackedMetadata.listed_files``, as ``load_packed(verify=True)``)
    and ``shard-NNNNN-<key>.arrow`` files in ``.cache/``; anything else (a user's notes, a checkpoint, an
    input, ``data/shard-00000.parquet.bak``, a shard copied in) is a stranger, a shard-named one with the
    reason: ``data/shard-00099.parquet (not listed in metadata.json)``. When ``metadata.json`` is missing or
    unreadable (a damaged dataset), every ``data/shard-NNNNN.parquet`` counts as seqpack's.
    """
    out = Path(output)
    try:
        listed = PackedMetadata.read(out).listed_files()
    except (PackedDatasetError, OSError):
        listed = None
    found = []
    for p in sorted(out.iterdir()):
        kind = "/" if p.is_dir() and not p.is_symlink() else ""
        if p.name not in SEQPACK_ENTRIES or p.is_symlink():
            found.append(p.name + kind + (" (a link)" if p.is_symlink() else ""))
        elif p.name in (DATA_DIR, CACHE_DIR):
            if not p.is_dir():
                found.append(p.name)
                continue
            own = _OWN_SHARD if p.name == DATA_DIR else _OWN_CACHE_FILE
            for q in sorted(p.iterdir()):
                rel = f"{p.name}/{q.name}"
                if q.is_symlink() or not q.is_file():
                    found.append(rel + ("/" if q.is_dir() and not q.is_symlink() else ""))
                elif p.name == DATA_DIR and listed is not None:  # listed AND shard-named: a crafted list owns nothing else
                    if rel not in listed or not own.fullmatch(q.name):
                        found.append(rel + (f" (not listed in {METADATA_FILE})" if own.fullmatch(q.name) else ""))
                elif not own.fullmatch(q.name):
                    found.append(rel)
        elif not p.is_file():
            found.append(p.name + "/")
    return found


def check_location(out: Path) -> None:
    """The parent chain of ``out`` must lead to a directory this process can create entries in; ``out``
    must not be a symbolic link and its name must leave room for the hidden sibling names
    (:func:`temp_name`) within the file system's name limit.

    Raises:
        FileExistsError: ``out`` is a symbolic link or a mount point.
        NotADirectoryError / PermissionError: its nearest existing parent is a file / not writable.
        OSError: (``ENAMETOOLONG``) its name, with the hidden siblings' suffix, or a folder name in the path
            is longer than the file system takes; the message says how long a name may be.
    """
    try:
        _check_location(out)
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG or e.filename is None:  # ours carry the message already
            raise
        raise OSError(errno.ENAMETOOLONG, f"cannot write the output {out}: a folder name in it is longer than the "
                      "file system takes (ENAMETOOLONG); choose a shorter --output") from None


def _check_location(out: Path) -> None:
    parent = out.absolute().parent
    probe = parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise NotADirectoryError(
            f"cannot write the output {out}: {probe} is a file, not a folder; choose an --output whose parent "
            "is a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(
            f"cannot write the output {out}: no permission to create files in {probe}; choose an --output in a "
            "folder you can write to")
    try:
        name_max = os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = len(temp_name(out, "spill").name) + 7  # room for a 7-digit larger pid
    if longest > name_max:
        raise OSError(
            errno.ENAMETOOLONG,
            f"cannot write the output {out}: its name is {len(out.name)} characters, and the hidden folders seqpack "
            f"writes beside it (.NAME.spill-PID-ID) need {longest - len(out.name)} more, over this file system's "
            f"limit of {name_max}; choose an --output name of at most {name_max - (longest - len(out.name))} "
            "characters")
    if out.is_symlink():
        raise FileExistsError(
            f"output {out} is a symbolic link (to {os.readlink(out)}); seqpack publishes a dataset by renaming a "
            f"finished folder onto the output path, which would replace the link itself. Pass the link's target "
            f"as the output: --output {os.path.realpath(out)}")
    if out.exists() and out.is_dir() and os.path.ismount(out):
        raise FileExistsError(
            f"output {out} is a mount point; seqpack publishes a dataset by renaming a finished folder onto the "
            f"output path, which a mount point cannot take. Use a folder inside it, e.g. --output {out / 'packed'}")


def check_inputs_outside(output: Path, inputs: Iterable[Any]) -> None:
    """Refuse inputs that lie inside the output folder: publishing the new dataset replaces the folder's
    seqpack-named files (``report.jsonl``, ``metadata.json``, ``data/*``) and a stranger file blocks
    ``--overwrite``, so such an input would be destroyed or the run refused only after all the work.
    ``inputs``: paths, or objects with a ``path`` / ``info_path`` (``LlamaFactorySource``); others are
    in-memory data and ignored. Compared after ``realpath`` (links into the folder count).

    Raises:
        FileExistsError: naming every input inside ``output`` and the fix.
    """
    root = os.path.realpath(output)
    inside = []
    for item in inputs:
        for p in (item,) if isinstance(item, (str, os.PathLike)) else (getattr(item, "path", None),
                                                                     getattr(item, "info_path", None)):
            if isinstance(p, (str, os.PathLike)) and Path(os.path.realpath(p)).is_relative_to(root):
                inside.append(str(p))
    if inside:
        shown = ", ".join(inside[:5]) + (f" and {len(inside) - 5} more" if len(inside) > 5 else "")
        raise FileExistsError(
            f"input {shown} is inside the output folder {output}; writing the dataset there would replace or "
            "delete it. Move the input out of the folder, or choose another --output")


def check_output_file(path: str | os.PathLike, what: str, example: str = "out") -> Path:
    """``path`` as a file the user asked seqpack to write (a plot, a recipe), checked before any work;
    ``example`` is the file name the message suggests inside a folder given instead.

    Raises:
        IsADirectoryError: ``path`` is an existing folder or ends with ``/`` (the message asks for a file name
            in it, e.g. ``<path>/<example>``).
        NotADirectoryError: its parent is a file.
        FileNotFoundError: its folder does not exist (never created: a typo must not make folders).
        PermissionError: the file (when it exists) or its folder is not writable by this user.
    """
    p = Path(path).expanduser()
    if p.is_dir() or os.fspath(path).endswith(("/", os.sep)):  # "new/" names a folder even before it exists
        raise IsADirectoryError(f"{what} {os.fspath(path)} is a folder, not a file; give a file name, e.g. {p / example}")
    if not p.parent.is_dir():
        is_file = p.parent.exists()
        raise (NotADirectoryError if is_file else FileNotFoundError)(
            f"cannot write the {what} {p}: " + (f"{p.parent} is a file, not a folder; choose another path" if is_file
                                                else f"the folder {p.parent} does not exist; create it first or "
                                                "choose another path"))
    if not os.access(p if p.exists() else p.parent, os.W_OK):
        where = f"the file {p}" if p.exists() else f"the folder {p.parent}"
        raise PermissionError(f"cannot write the {what} {p}: {where} is not writable by this user; choose "
                              "another path")
    return p


def check_output_dir(output: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an output location that must not be written (call it before any data is read); returns
    ``output`` as a ``Path``.

    Raises:
        NotADirectoryError: a parent of ``output`` is a file.
        PermissionError: the nearest existing parent is not writable; an existing dataset to overwrite
            that this user cannot delete (a folder of it not writable).
        TypeError: ``output`` is not a str or path (e.g. ``None``).
        ValueError: ``output`` is an empty string, or ``"-"`` (stdout: a packed dataset is a folder).
        FileExistsError: ``output`` is a file or a mount point; an existing seqpack dataset and
            ``overwrite`` is False; a dataset holding files seqpack did not write (named, never
            deleted); a non-empty directory that is not a seqpack dataset (never deleted).
    """
    if not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"output must be the dataset folder to create (a str or path, e.g. 'packed'), got "
                        f"{type(output).__name__}")
    if not str(output).strip():  # Path("") is Path("."): an empty --output would mean the current folder
        raise ValueError(f"output {str(output)!r} is empty; pass the dataset folder to create, e.g. --output packed")
    if Path(output) == Path("-"):  # stdout by the shell convention ("./-" too): never a folder named "-" here
        raise ValueError(f"output {os.fspath(output)!r}: packed output is a folder (shards + metadata.json); stdout is "
                         "not supported. Fix: pass the dataset folder to create, e.g. --output packed")
    out = Path(output)
    check_location(out)
    if not out.exists():
        return out
    if not out.is_dir():
        raise FileExistsError(f"output {out} exists and is a file, not a directory; choose another --output")
    if not any(out.iterdir()):
        return out
    if is_packed_dataset(out):
        if not overwrite:
            raise FileExistsError(
                f"output {out} already holds a packed dataset; pass --overwrite (overwrite=True) to "
                "replace it, or choose another --output"
            )
        strangers = stranger_entries(out)
        if strangers:
            shown = ", ".join(strangers[:10]) + (f" and {len(strangers) - 10} more" if len(strangers) > 10 else "")
            raise FileExistsError(
                f"output {out} holds a packed dataset and files seqpack did not write ({shown}); --overwrite "
                "replaces only seqpack's own files and never deletes yours. Move them out of the folder, or "
                "choose another --output"
            )
        locked = [d for d in (out, out / DATA_DIR, out / CACHE_DIR) if d.is_dir() and not os.access(d, os.W_OK | os.X_OK)]
        if locked:
            uid = locked[0].stat().st_uid
            fix = (f"make it writable (chmod -R u+w {out})" if hasattr(os, "getuid") and uid == os.getuid()
                   else "ask its owner to remove it")
            raise PermissionError(
                f"output {out} holds a packed dataset this user cannot delete ({locked[0]} is not writable, owner "
                f"uid {uid}); --overwrite would leave its files behind. Fix: {fix}, or choose another --output")
        return out
    raise FileExistsError(
        f"output {out} is a non-empty directory that is not a seqpack packed dataset (no "
        f"{METADATA_FILE}); refusing to delete it even with --overwrite. Choose another --output or "
        "empty it yourself."
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_leftovers(output: str | os.PathLike) -> list[Path]:
    """Clean up after runs for ``output`` that were killed (their process is gone).

    Write folders and sample spills are deleted. A replaced dataset (``.NAME.old-*``) is put back on the
    output path when nothing is there (the run died between its two renames), else deleted. Folders of
    live processes (another run in progress) are left alone.

    Returns:
        the leftover paths handled (deleted or restored).
    """
    out = Path(output)
    handled = []
    if not out.parent.is_dir():
        return handled
    for kind in LEFTOVER_KINDS:
        prefix = f".{out.name}.{kind}-"
        for p in sorted(out.parent.glob(prefix + "*")):
            try:
                pid = int(p.name[len(prefix):].split("-")[0])
            except ValueError:
                continue
            if pid == os.getpid() or _pid_alive(pid):
                continue
            if kind == "old" and not out.exists() and not p.is_symlink() and (p / METADATA_FILE).is_file():
                os.rename(p, out)
            else:
                _remove(p)
            handled.append(p)
    return handled


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100  # renameat2's flag; "paths relative to the cwd"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish_dir(tmp: Path, output: Path, overwrite: bool) -> None:
    """Put the finished temp directory ``tmp`` on ``output`` atomically (module docstring); an existing
    dataset is swapped out and then deleted.

    Raises:
        FileExistsError: see :func:`check_output_dir` (the target appeared meanwhile).
    """
    check_output_dir(output, overwrite)
    replace_dir(tmp, output)


def replace_dir(tmp: Path, output: Path) -> None:
    """Rename the finished folder ``tmp`` onto ``output``, swapping out and deleting what is there, so that
    ``output`` holds the old or the new folder at every instant (module docstring). The caller has checked
    that what is at ``output`` may be replaced (:func:`check_output_dir` for packed datasets)."""
    if not output.exists():
        os.rename(tmp, output)
    elif _exchange(tmp, output):
        _remove(tmp)  # tmp now holds the old folder
    else:
        old = temp_name(output, "old")
        os.rename(output, old)
        try:
            os.rename(tmp, output)
        except BaseException:
            os.rename(old, output)
            raise
        _remove(old)
    fsync_dir(output.parent)


def _remove(p: Path) -> None:
    """Delete a leftover: a link or a file is unlinked (never followed), a folder removed with its tree."""
    if p.is_symlink() or p.is_file():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p, ignore_errors=True)
