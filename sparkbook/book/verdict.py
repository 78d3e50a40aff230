"""Checks and verdicts: every notebook ends in one.

A :class:`Check` is one row: what was checked, on which node, the status, what was observed, what
was expected and the remedy. A :class:`Verdict` shows them as one coloured table and fails the cell
(so papermill fails the step) when any row is FAIL, repeating each failure with its remedy.

Past two nodes one row per check and node outgrows reading (8 nodes: about 300 rows in preflight),
so the verdict shows a node × check matrix instead: a row per check, a column per node, the status
in each cell, then the details of only what did not pass. The JSON keeps every check.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Iterable

from .errors import CheckFailed
from .project import step_notebooks
from .redact import mask
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
WORST_FIRST = (FAIL, WARN, SKIP, PASS)
# The matrix's marks in text: short, so that eight node columns fit a terminal.
MARKS = {PASS: "ok", WARN: "WARN", FAIL: "FAIL", SKIP: "skip"}
# Node values that name no node: the whole cluster, this machine, the benchmark client. A check
# with one of them (or None, or a list "a, b") is a row of its own, across the matrix.
SCOPES = frozenset({"", "all", "local", "client"})
# From this many nodes on, a verdict is a matrix. At one or two nodes the full table is short and
# shows what every passing check saw (link rates, versions), which the matrix keeps for hovering.
MATRIX_FROM = 3
LEFT = " style='text-align:left;vertical-align:top'"
# A step's notebook named in a check (``03_distribute_image.ipynb``, or its stem), outside a word or
# a path: in HTML a link to that notebook (see :func:`link_steps`). JupyterLab resolves a relative
# href in an HTML output against the notebook's folder and opens it in the application
# (source: https://github.com/jupyterlab/jupyterlab packages/rendermime/src/renderers.ts
# @0014a7ac02f0e52be43d7079baf598ded1018bdd, handleUrls/handleAnchor).
STEP_FILE = re.compile(r"(?<![\w./-])(\d\d_[A-Za-z0-9_]+)(\.ipynb)?(?![\w-])")


@dataclass
class Check:
    check: str
    node: str | None  # a node's name; None or one of SCOPES: not one node
    status: Status
    observed: str = ""
    expected: str = ""
    remedy: str = ""
    command: str = ""

    def __post_init__(self) -> None:
        # what a check saw or ran may hold a secret (a command's environment, an error): masked
        # here, before any table, matrix or message cuts it short
        for name in ("check", "observed", "expected", "remedy", "command"):
            if isinstance(value := getattr(self, name), str):
                setattr(self, name, mask(value))
        try:
            self.status = Status(self.status)
        except ValueError:
            raise ValueError(f"status must be one of {[s.value for s in Status]}, not {self.status!r}") from None


def run_step(notebook: str) -> str:
    """How a remedy sends a person to another step: ``run 03_distribute_image.ipynb (`sparkbook run
    -p FILE --steps 03`)`` (``notebook``: the file's stem), a link in the HTML."""
    return f"run {notebook}.ipynb (`sparkbook run -p FILE --steps {notebook[:2]}`)"


def link_steps(page: str) -> str:
    """``page`` (HTML) with every existing step's notebook named in its text (never in a tag) a
    relative link to it: beside the open notebook in JupyterLab (notebooks/), and in report.html
    the executed notebook beside it in the run folder."""
    steps = step_notebooks()
    link = lambda m: f"<a href='{m[1]}.ipynb'>{m[0]}</a>" if m[1] in steps else m[0]  # noqa: E731
    return re.sub(r"(?<=>)[^<]+", lambda text: STEP_FILE.sub(link, text[0]), page)


def is_node(node: str | None) -> bool:
    """Whether a check's node is one node (not the cluster, this machine or a list of nodes)."""
    return bool(node) and node not in SCOPES and ", " not in node


def worst(statuses: Iterable[Status]) -> Status:
    return min(statuses, key=WORST_FIRST.index)


def mark(checks: list[Check], short: bool = False) -> str:
    """A matrix cell: the worst status (its short mark in text) and, over several checks, how many
    have it (``PASS ×14``, ``FAIL 2/14``)."""
    statuses = [c.status for c in checks]
    w = worst(statuses)
    n, k, name = len(statuses), statuses.count(w), MARKS[w] if short else str(w)
    return name if n == 1 else f"{name} ×{n}" if k == n else f"{name} {k}/{n}"


def nodes_label(names: list[str], every: list[str]) -> str:
    """``spark-1, spark-3``, or ``all 8 nodes``, or ``all but spark-3`` (of more than three)."""
    if len(every) >= MATRIX_FROM and set(names) >= set(every):
        return f"all {len(every)} nodes"
    if len(every) > 3 and len(set(names) & set(every)) > len(every) / 2:
        return "all but " + ", ".join(n for n in every if n not in names)
    return ", ".join(names)


def cell_html(checks: list[Check], colspan: int = 1, note: str = "") -> str:
    """A matrix cell: its mark on the worst status's colour; what each check saw on hovering."""
    seen = html.escape("\n".join(f"{c.status} {c.check}: {c.observed}" for c in checks)).replace("\n", "&#10;")
    span = f" colspan='{colspan}'" if colspan > 1 else ""
    return (f"<td{span}{LEFT} title='{seen}'><b style='background-color:{COLOURS[worst(c.status for c in checks)]};"
            f"color:#fff;padding:0 4px;border-radius:3px;white-space:nowrap'>{html.escape(mark(checks))}"
            f"</b> {html.escape(note)}</td>")


@dataclass
class Row:
    """A matrix row: a check's name, any node's name in it written ``*`` (so "tcp → spark-3" from
    every node is one row), and its checks by node. A row of checks on no one node (the cluster, this
    machine) spans the nodes' columns: ``scope`` is that node value."""

    name: str
    scope: str | None = None
    cells: dict[str, list[Check]] = field(default_factory=dict)

    def note(self) -> str:
        """What a spanning row says after its mark: its scope, and what its one check saw."""
        checks = next(iter(self.cells.values()))  # a spanning row has one cell
        where = f"({self.scope})" if self.scope != "all" else ""
        return " ".join(s for s in (where, checks[0].observed if len(checks) == 1 else "") if s)


@dataclass
class Group:
    """Details: the checks that did not pass and share a status, a row, an expectation and a
    remedy; the nodes that saw the same (check, observed, command) are one entry."""

    status: Status
    name: str
    expected: str
    remedy: str
    seen: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)


