"""Violations and the one error type that setup-time validation raises."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

__all__ = ["ConfigValidationError", "Violation"]


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
        case = f" (case {self.case})" if self.case else ""
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
