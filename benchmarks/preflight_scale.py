"""Preflight on 2 and 8 lab nodes, side by side in one run: the wall clock, and the controller's CPU
time per node.

Goals: the controller's (this machine's) CPU time per node flat from 2 to 8 nodes (the 8-node
figure at most 1.2x the 2-node one, issue 14), stated next to the wall-clock ratio; and the 2-node
preflight under 15 s. Needs root; uses `sparkbook lab`, and leaves it as it found it at the end, also
when interrupted (Ctrl-C, SIGTERM): as many nodes up again, or none.

Both node counts run against one 8-node lab: the 2-node preflight targets its first two nodes
(parameters/lab.yaml names exactly those), so both see the same machines and the same idle
neighbours. Each count runs once on fresh SSH connections ("first run": the handshakes are part of
the cost) and then --repeat times on open ones ("warm", medians).

- controller CPU: user + sys of this process (Paramiko's threads: SSH, parsing, the checks and the
  verdict's text) and of its waited-for children, from getrusage; split into the gather (the round
  trips) and the checks.
- nodes' CPU: this machine's busy time (/proc/stat) less the controller's. The lab's nodes share
  this machine's cores (sshd, bash, the simulated tools, the TCP probe), so this is what the wall
  clock waits for here; on real Sparks every node has its own. Anything else running on the
  machine is counted there too: run the benchmark on an otherwise idle machine.

The 8 nodes are also checked one at a time (ssh.parallel 1): what the fan-out saves.

    .venv/bin/python benchmarks/preflight_scale.py [--repeat 3]

The results go to benchmarks/results/preflight_scale-lab-DATE.txt and .json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkbook import preflight
from sparkbook.nodes import remote
from sparkbook.lab import Lab
from sparkbook.lab.nodes import params_file
from sparkbook.params import Params, load
from sparkbook.nodes.remote import Cluster
from sparkbook.steps import preflight as step
from sparkbook.book.verdict import Verdict

RESULTS = Path(__file__).resolve().parent / "results"
CPU_GOAL, WALL_GOAL_2 = 1.2, 15.0


def controller_cpu_s() -> float:
    """User + sys seconds of this process (all its threads) and of its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def machine_busy_s() -> float:
    """CPU seconds this machine spent busy (every process, every core) since boot."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    wall_s: float
    cpu_s: float  # the controller's: gather + checks
    gather_cpu_s: float
    checks_cpu_s: float
    nodes_cpu_s: float  # this machine's busy time less the controller's: the lab's nodes
    checks: int
    failures: int


def run(params: Params) -> tuple[Sample, Verdict]:
    """Preflight as `sparkbook preflight` runs it: gather, check, the verdict as text."""
    t0, c0, b0 = time.perf_counter(), controller_cpu_s(), machine_busy_s()
    pf = preflight.gather(params, Cluster.from_params(params))
    c1 = controller_cpu_s()
    verdict = Verdict(step.TITLE, step.checks(params, pf))
    verdict.to_text()
    wall, c2, b2 = time.perf_counter() - t0, controller_cpu_s(), machine_busy_s()
    return Sample(wall, c2 - c0, c1 - c0, c2 - c1, (b2 - b0) - (c2 - c0), len(verdict.checks),
                  len(verdict.failures)), verdict


def measure(params: Params, repeat: int) -> dict:
    """The first run on fresh connections, then ``repeat`` on open ones; connections closed after,
    so that idle ones do not count against the next node count."""
    remote.close_all()
    first, verdict = run(params)
    assert not verdict.failures, verdict.to_text()
    warm = [run(params)[0] for _ in range(repeat)]
    remote.close_all()
    median = {k: statistics.median(getattr(s, k) for s in warm) for k in asdict(first)}
    n = len(params.nodes)
    return {"nodes": n, "first": asdict(first), "warm": median, "warm_runs": [asdict(s) for s in warm],
            "first_cpu_per_node_s": first.cpu_s / n, "warm_cpu_per_node_s": median["cpu_s"] / n}


def one_at_a_time(params: Params) -> float:
    """The same preflight with ssh.parallel 1, on open connections: its wall clock."""
    serial = params.model_copy(update={"ssh": params.ssh.model_copy(update={"parallel": 1})})
    run(params)  # open the connections
    sample, _ = run(serial)
    remote.close_all()
    return sample.wall_s


def report(rows: dict[int, dict], serial_s: float, repeat: int) -> list[str]:
    two, eight = rows[2], rows[8]
    lines = [f"preflight on an 8-node lab ({os.cpu_count()} cores), 2 of its nodes and all 8; "
             f"warm: median of {repeat}", "",
             f"{'nodes':>5}  {'checks':>6}  {'run':>5}  {'wall (s)':>8}  {'ctl CPU (s)':>11}  "
             f"{'gather':>6}  {'checks':>6}  {'CPU/node (s)':>12}  {'nodes CPU (s)':>13}"]
    for n, r in rows.items():
        for kind in ("first", "warm"):
            s = r[kind]
            lines.append(f"{n:>5}  {s['checks']:>6.0f}  {kind:>5}  {s['wall_s']:8.2f}  {s['cpu_s']:11.3f}  "
                         f"{s['gather_cpu_s']:6.3f}  {s['checks_cpu_s']:6.3f}  "
                         f"{r[kind + '_cpu_per_node_s']:12.3f}  {s['nodes_cpu_s']:13.2f}")
    lines.append("")
    for kind, label in (("first", "first run"), ("warm", "warm")):
        cpu = eight[f"{kind}_cpu_per_node_s"] / two[f"{kind}_cpu_per_node_s"]
        wall = eight[kind]["wall_s"] / two[kind]["wall_s"]
        lines.append(f"8-node / 2-node, {label + ':':<10} controller CPU per node {cpu:.2f} "
                     f"(goal <= {CPU_GOAL}), wall clock {wall:.2f}")
    lines.append(f"2-node first run: {two['first']['wall_s']:.2f} s (goal < {WALL_GOAL_2:g} s)")
    lines.append(f"8 nodes one at a time: {serial_s:.2f} s; in parallel (warm) "
                 f"{eight['warm']['wall_s'] / serial_s:.2f} of that")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    quiet = lambda *_: None
    with Lab().as_found(say=quiet) as lab:
        lab.down(say=quiet)
        eight = load(lab.up(8, say=quiet))
        two = load(params_file(2))
        same = [(n.name, n.host) for n in two.nodes] == [(n.name, n.host) for n in eight.nodes[:2]]
        assert same, f"{params_file(2)} does not name the first two nodes of the 8-node lab"
        rows = {2: measure(two, args.repeat), 8: measure(eight, args.repeat)}
        serial_s = one_at_a_time(eight)
    lines = report(rows, serial_s, args.repeat)
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"preflight_scale-lab-{datetime.date.today().isoformat()}"
    stem.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps(
        {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cores": os.cpu_count(),
         "repeat": args.repeat, "rows": rows, "one_at_a_time_8_s": serial_s}, indent=2) + "\n")
    print(f"saved: {stem}.txt, {stem}.json")


if __name__ == "__main__":
    main()
