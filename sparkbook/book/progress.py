"""Live progress for long work (copies, model loading, vLLM's start-up, benchmarks), a row per item:
its key, a bar where the fraction done is known, and a line of text.

* In JupyterLab (a kernel that a Jupyter server started, with ipywidgets): one display holding an
  ipywidgets view (a row per key with a progress bar) beside text/plain and text/html snapshots of
  the first state. The widget changes live; when the work ends (``close``), the display becomes the
  snapshot of the end state alone and the widget is closed. See ``_Widgets`` for why.
* In any other kernel (``sparkbook run``: papermill, nbclient): one text/plain + text/html display
  updated in place at ``interval``; the executed notebook keeps the last state.
* Elsewhere (a terminal, a log): the lines printed when they change, at most every ``interval``.
"""

from __future__ import annotations

import html
import importlib.util
import os
import sys
import threading
import time

from .redact import CONTROL
from .tables import human_bytes

# A row of the widget changes at most this often: a copy's rsync says something many times a second.
LIVE_S = 0.5
def printable(line: str) -> str:
    """``line`` (a node wrote it) without terminal control sequences, so that it cannot drive the
    operator's terminal: CSI colours and cursor moves, OSC titles and clipboard writes and the like
    (:data:`sparkbook.book.redact.CONTROL`); a newline or carriage return becomes a space."""
    return CONTROL.sub("", line).replace("\r", " ").replace("\n", " ")


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _widgets_shown() -> bool:
    """Whether a front end that draws widgets likely watches this kernel: jupyter_server starts a
    notebook's kernel with JPY_SESSION_NAME (the notebook's path); papermill and nbclient do not,
    and their executed notebooks only need the text.
    source: https://github.com/jupyter-server/jupyter_server jupyter_server/services/sessions/
    sessionmanager.py get_kernel_env (2.21.1, in .venv)"""
    return bool(os.environ.get("JPY_SESSION_NAME")) and importlib.util.find_spec("ipywidgets") is not None


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


def fraction_of(done: float, total: float | None) -> float | None:
    """``done / total`` within 0..1; None when the total is unknown."""
    return min(max(done / total, 0.0), 1.0) if total else None


class _Widgets:
    """The live view: a VBox of the title and a row per key (label, bar, line), each widget made
    once and then only changed.

    Why it ends as text: JupyterLab draws a widget-view output only while the kernel holds its
    model; a notebook saved and reopened later shows "Error displaying widget: model not found"
    in its place (jupyterlab_widgets 3.0.17, WidgetRenderer.renderModel, no fallback to the
    output's text/html), and every update of a display holding a widget view makes JupyterLab
    draw a new view (OutputArea._setOutput calls renderModel again for the same mime type), so
    the text beside the widget is not refreshed while it runs; at the end the display is
    replaced by the end state's snapshot (text/html in JupyterLab and the report, text/plain in
    terminals), which a reopened notebook shows as it was.
    source: the installed bundles (.venv/share/jupyter/labextensions/@jupyter-widgets/jupyterlab-manager
    and lab/static/jlab_core); their sources: https://github.com/jupyter-widgets/ipywidgets
    python/jupyterlab_widgets/src/renderer.ts (8.x branch; main @09a10209 shows the text/plain
    instead where no kernel runs), https://github.com/jupyterlab/jupyterlab
    packages/outputarea/src/widget.ts @64fb07977ace629a9fb977cb89cb536903ebf8c2"""

    def __init__(self, title: str):
        import ipywidgets as w
        self.w = w
        self.box = w.VBox([w.HTML(f"<b>{html.escape(title)}</b>")])
        self.box.add_class("sparkbook-progress")
        self.rows: dict[str, tuple] = {}
        self.drawn: dict[str, tuple[str, float | None]] = {}
        self.when: dict[str, float] = {}

    def bundle(self) -> dict:
        return self.box._repr_mimebundle_()

    def draw(self, key: str, line: str, frac: float | None) -> None:
        w = self.w
        if key not in self.rows:
            label = w.Label(key, layout=w.Layout(width="12em"))
            bar_ = w.FloatProgress(min=0.0, max=1.0, layout=w.Layout(width="14em"))
            text = w.HTML()
            self.rows[key] = label, bar_, text
            self.box.children = (*self.box.children, w.HBox([label, bar_, text]))
        _, bar_, text = self.rows[key]
        bar_.layout.visibility = "hidden" if frac is None else "visible"
        bar_.value = frac or 0.0
        text.value = f"<code>{html.escape(line)}</code>"
        self.drawn[key] = line, frac

    def refresh(self, lines: dict[str, str], fractions: dict[str, float | None], force: bool) -> bool:
        """Draw the rows that changed and were last drawn ``LIVE_S`` ago or more (all with
        ``force``); whether a row is left to draw."""
        now, left = time.monotonic(), False
        for key, line in lines.items():
            state = line, fractions.get(key)
            if self.drawn.get(key) == state:
                continue
            if force or now - self.when.get(key, -LIVE_S) >= LIVE_S:
                self.draw(key, *state)
                self.when[key] = now
            else:
                left = True
        return left

    def close(self) -> None:
        for widget in [self.box, *self.box.children, *(x for row in self.rows.values() for x in row)]:
            widget.close()


