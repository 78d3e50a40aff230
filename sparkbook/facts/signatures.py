"""Known failure signatures in vLLM, NCCL, Ray, torch and Docker logs: one table (known_failures.py),
matched line by line, naming a cause and its remedy. 02 (the all-reduce sweep), 05 (serving) and
``sparkbook diagnose LOG...`` read logs through it.

Each pattern matches the stable core of a message (the words its source code writes), not one
run's numbers, paths or prefixes: a line may carry a timestamp, a process prefix such as
``(RayWorkerWrapper pid=451, ip=192.168.100.11)``, a level (``ERROR 11-30 08:07:20 [core.py:708]``),
a ``docker compose`` service prefix or colour codes. The table runs from the most specific cause to
the most general: a line belongs to the first signature that matches it. The real log lines each
signature was written from are in tests/fixtures/logs/ with their sources.

No pattern takes time quadratic in a line (a line of binary must not hold a failed deployment's
GPUs while it is read): a repetition between two words is bounded (``.{0,200}``) or cannot hold
what follows it, and a line is matched on its first LINE_WIDTH characters. The inputs that made
the old patterns backtrack time each pattern in tests/test_signatures_worst_case.py.

Standard library only, and nothing from the rest of sparkbook: a person can read a log with it on
any machine.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Iterable

from ..book.redact import CONTROL
from .known_failures import SIGNATURES, Signature

# Lines that say nothing about where a log stopped: the shutdown that follows a kill (05 stops
# what hangs), blank lines and bare process prefixes.
_NOISE = re.compile(r"SIGTERM|Shutting down|shutdown complete|Terminated|[Kk]illed|received signal|"
                    r"KeyboardInterrupt|Parent process exited|Stopping|^\s*$")
_PREFIX = re.compile(r"\s*\((?:[\w.:-]+ )*pid=\d+(?:, ip=(?P<ip>[\d.:a-fA-F]+))?\)\s*")  # at a position
LINE_WIDTH = 8192  # a line is matched on this much: the longest real one (vLLM's config) is ~3,200

# Any error-looking line, for a failure no signature names ("the last error seen").
ERROR_LINE = re.compile(r"(NCCL WARN|Error|error:|Connection refused|timed out|Timeout)", re.I)


@dataclass
class Match:
    """A signature found in a log: the evidence is the last line that matched (cleaned of colour
    codes), ``line`` its number (1-based, counting newlines), ``count`` how many lines matched."""
    name: str
    cause: str
    remedy: str
    evidence: str
    line: int
    count: int = 1
    phase: str = "any"
    detail: str = ""
    source: str = ""  # the file it was read from, where a caller sets it
    reason: str = "configuration"  # the class of the cause and of the remedy (known_failures.REASONS,
    fix: str = "setting"           # FIXES)
    catch_all: bool = False        # the signature names a family of causes, not one

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.source else f"line {self.line}"

    def to_json(self) -> dict:
        return asdict(self)


BY_NAME = {s.name: s for s in SIGNATURES}
ORDER = {s.name: i for i, s in enumerate(SIGNATURES)}


def clean(line: str) -> str:
    """A log line without terminal control sequences (colour codes, titles, clipboard writes, other
    control characters) and carriage returns, cut to LINE_WIDTH characters ("…" where it was cut)."""
    cut = len(line) > LINE_WIDTH
    return CONTROL.sub("", line[:LINE_WIDTH]).replace("\r", " ").rstrip() + ("…" if cut else "")


def _prefixes(line: str) -> tuple[list[str], str]:
    """A line's process prefixes (``(EngineCore_DP0 pid=1392) (RayWorkerWrapper pid=451,
    ip=192.168.100.11)``): the node addresses they name, and what the line says after them."""
    ips, at = [], 0
    while (m := _PREFIX.match(line, at)):
        ips += [m["ip"]] if m["ip"] else []
        at = m.end()
    return ips, line[at:].strip()


def _said(line: str) -> str:
    """What a line says once its process prefixes are removed (empty for a bare prefix)."""
    return _prefixes(line)[1]


def ray_address(line: str) -> str | None:
    """The node address a Ray worker's prefix names in a log line (``ip=10.77.1.12``), or None."""
    return next(iter(_prefixes(clean(line))[0]), None)


