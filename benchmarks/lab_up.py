"""How long `sparkbook lab up` and `lab down` take, for 2 and 8 nodes, measured in one run.

Goal (the lab issue): `lab up` of 2 nodes under 30 s once the image is built. Prints each time and
its ratio to the goal. Needs root; builds the lab image first if it is missing (not timed).

    .venv/bin/python benchmarks/lab_up.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sparkbook.lab import Lab
from sparkbook.lab.image import ensure
from sparkbook.lab.lab import lab_params, leftovers

GOAL_UP_S = 30.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", default="2,8")
    args = ap.parse_args()
    lab = Lab()
    lab.down(say=lambda *_: None)
    ensure(lab_params(2)["runtime"]["image"], say=lambda *_: None)
    quiet = lambda *_: None
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
