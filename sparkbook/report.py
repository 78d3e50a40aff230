"""report.html: the executed notebooks of a run folder as one page, with an index at the top; every
secret masked (see :mod:`sparkbook.redact`)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import TagRemovePreprocessor

from . import fingerprint
from .errors import SparkbookError
from .redact import mask
from .verdict import Verdict, cell_html, is_node, nodes_label

TEMPLATE = Path(__file__).parent / "templates" / "report" / "sparkbook_report.html.j2"
# Cells tagged so keep their output in the report but not their code: the prose says enough.
HIDE_INPUT = "hide-input"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def _without_widgets(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The cell's outputs without widget views: the page runs no widget code (its template loads
    none, and the merged notebook carries no saved widget state), so each output shows the text
    snapshot beside its view (:mod:`sparkbook.progress`). nbconvert 7.17 would skip a view whose
    model is not in the notebook's saved state, but draw an empty box for one that is."""
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if WIDGET_VIEW in data and len(data) > 1:
            del data[WIDGET_VIEW]
    return cell


def _index(summary: dict) -> str:
    rows = []
    for s in summary["steps"]:
        # masked before the cut: a secret cut short is no longer whole, nor followed by an ellipsis
        err = html.escape(mask(s["error"]).splitlines()[0][:160]) if s.get("error") else ""
        rows.append(f"<tr><td><a href='#step-{s['step']}'>{html.escape(s['name'])}</a></td>"
                    f"<td class='sparkbook-status-{s['status']}'><b>{s['status']}</b></td>"
                    f"<td>{s['duration_s']:.1f} s</td><td>{err}</td></tr>")
    status = summary.get("status", "unknown")
    return (f"# sparkbook run: {html.escape(summary.get('deployment', '?'))}\n\n"
            f"<p>Overall: <b class='sparkbook-status-{status}'>{status.upper()}</b> · "
            f"started {summary.get('started', '?')} · finished {summary.get('finished', '—')}<br>"
            f"parameters: <code>{html.escape(summary.get('params', '?'))}</code></p>\n\n"
            "<table class='sparkbook-summary'><thead><tr><th>step</th><th>status</th>"
            f"<th>duration</th><th>error</th></tr></thead><tbody>{''.join(rows)}</tbody></table>\n")


def load_json(path: Path) -> dict | None:
    """A JSON file's content; None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _verdicts(run_dir: Path) -> list[tuple[str, dict]]:
    """(step, verdict) of every step that concluded, in step order."""
    return [(p.stem, v) for p in sorted((run_dir / "verdicts").glob("*.json")) if (v := load_json(p))]


def key_numbers(run_dir: Path) -> list[tuple[str, str]]:
    """The numbers people look for first, as each step recorded them with its verdict."""
    return [(label, value) for _, v in _verdicts(run_dir) for label, value in v.get("key_numbers", [])]


def commands(run_dir: Path) -> list[tuple[str, str, str]]:
    """(step, nodes, command) of every check that names the command it ran, a command run alike on
    several nodes once (``all 8 nodes``)."""
    out = []
    for step, data in _verdicts(run_dir):
        v = Verdict.from_json(data)
        ran: dict[str, list[str]] = {}
        for c in v.checks:
            if c.command and (c.node or "all") not in ran.setdefault(c.command, []):
                ran[c.command].append(c.node or "all")
        out += [(step, nodes_label(nodes, v.nodes()), command) for command, nodes in ran.items()]
    return out


def by_node(run_dir: Path, summary: dict) -> str:
    """Each step's checks by node, a row per step: the worst status of each node's checks, and of
    the checks on no one node (the cluster's, this machine's). Which node holds up a run, at a
    glance; empty where no check names a node."""
    found = [(step, Verdict.from_json(v)) for step, v in _verdicts(run_dir)]
    nodes = list(dict.fromkeys(n for _, v in found for n in v.nodes()))
    if not nodes:
        return ""
    anchors = {s["name"]: s["step"] for s in summary.get("steps", [])}
    rows = []
    for step, v in found:
        cells = [[c for c in v.checks if c.node == n] for n in nodes]
        cells.append([c for c in v.checks if not is_node(c.node)])
        name = f"<a href='#step-{anchors[step]}'>{html.escape(step)}</a>" if step in anchors else html.escape(step)
        rows.append(f"<tr><td>{name}</td>" + "".join(cell_html(cs) if cs else "<td></td>" for cs in cells) + "</tr>")
    head = "".join(f"<th>{html.escape(n)}</th>" for n in ["step", *nodes, "cluster"])
    return (f"<table class='sparkbook-summary sparkbook-by-node'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>\n")


def build(run_dir: str | Path) -> Path:
    """Write ``report.html`` in the run folder from ``summary.json`` and the executed notebooks."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise SparkbookError(f"{run_dir}: not a run folder (summary.json: {e})") from None
    merged = nbformat.v4.new_notebook()
    merged.cells.append(_md(_index(summary)))
    found = fingerprint.load(run_dir)
    if found:
        merged.cells.append(_md("### What ran\n\n" + found.html()))
    nodes = by_node(run_dir, summary)
    if nodes:
        merged.cells.append(_md("### By node\n\n" + nodes))
    numbers = key_numbers(run_dir)
    if numbers:
        merged.cells.append(_md("<table class='sparkbook-key-numbers'><tbody>" + "".join(
            f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in numbers)
            + "</tbody></table>"))
    for s in summary["steps"]:
        head = f"<a id='step-{s['step']}'></a>\n\n## {html.escape(s['name'])}: {s['status']}"
        if s["status"] != "skipped":
            head += f" ({s['duration_s']:.1f} s)"
        if s.get("error"):
            head += f"\n\n<pre class='sparkbook-error'>{html.escape(s['error'])}</pre>"
        merged.cells.append(_md(head))
        path = run_dir / s["notebook"]
        if s["status"] == "skipped" or not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        merged.metadata.setdefault("kernelspec", nb.metadata.get("kernelspec", {}))
        merged.metadata.setdefault("language_info", nb.metadata.get("language_info", {}))
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"s{s['step']}-{i}"
            merged.cells.append(_without_widgets(cell))
    ran = commands(run_dir)
    if ran:
        merged.cells.append(_md("<a id='commands'></a>\n\n## Commands run by the checks\n\n"
                                "<table class='sparkbook-summary'><thead><tr><th>step</th><th>node</th>"
                                "<th>command</th></tr></thead><tbody>" + "".join(
                                    f"<tr><td>{html.escape(a)}</td><td>{html.escape(b)}</td>"
                                    f"<td><code>{html.escape(c)}</code></td></tr>" for a, b, c in ran)
                                + "</tbody></table>"))
    exporter = HTMLExporter(extra_template_paths=[str(TEMPLATE.parent)], template_file=TEMPLATE.name,
                            embed_images=True)
    exporter.register_preprocessor(TagRemovePreprocessor(
        remove_input_tags={HIDE_INPUT}, remove_cell_tags={"parameters", "injected-parameters"},
        enabled=True), True)
    # masked before rendering too: markdown or ANSI colours could split a secret's text in the page
    merged = nbformat.reads(mask(nbformat.writes(merged)), as_version=4)
    body, _ = exporter.from_notebook_node(
        merged, resources={"metadata": {"name": f"sparkbook: {summary.get('deployment', 'run')}"}})
    out = run_dir / "report.html"
    out.write_text(mask(body))
    return out
