"""Recipes: all validate, and their packing defaults are pinned so an edit cannot flip them unnoticed."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest
import yaml

from seqpack.config import PackingConfig, list_recipes, load_recipe, recipe_descriptions, recipe_text

REPO = Path(__file__).resolve().parents[2]

# name -> pinned values (packing defaults); effective_pad_multiple is derived
PINNED = {
    "llama3_sft": dict(model_family="llama3", packing="offline", seq_length=8192, micro_batch_size=1,
                       context_parallel_size=1, algorithm="first_fit_shuffle", calculate_per_token_loss=True,
                       average_in_collective=False, attention_backend="te", mtp_num_layers=0,
                       effective_pad_multiple=1),
    "qwen3_sft": dict(model_family="qwen3", packing="offline", seq_length=4096, micro_batch_size=1,
                      context_parallel_size=1, algorithm="first_fit_shuffle", calculate_per_token_loss=True,
                      average_in_collective=False, effective_pad_multiple=1),
    "qwen3_sft_cp2": dict(model_family="qwen3", packing="offline", seq_length=16384, micro_batch_size=1,
                          context_parallel_size=2, tensor_model_parallel_size=2, sequence_parallel=True,
                          calculate_per_token_loss=True, average_in_collective=False, effective_pad_multiple=4),
    "qwen2_5_vl_sft": dict(model_family="qwen2_5_vl", packing="in_batch", micro_batch_size=4,
                           flatten_micro_batch=True, seq_length=4096, mtp_num_layers=0, effective_pad_multiple=1),
    # in-batch THD packing ON for Qwen3.5-VL fine-tuning (packing deferred to the step; never offline)
    "qwen3_5_vl_sft": dict(model_family="qwen3_5_vl", packing="in_batch", micro_batch_size=2,
                           flatten_micro_batch=True, linear_attention_varlen=True, pad_to_multiple_of=16,
                           mtp_num_layers=0, calculate_per_token_loss=True, effective_pad_multiple=16),
    "nemotron_h_sft": dict(model_family="nemotron_h", packing="offline", micro_batch_size=1, seq_length=8192,
                           linear_attention_varlen=True, effective_pad_multiple=1),
    "nemotron_omni_sft": dict(model_family="nemotron_omni", packing="in_batch", micro_batch_size=4,
                              flatten_micro_batch=True, linear_attention_varlen=True, effective_pad_multiple=1),
}


def test_recipe_list():
    assert list_recipes() == sorted(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_recipe_validates_and_pins_defaults(name):
    c = load_recipe(name)
    assert c.violations() == []
    assert c.recipe == name
    for key, want in PINNED[name].items():
        got = getattr(c, key)
        got = getattr(got, "value", got)
        assert got == want, f"{name}: {key} is {got!r}, pinned {want!r}"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_recipe_yaml_is_a_plain_config_file(name, tmp_path):
    p = tmp_path / f"{name}.yaml"
    p.write_text(recipe_text(name))
    assert PackingConfig.from_file(p) == load_recipe(name)
    assert recipe_text(name).lstrip().startswith("#")  # explained in a header comment


def test_recipe_overrides_and_unknown():
    c = load_recipe("qwen3_sft", context_parallel_size=2)
    assert c.context_parallel_size == 2 and c.violations() == []
    with pytest.raises(KeyError, match="qwen3_sft"):
        recipe_text("nope")


def test_descriptions_nonempty():
    d = recipe_descriptions()
    assert set(d) == set(PINNED) and all(d.values())


def test_required_models_have_recipes():
    fams = {yaml.safe_load(recipe_text(n))["model_family"] for n in list_recipes()}
    assert {"qwen2_5_vl", "qwen3", "qwen3_5_vl", "llama3", "nemotron_h", "nemotron_omni"} <= fams


def test_recipes_and_registry_ship_as_package_data():
    """pyproject's package-data globs must cover resources/families.yaml and resources/recipes/*.yaml."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["seqpack"]
    pkg = REPO / "src" / "seqpack"
    files = [pkg / "resources" / "families.yaml", *sorted((pkg / "resources" / "recipes").glob("*.yaml"))]
    assert len(files) > 1, "no recipes found under resources/recipes"
    for f in files:
        rel = f.relative_to(pkg).as_posix()
        # setuptools expands package-data globs with glob(recursive=True): "*" stops at "/", "**" does not
        ok = any(fnmatch.fnmatch(rel, g) and (g.count("/") == rel.count("/") or "**" in g) for g in globs)
        assert ok, f"{rel} is not matched by package-data {globs}; add 'resources/**/*'"
