"""Live progress (sparkbook/book/progress.py): printed lines outside a kernel; in a kernel one display
updated in place, as text where no front end draws widgets (`sparkbook run`) and as an ipywidgets
view in JupyterLab, which ends as the text snapshot of the end state; the report of an executed
notebook shows that snapshot and no widget."""

import json
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from sparkbook.book import progress
from sparkbook.record import report
from sparkbook.book.progress import Progress, fraction_of

VIEW = "application/vnd.jupyter.widget-view+json"
ROOT = Path(__file__).resolve().parents[1]


class FakeDisplay:
    """IPython.display.display with display_id=True, recording every bundle shown or updated."""

    def __init__(self):
        self.shown: list[tuple[str, dict]] = []

    def __call__(self, data, raw=False, display_id=None):
        assert raw and display_id is True
        self.shown.append(("display", data))
        return self

    def update(self, data, raw=False):
        assert raw
        self.shown.append(("update", data))


@pytest.fixture
def kernel(monkeypatch):
    """A kernel as Progress sees it, with its displays recorded; no Jupyter server (papermill)."""
    import IPython.display
    fake = FakeDisplay()
    monkeypatch.setattr(progress, "_in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", fake)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return fake


def test_outside_a_kernel_lines_are_printed_when_they_change_at_most_every_interval(capsys, monkeypatch):
    monkeypatch.setattr(progress, "_in_notebook", lambda: False)
    p = Progress("copy", interval=3600)
    assert not p.notebook and not p.live
    p.update("spark-2", "10%", fraction=0.1)  # the first line shows at once
    p.update("spark-2", "20%", fraction=0.2)  # within the interval: not printed
    assert capsys.readouterr().out == "copy\n  spark-2: 10%\n"
    p.update("spark-2", "30%", force=True)
    p.close()
    assert capsys.readouterr().out == "copy\n  spark-2: 30%\n" * 2


def test_the_first_line_shows_on_a_machine_up_for_less_than_the_interval(capsys, monkeypatch):
    """time.monotonic() counts from boot: a fresh CI machine may be up for seconds only."""
    monkeypatch.setattr(progress, "_in_notebook", lambda: False)
    monkeypatch.setattr(progress.time, "monotonic", lambda: 5.0)  # booted 5 s ago
    Progress("copy").update("spark-2", "10%")
    assert capsys.readouterr().out == "copy\n  spark-2: 10%\n"


def test_a_change_held_back_by_the_interval_shows_with_the_next_update_past_it(capsys, monkeypatch):
    """A loop that reports the same line again (a wait) shows the change it made within the
    interval once the interval is over: a stalled phase is not left unseen."""
    monkeypatch.setattr(progress, "_in_notebook", lambda: False)
    p = Progress("start-up", interval=0.2)
    p.update("spark-1", "weights")
    p.update("spark-1", "compile")  # within the interval: held back
    assert capsys.readouterr().out == "start-up\n  spark-1: weights\n"
    time.sleep(0.3)
    p.update("spark-1", "compile")  # the same line again, past the interval
    assert capsys.readouterr().out == "start-up\n  spark-1: compile\n"
    time.sleep(0.3)
    p.update("spark-1", "compile")  # nothing new: nothing printed
    assert capsys.readouterr().out == ""


def test_in_a_kernel_without_a_jupyter_server_one_text_display_is_updated_in_place(kernel):
    with Progress("copy", interval=0) as p:
        p.update("spark-2", "[#...] 10%", fraction=0.1)
        p.update("spark-3", "starting")
        p.update("spark-2", "[####] 100%", fraction=1.0)
    kinds = [k for k, _ in kernel.shown]
    assert kinds == ["display", "update", "update", "update"]  # the last one: close
    end = kernel.shown[-1][1]
    assert set(end) == {"text/plain", "text/html"}  # no widget where nothing draws it
    assert end["text/plain"] == "copy\n  spark-2: [####] 100%\n  spark-3: starting"
    assert "<progress value='1.000' max='1'></progress> 100%" in end["text/html"]
    assert end["text/html"].count("<progress") == 1  # spark-3's fraction is not known: no bar


