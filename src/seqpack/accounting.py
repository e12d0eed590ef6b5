"""The accounting of the prepare step: what happened to every input record (nothing is lost silently).

:class:`PrepareReport` counts records read and samples / tokens produced, and lists a
:class:`SampleRecord` for every record that was dropped, skipped, truncated or split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SampleRecord", "PrepareReport"]


@dataclass
class SampleRecord:
    """Accounting entry for one input record that was not packed as-is.

    ``status`` is one of ``"dropped"``, ``"skipped"`` (bad input with ``on_error=skip``),
    ``"truncated"``, ``"split"``, ``"kept"`` (no trainable token but kept on request,
    ``keep_untrainable=True``); ``reason`` is a short machine-readable key (e.g. ``"overlength"``,
    ``"no_trainable_tokens"``, ``"malformed_json"``) and ``detail`` the human message.
    """

    sample_id: str
    source: str | None
    index: int | None
    status: str
    reason: str
    detail: str = ""
    tokens_before: int | None = None
    tokens_after: int | None = None


@dataclass
class PrepareReport:
    """What happened to every input record (nothing is lost silently).

    ``records_read`` counts every record seen; ``entries`` lists every record that was dropped,
    skipped, truncated or split, with its reason and provenance.
    """

    records_read: int = 0
    samples_out: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    entries: list[SampleRecord] = field(default_factory=list)

    def count(self, status: str | None = None, reason: str | None = None) -> int:
        """Number of ``entries`` with this ``status`` and ``reason`` (``None`` matches any)."""
        return sum(
            1
            for e in self.entries
            if (status is None or e.status == status) and (reason is None or e.reason == reason)
        )

    def by_reason(self) -> dict[str, dict[str, int]]:
        """Entry counts as ``{status: {reason: count}}`` (statuses and reasons in first-seen order)."""
        out: dict[str, dict[str, int]] = {}
        for e in self.entries:
            out.setdefault(e.status, {}).setdefault(e.reason, 0)
            out[e.status][e.reason] += 1
        return out

    def merge(self, other: "PrepareReport") -> None:
        """Add ``other``'s counters to this report and append its entries (in place)."""
        self.records_read += other.records_read
        self.samples_out += other.samples_out
        self.tokens += other.tokens
        self.trainable_tokens += other.trainable_tokens
        self.entries.extend(other.entries)
