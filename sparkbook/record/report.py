"""report.html: the executed notebooks of a run folder as one page, with an index at the top; every
secret masked (see :mod:`sparkbook.book.redact`).

A run folder may come from elsewhere (:mod:`sparkbook.record.folder`): each piece is read checked, and
one that cannot be believed is named with why at the top of the page, the rest shown. What the page
adds to the notebooks (the index, the fingerprint, the overview by node, the key numbers, each
step's heading, the commands) is HTML made here with every value escaped, in outputs, never in
Markdown: a value's blank line would end an HTML block there and make Markdown of the rest, a link
of ``[x](javascript:...)``."""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import TagRemovePreprocessor

from ..book.errors import SparkbookError
from ..book.redact import mask
from ..book.verdict import Verdict, cell_html, is_node, nodes_label
from . import expiry, folder as runfolder, sanitize
from .folder import RunFolder

TEMPLATE = Path(__file__).parent / "templates" / "report" / "sparkbook_report.html.j2"
FILE = "report.html"
# Cells tagged so keep their output in the report but not their code: the prose says enough.
HIDE_INPUT = "hide-input"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MAX_VALUE = 4000  # characters of one value shown (a key number, a command); an error shows MAX_ERROR
MAX_ERROR = 20000


def escaped(value: object, limit: int = MAX_VALUE) -> str:
    """A value as HTML text: masked (before the cut: a secret cut short is no longer whole), cut
    at ``limit`` characters, escaped (quotes too: it may stand in an attribute)."""
    text = mask(runfolder.shown(str(value)))
    return html.escape(text if len(text) <= limit else text[: limit - 1] + "…")


_e = escaped


def _html(fragment: str) -> nbformat.NotebookNode:
    """A cell that shows ``fragment`` as the HTML it is: an output of a cell without input."""
    cell = nbformat.v4.new_code_cell("", metadata={"tags": [HIDE_INPUT]})
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": fragment})]
    return cell


def _without_widgets(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The cell's outputs without widget views: the page runs no widget code (its template loads
    none, and the merged notebook carries no saved widget state), so each output shows the text
    snapshot beside its view (:mod:`sparkbook.book.progress`). nbconvert 7.17 would skip a view whose
    model is not in the notebook's saved state, but draw an empty box for one that is."""
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if WIDGET_VIEW in data and len(data) > 1:
            del data[WIDGET_VIEW]
    return cell


