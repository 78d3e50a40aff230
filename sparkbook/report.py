"""report.html: the executed notebooks of a run folder as one page, with an index at the top."""

from __future__ import annotations

import html
import json
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import TagRemovePreprocessor

from .errors import SparkbookError

TEMPLATE = Path(__file__).parent / "templates" / "report" / "sparkbook_report.html.j2"
# Cells tagged so keep their output in the report but not their code: the prose says enough.
HIDE_INPUT = "hide-input"


def _md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def _index(summary: dict) -> str:
    rows = []
    for s in summary["steps"]:
        err = html.escape((s.get("error") or "").splitlines()[0][:160]) if s.get("error") else ""
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


def build(run_dir: str | Path) -> Path:
    """Write ``report.html`` in the run folder from ``summary.json`` and the executed notebooks."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise SparkbookError(f"{run_dir}: not a run folder (summary.json: {e})") from None
    merged = nbformat.v4.new_notebook()
    merged.cells.append(_md(_index(summary)))
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
            merged.cells.append(cell)
    exporter = HTMLExporter(extra_template_paths=[str(TEMPLATE.parent)], template_file=TEMPLATE.name,
                            embed_images=True)
    exporter.register_preprocessor(TagRemovePreprocessor(
        remove_input_tags={HIDE_INPUT}, remove_cell_tags={"parameters"}, enabled=True), True)
    body, _ = exporter.from_notebook_node(
        merged, resources={"metadata": {"name": f"sparkbook: {summary.get('deployment', 'run')}"}})
    out = run_dir / "report.html"
    out.write_text(body)
    return out
