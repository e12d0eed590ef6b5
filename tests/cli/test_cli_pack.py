"""`seqpack pack`, `seqpack inspect`, `seqpack algorithms`: exit codes, readable errors, outputs."""

from __future__ import annotations

import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from seqpack.algorithms import DEFAULT_ALGORITHM, PackingAlgorithm
from seqpack.cli import app
from seqpack.io import load_packed

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _user_error(res, code: int) -> str:
    """A user error: the given exit code via a clean exit (no escaped exception = no traceback)."""
    assert res.exit_code == code, res.output
    assert type(res.exception) is SystemExit, repr(res.exception)
    assert "Traceback" not in res.output
    return res.output


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "packed"
    res = _run("pack", "--output", out, "--seq-length", "1024", "--quiet")
    assert res.exit_code == 0, res.output
    return out, res.output


def test_pack_without_inputs_packs_the_embedded_sample(packed_dir):
    out, output = packed_dir
    for label in ("records read", "samples packed", "packs / lower bound", "packing efficiency", "time"):
        assert label in output
    md = json.loads((out / "metadata.json").read_text())
    assert md["counts"]["records_read"] == 46 and md["counts"]["samples_packed"] == 46
    assert f"{md['num_packs']} / {md['lower_bound']}" in output
    assert len(load_packed(out)) == md["num_packs"] >= 2


def test_pack_real_file_with_progress_and_policies(shared_data, tmp_path):
    out = tmp_path / "fc"
    res = _run("pack", shared_data / "fastchat" / "dummy_conversation.json", "--output", out,
               "--seq-length", "2048", "--algorithm", "first_fit_decreasing", "--pad-to-multiple-of", "8",
               "--context-parallel-size", "2", "--seed", "5", "--format", "sharegpt")
    assert res.exit_code == 0, res.output
    assert "reading + tokenizing records" in res.output and "building + writing packs" in res.output
    ds = load_packed(out, expect={"capacity": 2048, "context_parallel_size": 2, "pad_to_multiple_of": 8,
                                  "effective_pad_multiple": 8, "algorithm": "first_fit_decreasing", "seed": 5})
    assert ds.metadata.counts["records_read"] == 500
    assert ds.metadata.format == "sharegpt"
    ds[0].validate(capacity=2048, context_parallel_size=2, multiple=8)


def test_pack_lists_records_not_packed_as_is(tmp_path):
    data = tmp_path / "d.jsonl"
    long_answer = " ".join(["word"] * 400)
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "long?"},
                                   {"role": "assistant", "content": long_answer}]})
        + "\n"
    )
    out = tmp_path / "o"
    res = _run("pack", data, "--output", out, "--seq-length", "128", "--overlength", "drop", "-q")
    assert res.exit_code == 0, res.output
    assert "records not packed as-is (first 1 of 1)" in res.output and "d.jsonl:1" in res.output
    assert "dropped" in res.output and "report.jsonl" in res.output
    res = _run("inspect", out, "--no-plot")
    assert res.exit_code == 0 and "d.jsonl:1" in res.output and not (out / "report.png").exists()
    md = json.loads((out / "metadata.json").read_text())
    assert md["counts"]["samples_packed"] == 1 and sum(md["counts"]["dropped"].values()) == 1


def test_existing_output_needs_overwrite(packed_dir):
    out, _ = packed_dir
    res = _run("pack", "--output", out, "--seq-length", "1024", "-q")
    assert "--overwrite" in _user_error(res, 1)
    res = _run("pack", "--output", out, "--seq-length", "1024", "-q", "--overwrite")
    assert res.exit_code == 0, res.output
    assert load_packed(out).metadata.seq_length == 1024


def test_B23_bad_capacity_for_cp_is_a_usage_error(tmp_path):
    res = _run("pack", "--output", tmp_path / "o", "--seq-length", "150", "--context-parallel-size", "2")
    msg = _user_error(res, 2)
    # a CLI user sees the flags, never the pack_dataset keywords
    assert "--seq-length 150 is not divisible" in msg and "--context-parallel-size 2" in msg
    assert "seq_length" not in msg and not (tmp_path / "o").exists()


