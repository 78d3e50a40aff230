"""Checks and verdicts: every notebook ends in one.

A :class:`Check` is one row: what was checked, on which node, the status, what was observed, what
was expected and the remedy. A :class:`Verdict` shows them as one coloured table and fails the cell
(so papermill fails the step) when any row is FAIL, repeating each failure with its remedy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Iterable

from .errors import CheckFailed
from .tables import Table



class Status(str, Enum):
    """A check's outcome. A ``str`` so that JSON, tables and comparisons with "PASS" read it as text."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


PASS, WARN, FAIL, SKIP = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP
STATUSES = tuple(Status)
COLOURS = {PASS: "#1a7f37", WARN: "#9a6700", FAIL: "#cf222e", SKIP: "#6e7781"}
COLUMNS = ("check", "node", "status", "observed", "expected", "remedy")


@dataclass
class Check:
    check: str
    node: str
    status: Status
    observed: str = ""
    expected: str = ""
    remedy: str = ""
    command: str = ""

    def __post_init__(self) -> None:
        try:
            self.status = Status(self.status)
        except ValueError:
            raise ValueError(f"status must be one of {[s.value for s in Status]}, not {self.status!r}") from None


@dataclass
class Verdict:
    title: str
    checks: list[Check] = field(default_factory=list)
    # (label, value) of the numbers people look for first, from the step's outcomes (the report's)
    key_numbers: list[tuple[str, str]] = field(default_factory=list)

    def add(self, *checks: Check) -> "Verdict":
        self.checks.extend(checks)
        return self

    def extend(self, checks: Iterable[Check]) -> "Verdict":
        self.checks.extend(checks)
        return self

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def status(self) -> Status:
        found = {c.status for c in self.checks}
        return FAIL if FAIL in found else WARN if WARN in found else PASS

    def counts(self) -> dict[str, int]:
        return {s.value: sum(c.status == s for c in self.checks) for s in Status}

    def headline(self) -> str:
        n = self.counts()
        return f"{self.title}: {self.status} ({', '.join(f'{v} {k}' for k, v in n.items() if v)})"

    def table(self) -> Table:
        return Table(COLUMNS, [[getattr(c, k) for k in COLUMNS] for c in self.checks],
                     title=self.headline(), title_colour=COLOURS[self.status],
                     colour=lambda col, v: COLOURS.get(v) if col == "status" else None)

    def to_text(self) -> str:
        return self.table().to_text()

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    __str__ = to_text

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython's text form (logs, terminals)
        printer.text(self.to_text())

    def to_json(self) -> dict:
        return {"title": self.title, "status": self.status, "checks": [asdict(c) for c in self.checks],
                "key_numbers": [list(kn) for kn in self.key_numbers]}

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    def raise_for_failures(self) -> None:
        """Fail (raise :class:`CheckFailed`) when any check failed, naming each with its remedy."""
        bad = self.failures
        if not bad:
            return
        lines = [f"{self.title}: {len(bad)} check(s) failed"]
        for c in bad:
            lines.append(f"- {c.check} on {c.node}: {c.observed or 'failed'}"
                         + (f" (expected {c.expected})" if c.expected else ""))
            if c.command:
                lines.append(f"  command: {c.command}")
            if c.remedy:
                lines.append(f"  remedy: {c.remedy}")
        raise CheckFailed("\n".join(lines))
