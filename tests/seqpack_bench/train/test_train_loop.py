"""seqpack_bench.train.run_training (the reference loop) at tiny sizes: every mode on the same samples,
the step plan, the notes it logs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqpack_bench.train import TrainConfig, compact_vocabulary, plan_steps, run_training, synthetic_samples

from _train_helpers import TINY


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

    from seqpack_bench.train import resolve_tokenizer, tiny_config

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


def test_out_dir_is_created_before_training(tmp_path):
    from seqpack_bench.train import CLI_OPTION_NAMES, check_out_dir

    assert check_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    assert check_out_dir(None) is None and check_out_dir("") is None  # nothing is written
    with pytest.raises(ValueError, match=r"^--out is empty \('  '\)"):
        check_out_dir("  ", option_names=CLI_OPTION_NAMES)
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"^out_dir .*f/x: cannot create this folder \(.*f is a file, not a folder\); "
                                         r"pass out_dir with a writable folder"):
        run_training(synthetic_samples(4, vocab_size=50, median=10, max_length=20),
                     TrainConfig(out_dir=str(tmp_path / "f" / "x"), seq_length=64, **TINY))


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


def test_streaming_alone_does_not_train_padded():
    s = synthetic_samples(30, vocab_size=100, seed=5, median=20, max_length=60)
    res = run_training(s, TrainConfig(modes=("streaming",), steps=2, seq_length=64, warmup_steps=0, out_dir=None,
                                      **TINY), log=lambda _m: None)
    assert set(res["modes"]) == {"streaming", "padded_stream"}
    assert res["modes"]["streaming"]["reference"] == "padded_stream"


def test_padded_alone_says_there_is_nothing_to_compare():
    logs = []
    s = synthetic_samples(6, vocab_size=60, seed=3, median=20, max_length=40)
    res = run_training(s, TrainConfig(modes=("padded",), steps=1, seq_length=64, warmup_steps=0, out_dir=None,
                                      **TINY), log=logs.append)
    assert set(res["modes"]) == {"padded"} and res["goals"] == []
    assert any(ln.startswith("note: modes padded alone trains only the baseline (unpacked, padded): no loss-agreement "
                             "check and no speed-up") for ln in logs), logs
