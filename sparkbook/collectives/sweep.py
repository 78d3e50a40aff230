"""The all-reduce sweeps of 02_collectives across all nodes, inside the serving image, so they
test the torch and NCCL (or gloo) that vLLM will use; with a hard timeout that places a hang.

One container per node runs torchrun (one process per GPU; one per node with gloo), rendezvous on
the head's first fabric address, and sweeps small messages (latency) then large ones (bandwidth) in
the same run. Rank 0 prints the results; every rank prints the phase it reached. The bandwidth is
judged at its plateau and the latency against its own bar (:mod:`sparkbook.collectives.nccltests`, which also
judges pasted nccl-tests tables).
"""

from __future__ import annotations

import csv
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..book.redact import mask
from ..book.tables import Table, human_bytes
from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..facts import signatures
from ..facts.parsers import nccl_transport, parse_nccl_log
from ..nodes import workdir
from ..nodes.remote import Cluster
from ..params import Node, Params
from ..serving.containers import deployment_label, docker_run, named
from ..serving.state import remove
from . import nccltests

SCRIPT = Path(__file__).parents[1] / "scripts" / "allreduce.py"
PHASES = ("rendezvous", "started", "init-done", "first-collective", "first-collective-done", "done")


def backend(params: Params) -> str:
    b = params.collectives.backend
    if b != "auto":
        return b
    return "nccl" if params.runtime.gpus and any(params.gpus_of(n) for n in params.nodes) else "gloo"


def container(params: Params) -> str:
    """The sweep's container on every node (this deployment's)."""
    return named(params, "collectives")


def script_path(params: Params, node: Node) -> str:
    """allreduce.py on ``node``, in the private working folder (mounted read-only)."""
    return f"{workdir.workdir(params, node)}/allreduce.py"


@dataclass(frozen=True)
class Group:
    """Nodes whose ranks sweep together, meeting at the first one's fabric address: every node
    (02's sweep), or one pair (:mod:`.pairs`); ``quick`` sweeps only the three largest sizes."""
    nodes: tuple[Node, ...]
    quick: bool = False

    @property
    def label(self) -> str:
        return "all" if not self.quick else ", ".join(n.name for n in self.nodes)


def command(params: Params, node: Node, group: Group | None = None) -> list[str]:
    """The container that runs this node's ranks, in ``group`` (default: every node)."""
    c = params.collectives
    group = group or Group(tuple(params.nodes))
    be = backend(params)
    port = params.collectives_master[1]
    addr = group.nodes[0].fabric_address
    nproc = max(params.gpus_of(node), 1) if be == "nccl" else 1
    sizes = c.sizes()[-3:] if group.quick else c.sizes()
    torchrun = ["torchrun", f"--nnodes={len(group.nodes)}", f"--nproc-per-node={nproc}",
                f"--node-rank={group.nodes.index(node)}", f"--master-addr={addr}",
                f"--master-port={port}", script_path(params, node), "--backend", be,
                "--sizes", ",".join(map(str, sizes)), "--iters", str(c.iters),
                "--warmup", str(c.warmup), "--timeout", str(int(c.timeout_s))]
    if c.latency_sizes() and not group.quick:
        torchrun += ["--latency-sizes", ",".join(map(str, c.latency_sizes())),
                     "--latency-iters", str(c.latency_iters)]
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "PYTHONUNBUFFERED": "1"}
    here = script_path(params, node)
    return docker_run(params, node, container(params), torchrun, env=env, mounts=[f"{here}:{here}:ro"])


@dataclass
class Sweep:
    """What the sweep found: rank 0's result (None when it did not finish), and every node's log,
    the phase its ranks reached and NCCL's choices read from the log."""
    backend: str
    result: dict | None = None
    logs: dict[str, str] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)
    nccl: dict[str, dict] = field(default_factory=dict)
    timed_out: bool = False
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    duration_s: float = 0.0
    left_running: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """What ``collectives.json`` keeps (the logs are in ``logs/NODE/collectives.log``)."""
        return {"backend": self.backend, "result": self.result, "phases": self.phases,
                "timed_out": self.timed_out, "duration_s": self.duration_s, "nccl": self.nccl}


def last_phase(log: str) -> str:
    """The furthest phase a node's ranks all reached ('rendezvous' when none started)."""
    reached = [m for m in re.findall(r"^PHASE (\S+)", log, re.M)]
    if not reached:
        return "rendezvous"
    named = [p for p in reached if p in PHASES]
    return named[-1] if named else "sweep"


