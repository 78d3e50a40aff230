"""Errors that are shown to people as a short explanation, not as a traceback."""

from __future__ import annotations


class SparkbookError(Exception):
    """An error whose message says everything: what failed, where, and what to do.

    In a notebook, IPython shows only the message (``_render_traceback_``), so a failed check
    reads as a verdict instead of a wall of frames; the cell still fails, so papermill stops.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[1;31m{type(self).__name__}\x1b[0m", *str(self).splitlines()]


class CheckFailed(SparkbookError):
    """One or more checks of a notebook failed. ``verdict``: the step's verdict when the failure
    is one (:meth:`~sparkbook.book.verdict.Verdict.raise_for_failures`), for whoever catches it to
    read its rows; None for a failure outside any verdict (a node that refused a command)."""

    def __init__(self, message: str, verdict: object | None = None):
        super().__init__(message)
        self.verdict = verdict