@dataclass
class Verdict:
    title: str
    checks: list[Check] = field(default_factory=list)
    # (label, value) of the numbers people look for first, from the step's outcomes (the report's)
    key_numbers: list[tuple[str, str]] = field(default_factory=list)
    # When it was taken and until when it holds (ISO 8601, UTC; "" in files older than these
    # fields): a stated age, or until a node in ``boots`` (node -> the boot ID the step read) boots
    # again, whichever comes first. A step that builds on another's verdict checks both.
    taken: str = ""
    holds_until: str = ""
    boots: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        return cls(d.get("title", ""), [Check(**c) for c in d.get("checks", [])],
                   [(k, v) for k, v in d.get("key_numbers", [])], d.get("taken", ""),
                   d.get("holds_until", ""), dict(d.get("boots", {})))

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
        """The worst status; SKIP when nothing was checked (every row a SKIP, or none): a verdict
        that judged nothing does not read as a pass."""
        found = {c.status for c in self.checks}
        return FAIL if FAIL in found else WARN if WARN in found else PASS if PASS in found else SKIP

    def counts(self) -> dict[str, int]:
        return {s.value: sum(c.status == s for c in self.checks) for s in Status}

    def headline(self) -> str:
        n = self.counts()
        counted = ', '.join(f'{v} {k}' for k, v in n.items() if v) or "no checks"
        nothing = ": nothing was checked" if self.status == SKIP else ""
        return f"{self.title}: {self.status} ({counted}){nothing}"

    def nodes(self) -> list[str]:
        """The nodes the checks name, in order of appearance: the matrix's columns."""
        return list(dict.fromkeys(c.node for c in self.checks if is_node(c.node)))

    def table(self) -> Table:
        """One row per check: what a verdict of one or two nodes shows."""
        return Table(COLUMNS, [[getattr(c, k) for k in COLUMNS] for c in self.checks],
                     title=self.headline(), title_colour=COLOURS[self.status],
                     colour=lambda col, v: COLOURS.get(v) if col == "status" else None)

    def rows(self) -> list[Row]:
        """The matrix's rows (see :class:`Row`), in order of appearance."""
        nodes = sorted(self.nodes(), key=len, reverse=True)  # a name holding another first
        named = re.compile("|".join(rf"(?<![\w-]){re.escape(n)}(?![\w-]|\.\w)" for n in nodes) or "(?!)")
        rows: dict[tuple[str, str | None], Row] = {}
        for c in self.checks:
            name, scope = named.sub("*", c.check), None if is_node(c.node) else c.node or "all"
            row = rows.setdefault((name, scope), Row(name, scope))
            row.cells.setdefault(c.node or "all", []).append(c)
        return list(rows.values())

    def details(self, statuses: Iterable[Status] = (FAIL, WARN, SKIP)) -> list[Group]:
        """The checks of ``statuses``, grouped (see :class:`Group`)."""
        rows = self.rows()
        row_of = {id(c): (i, r.name) for i, r in enumerate(rows) for cs in r.cells.values() for c in cs}
        groups: dict[tuple, Group] = {}
        for c in sorted(self.checks, key=lambda c: row_of[id(c)][0]):  # in the matrix's order
            if c.status in statuses:
                g = Group(c.status, row_of[id(c)][1], c.expected, c.remedy)
                g = groups.setdefault((g.status, g.name, g.expected, g.remedy), g)
                g.seen.setdefault((c.check, c.observed, c.command), []).append(c.node or "all")
        return list(groups.values())

    def details_text(self, groups: list[Group]) -> list[str]:
        every, lines = self.nodes(), []
        for g in groups:
            expected = f" (expected {g.expected})" if g.expected else ""
            if len(g.seen) == 1:
                ((check, observed, command), nodes), = g.seen.items()
                where = f" on {nodes_label(nodes, every)}" if nodes != ["all"] else ""
                lines.append(f"- {g.status} {check}{where}: {observed or 'failed'}{expected}")
                if command:
                    lines.append(f"  command: {command}")
            else:
                lines.append(f"- {g.status} {g.name}{expected}:")
                for (check, observed, command), nodes in g.seen.items():
                    lines.append(f"    {nodes_label(nodes, every)}: " + (f"{check}: " if check != g.name else "")
                                 + (observed or "failed") + (f" ({command})" if command else ""))
            if g.remedy:
                lines.append(f"  remedy: {g.remedy}")
        return lines

    def matrix_text(self) -> str:
        nodes, rows = self.nodes(), self.rows()
        cells = [[" ".join(s for s in (mark(r.cells[r.scope], short=True), r.note()) if s)] if r.scope else
                 [mark(r.cells[n], short=True) if n in r.cells else "" for n in nodes] for r in rows]
        name_w = min(max(len(s) for s in ["check", *(r.name for r in rows)]), 32)
        widths = [min(max([len(n)] + [len(cs[i]) for r, cs in zip(rows, cells) if not r.scope]), 16)
                  for i, n in enumerate(nodes)]
        span_w = max(sum(widths) + 2 * len(widths) - 2, 60)
        cut = lambda s, w: (s if len(s) <= w else s[: w - 1] + "…").ljust(w)
        line = lambda name, cs, ws: "  ".join([cut(name, name_w), *map(cut, cs, ws)]).rstrip()
        head = line("check", nodes, widths)
        body = [line(r.name, cs, [span_w] if r.scope else widths) for r, cs in zip(rows, cells)]
        details = self.details_text(self.details())
        return "\n".join([self.headline(), head, "-" * len(head), *body]
                         + (["", "not passed:", *details] if details else []))

    def matrix_html(self) -> str:
        nodes, esc = self.nodes(), html.escape
        head = "".join(f"<th{LEFT}>{esc(n)}</th>" for n in ["check", *nodes])
        body = "".join(f"<tr><td{LEFT}>{esc(r.name)}</td>" + (
            cell_html(r.cells[r.scope], len(nodes), r.note()) if r.scope else
            "".join(cell_html(r.cells[n]) if n in r.cells else "<td></td>" for n in nodes)) + "</tr>"
            for r in self.rows())
        return (f"<div class='sparkbook-table sparkbook-matrix'><h4 style='color:{COLOURS[self.status]}'>"
                f"{esc(self.headline())}</h4><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
                f"</table>{self.details_html(self.details())}</div>")

    def details_html(self, groups: list[Group]) -> str:
        if not groups:
            return ""
        esc, every = html.escape, self.nodes()
        rows = []
        for g in groups:
            seen = "<br>".join(
                f"<b>{esc(nodes_label(nodes, every))}</b>: " + (f"{esc(check)}: " if check != g.name else "")
                + esc(observed) + (f" <code>{esc(command)}</code>" if command else "")
                for (check, observed, command), nodes in g.seen.items())
            rows.append("<tr>" + "".join(f"<td{LEFT}>{v}</td>" for v in (
                f"<b style='color:{COLOURS[g.status]}'>{g.status}</b>", esc(g.name), seen, esc(g.expected),
                esc(g.remedy))) + "</tr>")
        head = "".join(f"<th{LEFT}>{h}</th>" for h in ("status", "check", "seen", "expected", "remedy"))
        return (f"<p>not passed:</p><table class='sparkbook-details'><thead><tr>{head}</tr></thead>"
                f"<tbody>{''.join(rows)}</tbody></table>")

    @property
    def is_matrix(self) -> bool:
        return len(self.nodes()) >= MATRIX_FROM

    def to_text(self) -> str:
        return self.matrix_text() if self.is_matrix else self.table().to_text()

    def _repr_html_(self) -> str:
        return link_steps(self.matrix_html() if self.is_matrix else self.table()._repr_html_())

    __str__ = to_text

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython's text form (logs, terminals)
        printer.text(self.to_text())

    def to_json(self) -> dict:
        return {"title": self.title, "status": self.status, "taken": self.taken,
                "holds_until": self.holds_until, "boots": self.boots,
                "checks": [asdict(c) for c in self.checks], "key_numbers": [list(kn) for kn in self.key_numbers]}

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(mask(json.dumps(self.to_json(), indent=2)) + "\n")
        return path

    def raise_for_failures(self) -> None:
        """Fail (raise :class:`CheckFailed`) when any check failed, naming each with its remedy
        (the nodes that failed alike in one entry)."""
        bad = self.failures
        if bad:
            raise CheckFailed("\n".join([f"{self.title}: {len(bad)} check(s) failed",
                                         *self.details_text(self.details([FAIL]))]), verdict=self)
