"""export_llamafactory checked by LLaMA-Factory 0.9.5 itself: its tokenized_path loader reads the folder,
its SFTDataCollatorWith4DAttentionMask (neat_packing) builds a 4-D mask equal to seqpack's block-diagonal
mask, and a tiny transformers model fed LLaMA-Factory's batch gives each sample's own logits."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

from _llamafactory import llamafactory_data
from _models import random_samples
from seqpack.interop.llamafactory import export_llamafactory, to_llamafactory_row
from seqpack.packed.build import build_packed_sequence
from seqpack.packed.masks import dense_block_causal_mask
from seqpack.sample import unshift_labels

V, W = 512, 64


@pytest.fixture()
def packs():
    s = random_samples([13, 7, 20, 9, 5, 30], vocab=V, seed=3)
    return [build_packed_sequence(s[:3], pad_to_multiple_of=8, pad_token_id=0, seq_length=W),
            build_packed_sequence(s[3:], pad_to_multiple_of=8, pad_token_id=0, seq_length=W)]


def _collator(lf):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "a": 1}, "<pad>")),
                                  pad_token="<pad>")
    return lf.collator.SFTDataCollatorWith4DAttentionMask(
        template=lf.template.TEMPLATES["qwen3"], tokenizer=tok, processor=None, model=None,
        block_diag_attn=True, neat_packing=True, attn_implementation="eager", compute_dtype=torch.float32,
        label_pad_token_id=-100)


def test_llamafactory_loader_and_collator_read_the_export(packs, tmp_path):
    lf = llamafactory_data()
    from llamafactory.extras.misc import has_tokenized_data

    out = export_llamafactory(packs, tmp_path / "lf", row_length=W)
    assert has_tokenized_data(str(out))
    train = lf.data_utils.get_dataset_module(datasets.load_from_disk(str(out)))["train_dataset"]
    batch = _collator(lf)([dict(r) for r in train])
    assert batch["input_ids"].shape == (2, W) and batch["attention_mask"].shape == (2, 1, W, W)
    for i, p in enumerate(packs):
        T = p.length
        allowed = (batch["attention_mask"][i, 0] == 0).numpy()
        mine = dense_block_causal_mask(torch.as_tensor(p.seq_idx), torch.as_tensor(p.padding_mask)).numpy()
        real = ~p.padding_mask
        np.testing.assert_array_equal(allowed[:T][real][:, :T], mine[real])  # every real query row, exactly
        assert not allowed[:T][real][:, T:].any() and not allowed[T:].any()  # tail: never attended, sees nothing
        np.testing.assert_array_equal(batch["position_ids"][i, :T].numpy(), p.position_ids)
        np.testing.assert_array_equal(batch["labels"][i, :T].numpy(),
                                      unshift_labels(p.labels, np.asarray(p.cu_seqlens_padded)))
        assert (batch["labels"][i, T:] == -100).all()
    assert train[0]["packing_params"]["sequence_boundaries"] == [*packs[0].cu_seqlens_padded.tolist(), W]


def test_tiny_model_on_llamafactory_batch_equals_per_sample(packs, tmp_path):
    lf = llamafactory_data()
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=W)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    out = export_llamafactory(packs, tmp_path / "lf", row_length=W)
    batch = _collator(lf)([dict(r) for r in datasets.load_from_disk(str(out))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
        for i, p in enumerate(packs):
            for a, b in zip(p.cu_seqlens[:-1], p.cu_seqlens[1:]):
                k = int(np.searchsorted(p.cu_seqlens, a))
                start = int(p.cu_seqlens_padded[k])
                alone = model(input_ids=torch.as_tensor(p.input_ids[start:start + b - a])[None]).logits
                torch.testing.assert_close(logits[i, start:start + b - a], alone[0], atol=2e-5, rtol=1e-4)


def test_refusals(packs, tmp_path):
    with pytest.raises(ValueError, match="shorter than the pack"):
        to_llamafactory_row(packs[0], row_length=8)
    from seqpack.sample import Sample

    cut = Sample(np.arange(1, 9), np.arange(2, 10), sample_id="cut")  # a truncated sample keeps its last target
    tight = build_packed_sequence([cut], pad_to_multiple_of=1, pad_token_id=0)
    with pytest.raises(ValueError, match="cannot be stored with unshifted labels"):
        to_llamafactory_row(tight)
    (tmp_path / "x").mkdir()
    with pytest.raises(FileExistsError):
        export_llamafactory(packs, tmp_path / "x")


@pytest.mark.parametrize("exporter", ["llamafactory", "axolotl"])
def test_export_is_atomic_and_checks_the_location_first(packs, tmp_path, monkeypatch, exporter):
    """Both save_to_disk exporters share one write path: a location problem is raised before any row is
    built, a failed write leaves neither the output nor a temp folder, and a killed export's temp folder
    is removed by the next export to that path."""
    from seqpack.interop.axolotl import export_axolotl

    export = export_llamafactory if exporter == "llamafactory" else export_axolotl
    (tmp_path / "file").write_text("x")
    built = []

    def source():
        built.append(1)
        yield from packs

    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        export(source(), tmp_path / "file" / "out")
    assert built == []  # refused before the source was read

    def broken(self, path, *a, **k):
        import pathlib

        pathlib.Path(path).mkdir()
        (pathlib.Path(path) / "partial.arrow").write_bytes(b"x")
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(datasets.Dataset, "save_to_disk", broken)
        with pytest.raises(OSError, match="disk full"):
            export(packs, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]

    dead = tmp_path / ".out.tmp-999999999-deadbeef"  # a killed export's folder (no such pid)
    dead.mkdir()
    out = export(packs, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "out"]
    assert len(datasets.load_from_disk(str(out))) == (2 if exporter == "llamafactory" else 6)
