"""The runbook stepped through in a real JupyterLab (headless Chromium, tests/jupyterlab_harness.py)
against the lab, as a person does it: each notebook 00..08 opened with nothing injected, all its
cells run, every code cell run without an error output, the verdict rendered (its headline with the
status the run folder's verdicts/NN_name.json holds), widgets drawn where work shows progress; then
all its cells run again in the same kernel, with the same status for every check (issue 16's
re-run test: re-running any cell, the setup cell included, gives the same checks). Then the front
page (notebooks/index.ipynb). A full-page screenshot of each notebook after its first run (and of
any that timed out) lands in the test's output folder, printed at the end.

The kernels read a lighter copy of parameters/lab.yaml (the same 2 nodes and Ray executor, fewer
benchmark levels, a short soak): the run takes about as long as `sparkbook run` on the lab.

The first test needs no lab: the harness itself sees an error, a traceback on stderr, a widget, and
no error where there is none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from jupyterlab_harness import Shown, jupyterlab, lab_page, light_params

STEPS = ["00_inventory", "01_preflight", "02_collectives", "03_distribute_image", "04_ray_cluster",
         "05_serve", "06_smoke_test", "07_benchmark", "08_teardown"]
# The notebooks whose work shows progress (sparkbook/book/progress.py): widgets appear while the cells
# run (vLLM's start-up per node in 05, the burn-in in 06, the benchmark levels in 07), and in 02 or
# 03 when the image is copied (a bar per worker; on a lab that earlier tests left with the image on
# every node, nothing is copied)
PROGRESS = {"05_serve", "06_smoke_test", "07_benchmark"}
COPIES = ("02_collectives", "03_distribute_image")
# Checks that judge this machine's own timing (the benchmark client's event-loop lag, the soak's
# latency drift): on the lab's 2 shared cores two passes need not agree on PASS or WARN, only that
# neither failed. Every other check keeps its status.
TIMED = {"load generator", "soak drift"}
LIMIT_S = 420  # one notebook's run-all: 05's start-up on the lab's 2 cores is the longest


def statuses(run_dir: Path, step: str) -> list[tuple[str, str, str]]:
    """(check, node, status) of every check in the step's saved verdict, in order."""
    data = json.loads((run_dir / "verdicts" / f"{step}.json").read_text())
    return [(c["check"], str(c["node"]), c["status"]) for c in data["checks"]]


def headline(run_dir: Path, step: str) -> str:
    """The start of the verdict's headline for the saved verdict: ``TITLE: STATUS``."""
    data = json.loads((run_dir / "verdicts" / f"{step}.json").read_text())
    return f"{data['title']}: {data['status']}"


@dataclass
class Stepped:
    """A notebook's two passes: what each showed, and its saved verdict's headline and statuses."""

    first: Shown
    second: Shown | None
    headline: str
    statuses: list[tuple[str, str, str]]
    headline_again: str = ""
    again: list[tuple[str, str, str]] | None = None


def _step(lab, server, out: Path, step: str) -> Stepped:
    lab.open(f"{step}.ipynb")
    verdict = server.run_dir / "verdicts" / f"{step}.json"
    try:
        first = lab.run_all(f"{step}.ipynb", LIMIT_S)
        lab.screenshot(out / f"{step}.png")
        if first.errors or not verdict.is_file():
            return Stepped(first, None, "", [])
        done, head, once = verdict.stat().st_mtime_ns, headline(server.run_dir, step), statuses(server.run_dir, step)
        second = lab.run_all(f"{step}.ipynb", LIMIT_S)
        assert verdict.stat().st_mtime_ns > done, f"{step}: the second run-all did not conclude again"
        return Stepped(first, second, head, once, headline(server.run_dir, step), statuses(server.run_dir, step))
    except TimeoutError:
        lab.screenshot(out / f"{step}-timeout.png")
        raise
    finally:
        lab.close()