def _evidence(line: str, sig: Signature, width: int = 300) -> str:
    """The line, cut to ``width`` characters around where the signature matched."""
    line = line.strip()
    if len(line) <= width:
        return line
    starts = [m.start("at" if "at" in p.groupindex else 0) for p in sig.patterns if (m := p.search(line))]
    start = max(0, min(min(starts, default=0) - width // 3, len(line) - width))
    return ("…" if start else "") + line[start:start + width] + ("…" if start + width < len(line) else "")


# Every pattern in one expression: one search rules out a line that matches nothing (nearly all).
_ANY = re.compile("|".join(f"(?{'i' if p.flags & re.I else ''}:{p.pattern})"
                           for s in SIGNATURES for p in s.patterns))


def _first(table: list[Signature], line: str) -> Signature | None:
    """The first signature of ``table`` that matches ``line``."""
    if not _ANY.search(line):
        return None
    return next((sig for sig in table if sig.matches(line)), None)


class Scan:
    """What :func:`match` finds, read line by line in bounded memory (``feed`` each, then ``matches``):
    a line is held until the next says whether a message wraps across them; of the rest each
    signature keeps its count, its last line and whether a later line voided it."""

    def __init__(self, step: str | None = None, source: str = ""):
        self.table = [s for s in SIGNATURES if step is None or step in s.steps]
        self.source, self.lines = source, 0
        self.hits: dict[str, list] = {}  # name -> [lines claimed, the last one's index, its text]
        self.cleared: set[str] = set()  # claimed, then voided by a later line (cleared_by)
        self.said: tuple[int, str | None] = (-1, None)  # the last line not noise, and who claimed it
        self.clearing = [s for s in self.table if s.cleared_by]
        self.details = {s.detail.pattern: s.detail for s in self.table if s.detail}
        self.detail: dict[str, list] = {}  # pattern -> [what its last line says, waits for the next]
        self.held: tuple[int, str, Signature | None] | None = None

    def feed(self, line: str) -> None:
        """Read the next line (without its newline)."""
        i, line = self.lines, clean(line)
        self.lines += 1
        alone = _first(self.table, line)
        if self.held:
            self._settle(line, alone)
        for s in self.clearing:
            if s.name in self.hits and s.cleared_by.search(line):
                self.cleared.add(s.name)
        said = _said(line)
        if not _NOISE.search(said):
            self.said = (i, None)
        for key, pattern in self.details.items():
            if (last := self.detail.get(key)) and last[1]:  # "Last error:" says it on the next line
                last[:] = [f"{last[0]} {said}", False]
            if pattern.search(line):
                self.detail[key] = [said, said.endswith("Last error:")]
        self.held = (i, line, alone)

    def _settle(self, after: str | None, after_alone: Signature | None = None) -> None:
        """Claim the held line for the first signature that matches it, alone or (when neither it
        nor the next line matches one alone) joined to the next line as a wrapped message."""
        i, line, sig = self.held
        text, self.held = line, None
        if sig is None and after is not None and after_alone is None and line.strip():
            head, tail = line[-160:], after.lstrip()[:160]
            for glue in ("", " "):
                if tail and (sig := _first(self.table, head + glue + tail)):
                    text = line + glue + after.lstrip()
                    break
        if sig is not None:
            hit = self.hits.setdefault(sig.name, [0, i, text])
            hit[:] = [hit[0] + 1, i, text]
            self.cleared.discard(sig.name)
            if self.said[0] == i:
                self.said = (i, sig.name)

    def matches(self) -> list[Match]:
        """Every known failure read so far, most specific first (see :func:`match`)."""
        if self.held:
            self._settle(None)
        found = []
        for sig in self.table:
            voided = sig.name in self.cleared or (sig.hang and self.said[1] != sig.name)
            if sig.name not in self.hits or voided:
                continue
            count, last, text = self.hits[sig.name]
            detail = self.detail.get(sig.detail.pattern, [""])[0][-300:] if sig.detail else ""
            found.append(Match(sig.name, sig.cause, sig.remedy, _evidence(text, sig), last + 1, count,
                               sig.phase, detail, self.source, sig.reason, sig.fix, sig.catch_all))
        return found


def match(text: str | Iterable[str], step: str | None = None, source: str = "") -> list[Match]:
    """Every known failure in ``text`` (or in its lines, read one at a time), most specific first.
    A line belongs to the first signature (in table order) that matches it; ``step`` keeps the
    signatures that apply to that step. A signature with ``cleared_by`` is dropped when a later
    line shows the start-up went on; a ``hang`` signature counts only when its line is the last
    thing the log says (shutdown noise after it aside). A message hard-wrapped onto the next line
    (a log pasted from a terminal or a web page) is read across the break."""
    scan = Scan(step, source)
    for line in text.split("\n") if isinstance(text, str) else text:
        scan.feed(line)
    return scan.matches()


def first(text: str | Iterable[str], step: str | None = None) -> Match | None:
    """The most specific known failure in ``text``, or None."""
    found = match(text, step)
    return found[0] if found else None


def most_specific(texts: dict[str, str | Iterable[str]], step: str | None = None) -> Match | None:
    """The most specific known failure across several logs (``source`` -> text, or its lines),
    each read on its own, or None."""
    hits = [found[0] for source, text in texts.items() if (found := match(text, step, source))]
    return min(hits, key=lambda h: ORDER[h.name], default=None)


def last_error(text: str, width: int = 200) -> str:
    """The last error-looking line of ``text`` (for a failure no signature names), or ''."""
    errors = [ln for line in text.split("\n") if ERROR_LINE.search(ln := clean(line))]
    return _said(errors[-1])[:width] if errors else ""
