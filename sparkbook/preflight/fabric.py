"""Preflight checks of the RoCE fabric: its layout (a direct pair or a switch), then per rail of
every node: the HCA mapped to its interface and Up, its port ACTIVE, the link rate, its forward
error correction, the MTU, the address, the RoCE GID index NCCL is told, and the path MTU to every
peer on the rail's subnet."""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..facts.parsers import NO_FEC, Gid, ipv4
from ..params import Node, Params, Rail
from ..serving.containers import nccl_gid_index
from .collect import NodeReport, Preflight
from ..params.layout import MIXED, RING, classify


def rails(params: Params, pf: Preflight) -> Iterator[Check]:
    names = {str(r.ip): n.name for n in params.nodes for r in n.rails}  # a peer's rail address -> its name
    for node in pf.up(params):
        d = pf.nodes[node.name]
        for rail in node.rails:
            if rail.hca:
                yield from rail_map(node, rail, d)
            yield rail_rate(params, node, rail, d)
            yield rail_fec(node, rail, d)
            yield rail_mtu(params, node, rail, d)
            yield rail_address(node, rail, d)
            if rail.hca:
                yield rail_gid(params, node, rail, d)
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
        railed = {r.interface for r in node.rails}
        elsewhere = [f"{h} ==> {o['netdev']} (Up)" for h, o in d["ibdev2netdev"].items()
                     if o["up"] and h != hca and o["netdev"] not in railed]
        remedy = "" if ok else (
            f"the cable sits in another port: ibdev2netdev shows {', '.join(elsewhere)}. Move it back to "
            f"{where}'s port, or write the rails from what is cabled (`sparkbook discover`, then `sparkbook "
            "fabric plan`)" if elsewhere and not (ib and ib["up"]) else
            f"check the QSFP cable and that {hca} belongs to {where} (ibdev2netdev); the link must be Up")
        yield Check("rail map", node.name, PASS if ok else FAIL, seen + (f"; Up instead: {', '.join(elsewhere)}"
                    if elsewhere and not ok else ""), f"{hca} ==> {where} (Up)", remedy, "ibdev2netdev")
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


# From 200 Gb/s (50G PAM4 lanes) Ethernet needs RS-FEC. A DGX Spark whose QSFP cable was moved
# came up at 200 Gb/s with "Active FEC encoding: None" and all_gather busbw fell from 21.4 to
# 2.8 GB/s (github.com/KoyoImai/dgx_spark_cluster2, Step011/README.md; tests/test_fabric_field.py).
FEC_FROM_MBPS = 200_000


def rail_fec(node: Node, rail: Rail, d: NodeReport) -> Check:
    """An active FEC (RS) on a rail that runs at 200 Gb/s or more."""
    where = rail.interface
    want, command = "an active FEC (RS) at 200 Gb/s and above", f"ethtool --show-fec {where}"
    fecs = d.get("fec")
    if fecs is None:
        return Check("rail fec", node.name, WARN, "ethtool unavailable", want,
                     "install ethtool: a rail without FEC runs at a fraction of its rate while "
                     "every other check passes", command)
    fec = fecs.get(where)
    if not fec or not fec["active"]:
        # unread is not judged good: the rails where ethtool cannot say are where it matters
        seen = fec["error"] if fec and fec["error"] else "no FEC mode reported"
        return Check("rail fec", node.name, WARN, f"{where}: {seen}: FEC not read, so not judged", want,
                     f"read it by hand (`sudo {command}`); a rail without FEC runs at a fraction of its "
                     "rate while every other check passes: 02_collectives.ipynb's bandwidth shows it", command)
    speed = (d["ethtool"].get(where) or {}).get("speed_mbps")
    seen = f"{where}: active {fec['active']}" + (f" at {speed}Mb/s" if speed else ", no link speed") + (
        f" (configured: {' '.join(fec['configured'])})" if fec["configured"] else "")
    if fec["active"] not in NO_FEC:
        return Check("rail fec", node.name, PASS, seen, want, "", command)
    if not speed:  # the link is down: the rate row says so, and no FEC is negotiated
        return Check("rail fec", node.name, SKIP, seen, want, "", command)
    if speed < FEC_FROM_MBPS:
        return Check("rail fec", node.name, PASS, seen + "; FEC is judged from 200 Gb/s", want, "", command)
    return Check("rail fec", node.name, FAIL, seen, want,
                 f"forward error correction is off: `sudo ethtool --set-fec {where} encoding rs` here "
                 "and on the cable's other end (on a switch, set the port's FEC to RS, `fec91` on "
                 f"RouterOS), then `{command}` must show Active FEC encoding: RS; if the bandwidth stays "
                 "low after that, reboot the node (owners report that restored it)", command)