@pytest.fixture(scope="module")
def stepped(lab, tmp_path_factory):
    """Every notebook run twice in JupyterLab, then the front page; after a notebook with an error,
    only 08 (so nothing is left running on the lab, as `sparkbook run` does)."""
    out = tmp_path_factory.mktemp("jupyterlab")
    results: dict[str, Stepped] = {}
    with jupyterlab(out / "server", light_params()) as server, lab_page(server) as page:
        for step in STEPS:
            failed = [s for s, r in results.items() if r.first.errors or r.second is None]
            if failed and step != "08_teardown":
                continue
            results[step] = _step(page, server, out, step)
        page.open("index.ipynb")
        front = page.run_all("index.ipynb", 120)
        page.screenshot(out / "index.png")
        front_text = "\n".join(o.get("data", {}).get("text/plain", "") for c in nbformat.read(
            server.root / "index.ipynb", as_version=4).cells for o in c.get("outputs", []))
        clicked = _press_the_buttons(page.page)
        page.screenshot(out / "index-after-the-buttons.png")
        page.close()
    print(f"\nJupyterLab screenshots and saved notebooks: {out}")
    for step, r in results.items():
        again = f", again {r.second.seconds:.0f} s" if r.second else ""
        errors = "".join(f"\n    error: {e}" for e in r.first.errors + (r.second.errors if r.second else []))
        print(f"  {step}: {r.headline or 'no verdict'}, run-all {r.first.seconds:.0f} s{again}{errors}")
    return results, (front, front_text, clicked), page.page_errors, server.run_dir


def _press_the_buttons(page) -> dict[str, str]:
    """On the front page: choose 00 and press *run this step* (a `sparkbook run` of 00 into the
    page's run folder, its output streamed into the page), then *nodes now*; what the page said."""
    page.locator(".widget-dropdown select").nth(1).select_option("00_inventory")
    page.get_by_role("button", name="run this step").click()
    ended = page.get_by_text("sparkbook run ended: exit code")
    ended.wait_for(timeout=180_000)
    out = {"run": page.locator(".widget-output").first.inner_text()}
    page.get_by_role("button", name="nodes now").click()
    page.get_by_text("endpoint http").wait_for(timeout=90_000)
    out["nodes"] = page.locator(".jp-OutputArea-output").filter(has_text="endpoint http").last.inner_text()
    out["state"] = page.locator(".sparkbook-frontpage").first.inner_text()
    return out


