"""What preflight learns from each node: one bundle of node scripts per node, one SSH round trip
each (all nodes at once), parsed into one :class:`NodeReport` per node; then one short round trip
for the clocks, and one for TCP between the nodes on the serving ports."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from ..book.step import Outcome
from ..facts import identity, inventory, memfit
from ..facts.inventory import NodeFacts, NodeRow
from ..facts.manifest import Manifest, manifests
from ..facts.parsers import (Fec, Gid, IbDevice, LinkSpeed, RailMap, SmiTable, parse_ethtool,
                             parse_fec_sections, parse_ibdev2netdev, parse_ibstat, parse_ibv_devinfo,
                             parse_nvidia_smi_table, parse_sections, parse_show_gids)
from ..nodes.remote import Cluster, drop
from ..nodes.shell import PEER_SSH, Bundle, bundle, script
from ..params import Node, Params
from ..serving import vllm as engine
from . import tcp
from .host_state import HostState, parse_host_state
from ..params.layout import RING, classify

# Processes that hold GPU memory when left over from an earlier run: the engine's, Ray's, torchrun.
STALE = rf"{engine.STALE}|raylet|gcs_server|ray::|torchrun"


class Address(TypedDict, total=False):
    family: str  # inet, inet6
    local: str
    prefixlen: int


class Link(TypedDict, total=False):
    """An interface as ``ip -j addr show`` prints it (the fields read here; the others are kept)."""
    ifname: str
    mtu: int
    operstate: str
    addr_info: list[Address]


class Ping(TypedDict):
    interface: str
    peer: str  # the peer's address on the same rail
    ok: bool  # the don't-fragment ping was answered


class NodeReport(TypedDict):
    """Everything one node reported, parsed; None where the tool is not installed."""
    facts: NodeFacts
    smi: SmiTable | None
    ibdev2netdev: dict[str, RailMap] | None
    ibstat: dict[str, IbDevice] | None
    ibv_devinfo: dict[str, IbDevice] | None
    ethtool: dict[str, LinkSpeed]  # rail interface -> its speed
    fec: dict[str, Fec] | None  # rail interface -> its FEC mode (ethtool --show-fec); None: no ethtool
    gids: dict[str, list[Gid]] | None  # HCA -> its RoCE GID table; None: neither show_gids nor sysfs
    links: dict[str, Link]  # interface -> its link and addresses
    ping: list[Ping]
    listeners: list[str]  # ss -ltnp lines
    processes: list[str]  # "PID COMMAND LINE" of possibly stale processes
    containers: list[list[str]]  # [name, image, status]
    image: dict | None  # the parameters' image: identity.py's fields of `docker image inspect`; None: absent
    model: Manifest | None  # None: the model's folder is absent (or unreadable: model_error)
    model_error: str | None  # why the manifest could not be read
    model_read: tuple[int, int] | None  # bytes and files read to hash it (the rest from the cache)
    peers_ssh: dict[str, tuple[str, bool]]  # peer -> (target, answered): see ssh_peers
    skew_s: float | None  # clock against this machine's
    skew_error_s: float | None  # how far off skew_s can be: half the round trip it was read in
    tcp: tcp.TcpReport | None  # the serving ports probed from this node; None: not probed
    host: HostState | None  # GPU clocks, memlock (for the bug report), swap, rail firmware; None: not reported
    memory: memfit.MemReport  # meminfo, GPU memory; on the head the model's size and config


@dataclass
class Preflight(Outcome):
    """What every reachable node reported (``preflight.json``), and why the others could not be
    asked."""

    FILE: ClassVar[str] = "preflight.json"
    nodes: dict[str, NodeReport]  # reachable nodes only
    errors: dict[str, str] = field(default_factory=dict)  # node -> the SSH error
    roles: dict[str, str] = field(default_factory=dict)  # node -> head / worker
    layout: str = ""  # e.g. "switch, 4 nodes, 2 rails" (see layout.py); "" for one node

    def to_json(self) -> dict[str, Any]:
        return dict(self.nodes)

    def key_numbers(self) -> list[tuple[str, str]]:
        return [("layout", self.layout)] if self.layout else []

    def boots(self) -> dict[str, str]:
        return {n: b for n, r in self.nodes.items() if (b := r["facts"].get("boot_id"))}

    def rows(self) -> list[NodeRow]:
        """The nodes' facts as rows of the inventory's table."""
        return [{"node": n, "role": self.roles.get(n, ""), "reachable": True, **r["facts"]}
                for n, r in self.nodes.items()]

    def up(self, params: Params) -> list[Node]:
        """The nodes that answered, in the parameters' order."""
        return [n for n in params.nodes if n.name in self.nodes]


