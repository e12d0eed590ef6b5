"""Read a config file's text into plain Python data, refusing what a plain parser would let pass.

:func:`parse_file` parses YAML or JSON; a syntax error or a key given twice in one mapping (which
``yaml.safe_load`` and ``json.loads`` resolve silently: the last value wins) becomes a
``ConfigValidationError`` with rule ``"parse"`` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from seqpack.config.errors import ConfigValidationError, Violation, parse_problem

__all__ = ["DuplicateKeyError", "parse_file", "yaml_loads", "json_loads"]


class DuplicateKeyError(ValueError):
    """A mapping gives ``key`` twice; ``str(e)`` names the key (and the lines, for YAML)."""

    def __init__(self, key: Any, lines: tuple[int, int] | None = None):
        self.key, self.lines = key, lines
        where = f" (lines {lines[0]} and {lines[1]})" if lines else ""
        super().__init__(f"key {key!r} is given twice{where}; the second value would silently win")


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that raises :class:`DuplicateKeyError` for a key given twice in one mapping
    (``<<`` merge keys, which override by design, are left to the base loader)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(key, (seen[key], line))
            seen[key] = line
        return super().construct_mapping(node, deep)


def yaml_loads(text: str) -> Any:
    """``yaml.safe_load`` that raises :class:`DuplicateKeyError` (key and both 1-based lines) for a key
    given twice in one mapping; ``yaml.YAMLError`` for bad syntax."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def json_loads(text: str) -> Any:
    """``json.loads`` that raises :class:`DuplicateKeyError` (the key) for a key given twice in one
    object; ``json.JSONDecodeError`` for bad syntax."""
    return json.loads(text, object_pairs_hook=_unique_pairs)


def parse_file(p: Path, kind: str) -> Any:
    """Read ``p`` as UTF-8 and parse it as ``kind`` (``"YAML"`` or ``"JSON"``).

    Returns:
        the parsed data (``None`` for an empty YAML file).

    Raises:
        ConfigValidationError: rule ``"parse"``, naming the file: bad syntax (the line and column, fix
            "fix the <kind> syntax at the line shown"), or a key given twice (the key, for YAML both
            lines; fix "keep one").
    """
    loads, error = (yaml_loads, yaml.YAMLError) if kind == "YAML" else (json_loads, json.JSONDecodeError)
    try:
        return loads(p.read_text(encoding="utf-8"))
    except DuplicateKeyError as e:
        problem, fix, where = str(e), "keep one", (str(e.key),)
    except error as e:
        problem, fix, where = f"not valid {kind}{parse_problem(e)}", f"fix the {kind} syntax at the line shown", ("<file>",)
    raise ConfigValidationError([Violation("parse", where, problem, fix)], source=str(p))
