"""One seqpack run at a time per output path: an exclusive lock file beside the output.

A run that writes a packed dataset to ``OUT`` holds a non-blocking exclusive ``flock`` on
``<parent>/.<name>.lock`` from the output check (before any data is read) until the dataset is published
or the run fails. A second run for the same output fails at once with :class:`OutputBusyError`, whose
message names the holder's pid and start time (the lock file holds them as JSON).

Rules:

- The leftovers of killed runs (``.NAME.tmp-*``, ``.NAME.spill-*``, ``.NAME.old-*``,
  :func:`seqpack.io.output_dir.remove_leftovers`) are removed only by the lock's holder, right after it
  takes the lock, so a running job's folders are never removed by a second run.
- The lock is released on success, on an exception and on Ctrl-C / SIGTERM (the CLI turns SIGTERM into
  an exception that unwinds like Ctrl-C). The kernel drops a ``flock`` with the last descriptor of its
  open file, so a SIGKILLed holder leaves no stale lock: the next run takes it and cleans up. (Worker
  processes forked while the lock is held share the descriptor; the lock lasts until they are gone too.)
- The lock file is deleted on release while still locked. A run that opened the file before that checks,
  once it holds the lock, that its descriptor is still the file at the path, and opens the path again if
  not; so two runs never hold locks on two different files for one output. A SIGKILLed holder's file
  stays behind and is reused (and then deleted) by the next run.
- Within one thread the lock is re-entrant: ``pack_dataset`` holds it and its ``PackedWriter`` takes it
  again; the file is unlocked when the outermost holder releases it. Another thread of the same process
  is refused like another process.
- Where ``fcntl`` is absent (Windows), or the file system refuses ``flock``, there is no lock (and no lock
  file is left): concurrent runs for one output are not detected there, and the leftover cleanup relies on
  the pid check alone.
- In a folder shared by several users, a lock file another user created is opened read-only (``flock``
  needs no write access); its pid/start record is then the other user's last one.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from seqpack.io.output_dir import remove_leftovers

__all__ = ["OutputBusyError", "OutputLock", "lock_output", "lock_path"]


class OutputBusyError(FileExistsError):
    """Another seqpack run holds the output's lock; attributes ``pid`` and ``started`` (``None`` when
    the lock file could not be read)."""

    def __init__(self, message: str, pid: int | None = None, started: str | None = None) -> None:
        super().__init__(message)
        self.pid, self.started = pid, started


#: lock file path -> [descriptor or None, holders in this process, owning thread, start time]
_held: dict[str, list] = {}
_guard = threading.Lock()


def lock_path(output: str | os.PathLike) -> Path:
    """The lock file of ``output``: ``<parent>/.<name>.lock`` (an absolute path)."""
    out = Path(output).absolute()
    return out.parent / f".{out.name}.lock"


class OutputLock:
    """One holder's share of an output's lock (from :func:`lock_output`); :meth:`release` (or leaving a
    ``with`` block, or garbage collection) gives it back. Releasing twice is harmless."""

    def __init__(self, key: str) -> None:
        self._key: str | None = key

    def release(self) -> None:
        """Give back this share; the last share unlocks, deletes the lock file and closes it."""
        key, self._key = self._key, None
        if key is not None:
            _release(key)

    def __enter__(self) -> "OutputLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def lock_output(output: str | os.PathLike) -> OutputLock:
    """Take the exclusive lock of ``output`` (creating its parent folder), then remove the leftovers of
    killed runs for it. Call it after :func:`seqpack.io.output_dir.check_output_dir` (which gives the
    plain message for a parent that is a file or not writable) and before any data is read.

    Example::

        with lock_output("packed"):
            ...  # write the temp folder, publish it

    Raises:
        OutputBusyError: another process holds the lock; the message names its pid and start time.
        OSError: the lock file cannot be created (e.g. a read-only file system).
    """
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = os.path.join(os.path.realpath(path.parent), path.name)
    with _guard:
        entry = _held.get(key)
        if entry is not None and entry[2] != threading.get_ident():
            raise OutputBusyError(
                f"output {output} is being written by another thread of this process (pid {os.getpid()}, "
                f"started {entry[3]}); wait for it to finish or choose another --output", os.getpid(), entry[3])
        if entry is not None:
            entry[1] += 1
            return OutputLock(key)
        fd = _open_locked(key, output) if fcntl is not None else None
        started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        _held[key] = [fd, 1, threading.get_ident(), started]
    lock = OutputLock(key)
    try:
        if fd is not None and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR:  # not read-only
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "started": started}).encode(), 0)
        remove_leftovers(output)
    except BaseException:
        lock.release()
        raise
    return lock


def _open_locked(key: str, output: str | os.PathLike) -> int | None:
    """A descriptor of the lock file at ``key``, locked; None where the file system has no ``flock``."""
    cloexec = getattr(os, "O_CLOEXEC", 0)
    while True:
        try:
            fd = os.open(key, os.O_RDWR | os.O_CREAT | cloexec, 0o644)
        except PermissionError:  # another user's lock file (a shared folder): flock works read-only too
            try:
                fd = os.open(key, os.O_RDONLY | cloexec)
            except FileNotFoundError:  # deleted meanwhile: create it again
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, started = _holder(fd)
            os.close(fd)
            raise _busy(output, pid, started) from None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
                try:  # no lock on this file system: leave no lock file behind either
                    os.unlink(key)
                except OSError:
                    pass
                return None
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(key))
        except FileNotFoundError:  # the previous holder deleted it on release: open the path again
            same = False
        if same:
            return fd
        os.close(fd)


def _busy(output: str | os.PathLike, pid: int | None, started: str | None) -> OutputBusyError:
    return OutputBusyError(
        f"output {output} is being written by another seqpack run (pid {pid or '?'}, started {started or '?'}); "
        "wait for it to finish or choose another --output", pid, started)


def _holder(fd: int) -> tuple[int | None, str | None]:
    """The pid and start time the holder wrote into the lock file (None, None if unreadable)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode())
        return int(info["pid"]), str(info["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def _release(key: str) -> None:
    with _guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        fd = entry[0]
        if fd is None:
            return
        try:
            if os.path.samestat(os.fstat(fd), os.stat(key)):  # ours while we hold the lock
                os.unlink(key)
        except OSError:
            pass
        finally:
            os.close(fd)