def node_bundle(params: Params, node: Node) -> Bundle:
    """The scripts for one node (every value from the parameters is an argument)."""
    peers = [n for n in params.nodes if n.name != node.name]
    # Path MTU: a don't-fragment ping of MTU-28 bytes out of each rail to every peer address on its
    # subnet (a peer's same rail on a switch or a direct pair; the cable's other end in a ring).
    pings = [a for rail in node.rails for net in [rail.network] for peer in peers for pr in peer.rails
             if pr.ip in net for a in (rail.interface, pr.ip)]
    runtime = script("runtime_state.sh", params.runtime.image, identity.INSPECT_FORMAT)
    parts = [("inventory", inventory.node_script(params)),
             ("hardware", script("hardware.sh", *(r.interface for r in node.rails))),
             ("ping", script("path_mtu.sh", params.expectations.mtu - 28, *pings)),
             ("in-use", script("in_use.sh", STALE)),
             ("runtime", runtime),
             ("host", script("host_state.sh", *(r.interface for r in node.rails))),
             ("memfit", memfit.node_script(params, node))]
    reaches = ssh_peers(params, node)
    if reaches:
        targets = [a for peer in reaches for a in (peer.name, peer.peer_target, peer.port or 22)]
        parts.append(("peers-ssh", script("peers_ssh.sh", *targets, "--", *PEER_SSH)))
    return bundle(*parts)


def ssh_peers(params: Params, node: Node) -> list[Node]:
    """The nodes ``node`` must reach by SSH: from the head every worker (the image and the model
    copies); from a worker every other worker when the workers outnumber ``distribution.parallel``,
    since 03 then relays the image worker to worker, along a tree planned over the workers that
    lack it at that time."""
    if node.role == "head":
        return list(params.workers)
    if params.distribution.source != "head" or len(params.workers) <= params.distribution.parallel:
        return []
    return [w for w in params.workers if w.name != node.name]


def _unavailable(text: str | None) -> bool:
    return text is None or text.endswith("unavailable")


def parse(stdout: str) -> NodeReport:
    """One node's report from the output of its bundle."""
    s = parse_sections(stdout)
    ethtool: dict[str, LinkSpeed] = {}
    for key, text in s.items():
        if key.startswith("ethtool "):
            ethtool.update({k or key.split()[1]: v for k, v in parse_ethtool(text).items()})
    try:
        links = {li["ifname"]: li for li in json.loads(s.get("links") or "[]")}
    except json.JSONDecodeError:
        links = {}
    return {
        "facts": inventory.parse(stdout),
        "smi": None if _unavailable(s.get("smi", "")) else parse_nvidia_smi_table(s["smi"]),
        "ibdev2netdev": None if _unavailable(s.get("ibdev2netdev")) else parse_ibdev2netdev(s["ibdev2netdev"]),
        "ibstat": None if _unavailable(s.get("ibstat")) else parse_ibstat(s["ibstat"]),
        "ibv_devinfo": None if _unavailable(s.get("ibv_devinfo")) else parse_ibv_devinfo(s["ibv_devinfo"]),
        "ethtool": ethtool,
        "fec": parse_fec_sections(s),
        "gids": None if _unavailable(s.get("gids")) else parse_show_gids(s["gids"]),
        "links": links,
        "ping": [{"interface": p[0], "peer": p[1], "ok": p[2] == "0"}
                 for p in (ln.split() for ln in s.get("ping", "").splitlines()) if len(p) == 3],
        "listeners": s.get("listeners", "").splitlines(),
        "processes": [ln.strip() for ln in s.get("processes", "").splitlines() if ln.strip()],
        "containers": [ln.split("\t") for ln in s.get("containers", "").splitlines() if ln.strip()],
        "image": identity.parse(s.get("image", "")),
        "model": None,  # gather's: read beside the bundle, under its own time limit
        "model_error": None,
        "model_read": None,
        "peers_ssh": {p[0]: (p[1], p[2] == "0") for p in (ln.split() for ln in s.get("peers-ssh", "").splitlines())
                      if len(p) == 3},
        "skew_s": None,
        "skew_error_s": None,
        "tcp": None,
        "host": parse_host_state(s),
        "memory": memfit.parse(s),
    }


