"""Plain tables for notebooks (HTML), terminals (text) and the run folder (CSV); secrets masked in
every cell before a column cuts it short."""

from __future__ import annotations

import csv
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .redact import mask


def short_id(image_id: str | None) -> str:
    """``sha256:0123456789abcdef...`` -> ``0123456789ab`` (as ``docker images`` shows it)."""
    return image_id.split(":")[-1][:12] if image_id else "absent"


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``: binary units, three significant figures."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


def _text(value: Any) -> str:
    return "" if value is None else mask(str(value))


@dataclass
class Table:
    columns: Sequence[str]
    rows: list[Sequence[Any]] = field(default_factory=list)
    title: str = ""
    title_colour: str | None = None
    # (column, value) -> a CSS colour for the cell's text, or None
    colour: Callable[[str, Any], str | None] | None = None
    max_width: int = 48

    @classmethod
    def from_dicts(cls, records: Sequence[dict], title: str = "", **kw) -> "Table":
        columns = list(dict.fromkeys(k for r in records for k in r))
        return cls(columns, [[r.get(c, "") for c in columns] for r in records], title, **kw)

    def _repr_html_(self) -> str:
        def cell(col: str, value: Any) -> str:
            text = html.escape(_text(value))
            colour = self.colour(col, value) if self.colour else None
            if colour:
                text = f"<b style='color:{colour}'>{text}</b>"
            return f"<td style='text-align:left;vertical-align:top'>{text}</td>"

        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(cell(c, v) for c, v in zip(self.columns, r)) + "</tr>"
                       for r in self.rows)
        title = ""
        if self.title:
            style = f" style='color:{self.title_colour}'" if self.title_colour else ""
            title = f"<h4{style}>{html.escape(self.title)}</h4>"
        return f"<div class='sparkbook-table'>{title}<table><thead><tr>{head}</tr></thead>" \
               f"<tbody>{body}</tbody></table></div>"

    def to_text(self) -> str:
        rows = [list(map(_text, self.columns))] + [[_text(v) for v in r] for r in self.rows]
        widths = [min(max(len(r[i]) for r in rows), self.max_width) for i in range(len(self.columns))]
        cut = lambda s, w: s if len(s) <= w else s[: w - 1] + "…"
        lines = ["  ".join(cut(v, w).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        out = [lines[0], "-" * max(len(lines[0]), 1), *lines[1:]]
        return "\n".join(([self.title] if self.title else []) + out)

    def to_markdown(self) -> str:
        """A GitHub-flavoured Markdown table (the title a bold line above it), cells whole: a ``|``
        escaped, a line break made a space."""
        cell = lambda v: _text(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines = ["| " + " | ".join(map(cell, self.columns)) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(map(cell, r)) + " |" for r in self.rows]
        return "\n".join(([f"**{cell(self.title)}**", ""] if self.title else []) + lines)

    __str__ = to_text

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython's text form (logs, terminals)
        printer.text(self.to_text())

    def write_csv(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(map(_text, self.columns))
            w.writerows([_text(v) for v in r] for r in self.rows)
        return path
