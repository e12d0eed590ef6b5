"""`seqpack pack` messages name the flags a shell user types, and the config file's keys for values that
came from --config; the Python API keeps its keyword names for the same errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from seqpack.cli import app
from seqpack.data.length_policy import OverlengthError
from seqpack.data.records import DataFormatError
from seqpack.pipeline import PackConfigError, cli_error_text, cli_message, pack_dataset

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _error(res, code: int) -> str:
    """The one-line ``error: ...`` text of a user error (no traceback), whitespace normalised."""
    assert res.exit_code == code, res.output
    assert type(res.exception) is SystemExit and "Traceback" not in res.output
    return " ".join(res.output.split("error: ")[-1].split())


@pytest.fixture
def long_record(tmp_path):
    path = tmp_path / "long.json"
    path.write_text(json.dumps([{"instruction": "s", "input": "word " * 300, "output": "ok"}]))
    return path


def test_overlength_error_names_flags_on_the_cli_and_keywords_in_python(long_record, tmp_path):
    msg = _error(_run("pack", long_record, "-o", tmp_path / "o", "-q", "--seq-length", 64, "--overlength", "error"), 1)
    assert msg.startswith(f"sample 'long.json:0' ({long_record}, record 0) has ")
    assert msg.endswith("Fix: raise --seq-length, or pass --overlength truncate (the SFT default), --overlength drop "
                        "or --overlength split.")
    with pytest.raises(OverlengthError) as ei:
        pack_dataset([long_record], tmp_path / "p", seq_length=64, overlength="error")
    assert str(ei.value).endswith("Fix: raise seq_length, or pass overlength='truncate' (the SFT default), "
                                  "overlength='drop' or overlength='split'.")
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()


def test_cli_message_spells_values_as_shell_words():
    assert cli_message("set overlength='split' or seq_length=96; num_proc=1 runs here") == (
        "set --overlength split or --seq-length 96; --num-proc 1 runs here")
    # an on/off keyword is the bare flag; a value that is not one shell word keeps its quotes
    assert cli_message("pass allow_any_media_path=True, media_dir=DIR or on_error='a b'") == (
        "pass --allow-any-media-path, --media-dir DIR or --on-error 'a b'")
    # plain words are prose unless written key=value
    assert cli_message("unknown packing algorithm; algorithm='x'") == "unknown packing algorithm; --algorithm x"


def test_only_the_fix_of_a_record_error_is_translated():
    # the record's own text (here a key named like a keyword) is quoted as it is
    e = DataFormatError("unknown record format (keys: ['seq_length=3']).", source="d.jsonl", line=2,
                        fix="rename the columns; on_error='skip' skips and reports it.")
    assert cli_error_text(e) == ("d.jsonl, line 2: unknown record format (keys: ['seq_length=3']). Fix: rename the "
                                 "columns; --on-error skip skips and reports it.")
    assert cli_error_text(ValueError("seq_length=3 without a fix")) == "seq_length=3 without a fix"
    assert cli_error_text(PackConfigError("seq_length=3 is odd")) == "--seq-length 3 is odd"


def test_config_values_are_named_as_the_files_keys(tmp_path):
    cfg = tmp_path / "cp2.yaml"
    assert _run("recipe", "qwen3_sft_cp2", "-o", cfg).exit_code == 0  # seq_length 16384, CP 2
    msg = _error(_run("pack", "--config", cfg, "--pad-to-multiple-of", 12, "-o", tmp_path / "o"), 2)
    assert msg == (
        "seq_length: 16384 is not divisible by the pad multiple 12 (--pad-to-multiple-of 12, context_parallel_size: "
        "2); context parallelism pads every segment to a multiple of 2*context_parallel_size; set seq_length to "
        "16380 or 16392, or change --pad-to-multiple-of / context_parallel_size (seq_length and "
        f"context_parallel_size come from --config {cfg}; change them there, or override them with --seq-length / "
        "--context-parallel-size)")
    # a flag overrides the file: that value is named as the flag, the file's CP as its key
    msg = _error(_run("pack", "--config", cfg, "--seq-length", 1002, "-o", tmp_path / "o"), 2)
    assert msg.startswith("--seq-length 1002 is not divisible by the pad multiple 4 (pad_to_multiple_of: 1, "
                          "context_parallel_size: 2)")
    assert msg.endswith(f"(pad_to_multiple_of and context_parallel_size come from --config {cfg}; change them there, "
                        "or override them with --pad-to-multiple-of / --context-parallel-size)")
    with pytest.raises(PackConfigError, match=r"^seq_length=16384 is not divisible by the pad multiple 12 "
                       r"\(pad_to_multiple_of=12, context_parallel_size=2\)"):
        pack_dataset(None, tmp_path / "p", seq_length=16384, pad_to_multiple_of=12, context_parallel_size=2)


def test_an_invalid_config_points_at_the_problems_listed_above(tmp_path):
    for columns in ("80", "200"):  # numbered entries on a narrow terminal, a table on a wide one
        r = CliRunner(env={"COLUMNS": columns, "NO_COLOR": "1"}).invoke(
            app, ["pack", "--config", "qwen2_5_vl_sft", "-o", str(tmp_path / "o")])
        assert r.exit_code == 2
        assert _error(r, 2) == ("--config qwen2_5_vl_sft is not a valid packing config (its problems are "
                                "listed above; `seqpack validate qwen2_5_vl_sft` checks it)")
        assert "table" not in r.output


def test_a_quoted_number_in_a_config_is_refused_by_validate_and_pack(tmp_path):
    cfg = tmp_path / "q.yaml"
    cfg.write_text('tokenizer: qwen3\npacking: offline\nseq_length: "4096"\n')
    r = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"}).invoke(app, ["validate", str(cfg)])  # numbered entries
    assert r.exit_code == 1 and "OK" not in r.stdout
    text = " ".join(r.stderr.split())
    assert ("keys: seq_length problem: seq_length is the text '4096' (quoted), not an integer fix: remove the "
            "quotes: `seq_length: 4096`") in text
    r = _run("pack", "--config", cfg, "-o", tmp_path / "o", "-q")
    assert r.exit_code == 2 and "remove the quotes: `seq_length: 4096`" in " ".join(r.output.split())
    assert not (tmp_path / "o").exists()
    # the shipped recipes keep validating (every number and on/off key unquoted)
    from seqpack.config import list_recipes

    for name in list_recipes():
        assert _run("validate", name).exit_code == 0, name
