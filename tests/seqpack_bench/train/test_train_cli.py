"""`seqpack train` through the seqpack.cli entry points: option errors before any work, data errors, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from seqpack_bench.train import TrainConfig

from _train_helpers import GPU, _app, CLI_TINY, _invoke, _one_line, _chat_file, _forbid_work, _bench_gpu


def test_cli_train_on_a_data_file(tmp_path, qwen3_tokenizer):
    from seqpack.cli.app import app

    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"question {i} " * (i % 5 + 1)},
                                                       {"role": "assistant", "content": f"answer {i} " * (i % 7 + 2)}]})
                              for i in range(24)) + "\n")
    r = CliRunner().invoke(app, ["train", "--mode", "padded,packed", "--data", str(data), "--steps", "2",
                                 "--seq-length", "128", "--hidden-size", "32", "--intermediate-size", "64",
                                 "--num-layers", "1", "--no-progress", "--warmup-steps", "0", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "train.json").read_text())
    assert set(res["modes"]) == {"padded", "packed"} and res["data"]["samples"] == 24
    bad = CliRunner().invoke(app, ["train", "--mode", "padded,warp", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and _one_line(bad) == ("error: --mode: unknown mode(s) 'warp'; choose from padded, packed, "
                                                     "in_batch, streaming (or 'all' on the command line)")
    bad = CliRunner().invoke(app, ["train", "--dtype", "fp8", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and _one_line(bad) == "error: --dtype must be 'float32' or 'bfloat16', got 'fp8'"


def test_unwritable_out_fails_before_any_work(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    bad = tmp_path / "file" / "x"
    _forbid_work(monkeypatch)
    r = _invoke(["--steps", "3", "--out", str(bad), *CLI_TINY])
    assert r.exit_code == 2
    line = _one_line(r)
    assert "--out" in line and str(bad) in line and "writable folder" in line
    # run.sh checks before any wheel install or model build; bench_gpu.py before importing torch
    p = subprocess.run(["bash", str(GPU / "run.sh"), "--dry-run", "--out", str(bad)],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHON=sys.executable))
    assert p.returncode == 2 and "--out" in p.stderr and "Traceback" not in p.stderr + p.stdout
    assert "speed-up" not in p.stdout  # nothing ran
    with pytest.raises(SystemExit) as ex:
        _bench_gpu().main(["--dry-run", "--out", str(bad)])
    err = capsys.readouterr().err  # the shared check (seqpack_bench.timing.ensure_out_dir) names the blocking file
    assert ex.value.code == 2 and f"error: --out {bad}: cannot create this folder ({bad.parent} is a file" in err


def test_data_accepts_globs_and_refuses_folders(tmp_path, qwen3_tokenizer, fake_training):
    calls, _ = fake_training
    _chat_file(tmp_path / "a.jsonl", 5)
    _chat_file(tmp_path / "b.jsonl", 7)
    r = _invoke(["--data", str(tmp_path / "*.jsonl"), "--seq-length", "128", "--out", str(tmp_path / "o"), *CLI_TINY])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1 and len(calls[0][0]) == 12  # both files, globbed
    assert "prepare: 12 records read -> 12 samples" in r.output
    r = _invoke(["--data", str(tmp_path / "*.parquet"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "--data" in _one_line(r) and "matches no file" in _one_line(r)
    r = _invoke(["--data", str(tmp_path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "--data" in _one_line(r) and "is a folder" in _one_line(r) and "*.jsonl" in _one_line(r)
    assert len(calls) == 1


def test_bad_data_files_are_one_line_errors_with_the_record(tmp_path, qwen3_tokenizer, fake_training):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "yo"}]}) + "\n{\"messages\": [\n")
    r = _invoke(["--data", str(bad_json), "--out", str(tmp_path / "o")])
    assert r.exit_code == 1
    assert "--data" in _one_line(r) and "bad.jsonl, line 2" in _one_line(r) and "malformed JSON" in _one_line(r)
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps([{"foo": 1}]))
    r = _invoke(["--data", str(unknown), "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "unknown.json, record 0" in _one_line(r) and "unknown record format" in _one_line(r)
    assert fake_training[0] == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_hardware_mismatch_is_a_one_line_error_before_training(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    r = _invoke(["--device", "cuda", "--out", str(tmp_path)])
    assert r.exit_code == 2 and _one_line(r).startswith("error: --device: 'cuda'") and "--device cpu" in _one_line(r)
    r = _invoke(["--attn", "flash_attention_2", "--out", str(tmp_path)])
    assert r.exit_code == 2 and _one_line(r).startswith("error: --attn flash_attention_2") and "--attn sdpa" in r.output
    r = _invoke(["--attn", "flash", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown attention implementation" in _one_line(r)


def test_loss_check_failure_exits_1_speed_miss_exits_0(tmp_path, fake_training, qwen3_tokenizer):
    r = _invoke(["--tolerance", "-1", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--tolerance" in r.output  # a negative tolerance is refused
    calls, goals = fake_training
    data = str(_chat_file(tmp_path / "d.jsonl", 4))
    goals[:] = [{"goal": "packed: speed-up >= 90% of ideal", "pass": False, "info": "1.1x", "kind": "speed"}]
    r = _invoke(["--data", data, "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output  # speed verdicts are informational
    goals.append({"goal": "packed: loss curve = padded within 0.001", "pass": False, "info": "max |delta| 2e-2",
                  "kind": "loss"})
    r = _invoke(["--data", data, "--out", str(tmp_path)])
    assert r.exit_code == 1
    assert "1 loss-agreement check(s) failed" in _one_line(r) and "max |delta| 2e-2" in _one_line(r)
    assert len(calls) == 2


def test_prepare_report_is_summarised_and_empty_data_names_seq_length(tmp_path, qwen3_tokenizer, fake_training):
    data = _chat_file(tmp_path / "d.jsonl", 24)
    r = _invoke(["--data", str(data), "--seq-length", "24", "--out", str(tmp_path), *CLI_TINY])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("prepare:"))
    kept = len(fake_training[0][0][0])
    assert line.startswith(f"prepare: 24 records read -> {kept} samples") and 0 < kept < 24
    assert f"dropped: no_trainable_tokens {24 - kept}" in line and "truncated: overlength" in line
    r = _invoke(["--data", str(data), "--seq-length", "2", "--out", str(tmp_path)])
    assert r.exit_code == 1
    err = _one_line(r)
    assert "no samples to train on: 24 records read -> 0 samples" in err
    assert "dropped: no_trainable_tokens 24" in err and "--seq-length 2" in err and "raise --seq-length" in err


def test_image_records_are_trained_as_text_with_a_warning(tmp_path, shared_data):
    r = _invoke(["--data", str(shared_data / "llama-factory" / "mllm_demo.json"), "--mode", "packed", "--steps", "1",
                 "--warmup-steps", "0", "--seq-length", "256", "--out", str(tmp_path), *CLI_TINY])
    assert r.exit_code == 0, r.output
    assert "warning: 6 of 6 samples have images; seqpack train trains text-only models, so the images are ignored" \
        in r.output.replace("\n", " ")


def test_wrong_option_named_model_and_empty_mode(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    r = _invoke(["--model", "/nonexistent", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert _one_line(r).startswith("error: --model: /nonexistent is neither tiny-qwen3/tiny-llama nor an existing "
                                   "local model folder")
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    r = _invoke(["--model", str(notes), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and _one_line(r) == (
        f"error: --model: {notes} is a file, not a model folder. Fix: pass the folder model.save_pretrained(...) "
        "wrote (config.json + weights), or one of tiny-qwen3/tiny-llama")
    (tmp_path / "m").mkdir()
    cfg = tmp_path / "m" / "config.json"
    cfg.write_text("{}")
    r = _invoke(["--model", str(cfg), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and f"It is a file of a model folder; the model is its folder, {cfg.parent}." in _one_line(r)
    for mode in ("", " , "):
        r = _invoke(["--mode", mode, "--out", str(tmp_path)])
        assert r.exit_code == 2 and "--mode is empty" in _one_line(r)
        assert "padded, packed, in_batch, streaming" in _one_line(r)


def test_model_folder_needs_config_weights_and_tokenizer_exit_2(tmp_path, monkeypatch, qwen3_tokenizer):
    from transformers import AutoModelForCausalLM

    from seqpack_bench.train import CLI_OPTION_NAMES, check_runtime, tiny_config

    _forbid_work(monkeypatch)
    data = str(_chat_file(tmp_path / "d.jsonl", 3))
    conf = tiny_config("llama", vocab_size=300, hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2,
                       num_kv_heads=1)
    no_weights = tmp_path / "no_weights"  # config.json + tokenizer files, no weights (the tester's folder)
    conf.save_pretrained(no_weights)
    qwen3_tokenizer.save_pretrained(no_weights)
    (tmp_path / "empty").mkdir()
    for folder, missing in ((no_weights, "no weights (model.safetensors, pytorch_model.bin or a *.index.json"),
                            (tmp_path / "empty", "no config.json and no weights")):
        r = _invoke(["--model", str(folder), "--data", data, "--out", str(tmp_path / "o")])
        assert r.exit_code == 2
        assert _one_line(r).startswith(f"error: --model: the folder {folder} has {missing}"), r.output
    # a sharded checkpoint (shard index) is a checkpoint: the folder check passes
    (no_weights / "model.safetensors.index.json").write_text("{}")
    check_runtime(TrainConfig(model=str(no_weights)), option_names=CLI_OPTION_NAMES)
    # weights but no tokenizer: the library's multi-line message comes out on one line, naming --model and --tokenizer
    AutoModelForCausalLM.from_config(conf).save_pretrained(tmp_path / "no_tok")
    r = _invoke(["--model", str(tmp_path / "no_tok"), "--data", data, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert _one_line(r).startswith(f"error: --model: the folder {tmp_path / 'no_tok'} has no usable tokenizer and no "
                                   "--tokenizer is given (pass --tokenizer qwen3")
    # a tokenizer bigger than the model's vocabulary would index past the embedding
    r = _invoke(["--model", str(tmp_path / "no_tok"), "--tokenizer", "qwen3", "--data", data, "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--tokenizer qwen3 has 151,669 tokens but --model" in _one_line(r)
    assert "vocabulary of 300" in _one_line(r)


def test_algorithm_and_tokenizer_are_option_errors_before_data(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    data = str(_chat_file(tmp_path / "d.jsonl", 3))
    r = _invoke(["--algorithm", "bogus", "--data", data, "--out", str(tmp_path)])
    assert r.exit_code == 2
    line = _one_line(r)
    assert line.startswith("error: --algorithm: unknown packing algorithm 'bogus'; choose one of: ")
    assert "first_fit_shuffle" in line and "balanced_best_fit" in line
    r = _invoke(["--tokenizer", str(tmp_path / "no-tok"), "--data", data, "--out", str(tmp_path)])
    assert r.exit_code == 2 and _one_line(r).startswith("error: --tokenizer:")
    with pytest.raises(ValueError, match="^algorithm: unknown packing algorithm"):
        TrainConfig(algorithm="bogus")
    assert TrainConfig(algorithm=None).algorithm is None  # None = the library default


@pytest.mark.parametrize("argv,message", [
    (["--hidden-size", "9"], "error: --hidden-size 9 is not a multiple of --num-heads 4 (head size = --hidden-size / "
                             "--num-heads). Fix: --hidden-size 8 or 16"),
    (["--hidden-size", "36"], "error: --hidden-size 36 gives an odd head size 9 (rotary embeddings need an even one) "
                              "with --num-heads 4"),
    (["--num-kv-heads", "3"], "error: --num-heads 4 is not a multiple of --num-kv-heads 3"),
    (["--seq-length", "100000000"], "error: --seq-length must be <= 16777216"),
    (["--tolerance", "inf"], "error: --tolerance must be a finite number >= 0"),
    (["--lr", "0"], "error: --lr must be a finite number > 0, got 0.0"),
    (["--lr", "nan"], "error: --lr must be a finite number > 0, got nan"),
])
def test_bad_values_are_option_errors_naming_the_option(argv, message, tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    r = _invoke([*argv, "--out", str(tmp_path)])
    assert r.exit_code == 2 and _one_line(r).startswith(message), r.output
    assert "pad_to_multiple_of" not in r.output  # train has no such option


def _train_help(name):
    import typer

    cmd = typer.main.get_command(_app()).commands["train"]
    return next(p for p in cmd.params if p.name == name)


def test_attn_help_and_checks_agree():
    from seqpack_bench.cli.train import ATTN_HELP
    from seqpack.collate import HF_ATTN

    assert set(ATTN_HELP) == set(HF_ATTN)  # what check_runtime accepts
    help_text = _train_help("attn").help
    assert all(name in help_text for name in HF_ATTN) and "flex_attention (CUDA only" in help_text


def test_empty_out_is_refused(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    monkeypatch.chdir(tmp_path)
    for argv in (["--out", ""], ["--out="], ["--out", "  "]):
        r = _invoke(argv)
        assert r.exit_code == 2 and _one_line(r).startswith("error: --out is empty"), r.output
    assert list(tmp_path.iterdir()) == []


def test_several_data_files_need_repeated_data(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    a, b = _chat_file(tmp_path / "a.jsonl", 2), _chat_file(tmp_path / "b.jsonl", 2)
    r = _invoke(["--data", str(a), str(b), "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert _one_line(r).startswith(f"error: unexpected argument(s) '{b}': seqpack train takes no positional")
    assert "repeat --data for several files (--data a.jsonl --data b.jsonl)" in _one_line(r)
    p = _train_help("data")
    assert "repeat --data for several" in p.help and p.metavar == "FILE|GLOB"


def test_glob_matching_only_folders_says_so(tmp_path):
    (tmp_path / "sub" / "x").mkdir(parents=True)
    (tmp_path / "sub" / "y").mkdir()
    r = _invoke(["--data", str(tmp_path / "sub" / "*"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 1
    line = _one_line(r)
    assert f"the glob '{tmp_path / 'sub' / '*'}' matched only folders ({tmp_path / 'sub' / 'x'}, " in line
    assert f"'{tmp_path / 'sub' / '*'}/*.jsonl'" in line and "matches no file" not in line


def test_cli_train_without_torch_says_how_to_install(tmp_path, monkeypatch):
    import importlib.util

    from seqpack.cli.app import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    r = CliRunner().invoke(app, ["train", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert _one_line(r).startswith("error: seqpack train needs PyTorch, which is not installed. Fix: pip install")
    assert "Traceback" not in r.output and not (tmp_path / "train.json").exists()
