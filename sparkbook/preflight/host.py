"""Preflight checks of each host's health, the faults Spark owners report as "a software bug"
until they look here: the NVIDIA driver and the ConnectX-7 firmware (the same on every node, within
``expectations.driver`` / ``expectations.firmware``), GPU clocks held down by power or heat
(``nvidia-smi -q``), swap in use before the launch, and a rail NetworkManager sets by DHCP
(``nmcli``). (The unlimited memlock limit RDMA needs is not checked: sparkbook starts its
containers with ``--ulimit memlock=-1`` itself.)
What the node reports is parsed in :mod:`.host_state` (from ``scripts/host_state.sh``)."""

from __future__ import annotations

import shlex
from typing import Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..facts.health import SLOWDOWNS
from ..params import Node, Params
from .collect import NodeReport, Preflight

SWAP_WARN_KB = 1 << 20  # 1 GiB of swap in use before the launch: memory was short


def health(params: Params, pf: Preflight) -> Iterator[Check]:
    yield from versions(params, pf)
    yield from clocks(params, pf)
    yield from swap(params, pf)
    yield from rail_dhcp(params, pf)
    yield from rail_persisted(params, pf)


# ------------------------------------------------------------------------------ driver, firmware

def firmware_of(node: Node, report: NodeReport) -> list[str]:
    """The ConnectX-7 firmware of the node's rails: ``ethtool -i`` of each rail, else the HCAs that
    ibstat or ibv_devinfo list (the rails' own where the parameters name them)."""
    host = report.get("host")
    found = [host["firmware"][r.interface] for r in node.rails if host and r.interface in host["firmware"]]
    if not found:
        devices = report.get("ibstat") or report.get("ibv_devinfo") or {}
        hcas = [r.hca for r in node.rails if r.hca in devices] or list(devices)
        found = [v for h in hcas if (v := devices[h].get("firmware") or devices[h].get("fw_ver"))]
    return sorted(set(found))


def driver_of(report: NodeReport) -> list[str]:
    return [v for v in (report["facts"].get("driver") or "").split(", ") if v]


def versions(params: Params, pf: Preflight) -> Iterator[Check]:
    """The same driver and firmware on every node, each within the parameters' range."""
    e = params.expectations
    up = pf.up(params)
    for what, spec, seen, remedy in (
            ("driver", e.driver, {n.name: driver_of(pf.nodes[n.name]) for n in up},
             "install the same NVIDIA driver on every node: the DGX OS updates (DGX Dashboard, or "
             "`sudo apt update && sudo apt full-upgrade`), then reboot"),
            ("firmware", e.firmware, {n.name: firmware_of(n, pf.nodes[n.name]) for n in up},
             "update the ConnectX-7 firmware on every node with the DGX OS updates (DGX Dashboard, "
             "or `sudo fwupdmgr refresh && sudo fwupdmgr update`), then reboot")):
        if not any(seen.values()):
            if spec:
                yield Check(what, "all", WARN, f"no node reports its {what}", spec, remedy)
            continue
        same = len({tuple(v) for v in seen.values()}) == 1
        yield Check(f"same {what}", "all", PASS if same else WARN,
                    " / ".join(f"{n}: {', '.join(v) or 'unknown'}" for n, v in seen.items()),
                    "the same on every node", "" if same else remedy)
        if spec:
            for name, found in seen.items():
                yield in_range(what, name, found, spec, remedy)


def in_range(what: str, node: str, found: list[str], spec: str, remedy: str) -> Check:
    """One node's versions against a PEP 440 specifier set: FAIL outside it, or unparseable."""
    if not found:
        return Check(what, node, WARN, f"{what} unknown", spec, remedy)
    bad, out = [], []
    for v in found:
        try:
            if Version(v) not in SpecifierSet(spec):
                out.append(v)
        except InvalidVersion:
            bad.append(v)
    observed = ", ".join(found)
    if bad:
        return Check(what, node, FAIL, f"{observed}: {', '.join(bad)} is not a version to compare", spec,
                     f"read the {what} by hand (`{'nvidia-smi' if what == 'driver' else 'ethtool -i RAIL'}`)"
                     f"; {remedy}")
    return Check(what, node, FAIL if out else PASS, f"{observed} outside {spec}" if out else observed, spec,
                 remedy if out else "")


# ------------------------------------------------------------------------------------ GPU clocks

def clocks(params: Params, pf: Preflight) -> Iterator[Check]:
    """Per node: the GPU's clocks, and any reason that holds them down."""
    for node in pf.up(params):
        host = pf.nodes[node.name].get("host")
        if not host or not params.gpus_of(node):
            continue
        if not host["gpus"]:
            yield Check("gpu clocks", node.name, SKIP, "nvidia-smi -q shows no GPU", "", "", "nvidia-smi -q")
            continue
        rows = []
        for gpu in host["gpus"]:
            active = [r for r, on in gpu["reasons"].items() if on]
            held = [r for r in active if r in SLOWDOWNS]
            speeds = ", ".join(f"{k} {mhz} MHz" + (f" of {gpu['max_clocks'][k]}" if k in gpu["max_clocks"] else "")
                               for k, mhz in gpu["clocks"].items() if k in ("Graphics", "SM")) or "clocks N/A"
            state = f"{gpu['pstate']}, " if gpu["pstate"] else ""
            why = f"{', '.join(held)} active" if held else "no slowdown reason active" + (
                f" ({', '.join(active)})" if active else "")
            rows.append((held, f"{state}{speeds}: {why}"))
        held = [r for h, _ in rows for r in h]
        status = FAIL if any(SLOWDOWNS[r][0] == FAIL for r in held) else WARN if held else PASS
        # HW Slowdown is active with either of its causes, whose remedy says more
        said = [r for r in held if r != "HW Slowdown" or not set(held) & {"HW Power Brake Slowdown",
                                                                          "HW Thermal Slowdown"}]
        yield Check("gpu clocks", node.name, status, "; ".join(o for _, o in rows),
                    "no HW slowdown, power brake, thermal slowdown or power cap",
                    "; ".join(dict.fromkeys(SLOWDOWNS[r][1] for r in said)), "nvidia-smi -q")


