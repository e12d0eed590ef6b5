"""Violations and the one error type that setup-time validation raises."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

__all__ = ["CASES", "ConfigValidationError", "Violation", "case_label", "parse_problem"]

#: The public failure cases the setup-time rules prevent, one line each (the full glossary, with the
#: public reports behind each code, is ``docs/cases.md``).
CASES: dict[str, str] = {
    "B01": "packed samples attend to each other when a 2-D attention_mask hides the boundaries",
    "B02": "context-parallel attention without boundaries rotates K/V across documents",
    "B23": "CP needs every segment padded to 2*CP; seq_length must divide, stored data must match",
    "B24": "planner and row builder must use one pad multiple, or packs overflow",
    "B28": "loss normalised per micro-batch instead of by the global loss-token count",
}


def case_label(case: str | None) -> str:
    """``"case B23: <what it means>"`` for a known code, ``"case <code>"`` otherwise, ``""`` for None."""
    if not case:
        return ""
    meaning = CASES.get(case)
    return f"case {case}: {meaning}" if meaning else f"case {case}"


@dataclass(frozen=True)
class Violation:
    """One broken rule.

    Attributes:
        rule: short rule id (e.g. ``"cp_seq_length_divisible"``), stable for tests and tooling.
        keys: the config keys involved, in the order a reader should look at them.
        problem: what is wrong, with the offending values.
        fix: what to change (a concrete value where one exists).
        case: public failure case id this rule prevents (e.g. ``"B23"``), or None.
    """

    rule: str
    keys: tuple[str, ...]
    problem: str
    fix: str
    case: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (``keys`` as a list)."""
        d = asdict(self)
        d["keys"] = list(self.keys)
        return d

    def format(self) -> str:
        """One human-readable paragraph."""
        case = f" ({case_label(self.case)})" if self.case else ""
        return f"[{self.rule}]{case} keys: {', '.join(self.keys)}\n    problem: {self.problem}\n    fix: {self.fix}"


class ConfigValidationError(ValueError):
    """A packing config breaks one or more rules; ``violations`` lists all of them.

    Raised by :meth:`seqpack.config.PackingConfig.validate` (cross-key rules) and by the loaders
    (unknown keys, wrong types), so a caller handles one error type for every config problem.
    """

    def __init__(self, violations: Sequence[Violation], source: str | None = None):
        self.violations: list[Violation] = list(violations)
        self.source = source
        where = f" in {source}" if source else ""
        n = len(self.violations)
        lines = [f"{n} problem{'s' if n != 1 else ''} in the packing config{where}:"]
        for i, v in enumerate(self.violations, 1):
            lines.append(f"  {i}. " + v.format())
        super().__init__("\n".join(lines))

    @property
    def rules(self) -> list[str]:
        """The rule ids, in report order (handy in tests)."""
        return [v.rule for v in self.violations]


def parse_problem(e: Exception) -> str:
    """``" at line L, column C: problem (context)"`` of a YAML (``MarkedYAMLError``) or JSON parse error, 1-based
    as an editor shows them; the parser's own text (``": ..."``) for other errors."""
    mark = getattr(e, "problem_mark", None)
    if mark is not None:  # PyYAML: problem / context texts and a 0-based mark
        what = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        return f" at line {mark.line + 1}, column {mark.column + 1}: {what}" + (f" ({context})" if context else "")
    if hasattr(e, "lineno") and hasattr(e, "colno") and hasattr(e, "msg"):  # json.JSONDecodeError
        return f" at line {e.lineno}, column {e.colno}: {e.msg}"
    return f": {e}"
