"""The front page (``notebooks/index.ipynb``): choose a parameters file, see where its deployment
stands (:mod:`sparkbook.record.status`), open a step's notebook, run one step or the rest.

The picture is a plain display output (HTML, with a text form), so it shows wherever the notebook
runs: JupyterLab, papermill, a report. The controls are ipywidgets; without a widget frontend
(papermill, nbclient) they show as text and nothing waits on them. Choosing another file redraws
the picture in place (a display update).

A run is ``sparkbook run -p FILE --steps ... --out RUN_DIR`` in a subprocess, its output (secrets
masked) streamed into the page; one at a time per front page kernel (``sparkbook run`` holds the
deployment's lock for the whole run, so a run from elsewhere is refused meanwhile); when the
kernel exits (shut down, restarted), the run gets Ctrl-C: it stops its step and runs the teardown.
It writes into the run folder that notebooks opened by hand in this JupyterLab use
(``$SPARKBOOK_RUN_DIR``, for the parameters file they read, else ``outputs/interactive-<name>``),
or the page's ``run_dir`` when it names one: never into the newest run folder of a ``sparkbook
run`` from a terminal, whose summary it would replace.
"""

from __future__ import annotations

import atexit
import html
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

from ..book.errors import SparkbookError
from ..book.project import project_root
from ..book.redact import mask
from ..book.verdict import link_steps
from ..notebook import default_run_dir
from ..params import default_params_file, load
from ..record.status import Picture, nodes_now, picture


def parameters_files(given: str | Path | None = None, root: Path | None = None) -> list[Path]:
    """The parameters files to choose from: ``parameters/*.yaml``, ``$SPARKBOOK_PARAMS`` and
    ``given``, each once, absolute."""
    found = sorted((root or project_root()).joinpath("parameters").glob("*.yaml"))
    env = os.environ.get("SPARKBOOK_PARAMS")
    extra = [Path(p).expanduser() for p in (env, given) if p]
    return list(dict.fromkeys(p.resolve() for p in [*found, *extra]))


def label(path: Path, root: Path | None = None) -> str:
    """``parameters/lab.yaml`` for the project's files, the absolute path for others."""
    try:
        return str(path.relative_to(root or project_root()))
    except ValueError:
        return str(path)


def run_command(params_file: str | Path, steps: Sequence[str], run_dir: str | Path) -> list[str]:
    """``sparkbook run`` of ``steps`` into ``run_dir``, as an argument list (no shell). The paths
    are absolute, so none can be read as an option; the step names are the notebooks' stems."""
    if not steps:
        raise SparkbookError("no step to run")
    return [sys.executable, "-m", "sparkbook.cli", "run", "--params", str(Path(params_file).resolve()),
            "--steps", ",".join(steps), "--out", str(Path(run_dir).expanduser().resolve())]


