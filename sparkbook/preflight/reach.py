"""Preflight checks of reachability: SSH from here to every node, from the head to every worker
(what Ray, the image copy and the model sync need), and TCP between the nodes on the serving ports."""

from __future__ import annotations

from typing import Iterator

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..params import Node, Params
from .collect import Preflight
from .tcp import SEEN, TIMEOUT_S, Probe, serving_ports, shared


def ssh(params: Params, pf: Preflight) -> Iterator[Check]:
    for node in params.nodes:
        error = pf.errors.get(node.name)
        if error:
            yield Check("ssh", node.name, FAIL, error, "an SSH session (BatchMode, host key known)",
                        "bring the node up, or fix its host/user/key/known_hosts; every other check "
                        "of this node is skipped", "ssh ...")
        else:
            yield Check("ssh", node.name, PASS, "answers", "an SSH session")


def node_to_node(params: Params, pf: Preflight) -> Iterator[Check]:
    """SSH from the head to every worker, and from each worker that relays the image (03) to the
    workers it feeds (see :func:`sparkbook.preflight.collect.ssh_peers`)."""
    order = {n.name: i for i, n in enumerate(params.nodes)}  # not the order the probes ended in
    for node in pf.up(params):
        via = "head" if node.role == "head" else "relay"
        peers = sorted(pf.nodes[node.name]["peers_ssh"].items(), key=lambda kv: order.get(kv[0], len(order)))
        for peer, (target, ok) in peers:
            yield Check(f"ssh {via}→worker", peer, PASS if ok else FAIL,
                        f"{node.name} → {target}: {'answers' if ok else 'refused or unreachable'}",
                        f"key-based SSH from {node.name}, host key known",
                        "" if ok else f"on {node.name}: ssh-copy-id {target}, then ssh {target} once "
                        "to check and accept its host key", f"ssh -o BatchMode=yes -o ConnectTimeout=5 {target} true")


def tcp(params: Params, pf: Preflight) -> Iterator[Check]:
    """Per node: its serving ports reached from every peer over the fabric; else one FAIL per
    (from, to, port), on the node to open. Rows grow with the failures, not the pairs."""
    up = pf.up(params)
    for address, names in shared(up).items():
        yield Check("tcp ports", ", ".join(names), SKIP, f"{', '.join(names)} share the fabric address {address}: "
                    "only one of them can listen there, so the probe could not tell them apart",
                    "the serving ports reached from every node over the fabric",
                    "give each node its own fabric address (rails) in the parameters")
    if len(up) < 2 or not any(pf.nodes[n.name]["tcp"] for n in up):
        return  # one node, or not probed
    ports = serving_ports(params)
    into: dict[str, list[tuple[Node, Probe]]] = {n.name: [] for n in up}
    probed = set()
    for node in up:
        rep = pf.nodes[node.name]["tcp"] or {}
        if "error" in rep:
            yield Check("tcp ports", node.name, WARN, f"not probed from {node.name}: {rep['error']}"[:300],
                        "the serving ports probed from every node", "python3 must run on the node (it listens and "
                        "connects for this check); see the error", "python3 sparkbook/scripts/tcp_ports.py SPEC")
        elif rep:
            probed.add(node.name)
            for p in rep["failed"]:
                into[p["peer"]].append((node, p))
    shown = ", ".join(f"{what} {port}" for port, what in ports.items())
    for node in up:
        if node.name not in probed:  # it never listened: its WARN says why; probes into it prove nothing
            continue
        listen = (pf.nodes[node.name]["tcp"] or {}).get("listen", {})
        for src, p in into[node.name]:
            yield tcp_failure(src, node, p, ports.get(p["port"], "?"), listen.get(str(p["port"]), ""))
        if not into[node.name]:
            peers = len(probed - {node.name})
            yield Check("tcp ports", node.name, PASS, f"{shown} on {node.fabric_address}: reached from "
                        f"{peers} peer{'s' if peers != 1 else ''}", "the serving ports reached from "
                        "every node over the fabric")


def tcp_failure(src: Node, dst: Node, p: Probe, what: str, listen: str) -> Check:
    """One (from, to, port) that failed: what was seen and the firewall rule that lets it in."""
    addr, port = p["address"], p["port"]
    seen = SEEN.get(p["seen"], p["seen"])
    if listen not in ("", "listening"):
        seen += f" ({dst.name} could not listen there: {listen})"
    subnet = str(src.rails[0].network) if src.rails else src.fabric_address
    return Check("tcp ports", dst.name, FAIL, f"{src.name} → {dst.name} {addr}:{port} ({what}): {seen}",
                 f"TCP {port} reached from {src.name}",
                 f"on {dst.name}, let the whole fabric in, not only this port (Ray's raylet, object "
                 f"manager and workers and NCCL's bootstrap pick further ports at start): `sudo ufw allow "
                 f"from {subnet}` (or `sudo iptables -I INPUT -s {subnet} -j ACCEPT`); "
                 f"if {dst.name} has no such rule, check {src.name}'s outgoing ones (`sudo iptables -S OUTPUT`)",
                 f"on {src.name}: timeout {TIMEOUT_S:g} bash -c '</dev/tcp/{addr}/{port}' (while {dst.name} "
                 f"listens there, e.g. python3 -m http.server --bind {addr} {port})")


def unreachable(params: Params, pf: Preflight) -> Iterator[Check]:
    """The checks that could not run, one row per node that did not answer."""
    for node in params.nodes:
        if node.name not in pf.nodes:
            yield Check("node checks", node.name, SKIP, "not reachable: see the ssh check")
