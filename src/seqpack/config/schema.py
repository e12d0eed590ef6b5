"""Schema problems of a config mapping as :class:`~seqpack.config.errors.Violation` s, together with the
cross-key rule violations of the keys that passed, so one ``seqpack validate`` run lists every problem
(an unknown or mistyped key does not hide the others)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from seqpack.config.errors import Violation
from seqpack.config.rules import run_rules

__all__ = ["schema_violations", "schema_and_rule_violations"]


def schema_violations(err: ValidationError, fields: list[str]) -> list[Violation]:
    """One :class:`Violation` per pydantic error of ``err``: unknown keys (with a did-you-mean from
    ``fields``, the model's field names), wrong types or ranges, and the packing-mode exclusivity check."""
    out = []
    for e in err.errors():
        key = ".".join(str(x) for x in e.get("loc", ())) or "<root>"
        if e.get("type") == "packing_flags_exclusive":
            out.append(Violation("packing_modes_exclusive", ("packing", "packed_sequence", "pack_sequences_in_batch"),
                                 e.get("msg", ""), "choose one packing mode: `packing: offline` (micro_batch_size 1) "
                                 "or `packing: in_batch` (micro_batch_size > 1)"))
        elif e.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}?" if close else "remove it; `seqpack recipe qwen3_sft` shows the known keys"
            out.append(Violation("schema", (key,), f"unknown config key {key!r}", fix))
        else:
            msg = e.get("msg", "invalid value")
            out.append(Violation("schema", (key,), f"{msg} (got {e.get('input')!r})",
                                 f"give {key} a valid value"))
    return out


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
    found = schema_violations(err, fields)
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