class Runner:
    """One ``sparkbook run`` at a time (per kernel: :data:`RUNNER`), its output line by line."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def busy(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, argv: list[str], write: Callable[[str], object],
              done: Callable[[int], object] = lambda code: None) -> bool:
        """Start ``argv`` unless a run is going (then False); ``write`` gets each line of its output
        (stdout and stderr, secrets masked), ``done`` its exit code."""
        if self.busy():
            return False
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=project_root(),
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, errors="replace",
                                     start_new_session=True)
        threading.Thread(target=self._pump, args=(self.proc, write, done), daemon=True).start()
        return True

    @staticmethod
    def _pump(proc: subprocess.Popen, write: Callable[[str], object], done: Callable[[int], object]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            write(mask(line))
        done(proc.wait())

    def stop(self) -> bool:
        """Ctrl-C to the run (``sparkbook run`` stops the step and runs the teardown)."""
        if not self.busy():
            return False
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        return True


RUNNER = Runner()
atexit.register(RUNNER.stop)  # a kernel that exits stops its run (which then tears down)


def picture_html(pic: Picture) -> str:
    """The picture as HTML: its headline, then the same table as its text form, each step's name a
    relative link to its notebook (JupyterLab opens it in a tab)."""
    lines = "<br>".join(html.escape(line) for line in pic.headline().splitlines())
    return mask(f"<div class='sparkbook-frontpage'><p>{lines}</p>{link_steps(pic.table()._repr_html_())}</div>")


class View:
    """A display output with a text and an HTML form."""

    def __init__(self, text: str, html_text: str | None = None):
        self.text, self.html = text, html_text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str | None:
        return self.html


class FrontPage:
    """The page's state: the chosen parameters file, its picture, and the widgets that act on it."""

    def __init__(self, params_file: str | Path | None = None, run_dir: str | Path | None = None):
        self.files = parameters_files(params_file)
        self.path = Path(params_file or default_params_file()).expanduser().resolve()
        self.given = run_dir
        self.pic: Picture | None = None
        self.widgets: dict = {}  # by what they say, once shown

    @property
    def run_dir(self) -> str | Path | None:
        """The run folder shown: the page's ``run_dir``, else the one the notebooks opened by hand
        in this JupyterLab use ($SPARKBOOK_RUN_DIR), while the chosen file is the one they read;
        else (None) the deployment's newest."""
        if self.given or not os.environ.get("SPARKBOOK_RUN_DIR"):
            return self.given or None
        return os.environ["SPARKBOOK_RUN_DIR"] if self.path == Path(default_params_file()).expanduser().resolve() else None


    def look(self) -> View:
        """Read the chosen parameters file and its run folder (again): the picture, or why there
        is none (a file that does not validate is said, not raised)."""
        try:
            self.pic = picture(load(self.path), self.path, self.run_dir)
        except SparkbookError as e:
            self.pic, said = None, mask(f"{self.path}: {e}")
            return View(said, f"<pre>{html.escape(said)}</pre>")
        return View(mask(self.pic.to_text()), picture_html(self.pic))

    def steps(self) -> list[str]:
        return [s.name for s in self.pic.steps] if self.pic else []

    def show(self) -> None:
        """The parameters files to choose from, the picture, the run controls and their output."""
        import ipywidgets as w
        from IPython.display import display

        choose = w.Dropdown(options=[(label(p), str(p)) for p in self.files], value=str(self.path),
                            description="parameters", layout=w.Layout(width="60%"))
        display(choose)
        shown = display(self.look(), display_id=True)
        step = w.Dropdown(description="step", options=self.steps(), value=self.pic and self.pic.next_step())
        one, rest = w.Button(description="run this step"), w.Button(description="run from here to the end")
        stop, ask = w.Button(description="stop the run"), w.Button(description="nodes now")
        log = w.Output(layout=w.Layout(max_height="24em", overflow="auto"))
        display(w.VBox([w.HBox([step, one, rest, stop, ask]), log]))
        nodes = display(View("(the nodes are asked when you press 'nodes now')"), display_id=True)

        def redraw(_=None) -> None:
            self.path = Path(choose.value)
            shown.update(self.look())
            step.options, step.value = self.steps(), self.pic and self.pic.next_step()

        def run(names: list[str]) -> None:
            try:
                argv = run_command(self.path, names, self.run_dir or default_run_dir(load(self.path), use_env=False))
            except SparkbookError as e:
                log.append_stdout(f"{e}\n")
                return
            if RUNNER.busy():  # its output stays
                log.append_stdout("a run started here is still going: wait for it, or stop it\n")
                return
            log.clear_output()
            log.append_stdout(shlex.join(["sparkbook", *argv[3:]]) + "\n")
            RUNNER.start(argv, log.append_stdout, ended)

        def ended(code: int) -> None:
            log.append_stdout(f"sparkbook run ended: exit code {code}\n")
            redraw()

        def ask_nodes(_) -> None:
            try:
                table, endpoint = nodes_now(load(self.path))
            except SparkbookError as e:
                nodes.update(View(str(e)))
                return
            nodes.update(View(f"{table.to_text()}\n{endpoint}",
                              f"{table._repr_html_()}<p>{html.escape(endpoint)}</p>"))

        names = self.steps
        choose.observe(redraw, names="value")
        one.on_click(lambda _: run([step.value] if step.value else []))
        rest.on_click(lambda _: run(names()[names().index(step.value):] if step.value in names() else []))
        stop.on_click(lambda _: log.append_stdout("stopping: Ctrl-C to sparkbook run\n" if RUNNER.stop()
                                                  else "no run is going\n"))
        ask.on_click(ask_nodes)
        self.widgets = {"parameters": choose, "step": step, "run this step": one, "run from here": rest,
                        "stop": stop, "nodes now": ask, "log": log}
