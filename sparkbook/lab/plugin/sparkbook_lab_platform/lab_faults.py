"""Lab faults that only the worker itself can make (sparkbook.lab.faults writes the flag file into
the node's Ray container; the worker reads it at the point of its start-up the fault belongs to):

* spin     after the distributed initialisation, the worker busy-waits while the flag exists, as a
           rank spinning in a collective that never completes does (NCCL polls for completion):
           CPU used, no log line, no compile. Removing the flag lets the start-up go on.
* compile  before its warm-up, the worker builds a C++ file again and again with the image's g++
           (real compiler processes, as Triton's ptxas, FlashInfer's nvcc or inductor's workers
           are) for the seconds the flag holds, logging nothing: a long first-boot compile that is
           work, not a stall.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

FLAGS = "/tmp/sparkbook-lab-faults"  # one file per fault, in the Ray container
SOURCE = "\n".join(f"int f{i}(int x) {{ return x * {i} + (x >> 3); }}" for i in range(400))


def _flag(name: str) -> str:
    return os.path.join(FLAGS, name)


def spin_while_flagged() -> None:
    counter = 0
    while os.path.exists(_flag("spin")):
        for _ in range(200_000):  # a second or so between two looks at the flag
            counter += 1


def compile_while_flagged() -> None:
    try:
        with open(_flag("compile")) as f:
            seconds = float(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernels.cpp")
        with open(src, "w") as f:
            f.write(SOURCE)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            subprocess.run(["g++", "-O2", "-c", src, "-o", os.path.join(tmp, "kernels.o")], check=True)
