"""The output directory of a packed dataset: refuse what must not be written, clean up after killed
writers, fsync, and publish the finished temp directory atomically (an ``os.rename`` within one
directory is atomic on POSIX). An existing dataset is replaced only with ``overwrite=True``; a
non-empty directory that is not a seqpack dataset is never deleted."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from seqpack.io.metadata import METADATA_FILE

__all__ = ["check_output_dir", "fsync_dir", "fsync_file", "publish_dir", "remove_dead_temps"]


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


def check_output_dir(output: str | os.PathLike, overwrite: bool) -> None:
    """Refuse an output directory that must not be written (call it before any expensive work).

    Raises:
        FileExistsError: ``output`` is an existing seqpack dataset and ``overwrite`` is False, or it is
            a file, or a non-empty directory that is not a seqpack dataset (never deleted, even with
            ``overwrite``).
    """
    out = Path(output)
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"output {out} exists and is a file, not a directory; choose another --output")
    if not any(out.iterdir()):
        return
    if (out / METADATA_FILE).is_file():
        if not overwrite:
            raise FileExistsError(
                f"output {out} already holds a packed dataset; pass --overwrite (overwrite=True) to "
                "replace it, or choose another --output"
            )
        return
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


def remove_dead_temps(output: Path) -> None:
    """Delete ``.NAME.tmp-<pid>-<id>`` directories left by writers that were killed (their pid is gone)."""
    for p in output.parent.glob(f".{output.name}.tmp-*"):
        try:
            pid = int(p.name[len(f".{output.name}.tmp-") :].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)


def publish_dir(tmp: Path, output: Path, overwrite: bool) -> None:
    """Rename the finished temp directory ``tmp`` onto ``output`` (an existing dataset is moved aside
    first and deleted after; on failure it is put back).

    Raises:
        FileExistsError: see :func:`check_output_dir` (the target appeared meanwhile).
    """
    check_output_dir(output, overwrite)
    old = None
    if output.exists():
        old = output.parent / f".{output.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(output, old)
    try:
        os.rename(tmp, output)
    except BaseException:
        if old is not None:
            os.rename(old, output)
        raise
    fsync_dir(output.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
