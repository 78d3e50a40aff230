"""The Ray cluster (04): a Ray container per node, the head first, the workers joining on its fabric
address; checked as the head's Ray sees it, and stopped as a whole."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypedDict

from ..book.errors import CheckFailed
from ..book.progress import Progress, fraction_of
from ..book.step import Outcome
from ..facts.parsers import parse_sections
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..params import Params
from .plan import plan
from .listeners import Listener, read_listeners
from .logs import collect_logs
from .state import node_states, refuse_over_service, remove, require_image, start


class RayNode(TypedDict):
    ip: str
    alive: bool
    resources: dict[str, float]  # CPU, GPU, object_store_memory...


@dataclass
class RayCluster(Outcome):
    """The Ray cluster as the head's Ray sees it (04's outcome, kept only in memory)."""
    nodes: dict[str, RayNode] = field(default_factory=dict)  # by node name
    missing: list[str] = field(default_factory=list)
    status_text: str = ""  # `ray status`
    seconds: float = 0.0
    error: str | None = None
    workers: dict[str, int] = field(default_factory=dict)  # with actors: vLLM's Ray workers by node
    workers_error: str | None = None  # why the actors could not be listed
    version: str | None = None  # the Ray of the image (token authentication from 2.52)
    listeners: dict[str, list[Listener]] = field(default_factory=dict)  # what the containers listen on


def ray_nodes(params: Params, cluster: Cluster, actors: bool = False) -> RayCluster:
    """The Ray cluster as the head's Ray sees it, by node name (matched on fabric addresses); with
    ``actors``, also vLLM's Ray workers per node (every node of the cluster, 0 where it has none;
    a call to Ray's state API, so not on every poll)."""
    r = cluster.run_on(params.head, script("ray_nodes.sh", plan(params).ray_container, *(["actors"] if actors else [])),
                       timeout=90)
    out = RayCluster(status_text=parse_sections(r.stdout).get("status", ""))
    version = re.search(r"^RAYVERSION (\S+)$", r.stdout, re.M)
    out.version = version.group(1) if version else None
    found = re.search(r"^RAYNODES (.*)$", r.stdout, re.M)
    if not found:
        out.error = r.summary()
        out.missing = [n.name for n in params.serving_nodes]
        return out
    by_ip = params.by_address
    for rec in json.loads(found.group(1)):
        if rec["alive"] and rec["ip"] in by_ip:
            out.nodes[by_ip[rec["ip"]]] = rec
    out.missing = [n.name for n in params.serving_nodes if n.name not in out.nodes]
    if not actors:
        return out
    listed = re.search(r"^RAYACTORS (.*)$", r.stdout, re.M)
    if listed:
        # vLLM's Ray workers: RayWorkerProc (its newer Ray executor), RayWorkerWrapper (vLLM 0.17's)
        out.workers = {name: 0 for name in out.nodes}
        for a in json.loads(listed.group(1)):
            if "Worker" in a["class"]:
                node = by_ip.get(a["ip"], a["ip"])
                out.workers[node] = out.workers.get(node, 0) + 1
    else:
        why = re.search(r"^RAYACTORS-ERROR (.*)$", r.stdout, re.M)
        out.workers_error = why.group(1) if why else "no answer from Ray's state API"
    return out


def form_ray_cluster(params: Params, cluster: Cluster, run_dir: Path | None = None,
                     timeout: float = 180, say: Callable[[str], object] = print) -> RayCluster:
    """Ray head on the head node, workers joining on its fabric address; waits until every node is
    in the cluster with its GPUs (CPUs in the lab). Idempotent: a matching cluster is kept. With
    the mp executor nothing uses the cluster: it is stopped once checked."""
    start_t = time.monotonic()
    p = plan(params)
    name = p.ray_container
    current = node_states(params, cluster)
    stray = [n for n in params.nodes if n not in params.serving_nodes and current[n.name].running(name)]
    if stray:  # a node that no longer serves must not offer its GPUs to vLLM's placement group
        say(f"removing the Ray container of {', '.join(n.name for n in stray)}: not in serving.nodes")
        cluster.run(remove(params, name), stray).check(
            "remove the Ray container of the nodes outside serving.nodes", "08_teardown.ipynb removes it")
    running = all(current[n.name].current(name, p.nodes[n.name].ray.fingerprint) for n in params.serving_nodes)
    rc = ray_nodes(params, cluster) if running else RayCluster(missing=[n.name for n in params.serving_nodes])
    if rc.missing or params.serving.executor != "ray":  # it would be replaced, or stopped
        refuse_over_service(params, cluster, "04")
    if not rc.missing:
        say("the Ray cluster is already up with every node and matches the parameters: kept")
    else:
        require_image(params, current)
        try:
            start(params, cluster, params.serving_nodes, True, say=say)
        except CheckFailed:  # the head may have started before a worker failed
            stop_ray(params, cluster, run_dir)
            raise
        rc = wait_joined(params, cluster, timeout)
    rc.seconds = time.monotonic() - start_t
    if not rc.missing:
        rc.listeners, _ = read_listeners(params, cluster)
    if rc.missing:  # nothing half-formed stays up: logs first (with a run folder), then the containers
        stop_ray(params, cluster, run_dir)
    elif params.serving.executor != "ray":
        stop_ray(params, cluster, run_dir)
        say("serving.executor is mp: the Ray cluster was formed and checked, and is now stopped")
    return rc


def wait_joined(params: Params, cluster: Cluster, timeout: float) -> RayCluster:
    """Ray's view of the cluster once every node has joined, or at ``timeout``."""
    deadline = time.monotonic() + timeout
    rc = RayCluster(missing=[n.name for n in params.serving_nodes])
    with Progress("Ray cluster") as progress:
        while time.monotonic() < deadline:
            rc = ray_nodes(params, cluster)
            progress.update("nodes", f"{len(rc.nodes)} of {len(params.serving_nodes)} joined"
                            + (f"; waiting for {', '.join(rc.missing)}" if rc.missing else ""),
                            fraction=fraction_of(len(rc.nodes), len(params.serving_nodes)))
            if not rc.missing:
                break
            time.sleep(3)
    return rc


def stop_ray(params: Params, cluster: Cluster, run_dir: Path | None) -> None:
    """Remove the Ray containers (their logs saved first, with a run folder)."""
    name = plan(params).ray_container
    if run_dir:
        collect_logs(params, cluster, run_dir, [name])
    cluster.run(remove(params, name))