def _gid(g: Gid) -> str:
    return f"{g['ipv4'] or g['gid']} ({g['version'] or 'type unknown'}, {g['netdev'] or 'no interface'})"


def rail_gid(params: Params, node: Node, rail: Rail, d: NodeReport) -> Check:
    """The GID index NCCL gets (:func:`~sparkbook.serving.containers.nccl_gid_index`: serving.env's
    NCCL_IB_GID_INDEX, else runtime.nccl_ib_gid_index) holds the rail's IPv4 address as a RoCE v2
    GID on the rail's HCA (port 1); else the index that does, for the remedy."""
    hca, ip = rail.hca or "", str(rail.ip)
    value, setting = nccl_gid_index(params)
    command = f"show_gids {hca}"
    if not value.isdigit():  # an empty NCCL_IB_GID_INDEX reads as 0, the link-local GID
        return Check("rail gid", node.name, FAIL, f"NCCL_IB_GID_INDEX={value!r} ({setting})",
                     f"{hca}: the index of the RoCE v2 GID holding {ip}", f"set `{setting}` to that "
                     f"index (`{command}`), or remove it from serving.env to use runtime.nccl_ib_gid_index",
                     command)
    index = int(value)
    want = f"{hca} GID {index}: {ip} (v2)" + (f", from {setting}" if setting.startswith("serving.") else "")
    gids = d.get("gids")
    if gids is None:
        return Check("rail gid", node.name, WARN, "show_gids unavailable, and no /sys/class/infiniband",
                     want, "install mlnx-tools (show_gids) or load the RDMA driver, then re-check: "
                     "NCCL needs the GID index of the rail's address", command)
    table = [g for g in gids.get(hca, []) if g["port"] == 1]
    at = next((g for g in table if g["index"] == index), None)
    if at and at["version"] == "v2" and at["ipv4"] == ip:
        return Check("rail gid", node.name, PASS, f"{hca} GID {index}: {_gid(at)}", want, "", command)
    seen = f"{hca} GID {index}: {_gid(at) if at else 'empty'}" if table else f"no GID table for {hca}"
    right = next((g["index"] for g in table if g["version"] == "v2" and g["ipv4"] == ip), None)
    if right is not None:
        shown = f'"{right}"' if setting.startswith("serving.") else right  # serving.env holds strings
        remedy = (f"{ip} is the RoCE v2 GID at index {right}: set `{setting}: {shown}` in the "
                  "parameters (NCCL_IB_GID_INDEX is one index for every node and rail; an "
                  "address can move to another index after the cabled peer restarts), then re-check")
    else:
        remedy = (f"no RoCE v2 GID of {hca} holds {ip}: assign {ip}/{rail.prefix} to {rail.interface} "
                  f"(see the rail address row) and check that {hca} drives {rail.interface}; the GID "
                  "table follows the interface's addresses")
    return Check("rail gid", node.name, FAIL, seen, want, remedy, command)


def rail_mtu(params: Params, node: Node, rail: Rail, d: NodeReport) -> Check:
    where, want = rail.interface, params.expectations.mtu
    link = d["links"].get(where)
    mtu = link.get("mtu") if link else None
    return Check("rail mtu", node.name, PASS if mtu == want else FAIL,
                 f"{where}: mtu {mtu}" if link else f"no interface {where}", f"mtu {want}",
                 "" if mtu == want else f"`sudo ip link set {where} mtu {want}` and make it "
                 "permanent in netplan, on every node", f"ip link show {where}")


def rail_address(node: Node, rail: Rail, d: NodeReport) -> Check:
    """The rail holds its address. Where it does not but another rail of the node does (one twin
    configured and the other not, a common first-day slip), the row says so: that node runs on
    half its fabric, and the peers' traffic on this rail has nowhere to go."""
    where, want = rail.interface, f"{rail.ip}/{rail.prefix}"
    addrs = ipv4(d["links"].get(where))
    if want in addrs:
        return Check("rail address", node.name, PASS, f"{where}: {', '.join(addrs)}", want, command=f"ip addr show {where}")
    twins = [r.interface for r in node.rails if r is not rail and f"{r.ip}/{r.prefix}" in ipv4(d["links"].get(r.interface))]
    seen = f"{where}: {', '.join(addrs) or 'no IPv4 address'}"
    remedy = f"assign {want} to {where} (netplan), or fix the parameters"
    if twins:
        seen += f"; an address on one twin only ({', '.join(twins)} has its own): half the fabric"
        remedy = ("configure every rail at once: `sparkbook fabric plan` then `sparkbook fabric apply` "
                  f"(a netplan file for all twins), or assign {want} to {where} by hand")
    return Check("rail address", node.name, FAIL, seen, want, remedy, f"ip addr show {where}")


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
