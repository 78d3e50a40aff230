"""Preflight wall time on a 2-node and an 8-node lab, side by side in one run.

Goals (the preflight issue): the 8-node time within 1.5x the 2-node time (checks fan out in
parallel), and the 2-node preflight under 15 s. Needs root; uses `sparkbook lab`. The lab's nodes
share this machine's cores, so their work (real processes: sshd, bash, docker, the simulated
tools) adds up with the node count; the run also times the 8 nodes checked one at a time, which is
what the fan-out saves.

    .venv/bin/python benchmarks/preflight_scale.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sparkbook import preflight, remote
from sparkbook.lab import Lab
from sparkbook.params import Params, load
from sparkbook.remote import Cluster
from sparkbook.steps import preflight as step
from sparkbook.verdict import Verdict


def run(params: Params) -> Verdict:
    """Preflight as `sparkbook preflight` runs it: gather, then check."""
    return Verdict(step.TITLE, step.checks(params, preflight.gather(params, Cluster.from_params(params))))


def measure(lab: Lab, n: int, repeat: int) -> tuple[float, float, int, float]:
    lab.down(say=lambda *_: None)
    params = load(lab.up(n, say=lambda *_: None))
    times = []
    for i in range(repeat + 1):
        if i == 0:
            remote.close_all()  # the first run opens every connection
        t = time.perf_counter()
        verdict = run(params)
        times.append(time.perf_counter() - t)
    assert not verdict.failures, verdict.to_text()
    # the same checks one node at a time: what the fan-out saves
    serial = params.model_copy(update={"ssh": params.ssh.model_copy(update={"parallel": 1})})
    t = time.perf_counter()
    run(serial)
    one_by_one = time.perf_counter() - t
    return times[0], statistics.median(times[1:]), len(verdict.checks), one_by_one


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    lab = Lab()
    rows = {n: measure(lab, n, args.repeat) for n in (2, 8)}
    lab.down(say=lambda *_: None)
    lab.up(2, say=lambda *_: None)
    print(f"{'nodes':>5}  {'checks':>6}  {'first run (s)':>13}  {'warm (s)':>8}  {'one node at a time (s)':>22}")
    for n, (cold, warm, checks, serial) in rows.items():
        print(f"{n:>5}  {checks:>6}  {cold:13.2f}  {warm:8.2f}  {serial:22.2f}")
    print(f"8-node / 2-node, first run: {rows[8][0] / rows[2][0]:.2f} (goal <= 1.5)")
    print(f"8-node / 2-node, warm:      {rows[8][1] / rows[2][1]:.2f} (goal <= 1.5)")
    print(f"2-node first run / 15 s goal: {rows[2][0] / 15:.2f}")
    print(f"8-node parallel / one node at a time: {rows[8][1] / rows[8][3]:.2f}")


if __name__ == "__main__":
    main()