def test_user_errors_are_messages_not_tracebacks(tmp_path):
    res = _run("pack", tmp_path / "missing.json", "--output", tmp_path / "o")
    assert "missing.json" in _user_error(res, 1)
    res = _run("pack", "--output", tmp_path / "o", "--algorithm", "magic")
    assert "unknown packing algorithm 'magic'" in _user_error(res, 2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    res = _run("pack", bad, "--output", tmp_path / "o", "-q")
    assert "bad.jsonl" in _user_error(res, 1)
    res = _run("inspect", tmp_path)
    assert "metadata.json is missing" in _user_error(res, 1)
    skip = "on_error='skip'"
    assert skip not in res.output
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}) + "\n")
    res = _run("pack", bad, "--output", tmp_path / "o", "-q")
    assert "--on-error skip" in _user_error(res, 1) and skip not in res.output  # the fix names the flag


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_output_is_refused_not_taken_as_the_current_folder(tmp_path, monkeypatch, empty):
    from seqpack import pack_dataset

    monkeypatch.chdir(tmp_path)
    res = _run("pack", "--output", empty, "--quiet")
    assert f"output {empty!r} is empty" in _user_error(res, 1)
    with pytest.raises(ValueError, match="is empty; pass the dataset folder"):
        pack_dataset(output=empty, progress=None)
    assert list(tmp_path.iterdir()) == []


def test_a_dash_output_is_refused_before_any_data_is_read_not_made_a_folder(tmp_path, monkeypatch):
    import os
    from pathlib import Path

    from seqpack import pack_dataset
    from seqpack.io.writer import PackedWriter

    monkeypatch.chdir(tmp_path)
    want = ("output '-': packed output is a folder (shards + metadata.json); stdout is not supported. Fix: pass the "
            "dataset folder to create, e.g. --output packed")
    res = _run("pack", tmp_path / "missing.jsonl", "--output", "-", "--quiet")  # refused before the input is read
    assert _user_error(res, 1) == f"error: {want}\n" and res.stdout == ""
    for out in ("-", Path("-"), "./-"):
        with pytest.raises(ValueError) as ei:
            pack_dataset(output=out, progress=None)
        assert str(ei.value) == want.replace("'-'", repr(os.fspath(out)))
    with pytest.raises(ValueError, match="stdout is not supported"):
        PackedWriter("-")
    assert list(tmp_path.iterdir()) == []
    res = _run("pack", "--output", tmp_path / "-", "--quiet", "--seq-length", "1024")  # a folder named '-' elsewhere
    assert res.exit_code == 0, res.output
    assert (tmp_path / "-" / "metadata.json").is_file()


@pytest.mark.parametrize("bad", [None, 5, ["out"]])
def test_an_output_that_is_no_path_is_refused_by_type(tmp_path, monkeypatch, bad):
    from seqpack import pack_dataset

    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=rf"output must be the dataset folder to create \(a str or path, e.g. "
                                        rf"'packed'\), got {type(bad).__name__}"):
        pack_dataset(output=bad, progress=None)
    assert list(tmp_path.iterdir()) == []


def test_inspect_on_a_read_only_dataset_says_how_to_plot_elsewhere(packed_dir, monkeypatch):
    import seqpack.io.summary as summary

    def denied(ds, out_path=None):  # what a read-only dataset folder gives (root may write anywhere)
        raise PermissionError(13, "Permission denied", str(ds.path / "report.png"))

    monkeypatch.setattr(summary, "plot_report", denied)
    out = _user_error(_run("inspect", packed_dir[0]), 1)
    assert "report.png: no permission" in out and "--plot PATH" in out and "--no-plot" in out
    assert _run("inspect", packed_dir[0], "--no-plot").exit_code == 0


