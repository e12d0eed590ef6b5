"""A folder where a command reads or writes a file (`validate DIR`, `pack --config DIR`, `recipe -o DIR`,
`inspect --plot DIR`), or a file where it reads a folder (`inspect FILE`, `validate CONFIG FILE`): one
plain message on stderr saying which it is and what to run instead, a non-zero exit, no traceback."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from seqpack.cli import app
from seqpack.cli.app import path_kind_problem

SRC = Path(__file__).resolve().parents[2] / "src"
runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _error(r, code: int) -> str:
    """The one error line of a user error (exit ``code``, nothing on stdout, no traceback)."""
    assert r.exit_code == code, r.output
    assert r.stdout == "" and r.exception is None or isinstance(r.exception, SystemExit), r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """A packed dataset (the embedded demo data) in a folder whose name has a space."""
    out = tmp_path_factory.mktemp("cli_paths") / "my packed"
    r = _run("pack", "-o", out, "-q", "--seq-length", 512)
    assert r.exit_code == 0, r.output
    return out


def test_validate_a_folder_says_it_is_a_folder_not_a_missing_file(tmp_path):
    msg = _error(_run("validate", tmp_path), 1)
    assert msg == (f"error: config {tmp_path} is a folder, not a file. Fix: pass a packing config file "
                   "(.yaml/.yml/.json) or a recipe name (`seqpack recipe` lists them)")
    assert "not found" not in msg


def test_validate_a_packed_dataset_suggests_inspect_verify_which_works(packed):
    msg = _error(_run("validate", packed), 1)
    hint = f"run `seqpack inspect {shlex.quote(str(packed))} --verify`"
    assert f"config {packed} is a folder, not a file. It holds a packed dataset (metadata.json): to check it, {hint}." in msg
    r = runner.invoke(app, shlex.split(hint.split("`")[1])[1:] + ["--no-plot"])
    assert r.exit_code == 0 and "verified sha256 of 1 shard(s)" in r.stdout


def test_pack_config_folder_is_the_same_message_with_exit_2(packed, tmp_path):
    msg = _error(_run("pack", "--config", packed, "-o", tmp_path / "out", "-q"), 2)
    assert msg.startswith(f"error: --config {packed} is a folder, not a file. It holds a packed dataset")
    assert not (tmp_path / "out").exists()


def test_inspect_a_file_says_it_is_a_file_and_what_reads_it(packed, tmp_path):
    cfg = tmp_path / "my.yaml"
    assert _run("recipe", "qwen3_sft", "-o", cfg).exit_code == 0
    assert _error(_run("inspect", cfg), 1) == (
        f"error: packed dataset {cfg} is a file, not a folder. To check a packing config file, run "
        f"`seqpack validate {cfg}`. Fix: pass the folder `seqpack pack --output` wrote")
    meta = packed / "metadata.json"
    assert _error(_run("inspect", meta), 1) == (
        f"error: packed dataset {meta} is a file, not a folder. It is a packed dataset's metadata.json; the "
        f"dataset is its folder, {packed}. Fix: pass the folder `seqpack pack --output` wrote")
    assert "is a file, not a folder" in _error(_run("validate", "qwen3_sft", cfg), 1)  # PACKED_DIR


def test_missing_paths_keep_their_own_messages(tmp_path):
    assert "config file not found" in _error(_run("validate", tmp_path / "nope.yaml"), 1)
    assert _error(_run("inspect", tmp_path / "nope"), 1) == (
        f"error: packed dataset {tmp_path / 'nope'} does not exist; pass the folder `seqpack pack` (or "
        "pack_dataset) wrote")


def test_output_files_given_as_folders_suggest_a_file_name_inside(packed, tmp_path):
    assert _error(_run("recipe", "qwen3_sft", "-o", tmp_path), 1) == (
        f"error: recipe file {tmp_path} is a folder, not a file; give a file name, e.g. {tmp_path / 'qwen3_sft.yaml'}")
    assert _error(_run("inspect", packed, "--plot", tmp_path), 1) == (
        f"error: plot {tmp_path} is a folder, not a file; give a file name, e.g. {tmp_path / 'report.png'}")


def test_path_kind_problem_is_none_for_the_right_kind_or_a_missing_path(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("seq_length: 8\n")
    assert path_kind_problem(f, "file", "config", "x") is None
    assert path_kind_problem(tmp_path, "folder", "dataset", "x") is None
    assert path_kind_problem(tmp_path / "missing", "file", "config", "x") is None
    assert path_kind_problem(tmp_path / "missing", "folder", "dataset", "x") is None
    assert path_kind_problem(f, "folder", "dataset", "fix it") == (
        f"dataset {f} is a file, not a folder. To check a packing config file, run `seqpack validate {f}`. "
        "Fix: fix it")


def test_the_console_command_prints_the_message_on_stderr_without_a_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "80"}
    res = subprocess.run([sys.executable, "-m", "seqpack", "validate", str(tmp_path)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith(f"error: config {tmp_path} is a folder, not a file.") and "Traceback" not in res.stderr


def test_a_bad_plot_path_fails_before_any_shard_is_read(packed, tmp_path, monkeypatch):
    import seqpack.io

    def must_not_read(*a, **k):
        raise AssertionError("the dataset was read before the --plot path was checked")

    monkeypatch.setattr(seqpack.io, "load_packed", must_not_read)
    missing = tmp_path / "no such folder" / "r.png"
    assert _error(_run("inspect", packed, "--verify", "--plot", missing), 1) == (
        f"error: cannot write the plot {missing}: the folder {missing.parent} does not exist; create it first "
        "or choose another path")
    a_file = tmp_path / "notes.jsonl"
    a_file.write_text("{}\n")
    assert _error(_run("inspect", packed, "--plot", a_file / "r.png"), 1) == (
        f"error: cannot write the plot {a_file / 'r.png'}: {a_file} is a file, not a folder; choose another path")
    new_folder = f"{tmp_path / 'newdir'}/"  # a trailing slash names a folder, even one that does not exist
    assert _error(_run("inspect", packed, "--plot", new_folder), 1) == (
        f"error: plot {new_folder} is a folder, not a file; give a file name, e.g. {tmp_path / 'newdir' / 'report.png'}")
    assert not (tmp_path / "newdir.png").exists() and not (tmp_path / "newdir").exists()
    msg = _error(_run("inspect", packed, "--plot", tmp_path / "plot.jsonl"), 1)
    assert msg.startswith(f"error: cannot write the plot {tmp_path / 'plot.jsonl'}: '.jsonl' is not an image "
                          "format matplotlib writes; use .png (or one of ") and ".svg" in msg
    assert not (tmp_path / "plot.jsonl").exists()
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            assert _error(_run("inspect", packed, "--plot", ro / "r.png"), 1) == (
                f"error: cannot write the plot {ro / 'r.png'}: the folder {ro} is not writable by this user; "
                "choose another path")
        finally:
            ro.chmod(0o700)


def test_a_packed_dataset_given_as_input_says_it_is_already_packed(packed, tmp_path):
    import shutil

    from seqpack.data import DataFormatError
    from seqpack.pipeline import pack_dataset

    src = str(packed.parent / "my packed")
    shard = packed / "data" / "shard-00000.parquet"
    cols = "packed columns input_ids, labels, cu_seqlens, cu_seqlens_padded, sample_ids"
    fix = (f"Fix: to train on it, load it with seqpack.io.load_packed({src!r}), or look at it with `seqpack inspect "
           f"{src}`; to pack again, give the source records (JSON, JSONL, Parquet of records) as the input.")
    origin = "packed from " + json.loads((packed / "metadata.json").read_text())["inputs"][0]["path"]
    cases = {
        packed: f"is already a seqpack packed dataset (it holds metadata.json; {origin})",
        packed / "metadata.json": f"is the metadata.json of the seqpack packed dataset {src} ({origin})",
        shard: f"is a shard of the seqpack packed dataset {src} ({cols}; {origin})",
    }
    for given, what in cases.items():
        msg = _error(_run("pack", given, "-o", tmp_path / "o", "-q"), 1)
        assert msg == f"error: {given}: {what}: packed rows, not records to pack. {fix}"
    msg = _error(_run("pack", str(packed / "data" / "*.parquet"), "-o", tmp_path / "o", "-q"), 1)  # by a glob
    assert msg.startswith(f"error: {shard}: is a shard of the seqpack packed dataset {src} (")
    lone = tmp_path / "lone.parquet"
    shutil.copy(shard, lone)
    msg = _error(_run("pack", lone, "-o", tmp_path / "o", "-q"), 1)
    assert msg == (f"error: {lone}: is a shard of a seqpack packed dataset ({cols}): packed rows, not records to "
                   "pack. Fix: to train on it, load it with seqpack.io.load_packed('DATASET_FOLDER'), or look at it "
                   "with `seqpack inspect DATASET_FOLDER`; to pack again, give the source records (JSON, JSONL, "
                   "Parquet of records) as the input.")
    with pytest.raises(DataFormatError, match="is already a seqpack packed dataset") as ei:
        pack_dataset(packed, tmp_path / "o")
    assert ei.value.reason == "bad_input"
    assert not (tmp_path / "o").exists()


def test_only_files_with_every_packed_column_are_shards(packed, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from seqpack.io import is_packed_dataset
    from seqpack.io.cache import SHARD_COLUMNS, is_packed_shard

    assert is_packed_shard(packed / "data" / "shard-00000.parquet") and is_packed_dataset(packed)
    pq.write_table(pa.table({c: [[1]] for c in SHARD_COLUMNS[:-1]}), tmp_path / "records.parquet")  # no sample_ids
    (tmp_path / "text.parquet").write_text("not parquet")
    assert not is_packed_shard(tmp_path / "records.parquet") and not is_packed_shard(tmp_path / "text.parquet")
    assert not is_packed_dataset(packed / "metadata.json") and not is_packed_dataset(tmp_path)
