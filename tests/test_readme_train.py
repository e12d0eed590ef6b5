"""The README's "Train with packed batches" snippets, verbatim, run on a tiny random-init Qwen3.

Each snippet gets ``model`` (an HF causal LM as loaded) and ``samples`` (``seqpack.data.Sample`` s,
as returned by ``seqpack.data.prepare``) and must train: finite loss, parameters change.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqpack.data.sample import Sample, shift_labels

HF_TRAINER_SNIPPET = '''
from transformers import Trainer, TrainingArguments
from seqpack.collate import InBatchPackingCollator

collator = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, format="hf",
                                  attn_implementation=model.config._attn_implementation)
args = TrainingArguments("out", per_device_train_batch_size=4, max_steps=2, report_to=[])
result = Trainer(model=model, args=args, train_dataset=samples, data_collator=collator).train()
'''

TORCH_LOOP_SNIPPET = '''
import torch
from torch.utils.data import DataLoader
from seqpack.collate import InBatchPackingCollator
from seqpack.hf import packed_forward

loader = DataLoader(samples, batch_size=4, collate_fn=InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for batch in loader:
    loss = packed_forward(model, batch).loss  # token mean; segments never attend to each other
    loss.backward(); opt.step(); opt.zero_grad()
'''


def _setup():
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    model = AutoModelForCausalLM.from_config(cfg)  # default attn_implementation, default config
    rng = np.random.default_rng(0)
    samples = []
    for i, L in enumerate(rng.integers(5, 40, 8)):
        ids = rng.integers(1, 256, L)
        samples.append(Sample(ids, shift_labels(ids, np.arange(L) >= 2), sample_id=f"s{i}"))
    return model, samples


@pytest.mark.parametrize("snippet", [HF_TRAINER_SNIPPET, TORCH_LOOP_SNIPPET], ids=["hf_trainer", "torch_loop"])
def test_readme_snippet_trains(snippet, tmp_path, monkeypatch):
    assert len(snippet.strip().splitlines()) <= 10
    monkeypatch.chdir(tmp_path)
    model, samples = _setup()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ns = {"model": model, "samples": samples}
    exec(compile(snippet, "README.md", "exec"), ns)
    changed = sum(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert changed >= len(before) - 1
    if "result" in ns:
        assert math.isfinite(ns["result"].training_loss) and ns["result"].global_step == 2
    else:
        assert math.isfinite(ns["loss"].item())