# ------------------------------------------------------------------------------------------ swap

def swap(params: Params, pf: Preflight) -> Iterator[Check]:
    """Swap in use before the launch means memory ran short: on GB10 the OS, the page cache and the
    GPU share one pool, and owners report hosts wedged under memory exhaustion rather than an OOM
    kill. Reported, and a WARN from 1 GiB in use."""
    for node in pf.up(params):
        host = pf.nodes[node.name].get("host")
        kb = host and host["swap_kb"]
        if not kb:
            continue
        used = kb["total"] - kb["free"]
        gib = lambda k: f"{k / 2**20:.1f} GiB"  # noqa: E731
        if not kb["total"]:
            yield Check("swap", node.name, PASS, "no swap", f"under {gib(SWAP_WARN_KB)} in use", "", "/proc/meminfo")
            continue
        status = WARN if used >= SWAP_WARN_KB else PASS
        yield Check("swap", node.name, status, f"{gib(used)} of {gib(kb['total'])} swap in use",
                    f"under {gib(SWAP_WARN_KB)} in use", "" if status == PASS else
                    "memory ran short before the launch: find and stop what holds it (`free -g`, "
                    "`ps aux --sort=-rss | head`, 08_teardown.ipynb for an earlier deployment), then bring the "
                    "swapped pages back (`sudo swapoff -a && sudo swapon -a`)", "/proc/meminfo")


# ------------------------------------------------------------------------------ rails by DHCP

def rail_dhcp(params: Params, pf: Preflight) -> Iterator[Check]:
    """A rail NetworkManager sets by DHCP (``ipv4.method auto``): DGX OS ships the CX-7 ports on
    such profiles, so an address set by hand lasts until the next reboot or reconnect, and then the
    rail has another address or none. One row per rail that NetworkManager manages; none where
    nmcli is absent or the rail is another tool's (netplan with networkd, ifupdown)."""
    for node in pf.up(params):
        host = pf.nodes[node.name].get("host")
        for rail in node.rails:
            nm = ((host or {}).get("nm") or {}).get(rail.interface)
            if not nm or not nm["connection"]:
                continue
            seen = f"{rail.interface}: profile {nm['connection']!r}, ipv4.method {nm['method'] or 'unknown'}"
            dhcp = nm["method"] in ("auto", "")  # unread: it may be DHCP, so not a PASS
            fix = shlex.join(["sudo", "nmcli", "connection", "modify", "id", nm["connection"], "ipv4.method",
                              "manual", "ipv4.addresses", f"{rail.ip}/{rail.prefix}", "802-3-ethernet.mtu",
                              str(params.expectations.mtu)])
            yield Check("rail dhcp", node.name, WARN if dhcp else PASS, seen,
                        "a static address that survives a reboot (ipv4.method manual)",
                        f"make the address static: `{fix}`, then `sudo nmcli connection up id "
                        f"{shlex.quote(nm['connection'])}`" if dhcp else "", "nmcli")


def rail_persisted(params: Params, pf: Preflight) -> Iterator[Check]:
    """A rail whose configuration no file persists (no netplan, networkd or ifupdown file names its
    interface, no NetworkManager profile holds it): an address set by hand with `ip`, which the next
    reboot takes away. SKIP where the only candidates are files this user cannot read (netplan's
    are root's alone, mode 600)."""
    for node in pf.up(params):
        host = pf.nodes[node.name].get("host") or {}
        for rail in node.rails:
            files = (host.get("persist") or {}).get(rail.interface)
            if files is None:
                continue
            nm = ((host.get("nm") or {}).get(rail.interface) or {}).get("connection")
            owners = [f for f in files if not f.startswith("?")] + ([f"NetworkManager profile {nm!r}"] if nm else [])
            hidden = [f[1:] for f in files if f.startswith("?")]
            expected = "a file that brings the rail back after a reboot"
            if owners:
                yield Check("rail persisted", node.name, PASS, f"{rail.interface}: {', '.join(owners)}", expected)
            elif hidden:
                yield Check("rail persisted", node.name, SKIP, f"{rail.interface}: cannot tell: {', '.join(hidden)} "
                            "not readable by this user", expected)
            else:
                yield Check("rail persisted", node.name, WARN,
                            f"{rail.interface}: set at runtime only (no netplan, networkd, ifupdown or NetworkManager "
                            "configuration names it): gone at the next reboot", expected,
                            "persist it: `sparkbook fabric plan` then `sparkbook fabric apply` with this parameters "
                            "file (a netplan file, backed up, applied under a guard that rolls back by itself)",
                            f"bash sparkbook/scripts/host_state.sh {rail.interface}")
