"""02's measurement of each cable: perftest between every pair of nodes on every rail, one way, the
other way, both at once (``ib_write_bw -b``) and the latency (``ib_write_lat``), disjoint pairs at
the same time; each rail's counters read before and after.

Silent degradations pass every static check: NVIDIA documents a ConnectX-7 of a DGX Spark that
initialised degraded, its link at 200 Gb/s, PCIe at Gen5 x4 and its error counters clean, yet 8-25
Gb/s per rail (NVIDIA/dgx-spark-playbooks, nvidia/connect-two-sparks/assets/
performance_benchmarking_guide.md, "Detect a degraded ConnectX-7 initialization", which also says to
test both directions "because an endpoint can be degraded in only one direction"). Only traffic
shows them. The verdict (:mod:`.rdma_judge`) tells the faults apart by those signatures.

A link here is one rail between two nodes: the rail's subnet holds both (a direct pair's cable, a
path through a switch, a ring's cable). The latency is measured one way only: perftest reports half
a round trip.
"""

from __future__ import annotations

import csv
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..book.progress import Progress
from ..facts import health, perftest
from ..nodes.remote import Cluster, Result
from ..nodes.shell import script
from ..params import Node, Params, Rail
from ..params.layout import classify
from ..serving.containers import nccl_gid_index

# (key, the script's test, the node that runs the client: a or b): a client writes to its server, so
# the data of "forward" flows from a to b
TESTS = (("forward", "bw", "a"), ("reverse", "bw", "b"), ("both", "bidir", "a"), ("latency", "lat", "a"))
WAIT_S = 20  # the client's tries while its server starts (rdma_test.sh)


@dataclass(frozen=True)
class Link:
    """One rail between two nodes, ``a`` before ``b`` in the parameters' order."""
    a: str
    b: str
    rail_a: Rail
    rail_b: Rail

    @property
    def interface(self) -> str:
        return self.rail_a.interface

    @property
    def subnet(self) -> str:
        return str(self.rail_a.network)

    @property
    def label(self) -> str:
        return f"{self.a}↔{self.b}"

    def ends(self) -> tuple[tuple[str, Rail], tuple[str, Rail]]:
        return (self.a, self.rail_a), (self.b, self.rail_b)


@dataclass
class LinkResult:
    """What one link's tests found: Gb/s each way and both at once (the sum), the latency in µs,
    and per test what stopped it. ``counters``: the error counters that rose on each end
    (``node interface`` -> counter -> by how much) while its rail was measured."""
    link: Link
    forward: float | None = None
    reverse: float | None = None
    both: float | None = None
    latency_us: float | None = None
    errors: dict[str, str] = field(default_factory=dict)  # test -> "node: perftest's error line"
    error_kinds: dict[str, str] = field(default_factory=dict)  # test -> facts.perftest's kind
    commands: dict[str, str] = field(default_factory=dict)  # test -> the client's command line
    down: list[str] = field(default_factory=list)  # "node interface (operstate down)"
    unread: list[str] = field(default_factory=list)  # nodes whose rail state could not be read first
    unavailable: list[str] = field(default_factory=list)  # nodes without perftest
    bind_all: list[str] = field(default_factory=list)  # nodes whose perftest cannot bind the rail address
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    fec: dict[str, str] = field(default_factory=dict)  # "node interface" -> active FEC mode, where read

    def to_json(self) -> dict:
        out = asdict(self)
        out["link"] = {"a": self.link.a, "b": self.link.b, "interface": self.link.interface,
                       "subnet": self.link.subnet, "ip_a": str(self.link.rail_a.ip), "ip_b": str(self.link.rail_b.ip)}
        return out


@dataclass
class RdmaOutcome:
    results: list[LinkResult] = field(default_factory=list)
    skipped: str | None = None  # why nothing was measured
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)  # rails that could not be measured, and why

    def to_json(self) -> dict:
        return {"results": [r.to_json() for r in self.results], "skipped": self.skipped,
                "duration_s": self.duration_s, "notes": self.notes}


def plan(params: Params) -> tuple[list[Link], list[str]]:
    """Every link to measure (by rail subnet, then pair), and what cannot be: rails without an HCA."""
    by_name = {n.name: n for n in params.nodes}
    links, notes = [], []
    for subnet, names in classify(params).subnets.items():
        ends = [(name, next(r for r in by_name[name].rails if str(r.network) == subnet)) for name in names]
        without = [f"{name} {rail.interface}" for name, rail in ends if not rail.hca]
        if without:
            notes.append(f"{subnet}: no HCA named for {', '.join(without)} (nodes[].rails[].hca): not measured")
            ends = [(name, rail) for name, rail in ends if rail.hca]
        links += [Link(a, b, ra, rb) for i, (a, ra) in enumerate(ends) for b, rb in ends[i + 1:]]
    return links, notes


