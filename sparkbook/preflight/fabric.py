"""Preflight checks of the RoCE fabric: its layout (a direct pair or a switch), then per rail of
every node: the HCA mapped to its interface and Up, its port ACTIVE, the link rate, the MTU, the
address, and the path MTU to every peer on the rail's subnet."""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ..params import Node, Params, Rail
from ..verdict import FAIL, PASS, WARN, Check
from .collect import NodeReport, Preflight
from .layout import MIXED, RING, classify


def rails(params: Params, pf: Preflight) -> Iterator[Check]:
    names = {str(r.ip): n.name for n in params.nodes for r in n.rails}  # a peer's rail address -> its name
    for node in pf.up(params):
        d = pf.nodes[node.name]
        for rail in node.rails:
            if rail.hca:
                yield from rail_map(node, rail, d)
            yield rail_rate(params, node, rail, d)
            yield rail_mtu(params, node, rail, d)
            yield rail_address(node, rail, d)
            yield from path_mtu(params, node, rail, d, names)


def layout(params: Params, pf: Preflight) -> Iterator[Check]:
    """The layout the rails' subnets draw, confirmed by every rail ping answered; a ring or mesh
    of cabled nodes is named unsupported (WARN), rails that fit no layout FAIL."""
    lay = classify(params)
    if not lay.kind:
        return
    want = "a direct pair, or every node's rails on a switch (each rail's subnet holding every node)"
    subnets = "; ".join(f"{net}: {', '.join(names)}" for net, names in lay.subnets.items())
    if lay.kind == RING:
        yield Check("fabric layout", "all", WARN, f"{lay}: {subnets}", want, "sparkbook supports a direct "
                    "pair or a switch for now: connect every node's rails to a switch (one subnet per rail)")
    elif lay.kind == MIXED:
        yield Check("fabric layout", "all", FAIL, f"{lay}: {subnets}", want, "put rail N of every node "
                    "on one subnet (netplan), or fix the rails' addresses in the parameters")
    else:
        answered = [p["ok"] for n in pf.up(params) for p in pf.nodes[n.name]["ping"]]
        lost, missing = answered.count(False), lay.nodes - len(pf.nodes)
        ok = not lost and not missing
        yield Check("fabric layout", "all", PASS if ok else WARN, f"{lay} ({', '.join(lay.subnets)})" + (
                    "" if ok else f"; not confirmed: {lost} of {len(answered)} rail pings unanswered"
                    + (f", {missing} node(s) not reached" if missing else "")), want,
                    "" if ok else "see the path mtu and ssh rows")


def rail_map(node: Node, rail: Rail, d: NodeReport) -> Iterator[Check]:
    """The rail's HCA drives its interface and is Up (ibdev2netdev); its port is ACTIVE."""
    hca, where = rail.hca or "", rail.interface
    if d["ibdev2netdev"] is None:
        yield Check("rail map", node.name, FAIL, "ibdev2netdev unavailable",
                    f"{hca} ==> {where} (Up)", "install the Mellanox/DOCA tools (ibdev2netdev)")
    else:
        ib = d["ibdev2netdev"].get(hca)
        ok = bool(ib) and ib["netdev"] == where and ib["up"]
        seen = f"{hca} ==> {ib['netdev']} ({'Up' if ib['up'] else 'Down'})" if ib else f"no HCA {hca}"
        yield Check("rail map", node.name, PASS if ok else FAIL, seen, f"{hca} ==> {where} (Up)",
                    "" if ok else f"check the QSFP cable and that {hca} belongs to "
                    f"{where} (ibdev2netdev); the link must be Up", "ibdev2netdev")
    port = port_state(d, hca)
    if port:
        ok = port.active and port.link_up
        yield Check("rail port", node.name, PASS if ok else FAIL,
                    f"{hca}: state {port.state}, physical {port.physical}",
                    "ACTIVE, LinkUp", "" if ok else "the port is down: reseat the cable, check "
                    f"the peer's port and `ip link set {where} up`", port.command)


