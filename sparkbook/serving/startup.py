"""vLLM's start-up as 05 watches it on every node: the container's state, the phase its log has
reached, and whether it still makes progress.

A start-up that hangs (the reference deployment's NCCL initialisation hang) must be called in
minutes, not at the 40-minute start-up limit. A node makes progress while its log grows, while
something compiles in its container (a first boot that builds kernels for 17 to 36 minutes with no
log line is work), or while vLLM's workers on it use CPU (the API server and the engine poll while
they wait, so theirs is not counted) unless that CPU is a spin: a rank that polls in a collective
that never completes (NCCL busy-waits) burns CPU in its own threads with no log line and nothing
compiling. Its own CPU without a compile is called a spin where no compile can be (the ranks
connecting, before the weights) or where it is the only node at work (its peers idle: they wait
on it, or it on them). When no node has made progress for
``serving.stall_timeout``, the start-up has stalled, in the phase the logs last reached.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..facts import phases
from ..facts.parsers import parse_sections
from ..facts.signatures import ray_address
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..nodes.workdir import serve_log
from ..params import Params
from .plan import plan
from .vllm import NAME, PHASE_CAUSES, SERVE_PATTERN, START_CAUSE, WAITING

TAIL_LINES = 40
# CPU seconds per second of wall time above which vLLM's processes count as working: an idle
# Python process polling its sockets stays well below it, a compile or a weight load far above.
BUSY_CPU = 0.05
MIN_QUIET_READS = 3  # readings without progress that a stall needs, however long the gap between them

ORDER = [name for name, _ in phases.VLLM]
# The phase in which nothing compiles: the ranks connect (NCCL, gloo). vLLM builds kernels once
# the weights load (torch.compile, the KV cache's profiling run, CUDA graphs); before it, a worker
# still imports its modules (CPU and no log line for a while on a slow node).
NO_COMPILE = {"distributed init"}


def phase_of(lines: list[str], current: str = "") -> str:
    """The latest phase ``lines`` reach (phases never go back: ``current`` is kept otherwise)."""
    return phases.reached(lines, NAME, current).phase


def likely_cause(phase: str) -> str:
    return PHASE_CAUSES.get(phase, START_CAUSE)


# A spinning rank has been placed and runs: the cause of its phase, where its log says one past
# Ray's placement, follows this.
SPIN_CAUSE = ("a rank spinning: its vLLM workers used CPU with no log line and nothing compiling, as one "
              "polling in a collective that never completes does (NCCL busy-waits); where its threads were "
              "follows the stall (logs/<node>/worker-stacks.txt; runtime.ptrace lets py-spy read its Python "
              "stack where the host restricts ptrace); run 02_collectives.ipynb with the serving image")


@dataclass
class NodeProgress:
    """One reading of one node."""
    status: str            # "running", "exited with code 137, killed for memory (OOM)", "serve-exited"...
    cpu_s: float | None    # CPU seconds of vLLM's processes so far (None: not read)
    tail: list[str]        # the log's last lines
    stuck: int = 0         # of those processes, how many are stopped or in uninterruptible sleep
    compile_s: float | None = None  # CPU seconds of compilers in the container so far (None: not read)

    @property
    def last_line(self) -> str:
        return self.tail[-1] if self.tail else ""

    @property
    def dead(self) -> bool:
        return not self.status.startswith(("running", "?"))


def read_progress(params: Params, cluster: Cluster) -> dict[str, NodeProgress]:
    """Every node's reading, in one round trip per node: with Ray, the head's vllm serve and every
    node's Ray container (which holds vLLM's Ray workers); with mp, every serving container."""
    name = plan(params).serving_container

    def cmd(node):
        if params.serving.executor != "ray":
            return script("serving_progress.sh", name, "mp", TAIL_LINES)
        if node.role == "head":
            return script("serving_progress.sh", name, "ray-head", TAIL_LINES, SERVE_PATTERN,
                          serve_log(params, node))
        return script("serving_progress.sh", name, "ray-worker", TAIL_LINES)

    out = {}
    for n, r in cluster.run(cmd, params.serving_nodes, timeout=30).items():
        first, _, rest = r.stdout.partition("\n")
        sections = parse_sections(rest)
        tail = [ln for ln in sections.get("tail", "").splitlines() if ln.strip()]
        stuck = sections.get("stuck", "").strip()
        out[n] = NodeProgress(describe_state(first if r.stdout else "?"), _seconds(sections, "cpu"), tail,
                              int(stuck) if stuck.isdecimal() else 0, _seconds(sections, "compile"))
    if params.serving.executor == "ray":
        attribute_ray_lines(params, out)
    return out


def _seconds(sections: dict[str, str], name: str) -> float | None:
    try:
        return float(sections.get(name, "").strip())
    except ValueError:
        return None


def attribute_ray_lines(params: Params, readings: dict[str, NodeProgress]) -> None:
    """vllm serve's log on the head holds every Ray worker's lines, prefixed
    ``(RayWorkerProc pid=437, ip=10.77.1.12)``: each goes to the node of that address, so that
    every node's phase and progress are its own."""
    head = readings.get(params.head.name)
    if head is None:
        return
    own = []
    for line in head.tail:
        node = params.by_address.get(ray_address(line) or "")
        if node and node != params.head.name and node in readings:
            readings[node].tail.append(line)
        else:
            own.append(line)
    head.tail = own