def run(params: Params, cluster: Cluster, run_dir: Path | None = None, omit: tuple[str, ...] = (),
        say: Callable[[str], object] = print) -> Sweep:
    """Run the sweep; ``omit`` leaves nodes out (their ranks never join: a drill for the hang
    diagnosis). Always removes the containers and collects every node's log."""
    c = params.collectives
    small = (f"{human_bytes(c.latency_min_bytes)}-{human_bytes(c.latency_max_bytes)} then "
             if c.latency_sizes() else "")
    say(f"all-reduce: {backend(params)}, {len(params.nodes)} node(s), sizes {small}{c.min_size_mb:g}"
        f"-{c.max_size_mb:g} MB, time limit {c.timeout_s:.0f} s")
    return run_groups(params, cluster, [Group(tuple(params.nodes))], run_dir, omit, say)[0]


def run_groups(params: Params, cluster: Cluster, groups: list[Group], run_dir: Path | None = None,
               omit: tuple[str, ...] = (), say: Callable[[str], object] = print) -> list[Sweep]:
    """Sweeps of disjoint groups at once (each its own rendezvous at its first node), one
    :class:`Sweep` each; the logs go to ``logs/NODE/collectives.log`` (every node's group) or
    ``collectives-A-B.log`` (a pair)."""
    outs = [Sweep(backend(params)) for _ in groups]
    nodes = [n for g in groups for n in g.nodes]
    name = container(params)
    workdir.prepare(params, cluster, nodes)
    cluster.put(SCRIPT, lambda n: script_path(params, n), nodes).check("copy the all-reduce script to the nodes")
    cluster.run(remove(params, name), nodes)  # a leftover of an interrupted run (this deployment's only)
    group_of = {n.name: g for g in groups for n in g.nodes}
    start = time.monotonic()
    timed_out = False
    exit_codes: dict[str, int | None] = {}
    try:
        # workers first: each group's rank 0 hosts its rendezvous and waits for them
        for first in (False, True):
            batch = [n for g in groups for n in g.nodes if (n == g.nodes[0]) == first and n.name not in omit]
            if batch:
                cluster.run(lambda n: command(params, n, group_of[n.name]), batch).check(
                    "start the all-reduce containers",
                    "is the serving image on every node? (01_preflight.ipynb, 03_distribute_image.ipynb)")
        deadline = start + params.collectives.timeout_s
        shown = 0.0
        while True:
            states = cluster.run(["docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", name], nodes)
            running = {n: r.stdout.split()[0] == "true" for n, r in states.items() if r.ok}
            if not any(running.values()):
                exit_codes = {n: int(r.stdout.split()[1]) if r.ok else None for n, r in states.items()}
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            if time.monotonic() - shown > 10:
                shown = time.monotonic()
                say(f"  {shown - start:5.0f} s: running on {', '.join(n for n, r in running.items() if r)}")
            time.sleep(1)
    finally:
        logs = cluster.run(["docker", "logs", name], nodes, timeout=60)
        cluster.run(remove(params, name), nodes, timeout=60)
        left = cluster.run(["docker", "ps", "-aq", "--filter", f"label={deployment_label(params)}",
                            "--filter", f"name=^{name}$"], nodes)
    took = time.monotonic() - start
    for g, out in zip(groups, outs):
        out.timed_out, out.duration_s = timed_out, took
        out.left_running = [n.name for n in g.nodes if left[n.name].stdout.strip()]
        out.exit_codes = {n.name: exit_codes.get(n.name) for n in g.nodes}
        for node in g.nodes:
            r = logs[node.name]
            text = (r.stdout + r.stderr) if r.exit_code == 0 else f"(no container on {node.name}: {r.summary()})"
            out.logs[node.name] = text
            if run_dir is not None:
                log = "collectives.log" if not g.quick else f"collectives-{'-'.join(n.name for n in g.nodes)}.log"
                path = Path(run_dir) / "logs" / node.name / log
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(mask(text))
            out.phases[node.name] = "not started" if node.name in omit else last_phase(text)
            out.nccl[node.name] = parse_nccl_log(text)
            if node == g.nodes[0] and (m := re.search(r"^RESULT (.+)$", text, re.M)):
                out.result = json.loads(m[1])
    return outs


