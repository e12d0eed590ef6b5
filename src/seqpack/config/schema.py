"""Schema problems of a config mapping as :class:`~seqpack.config.errors.Violation` s, together with the
cross-key rule violations of the keys that passed, so one ``seqpack validate`` run lists every problem
(an unknown or mistyped key does not hide the others)."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any

from pydantic import ValidationError

from seqpack.config.errors import Violation
from seqpack.config.options import ALGORITHM_VALUES, TRAIN_ON_VALUES
from seqpack.config.rules import run_rules

__all__ = ["schema_violations", "schema_and_rule_violations"]


def schema_violations(err: ValidationError, model: Any) -> list[Violation]:
    """One :class:`Violation` per pydantic error of ``err`` (raised by ``model.model_validate``), in the
    config file's words: unknown keys (with a did-you-mean), wrong types (a quoted number, a boolean for a
    number), out-of-range values and unknown names, each with a concrete fix (the value to write), and the
    packing-mode exclusivity check.

    Example::

        schema_violations(err, PackingConfig)[0]  # for `seq_length: "4096"`
        # Violation('schema', ('seq_length',), "seq_length is the text '4096' (quoted), not an integer",
        #           'remove the quotes: `seq_length: 4096`')
    """
    fields = list(model.model_fields)
    by_spelling = {s: name for name, f in model.model_fields.items() for s in {name, *_spellings(f)}}
    out = []
    for e in err.errors():
        key = ".".join(str(x) for x in e.get("loc", ())) or "<root>"
        if e.get("type") == "packing_flags_exclusive":
            out.append(Violation("packing_modes_exclusive", ("packing", "packed_sequence", "pack_sequences_in_batch"),
                                 e.get("msg", ""), "choose one packing mode: `packing: offline` (micro_batch_size 1) "
                                 "or `packing: in_batch` (micro_batch_size > 1)"))
        elif e.get("type") == "packing_flag_type":
            flag = e["ctx"]["key"]
            out.append(Violation("schema", (flag,), e.get("msg", ""), f"write `{flag}: true` or `{flag}: false`, "
                                 "without quotes"))
        elif e.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}?" if close else "remove it; `seqpack recipe qwen3_sft` shows the known keys"
            out.append(Violation("schema", (key,), f"unknown config key {key!r}", fix))
        else:
            name = by_spelling.get(str(e["loc"][0])) if e.get("loc") else None
            field = model.model_fields[name] if name else None
            out.append(Violation("schema", (key,), *_value_problem(key, e, name, field)))
    return out


def _value_problem(key: str, e: Mapping[str, Any], name: str | None, field: Any) -> tuple[str, str]:
    """``(problem, fix)`` for ``key`` (as written) whose value pydantic refused (error ``e``); ``name`` and
    ``field``: the model field it sets (``None`` when unknown). The fix names a value to write, in YAML."""
    kind, choices = _kind(name, field)
    value, etype, ctx = e.get("input"), e.get("type", ""), e.get("ctx") or {}
    example = _example(field, kind, choices)
    msg = re.sub(r"^(Value error|Assertion failed), ", "", e.get("msg", "invalid value"))
    if kind in _KIND_TEXT and etype.endswith(("_type", "_parsing", "_from_float")):
        what = _KIND_TEXT[kind]
        if isinstance(value, str) and _unquoted(value, kind) is not None:
            return (f"{key} is the text {value!r} (quoted), not {what}",
                    f"remove the quotes: `{key}: {_unquoted(value, kind)}`")
        got = _what(value)
        return f"{key} is {got} ({_yaml(value)}), not {what}", f"set {key} to {what}, e.g. `{key}: {example}`"
    if kind is str and etype == "string_type":
        return (f"{key} is {_what(value)} ({_yaml(value)}), not text",
                f"write the text in quotes: `{key}: '{_yaml(value)}'`")
    bound = next(((op, ctx[k]) for k, op in _BOUNDS if k in ctx), None)
    if bound is not None:
        op, limit = bound
        return (f"{key} must be {op} {limit}, got {_yaml(value)}",
                f"set {key} to {_KIND_TEXT.get(kind, 'a value')} {op} {limit}, e.g. `{key}: {example}`")
    if choices:
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
        problem = msg if repr(value) in msg else f"{key} is {_yaml(value)}; choose one of: {', '.join(choices)}"
        return problem, (f"did you mean `{key}: {close[0]}`?" if close else
                         f"set {key} to one of the names listed, e.g. `{key}: {example}`")
    problem = msg if repr(value) in msg else f"{msg} (got {_yaml(value)})"
    return problem, (f"set {key} to a valid value, e.g. `{key}: {example}`" if example != "null" else
                     f"set {key} to a valid value, or remove it; `seqpack recipe qwen3_sft` shows the known keys")


#: pydantic's bound context keys, as the message writes them.
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))

#: the names a string field takes (enum fields list their values themselves).
_CHOICES = {"algorithm": ALGORITHM_VALUES, "train_on": TRAIN_ON_VALUES}

#: a field's value kind, as a problem names it.
_KIND_TEXT = {int: "an integer", bool: "true or false", float: "a number"}


def _kind(name: str | None, field: Any) -> tuple[type | None, tuple[str, ...]]:
    """``(int | bool | float | str | None, choices)`` of the model field ``name``: its value type
    (``Optional`` and ``Annotated`` unwrapped) and the names it takes (an enum's values, :data:`_CHOICES`)."""
    if field is None:
        return None, ()
    ann = field.annotation
    while typing.get_origin(ann) is not None:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if not args:
            break
        ann = args[0]
    if isinstance(ann, type) and issubclass(ann, Enum):
        return str, tuple(m.value for m in ann)
    return ann if isinstance(ann, type) else None, _CHOICES.get(name, ())


def _example(field: Any, kind: type | None, choices: tuple[str, ...]) -> str:
    """A valid value for ``field`` in YAML: its default when that is a real value, else the lowest value its
    bound allows, else the first of its choices (``"null"`` when there is none)."""
    default = getattr(field, "default", None)
    default = getattr(default, "value", default)
    if default is not None and default in choices:
        return str(default)
    if default is not None and not choices:
        return _yaml(default)
    if choices:
        return choices[0]
    for m in getattr(field, "metadata", ()):
        for attr in ("ge", "gt"):
            bound = getattr(m, attr, None)
            if bound is not None:
                return _yaml(bound + (1 if attr == "gt" else 0) if kind is int else bound)
    return "null"


def _unquoted(text: str, kind: type) -> str | None:
    """``text`` as the unquoted YAML scalar of ``kind`` it spells (``"4096"`` -> ``4096``), or None."""
    t = text.strip()
    if kind is int and re.fullmatch(r"[+-]?\d+", t):
        return str(int(t))
    if kind is bool and t.lower() in ("true", "false"):
        return t.lower()
    if kind is float and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", t):
        return t
    return None


def _what(value: Any) -> str:
    """What kind of YAML value ``value`` is, for a problem: ``"a boolean"``, ``"text"``, ``"a list"`` ..."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number with a fraction" if value != int(value) else "a decimal number"
    kinds = {int: "an integer", str: "text", list: "a list", dict: "a mapping", type(None): "null"}
    return next((w for t, w in kinds.items() if isinstance(value, t)), f"a {type(value).__name__}")


def _yaml(value: Any) -> str:
    """``value`` as YAML writes a scalar: ``true``, ``null``, ``4096``, ``'text'``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value) if isinstance(value, str) else str(value)