def rail_rate(params: Params, node: Node, rail: Rail, d: NodeReport) -> Check:
    where = rail.interface
    speed = d["ethtool"].get(where, {}).get("speed_mbps")
    want = int(params.expectations.link_rate_gbps * 1000)
    return Check("rail rate", node.name, PASS if speed == want else FAIL,
                 f"{where}: {speed}Mb/s" if speed else f"{where}: no link speed",
                 f"{want}Mb/s", "" if speed == want else "a degraded or down link: pin the switch "
                 "port (or both ends) to the expected speed and check the cable", f"ethtool {where}")


def rail_mtu(params: Params, node: Node, rail: Rail, d: NodeReport) -> Check:
    where, want = rail.interface, params.expectations.mtu
    link = d["links"].get(where)
    mtu = link.get("mtu") if link else None
    return Check("rail mtu", node.name, PASS if mtu == want else FAIL,
                 f"{where}: mtu {mtu}" if link else f"no interface {where}", f"mtu {want}",
                 "" if mtu == want else f"`sudo ip link set {where} mtu {want}` and make it "
                 "permanent in netplan, on every node", f"ip link show {where}")


def rail_address(node: Node, rail: Rail, d: NodeReport) -> Check:
    where = rail.interface
    addrs = [f"{a['local']}/{a['prefixlen']}" for a in (d["links"].get(where) or {}).get("addr_info", [])
             if a.get("family") == "inet"]
    want = f"{rail.ip}/{rail.prefix}"
    return Check("rail address", node.name, PASS if want in addrs else FAIL,
                 f"{where}: {', '.join(addrs) or 'no IPv4 address'}", want,
                 "" if want in addrs else f"assign {want} to {where} (netplan), or fix "
                 "the parameters", f"ip addr show {where}")


def path_mtu(params: Params, node: Node, rail: Rail, d: NodeReport, names: dict[str, str]) -> Iterator[Check]:
    """A don't-fragment ping of MTU-28 bytes to every peer on the rail's subnet was answered: one
    row per rail, naming the peers that did not answer."""
    where, mtu = rail.interface, params.expectations.mtu
    pings = [p for p in d["ping"] if p["interface"] == where]
    if not pings:
        return
    lost = sorted(p["peer"] for p in pings if not p["ok"])
    peers = sorted(names.get(p["peer"], p["peer"]) for p in pings)
    seen = f"{where} → {', '.join(peers) if len(peers) <= 3 else f'{len(peers)} peers'}: ok"
    if lost:
        seen = f"{where} → " + ", ".join(f"{names.get(ip, ip)} ({ip})" for ip in lost) + ": no reply"
        if len(lost) < len(pings):
            seen += f" ({len(pings) - len(lost)} of {len(pings)} peers answered)"
    yield Check("path mtu", node.name, FAIL if lost else PASS, seen, f"{mtu - 28}-byte don't-fragment ping answered",
                f"MTU {mtu} must hold end to end on this rail: every node's interface and any switch port; "
                "check that the peer's link is up" if lost else "",
                f"ping -M do -s {mtu - 28} -I {where} {(lost or [pings[0]['peer']])[0]}")


class PortState(NamedTuple):
    active: bool
    link_up: bool
    state: str | None
    physical: str | None
    command: str


def port_state(d: NodeReport, hca: str) -> PortState | None:
    """The HCA's port 1 from ibstat, else ibv_devinfo; None where neither lists it."""
    st = (d["ibstat"] or {}).get(hca)
    if st and 1 in st["ports"]:
        p = st["ports"][1]
        return PortState(p.get("state") == "Active", p.get("physical_state") == "LinkUp", p.get("state"),
                         p.get("physical_state"), f"ibstat {hca}")
    dev = (d["ibv_devinfo"] or {}).get(hca)
    if dev and 1 in dev["ports"]:
        p = dev["ports"][1]
        active = p.get("state") == "PORT_ACTIVE"
        return PortState(active, active, p.get("state"), p.get("phys_state", "LinkUp" if active else "?"),
                         f"ibv_devinfo -d {hca}")
    return None
