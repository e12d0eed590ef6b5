"""seqpack's Energon mixin on a real Energon dataset: webdataset shards prepared by ``energon prepare``
(non-interactive), read by Energon's ``get_train_dataset`` + ``get_savable_loader``, with the loader
state saved mid-epoch and restored into a fresh loader."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest

energon = pytest.importorskip("megatron.energon")
wds = pytest.importorskip("webdataset")

from click.testing import CliRunner
from megatron.energon import (
    Cooker,
    DefaultTaskEncoder,
    WorkerConfig,
    basic_sample_keys,
    get_savable_loader,
    get_train_dataset,
    stateless,
)
from megatron.energon.errors import FatalSampleError
from megatron.energon.tools.prepare import command as energon_prepare

from seqpack.interop.energon import ENERGON_KEYS, SeqpackPack, SeqpackPackingMixin
from seqpack.packed import PackedSequence
from seqpack.sample import IGNORE_INDEX

N_SAMPLES, SEQ, PAD, MULT = 60, 64, 0, 4
ROW_FIELDS = ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded", "position_ids", "loss_mask")


def _token_ids() -> dict[str, list[int]]:
    """Sample name -> token ids: a unique first token, then 1..40 random ids (the longest fit SEQ)."""
    rng = np.random.default_rng(0)
    return {f"{i:04d}": [1000 + i] + rng.integers(1, 999, int(rng.integers(1, 41))).tolist()
            for i in range(N_SAMPLES)}


def _prepare(root, ids: dict[str, list[int]], sample_type: list[str]):
    """Three webdataset shards (``txt``: ids as text, ``json``: {"input_ids": ...}), then ``energon prepare``."""
    (root / "parts").mkdir(parents=True)
    with wds.ShardWriter(str(root / "parts" / "data-%d.tar"), maxcount=20, verbose=0) as w:
        for key, toks in ids.items():
            w.write({"__key__": key, "txt": " ".join(map(str, toks)).encode(),
                     "json": json.dumps({"input_ids": toks}).encode()})
    res = CliRunner().invoke(energon_prepare, [str(root), "--non-interactive", "--split-ratio", "1,0,0",
                                               "--no-progress", "--num-workers", "1", *sample_type])
    assert res.exit_code == 0, res.output
    return root


@pytest.fixture(scope="module")
def ids():
    return _token_ids()


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory, ids):
    return _prepare(tmp_path_factory.mktemp("energon_text"), ids,
                    ["--sample-type", "TextSample", "--field-map", '{"text": "txt"}'])


@pytest.fixture(scope="module")
def crude_dataset(tmp_path_factory, ids):
    return _prepare(tmp_path_factory.mktemp("energon_crude"), ids, ["--sample-type", "CrudeWebdataset"])


class TextEncoder(SeqpackPackingMixin, DefaultTaskEncoder):
    """The README's shape: the user's encode_sample tokenizes (here: the ids written as text)."""

    seq_length, pad_token_id, pad_to_multiple_of = SEQ, PAD, MULT

    @stateless
    def encode_sample(self, sample):
        return self.seqpack_sample(sample, [int(t) for t in sample.text.split()])


@stateless
def cook_ids(crude: dict) -> dict:
    """Crude webdataset sample -> a dict carrying ``input_ids`` (and Energon's keys)."""
    return {**basic_sample_keys(crude), "input_ids": crude["json"]["input_ids"]}


class CrudeEncoder(SeqpackPackingMixin, DefaultTaskEncoder):
    """Token ids already in the sample: the mixin's own encode_sample."""

    seq_length, pad_token_id, pad_to_multiple_of = SEQ, PAD, MULT
    cookers = (Cooker(cook_ids),)


def _loader(path, encoder, workers: int, state=None, **kw):
    ds = get_train_dataset(
        path, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=2,
        shuffle_buffer_size=8, max_samples_per_sequence=5, packing_buffer_size=16, task_encoder=encoder,
        repeat=False, **kw,
    )
    loader = get_savable_loader(ds, watchdog_timeout_seconds=None)
    if state is not None:
        loader.restore_state_rank(state)
    return loader


def _rows(batch) -> dict:
    return {k: batch[k].numpy().copy() for k in ROW_FIELDS} | {
        "sample_ids": list(batch["sample_ids"]), "__key__": list(batch["__key__"])}


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x["sample_ids"] == y["sample_ids"] and x["__key__"] == y["__key__"]
        for k in ROW_FIELDS:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def _check_batch(batch: dict, ids: dict[str, list[int]]) -> list[str]:
    """``batch`` (as :func:`_rows` keeps it): the THD row and each pack in it are valid, every segment
    holds its source sample's tokens; returns the segments' names."""
    names = list(batch["sample_ids"])  # the raw samples' __key__
    tokens, labels, cu, cup = (batch[k] for k in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded"))
    tokens, labels = tokens[0], labels[0]
    PackedSequence.from_boundaries(tokens, labels, cu, cup, names).validate()
    first = 0
    for key in batch["__key__"]:  # each pack of the micro-batch is a valid row of at most SEQ slots
        last = first + len(key.split(","))
        sl = slice(int(cup[first]), int(cup[last]))
        PackedSequence.from_boundaries(tokens[sl], labels[sl], cu[first: last + 1] - cu[first],
                                       cup[first: last + 1] - cup[first], names[first:last]).validate(capacity=SEQ)
        first = last
    assert first == len(names)
    for s, name in enumerate(names):
        seg = tokens[cup[s]: cup[s] + cu[s + 1] - cu[s]].tolist()
        assert seg == ids[name]
        # no labels in the data: every next token of the segment is trained, never across segments
        assert labels[cup[s]: cup[s] + len(seg)].tolist() == ids[name][1:] + [IGNORE_INDEX]
    # the batch's __key__ lists its packs, each the joined keys of its segments, in segment order
    assert ",".join(batch["__key__"]) == ",".join(names)
    return names


# the worker path does not depend on the encoder: one DataLoader worker with the text encoder only
@pytest.mark.parametrize("encoder,workers", [(TextEncoder, 0), (TextEncoder, 1), (CrudeEncoder, 0)])
def test_save_restore_gives_identical_remaining_batches(text_dataset, crude_dataset, ids, encoder, workers):
    path = text_dataset if encoder is TextEncoder else crude_dataset
    loader = _loader(path, encoder(), workers)
    it = iter(loader)
    head = [_rows(next(it)) for _ in range(3)]
    state = loader.save_state_rank()
    rest = [_rows(b) for b in it]  # the rest of the epoch (repeat=False)

    restored = [_rows(b) for b in _loader(path, encoder(), workers, state=state)]
    _assert_same(rest, restored)

    # every sample packed exactly once in the epoch, each row valid, tokens those of its source sample
    names = Counter(n for b in head + rest for n in _check_batch(b, ids))
    assert names == Counter(list(ids))
    # two packs of at most SEQ slots per batch (the last batch of the epoch may hold one)
    assert all(len(b["__key__"]) == 2 for b in head + rest[:-1]) and len(rest[-1]["__key__"]) in (1, 2)
    assert all(int(b["cu_seqlens_padded"][-1]) <= 2 * SEQ for b in head + rest)


def test_packs_and_batches_carry_restore_keys(text_dataset, ids):
    loader = _loader(text_dataset, TextEncoder(), 0)
    batch = next(iter(loader))
    # Energon's own restore: the batch rebuilt from its restore key alone, by the same stateless hooks
    again = loader.restore_sample(batch["__restore_key__"])
    _assert_same([_rows(batch)], [_rows(again)])
    key = batch["__restore_key__"]
    assert key[0] == "SimpleSavableDatasetWrapper" and "BatchDataset" in key and set(ENERGON_KEYS) <= set(batch)
    # a pack of two samples: joined keys, the primary's subflavors, the row of both samples in order
    enc = TextEncoder()
    raw = [{"__key__": k, "__restore_key__": ("X", i), "__subflavors__": {"src": "a"}}
           for i, k in enumerate(["0000", "0001"])]
    pack = enc.pack_selected_samples([enc.seqpack_sample(r, ids[r["__key__"]]) for r in raw])
    assert isinstance(pack, SeqpackPack) and pack.__key__ == "0000,0001" and pack.__subflavors__ == {"src": "a"}
    pack.packed.validate(capacity=SEQ)
    assert pack.packed.sample_ids == ["0000", "0001"]
    assert pack.packed.input_ids[pack.packed.real_token_indices()].tolist() == ids["0000"] + ids["0001"]


def test_overlength_drop_accounts_for_every_sample(text_dataset, ids, caplog):
    class Drop(TextEncoder):
        seq_length, overlength = 16, "drop"

    with caplog.at_level("WARNING", logger="seqpack.stream"):
        packed = [n for b in _loader(text_dataset, Drop(), 0) for n in b["sample_ids"]]
    dropped = sum(int(re.search(r"dropped (\d+) over-length", r.getMessage()).group(1)) for r in caplog.records)
    fits = [k for k, v in ids.items() if -(-len(v) // MULT) * MULT <= 16]
    assert sorted(packed) == sorted(fits) and dropped == len(ids) - len(fits) > 0


def test_over_length_sample_is_refused_at_the_first_buffer(text_dataset):
    class Short(TextEncoder):
        seq_length = 16

    with pytest.raises(FatalSampleError) as exc:
        next(iter(_loader(text_dataset, Short(), 0)))
    chain, e = [], exc.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    # the refusal names the sample (its Energon __key__), its length, the capacity and the fix
    assert any(re.search(r"sample_id '\d{4}'\) has length \d+ \(padded \d+\), which does not fit capacity 16", m)
               and "overlength='drop'" in m for m in chain), chain


def test_sample_without_token_ids_is_refused(text_dataset):
    class NoIds(SeqpackPackingMixin, DefaultTaskEncoder):
        seq_length, pad_token_id = SEQ, PAD

    with pytest.raises(FatalSampleError) as exc:
        next(iter(_loader(text_dataset, NoIds(), 0)))
    assert "has no input_ids; override encode_sample" in str(exc.value.__context__)


def test_energon_batch_runs_a_real_model_per_sample_exactly(text_dataset, ids):
    """The batch as Energon yields it (Energon keys included) goes to seqpack.hf.packed_forward; every
    segment's logits equal the sample's own forward through the model as loaded."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from seqpack.hf import packed_forward

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=1100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = transformers.AutoModelForCausalLM.from_config(cfg).train()
    batch = next(iter(_loader(text_dataset, TextEncoder(), 0)))
    cu, cup = batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()
    assert len(batch["sample_ids"]) >= 3
    with torch.no_grad():
        out = packed_forward(model, batch)
        for s, name in enumerate(batch["sample_ids"]):
            alone = model(torch.tensor([ids[name]])).logits[0]
            n = cu[s + 1] - cu[s]
            torch.testing.assert_close(out.logits[0, cup[s]: cup[s] + n], alone, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(out.loss)


def test_label_conventions_and_output_formats():
    class HfLabels(TextEncoder):
        label_convention, collate_format = "hf", "hf"
        model_config = __import__("transformers").Qwen3Config(attn_implementation="sdpa")

    enc = HfLabels()
    # unshifted HF labels [-100, 6, 7] on ids [5, 6, 7] -> shifted [6, 7, -100]
    s = enc.seqpack_sample({"__key__": "k", "__restore_key__": ("X", 0)}, [5, 6, 7], [IGNORE_INDEX, 6, 7])
    assert s.sample.labels.tolist() == [6, 7, IGNORE_INDEX] and s.__restore_key__ == ("X", 0)
    assert s.sample_id == "k"
    batch = enc.batch([enc.pack_selected_samples([s])])
    assert set(ENERGON_KEYS) <= set(batch) and batch["__key__"] == ["k"]
    assert batch["attention_mask"].dim() == 4 and batch["position_ids"].tolist() == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="label_convention must be 'shifted' or 'hf'"):
        type("Bad", (TextEncoder,), {"label_convention": "unshifted"})().seqpack_sample({"__key__": "k"}, [1, 2])
