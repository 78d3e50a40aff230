"""report.html: the executed notebooks of a run folder as one page, with an index at the top."""

from __future__ import annotations

import html
import json
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import TagRemovePreprocessor

from . import bench
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


def key_numbers(run_dir: Path) -> list[tuple[str, str]]:
    """The numbers people look for first, from the run folder's data (what exists of it)."""
    out = []
    coll = _load(run_dir / "collectives.json")
    if coll and coll.get("result"):
        top = coll["result"]["rows"][-1]
        out.append(("all-reduce bus bandwidth", f"{top['busbw_gbs']:.2f} GB/s at "
                    f"{top['bytes'] / 2**20:g} MiB ({coll['backend']})"))
    dist = (_load(run_dir / "distribution.json") or {}).get("image")
    if dist:
        sent = dist["transfers"]
        out.append(("image distribution", "already on every node" if not sent else "; ".join(
            f"{t['node']}: {t['wire'] / 1e9:.2f} GB in {t['seconds']:.0f} s"
            + (f" ({t['layers_held']} layers already there)" if t["layers_held"] else "") for t in sent)))
    serving = _load(run_dir / "serving.json")
    if serving:
        out.append(("vLLM start-up", (f"ready in {serving['seconds']:.0f} s" if serving["ready"] else
                                      f"not ready after {serving['seconds']:.0f} s")
                    + f" ({serving['action']})"))
    if (run_dir / bench.FOLDER / "results.json").exists():
        res = bench.load(run_dir)
        one = res.single_user()  # the level the references are compared with
        if one:
            out.append(("single user", f"{one.decode_tok_s:.1f} tok/s decode, "
                        f"{one.prefill_tok_s or 0:.0f} tok/s prefill at {one.label}"))
        conc = [lv for lv in res.concurrency if lv.output_tok_s]
        if conc:
            best = max(conc, key=lambda lv: lv.output_tok_s)
            out.append(("peak throughput", f"{best.output_tok_s:.0f} output tok/s at concurrency "
                        f"{best.concurrency} (TTFT p50 {best.ttft_ms['p50'] or 0:.0f} ms)"))
    return out


def commands(run_dir: Path) -> list[tuple[str, str, str]]:
    """(step, node, command) of every check that names the command it ran."""
    out = []
    for path in sorted((run_dir / "verdicts").glob("*.json")):
        for c in (_load(path) or {}).get("checks", []):
            row = (path.stem, c.get("node", ""), c.get("command", ""))
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
