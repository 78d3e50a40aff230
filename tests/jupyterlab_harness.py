"""JupyterLab, driven the way a person drives it, for the tests and the screenshots that open the
runbook's notebooks in a real JupyterLab (headless Chromium, tests/browser.py).

:func:`jupyterlab` starts ``jupyter lab`` on 127.0.0.1 with a random token over a COPY of
``notebooks/`` in a temporary folder (JupyterLab saves what it runs, and jupytext may write paired
files: the repository's notebooks never get outputs), with its own settings (no news or update
toasts, every cell attached to the page) and the kernels' ``$SPARKBOOK_PARAMS`` and
``$SPARKBOOK_RUN_DIR``. :class:`Lab` is the page: open a notebook, run all its cells, wait until
every code cell has run, read what the page shows (outputs by mime type, verdict headlines,
widgets), screenshot it. Nothing is injected into a notebook: it runs as it is in the repository.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import nbformat
import yaml

from browser import chromium
from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
JUPYTER = Path(sys.executable).with_name("jupyter")

# User settings, one file per plugin, in $JUPYTERLAB_SETTINGS_DIR.
# source: https://github.com/jupyterlab/jupyterlab/blob/137cd4531e4b250142982d17ca06b83dce228d79/packages/apputils-extension/schema/notification.json
# source: https://github.com/jupyterlab/jupyterlab/blob/3fd8d58334e92a53f43f5cc3c812156aa4fa947a/packages/notebook-extension/schema/tracker.json
SETTINGS = {
    # no news feed, no update check, no toast over the page
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False,
                                                     "doNotDisturbMode": True},
    # every cell in the page, not only those in view: the checks read the whole notebook's DOM
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}

# What the page observes while cells run: widgets that appeared (a progress bar may be replaced by
# its text snapshot once its work ends, so the end state alone would miss it). ipywidgets 8 draws
# a progress bar as .jupyter-widgets.widget-hprogress (vertical: widget-vprogress)
# source: https://github.com/jupyter-widgets/ipywidgets/blob/1a357c96351b69bb76e4292e3fc37ae4508d355c/packages/controls/src/widget_int.ts
OBSERVE = """
const BARS = '.widget-hprogress, .widget-vprogress';
window.__seen = {widgets: 0, progress: 0};
new MutationObserver(records => {
  for (const r of records) for (const n of r.addedNodes) {
    if (n.nodeType !== 1) continue;
    if (n.matches('.jupyter-widgets') || n.querySelector('.jupyter-widgets')) window.__seen.widgets++;
    if (n.matches(BARS) || n.querySelector(BARS)) window.__seen.progress++;
  }
}).observe(document, {childList: true, subtree: true});
"""

OPEN = """async path => {
  const app = window.jupyterapp;
  await app.restored;
  const w = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await w.context.ready;
  await w.sessionContext.ready;
  app.shell.activateById(w.id);
  window.__nb = w;
  return w.sessionContext.session.kernel.name;
}"""

RUN_ALL = """() => {
  const app = window.jupyterapp, w = window.__nb;
  window.__ran = null;
  window.__seen = {widgets: 0, progress: 0};
  app.shell.activateById(w.id);
  app.commands.execute('notebook:run-all-cells').then(
    r => { window.__ran = {ok: r === undefined ? null : r}; },
    e => { window.__ran = {error: String(e)}; });
}"""

# Whether run-all has finished: its command settled, no code cell queued or running ("[*]"), the
# kernel idle
STATE = """() => {
  const w = window.__nb, k = w.sessionContext.session && w.sessionContext.session.kernel;
  const prompts = w.content.widgets.filter(c => c.model.type === 'code')
    .map(c => (c.node.querySelector('.jp-InputArea-prompt') || {}).textContent || '');
  return {ran: window.__ran, kernel: k ? k.status : null, prompts};
}"""

# What the notebook shows: each output's mime type and text, the verdict tables' headlines, widgets
SHOWN = """() => {
  const n = window.__nb.content.node;
  return {
    outputs: Array.from(n.querySelectorAll('.jp-OutputArea-output'))
      .map(o => [o.dataset.mimeType || '', o.textContent.slice(0, 4000)]),
    headlines: Array.from(n.querySelectorAll('.sparkbook-table > h4')).map(h => h.textContent),
    links: Array.from(n.querySelectorAll('.jp-OutputArea-output a[href]')).map(a => a.getAttribute('href')),
    widgets: n.querySelectorAll('.jupyter-widgets').length,
    progress: n.querySelectorAll('.widget-hprogress, .widget-vprogress').length,
    seen: window.__seen,
  };
}"""

CLOSE = """async () => {
  const w = window.__nb;
  await w.context.save();
  await w.sessionContext.shutdown();
  w.dispose();
  window.__nb = null;
}"""

# The notebook's scrolling area: its whole height and the part of it in view; scrolled to the top
HEIGHTS = """() => {
  const o = window.__nb.content.node.querySelector('.jp-WindowedPanel-outer') || window.__nb.content.node;
  o.scrollTop = 0;
  return [o.scrollHeight, o.clientHeight];
}"""

ERROR_MIME = "application/vnd.jupyter.error"
STDERR_MIME = "application/vnd.jupyter.stderr"


def light_params(source: Path = ROOT / "parameters" / "lab.yaml") -> dict:
    """The lab's parameters made lighter for a run in the browser: the same 2 nodes and Ray
    executor, fewer benchmark levels and requests, 6 sequential burn-in requests (not 20), a short
    soak and all-reduce sweep."""
    data = yaml.safe_load(source.read_text())
    data["benchmark"].update(context_depths=[0, 512], concurrency=[1, 4], requests_per_level=4)
    data["smoke"].update(soak_s=3, requests=6)
    data["collectives"].update(max_size_mb=8, iters=3)
    return data


@dataclass
class Server:
    url: str
    token: str
    root: Path  # the copy of notebooks/ it serves
    run_dir: Path  # the kernels' $SPARKBOOK_RUN_DIR
    log: Path
    process: subprocess.Popen = field(repr=False)

    def api(self, path: str, method: str = "GET") -> Any:
        req = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _settings(folder: Path) -> None:
    for plugin, values in SETTINGS.items():
        path = folder / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@contextmanager
def jupyterlab(work: Path, params: dict, notebooks: Path = ROOT / "notebooks",
               startup_s: float = 90) -> Iterator[Server]:
    """``jupyter lab`` over a copy of ``notebooks`` in ``work``, its kernels reading ``params`` (a
    parameters file's data) and writing to ``work/run``; stopped with its kernels on leaving."""
    root, run_dir = work / "notebooks", work / "run"
    shutil.copytree(notebooks, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    run_dir.mkdir(mode=0o700)
    params_file = work / "params.yaml"
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    _settings(work / "settings")
    token = secrets.token_hex(24)
    env = {**os.environ, "SPARKBOOK_PARAMS": str(params_file), "SPARKBOOK_RUN_DIR": str(run_dir),
           "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(work / "workspaces"),
           "JUPYTER_CONFIG_DIR": str(work / "config"), "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
           "JUPYTER_TOKEN": token}  # in the environment, not on the command line
    port = free_port()
    log = work / "jupyterlab.log"
    cmd = [str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
           f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:  # the lab's tests run as root (network namespaces)
        cmd.append("--allow-root")
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", token, root, run_dir, log, process)
    try:
        _wait_up(server, startup_s)
        yield server
    finally:
        _stop(server)


def _wait_up(server: Server, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited ({server.process.returncode}):\n{server.log_tail()}")
        try:
            server.api("status")
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"jupyter lab did not answer in {limit_s:.0f} s:\n{server.log_tail()}")


def _stop(server: Server) -> None:
    """Its kernels shut down, then the server; what is left of its process group is killed."""
    try:
        for kernel in server.api("kernels"):
            server.api(f"kernels/{kernel['id']}", method="DELETE")
        server.api("shutdown", method="POST")
        server.process.wait(timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.process.pid, sig)  # the group this harness started (new session)
        except ProcessLookupError:
            return
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Shown:
    """What a notebook showed after run-all: outputs (mime type, text), verdict headlines, widgets
    in the page at the end and seen while it ran, and errors in the saved notebook."""

    outputs: list[tuple[str, str]]
    headlines: list[str]
    links: list[str]  # the outputs' links, as written
    widgets: int
    progress: int
    seen: dict[str, int]
    saved_errors: list[str]
    seconds: float

    @property
    def errors(self) -> list[str]:
        """Error outputs on the page and in the saved notebook; a stderr stream only when it holds
        a traceback."""
        page = [text[:400] for mime, text in self.outputs if mime == ERROR_MIME
                or (mime == STDERR_MIME and "Traceback (most recent call last)" in text)]
        return page + self.saved_errors


def saved_errors(path: Path) -> list[str]:
    """Errors in a saved notebook: error outputs, and stderr streams with a traceback."""
    found = []
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                found.append(f"cell {i}: {out.ename}: {out.evalue}"[:400])
            elif out.output_type == "stream" and out.name == "stderr" and "Traceback" in out.text:
                found.append(f"cell {i}: stderr: {out.text[-400:]}")
    return found


class Lab:
    """JupyterLab's page in headless Chromium, for ``server``; page errors (uncaught exceptions)
    are collected in ``page_errors``."""

    def __init__(self, page: Any, server: Server):
        self.page, self.server = page, server
        self.page_errors: list[str] = []
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        page.add_init_script(OBSERVE)
        page.goto(f"{server.url}/lab?token={server.token}", wait_until="load")
        page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
        page.evaluate("async () => { await window.jupyterapp.restored; window.jupyterapp.shell.collapseLeft(); }")

    def open(self, name: str) -> str:
        """Open ``name`` (a path under the served folder), its kernel started; its kernel's name."""
        return self.page.evaluate(OPEN, name)

    def run_all(self, name: str, limit_s: float) -> Shown:
        """Run all cells of the open notebook and wait until every code cell has run (or run-all
        stopped at an error); save it, and say what the page shows."""
        t0 = time.monotonic()
        self.start_all()
        return self.wait(name, limit_s, t0)

    def start_all(self) -> None:
        """Start running all cells of the open notebook (as its Run All menu item does)."""
        self.page.evaluate(RUN_ALL)

    def wait(self, name: str, limit_s: float, t0: float) -> Shown:
        """Wait until every code cell of the open notebook, started at ``t0``, has run (or run-all
        stopped at an error); save it, and say what the page shows."""
        deadline, idle = t0 + limit_s, 0
        while True:
            st = self.page.evaluate(STATE)
            done = st["ran"] is not None and st["kernel"] == "idle" and not any("*" in p for p in st["prompts"])
            idle = idle + 1 if done else 0
            if idle >= 2:  # twice in a row, a second apart: nothing left in the kernel's queue
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: cells still running after {limit_s:.0f} s: {st}")
            time.sleep(1)
        seconds = time.monotonic() - t0
        self.page.evaluate("async () => { await window.__nb.context.save(); }")
        shown = self.page.evaluate(SHOWN)
        return Shown([tuple(o) for o in shown["outputs"]], shown["headlines"], shown["links"], shown["widgets"],
                     shown["progress"], shown["seen"], saved_errors(self.server.root / name), seconds)

    def screenshot(self, path: Path, max_height: int = 14000) -> Path:
        """The whole open notebook, the page made as tall as its content."""
        size = self.page.viewport_size
        total, in_view = self.page.evaluate(HEIGHTS)
        self.page.set_viewport_size({"width": size["width"],
                                     "height": min(size["height"] - in_view + total + 40, max_height)})
        try:
            self.page.wait_for_timeout(500)  # layout after the resize
            self.page.evaluate(HEIGHTS)
            self.page.screenshot(path=str(path))
        finally:
            self.page.set_viewport_size(size)
        return path

    def close(self) -> None:
        """Save the open notebook, shut its kernel down and close it."""
        self.page.evaluate(CLOSE)


@contextmanager
def lab_page(server: Server) -> Iterator[Lab]:
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield Lab(page, server)
