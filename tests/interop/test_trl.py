"""seqpack packs trained by the real ``trl.SFTTrainer`` (TRL 1.16) and ``transformers.Trainer``.

Every test runs the trainer itself for real optimizer steps (a tiny random-init Qwen3 from a config, CPU,
fp32) and compares the first step's logged loss with the per-sample reference: each sample run alone
through an identical copy of the initial model, cross-entropy summed over its trained (assistant) tokens,
divided by the trained-token count of the step.

The chats are tokenized with the real Qwen3 tokenizer; the token ids in use are then renumbered
one-to-one into a small vocabulary (a bijection of the ids: boundaries, positions and which slots are
trained are untouched), so the model's LM head stays tiny. TRL's fused LM head on CPU costs ~20 s per
step over Qwen3's 152k-entry vocabulary.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import numpy as np
import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from seqpack.collate import InBatchPackingCollator, PackedCollator
from seqpack.interop import from_hf_dataset, to_hf_dataset
from seqpack.interop.hf_datasets import TRL_COLUMNS
from seqpack.packed import concat_boundaries
from seqpack.pipeline import sample_data_path

IGN = -100


def _chats(n=10):
    rows = [json.loads(line) for line in sample_data_path().read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if "tools" not in r][:n]


class Vocab:
    """A one-to-one renumbering of the token ids in use into ``1..k`` (``-100`` stays)."""

    def __init__(self, id_arrays):
        used = np.unique(np.concatenate([np.asarray(a, np.int64) for a in id_arrays]))
        self.table = {int(t): i + 1 for i, t in enumerate(used[used >= 0])}
        self.size = len(self.table) + 1

    def __call__(self, ids):
        return np.array([self.table[int(t)] if t >= 0 else int(t) for t in np.asarray(ids)], np.int64)


def _model(vocab_size):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      initializer_range=0.2)  # larger than default: attending across samples shows in the loss
    return AutoModelForCausalLM.from_config(cfg)  # default attn implementation (sdpa)


def _reference(model, samples):
    """Token-mean CE over the trained slots of ``samples`` [(ids, shifted labels)], each run alone."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, lab in samples:
            logits = model(torch.as_tensor(ids[None], dtype=torch.long)).logits[0]
            lab = torch.as_tensor(lab, dtype=torch.long)
            total += torch.nn.functional.cross_entropy(logits, lab, ignore_index=IGN, reduction="sum").item()
            count += int((lab != IGN).sum())
    return total / count, count


def _segments(packs):
    """The packs' samples as (ids, shifted labels), real tokens only (what each pack was built from)."""
    out = []
    for p in packs:
        cu, cup = p.cu_seqlens, p.cu_seqlens_padded
        for s in range(len(cu) - 1):
            a, n = int(cup[s]), int(cu[s + 1] - cu[s])
            out.append((np.asarray(p.input_ids[a:a + n]), np.asarray(p.labels[a:a + n])))
    return out


@pytest.fixture(scope="module")
def offline(tmp_path_factory, qwen3_tokenizer):
    """Offline packs of 10 demo chats (``pack_dataset`` -> ``load_packed``), ids renumbered."""
    from seqpack import load_packed, pack_dataset

    d = tmp_path_factory.mktemp("trl")
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _chats()), encoding="utf-8")
    pack_dataset([d / "chat.jsonl"], d / "packed", tokenizer=qwen3_tokenizer, seq_length=256, pad_to_multiple_of=8)
    ds = load_packed(d / "packed", expect={"capacity": 256})
    real = [ds[i] for i in range(len(ds))]
    vocab = Vocab([p.input_ids for p in real])
    packs = [dataclasses.replace(p, input_ids=vocab(p.input_ids), labels=vocab(p.labels)) for p in real]
    assert len(packs) >= 3 and sum(p.num_segments for p in packs) == 10
    assert any(np.diff(p.cu_seqlens_padded)[:-1].tolist() != np.diff(p.cu_seqlens)[:-1].tolist() for p in packs)
    trained = sum(int((p.labels != IGN).sum()) for p in packs)
    assert 0 < trained < sum(int(p.cu_seqlens[-1]) for p in packs)  # assistant tokens only
    return packs, vocab.size


def _args(tmp_path, **kw):
    from trl import SFTConfig

    base = {"max_steps": 2, "logging_steps": 1, "report_to": [], "save_strategy": "no", "bf16": False,
            "use_cpu": True, "learning_rate": 1e-3, "seed": 0, "train_sampling_strategy": "sequential"}
    return SFTConfig(str(tmp_path / "out"), **{**base, **kw})


