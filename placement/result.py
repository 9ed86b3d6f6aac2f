"""What a placement decision says: a host, or an explained no.

Contract: results are frozen, JSON-friendly (`to_dict`) and print as one line, e.g.
``no host: 212 lack memory, 30 drained, 8 wrong hypervisor type; earliest fit
2026-12-01 14:30`` (times in UTC).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

from . import refusals
from .model import Request
from .vectors import Resources

_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


def format_time(t: float) -> str:
    """UTC, minutes unless the instant has seconds (a fit at 14:30:15 is not "14:30")."""
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S" if moment.second else "%Y-%m-%d %H:%M")


@dataclass(frozen=True, slots=True)
class Miss:
    """A host that would have fitted with a little more of some resources."""

    host: str
    reason: str
    shortfall: Resources

    def to_dict(self) -> dict:
        return {"host": self.host, "reason": self.reason, "shortfall": self.shortfall.as_dict()}


@dataclass(frozen=True, slots=True)
class EarliestFit:
    """The earliest start at which some host fits, or why none ever does."""

    start: float | None
    host: str | None = None
    reasons: Mapping[str, int] = field(default_factory=lambda: _NO_COUNTS, hash=False)

    @property
    def found(self) -> bool:
        return self.start is not None

    def __str__(self) -> str:
        if self.start is None:
            why = refusals.summarize(self.reasons)
            return f"never fits: {why}" if why else "never fits"
        return f"earliest fit {format_time(self.start)}"

    def to_dict(self) -> dict:
        return {"start": self.start, "host": self.host, "reasons": dict(self.reasons)}


@dataclass(frozen=True, slots=True)
class PlacementResult:
    request: Request
    host: str | None
    policy: str | None = None
    group: str | None = None
    score: float | None = None
    #: Hosts rejected, per reason (each host counted once, under its first failed check).
    reasons: Mapping[str, int] = field(default_factory=lambda: _NO_COUNTS, hash=False)
    closest_misses: tuple[Miss, ...] = ()
    earliest_fit: EarliestFit | None = None
    #: Hosts that passed every check in the tier that decided.
    candidates: int = 0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.host is not None

    def __str__(self) -> str:
        if self.host is not None:
            score = "" if self.score is None else f", score {self.score:.6g}"
            return f"host {self.host} ({self.policy}{score})"
        why = refusals.summarize(self.reasons) or self.note or "no hosts"
        text = f"no host: {why}"
        if self.earliest_fit is not None:
            fit = self.earliest_fit
            text += "; never fits" if fit.start is None else f"; {fit}"
        return text

    def explained(self) -> str:
        """The one line, with the note when the counts do not say it all (``no host has tag gpu``)."""
        text = str(self)
        if self.host is None and self.note and self.reasons and self.note not in text:
            text += f" ({self.note})"
        return text

    def to_dict(self) -> dict:
        return {
            "request": self.request.id,
            "host": self.host,
            "policy": self.policy,
            "group": self.group,
            "score": self.score,
            "reasons": dict(self.reasons),
            "closest_misses": [m.to_dict() for m in self.closest_misses],
            "earliest_fit": None if self.earliest_fit is None else self.earliest_fit.to_dict(),
            "candidates": self.candidates,
            "note": self.note,
            "summary": str(self),
        }


@dataclass(frozen=True, slots=True)
class MultiPlacementResult:
    """N requests placed together; with all-or-nothing, either all placed or none."""

    results: tuple[PlacementResult, ...]
    all_or_nothing: bool = False

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def placed(self) -> tuple[PlacementResult, ...]:
        if self.all_or_nothing and not self.ok:
            return ()
        return tuple(r for r in self.results if r.ok)

    def __str__(self) -> str:
        failed = [r for r in self.results if not r.ok]
        head = f"{len(self.results) - len(failed)}/{len(self.results)} placed"
        if failed and self.all_or_nothing:
            head += " (all-or-nothing: none kept)"
        if failed:
            head += f"; first failure {failed[0].request.id}: {failed[0]}"
        return head

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "all_or_nothing": self.all_or_nothing,
            "results": [r.to_dict() for r in self.results],
        }
