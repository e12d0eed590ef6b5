"""attention_pattern(config): each layer's attention as transformers decides it, and the masks handed over.

The reference is transformers itself: ``masking_utils.create_masks_for_generate`` (the masks the
``modeling_*.py`` files build, keyed by layer type) on one unpacked sample must equal
:func:`seqpack.adapters.hf_forward.model_attention_inputs` of that sample as a one-segment row.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from seqpack.adapters.attention_pattern import LayerAttention, attention_pattern
from seqpack.adapters.hf_forward import model_attention_inputs, to_hf_inputs
from seqpack.collate import InBatchPackingCollator, PackedCollator
from seqpack.sample import Sample, shift_labels

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)


def _configs():
    import transformers as T

    return {
        "mistral": T.MistralConfig(sliding_window=5, **COMMON),
        "qwen2": T.Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=1, **COMMON),
        "gemma2": T.Gemma2Config(sliding_window=5, head_dim=8, **COMMON),
        "gemma3_text": T.Gemma3TextConfig(sliding_window=5, head_dim=8,
                                          layer_types=["sliding_attention", "full_attention"], **COMMON),
        "cohere2": T.Cohere2Config(sliding_window=5, layer_types=["sliding_attention", "full_attention"], **COMMON),
        "gpt_oss": T.GptOssConfig(head_dim=8, num_local_experts=4, num_experts_per_tok=2, **COMMON),
        "phi3": T.Phi3Config(sliding_window=5, **COMMON),
        "llama4_text": T.Llama4TextConfig(attention_chunk_size=4, head_dim=8, intermediate_size_mlp=64,
                                          num_local_experts=2, no_rope_layers=[1, 0], **COMMON),
        "qwen3": T.Qwen3Config(head_dim=8, **COMMON),
    }


EXPECTED = {
    "mistral": ({"sliding_attention": ("sliding", 5)}, False),
    "qwen2": ({"full_attention": ("full", None), "sliding_attention": ("sliding", 5)}, True),
    "gemma2": ({"sliding_attention": ("sliding", 5), "full_attention": ("full", None)}, True),
    "gemma3_text": ({"sliding_attention": ("sliding", 5), "full_attention": ("full", None)}, True),
    "cohere2": ({"sliding_attention": ("sliding", 5), "full_attention": ("full", None)}, True),
    "gpt_oss": ({"sliding_attention": ("sliding", 128), "full_attention": ("full", None)}, True),  # default window
    "phi3": ({"sliding_attention": ("sliding", 5)}, False),
    "llama4_text": ({"chunked_attention": ("chunked", 4), "full_attention": ("full", None)}, True),
    "qwen3": ({"full_attention": ("full", None)}, True),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_pattern_of_real_configs(name):
    cfg = _configs()[name]
    pat = attention_pattern(cfg)
    masks, keyed = EXPECTED[name]
    assert {k: (v.kind, v.size) for k, v in pat.masks.items()} == masks
    assert pat.keyed is keyed and len(pat.layers) == 2 and pat.model_type == cfg.model_type
    if name == "qwen2":  # layers i >= max_window_layers slide
        assert [lay.kind for lay in pat.layers] == ["full", "sliding"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_masks_equal_transformers_own_on_one_sample(name):
    """One sample longer than the window / chunk: our masks == create_masks_for_generate's, key by key."""
    from transformers.masking_utils import create_masks_for_generate

    cfg = _configs()[name]
    cfg._attn_implementation = "eager"  # materialised masks (no is_causal shortcut)
    L = 11
    theirs = create_masks_for_generate(cfg, torch.zeros(1, L, 8), attention_mask=None, cache=None,
                                       position_ids=torch.arange(L)[None])
    row = {"input_ids": torch.arange(1, L + 1)[None], "cu_seqlens": torch.tensor([0, L]),
           "cu_seqlens_padded": torch.tensor([0, L])}
    ours = model_attention_inputs(row, cfg)["attention_mask"]
    if not isinstance(theirs, dict):
        theirs = {"one": theirs}
    if not isinstance(ours, dict):  # one kind of attention: one 4-D mask serves every layer type
        assert len({(m.kind, m.size) for m in attention_pattern(cfg).masks.values()}) == 1
        ours = {key: ours for key in theirs}
    assert set(ours) == set(theirs)
    for key in theirs:
        assert torch.equal(ours[key] == 0, theirs[key] == 0), key
    windowed = [k for k, v in attention_pattern(cfg).masks.items() if v.kind != "full" and (v.size or 99) < L]
    for key in windowed:  # the window / chunk really cuts this sample
        one = ours[key] if key in ours else next(iter(ours.values()))
        assert int((one[0, 0] == 0).sum()) < L * (L + 1) // 2


