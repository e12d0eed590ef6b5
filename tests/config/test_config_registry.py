"""Model-family registry: required families and their facts, alias look-up, data consistency checks."""

from __future__ import annotations

import copy

import pytest
import yaml
from importlib import resources

from seqpack.config import get_family, list_families, load_registry
from seqpack.config.registry import PACKING_MODES, RegistryError, parse_registry

REQUIRED = ["llama3", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "glm4_5", "qwen2_5_vl", "qwen3_5_vl",
            "nemotron_h", "nemotron_omni", "deepseek_v3", "mixtral"]


def _raw():
    return yaml.safe_load(resources.files("seqpack").joinpath("resources/families.yaml").read_text())


def test_required_families_present_with_sources():
    names = [f.key for f in list_families()]
    assert set(REQUIRED) <= set(names)
    for f in list_families():
        assert f.sources, f"{f.key} has no source"
        assert f.modality in ("text", "vlm") and f.position_type in ("rope", "mrope", "none")
        assert "none" in f.packing_modes
        for o in f.opt_outs:
            assert o.reason and o.source


@pytest.mark.parametrize("key", ["qwen3_next", "glm4_5"])
def test_no_packing_opt_outs(key):
    f = get_family(key)
    assert f.packing_modes == ("none",)
    for mode in ("offline", "in_batch", "streaming"):
        o = f.opt_out_for(mode)
        assert o is not None and "Megatron-Bridge" in o.source


def test_qwen3_5_vl_packs_in_batch_only():
    f = get_family("qwen3_5_vl")
    assert f.supports("in_batch") and not f.supports("offline") and not f.supports("streaming")
    assert "training step" in f.opt_out_for("offline").reason
    assert f.is_multimodal and f.position_type == "mrope"
    assert "gated_delta_net" in f.attention_kinds


@pytest.mark.parametrize("key,modality,pos,mtp,moe", [
    ("llama3", "text", "rope", False, False),
    ("qwen2_5_vl", "vlm", "mrope", False, False),
    ("deepseek_v3", "text", "rope", True, True),
    ("mixtral", "text", "rope", False, True),
    ("nemotron_h", "text", "none", False, False),
    ("nemotron_omni", "vlm", "none", False, False),
    ("qwen3_moe", "text", "rope", False, True),
])
def test_family_facts(key, modality, pos, mtp, moe):
    f = get_family(key)
    assert (f.modality, f.position_type, f.mtp, f.moe) == (modality, pos, mtp, moe)


def test_varlen_kernel_kinds():
    reg = load_registry()
    assert reg.attention_kinds["gated_delta_net"].needs_varlen_kernel
    assert reg.attention_kinds["mamba2"].needs_varlen_kernel
    assert not reg.attention_kinds["full"].needs_varlen_kernel
    assert "mamba2" in get_family("nemotron_h").attention_kinds
    assert "gated_delta_net" in get_family("qwen3_next").attention_kinds


def test_attention_backends_boundary_support():
    b = load_registry().attention_backends
    assert b["te"].cp_varlen and b["flash"].cp_varlen
    assert not b["sdpa"].cp_varlen and not b["flex"].cp_varlen and not b["eager"].cp_varlen
    assert not b["local"].varlen


@pytest.mark.parametrize("alias,key", [("Qwen3.5-VL", "qwen3_5_vl"), ("GLM-4.5", "glm4_5"), ("LLAMA3", "llama3"),
                                       ("qwen2.5-vl", "qwen2_5_vl"), ("deepseek-v3", "deepseek_v3")])
def test_alias_lookup(alias, key):
    assert get_family(alias).key == key


def test_unknown_family_lists_known():
    with pytest.raises(KeyError, match="llama3"):
        get_family("gpt5")


def test_packaged_registry_parses_consistently():
    raw = _raw()
    reg = parse_registry(raw)
    # parse_registry keeps every family of the YAML, in file order (the YAML keys are the oracle)
    assert reg.names() == list(raw["families"])
    assert set(REQUIRED) <= set(reg.names())
    assert load_registry().names() == reg.names()


def _broken(mutate):
    data = copy.deepcopy(_raw())
    mutate(data)
    return data


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d["families"]["qwen3_next"]["packing_modes"].append("offline"), "also listed in packing_modes"),
    (lambda d: d["families"]["llama3"].__setitem__("packing_modes", ["offline", "in_batch", "streaming"]),
     "'none'"),
    (lambda d: d["families"]["llama3"]["attention_kinds"].append("quantum"), "unknown kind"),
    (lambda d: d["families"]["qwen3"]["aliases"].append("llama"), "already names family"),
    (lambda d: d["families"]["qwen3"].__setitem__("packing_modes", ["offline", "none"]),
     "neither supported nor covered"),
    (lambda d: d["families"]["qwen3"].__setitem__("modality", "audio"), "modality"),
    (lambda d: d["families"]["qwen3"].__setitem__("position_type", "alibi"), "position_type"),
    (lambda d: d["families"]["qwen3"]["packing_modes"].append("sometimes"), "unknown mode"),
    (lambda d: d["families"]["qwen3"].pop("modality"), "missing key 'modality'"),
])
def test_registry_consistency_errors(mutate, match):
    with pytest.raises(RegistryError, match=match):
        parse_registry(_broken(mutate))


def test_packing_modes_constant_matches_config_enum():
    from seqpack.config import PackingMode

    assert PACKING_MODES == tuple(m.value for m in PackingMode)