def describe_state(line: str) -> str:
    """``docker inspect``'s "STATUS EXIT_CODE OOM_KILLED" in words."""
    words = line.split()
    status = words[0] if words else "?"
    if status not in ("running", "?", "absent") and len(words) >= 3:
        code, oom = words[1], words[2] == "true"
        status += f" with code {code}" + (", killed for memory (OOM)" if oom else
                                          ", killed by a signal" if code in ("137", "143") else "")
    return status


@dataclass
class Stall:
    node: str        # the node furthest behind (among equals, the one still longest: see StallWatch)
    phase: str       # the phase its log had reached ("" before the first)
    quiet_s: float   # how long no node made progress
    last_line: str
    cause: str
    readings: int = 0  # readings of every node in the quiet span
    held: bool = False  # the node's vLLM processes were stopped or in uninterruptible sleep (the last readings)
    every_s: float = 0.0  # seconds between two readings in the quiet span, on average: how late a
    # stall can be called (the reading after the last progress, then the one past the timeout)
    spinning: bool = False  # the node's vLLM workers used CPU, but no log line and no compile (the last readings)
    where: str = ""  # where its workers' threads were when it was called (serving/stacks.py)

    @property
    def summary(self) -> str:
        """``stalled in phase 'weights': no node logged a line, compiled or worked in vLLM's workers
        (a spin is no work) for 62 s (...); spark-2 is furthest behind``."""
        if self.held:
            who = f"{self.node}'s vLLM processes are stopped or in uninterruptible sleep (state T or D)"
        elif self.spinning:
            who = (f"{self.node}'s vLLM workers are spinning: using CPU in their own threads with no log "
                   "line and nothing compiling, as a rank polling in a collective that never completes")
        else:
            who = f"{self.node} is furthest behind"
        return (f"stalled in phase '{self.phase or 'start'}': no node logged a line, compiled or worked in "
                f"vLLM's workers (a spin is no work) for {self.quiet_s:.0f} s ({self.readings} readings, one "
                f"every {self.every_s:.0f} s); {who}" + (f"; {self.where}" if self.where else ""))