def test_inspect_of_a_damaged_report_prints_only_the_error(packed_dir, tmp_path):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(packed_dir[0], ds)
    report = ds / "report.jsonl"
    n = len(report.read_text(encoding="utf-8").splitlines()) + 1
    with open(report, "a", encoding="utf-8") as f:
        f.write("{not json\n")
    for flags in (["--no-plot"], ["--json"]):  # --json reads and checks the report the same way
        res = _run("inspect", ds, *flags)
        _user_error(res, 1)
        assert res.stdout == ""  # the report is read before the summary (or the JSON) is printed
        assert res.stderr == (
            f"error: {report} line {n}: not JSON (Expecting property name enclosed in double quotes at column 2). "
            f"report.jsonl was edited or damaged after packing; re-pack, or check it with `seqpack inspect {ds} "
            "--verify`\n")


def test_inspect_writes_report_png(packed_dir, tmp_path):
    out, _ = packed_dir
    res = _run("inspect", out)
    assert res.exit_code == 0, res.output
    assert "packing efficiency" in res.output
    with Image.open(out / "report.png") as im:
        assert im.format == "PNG" and im.size[0] > 400
    target = tmp_path / "plots" / "r.png"
    target.parent.mkdir()  # a missing folder is refused, not made (test_files_the_user_names_are_checked...)
    res = _run("inspect", out, "--plot", target)
    assert res.exit_code == 0 and target.is_file()
    assert load_packed(out)  # the PNG and cache do not break the dataset checks
    res = _run("inspect", out, "--json")
    assert res.exit_code == 0
    md = json.loads(res.output)
    assert md == json.loads((out / "metadata.json").read_text())


def test_algorithms_lists_one_line_each():
    res = _run("algorithms")
    assert res.exit_code == 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == len(PackingAlgorithm)
    for a, line in zip(PackingAlgorithm, lines):
        assert line.split()[0] == a.value
        assert len(line.split()) > 2  # has a description
    assert [ln for ln in lines if "(default)" in ln][0].split()[0] == PackingAlgorithm(DEFAULT_ALGORITHM).value


def test_summary_rows_show_gap_to_lower_bound_and_reasons():
    from seqpack.io import PackedMetadata
    from seqpack.io.summary import summary_rows

    m = PackedMetadata(seq_length=4096, num_packs=5, lower_bound=4, packing_efficiency=0.8125,
                       counts={"records_read": 10, "samples_packed": 8, "dropped": {"overlength": 1},
                               "skipped": {"malformed_json": 1}})
    rows = dict(summary_rows(m, {"total": 1.5}))
    assert rows["packs / lower bound"] == "5 / 4 (+1)"
    assert rows["dropped"] == "1 (overlength: 1)" and rows["skipped"] == "1 (malformed_json: 1)"
    assert rows["truncated"] == "0" and rows["packing efficiency"].startswith("81.25%")
    assert rows["time"] == "total 1.50s"
    m.num_packs = 4
    assert dict(summary_rows(m))["packs / lower bound"] == "4 / 4 (optimal)"


def test_engine_option_errors_are_user_errors(tmp_path):
    out = _user_error(_run("pack", "--output", tmp_path / "x", "--engine", "spark", "--quiet"), 2)
    assert "--engine spark is not an engine" in out and "local, ray" in out and "key:" not in out
    out = _user_error(_run("pack", "--output", tmp_path / "y", "--num-cpus", "2", "--quiet"), 2)
    assert "--engine ray only" in out
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_engine_ray_without_ray_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *a, **kw):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    out = _user_error(_run("pack", "--output", tmp_path / "z", "--engine", "ray", "--quiet"), 2)
    assert 'pip install "seqpack[ray]"' in out


def test_version_option_prints_the_package_version():
    from typer.testing import CliRunner

    import seqpack
    from seqpack.cli import app

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout == f"seqpack {seqpack.__version__}\n"