def round_robin(names: list[str]) -> list[list[tuple[str, str]]]:
    """Every pair of ``names`` in rounds in which no name is in two pairs: the circle method, N-1
    rounds for N even, N for N odd."""
    names = [*names, ""] if len(names) % 2 else list(names)  # "": a bye
    out = []
    for _ in range(len(names) - 1):
        out.append([(a, b) for i in range(len(names) // 2) if "" not in (a := names[i], b := names[-1 - i])])
        names = [names[0], names[-1], *names[1:-1]]
    return out


def rounds(links: list[Link]) -> list[list[Link]]:
    """The links in rounds in which no node takes part twice (its HCA measures one link at a time),
    each rail's links apart from the others' (the twins of a Spark share one port)."""
    out: list[list[Link]] = []
    for subnet in dict.fromkeys(lk.subnet for lk in links):
        mine = {frozenset((lk.a, lk.b)): lk for lk in links if lk.subnet == subnet}
        names = list(dict.fromkeys(n for lk in mine.values() for n in (lk.a, lk.b)))
        out += [found for pairs in round_robin(names)
                if (found := [mine[frozenset(p)] for p in pairs if frozenset(p) in mine])]
    return out


def test_script(params: Params, link: Link, test: str, role: str, side: str):
    """rdma_test.sh for one end of one test: ``side`` a or b, the server or the client."""
    r = params.collectives.rdma
    name, rail = link.ends()[0 if side == "a" else 1]
    server_rail = link.rail_b if side == "a" else link.rail_a
    args = [role, test, rail.hca, nccl_gid_index(params)[0], r.port, f"{r.duration_s:g}", r.size, r.qps,
            r.latency_iters, WAIT_S, rail.ip]
    return script("rdma_test.sh", *args, *([server_rail.ip] if role == "client" else []))


def _health(params: Params, cluster: Cluster, nodes: list[Node]) -> dict[str, dict[str, dict]]:
    """Each node's rails now: ``{node: {interface: {"oper", "stats", "fec", "fec_mode"}}}``; a node
    whose state could not be read is absent."""
    res = cluster.run(lambda n: script("link_health.sh", *(r.interface for r in n.rails)), nodes, timeout=30)
    return {name: health.parse_link_health(r.stdout)["rails"] for name, r in res.items() if r.ok}


def stopped(res: LinkResult) -> bool:
    """Whether a link's remaining tests can tell nothing more: perftest missing or unable to bind
    the rail address, or an error that is not the traffic's (no connection, no device)."""
    return bool(res.unavailable or res.bind_all
                or set(res.error_kinds.values()) & {"connect", "qp", "port", "no-device"})


def _state(res: LinkResult, before: dict[str, dict[str, dict]]) -> None:
    """A link's ends as read before its tests: down where the operstate is not up; unread where the
    node's rail state could not be read (measured all the same)."""
    for n, rail in res.link.ends():
        if n not in before:
            res.unread.append(n)
        elif (oper := before[n].get(rail.interface, {}).get("oper")) != "up":
            res.down.append(f"{n} {rail.interface} (operstate {oper or '?'})")


def _record(res: LinkResult, key: str, client: Result, server: Result, client_node: str, server_node: str) -> None:
    """One test's two ends into ``res``: the number from the client's output, else what stopped it."""
    for node, r in ((client_node, client), (server_node, server)):
        if "RDMA-UNAVAILABLE" in r.stdout and node not in res.unavailable:
            res.unavailable.append(node)
        if "RDMA-BIND all" in r.stdout and node not in res.bind_all:
            res.bind_all.append(node)
    if m := re.search(r"^RDMA-COMMAND (.+)$", client.stdout, re.M):
        res.commands[key] = m[1]
    if res.unavailable or res.bind_all:
        return
    run = perftest.parse(client.stdout)
    value = perftest.latency_us(run) if key == "latency" else perftest.gbps(run)
    if value is not None:
        setattr(res, "latency_us" if key == "latency" else key, value)
        return
    for node, r in ((client_node, client), (server_node, server)):
        seen = perftest.parse(r.stdout)
        if seen["error"]:
            res.errors[key], res.error_kinds[key] = f"{node}: {seen['error']}", seen["error_kind"] or "other"
            return
    res.errors[key] = f"{client_node}: " + (client.error or f"no result ({client.summary(2)})")
    res.error_kinds[key] = "other"


def measure(params: Params, cluster: Cluster, say: Callable[[str], object] = print) -> RdmaOutcome:
    """Every link measured (see the module's docstring); nothing when ``collectives.rdma.run`` is
    off. The ends of a test run at once, one SSH command each: the client tries again until its
    server listens; both end by themselves (``-D``, and the commands' time limit)."""
    r = params.collectives.rdma
    if r.run == "off":
        return RdmaOutcome(skipped="collectives.rdma.run: off")
    links, notes = plan(params)
    if not links:
        return RdmaOutcome(skipped="no rail joins two nodes with an HCA named", notes=notes)
    out = RdmaOutcome(notes=notes)
    start = time.monotonic()
    results = {lk: LinkResult(lk) for lk in links}
    before = _health(params, cluster, params.nodes)
    limit = WAIT_S + r.duration_s + r.latency_iters * 0.01 + 30
    schedule = rounds(links)
    with Progress("each cable measured (perftest)") as progress:
        for i, group in enumerate(schedule, 1):
            live = []
            for lk in group:
                _state(results[lk], before)
                if not results[lk].down:
                    live.append(lk)
            for key, test, client in TESTS:
                if not live:
                    break
                progress.update(live[0].interface, f"round {i}/{len(schedule)}: {key} on "
                                f"{', '.join(lk.label for lk in live)}", fraction=(i - 1) / len(schedule))
                cmds = {}
                for lk in live:
                    server = "b" if client == "a" else "a"
                    cmds[getattr(lk, client)] = test_script(params, lk, test, "client", client)
                    cmds[getattr(lk, server)] = test_script(params, lk, test, "server", server)
                ran = cluster.run(lambda n: cmds[n.name], list(cmds), timeout=limit)
                for lk in live:
                    c, s = (lk.a, lk.b) if client == "a" else (lk.b, lk.a)
                    _record(results[lk], key, ran[c], ran[s], c, s)
                live = [lk for lk in live if not stopped(results[lk])]
        for interface in dict.fromkeys(lk.interface for lk in links):
            done = [res for lk, res in results.items() if lk.interface == interface]
            progress.update(interface, f"{len(done)} link(s) measured, {sum(not r.down for r in done)} up",
                            fraction=1.0)
    after = _health(params, cluster, params.nodes)
    for res in results.values():
        for n, rail in res.link.ends():
            was, now = before.get(n, {}).get(rail.interface, {}), after.get(n, {}).get(rail.interface, {})
            if now.get("fec_mode"):
                res.fec[f"{n} {rail.interface}"] = now["fec_mode"]
            if not (was.get("stats") and now.get("stats")):
                continue  # a side not read: nothing to compare, never "risen"
            rose = health.grown(health.link_errors(was.get("stats", {}), was.get("fec")),
                                health.link_errors(now.get("stats", {}), now.get("fec")))
            if rose:
                res.counters[f"{n} {rail.interface}"] = rose
    out.results = list(results.values())
    out.duration_s = time.monotonic() - start
    say(f"each cable: {len(links)} link(s) measured in {out.duration_s:.0f} s")
    return out


CSV_FIELDS = ("interface", "subnet", "from", "to", "test", "gbps", "latency_us")


def write_csv(out: RdmaOutcome, path: Path) -> Path | None:
    """One row per link and test: Gb/s from a to b (forward), b to a (reverse), both at once
    (the sum; from and to as a and b), or the latency in µs."""
    if not out.results:
        return None
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for res in out.results:
            lk = res.link
            for key, frm, to in (("forward", lk.a, lk.b), ("reverse", lk.b, lk.a), ("both", lk.a, lk.b)):
                w.writerow({"interface": lk.interface, "subnet": lk.subnet, "from": frm, "to": to, "test": key,
                            "gbps": "" if getattr(res, key) is None else f"{getattr(res, key):.2f}", "latency_us": ""})
            w.writerow({"interface": lk.interface, "subnet": lk.subnet, "from": lk.a, "to": lk.b, "test": "latency",
                        "gbps": "", "latency_us": "" if res.latency_us is None else f"{res.latency_us:.2f}"})
    return path


def save(out: RdmaOutcome, run_dir: Path) -> None:
    (run_dir / "rdma.json").write_text(json.dumps(out.to_json(), indent=2))
    write_csv(out, run_dir / "rdma.csv")