class Progress:
    """``with Progress("copy") as p: p.update("spark-2", "...", fraction=0.4)``; thread-safe."""

    def __init__(self, title: str, interval: float | None = None):
        self.title, self.lines, self.fractions = title, {}, {}
        self.notebook = _in_notebook()
        self.interval = interval if interval is not None else (1.0 if self.notebook else 10.0)
        self.lock = threading.Lock()
        # never shown yet: monotonic() counts from boot, which may be less than an interval ago
        self.shown = float("-inf")
        self.stale = False  # a change not shown yet (it came within the interval)
        self.handle = None
        self.widgets: _Widgets | None = None
        self.live = self.notebook and _widgets_shown()
        self.timer: threading.Timer | None = None  # draws the rows left when updates stop

    def text(self) -> str:
        return "\n".join([self.title] + [f"  {k}: {v}" for k, v in self.lines.items()])

    def html(self) -> str:
        """The state as a table: a row per key, with a bar where the fraction done is known."""
        rows = []
        for key, line in self.lines.items():
            frac = self.fractions.get(key)
            meter = "" if frac is None else f"<progress value='{frac:.3f}' max='1'></progress> {frac:.0%}"
            rows.append(f"<tr><td style='text-align:left'>{html.escape(key)}</td>"
                        f"<td style='text-align:left;white-space:nowrap'>{meter}</td>"
                        f"<td style='text-align:left'><code>{html.escape(line)}</code></td></tr>")
        return (f"<div class='sparkbook-progress'><b>{html.escape(self.title)}</b>"
                f"<table><tbody>{''.join(rows)}</tbody></table></div>")

    def snapshot(self) -> dict:
        return {"text/plain": self.text(), "text/html": self.html()}

    def update(self, key: str, line: str, force: bool = False, fraction: float | None = None) -> None:
        """Set ``key``'s line and, where known, the fraction of its work done (0..1)."""
        line = printable(line)
        with self.lock:
            changed = (self.lines.get(key), self.fractions.get(key)) != (line, fraction)
            self.lines[key], self.fractions[key] = line, fraction
            self.stale = self.stale or changed
            if self.live:
                self._live(force)
            elif self.stale and (force or time.monotonic() - self.shown >= self.interval):
                self._show()  # a change held back is shown by the next update past the interval

    def _live(self, force: bool) -> None:
        if self.widgets is None:
            self.widgets = _Widgets(self.title)
            self.widgets.refresh(self.lines, self.fractions, True)
            from IPython.display import display
            self.handle = display({**self.widgets.bundle(), **self.snapshot()}, raw=True, display_id=True)
        elif self.widgets.refresh(self.lines, self.fractions, force) and self.timer is None:
            self.timer = threading.Timer(LIVE_S, self._catch_up)
            self.timer.daemon = True
            self.timer.start()

    def _catch_up(self) -> None:
        with self.lock:
            self.timer = None
            if self.widgets is not None:
                self.widgets.refresh(self.lines, self.fractions, True)

    def _show(self) -> None:
        self.shown, self.stale = time.monotonic(), False
        if self.notebook:
            from IPython.display import display
            if self.handle is None:
                self.handle = display(self.snapshot(), raw=True, display_id=True)
            else:
                self.handle.update(self.snapshot(), raw=True)
        else:
            print(self.text(), file=sys.stdout, flush=True)

    def close(self) -> None:
        """Show the end state; a widget's display becomes its text snapshot (see ``_Widgets``)."""
        with self.lock:
            if not self.lines:
                return
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if self.widgets is not None:  # its models' last state right (nbclient can keep it)
                self.widgets.refresh(self.lines, self.fractions, True)
            self._show()
            if self.widgets is not None:
                self.widgets.close()
                self.widgets, self.live = None, False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
