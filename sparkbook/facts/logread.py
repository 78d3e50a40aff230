"""A log file read once, line by line, in bounded memory: each line cut to a little over
``signatures.LINE_WIDTH`` characters (the rest of a longer line is read past, never held) and bytes
that are not UTF-8 replaced. ``sparkbook diagnose`` reads its files through it, and 05 the logs it
collected, so that a log of any size (or a binary file given by mistake) costs the same memory.

Standard library and sparkbook.facts (signatures, phases) only, like signatures itself.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import IO, Iterator

from .phases import PhaseScan, Reached
from .signatures import LINE_WIDTH, Match, Scan, clean

# The lines an nccl-tests output is read from (sparkbook.collectives.nccltests.parse): its '#' lines (the
# header, the ranks, the average), its name (all_reduce_perf) and its rows (size, count, ...),
# behind an mpirun --tag-output or pdsh prefix; at most TABLE_CHARS of them are kept.
_TABLE_LINE = re.compile(r"(?:\[\d+,\d+\]<std\w+>:|\S+: )?\s*\d+\s+\d+(?:\s|$)")
TABLE_CHARS = 4 * 2**20


def read_lines(stream: IO) -> Iterator[str]:
    """The lines of ``stream`` (binary, or text), without their newlines, each cut to
    LINE_WIDTH + 1 characters at most (so that signatures.clean marks the cut)."""
    while chunk := stream.readline(LINE_WIDTH + 1):
        nl = "\n" if isinstance(chunk, str) else b"\n"
        if chunk.endswith(nl):
            chunk = chunk[:-1]
        elif len(chunk) > LINE_WIDTH:  # a longer line: read past its rest, to its newline
            while (rest := stream.readline(2**16)) and not rest.endswith(nl):
                pass
        yield chunk if isinstance(chunk, str) else chunk.decode("utf-8", "replace")


def file_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a log file, as :func:`read_lines` reads them."""
    with open(path, "rb") as f:
        yield from read_lines(f)


@dataclass
class Read:
    """A log read for ``sparkbook diagnose``: the known failures it names, how many lines it has,
    the lines of an nccl-tests table it may hold (for nccltests.parse), and the engine that wrote
    it with the phase of its start-up it reached."""
    matches: list[Match]
    lines: int
    table: str
    reached: Reached


def read(name: str, source: str = "") -> Read:
    """Read the log file ``name`` (``-`` for stdin) once; an OSError says it cannot be read."""
    scan, phases, table, kept = Scan(source=source or name), PhaseScan(), [], 0
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    with open(name, "rb") if name != "-" else nullcontext(stdin) as f:
        for line in read_lines(f):
            scan.feed(line)
            phases.feed(clean(line))
            if kept < TABLE_CHARS and ("#" in line or "_perf" in line or _TABLE_LINE.match(line)):
                table.append(line)
                kept += len(line) + 1
    return Read(scan.matches(), scan.lines, "\n".join(table), phases.reached)

