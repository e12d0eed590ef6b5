"""seqpack_bench.train.config and checks: TrainConfig bounds, machine checks, one-line messages."""

from __future__ import annotations

import sys

import pytest

from seqpack_bench.train import TrainConfig, run_training, synthetic_samples

from _train_helpers import TINY


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


def test_flash_attention_without_flash_attn_names_attn(monkeypatch):
    # a CUDA machine without flash-attn (faked: the check runs before any CUDA call)
    import torch

    from seqpack_bench.train import CLI_OPTION_NAMES, check_runtime

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn -> ImportError
    cfg = TrainConfig(device="cuda", attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match=r"^--attn flash_attention_2 needs the flash_attn package.*Fix: --attn sdpa"):
        check_runtime(cfg, option_names=CLI_OPTION_NAMES)
    with pytest.raises(ValueError, match=r"^--device: 'cuda:1' but only 1 CUDA device"):
        check_runtime(TrainConfig(device="cuda:1"), option_names=CLI_OPTION_NAMES)


def test_one_line_collapses_library_line_breaks():
    from seqpack_bench.train import one_line

    msg = "could not load: Couldn't instantiate from one of: \n(1) a file, \n(2) a slow one.. Fix: x"
    assert one_line(ValueError(msg)) == "could not load: Couldn't instantiate from one of: (1) a file, (2) a slow one. Fix: x"
    assert one_line("wait... ok") == "wait... ok"


def test_shape_and_bounds_in_train_config():
    from seqpack.algorithms.core import MAX_CAPACITY_UNITS
    from seqpack_bench.train import MAX_SEQ_LENGTH

    assert MAX_SEQ_LENGTH == MAX_CAPACITY_UNITS  # the step plan packs at pad_to_multiple_of=1
    TrainConfig(seq_length=MAX_SEQ_LENGTH)
    with pytest.raises(ValueError, match=r"^seq_length must be <= 16777216"):
        TrainConfig(seq_length=MAX_SEQ_LENGTH + 1)
    with pytest.raises(ValueError, match=r"^loss_tolerance must be a finite number"):
        TrainConfig(loss_tolerance=float("inf"))
    with pytest.raises(ValueError, match=r"^hidden_size 30 is not a multiple of num_heads 4"):
        TrainConfig(hidden_size=30)
    TrainConfig(model="/some/folder", hidden_size=30)  # a local model brings its own shape: not checked
