"""How long `sparkbook lab up` and `lab down` take, for 2 and 8 nodes, measured in one run.

Goal (the lab issue): `lab up` of 2 nodes under 30 s once the image is built. Prints each time and
its ratio to the goal. Needs root; builds the lab image first if it is missing (not timed). Leaves
the lab as it found it, also when interrupted (Ctrl-C, SIGTERM): as many nodes up again, or none.

    .venv/bin/python benchmarks/lab_up.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sparkbook.lab import Lab
from sparkbook.lab.image import ensure
from sparkbook.lab.host import leftovers
from sparkbook.lab.nodes import lab_params

GOAL_UP_S = 30.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", default="2,8")
    args = ap.parse_args()
    with Lab().as_found(say=quiet) as lab:
        lab.down(say=quiet)
        ensure(lab_params(2)["runtime"]["image"], say=quiet)
        timings(lab, args)


def quiet(*_) -> None:
    pass


def timings(lab: Lab, args) -> None:
    print(f"{'nodes':>5}  {'up (s)':>8}  {'down (s)':>8}  {'up / goal':>9}")
    for n in map(int, args.nodes.split(",")):
        ups, downs = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            lab.up(n, say=quiet)
            ups.append(time.perf_counter() - t)
            assert lab.healthy() == []
            t = time.perf_counter()
            lab.down(say=quiet)
            downs.append(time.perf_counter() - t)
            assert leftovers() == []
        up, down = statistics.median(ups), statistics.median(downs)
        print(f"{n:>5}  {up:8.2f}  {down:8.2f}  {up / GOAL_UP_S:9.3f}")


if __name__ == "__main__":
    main()