def schema_and_rule_violations(model: Any, data: Mapping[str, Any], err: ValidationError) -> list[Violation]:
    """The schema violations of ``data`` (``err``: what ``model.model_validate(data)`` raised), then the
    cross-key rule violations (:func:`seqpack.config.rules.run_rules`) of the config built from the keys
    that passed.

    A rule violation is listed only when none of its keys is a key that failed the schema or the key
    an unknown key was probably meant to be (its did-you-mean): such a rule would judge a default the
    user did not choose. When the remaining keys still do not build (a whole-model check failed), only
    the schema violations are returned.
    """
    fields = list(model.model_fields)
    found = schema_violations(err, model)
    bad = {str(e["loc"][0]) for e in err.errors() if e.get("loc")}
    if not bad or not bad <= set(map(str, data)):
        return found
    meant = set(bad)
    for key in bad:
        meant.update(difflib.get_close_matches(key, fields, n=1, cutoff=0.6))
        meant.update(name for name, f in model.model_fields.items() if key in _spellings(f))
    try:
        rest = model.model_validate({k: v for k, v in data.items() if str(k) not in bad})
    except ValidationError:
        return found
    return found + [v for v in run_rules(rest) if not meant.intersection(v.keys)]


def _spellings(field: Any) -> set[str]:
    """The input spellings of a pydantic field: its alias and its ``AliasChoices``."""
    out = {field.alias} if field.alias else set()
    choices = getattr(field.validation_alias, "choices", None)
    if choices:
        out.update(c for c in choices if isinstance(c, str))
    elif isinstance(field.validation_alias, str):
        out.add(field.validation_alias)
    return out