def diagnose(params: Params, out: Sweep) -> tuple[str, str]:
    """Where a failed sweep stopped, and the likely cause: a known failure signature in a node's
    log (sparkbook.facts.signatures) when there is one, else what the phase it stopped in suggests."""
    stuck = {n: p for n, p in out.phases.items() if p != "done"}
    phase = min(stuck.values(), key=lambda p: PHASES.index(p) if p in PHASES else -1) if stuck else "done"
    addr, port = params.collectives_master
    missing = [n for n, p in out.phases.items() if p in ("not started", "rendezvous")]
    if phase in ("not started", "rendezvous"):
        phase = "rendezvous"
    elif phase == "started":
        phase = "communicator init"
    elif phase in ("init-done", "first-collective"):
        phase = "first collective"
    else:
        phase = "sweep"
    hit = signatures.most_specific({f"logs/{n}/collectives.log": log for n, log in out.logs.items()}, step="02")
    if hit:
        detail = f"; {hit.detail}" if hit.detail and hit.detail not in hit.evidence else ""
        return (phase, f"{hit.cause} ({hit.where}: {hit.evidence}{detail}). {hit.remedy}")
    errors = [e for log in out.logs.values() if (e := signatures.last_error(log))]
    hint = f" Last error seen: {errors[-1]}" if errors else ""
    if phase == "rendezvous":
        return (phase, f"rank(s) on {', '.join(missing)} never joined the rendezvous at "
                f"{addr}:{port}: the node did not start its container, or cannot reach the head's "
                f"fabric address (firewall, wrong rail address, port in use).{hint}")
    if phase == "communicator init":
        return (phase, "the ranks met but could not build the communicator: an "
                "interface mismatch (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME must name a rail every "
                f"node reaches) or a firewall on NCCL's ports.{hint}")
    if phase == "first collective":
        return (phase, "the communicator exists but no data moves: a RoCE rail down, "
                f"an MTU mismatch on the path, or a wrong NCCL_IB_GID_INDEX.{hint}")
    return (phase, f"the sweep started but did not finish in time: a slow or flapping link, or a "
            f"time limit (collectives.timeout_s) too short for the largest size.{hint}")


def checks(params: Params, out: Sweep) -> list[Check]:
    """The sweep finished, its values are right, its bandwidth at the plateau and its small-message
    latency meet the expectations, and the transport NCCL chose on every node."""
    found: list[Check] = []
    e = params.expectations
    addr, port = params.collectives_master
    if out.left_running:
        found.append(Check("cleanup", ", ".join(out.left_running), FAIL,
                           "the all-reduce container is still there", "removed",
                           f"docker rm -f {container(params)}"))
    if out.result is None:
        phase, cause = diagnose(params, out)
        what = f"no result after {out.duration_s:.0f} s" + (" (time limit reached)" if out.timed_out else "")
        found.append(Check("all-reduce", "all", FAIL, f"{what}; stuck in: {phase}; "
                           + ", ".join(f"{n}: {p}" for n, p in out.phases.items()),
                           "every rank finishes the sweep", cause,
                           f"torchrun ... --master-addr={addr} --master-port={port} allreduce.py "
                           "(logs in logs/<node>/)"))
        return found
    rows, small = out.result["rows"], out.result.get("latency", [])
    bad = [r["bytes"] for r in small + rows if not r["correct"]]
    sizes = f"{len(small)} small and {len(rows)} large sizes" if small else f"{len(rows)} sizes"
    found.append(Check("all-reduce", "all", PASS, f"{sizes}, world size {out.result['world_size']}, "
                       f"{out.backend}, {out.duration_s:.0f} s",
                       "every rank finishes the sweep"))
    found.append(Check("reduced values", "all", FAIL if bad else PASS,
                       f"wrong at {', '.join(human_bytes(b) for b in bad)}" if bad else "correct at every size",
                       "sum of (rank+1) in every element", "a data corruption on the fabric or a broken "
                       "NCCL build: rerun, then test each rail alone" if bad else ""))
    found.append(nccltests.bandwidth_check(rows, e.busbw_gbps))
    found.append(nccltests.latency_check(small, e.allreduce_latency_us))
    return found + [transport_check(out, node) for node in params.nodes]


