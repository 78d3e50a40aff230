"""The runbook past two nodes, too long for CI: 00-03 on an 8-node lab (inventory, preflight, an
all-reduce across all 8, the image to 7 workers through relays), and the whole runbook on a 4-node
lab with the mp executor (TP 2 x PP 2, `--nnodes 4`). CI runs the 4-node Ray runbook
(tests/test_e2e_quad.py).

Each run goes through `sparkbook run`, as a person runs it, into outputs/DATE-scale-NAME/ (the
run folders, with their report.html); the steps' times and statuses are printed and written to
benchmarks/results/scale_runs-lab-DATE.md. Needs root; takes the lab down first and leaves it as it
found it at the end, also when interrupted (Ctrl-C, SIGTERM): as many nodes up again, or none.

    .venv/bin/python benchmarks/scale_runs.py [--only 8|4mp]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import yaml

from sparkbook.lab import Lab, lab_params
from sparkbook.runbook.runner import run

RESULTS = Path(__file__).resolve().parent / "results"
OUTPUTS = Path(__file__).resolve().parents[1] / "outputs"  # the run folders (not committed)


def one(lab: Lab, name: str, nodes: int, steps: str | None, change) -> None:
    """`sparkbook run` on a fresh lab of ``nodes`` nodes, its parameters changed by ``change``."""
    lab.down(say=lambda *_: None)
    lab.up(nodes, say=lambda *_: None)
    data = lab_params(nodes)
    change(data)
    out = OUTPUTS / f"{datetime.date.today()}-scale-{name}"
    out.mkdir(parents=True, exist_ok=True)
    params_file = out.with_suffix(".yaml")
    params_file.write_text(yaml.safe_dump(data, sort_keys=False))
    run(params_file, steps=steps, out=out)


def mp(data: dict) -> None:
    """The mp executor, with a short benchmark: on the lab's 2 shared cores, 4 ranks that each poll
    vLLM's shared-memory queues decode at about 4 tok/s (measured 2026-11-30), and the whole grid
    would take most of an hour."""
    data["serving"]["executor"] = "mp"
    data["benchmark"].update(context_depths=[0], concurrency=[1, 2], requests_per_level=2,
                             output_tokens=32)


def table(name: str, summary: dict, took: float) -> list[str]:
    lines = [f"## {name}: {summary['status']} in {took:.0f} s", "", "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['duration_s'] or 0:.1f} |" for s in summary["steps"]]
    return lines + [""]


def record() -> str:
    """Today's scale runs, from their run folders (each run's summary and key numbers)."""
    lines = [f"# Scale runs on the lab, {datetime.date.today()}", ""]
    for out in sorted(OUTPUTS.glob(f"{datetime.date.today()}-scale-*/")):
        summary = json.loads((out / "summary.json").read_text())
        took = sum(s["duration_s"] or 0 for s in summary["steps"])
        lines += table(out.name, summary, took)
        for step in summary["steps"]:
            verdict = out / "verdicts" / f"{step['name']}.json"
            if verdict.exists():
                v = json.loads(verdict.read_text())
                lines.append(f"- {step['name']}: {v['status']}; "
                             + "; ".join(f"{k}: {val}" for k, val in v.get("key_numbers", [])))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("8", "4mp"))
    args = ap.parse_args()
    with Lab().as_found() as lab:
        if args.only in (None, "8"):
            one(lab, "lab8-00-03", 8, "0,1,2,3", lambda d: None)
        if args.only in (None, "4mp"):
            one(lab, "lab4-mp", 4, None, mp)
    text = record()
    print(text)
    path = RESULTS / f"scale_runs-lab-{datetime.date.today()}.md"
    path.write_text(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
