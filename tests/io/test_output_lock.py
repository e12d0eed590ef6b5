"""The output lock: a second run for the same output fails at once naming the holder's pid and start time,
the leftovers of killed runs are removed only by the lock's holder, a SIGKILLed holder's lock is gone with
it, the lock is released on success and failure, and the CLI turns a held lock into a plain message."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from seqpack import pack_dataset
from seqpack.io import OutputBusyError, PackedWriter, lock_output
from seqpack.io.output_lock import lock_path

DEMO = dict(seq_length=256, progress=None)

#: a second process that takes the lock through the public function and holds it until stdin closes
_HOLD = ("import sys\nfrom seqpack.io import lock_output\nlock = lock_output(sys.argv[1])\n"
         "print('held', flush=True)\nsys.stdin.read()\n")


def _holder(out: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        pytest.fail(f"the holder did not take the lock: {line!r} {proc.communicate()}")
    return proc


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _busy_message(out: Path, pid: int) -> str:
    return (rf"^output {re.escape(str(out))} is being written by another seqpack run \(pid {pid}, started "
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\); wait for it to finish or choose another --output$")


def test_a_second_process_is_refused_naming_the_holders_pid_and_start(tmp_path):
    out = tmp_path / "ds"
    holder = _holder(out)
    try:
        info = json.loads(lock_path(out).read_text())
        assert info["pid"] == holder.pid
        with pytest.raises(OutputBusyError, match=_busy_message(out, holder.pid)) as e:
            lock_output(out)
        assert e.value.pid == holder.pid and e.value.started == info["started"]
        assert isinstance(e.value, FileExistsError)
        with pytest.raises(OutputBusyError, match=_busy_message(out, holder.pid)):
            pack_dataset(output=str(out), overwrite=True, **DEMO)
        with pytest.raises(OutputBusyError):
            PackedWriter(out, overwrite=True)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not lock_path(out).exists()  # a holder that ends normally deletes the file
    with lock_output(out):
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    assert not lock_path(out).exists()


def test_a_sigkilled_holders_lock_is_gone_and_the_next_run_proceeds(tmp_path):
    out = tmp_path / "ds"
    holder = _holder(out)
    holder.kill()
    holder.wait(timeout=30)
    assert lock_path(out).exists()  # SIGKILL cannot delete the file; the kernel dropped the lock
    with lock_output(out) as lock:
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    lock.release()  # twice is harmless
    assert not lock_path(out).exists()


def test_leftovers_are_kept_while_another_run_holds_the_lock_and_removed_after_it_dies(tmp_path):
    out = tmp_path / "ds"
    holder = _holder(out)
    dead = _dead_pid()  # e.g. a pid of another host on a shared file system: not alive here
    left = [tmp_path / f".ds.{kind}-{dead}-abcd" for kind in ("tmp", "spill")]
    for p in left:
        p.mkdir()
        (p / "part").write_bytes(b"0" * 100)
    try:
        with pytest.raises(OutputBusyError):
            pack_dataset(output=str(out), overwrite=True, **DEMO)
        with pytest.raises(OutputBusyError):
            PackedWriter(out, overwrite=True)
        assert all((p / "part").is_file() for p in left)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    res = pack_dataset(output=str(out), overwrite=True, **DEMO)
    assert (res.output / "metadata.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # leftovers and lock file gone


def test_the_lock_is_released_when_a_run_fails_and_reentrant_within_a_thread(tmp_path, monkeypatch):
    from seqpack.pipeline import stages

    out = tmp_path / "ds"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "q", "output": "a"}\n{"instruction": \n')
    held = []
    real = stages.open_tokenizer

    def spy(job):  # the first stage after the lock is taken
        held.append(lock_path(out).exists())
        return real(job)

    monkeypatch.setattr(stages, "open_tokenizer", spy)
    with pytest.raises(ValueError, match="bad.jsonl"):  # raised while the lock is held
        pack_dataset([str(bad)], str(out), **DEMO)
    assert held == [True]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    with lock_output(out):
        with lock_output(out):  # pack_dataset holds it, its PackedWriter takes it again
            pass
        assert lock_path(out).exists()  # the outer holder still has it
        holder = subprocess.run([sys.executable, "-c", _HOLD, str(out)], input="", capture_output=True,
                                text=True, timeout=60)
        assert holder.returncode != 0 and "OutputBusyError" in holder.stderr
        assert f"pid {os.getpid()}," in holder.stderr
        seen = []
        thread = threading.Thread(target=lambda: seen.append(pytest.raises(OutputBusyError, lock_output, out)))
        thread.start()
        thread.join()
        assert seen and f"pid {os.getpid()}," in str(seen[0].value)  # another thread is another run
    assert not lock_path(out).exists()
    pack_dataset(output=str(out), **DEMO)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "ds"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_parent_gives_the_not_writable_message_not_a_lock_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="no permission to create files") as e:
            pack_dataset(output=str(ro / "out"), overwrite=True, **DEMO)
        assert not isinstance(e.value, OutputBusyError)
    finally:
        ro.chmod(0o700)


def test_the_cli_exits_1_with_the_message_and_no_traceback(tmp_path):
    out = tmp_path / "ds"
    holder = _holder(out)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "seqpack", "pack", "--output", str(out), "--overwrite", "--seq-length", "256",
             "--quiet"], capture_output=True, text=True, timeout=120)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    text = " ".join((res.stderr + res.stdout).split())  # the console may wrap the line
    assert f"is being written by another seqpack run (pid {holder.pid}, started " in text
    assert "wait for it to finish or choose another --output" in text
    assert not out.exists()


def test_a_writer_that_cannot_make_its_temp_folder_releases_the_lock(tmp_path, monkeypatch):
    from seqpack.io import output_lock, writer

    out = tmp_path / "ds"
    (tmp_path / "a file").write_text("x")
    monkeypatch.setattr(writer, "temp_name", lambda output, kind: tmp_path / "a file" / "tmp")
    with pytest.raises(NotADirectoryError):
        PackedWriter(out)
    assert output_lock._held == {} and not lock_path(out).exists()


def test_another_users_lock_file_is_locked_read_only(tmp_path, monkeypatch):
    """In a shared folder the lock file may belong to another user (opening it read-write is refused): the
    lock is taken on a read-only descriptor, the file is not rewritten, and a second holder is still refused."""
    from seqpack.io import output_lock

    out = tmp_path / "ds"
    key = lock_path(out)
    key.write_text(json.dumps({"pid": 1, "started": "earlier"}))
    real_open = os.open

    def refuse_write(path, flags, *a):
        if str(path) == str(key) and flags & os.O_ACCMODE != os.O_RDONLY:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(output_lock.os, "open", refuse_write)
    with lock_output(out):
        assert json.loads(key.read_text()) == {"pid": 1, "started": "earlier"}
        holder = subprocess.run([sys.executable, "-c", _HOLD, str(out)], input="", capture_output=True,
                                text=True, timeout=120)
        assert holder.returncode != 0 and "is being written by another seqpack run" in holder.stderr
    assert output_lock._held == {}
