"""A copy's progress while it runs: whole lines of a streamed command and the numbers in them; and
how long a node-to-node copy may go without any before it fails."""

from __future__ import annotations

from typing import Callable

# A copy to one worker that moves no data for this long fails, by name, and the others go on: the
# image stream's per-worker writers, and rsync's --timeout for the model.
STALL_S = 120


class Lines:
    """A text sink (for :meth:`Cluster.run`'s ``stream``) that hands each whole line to ``each``."""

    def __init__(self, each: Callable[[str], None]):
        self.each, self.buf = each, ""

    def write(self, s: str) -> int:
        self.buf += s
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            self.each(line)
        return len(s)

    def flush(self) -> None:
        pass


def number(text: str) -> int:
    """``"1,234,567"`` -> ``1234567``."""
    return int(text.replace(",", ""))
