"""report.html: the executed notebooks of a run folder as one page, with an index at the top."""

from __future__ import annotations

import html
import json
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import TagRemovePreprocessor

from .errors import SparkbookError
from .redact import mask

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


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _verdicts(run_dir: Path) -> list[tuple[str, dict]]:
    """(step, verdict) of every step that concluded, in step order."""
    return [(p.stem, v) for p in sorted((run_dir / "verdicts").glob("*.json")) if (v := _load(p))]


def key_numbers(run_dir: Path) -> list[tuple[str, str]]:
    """The numbers people look for first, as each step recorded them with its verdict."""
    return [(label, value) for _, v in _verdicts(run_dir) for label, value in v.get("key_numbers", [])]


def commands(run_dir: Path) -> list[tuple[str, str, str]]:
    """(step, node, command) of every check that names the command it ran."""
    out = []
    for step, verdict in _verdicts(run_dir):
        for c in verdict.get("checks", []):
            row = (step, c.get("node", ""), c.get("command", ""))
            if row[2] and row not in out:
                out.append(row)
    return out


def build(run_dir: str | Path) -> Path:
    """Write ``report.html`` in the run folder from ``summary.json`` and the executed notebooks."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise SparkbookError(f"{run_dir}: not a run folder (summary.json: {e})") from None
    merged = nbformat.v4.new_notebook()
    merged.cells.append(_md(_index(summary)))
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
            merged.cells.append(cell)
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
    body, _ = exporter.from_notebook_node(
        merged, resources={"metadata": {"name": f"sparkbook: {summary.get('deployment', 'run')}"}})
    out = run_dir / "report.html"
    out.write_text(mask(body))
    return out
