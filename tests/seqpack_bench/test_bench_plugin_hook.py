"""seqpack's CLI plugin hook (entry points of group ``seqpack.cli``) and the rule that seqpack never imports
seqpack_bench: `seqpack bench` / `seqpack train` come from the entry points; a broken plugin is a warning."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import typer
from typer.testing import CliRunner

from seqpack_bench._child import child_env

SRC = Path(__file__).resolve().parents[2] / "src"


def test_seqpack_source_never_names_seqpack_bench():
    hits = [f"{p.relative_to(SRC)}:{k}" for p in sorted((SRC / "seqpack").rglob("*.py"))
            for k, line in enumerate(p.read_text().splitlines(), 1) if "seqpack_bench" in line]
    assert hits == []


def test_bench_and_train_come_from_the_entry_points():
    from seqpack.cli import PLUGIN_GROUP, app
    from seqpack_bench.cli.bench import bench_app

    eps = {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}
    assert eps == {"bench": "seqpack_bench.cli.bench:bench_app", "train": "seqpack_bench.cli.train:register"}
    assert [g.typer_instance for g in app.registered_groups if g.name == "bench"] == [bench_app]
    assert [c.name for c in app.registered_commands].count("train") == 1


def test_a_broken_plugin_is_a_warning_naming_it(monkeypatch, capsys):
    import seqpack.cli as cli

    good = typer.Typer()

    @good.command("hello")
    def hello() -> None:
        print("hello from the plugin")

    fakes = [EntryPoint("zbroken", "no_such_module_xyz:app", cli.PLUGIN_GROUP),
             EntryPoint("aok", "x:y", cli.PLUGIN_GROUP), EntryPoint("wrongtype", "x:z", cli.PLUGIN_GROUP)]
    objects = {"x:y": good, "x:z": 42}
    monkeypatch.setattr(EntryPoint, "load", lambda self: objects[self.value] if self.value in objects
                        else __import__(self.value.split(":")[0]))
    monkeypatch.setattr(cli, "entry_points", lambda group: [ep for ep in fakes if ep.group == group])
    host = typer.Typer()

    @host.command("pack")
    def pack() -> None:
        print("packing")

    assert cli.load_plugins(host) == ["aok"]
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("warning: seqpack CLI plugin 'wrongtype' (x:z) not loaded: TypeError: ")
    assert err[1].startswith("warning: seqpack CLI plugin 'zbroken' (no_such_module_xyz:app) not loaded: "
                             "ModuleNotFoundError: ")
    assert "packing" in CliRunner().invoke(host, ["pack"]).output
    assert "hello from the plugin" in CliRunner().invoke(host, ["aok", "hello"]).output


def test_seqpack_pack_works_with_a_broken_installed_plugin(tmp_path):
    # an installed distribution whose seqpack.cli entry point cannot be imported (metadata on sys.path)
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[seqpack.cli]\nbroken = broken_plugin_missing.cli:app\n")
    env = child_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    p = subprocess.run([sys.executable, "-c", "from seqpack.cli import main; main()", "pack", "--help"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Usage:" in p.stdout and "pack" in p.stdout
    assert ("warning: seqpack CLI plugin 'broken' (broken_plugin_missing.cli:app) not loaded: ModuleNotFoundError"
            in p.stderr)
    assert "Traceback" not in p.stderr