def test_keyed_masks_and_none_for_layers_without_attention():
    from transformers import FalconH1Config

    cfg = FalconH1Config(**{**COMMON, "num_hidden_layers": 1})
    pat = attention_pattern(cfg)
    assert {k: v.kind for k, v in pat.masks.items()} == {"full_attention": "full", "linear_attention": "none"}
    # all attention layers share one mask -> one 4-D mask (mamba layers get None from it in transformers)
    row = {"input_ids": torch.ones(1, 6, dtype=torch.long), "cu_seqlens": torch.tensor([0, 4, 6]),
           "cu_seqlens_padded": torch.tensor([0, 4, 6])}
    assert model_attention_inputs(row, cfg, "sdpa")["attention_mask"].shape == (1, 1, 6, 6)
    nem = SimpleNamespace(model_type="toy", num_hidden_layers=3, sliding_window=2,
                          layer_types=["sliding_attention", "full_attention", "mlp"])
    got = model_attention_inputs(row, nem, "sdpa")["attention_mask"]
    assert set(got) == {"sliding_attention", "full_attention", "mlp"} and got["mlp"] is None
    assert got["sliding_attention"][0, 0, 3].nonzero().flatten().tolist() == [2, 3]
    assert got["full_attention"][0, 0, 3].nonzero().flatten().tolist() == [0, 1, 2, 3]


def test_refusals_name_the_model_and_the_reason():
    row = {"input_ids": torch.ones(1, 4, dtype=torch.long), "cu_seqlens": torch.tensor([0, 4]),
           "cu_seqlens_padded": torch.tensor([0, 4])}
    with pytest.raises(ValueError, match="model_type 'toy' has layers of type 'odd_attention'.*padded batches"):
        attention_pattern(SimpleNamespace(model_type="toy", layer_types=["odd_attention"]))
    with pytest.raises(ValueError, match="'sliding_attention' needs config.sliding_window, which is None"):
        attention_pattern(SimpleNamespace(model_type="toy", layer_types=["sliding_attention"], sliding_window=None))
    with pytest.raises(ValueError, match="bidirectional"):
        attention_pattern(SimpleNamespace(model_type="toy", is_causal=False))
    with pytest.raises(ValueError, match="'compressed_sparse_attention': its key/value compressor pools tokens"):
        attention_pattern(SimpleNamespace(model_type="deepseek_v4", sliding_window=4,
                                          layer_types=["compressed_sparse_attention"]))
    with pytest.raises(ValueError, match="needs config=model.config"):
        to_hf_inputs(row, "sdpa")
    with pytest.raises(ValueError, match="attn_implementation='eager' but config._attn_implementation is 'sdpa'"):
        to_hf_inputs(row, "eager", config=SimpleNamespace(_attn_implementation="sdpa", model_type="toy"))
    with pytest.raises(ValueError, match="needs config=model.config"):
        PackedCollator(format="hf", attn_implementation="sdpa")
    with pytest.raises(ValueError, match="odd_attention"):  # refused when the collator is built
        InBatchPackingCollator(pad_token_id=0, format="hf", attn_implementation="sdpa",
                               config=SimpleNamespace(model_type="toy", layer_types=["odd_attention"]))


def test_pattern_without_layer_types():
    # as transformers' modeling files without layer_types: one window for every layer (Qwen3-MoE ignores
    # max_window_layers)
    q = SimpleNamespace(model_type="qwen3_moe", num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                        max_window_layers=1)
    assert attention_pattern(q).layers == (LayerAttention("sliding", 4),) * 3 and not attention_pattern(q).keyed
    off = SimpleNamespace(model_type="qwen3", num_hidden_layers=2, use_sliding_window=False, sliding_window=4)
    assert attention_pattern(off).layers == (LayerAttention("full"),) * 2
    ch = SimpleNamespace(model_type="toy", num_hidden_layers=1, attention_chunk_size=8)
    assert attention_pattern(ch).masks == {"chunked_attention": LayerAttention("chunked", 8)}
    # a composite (vision-language) config is read through its text config
    vl = SimpleNamespace(model_type="vlm", get_text_config=lambda decoder=None: SimpleNamespace(
        model_type="vlm_text", num_hidden_layers=1, sliding_window=3))
    assert attention_pattern(vl).masks == {"sliding_attention": LayerAttention("sliding", 3)}


def test_flash_chunked_gets_none_masks_and_refuses_long_segments():
    cfg = _configs()["llama4_text"]
    ids = np.arange(1, 4)
    s = [Sample(ids, shift_labels(ids, np.ones(3, bool)), sample_id=str(i)) for i in range(3)]
    b = InBatchPackingCollator(pad_token_id=0)(s)  # T = 9 > chunk 4, every segment within one chunk
    kw = model_attention_inputs(b, cfg, "flash_attention_2")
    assert kw["attention_mask"] == {"chunked_attention": None, "full_attention": None}
    assert kw["cu_seq_lens_q"].tolist() == [0, 3, 6, 9]
    long = [Sample(np.arange(1, 7), shift_labels(np.arange(1, 7), np.ones(6, bool)), sample_id="long")]
    with pytest.raises(ValueError, match="cannot restrict attention to chunks of 4 tokens"):
        model_attention_inputs(InBatchPackingCollator(pad_token_id=0)(long), cfg, "flash_attention_2")