def _record_forward_kwargs(model):
    seen: list[dict] = []
    model.register_forward_pre_hook(lambda mod, a, kw: seen.append(dict(kw)), with_kwargs=True)
    return seen


def _train(trainer_cls, model, **kw):
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = trainer_cls(model=model, **kw)
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert result.global_step == trainer.args.max_steps and all(math.isfinite(x) for x in losses)
    moved = sum(not torch.equal(start[n], p) for n, p in model.named_parameters())
    assert moved >= len(start) - 1
    return losses


def _flat_physical(packs):
    """Position ids and physical boundaries of the packs laid end to end (one padding-free row)."""
    pos = np.concatenate([p.position_ids for p in packs])
    _, cup = concat_boundaries([(p.cu_seqlens, p.cu_seqlens_padded) for p in packs])
    return pos, cup


# ------------------------------------------------------------------------ TRL, offline packs


def test_sft_trainer_padding_free_on_offline_packs(offline, qwen3_tokenizer, tmp_path):
    """The README recipe: ``to_hf_dataset`` + TRL's own padding-free collator. The batch TRL builds from
    the columns it reads (``input_ids``, ``labels``, ``seq_lengths``) has the packs' own positions,
    physical boundaries and unshifted labels, and the first step's loss is the per-sample reference."""
    from trl import SFTTrainer

    packs, vocab_size = offline
    train = to_hf_dataset(packs)
    assert set(TRL_COLUMNS) <= set(train.column_names)
    model = _model(vocab_size)
    ref, n = _reference(copy.deepcopy(model), _segments(packs))
    seen = _record_forward_kwargs(model)
    args = _args(tmp_path, padding_free=True, max_length=None, per_device_train_batch_size=len(packs),
                 dataset_kwargs={"skip_prepare_dataset": True})
    losses = _train(SFTTrainer, model, args=args, train_dataset=train, processing_class=qwen3_tokenizer)
    assert losses[0] == pytest.approx(ref, rel=1e-5), (losses, ref)
    kw = seen[0]
    pos, cup = _flat_physical(packs)
    assert "attention_mask" not in kw  # padding-free: the boundaries are all the model gets
    assert kw["position_ids"][0].tolist() == pos.tolist()
    assert kw["cu_seq_lens_q"].tolist() == cup.tolist()
    assert kw["labels"][0].tolist() == np.concatenate([p.hf_unshifted_labels() for p in packs]).tolist()
    assert int((kw["labels"] != IGN).sum()) == n


def test_sft_trainer_reads_seq_lengths_by_name(offline, qwen3_tokenizer, tmp_path):
    """The column TRL reads is the one written: under another name TRL trains without an error on one
    sequence per row (the hazard the export's ``seq_lengths`` prevents), and the loss leaves the reference."""
    from trl import SFTTrainer

    packs, vocab_size = offline
    train = to_hf_dataset(packs).rename_column("seq_lengths", "seq_lens")
    model = _model(vocab_size)
    ref, _ = _reference(copy.deepcopy(model), _segments(packs))
    seen = _record_forward_kwargs(model)
    args = _args(tmp_path, padding_free=True, max_length=None, per_device_train_batch_size=len(packs),
                 dataset_kwargs={"skip_prepare_dataset": True}, max_steps=1)
    losses = _train(SFTTrainer, model, args=args, train_dataset=train, processing_class=qwen3_tokenizer)
    assert abs(losses[0] - ref) > 1e-3 * ref, (losses, ref)  # exact runs match to ~1e-7
    widths = np.cumsum([0] + [p.length for p in packs]).tolist()
    assert seen[0]["cu_seq_lens_q"].tolist() == widths  # one sequence per row


