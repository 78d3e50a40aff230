"""Live progress for long work (copies, model loading, benchmarks), one line per item.

In a notebook the lines are one display updated in place; the executed notebook keeps the last
state, so a shared report shows where each item ended (a widget would show its first frame).
Elsewhere (a terminal, a log) the lines are printed when they change, at most every few seconds.
"""

from __future__ import annotations

import sys
import threading
import time

from .tables import human_bytes


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def bar(done: float, total: float | None, started: float, now: float | None = None,
        unit: str = "bytes") -> str:
    """``[#####.....]  52%  2.1 GiB of 4.0 GiB  95 MB/s  ETA 0:00:21``"""
    now = now if now is not None else time.monotonic()
    took = max(now - started, 1e-9)
    rate = done / took
    amount = human_bytes if unit == "bytes" else (lambda v: f"{v:,.0f} {unit}")
    if not total:
        return f"{amount(done)}  {rate / 1e6:.0f} MB/s" if unit == "bytes" else f"{amount(done)}"
    frac = min(done / total, 1.0)
    eta = (total - done) / rate if rate > 0 and done < total else 0
    speed = f"{rate / 1e6:.0f} MB/s" if unit == "bytes" else f"{rate:.1f} {unit}/s"
    return (f"[{'#' * round(frac * 20):.<20}] {frac:4.0%}  {amount(done)} of {amount(total)}  {speed}  "
            f"ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}")


class Progress:
    """``with Progress("copy") as p: p.update("spark-2", "...")``; thread-safe."""

    def __init__(self, title: str, interval: float | None = None):
        self.title, self.lines = title, {}
        self.notebook = _in_notebook()
        self.interval = interval if interval is not None else (1.0 if self.notebook else 10.0)
        self.lock = threading.Lock()
        self.shown = 0.0
        self.handle = None

    def text(self) -> str:
        return "\n".join([self.title] + [f"  {k}: {v}" for k, v in self.lines.items()])

    def update(self, key: str, line: str, force: bool = False) -> None:
        with self.lock:
            changed = self.lines.get(key) != line
            self.lines[key] = line
            if changed and (force or time.monotonic() - self.shown >= self.interval):
                self._show()

    def _show(self) -> None:
        self.shown = time.monotonic()
        if self.notebook:
            from IPython.display import display
            data = {"text/plain": self.text()}
            if self.handle is None:
                self.handle = display(data, raw=True, display_id=True)
            else:
                self.handle.update(data, raw=True)
        else:
            print(self.text(), file=sys.stdout, flush=True)

    def close(self) -> None:
        with self.lock:
            if self.lines:
                self._show()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