@pytest.mark.slow
def test_the_harness_sees_errors_tracebacks_and_widgets(tmp_path):
    """Without the lab: a notebook that raises shows its error (and the cells after it never ran),
    a traceback printed on stderr counts as an error and a warning on stderr does not, and a widget
    drawn while the cells run is seen even when the cell replaces it by text at its end."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    code = nbformat.v4.new_code_cell
    cells = {
        "fails": [code("print('before')"), code("raise ValueError('boom in cell 1')"), code("print('after')")],
        "stderr": [code("import sys, traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
                        "    traceback.print_exc()")],
        "warns": [code("import sys\nprint('a warning, not an error', file=sys.stderr)")],
        "widget": [code("import time, ipywidgets as w\nfrom IPython.display import display, HTML\n"
                        "bar = w.IntProgress(value=3, max=10)\nh = display(bar, display_id=True)\n"
                        "time.sleep(2)\nh.update(HTML('<p>done</p>'))\nbar.close()")],
    }
    for name, cs in cells.items():
        nbformat.write(nbformat.v4.new_notebook(cells=cs, metadata={"kernelspec": {
            "name": "python3", "display_name": "Python 3", "language": "python"}}), nbs / f"{name}.ipynb")
    shown = {}
    with jupyterlab(tmp_path / "server", {}, notebooks=nbs) as server, lab_page(server) as page:
        for name in cells:
            page.open(f"{name}.ipynb")
            shown[name] = page.run_all(f"{name}.ipynb", 60)
            page.close()
        saved = nbformat.read(server.root / "fails.ipynb", as_version=4)
    assert any("ValueError: boom in cell 1" in e for e in shown["fails"].errors), shown["fails"]
    assert saved.cells[2].execution_count is None and not saved.cells[2].outputs  # never ran
    assert any("ZeroDivisionError" in e for e in shown["stderr"].errors), shown["stderr"]
    assert shown["warns"].errors == [] and ("application/vnd.jupyter.stderr", "a warning, not an error\n") \
        in shown["warns"].outputs
    assert shown["widget"].errors == [] and shown["widget"].seen["progress"] >= 1
    assert shown["widget"].progress == 0  # replaced by its text at the end: only seen while running
    assert shown["warns"].seen == {"widgets": 0, "progress": 0}


def test_every_notebook_runs_in_jupyterlab_without_error(stepped):
    results, _, page_errors, _ = stepped
    assert list(results) == STEPS, f"stopped after an error: {[s for s in STEPS if s not in results]}"
    errors = {s: r.first.errors + (r.second.errors if r.second else []) for s, r in results.items()}
    assert {s: e for s, e in errors.items() if e} == {}
    assert page_errors == []  # nothing uncaught in JupyterLab's page (a widget that failed to render)


def test_every_notebook_shows_its_verdict(stepped):
    """Each pass renders the verdict table whose headline carries the status saved in
    verdicts/NN_name.json; every step PASS or WARN on the lab."""
    results, _, _, _ = stepped
    for step, r in results.items():
        assert r.headline.split(": ")[-1] in {"PASS", "WARN"}, (step, r.headline)
        for head, shown in ((r.headline, r.first), (r.headline_again, r.second)):
            assert any(h.startswith(head) for h in shown.headlines), (step, head, shown.headlines)


def test_widgets_render_where_work_shows_progress(stepped):
    results, _, _, _ = stepped
    copied = {s for s in COPIES if s in results and any("streaming from" in text for _, text in results[s].first.outputs)}
    drawn = {s: r.first.seen for s, r in results.items() if s in PROGRESS | copied}
    assert drawn.keys() == PROGRESS | copied and all(seen["progress"] >= 1 for seen in drawn.values()), drawn


def test_every_notebook_twice_in_one_kernel_gives_the_same_statuses(stepped):
    """Run-all again in the same kernel: the same checks, check by check, with the same status (05
    keeps the healthy deployment it started; 06 and 07 run their requests again)."""
    results, _, _, _ = stepped
    for step, r in results.items():
        assert r.again is not None and [c[:2] for c in r.again] == [c[:2] for c in r.statuses], step
        steady = lambda checks: [c if c[0] not in TIMED else (*c[:2], c[2] != "FAIL") for c in checks]  # noqa: E731
        assert steady(r.again) == steady(r.statuses), step


def test_the_front_page_shows_every_step(stepped):
    """notebooks/index.ipynb, run after the runbook in the same JupyterLab, shows its run folder
    ($SPARKBOOK_RUN_DIR) with every step passed, and links every step's notebook."""
    _, (front, text, _), _, run_dir = stepped
    assert front.errors == []
    linked = {Path(link.split("?")[0]).stem for link in front.links}
    assert set(STEPS) <= linked, front.links
    assert f"run folder: {run_dir}" in text, text
    rows = [line.split() for line in text.splitlines()]
    assert {r[0]: r[1] for r in rows if len(r) > 1 and r[0] in STEPS} == dict.fromkeys(STEPS, "passed"), text


def test_the_front_page_runs_a_step_and_asks_the_nodes(stepped):
    """Its buttons, pressed in the browser: *run this step* on 00 starts `sparkbook run`, streams
    its output into the page and redraws the state; *nodes now* shows every node and the endpoint
    (08 has run: no container left, no endpoint)."""
    _, (_, _, clicked), page_errors, run_dir = stepped
    assert "== step 00_inventory: passed" in clicked["run"] and "exit code 0" in clicked["run"], clicked
    assert f"--out {run_dir}" in clicked["run"], clicked
    assert "sparkbook run passed" in clicked["state"], clicked  # the summary that run wrote, read again
    for node in ("spark-1", "spark-2"):
        assert node in clicked["nodes"], clicked
    assert "ready, serving" not in clicked["nodes"] and page_errors == [], clicked