def _index(summary: dict, verdicts: list[tuple[str, Verdict]], now: datetime) -> str:
    taken = {step: v for step, v in verdicts}
    rows = []
    for s in summary["steps"]:
        # masked before the cut: a secret cut short is no longer whole, nor followed by an ellipsis
        err = html.escape(mask(s["error"]).splitlines()[0][:160]) if s.get("error") else ""
        v = taken.get(s["name"])
        until = expiry.when(v.holds_until) if v else None
        when = (expiry.taken_text(v, now) + (f", holds until {until:%Y-%m-%d %H:%M UTC}" if until else "")
                if v else "")
        rows.append(f"<tr><td><a href='#step-{_e(s['step'])}'>{_e(s['name'])}</a></td>"
                    f"<td class='sparkbook-status-{_e(s['status'])}'><b>{_e(s['status'])}</b></td>"
                    f"<td>{s['duration_s']:.1f} s</td><td>{_e(when)}</td><td>{err}</td></tr>")
    status = summary.get("status") or "unknown"
    return (f"<h1>sparkbook run: {_e(summary.get('deployment') or '?')}</h1>"
            f"<p>Overall: <b class='sparkbook-status-{_e(status)}'>{_e(status.upper())}</b> · "
            f"started {_e(summary.get('started') or '?')} · finished {_e(summary.get('finished') or '—')}<br>"
            f"parameters: <code>{_e(summary.get('params') or '?')}</code></p>"
            "<table class='sparkbook-summary'><thead><tr><th>step</th><th>status</th><th>duration</th>"
            f"<th>verdict taken (age as of {now:%Y-%m-%d %H:%M UTC})</th><th>error</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _unreadable(found: dict[str, str]) -> str:
    """What the run folder holds but the page could not read, and why: left out below."""
    items = "".join(f"<li><code>{_e(name)}</code>: unreadable: {_e(why)}</li>" for name, why in found.items())
    return (f"<div class='sparkbook-unreadable'><p><b>Unreadable in this run folder</b> (left out "
            f"below):</p><ul>{items}</ul></div>")


def load_json(path: Path) -> dict | None:
    """A JSON object's content; None when it is missing, unreadable or not an object (see
    :func:`sparkbook.record.folder.read` for the shape of a run folder's files)."""
    path = Path(path)
    try:
        return runfolder.read_json(path.parent, path.name)
    except runfolder.Unreadable:
        return None


def key_numbers(run_dir: str | Path) -> list[tuple[str, str]]:
    """The numbers people look for first, as each step recorded them with its verdict."""
    return _key_numbers(RunFolder(Path(run_dir)).verdicts())


def _key_numbers(found: list[tuple[str, Verdict]]) -> list[tuple[str, str]]:
    return [kn for _, v in found for kn in v.key_numbers]


def commands(run_dir: str | Path) -> list[tuple[str, str, str]]:
    """(step, nodes, command) of every check that names the command it ran, a command run alike on
    several nodes once (``all 8 nodes``)."""
    return _commands(RunFolder(Path(run_dir)).verdicts())


def _commands(found: list[tuple[str, Verdict]]) -> list[tuple[str, str, str]]:
    out = []
    for step, v in found:
        ran: dict[str, list[str]] = {}
        for c in v.checks:
            if c.command and (c.node or "all") not in ran.setdefault(c.command, []):
                ran[c.command].append(c.node or "all")
        out += [(step, nodes_label(nodes, v.nodes()), command) for command, nodes in ran.items()]
    return out


def by_node(found: list[tuple[str, Verdict]], summary: dict) -> str:
    """Each step's checks by node, a row per step: the worst status of each node's checks, and of
    the checks on no one node (the cluster's, this machine's). Which node holds up a run, at a
    glance; empty where no check names a node."""
    nodes = list(dict.fromkeys(n for _, v in found for n in v.nodes()))
    if not nodes:
        return ""
    anchors = {s["name"]: s["step"] for s in summary.get("steps", [])}
    rows = []
    for step, v in found:
        cells = [[c for c in v.checks if c.node == n] for n in nodes]
        cells.append([c for c in v.checks if not is_node(c.node)])
        name = f"<a href='#step-{_e(anchors[step])}'>{_e(step)}</a>" if step in anchors else _e(step)
        rows.append(f"<tr><td>{name}</td>" + "".join(cell_html(cs) if cs else "<td></td>" for cs in cells) + "</tr>")
    head = "".join(f"<th>{_e(n)}</th>" for n in ["step", *nodes, "cluster"])
    return (f"<table class='sparkbook-summary sparkbook-by-node'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _step_head(s: dict, unreadable: str | None) -> str:
    head = f"<a id='step-{_e(s['step'])}'></a><h2>{_e(s['name'])}: {_e(s['status'])}"
    if s["status"] != "skipped":
        head += f" ({s['duration_s']:.1f} s)"
    head += "</h2>"
    if s.get("error"):
        head += f"<pre class='sparkbook-error'>{_e(s['error'], MAX_ERROR)}</pre>"
    if unreadable:
        head += f"<p class='sparkbook-unreadable'>{_e(s['notebook'])}: unreadable: {_e(unreadable)}</p>"
    return head


def merged(run_dir: str | Path) -> tuple[nbformat.NotebookNode, dict]:
    """The page as one notebook (every piece read checked, what is unreadable named at the top),
    and the run's summary. Raises SparkbookError when the folder has no summary.json it can read."""
    folder = RunFolder(Path(run_dir))
    try:
        summary = runfolder.read(folder.path, "summary.json")
    except runfolder.Unreadable as e:
        raise SparkbookError(f"{run_dir}: not a run folder that can be read: {e}") from None
    if summary is None:
        raise SparkbookError(f"{run_dir}: not a run folder (no summary.json)")
    nb = nbformat.v4.new_notebook()
    verdicts = folder.verdicts()
    nb.cells.append(_html(_index(summary, verdicts, datetime.now(timezone.utc))))
    found = folder.fingerprint()
    if found:
        nb.cells.append(_html("<h3>What ran</h3>" + found.html()))
    nodes = by_node(verdicts, summary)
    if nodes:
        nb.cells.append(_html("<h3>By node</h3>" + nodes))
    numbers = _key_numbers(verdicts)
    if numbers:
        nb.cells.append(_html("<table class='sparkbook-key-numbers'><tbody>" + "".join(
            f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in numbers) + "</tbody></table>"))
    for k, s in enumerate(summary["steps"]):
        book = folder.notebook(s["notebook"]) if s["status"] != "skipped" else None
        nb.cells.append(_html(_step_head(s, folder.unreadable.get(runfolder.shown(s["notebook"])))))
        if book is None:
            continue
        for key in ("kernelspec", "language_info"):  # from the first step whose kernel started
            found = book.metadata.get(key)
            if isinstance(found, dict) and found.get("name"):
                nb.metadata.setdefault(key, found)
        for i, cell in enumerate(book.cells):
            cell["id"] = f"s{k}-{i}"  # unique, whatever the summary's step numbers
            nb.cells.append(_without_widgets(cell))
    ran = _commands(verdicts)
    if ran:
        nb.cells.append(_html("<a id='commands'></a><h2>Commands run by the checks</h2>"
                              "<table class='sparkbook-summary'><thead><tr><th>step</th><th>node</th>"
                              "<th>command</th></tr></thead><tbody>" + "".join(
                                  f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td><code>{_e(c)}</code></td></tr>"
                                  for a, b, c in ran) + "</tbody></table>"))
    if folder.unreadable:
        nb.cells.insert(1, _html(_unreadable(folder.unreadable)))
    return nb, summary


def build(run_dir: str | Path) -> Path:
    """Write ``report.html`` in the run folder from ``summary.json`` and the executed notebooks."""
    run_dir = Path(run_dir)
    nb, summary = merged(run_dir)
    # no image is read from a path a notebook's Markdown names: a received notebook could name a
    # file of this machine (attachments, which a notebook carries itself, still show)
    # and every piece of HTML a notebook carries (Markdown, outputs, raw cells) through an allow-list
    # that keeps the verdicts' colours and no script, handler or fetch (sparkbook.record.sanitize)
    exporter = HTMLExporter(extra_template_paths=[str(TEMPLATE.parent)], template_file=TEMPLATE.name,
                            embed_images=False, sanitize_html=True, filters={"clean_html": sanitize.clean})
    exporter.register_preprocessor(TagRemovePreprocessor(
        remove_input_tags={HIDE_INPUT}, remove_cell_tags={"parameters", "injected-parameters"},
        enabled=True), True)
    # masked before rendering too: markdown or ANSI colours could split a secret's text in the page
    nb = nbformat.reads(mask(nbformat.writes(nb)), as_version=4)
    body, _ = exporter.from_notebook_node(
        nb, resources={"metadata": {"name": f"sparkbook: {summary.get('deployment') or 'run'}"}})
    return runfolder.write(run_dir, FILE, mask(body))
