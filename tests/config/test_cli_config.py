"""`seqpack validate` and `seqpack recipe` through typer's CliRunner on seqpack.cli.app."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from seqpack.cli import app
from seqpack.config import PackingConfig, list_recipes, load_recipe

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.mark.parametrize("name", list_recipes())
def test_validate_every_recipe_exits_0(name, tmp_path):
    out = tmp_path / f"{name}.yaml"
    r = invoke("recipe", name, "--output", str(out))
    assert r.exit_code == 0, r.output
    assert PackingConfig.from_file(out) == load_recipe(name)
    r = invoke("validate", str(out))
    assert r.exit_code == 0, r.output
    assert r.output.startswith("OK ") and f"effective_pad_multiple={load_recipe(name).effective_pad_multiple}" in r.output
    # a recipe name works directly too
    assert invoke("validate", name).exit_code == 0


def test_validate_bad_config_exits_1_with_table(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("seq_length: 150\ncontext_parallel_size: 2\npacking: streaming\nmtp_num_layers: 1\n"
                 "model_family: deepseek_v3\n")
    r = invoke("validate", str(p))
    assert r.exit_code == 1
    out = r.output
    assert "4 problems in" in out
    for rule in ("seq_length_divisible", "cp_loss_settings", "streaming_loss", "streaming_mtp"):
        assert rule in out
    for key in ("seq_length", "context_parallel_size", "calculate_per_token_loss", "mtp_num_layers"):
        assert key in out
    assert "148 or 152" in out and "case B23" in out


def test_validate_json_format(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"packing": "offline", "micro_batch_size": 2}))
    r = invoke("validate", str(p), "--format", "json")
    assert r.exit_code == 1
    data = json.loads(r.output)
    assert data["valid"] is False
    assert [v["rule"] for v in data["violations"]] == ["offline_micro_batch"]
    assert data["violations"][0]["keys"] == ["packing", "micro_batch_size"]
    p.write_text(json.dumps({"packing": "offline"}))
    r = invoke("validate", str(p), "-f", "json")
    assert r.exit_code == 0 and json.loads(r.output) == {"source": str(p), "valid": True,
                                                         "effective_pad_multiple": 1, "packed_data": None,
                                                         "notes": [], "violations": []}


def test_validate_schema_error_and_missing_file(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("seq_len: 4096\n")
    r = invoke("validate", str(p))
    assert r.exit_code == 1 and "seq_len" in r.output and "did you mean 'seq_length'?" in r.output
    r = invoke("validate", str(tmp_path / "nope.yaml"))
    assert r.exit_code == 1 and "not found" in r.output
    assert invoke("validate", str(p), "--format", "xml").exit_code == 2


def test_recipe_lists_names_and_prints_yaml():
    r = invoke("recipe")
    assert r.exit_code == 0
    for n in list_recipes():
        assert n in r.output
    r = invoke("recipe", "qwen3_5_vl_sft")
    assert r.exit_code == 0
    data = yaml.safe_load(r.output)
    assert data["packing"] == "in_batch" and data["micro_batch_size"] == 2
    r = invoke("recipe", "does_not_exist")
    assert r.exit_code == 1 and "unknown recipe" in r.output


def test_B23_validate_checks_stored_packed_data(tmp_path):
    import numpy as np

    from seqpack.sample import Sample
    from seqpack.io import write_packed
    from seqpack.io.metadata import PackedMetadata
    from seqpack.packed import build_packed_sequence

    ids = np.arange(1, 6, dtype=np.int32)
    s = Sample(ids, np.r_[ids[1:], -100].astype(np.int32), sample_id="a")
    row = build_packed_sequence([s], pad_to_multiple_of=1, pad_token_id=0, seq_length=8)
    data = tmp_path / "packed"
    write_packed([row], data, PackedMetadata(seq_length=8, algorithm="first_fit_shuffle"))
    cfg = tmp_path / "c.yaml"
    base = f"seq_length: 8\nalgorithm: first_fit_shuffle\npacked_dataset_path: {data}\n"
    cfg.write_text(base)
    assert invoke("validate", str(cfg)).exit_code == 0
    cfg.write_text(base + "context_parallel_size: 2\ncalculate_per_token_loss: true\naverage_in_collective: false\n")
    r = invoke("validate", str(cfg))
    assert r.exit_code == 1 and "stale_packed_data" in r.output and "context_parallel_size" in r.output
    assert invoke("validate", str(cfg), "--no-check-data").exit_code == 0


def test_families_command():
    r = invoke("families")
    assert r.exit_code == 0
    for key in ("llama3", "qwen3_next", "glm4_5", "qwen3_5_vl", "deepseek_v3", "mixtral", "nemotron_omni"):
        assert key in r.output
    r = invoke("families", "Qwen3-Next")
    assert r.exit_code == 0
    assert "packing modes: none" in r.output and "opt-out offline, in_batch, streaming" in r.output
    assert "qwen3_next.py" in r.output
    r = invoke("families", "gpt5")
    assert r.exit_code == 1 and "unknown model family" in r.output


@pytest.mark.parametrize("columns", [80, 200])
def test_listings_keep_to_the_terminal_width_and_cut_no_name(columns):
    from seqpack.config import list_families, list_recipes

    narrow = CliRunner(env={"COLUMNS": str(columns), "NO_COLOR": "1"})
    for command, names in (("recipe", list_recipes()), ("families", [f.key for f in list_families()])):
        r = narrow.invoke(app, [command])
        assert r.exit_code == 0
        assert max(len(line) for line in r.output.splitlines()) <= columns, command
        assert "…" not in r.output, command  # a cell is wrapped, never cut
        first_cells = [line.split("│")[1].strip() for line in r.output.splitlines() if line.startswith("│")]
        assert set(names) <= set(first_cells), command


def test_B23_readme_flow_pack_then_validate_recipe_with_packed_dir(tmp_path):
    """README: `seqpack pack --tokenizer qwen3 ...` then `seqpack validate <qwen3 recipe> packed/`.
    Same tokenizer (named 'qwen3' at pack time), CLI default algorithm vs the recipe's: valid, with notes."""
    packed = tmp_path / "packed"
    r = invoke("pack", "--tokenizer", "qwen3", "--seq-length", "4096", "--output", str(packed))
    assert r.exit_code == 0, r.output
    meta = json.loads((packed / "metadata.json").read_text())
    assert meta["tokenizer"] == "qwen3" and meta["algorithm"] != "first_fit_shuffle"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(load_recipe("qwen3_sft", tokenizer="Qwen/Qwen3-8B").to_yaml())  # the hub id spelling
    r = invoke("validate", str(cfg), str(packed))
    assert r.exit_code == 0, r.output
    assert f"packed data {packed} fits this config" in r.output
    assert "note: algorithm: stored" in r.output and "compared by name only" in r.output
    r = invoke("validate", "qwen3_sft", str(packed), "-f", "json")  # the shipped recipe: hashes compared
    data = json.loads(r.output)
    assert r.exit_code == 0 and data["valid"] and data["packed_data"] == str(packed)
    assert any("hashes equal the stored ones" in n for n in data["notes"])
    # the positional directory overrides packed_dataset_path; a real staleness key still fails
    r = invoke("validate", "qwen3_sft_cp2", str(packed), "-f", "json")
    data = json.loads(r.output)
    assert r.exit_code == 1 and [v["rule"] for v in data["violations"]] == ["stale_packed_data"]
    assert data["violations"][0]["keys"] == ["packed_dataset_path", "capacity", "effective_pad_multiple",
                                             "context_parallel_size"]


