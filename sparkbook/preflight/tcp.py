"""Preflight check of TCP between the nodes over the fabric, on the ports serving needs: a firewall
can pass ping and still drop Ray, the torch rendezvous or the API.

A port with nothing listening cannot tell "closed" from "reachable", so every node runs
``scripts/tcp_ports.py`` at the same moment (one round trip, all nodes at once): it listens briefly
on its fabric address, connects to every peer's, and reports only what failed. The checks are one
row per node and one FAIL per (from, to, port) that failed (:func:`sparkbook.preflight.reach.tcp`),
so their cost grows with the failures, not with the pairs of nodes.
"""

from __future__ import annotations

import json
from typing import TypedDict

from ..nodes.remote import Cluster, Result
from ..nodes.shell import SCRIPTS
from ..params import Node, Params

SCRIPT = SCRIPTS / "tcp_ports.py"
TIMEOUT_S = 2.0  # a SYN unanswered this long was dropped
WINDOW_S = 5.0  # refused connections are retried this long: the peer's listener may start later
SEEN = {"timeout": f"no answer within {TIMEOUT_S:g} s: dropped by a firewall (filtered)",
        "refused": "refused: rejected by a firewall, or nothing listens there"}


class Probe(TypedDict):
    peer: str
    address: str
    port: int
    seen: str  # timeout, refused or the error


class TcpReport(TypedDict, total=False):
    """What ``tcp_ports.py`` printed on one node, or why it could not run (``error``)."""
    listen: dict[str, str]  # port -> listening, busy or "error: ..."
    accepted: dict[str, int]  # port -> the peers' connections it accepted
    probes: int
    failed: list[Probe]
    error: str


# One port of Linux's ephemeral range (32768-60999): Ray's raylet, object manager and workers and
# NCCL's bootstrap bind random ports there unless told otherwise (Ray's `ray start` reference:
# "If not set, random ports will be chosen"), so a firewall that opens only the named ports passes
# the probes above and still hangs 04 or 05.
EPHEMERAL = 40000


def serving_ports(params: Params) -> dict[int, str]:
    """The ports serving needs between the nodes, each with what uses it."""
    found: dict[int, list[str]] = {}
    for what, port in (("ray", params.ports.ray), ("master", params.ports.master),
                       ("all-reduce", params.collectives_master[1]), ("api", params.ports.api),
                       ("ephemeral", EPHEMERAL)):
        found.setdefault(port, []).append(what)
    return {port: "/".join(names) for port, names in found.items()}


def shared(up: list[Node]) -> dict[str, list[str]]:
    """Fabric addresses held by more than one node, each with its nodes (one machine reached on
    several SSH ports, as in a test): only one of them can listen there, so the probe could not
    tell which node answered, and it is not run."""
    held: dict[str, list[str]] = {}
    for node in up:
        held.setdefault(node.fabric_address, []).append(node.name)
    return {address: names for address, names in held.items() if len(names) > 1}


def command(params: Params, node: Node, up: list[Node]) -> list[str]:
    """``tcp_ports.py`` for one node, its source sent inline (no copy, no extra round trip)."""
    spec = {"address": node.fabric_address, "ports": list(serving_ports(params)), "timeout": TIMEOUT_S,
            "window": WINDOW_S, "peers": [[p.name, p.fabric_address] for p in up if p.name != node.name]}
    return ["python3", "-c", SCRIPT.read_text(), json.dumps(spec)]


def probe(params: Params, cluster: Cluster, up: list[Node]) -> dict[str, TcpReport]:
    """Every reachable node's report, all at once: the probes only work when every node listens
    at the same moment, so ``ssh.parallel`` is raised to the node count for this round trip."""
    at_once = Cluster(up, cluster.ssh.model_copy(update={"parallel": max(len(up), cluster.ssh.parallel)}))
    results = at_once.run(lambda n: command(params, n, up), timeout=WINDOW_S + TIMEOUT_S + 20)
    return {name: parse(r) for name, r in results.items()}


def parse(r: Result) -> TcpReport:
    line = r.stdout.strip().splitlines()[-1:] if r.error is None else []
    try:
        report = json.loads(line[0])
    except (IndexError, ValueError):
        return {"error": r.summary()}
    return report if isinstance(report, dict) and "failed" in report else {"error": r.summary()}
