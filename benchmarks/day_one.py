"""Day one end to end, too long for CI (tests/test_dayone.py runs 01 and 02 on 2 nodes): on an
unwired lab (`lab up --unwired`: rails cabled, no address, MTU 1500, no peer's host key known) of 2
nodes and of 4 (one switch per rail), `sparkbook discover` writes the parameters file, `sparkbook
fabric plan` and `fabric apply` configure the rails and SSH between the nodes, then the whole runbook
runs (`sparkbook run`) on the file as discovery wrote it, no hand edit; then every node reboots
(`lab reboot`) and the whole runbook runs again; then `fabric restore` must bring back every node's
netplan files byte for byte and their rails' addresses.

The template for the sections besides the nodes is the lab's own parameters file for that many
nodes (its image, model and serving layout). The 4-node lab's workers start with the head's images,
as CI's 4-node run does. Writes benchmarks/results/day_one-lab-DATE.md; the run folders go to
outputs/DATE-dayone-N/. Needs root; leaves the lab as it found it, also when interrupted.

    .venv/bin/python benchmarks/day_one.py [--nodes 2 4]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import time
from pathlib import Path

import yaml

from sparkbook.cli import main as cli
from sparkbook.lab import Lab, lab_params
from sparkbook.lab.nodes import LAB_HOME
from sparkbook.lab.power import reboot
from sparkbook.runbook.runner import run

RESULTS = Path(__file__).resolve().parent / "results"
OUTPUTS = Path(__file__).resolve().parents[1] / "outputs"  # the run folders (not committed)


def netplan_files(lab: Lab) -> dict[str, str]:
    return {f"{n.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for n in lab.nodes() for p in sorted((n.dir / "netplan").glob("*.yaml"))}


def timed(what: str, fn, lines: list[str]):
    t0 = time.monotonic()
    result = fn()
    lines.append(f"| {what} | {time.monotonic() - t0:.1f} | {result} |")
    print(lines[-1], flush=True)
    return result


def steps(summary: dict) -> str:
    return f"{summary['status']}: " + ", ".join(f"{s['name'][:2]} {s['status']} {s['duration_s'] or 0:.0f} s"
                                                 for s in summary["steps"])


def one(lab: Lab, n: int) -> list[str]:
    lines = [f"## {n} nodes", "", "| stage | seconds | result |", "|---|---|---|"]
    lab.down(say=lambda *_: None)
    lab.up(n, say=lambda *_: None, seed_images=n > 2, unwired=True)
    before = netplan_files(lab)
    out = OUTPUTS / f"{datetime.date.today()}-dayone-{n}"
    out.mkdir(parents=True, exist_ok=True)
    template, params = out / "template.yaml", out / "discovered.yaml"
    template.write_text(yaml.safe_dump(lab_params(n), sort_keys=False))
    nodes = [node.mgmt_ip for node in lab.nodes()]
    key = str(LAB_HOME / "id_ed25519")
    timed("discover", lambda: cli(["discover", *nodes, "--user", "root", "--key", key, "--known-hosts",
                                   str(LAB_HOME / "known_hosts"), "--template", str(template), "--name",
                                   f"dayone{n}", "-o", str(params), "--force"]), lines)
    timed("fabric plan", lambda: cli(["fabric", "plan", "-p", str(params)]), lines)
    timed("fabric apply", lambda: cli(["fabric", "apply", "-p", str(params)]), lines)
    timed("whole runbook", lambda: steps(run(params, out=out / "run1")), lines)
    took = timed("lab reboot, every node", lambda: reboot(lab, [x.name for x in lab.nodes()], say=lambda *_: None), lines)
    lines[-1] = lines[-1].replace(str(took), f"all answer SSH and Docker again, slowest {max(took.values()):.1f} s")
    timed("whole runbook after the reboot", lambda: steps(run(params, out=out / "run2")), lines)
    timed("fabric restore", lambda: cli(["fabric", "restore", "-p", str(params)]), lines)
    same = netplan_files(lab) == before
    lines += ["", f"netplan files after restore: {'byte-identical (SHA-256)' if same else 'DIFFERENT'} "
              f"({len(before)} files); the discovered file: outputs/{out.name}/discovered.yaml", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args()
    lines = [f"# Day one on the lab, {datetime.date.today()}", "",
             "Exit codes: 0 for the CLI stages means passed. `benchmarks/day_one.py`.", ""]
    with Lab().as_found() as lab:
        for n in args.nodes:
            lines += one(lab, n)
    text = "\n".join(lines)
    print(text)
    path = RESULTS / f"day_one-lab-{datetime.date.today()}.md"
    path.write_text(text + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
