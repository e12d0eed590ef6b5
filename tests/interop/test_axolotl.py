"""export_axolotl run through Axolotl 0.19's own data path (installed --no-deps by .ci/run): its
pre-tokenized check keeps the dataset as is, its sample-packing preprocessing, multipack sampler and
V2 collator build the batch, and a tiny transformers model on that batch (attention mask dropped, as
Axolotl does for sample packing) gives each sample's own logits; labels are seqpack's, unshifted."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")
os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")
pytest.importorskip("axolotl", reason="axolotl not installed (.ci/run installs axolotl==0.19.0 --no-deps)")
from axolotl.utils.collators.batching import V2BatchSamplerDataCollatorForSeq2Seq
from axolotl.utils.data.wrappers import _is_dataset_already_tokenized, get_dataset_wrapper
from axolotl.utils.dict import DictDefault
from axolotl.utils.samplers.multipack import MultipackBatchSampler
from axolotl.utils.trainer import process_datasets_for_packing

from _models import random_samples
from seqpack.interop.axolotl import axolotl_rows, export_axolotl
from seqpack.packed.build import build_packed_sequence
from seqpack.sample import Sample, unshift_labels


@pytest.fixture(autouse=True)
def _keep_os_environ():
    """datasets' ``Dataset.map(num_proc=...)`` (Axolotl's packing step calls it) rebinds ``os.environ`` to a
    copy, after which libraries holding the original object (rich's consoles) stop seeing environment changes;
    put the original object back."""
    original = os.environ
    yield
    if os.environ is not original:
        original.clear()
        original.update(os.environ)
        os.environ = original

V, W = 512, 64


@pytest.fixture()
def packs():
    s = random_samples([13, 7, 20, 9, 5, 30], vocab=V, seed=4)
    for x in s[::2]:  # prompt tokens untrained, as assistant-only labels leave them
        x.labels[:3] = -100
    return [build_packed_sequence(s[:3], pad_to_multiple_of=8, pad_token_id=0, seq_length=W),
            build_packed_sequence(s[3:], pad_to_multiple_of=8, pad_token_id=0, seq_length=W)], s


def _tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "a": 1}, "<pad>")),
                                   pad_token="<pad>")


def test_axolotl_data_path_packs_the_export_exactly(packs, tmp_path):
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, Qwen3Config

    packs, samples = packs
    ds = datasets.load_from_disk(str(export_axolotl(packs, tmp_path / "axo")))
    assert _is_dataset_already_tokenized(ds) and len(ds) == len(samples)
    kept, _ = get_dataset_wrapper(DictDefault({"path": str(tmp_path / "axo")}), _tokenizer(), DictDefault({}), None, ds)
    assert kept is ds  # used as is: no prompt strategy
    for row, s in zip(ds, samples):
        assert row["input_ids"] == s.input_ids.tolist()
        assert row["labels"] == unshift_labels(s.labels, np.array([0, s.length])).tolist()
    cfg = DictDefault({"sample_packing": True, "dataset_num_proc": 1, "is_preprocess": False})
    train, _ = process_datasets_for_packing(cfg, ds, None)
    sampler = MultipackBatchSampler(SequentialSampler(train), batch_size=1, batch_max_len=W,
                                    lengths=np.array(train["length"]), bin_size=200, sequential=True)
    collate = V2BatchSamplerDataCollatorForSeq2Seq(tokenizer=_tokenizer(), padding=True, return_tensors="pt")
    from axolotl.loaders.utils import check_model_config

    mcfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=W)
    check_model_config(DictDefault({}), mcfg)  # Axolotl turns the KV cache off for training: use_cache=False
    assert mcfg.use_cache is False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mcfg).eval()
    seen = 0
    for batch_idx in sampler:
        feats = [[{k: v for k, v in train[i].items() if k != "length"} for i in b] for b in batch_idx]
        batch = collate(feats)
        batch.pop("attention_mask")  # Axolotl's sample_packing_drop_attention_mask
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            start = 0
            for i in batch_idx[0]:
                n = len(train[i]["input_ids"])
                alone = model(input_ids=torch.tensor([train[i]["input_ids"]])).logits
                torch.testing.assert_close(logits[0, start:start + n], alone[0], atol=2e-5, rtol=1e-4)
                assert batch["labels"][0, start:start + n].tolist() == train[i]["labels"]
                start += n
                seen += 1
        assert len(batch_idx[0]) >= 2 or seen == len(samples)
    assert seen == len(samples)


def test_truncated_sample_final_target_is_refused():
    cut = Sample(np.arange(1, 9), np.arange(2, 10), sample_id="cut")  # a truncated sample keeps its last target
    pack = build_packed_sequence([cut], pad_to_multiple_of=8, pad_token_id=0)
    with pytest.raises(ValueError, match="sample 'cut'.*cannot be stored with unshifted labels"):
        list(axolotl_rows([pack]))
    assert list(axolotl_rows([pack], final_target="drop"))[0]["labels"][-1] == 8
