"""Recipes: ready-made, validated packing configs shipped as package data.

Each recipe is a YAML file in ``seqpack/resources/recipes/`` holding a flat
:class:`~seqpack.config.PackingConfig` mapping (``recipe`` and ``description`` included), so
``seqpack recipe NAME > my.yaml`` gives a file ``seqpack validate my.yaml`` accepts.
"""

from __future__ import annotations

from importlib import resources

import yaml

from seqpack.config.model import PackingConfig

__all__ = ["list_recipes", "load_recipe", "recipe_text", "recipe_descriptions"]

_DIR = "resources/recipes"


def _root():
    return resources.files("seqpack").joinpath(_DIR)


def list_recipes() -> list[str]:
    """Recipe names (file stems), sorted."""
    return sorted(p.name[: -len(".yaml")] for p in _root().iterdir() if p.name.endswith(".yaml"))


def recipe_text(name: str) -> str:
    """The recipe's YAML text, comments included.

    Raises:
        KeyError: unknown recipe; the message lists the known names.
    """
    if name not in list_recipes():
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(list_recipes())}")
    return _root().joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def load_recipe(name: str, **overrides) -> PackingConfig:
    """Load a recipe as a :class:`PackingConfig`, optionally overriding keys.

    Raises:
        KeyError: unknown recipe.
        ConfigValidationError: an override is an unknown key or has a wrong type.
    """
    data = yaml.safe_load(recipe_text(name)) or {}
    data.update(overrides)
    return PackingConfig.from_dict(data, source=f"recipe {name}")


def recipe_descriptions() -> dict[str, str]:
    """``{name: description}`` for every recipe (the ``description`` key, first line)."""
    out = {}
    for n in list_recipes():
        d = (yaml.safe_load(recipe_text(n)) or {}).get("description") or ""
        out[n] = str(d).strip().splitlines()[0] if str(d).strip() else ""
    return out