def test_num_proc_flag(tmp_path):
    res = _run("pack", "--output", tmp_path / "a", "--seq-length", "1024", "--num-proc", "2", "--quiet")
    assert res.exit_code == 0, res.output
    res1 = _run("pack", "--output", tmp_path / "b", "--seq-length", "1024", "--num-proc", "1", "--quiet")
    assert res1.exit_code == 0, res1.output
    shards = sorted((tmp_path / "a" / "data").glob("*.parquet"))
    assert shards and [p.read_bytes() for p in shards] == [
        p.read_bytes() for p in sorted((tmp_path / "b" / "data").glob("*.parquet"))
    ]
    assert "--num-proc" in _user_error(_run("pack", "--output", tmp_path / "c", "--num-proc", "0", "-q"), 2)
    assert "--engine local only" in _user_error(
        _run("pack", "--output", tmp_path / "d", "--engine", "ray", "--num-proc", "2", "-q"), 2
    )
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_pack_help_shows_the_ray_extra_literally():
    from typer.testing import CliRunner

    from seqpack.cli import app

    r = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["pack", "--help"])
    assert r.exit_code == 0 and 'pip install "seqpack[ray]"' in r.stdout


def test_a_run_without_torch_does_not_print_transformers_no_torch_notice(tmp_path):
    import subprocess
    import sys

    hide = "import sys; sys.modules['torch'] = None\n"  # what a minimal install (no torch) looks like to imports
    seen = subprocess.run([sys.executable, "-c", hide + "import transformers"], capture_output=True, text=True)
    assert "PyTorch was not found" in seen.stderr  # the notice the CLI drops: this check can fail
    run = hide + f"from seqpack.cli import main\nmain(['pack', '-o', {str(tmp_path / 'o')!r}, '--quiet'])"
    res = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "PyTorch was not found" not in res.stderr + res.stdout and (tmp_path / "o" / "metadata.json").is_file()


def test_full_disk_is_a_plain_message_and_leaves_no_spill(tmp_path, monkeypatch):
    """ENOSPC while spilling (the flush in close fails too, as on a full disk): one message naming the
    folder and the fix, exit 1, and no hidden spill or temp folder left beside the output."""
    import errno

    from seqpack.io.spill import SampleSpill

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.directory / "ids.bin"))

    real_close = SampleSpill.close

    def close_fails(self):
        real_close(self)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SampleSpill, "append", full)
    monkeypatch.setattr(SampleSpill, "extend", full)
    monkeypatch.setattr(SampleSpill, "close", close_fails)
    out = tmp_path / "out"
    text = " ".join(_user_error(_run("pack", "--output", out, "--seq-length", "1024", "--quiet"), 1).split())
    assert "no space left on the device while writing" in text
    assert f"in {tmp_path}" in text and "Fix: free space there" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_files_the_user_names_are_checked_and_no_folder_is_made(packed_dir, tmp_path):
    """``inspect --plot`` and ``recipe -o``: a folder or a missing folder is one message (exit 1); nothing
    is created; a plot path without a suffix is written, and reported, as ``.png``."""
    out, _ = packed_dir
    folder = tmp_path / "figs"
    folder.mkdir()
    missing = tmp_path / "no" / "such"
    for args, says in [
        (("inspect", out, "--plot", folder), f"plot {folder} is a folder, not a file; give a file name, e.g. {folder / 'report.png'}"),
        (("inspect", out, "--plot", missing / "r.png"), f"the folder {missing} does not exist"),
        (("recipe", "qwen3_sft", "-o", folder), f"recipe file {folder} is a folder"),
        (("recipe", "qwen3_sft", "-o", missing / "r.yaml"), f"the folder {missing} does not exist"),
    ]:
        assert says in " ".join(_user_error(_run(*args), 1).split())
    assert not (tmp_path / "no").exists() and list(folder.iterdir()) == []
    res = _run("inspect", out, "--plot", tmp_path / "plot")
    assert res.exit_code == 0 and f"wrote {tmp_path / 'plot.png'}" in " ".join(res.output.split())
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "plot").exists()


def test_an_error_before_any_bar_is_the_first_line_on_stderr(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n{bad\n')
    r = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(app, ["pack", str(bad), "-o", str(tmp_path / "o")])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith(f"error: {bad}, line 2: malformed JSON"), repr(r.stderr[:80])