def test_sft_trainer_with_packed_collator_on_offline_packs(offline, qwen3_tokenizer, tmp_path):
    """``SFTTrainer`` + ``PackedCollator(format="hf")`` over the export (``skip_prepare_dataset``,
    ``remove_unused_columns=False``): the collator reads the boundary columns and ``shift_labels``; the
    first step's loss is the per-sample reference. With the trainer's default column removal the
    boundaries never reach the collator, which refuses the row instead of reading one sequence."""
    from trl import SFTTrainer

    packs, vocab_size = offline
    train = to_hf_dataset(packs)
    model = _model(vocab_size)
    coll = PackedCollator(format="hf", config=model.config)
    args = _args(tmp_path, per_device_train_batch_size=2, remove_unused_columns=False,
                 dataset_kwargs={"skip_prepare_dataset": True})
    start = copy.deepcopy(model)
    losses = _train(SFTTrainer, model, args=args, train_dataset=train, processing_class=qwen3_tokenizer,
                    data_collator=coll)
    ref, _ = _reference(start, _segments(packs[:2]))  # sequential sampler: the first step holds packs 0, 1
    assert losses[0] == pytest.approx(ref, rel=1e-5), (losses, ref)

    args = _args(tmp_path, per_device_train_batch_size=2, dataset_kwargs={"skip_prepare_dataset": True})
    trainer = SFTTrainer(model=_model(vocab_size), args=args, train_dataset=train, processing_class=qwen3_tokenizer,
                         data_collator=coll)
    with pytest.raises(KeyError, match="no cu_seqlens.*remove_unused_columns=False"):
        trainer.train()


# ------------------------------------------------------------------------ TRL, in-batch packing


def test_sft_trainer_in_batch_packing_assistant_only(tmp_path, qwen3_tokenizer):
    """TRL prepares the data (labels from ``assistant_masks`` that the tokenizer computes with TRL's Qwen3
    training template, its assistant-only loss for tokenized data); seqpack's ``InBatchPackingCollator``
    packs each micro-batch into one row. The first step's loss is the per-sample reference over TRL's own
    labels."""
    from pathlib import Path

    import datasets
    import trl
    from trl import SFTTrainer

    tok = copy.copy(qwen3_tokenizer)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja").read_text()
    enc = [tok.apply_chat_template(c["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
           for c in _chats(8)]
    vocab = Vocab([e["input_ids"] for e in enc])
    rows = [{"input_ids": vocab(e["input_ids"]).tolist(), "assistant_masks": list(e["assistant_masks"])} for e in enc]
    assert all(0 < sum(r["assistant_masks"]) < len(r["input_ids"]) for r in rows)
    model = _model(vocab.size)
    start = copy.deepcopy(model)
    coll = InBatchPackingCollator(pad_token_id=0, pad_to_multiple_of=8, format="hf", label_convention="hf",
                                  config=model.config)
    seen = _record_forward_kwargs(model)
    args = _args(tmp_path, per_device_train_batch_size=4)
    trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tok, data_collator=coll)
    prepared = trainer.train_dataset  # TRL's labels: input_ids where assistant_masks, else -100
    for r, p in zip(rows, prepared):
        assert p["labels"] == [t if m else IGN for t, m in zip(r["input_ids"], r["assistant_masks"])]
    start_params = {n: q.detach().clone() for n, q in model.named_parameters()}
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert result.global_step == 2 and sum(not torch.equal(start_params[n], q)
                                           for n, q in model.named_parameters()) >= len(start_params) - 1
    first = [prepared[i] for i in range(4)]  # sequential sampler
    samples = [(np.asarray(p["input_ids"]), np.append(np.asarray(p["labels"])[1:], IGN)) for p in first]
    ref, n = _reference(start, samples)
    assert losses[0] == pytest.approx(ref, rel=1e-5), (losses, ref)
    kw = seen[0]
    assert kw["attention_mask"].dim() == 4 and kw["input_ids"].shape[0] == 1  # one packed row, 4-D mask
    assert int((kw["shift_labels"] != IGN).sum()) == n


# ------------------------------------------------------------------------ HF Trainer, offline packs


def test_hf_trainer_with_packed_collator_on_offline_packs(offline, tmp_path):
    """The README's HF Trainer recipe: ``Trainer`` over the packs (a ``PackedDataset`` or a list of
    ``PackedSequence``) with ``PackedCollator(format="hf")``; the default column removal leaves
    ``PackedSequence`` features alone. First step's loss = the per-sample reference."""
    from transformers import Trainer, TrainingArguments

    packs, vocab_size = offline
    model = _model(vocab_size)
    ref, _ = _reference(copy.deepcopy(model), _segments(packs[:2]))
    coll = PackedCollator(format="hf", config=model.config)
    args = TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, learning_rate=1e-3, seed=0,
                             train_sampling_strategy="sequential")
    losses = _train(Trainer, model, args=args, train_dataset=packs, data_collator=coll)
    assert losses[0] == pytest.approx(ref, rel=1e-5), (losses, ref)
    # the export read back gives the same rows (the HF-datasets route to the same batches)
    back = from_hf_dataset(to_hf_dataset(packs))
    for a, b in zip(back, packs):
        assert np.array_equal(a.labels, b.labels) and np.array_equal(a.cu_seqlens, b.cu_seqlens)
