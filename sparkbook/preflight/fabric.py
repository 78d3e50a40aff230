"""Preflight checks of the RoCE fabric, per rail of every node: the HCA mapped to its interface
and Up, its port ACTIVE, the link rate, the MTU, the address, and the path MTU to every peer."""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ..params import Node, Params, Rail
from ..verdict import FAIL, PASS, Check
from .collect import NodeReport, Preflight


def rails(params: Params, pf: Preflight) -> Iterator[Check]:
    for node in pf.up(params):
        d = pf.nodes[node.name]
        for rail in node.rails:
            if rail.hca:
                yield from rail_map(node, rail, d)
            yield rail_rate(params, node, rail, d)
            yield rail_mtu(params, node, rail, d)
            yield rail_address(node, rail, d)
            yield from path_mtu(params, node, rail, d)


def rail_subnets(params: Params, pf: Preflight) -> Iterator[Check]:
    subnets = [str(r.network) for r in params.head.rails]
    yield Check("rail subnets", "all", PASS, ", ".join(subnets) or "no rails", "one subnet per rail; "
                "addresses unique (checked when the parameters were validated)")


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


def path_mtu(params: Params, node: Node, rail: Rail, d: NodeReport) -> Iterator[Check]:
    """A don't-fragment ping of MTU-28 bytes to each peer's same rail was answered."""
    where, mtu = rail.interface, params.expectations.mtu
    for ping in sorted(d["ping"], key=lambda p: p["peer"]):
        if ping["interface"] != where:
            continue
        peer_ip, ok = ping["peer"], ping["ok"]
        peer = next((p.name for p in params.nodes for pr in p.rails if str(pr.ip) == peer_ip), peer_ip)
        yield Check("path mtu", node.name, PASS if ok else FAIL,
                    f"{where} → {peer} ({peer_ip}): {'ok' if ok else 'no reply'}",
                    f"{mtu - 28}-byte don't-fragment ping answered",
                    "" if ok else f"MTU {mtu} must hold end to end on this rail: every node's "
                    "interface and any switch port; check that the peer's link is up",
                    f"ping -M do -s {mtu - 28} -I {where} {peer_ip}")


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