@dataclass
class StallWatch:
    """Follows the readings; says when no node has made progress for ``timeout`` seconds."""
    timeout: float
    phases: dict[str, str] = field(default_factory=dict)
    _cpu: dict[str, float] = field(default_factory=dict)
    _tail: dict[str, list[str]] = field(default_factory=dict)
    _moved: dict[str, float] = field(default_factory=dict)
    _seen: dict[str, float] = field(default_factory=dict)
    _ticked: dict[str, float] = field(default_factory=dict)  # when its vLLM last used any CPU at all
    _stuck: dict[str, int] = field(default_factory=dict)  # readings in a row with a process held
    _compile: dict[str, float] = field(default_factory=dict)
    _spins: dict[str, int] = field(default_factory=dict)  # readings in a row spinning
    _quiet_reads: int = 0  # readings since the last progress of any node

    def update(self, readings: dict[str, NodeProgress], now: float | None = None) -> Stall | None:
        now = time.monotonic() if now is None else now
        busy, compiling, moved = {}, {}, set()
        for node, p in readings.items():
            self.phases[node] = phase_of(p.tail, self.phases.get(node, ""))
            if node not in self._moved:
                self._moved[node] = now
            busy[node] = self._rate(self._cpu, node, p.cpu_s, now)
            compiling[node] = self._rate(self._compile, node, p.compile_s, now)
            working = [ln for ln in p.tail if not WAITING.search(ln)]
            if working != self._tail.get(node, working):
                moved.add(node)
            if p.cpu_s is not None:
                if p.cpu_s != self._cpu.get(node):
                    self._ticked[node] = now
                self._cpu[node] = p.cpu_s
            if p.compile_s is not None:
                self._compile[node] = p.compile_s
            self._tail[node], self._seen[node] = working, now
            self._stuck[node] = self._stuck.get(node, 0) + 1 if p.stuck else 0
        for node in readings:
            peers = [n for n in readings if n != node]
            spinning = (busy[node] and not compiling[node] and node not in moved and
                        (self.phases[node] in NO_COMPILE or
                         bool(peers) and not any(busy[n] or compiling[n] for n in peers)))
            self._spins[node] = self._spins.get(node, 0) + 1 if spinning else 0
            if node in moved or compiling[node] or busy[node] and not spinning:
                self._moved[node] = now
        last = max(self._moved.values(), default=now)
        self._quiet_reads = 0 if last == now else self._quiet_reads + 1
        # a stall is seen, not inferred from one late reading: this machine may have been too
        # busy to poll (the quiet span counts only what readings in it showed)
        if not self._moved or now - last < self.timeout or self._quiet_reads < MIN_QUIET_READS:
            return None
        # A node whose vLLM processes were held (stopped, or in uninterruptible sleep) in the last
        # MIN_QUIET_READS readings is the culprit: such a process waits on no other node (a
        # moment's disk wait does not last that long).
        # Otherwise the node furthest behind (its log reached the earliest phase): the others
        # wait for it. Among equals, the one whose vLLM has used no CPU at all for the longest (a
        # process that waits mostly still ticks: its threads poll), then the one that went quiet
        # first.
        rank = {n: ORDER.index(ph) if ph else -1 for n, ph in self.phases.items()}
        held = {n for n, reads in self._stuck.items() if reads >= MIN_QUIET_READS}
        spinning = {n for n, reads in self._spins.items() if reads >= MIN_QUIET_READS}
        behind = min(self._moved, key=lambda n: (n not in held, n not in spinning, rank.get(n, -1),
                                                 self._ticked.get(n, self._moved[n]), self._moved[n]))
        ahead = max(self.phases.values(), key=lambda ph: ORDER.index(ph) if ph else -1)
        own = self.phases.get(behind, "")
        phase = own or ahead
        spins = behind not in held and behind in spinning
        cause = likely_cause(phase)
        if spins:  # its own log's phase only: a silent log says nothing of where it spins
            cause = SPIN_CAUSE + (f"; {likely_cause(own)}" if own not in ("", "ray") else "")
        return Stall(behind, phase, now - last, readings[behind].last_line, cause, self._quiet_reads,
                     behind in held, (now - last) / self._quiet_reads, spins)

    def _rate(self, totals: dict[str, float], node: str, seconds: float | None, now: float) -> bool:
        """Whether ``seconds`` (a running total of CPU) grew by more than BUSY_CPU per second of
        wall time since the node's last reading."""
        return (seconds is not None and node in totals and
                seconds - totals[node] > BUSY_CPU * (now - self._seen[node]))
