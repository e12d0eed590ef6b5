"""The output folder: overwrite replaces only seqpack's files, publishing is atomic, killed runs are cleaned
up by the next run, SIGTERM unwinds like Ctrl-C, the location is checked before any data is read, and
metadata.json is byte-identical for equal inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seqpack import pack_dataset
from seqpack.cli import app
from seqpack.io import output_dir
from seqpack.io.output_dir import check_output_dir, publish_dir, remove_leftovers, stranger_entries

DEMO = dict(seq_length=256)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _pack(out, **kw):
    return pack_dataset(output=str(out), progress=None, **{**DEMO, **kw})


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------ overwrite keeps the user's files


def test_overwrite_refuses_and_names_files_seqpack_did_not_write(tmp_path):
    out = tmp_path / "ds"
    _pack(out)
    (out / "NOTES.md").write_text("mine")
    (out / "ckpt").mkdir()
    (out / "data" / "extra.bin").write_bytes(b"x")
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(FileExistsError) as e:
        _pack(out, overwrite=True, seq_length=512)
    msg = str(e.value)
    for name in ("NOTES.md", "ckpt/", "data/extra.bin"):
        assert name in msg
    assert "never deletes yours" in msg
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing touched
    assert json.loads((out / "metadata.json").read_text())["seq_length"] == 256


@pytest.mark.parametrize("name", ["report.jsonl", "metadata.json", "data/shard-00000.parquet", "chats.jsonl"])
def test_an_input_inside_the_output_folder_is_refused_before_anything_is_written(tmp_path, name):
    from seqpack.pipeline.job import sample_data_path

    out = tmp_path / "ds"
    _pack(out)
    inp = out / name
    if name != "metadata.json":  # the user's chats saved under one of seqpack's names (or their own)
        inp.write_bytes(sample_data_path().read_bytes())
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    link = tmp_path / "link.jsonl"
    link.symlink_to(inp)
    for given in (inp, link):  # through a link too
        if name == "metadata.json" and given == inp:  # the dataset's own metadata.json: no records at all
            with pytest.raises(ValueError, match=f"is the metadata.json of the seqpack packed dataset {out} "):
                pack_dataset(given, output=str(out), overwrite=True, progress=None, seq_length=512)
            continue
        with pytest.raises(FileExistsError) as e:
            pack_dataset(given, output=str(out), overwrite=True, progress=None, seq_length=512)
        if name == "chats.jsonl":  # a file seqpack did not write: refused as a stranger first
            assert "files seqpack did not write (chats.jsonl)" in str(e.value)
        else:
            assert f"input {given} is inside the output folder {out}" in str(e.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not _hidden(tmp_path)


def test_overwrite_replaces_a_clean_dataset_and_its_cache(tmp_path):
    from seqpack import load_packed

    out = tmp_path / "ds"
    _pack(out)
    _ = load_packed(out)[0]  # creates the reader's .cache
    assert stranger_entries(out) == []
    _pack(out, overwrite=True, seq_length=512)
    assert json.loads((out / "metadata.json").read_text())["seq_length"] == 512
    assert _hidden(tmp_path) == []


def test_inspect_plot_counts_as_seqpack_s_own_and_look_alike_files_do_not(tmp_path):
    from seqpack import load_packed
    from seqpack.io.summary import plot_report

    out = tmp_path / "ds"
    _pack(out)
    plot_report(load_packed(out))  # what `seqpack inspect` writes into the dataset
    assert (out / "report.png").is_file() and stranger_entries(out) == []
    _pack(out, overwrite=True, seq_length=512)  # inspect, then re-pack: allowed
    (out / "data" / "shard-00000.parquet.bak").write_bytes(b"x")
    (out / "data" / "shard-mycheckpoint.parquet").write_bytes(b"x")
    (out / ".cache").mkdir(exist_ok=True)
    (out / ".cache" / "my_model.safetensors").write_bytes(b"x")
    assert stranger_entries(out) == [".cache/my_model.safetensors", "data/shard-00000.parquet.bak",
                                     "data/shard-mycheckpoint.parquet"]
    with pytest.raises(FileExistsError, match="shard-00000.parquet.bak"):
        _pack(out, overwrite=True)
    assert (out / ".cache" / "my_model.safetensors").is_file()


def test_a_shard_metadata_json_does_not_list_blocks_overwrite_as_it_fails_verify(tmp_path):
    import shutil

    from seqpack import load_packed
    from seqpack.io.metadata import PackedDatasetError

    out = tmp_path / "ds"
    _pack(out, rows_per_shard=4)
    listed = sorted(s["file"] for s in json.loads((out / "metadata.json").read_text())["shards"])
    assert len(listed) > 1 and stranger_entries(out) == []  # every listed shard is seqpack's
    shutil.copy(out / listed[0], out / "data" / "shard-00099.parquet")  # a shard copied in
    assert stranger_entries(out) == ["data/shard-00099.parquet (not listed in metadata.json)"]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError) as e:
        _pack(out, overwrite=True, seq_length=512)
    assert ("files seqpack did not write (data/shard-00099.parquet (not listed in metadata.json)); --overwrite "
            "replaces only seqpack's own files and never deletes yours") in str(e.value)
    res = CliRunner().invoke(app, ["pack", "--output", str(out), "--seq-length", "512", "--overwrite", "--quiet"])
    assert res.exit_code == 1 and "data/shard-00099.parquet (not listed in metadata.json)" in res.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing deleted
    with pytest.raises(PackedDatasetError, match="data/shard-00099.parquet in data/ is not a shard metadata.json"):
        load_packed(out, verify=True)  # the same file, the same verdict
    (out / "data" / "shard-00099.parquet").unlink()
    _pack(out, overwrite=True, seq_length=512, rows_per_shard=4)  # only listed shards: replaced
    assert json.loads((out / "metadata.json").read_text())["seq_length"] == 512
    assert not (out / "data" / "shard-00099.parquet").exists() and _hidden(tmp_path) == []


def test_a_metadata_json_listing_a_user_file_does_not_make_it_seqpack_s(tmp_path):
    out = tmp_path / "ds"
    _pack(out)
    meta = json.loads((out / "metadata.json").read_text())
    meta["shards"][0]["file"] = "data/notes.txt"  # crafted: a user's file listed as a shard
    (out / "metadata.json").write_text(json.dumps(meta))
    (out / "data" / "notes.txt").write_text("mine")
    assert "data/notes.txt" in stranger_entries(out)
    with pytest.raises(FileExistsError, match="data/notes.txt"):
        _pack(out, overwrite=True, seq_length=512)
    assert (out / "data" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("damage", ["not json {", '{"format_version": 1}'])
def test_with_metadata_json_unreadable_shard_named_files_count_as_seqpack_s(tmp_path, damage):
    import shutil

    out = tmp_path / "ds"
    _pack(out)
    (out / "metadata.json").write_text(damage)
    shutil.copy(out / "data" / "shard-00000.parquet", out / "data" / "shard-00099.parquet")
    (out / "data" / "shard-00000.parquet.bak").write_bytes(b"x")
    assert stranger_entries(out) == ["data/shard-00000.parquet.bak"]  # the name pattern, as for any damage
    (out / "data" / "shard-00000.parquet.bak").unlink()
    _pack(out, overwrite=True, seq_length=512)  # a damaged dataset can still be overwritten
    assert json.loads((out / "metadata.json").read_text())["seq_length"] == 512
    assert not (out / "data" / "shard-00099.parquet").exists()


def test_a_linked_cache_folder_is_a_stranger(tmp_path):
    out = tmp_path / "ds"
    _pack(out)
    (tmp_path / "elsewhere").mkdir()
    (out / ".cache").symlink_to(tmp_path / "elsewhere")
    assert stranger_entries(out) == [".cache (a link)"]


def test_output_that_is_a_link_is_refused_naming_its_target(tmp_path):
    real = tmp_path / "real"
    _pack(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(FileExistsError, match=f"symbolic link.*--output {real}"):
        _pack(link, overwrite=True)
    assert link.is_symlink() and (real / "metadata.json").is_file()
    assert _hidden(tmp_path) == []


def test_an_output_name_too_long_for_the_temp_names_is_refused_before_reading(tmp_path):
    with pytest.raises(OSError, match="choose an --output name of at most"):
        check_output_dir(tmp_path / ("o" * 245), overwrite=False)
    for n in (256, 300, 5000):  # over the file system's own limit: the same message, never a raw errno
        with pytest.raises(OSError, match=f"its name is {n} characters.*at most"):
            check_output_dir(tmp_path / ("o" * n), overwrite=False)
    with pytest.raises(OSError, match="a folder name in it is longer than the file system takes"):
        check_output_dir(tmp_path / ("p" * 300) / "out", overwrite=False)
    check_output_dir(tmp_path / ("o" * 200), overwrite=False)
    res = CliRunner().invoke(app, ["pack", "--output", str(tmp_path / ("o" * 300)), "--quiet"])
    assert res.exit_code == 1 and type(res.exception) is SystemExit and "at most" in res.output


def test_a_leftover_that_is_a_link_is_unlinked_not_followed(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    dead = tmp_path / f".ds.tmp-{_dead_pid()}-deadbeef"
    dead.symlink_to(target)
    assert remove_leftovers(tmp_path / "ds") == [dead]
    assert not dead.is_symlink() and (target / "keep").is_file()


def test_an_input_inside_the_output_is_never_deleted(tmp_path):
    from seqpack.pipeline import sample_data_path

    out = tmp_path / "ds"
    _pack(out)
    inp = out / "chat.jsonl"
    inp.write_bytes(Path(sample_data_path()).read_bytes())
    with pytest.raises(FileExistsError, match="chat.jsonl"):
        pack_dataset([str(inp)], str(out), overwrite=True, progress=None, **DEMO)
    assert inp.is_file()


# ------------------------------------------------------------------ atomic publish


def test_publish_swaps_atomically_where_the_kernel_can(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    _pack(out)
    renames = []
    real_rename = os.rename
    monkeypatch.setattr(output_dir.os, "rename", lambda a, b: (renames.append((a, b)), real_rename(a, b))[1])
    _pack(out, overwrite=True, seq_length=512)
    # Linux: one renameat2(RENAME_EXCHANGE), never a moment without a dataset at `out`
    assert renames == []
    assert json.loads((out / "metadata.json").read_text())["seq_length"] == 512


def test_without_exchange_a_death_between_the_renames_is_repaired_by_the_next_run(tmp_path):
    out = tmp_path / "ds"
    _pack(out)
    old = tmp_path / f".ds.old-{_dead_pid()}-deadbeef"
    os.rename(out, old)  # the state a run killed between its two renames leaves
    assert not out.exists()
    handled = remove_leftovers(out)
    assert handled == [old]
    assert (out / "metadata.json").is_file() and not old.exists()


def test_publish_fallback_puts_the_old_dataset_back_when_the_second_rename_fails(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    _pack(out)
    tmp = tmp_path / ".ds.tmp-1-x"
    tmp.mkdir()
    (tmp / "metadata.json").write_text("{}")
    monkeypatch.setattr(output_dir, "_exchange", lambda a, b: False)
    real_rename = os.rename
    calls = []

    def rename(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError("disk gone")
        real_rename(a, b)

    monkeypatch.setattr(output_dir.os, "rename", rename)
    with pytest.raises(OSError, match="disk gone"):
        publish_dir(tmp, out, overwrite=True)
    assert json.loads((out / "metadata.json").read_text())["seq_length"] == 256


# ------------------------------------------------------------------ leftovers of killed runs


def test_leftovers_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    out = tmp_path / "ds"
    dead = _dead_pid()
    for kind in ("tmp", "spill"):
        (tmp_path / f".ds.{kind}-{dead}-0000").mkdir()
    live = tmp_path / f".ds.spill-{os.getppid()}-1111"  # the test runner's parent: alive
    live.mkdir()
    other = tmp_path / f".other.tmp-{dead}-2222"  # another output's leftovers: not ours to judge
    other.mkdir()
    removed = remove_leftovers(out)
    assert sorted(p.name for p in removed) == [f".ds.spill-{dead}-0000", f".ds.tmp-{dead}-0000"]
    assert live.exists() and other.exists()


def test_next_run_cleans_what_a_killed_run_left(tmp_path):
    out = tmp_path / "ds"
    dead = _dead_pid()
    spill = tmp_path / f".ds.spill-{dead}-abcd"
    spill.mkdir()
    (spill / "tokens.bin").write_bytes(b"0" * 1000)
    _pack(out)
    assert _hidden(tmp_path) == []


def _big_input(path: Path, n: int = 30000) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"instruction": f"question {i} " + "word " * 40, "output": "answer " * 40}) + "\n")
    return path


def _start_pack(tmp_path: Path, out: Path) -> subprocess.Popen:
    inp = _big_input(tmp_path / "big.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "seqpack", "pack", str(inp), "--output", str(out), "--seq-length", "512", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_spill(proc: subprocess.Popen, parent: Path, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if any(p.name.startswith(".ds.spill-") for p in parent.iterdir()):
            time.sleep(0.5)  # well inside tokenizing
            return
        if proc.poll() is not None:
            pytest.fail(f"seqpack pack ended before it was killed: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no spill folder appeared")


def test_sigterm_cleans_up_like_ctrl_c(tmp_path):
    out = tmp_path / "ds"
    proc = _start_pack(tmp_path, out)
    _wait_for_spill(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM); nothing was written" in err
    assert "Traceback" not in err
    assert not out.exists() and _hidden(tmp_path) == []


def test_sigkill_leftovers_are_removed_by_the_next_run(tmp_path):
    out = tmp_path / "ds"
    proc = _start_pack(tmp_path, out)
    _wait_for_spill(proc, tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    assert any(n.startswith(".ds.spill-") for n in _hidden(tmp_path))  # SIGKILL cannot clean up
    _pack(out)
    assert _hidden(tmp_path) == []
    assert (out / "metadata.json").is_file()


# ------------------------------------------------------------------ location checked first


def test_a_file_as_parent_is_refused_before_reading(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        pack_dataset([str(tmp_path / "missing.jsonl")], str(tmp_path / "f" / "out"), progress=None, **DEMO)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_parent_is_refused_before_reading(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="no permission to create files"):
            check_output_dir(ro / "out", overwrite=False)
    finally:
        ro.chmod(0o700)


def test_overwriting_a_dataset_this_user_cannot_delete_is_refused_before_reading(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    _pack(out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    data = out / "data"
    if os.geteuid() != 0:
        data.chmod(0o500)  # as for another user's dataset: its files cannot be unlinked by us
    else:  # root may delete anything: make the check see what a non-owner sees
        real = output_dir.os.access
        monkeypatch.setattr(output_dir.os, "access", lambda p, mode: False if Path(p) == data else real(p, mode))
    try:
        with pytest.raises(PermissionError) as ei:
            pack_dataset([str(tmp_path / "not read.jsonl")], str(out), overwrite=True, progress=None, **DEMO)
        assert str(ei.value) == (
            f"output {out} holds a packed dataset this user cannot delete ({data} is not writable, owner uid "
            f"{data.stat().st_uid}); --overwrite would leave its files behind. Fix: make it writable (chmod -R u+w "
            f"{out}), or choose another --output")  # our own folder; another user's: "ask its owner to remove it"
        owner = data.stat().st_uid
        with monkeypatch.context() as m:  # as seen by another user
            m.setattr(output_dir.os, "getuid", lambda: owner + 1)
            with pytest.raises(PermissionError, match=r"Fix: ask its owner to remove it, or choose another --output$"):
                check_output_dir(out, overwrite=True)
    finally:
        data.chmod(0o700)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert _hidden(tmp_path) == []


def test_a_mount_point_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()
    (out / "x").write_text("1")
    monkeypatch.setattr(output_dir.os.path, "ismount", lambda p: Path(p) == out)
    with pytest.raises(FileExistsError, match="mount point.*--output .*packed"):
        check_output_dir(out, overwrite=True)


# ------------------------------------------------------------------ deterministic metadata


def test_metadata_is_byte_identical_for_equal_inputs(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    a, b = tmp_path / "a", tmp_path / "b"
    _pack(a)
    time.sleep(1.1)
    _pack(b)
    assert (a / "metadata.json").read_bytes() == (b / "metadata.json").read_bytes()
    assert json.loads((a / "metadata.json").read_text())["created_at"] == ""


def test_source_date_epoch_sets_created_at(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    _pack(tmp_path / "a")
    assert json.loads((tmp_path / "a" / "metadata.json").read_text())["created_at"] == "2023-11-14T22:13:20+00:00"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ValueError, match="SOURCE_DATE_EPOCH='yesterday'"):
        _pack(tmp_path / "b")
    assert _hidden(tmp_path) == []


def test_the_rejected_reports_temp_file_is_a_leftover_the_next_run_removes(tmp_path, monkeypatch):
    from seqpack.io import report_file

    out = tmp_path / "ds"
    seen = []
    real = report_file.write_report

    def spy(path, entries):
        seen.append(Path(path))
        return real(path, entries)

    monkeypatch.setattr(report_file, "write_report", spy)
    path = report_file.write_rejected_report(out, [{"sample_id": "a", "reason": "bad"}])
    assert path == tmp_path / "ds.report.jsonl" and json.loads(path.read_text())["sample_id"] == "a"
    assert seen[0].name.startswith(f".ds.tmp-{os.getpid()}-") and not seen[0].exists()
    dead = tmp_path / f".ds.tmp-{_dead_pid()}-cafe0123"  # what a run killed while writing it leaves
    dead.write_text('{"sample_id": "a"}\n')
    assert remove_leftovers(out) == [dead] and not dead.exists() and path.is_file()