def test_in_jupyterlab_a_widget_changes_live_and_the_display_ends_as_the_snapshot(kernel, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/notebooks/03_distribute_image.ipynb")
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    p = Progress("copy")
    assert p.live
    p.update("spark-2", "10%", fraction=0.1)
    first = kernel.shown[0][1]
    assert first[VIEW]["model_id"] == p.widgets.box.model_id and first["text/plain"] == "copy\n  spark-2: 10%"
    box = p.widgets.box
    label, bar, text = p.widgets.rows["spark-2"]
    assert (label.value, bar.value, text.value) == ("spark-2", 0.1, "<code>10%</code>")
    now[0] += 0.1
    p.update("spark-2", "20%", fraction=0.2)  # a row changes at most every LIVE_S
    assert bar.value == 0.1
    p.update("spark-3", "starting")  # a new row shows at once, its bar hidden
    assert p.widgets.rows["spark-3"][1].layout.visibility == "hidden"
    p.timer.join(5)  # when the updates stop, what is left is drawn LIVE_S later
    assert bar.value == 0.2 and p.timer is None
    now[0] += progress.LIVE_S
    p.update("spark-2", "30%", fraction=0.3)
    p.update("spark-3", "loading")
    assert bar.value == 0.3 and p.widgets.rows["spark-3"][2].value == "<code>loading</code>"
    assert len(box.children) == 3  # the title, a row per key: no widget per update
    assert [k for k, _ in kernel.shown] == ["display"]  # no re-render of the view while it runs
    p.update("spark-2", "100%", fraction=1.0)
    p.close()
    kind, end = kernel.shown[-1]
    assert kind == "update" and set(end) == {"text/plain", "text/html"}
    assert end["text/plain"] == "copy\n  spark-2: 100%\n  spark-3: loading"
    assert box.comm is None and bar.comm is None  # the widgets are closed
    assert p.widgets is None and not p.live


def test_fraction_of():
    assert fraction_of(5, 10) == 0.5 and fraction_of(12, 10) == 1.0 and fraction_of(3, None) is None
    assert fraction_of(3, 0) is None


NOTEBOOK = """\
import os
{env}
from sparkbook.book.progress import Progress
with Progress("image from spark-1") as p:
    for i in range(5):
        p.update("spark-2", f"{{i}} of 4 GiB", fraction=i / 4)
"""


class Recording(NotebookClient):
    """nbclient, recording the mime types of each display a cell sent (first shown, then updated)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent: list[tuple[str, set]] = []

    def process_message(self, msg, cell, cell_index):
        if msg["msg_type"] in ("display_data", "update_display_data"):
            self.sent.append((msg["msg_type"], set(msg["content"]["data"])))
        return super().process_message(msg, cell, cell_index)


def execute(env: str) -> tuple[nbformat.NotebookNode, Recording]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NOTEBOOK.format(env=env))])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = Recording(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    return nb, client


@pytest.fixture(scope="module")
def in_jupyterlab():
    """A real ipykernel, its environment as a Jupyter server gives it (JPY_SESSION_NAME)."""
    return execute("os.environ['JPY_SESSION_NAME'] = 'progress.ipynb'")


def test_a_real_kernel_in_jupyterlab_leaves_the_end_state_as_text(in_jupyterlab):
    nb, client = in_jupyterlab
    assert client.sent[0] == ("display_data", {VIEW, "text/plain", "text/html"})
    assert client.sent[-1] == ("update_display_data", {"text/plain", "text/html"})
    [out] = nb.cells[0].outputs
    assert out.output_type == "display_data" and VIEW not in out.data
    assert out.data["text/plain"] == "image from spark-1\n  spark-2: 4 of 4 GiB"
    # the widget was drawn live: nbclient kept its models' last state (store_widget_state)
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in state.values() if m["model_name"] == "FloatProgressModel"]
    assert [b["value"] for b in bars] == [1.0]


def test_a_real_kernel_without_a_jupyter_server_shows_text_only():
    nb, client = execute("os.environ.pop('JPY_SESSION_NAME', None)")
    assert {t for _, mimes in client.sent for t in mimes} == {"text/plain", "text/html"}
    [out] = nb.cells[0].outputs
    assert out.data["text/plain"] == "image from spark-1\n  spark-2: 4 of 4 GiB"
    assert "widgets" not in nb.metadata


def test_the_report_of_an_executed_notebook_shows_the_snapshot_and_no_widget(in_jupyterlab, tmp_path):
    nb, _ = in_jupyterlab
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    # a display left with its view (a kernel that died before close): the report shows its text
    nb.cells[0].outputs[0].data[VIEW] = {"version_major": 2, "version_minor": 0,
                                         "model_id": next(iter(nb.metadata.widgets[
                                             "application/vnd.jupyter.widget-state+json"]["state"]))}
    nbformat.write(nb, tmp_path / "03_distribute_image.ipynb")
    (tmp_path / "summary.json").write_text(json.dumps({
        "deployment": "lab", "params": "lab.yaml", "status": "passed", "steps": [
            {"step": 3, "name": "03_distribute_image", "notebook": "03_distribute_image.ipynb",
             "status": "passed", "duration_s": 1.0}]}))
    page = report.build(tmp_path).read_text()
    snapshot = page.split('<div class="sparkbook-progress">')[1].split("</div>")[0]  # nbconvert requotes
    assert snapshot.startswith("<b>image from spark-1</b>") and snapshot.count("<tr>") == 1
    assert '<progress max="1" value="1.000"></progress> 100%' in snapshot and "<code>4 of 4 GiB</code>" in snapshot
    assert "widget-view+json" not in page and "widget-state+json" not in page
    assert "jupyter-widgets" not in page
