"""seqpack.interop.torchtune.packed_dataset run by the real torchtune 0.6.1: built from a YAML config
with ``torchtune.config.instantiate``, collated by ``padded_collate_packed``, fed to a tiny torchtune
Llama-3 model whose packed logits equal its per-sample logits."""

from __future__ import annotations

import numpy as np
import pytest

torchtune = pytest.importorskip("torchtune", reason="torchtune not installed (.ci/run installs torchtune==0.6.1)")
torch = pytest.importorskip("torch")
from omegaconf import OmegaConf
from torchtune import config as tt_config
from torchtune.data import padded_collate_packed

from seqpack.packed.masks import dense_block_causal_mask
from seqpack.pipeline import pack_dataset

SEQ = 192


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory):
    from seqpack.pipeline.job import sample_data_path

    tmp = tmp_path_factory.mktemp("tt")
    src = tmp / "chat.jsonl"
    src.write_text("".join(sample_data_path().read_text().splitlines(keepends=True)[:16]))
    out = tmp / "packed"
    pack_dataset(src, out, seq_length=SEQ, overlength="drop")  # Qwen3 tokenizer (embedded)
    return out


def _cfg(packed_dir, **extra):
    body = "\n".join(f"  {k}: {v}" for k, v in extra.items())
    return OmegaConf.create(
        f"dataset:\n  _component_: seqpack.interop.torchtune.packed_dataset\n  source: {packed_dir}\n{body}\n"
    )


def test_config_instantiate_collate_and_masks(packed_dir):
    from seqpack.io import load_packed

    cfg = _cfg(packed_dir, packed=True)
    ds = tt_config.instantiate(cfg.dataset, object())  # recipes pass their tokenizer positionally
    seq = load_packed(packed_dir)
    assert len(ds) == len(seq) > 1 and cfg.dataset.get("packed") is True
    batch = padded_collate_packed([ds[i] for i in range(len(ds))])
    assert batch["tokens"].shape == (len(ds), SEQ) and batch["tokens"].dtype == torch.long
    for i, pack in enumerate(seq):
        T = pack.length
        np.testing.assert_array_equal(batch["tokens"][i, :T].numpy(), pack.input_ids)
        assert (batch["tokens"][i, T:] == seq.metadata.pad_token_id).all()
        # the recipes' whole-row shift (labels[1:] + one ignore) gives seqpack's per-segment labels
        shifted = torch.cat([batch["labels"][i, 1:], torch.tensor([-100])])
        np.testing.assert_array_equal(shifted[:T].numpy(), pack.labels)
        assert (shifted[T:] == -100).all()
        np.testing.assert_array_equal(batch["input_pos"][i, :T].numpy(), pack.position_ids)
        # torchtune's block-causal mask == seqpack's on the real slots; the tail sees only itself
        mine = dense_block_causal_mask(torch.as_tensor(pack.seq_idx)).numpy()
        np.testing.assert_array_equal(batch["mask"][i, :T, :T].numpy(), mine.reshape(T, T))
        assert not batch["mask"][i, T:, :T].any() and not batch["mask"][i, :T, T:].any()


def test_refuses_unpacked_config_and_short_rows(packed_dir):
    with pytest.raises(ValueError, match="set `packed: True`"):
        tt_config.instantiate(_cfg(packed_dir, packed=False).dataset, None)
    with pytest.raises(ValueError, match=f"smaller than the packed data's seq_length={SEQ}"):
        tt_config.instantiate(_cfg(packed_dir, max_seq_len=SEQ // 2).dataset, None)


def test_torchtune_model_packed_equals_per_sample(packed_dir):
    from torchtune.models.llama3 import llama3

    torch.manual_seed(0)
    V = 997  # token ids are folded into a tiny vocabulary, the same on both sides
    model = llama3(vocab_size=V, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=SEQ).eval()
    ds = tt_config.instantiate(_cfg(packed_dir, packed=True).dataset, None)
    b = padded_collate_packed([ds[0]])
    tokens = b["tokens"] % V
    with torch.no_grad():
        packed = model(tokens, mask=b["mask"], input_pos=b["input_pos"])
        start = 0
        lens = ds[0]["seq_lens"].tolist()
        assert len(lens) >= 2
        for n in lens:
            alone = model(tokens[:, start:start + n])
            torch.testing.assert_close(packed[:, start:start + n], alone, atol=2e-5, rtol=1e-4)
            start += n


def test_recipe_tokenizer_checked_against_the_data(packed_dir, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from torchtune.modules.transforms.tokenizers import HuggingFaceBaseTokenizer

    from seqpack.data import load_tokenizer

    load_tokenizer("qwen3").save_pretrained(tmp_path / "qwen3")
    (tmp_path / "gen.json").write_text('{"bos_token_id": 151643, "eos_token_id": 151645}')  # Qwen3's
    same = HuggingFaceBaseTokenizer(str(tmp_path / "qwen3" / "tokenizer.json"),
                                    generation_config_path=str(tmp_path / "gen.json"))
    assert len(tt_config.instantiate(_cfg(packed_dir).dataset, same)) > 1
    other = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1}, "<unk>"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    other.save(str(tmp_path / "other.json"))
    wrong = HuggingFaceBaseTokenizer(str(tmp_path / "other.json"), generation_config_path=str(tmp_path / "gen.json"))
    with pytest.raises(ValueError, match="encodes a probe text as .* the data's tokenizer 'qwen3'"):
        tt_config.instantiate(_cfg(packed_dir).dataset, wrong)
    assert len(tt_config.instantiate(_cfg(packed_dir, check_tokenizer=False).dataset, wrong)) > 1
