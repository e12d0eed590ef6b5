"""The family registry and seqpack.adapters.architecture agree for every family that names transformers
model types, and validation refuses with the check's reason."""

from __future__ import annotations

import pytest

from seqpack.adapters.architecture import model_type_problem
from seqpack.config import PackingConfig
from seqpack.config.registry import list_families, load_registry

NAMED = [f for f in list_families() if f.model_types]


def test_most_families_name_their_transformers_model_types():
    assert {"qwen3_next", "nemotron_h", "qwen3_5_vl", "qwen3_moe", "mixtral", "llama3"} <= {f.key for f in NAMED}


@pytest.mark.parametrize("fam", NAMED, ids=lambda f: f.key)
def test_registry_agrees_with_the_architecture_check(fam):
    reg = load_registry()
    state_kinds = {k for k in fam.attention_kinds if reg.attention_kinds[k].needs_varlen_kernel}
    for mt in fam.model_types:
        found = model_type_problem(mt)
        assert (found is not None) == bool(state_kinds), (fam.key, mt, found)
        if found is not None:
            assert found.layer_kind in state_kinds and found.model_type == mt
            # the registry never lets such a family pack without the kernels' confirmation
            packs = [m for m in fam.packing_modes if m != "none"]
            if packs:
                cfg = PackingConfig(model_family=fam.key, packing=packs[0], seq_length=4096,
                                    micro_batch_size=2 if packs[0] == "in_batch" else 1)
                v = [x for x in cfg.violations() if x.rule == "linear_attention_kernels"]
                assert v and f"model_type {mt!r}" in v[0].problem and "PaddedCollator" in v[0].fix + v[0].problem


@pytest.mark.parametrize("model_type,kind", [("lfm2", "short_conv"), ("falcon_h1", "mamba2"), ("bloom", "alibi")])
def test_validation_names_a_transformers_model_type_that_cannot_pack(model_type, kind):
    v = PackingConfig(model_family=model_type, packing="offline", seq_length=4096).violations()
    assert [x.rule for x in v] == ["unknown_model_family"]
    assert f"model_type {model_type!r}" in v[0].problem and kind in v[0].problem
    assert "packing: none" in v[0].fix
    ok = PackingConfig(model_family=model_type, packing="none", seq_length=4096).violations()
    assert [x.rule for x in ok] == ["unknown_model_family"] and "unknown model family" in ok[0].problem
