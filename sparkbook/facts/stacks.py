"""Where a quiet worker's threads are: the output of sparkbook/scripts/worker_stacks.sh (each
worker process's threads from /proc, read twice a second apart, and `py-spy dump` where it ran)
read into the busiest thread and, from a Python stack, the phase it is in.

py-spy prints each thread's stack innermost frame first, a frame as ``function (file:line)``
("Thread 99 (idle): "MainThread"" then "    all_reduce (torch/distributed/distributed_c10d.py:3252)":
tests/fixtures/stacks/, captured on the lab). A stack names its phase by the first of STACK_PHASES
that any of its frames matches: the set-up of the process groups before a collective inside it,
a compile before what it compiles for.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# (phase, frames that put a stack in it), in the order a stack is named by.
STACK_PHASES: list[tuple[str, re.Pattern]] = [(name, re.compile(pattern)) for name, pattern in [
    ("distributed init", r"init_process_group|init_distributed_environment|initialize_model_parallel|"
                         r"init_model_parallel_group|new_group|PyNcclCommunicator\.__init__|rendezvous|TCPStore"),
    ("compile", r"torch/_inductor/|torch/_dynamo/|triton/compiler/|triton/runtime/(?:autotuner|build)|"
                r"flashinfer/jit/|deep_gemm/|compile_worker"),
    ("graph capture", r"capture_model|[Cc]uda_?[Gg]raph|graph_capture|CUDAGraph"),
    ("weights", r"load_weights|safetensors|model_loader|weight_loader"),
    ("kv cache", r"allocate_kv_cache|initialize_kv_cache|determine_available_memory|profile_run"),
    ("collective", r"torch/distributed/distributed_c10d\.py|pynccl|all_reduce|all_gather|reduce_scatter|"
                   r"broadcast|barrier|\bsend\b|\brecv\b|synchronize"),
]]
_THREAD = re.compile(r'^Thread (?P<tid>\d+) \((?P<state>[^)]*)\): "(?P<name>[^"]*)"')
_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^():]+):(?P<line>\d+)\)\s*$")


@dataclass
class Thread:
    tid: int
    name: str
    state: str = ""          # /proc's (R running, S sleeping...) or py-spy's (active, idle, active+gil)
    cpu_share: float = 0.0   # of one core, over the second between the two reads (/proc)
    frames: list[str] = field(default_factory=list)  # py-spy's, innermost first


@dataclass
class Sample:
    """One node's sample: its workers' threads from /proc, their Python stacks where py-spy ran,
    and why it did not where it did not."""
    threads: list[Thread] = field(default_factory=list)
    stacks: list[Thread] = field(default_factory=list)
    pyspy: str = ""  # "" where py-spy ran, else why not

    @property
    def busiest(self) -> Thread | None:
        return max(self.threads, key=lambda t: t.cpu_share, default=None)

    def phase(self) -> tuple[str, str]:
        """The phase the Python stacks are in and the frame that says so (the busiest thread's
        stack where /proc names it, else the first that names a phase), or ("", "")."""
        busy = self.busiest
        ordered = sorted(self.stacks, key=lambda t: busy is None or t.tid != busy.tid)
        for thread in ordered:
            for name, rx in STACK_PHASES:
                if frame := next((f for f in thread.frames if rx.search(f)), ""):
                    return name, frame
        return "", ""

    def summary(self) -> str:
        """``busiest thread 'ray::RayWorkerProc' (R, 98% of a core); Python stack: in collective at
        all_reduce (torch/distributed/distributed_c10d.py:3252)``, or what could be read."""
        parts = []
        if busy := self.busiest:
            parts.append(f"busiest thread '{busy.name}' ({busy.state}, {busy.cpu_share:.0%} of a core)")
        phase, frame = self.phase()
        if phase:
            parts.append(f"Python stack: in {phase} at {frame.strip()}")
        elif self.stacks:
            top = next((t.frames[0].strip() for t in self.stacks if t.frames), "")
            parts.append(f"Python stack at {top}" if top else "no Python frame read")
        elif self.pyspy:
            parts.append(f"no Python stack ({self.pyspy})")
        return "; ".join(parts)


def parse_pyspy(text: str) -> list[Thread]:
    """The threads of ``py-spy dump`` output, each with its frames (innermost first)."""
    threads: list[Thread] = []
    for line in text.splitlines():
        if m := _THREAD.match(line):
            threads.append(Thread(int(m["tid"]), m["name"], m["state"]))
        elif threads and (m := _FRAME.match(line)):
            threads[-1].frames.append(f"{m['func']} ({m['file']}:{m['line']})")
    return threads


def parse_sample(text: str) -> Sample:
    """worker_stacks.sh's output: ``@@ threads`` lines "TID STATE SHARE NAME", ``@@ py-spy PID``
    sections holding a dump, ``@@ no-py-spy`` with why not."""
    sample, section, dump = Sample(), "", []
    for line in text.splitlines() + ["@@ end"]:
        if line.startswith("@@ "):
            if section == "py-spy":
                sample.stacks += parse_pyspy("\n".join(dump))
            section, dump = line[3:].split(" ", 1)[0], []
            if section == "no-py-spy":
                sample.pyspy = line[3 + len("no-py-spy"):].strip()
            continue
        if section == "threads" and (f := line.split(None, 3)) and len(f) == 4 and f[0].isdecimal():
            try:
                sample.threads.append(Thread(int(f[0]), f[3], f[1], float(f[2])))
            except ValueError:
                continue
        elif section == "py-spy":
            dump.append(line)
    return sample
