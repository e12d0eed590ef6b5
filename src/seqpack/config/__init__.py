"""Setup-time configuration: :class:`PackingConfig`, its cross-key rules, the model-family registry
and shipped recipes.

Layers, bottom up: ``errors`` (Violation), ``registry`` (model-family data), ``options`` (enums and
value sets), ``tokenizers`` (tokenizer identity), ``rules`` (cross-key rules on a config),
``packed_data`` (stored data vs a config), ``model`` (``PackingConfig``), ``recipes``.

Typical use::

    from seqpack.config import PackingConfig
    cfg = PackingConfig.from_file("packing.yaml").validate()   # raises ConfigValidationError
    multiple = cfg.effective_pad_multiple                       # pass to planner AND builder
    ds = seqpack.io.load_packed(path, expect=cfg.packed_data_expectations())
    cfg.check_packed_data("packed/")   # + tokenizer identity (hash or alias table), notes
"""

from seqpack.config.errors import ConfigValidationError, Violation
from seqpack.config.model import PackingConfig
from seqpack.config.options import ALGORITHM_VALUES, AttentionBackend, PackingMode
from seqpack.config.packed_data import PackedDataCheck
from seqpack.config.recipes import list_recipes, load_recipe, recipe_descriptions, recipe_text
from seqpack.config.registry import ModelFamily, OptOut, get_family, list_families, load_registry
from seqpack.config.rules import RULES

__all__ = [
    "ALGORITHM_VALUES",
    "AttentionBackend",
    "ConfigValidationError",
    "ModelFamily",
    "OptOut",
    "PackedDataCheck",
    "PackingConfig",
    "PackingMode",
    "RULES",
    "Violation",
    "get_family",
    "list_families",
    "list_recipes",
    "load_config",
    "load_recipe",
    "load_registry",
    "recipe_descriptions",
    "recipe_text",
]


def load_config(path) -> PackingConfig:
    """Load a YAML/JSON config file (no cross-key validation; call ``.validate()``)."""
    return PackingConfig.from_file(path)