def transport_check(out: Sweep, node: Node) -> Check:
    """The transport NCCL chose on ``node``, read from its log: RDMA, P2P/SHM only, or a socket
    fallback."""
    if out.backend != "nccl":
        return Check("transport", node.name, SKIP, "gloo over TCP on the fabric rail (no GPUs)",
                     "NET/IB over RoCE with NCCL")
    parsed = out.nccl[node.name]
    kind = nccl_transport(parsed)
    fabric = any(r.hca for r in node.rails)
    if kind == "intra-node":
        return Check("transport", node.name, PASS, f"P2P/SHM only ({', '.join(parsed['channels'])}): "
                     "every peer on the same host", "RDMA (NET/IB) between hosts")
    if kind == "rdma":
        return Check("transport", node.name, PASS,
                     f"NCCL {parsed['network']} via {', '.join(parsed['hcas']) or 'HCAs'}", "RDMA (NET/IB)")
    if kind == "socket" and fabric:
        return Check("transport", node.name, FAIL, f"socket fallback (NET/Socket over "
                     f"{', '.join(parsed['socket_ifs']) or '?'}), about 8x slower on Sparks",
                     "RDMA (NET/IB) over the configured HCAs",
                     "NCCL found no usable HCA: check /dev/infiniband in the container (runtime.rdma), "
                     "NCCL_IB_HCA, libibverbs in the image and the rails (01_preflight.ipynb)")
    return Check("transport", node.name, WARN if fabric else PASS,
                 f"NCCL network {parsed['network'] or 'unknown'}", "RDMA (NET/IB)")


def write_csv(out: Sweep, path: Path, key: str = "rows") -> Path | None:
    """One sweep's rows as CSV (``key``: ``rows``, the bandwidth sizes, or ``latency``, the small
    ones); nothing when the sweep did not finish or has no such rows."""
    rows = (out.result or {}).get(key)
    if not rows:
        return None
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def plot(params: Params, out: Sweep, path: Path | None = None):
    """busbw against message size (log x, y from 0), with the expectation and the plateau marked."""
    rows = (out.result or {}).get("rows")
    if not rows:
        return None
    fig, ax = _axes()
    ax.plot([r["bytes"] for r in rows], [r["busbw_gbs"] for r in rows], marker="o",
            label=f"busbw ({out.backend}, {out.result['world_size']} ranks)")
    if best := nccltests.plateau(rows):
        ax.plot([best["bytes"]], [best["busbw_gbs"]], marker="*", markersize=16, linestyle="none",
                color="tab:green", label=f"plateau {best['busbw_gbs']:.2f} GB/s at {human_bytes(best['bytes'])}")
    ax.axhline(params.expectations.busbw_gbps, color="tab:red", linestyle="--",
               label=f"expectation {params.expectations.busbw_gbps:g} GB/s")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("bus bandwidth (GB/s)")
    return _finish(fig, ax, f"all-reduce bandwidth across {len(params.nodes)} nodes: {params.name}", path)


def latency_plot(params: Params, out: Sweep, path: Path | None = None):
    """The time of one small all-reduce against its size, log-log, with the bar when one is set
    (the y axis then reaches it)."""
    rows = (out.result or {}).get("latency")
    if not rows:
        return None
    fig, ax = _axes()
    ax.plot([r["bytes"] for r in rows], [r["time_us"] for r in rows], marker="o",
            label=f"time per all-reduce ({out.backend}, {out.result['world_size']} ranks)")
    if bar := params.expectations.allreduce_latency_us:
        ax.axhline(bar, color="tab:red", linestyle="--", label=f"expectation ≤ {bar:g} µs")
    ax.set_yscale("log")
    ax.set_ylabel("time per all-reduce (µs)")
    return _finish(fig, ax, f"small all-reduces across {len(params.nodes)} nodes: {params.name}", path)


def _axes():
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=(7, 4))


def _finish(fig, ax, title: str, path: Path | None):
    import matplotlib.pyplot as plt
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    plt.close(fig)  # shown by returning it, not by pyplot's state
    return fig


def table(out: Sweep | None) -> Table:
    """The bandwidth sizes, the plateau marked."""
    rows = ((out and out.result) or {}).get("rows", [])
    return nccltests.table(rows, "all-reduce bandwidth sweep", nccltests.plateau(rows))


def latency_table(out: Sweep | None) -> Table:
    """The small sizes: the time of one all-reduce."""
    return nccltests.table(((out and out.result) or {}).get("latency", []), "all-reduce small messages")
