"""`seqpack pack --config`: the YAML `seqpack validate` and the recipes read fills the pack options;
`--help` shows on/off options as plain flags; settings errors name the flags on the CLI and the
keywords in the Python API."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from seqpack.cli import app
from seqpack.config import ConfigValidationError, load_recipe
from seqpack.pipeline import PackConfigError, cli_message, pack_dataset

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _metadata(out) -> dict:
    return json.loads((out / "metadata.json").read_text())


def test_recipe_file_packs_like_the_equivalent_flags(tmp_path):
    recipe = tmp_path / "my.yaml"
    assert _run("recipe", "qwen3_sft", "-o", recipe).exit_code == 0
    r = _run("pack", "--config", recipe, "-o", tmp_path / "from_config", "-q")
    assert r.exit_code == 0, r.output
    # qwen3_sft: seq_length 4096, first_fit_shuffle, embedded qwen3 tokenizer, no CP, pad multiple 1
    r = _run("pack", "-o", tmp_path / "from_flags", "-q", "--seq-length", 4096, "--algorithm", "first_fit_shuffle",
             "--tokenizer", "qwen3", "--pad-to-multiple-of", 1, "--context-parallel-size", 1)
    assert r.exit_code == 0, r.output
    a, b = _metadata(tmp_path / "from_config"), _metadata(tmp_path / "from_flags")
    assert a["seq_length"] == 4096 and a["algorithm"] == "first_fit_shuffle"
    a.pop("timings_s", None), b.pop("timings_s", None)
    assert a == b
    # a flag given on the command line wins over the file
    r = _run("pack", "--config", recipe, "-o", tmp_path / "override", "-q", "--seq-length", 2048)
    assert r.exit_code == 0, r.output
    s = _metadata(tmp_path / "override")
    assert s["seq_length"] == 2048 and s["algorithm"] == "first_fit_shuffle"


def test_config_problems_print_validates_table_before_reading_data(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seq_lenght: 1024\n")
    r = _run("pack", tmp_path / "never-read.jsonl", "--config", bad, "-o", tmp_path / "o")
    assert r.exit_code == 2 and type(r.exception) is SystemExit
    assert "unknown config key 'seq_lenght'" in r.output and "did you mean 'seq_length'?" in r.output
    assert "never-read" not in r.output and not (tmp_path / "o").exists()
    # a rule violation (CP needs seq_length divisible by 2*CP) gives the same rule name as `seqpack validate`
    cp = tmp_path / "cp.yaml"
    cp.write_text("seq_length: 1001\ncontext_parallel_size: 2\n")
    v = _run("validate", cp)
    rule = re.search(r"│\s*1\s*│\s*(\w+)", v.output).group(1)
    r = _run("pack", "--config", cp, "-o", tmp_path / "o")
    assert r.exit_code == 2 and rule in r.output and "seqpack validate" in r.output


def test_config_for_training_time_packing_is_refused_naming_the_key(tmp_path):
    r = _run("pack", "--config", "qwen2_5_vl_sft", "-o", tmp_path / "o")
    assert r.exit_code == 2
    assert "packing is 'in_batch'" in r.output and "packing: offline" in r.output
    with pytest.raises(ConfigValidationError) as ei:
        load_recipe("qwen3_sft", packing="streaming", packing_buffer_size=64).pack_options()
    assert {k for v in ei.value.violations for k in v.keys} == {"packing", "packing_buffer_size"}


def test_pack_options_keep_the_effective_pad_multiple_of_tp_and_sp():
    # CP 2 pads to 4; TP 4 with sequence parallelism raises it to lcm(4, CP*TP) = 8, which pack_dataset
    # (no TP setting) gets as its pad multiple
    cfg = load_recipe("qwen3_sft_cp2", tensor_model_parallel_size=4)
    opts = cfg.pack_options()
    assert cfg.effective_pad_multiple == 8 and opts["pad_to_multiple_of"] == 8
    assert load_recipe("qwen3_sft_cp2").pack_options()["pad_to_multiple_of"] == 1  # CP*TP = 2*CP: no change
    assert opts["context_parallel_size"] == 2 and opts["seq_length"] == cfg.seq_length
    assert "micro_batch_size" not in opts


def test_help_shows_flags_without_a_value():
    out = _run("pack", "--help").output
    for flag in ("--overwrite", "--quiet", "--help"):
        assert re.search(rf"{flag}\s", out)
    assert "<bool>" not in out  # no on/off option reads as taking a value
    assert re.search(r"--seq-length\s+<int>", out)
    assert "flags given on the command line override the file" in " ".join(out.split())


def test_errors_name_flags_on_the_cli_and_keywords_in_python(tmp_path):
    r = _run("pack", "-o", tmp_path / "o", "--algorithm", "magic")
    assert r.exit_code == 2 and "--algorithm magic: unknown packing algorithm 'magic'" in r.output
    with pytest.raises(PackConfigError, match=r"^algorithm='magic': unknown packing algorithm") as ei:
        pack_dataset(None, tmp_path / "o", algorithm="magic")
    assert "--" not in str(ei.value)
    r = _run("pack", "-o", tmp_path / "o", "--planning", "per_shard")
    assert r.exit_code == 2 and "--planning apply to --engine ray only" in r.output
    r = _run("pack", "-o", tmp_path / "o", "--overlength", "cut")
    assert r.exit_code == 2 and "--overlength cut is not valid" in r.output
    assert cli_message("on_error='x'; see the algorithm setting, algorithm=None") == (
        "--on-error x; see the algorithm setting, --algorithm None")