CLOCK_READS = 5  # round trips per node: the shortest decides (NTP's minimum-delay filter)


def clock_skews(cluster: Cluster, names: list[str]) -> dict[str, tuple[float | None, float | None]]:
    """Each node's clock against this machine's, and how far off that can be, by name.

    Once the connections are open, a bare `date` costs one short round trip; the node read its
    clock somewhere inside it, so the skew is known to within half the round trip. On a busy
    machine one round trip can take a second (a thread that started late, a stalled SSH
    channel), so the clock is read :data:`CLOCK_READS` times and the shortest round trip is kept:
    one slow read cannot make a skew. Each round trip is timed from its own start."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(CLOCK_READS):
        for name, r in cluster.run(["date", "+%s.%N"], names, timeout=10).items():
            try:
                skew = float(r.stdout) - (r.started + r.duration / 2)
            except ValueError:
                continue
            if name not in best or r.duration / 2 < best[name][1]:
                best[name] = (skew, r.duration / 2)
    return {n: best.get(n, (None, None)) for n in names}


def gather(params: Params, cluster: Cluster) -> Preflight:
    """Every node's report, all nodes at once, with the clocks' skew and the serving ports probed
    between the nodes (except in a ring, whose routes between nodes without a cable are unknown,
    and where nodes share a fabric address: :func:`sparkbook.preflight.tcp.shared`)."""
    # the C locale for every script: the parsers read the tools' untranslated output
    # the model's manifest hashes every file the first time (minutes for 100 GB): beside the
    # bundle, at once, under the distribution's limit
    read: dict[str, tuple[int, int]] = {}
    pool = ThreadPoolExecutor(1)
    try:
        models = pool.submit(manifests, params, cluster, None, read)
        results = cluster.run(lambda n: node_bundle(params, n), timeout=min(params.ssh.command_timeout, 60),
                              env={"LC_ALL": "C"})
        found = models.result()
    except BaseException:  # Ctrl-C while the nodes hash: their commands end with their connections
        pool.shutdown(wait=False, cancel_futures=True)
        for node in params.nodes:
            drop(node, cluster.ssh)
        raise
    pool.shutdown()
    nodes = {n.name: parse(results[n.name].stdout) for n in params.nodes if results[n.name].error is None}
    for name, facts in nodes.items():
        m = found.get(name)
        facts["model"], facts["model_error"] = (None, m) if isinstance(m, str) else (m, None)
        facts["model_read"] = read.get(name)
    errors = {n.name: results[n.name].error or "" for n in params.nodes if results[n.name].error is not None}
    for name, (skew, error) in clock_skews(cluster, list(nodes)).items():
        nodes[name]["skew_s"], nodes[name]["skew_error_s"] = skew, error
    up = [n for n in params.nodes if n.name in nodes]
    layout = classify(params)
    if len(up) > 1 and layout.kind != RING and not tcp.shared(up):
        for name, report in tcp.probe(params, cluster, up).items():
            nodes[name]["tcp"] = report
    return Preflight(nodes, errors, {n.name: n.role for n in params.nodes}, str(layout) if layout.kind else "")