def test_validate_packed_dir_argument_overrides_and_conflicts(tmp_path):
    import numpy as np

    from seqpack.sample import Sample
    from seqpack.io import write_packed
    from seqpack.io.metadata import PackedMetadata
    from seqpack.packed import build_packed_sequence

    ids = np.arange(1, 6, dtype=np.int32)
    row = build_packed_sequence([Sample(ids, np.r_[ids[1:], -100].astype(np.int32), sample_id="a")],
                                pad_token_id=0, seq_length=8)
    good = tmp_path / "good"
    write_packed([row], good, PackedMetadata(seq_length=8, algorithm="first_fit_shuffle"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"seq_length: 8\npacked_dataset_path: {tmp_path / 'gone'}\n")
    r = invoke("validate", str(cfg))
    assert r.exit_code == 1 and "packed_data_unreadable" in r.output
    r = invoke("validate", str(cfg), str(good))
    assert r.exit_code == 0 and "note: algorithm: stored 'first_fit_shuffle'" in r.output
    r = invoke("validate", str(cfg), str(good), "--no-check-data")
    assert r.exit_code == 2 and "--no-check-data" in r.output


@pytest.mark.parametrize("args, start", [
    (["recipe", "nope"], "error: unknown recipe 'nope'; known: "),
    (["families", "nope"], "error: "),
    (["validate", "no-such-config.yaml"], "error: "),
    (["validate", "x.yaml", "--format", "xml"], "error: --format must be 'table' or 'json', got 'xml'"),
])
def test_config_commands_print_errors_on_stderr_only(args, start, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from seqpack.cli import app

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, args)
    assert r.exit_code in (1, 2) and r.stdout == ""  # a `> out.yaml` redirect never captures an error
    assert r.stderr.startswith(start), r.stderr


@pytest.mark.parametrize("columns", [80, 200])
def test_validate_prints_problems_on_stderr_within_the_terminal_width(tmp_path, columns):
    p = tmp_path / "bad.yaml"
    p.write_text("seq_length: 150\ncontext_parallel_size: 2\npacking: streaming\nmtp_num_layers: 1\n"
                 "model_family: deepseek_v3\n")
    r = CliRunner(env={"COLUMNS": str(columns), "NO_COLOR": "1"}).invoke(app, ["validate", str(p)])
    assert r.exit_code == 1 and r.stdout == ""
    err = r.stderr
    assert [line for line in err.splitlines() if len(line) > columns] == []
    flat = " ".join(err.split())
    assert "4 problems in" in flat and "148 or 152" in flat and "case B23" in flat
    for rule in ("seq_length_divisible", "cp_loss_settings", "streaming_loss", "streaming_mtp"):
        assert rule in err
    if columns == 80:  # one entry per problem, words whole (a table's cells would cut them)
        assert "1. seq_length_divisible" in err and "   keys: seq_length" in err
        for word in ("calculate_per_token_loss", "context_parallel_size", "mtp_num_layers"):
            assert word in err
    ok = tmp_path / "ok.yaml"
    ok.write_text("seq_length: 4096\n")
    r = CliRunner(env={"COLUMNS": str(columns)}).invoke(app, ["validate", str(ok)])
    assert r.exit_code == 0 and r.stdout.startswith("OK ") and r.stderr == ""
