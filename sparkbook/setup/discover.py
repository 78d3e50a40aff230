"""Day one, first half: what the nodes are, read before any parameters file exists.

:func:`discover` asks every node, all at once and in one SSH round trip each
(``scripts/discover.sh``, read-only), for its identity (OS, kernel, arch, BIOS), GPU, memory, the
management address the session arrived at, and every netdev of an HCA: its link state and carrier,
speed, MTU, PCIe function, firmware, addresses, and who persists them (netplan, networkd, ifupdown,
NetworkManager, DHCP; an address none of them names lives until the next reboot). A port is
cabled when ibdev2netdev says Up and the netdev has carrier.

:mod:`sparkbook.setup.draft` turns what was found into a parameters file.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Iterable

from ..book.tables import Table
from ..facts.parsers import (parse_ibdev2netdev, parse_key_values, parse_meminfo, parse_nvidia_smi_csv,
                             parse_sections)
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..params import validate

GPU_FIELDS = ["name", "memory.total", "driver_version"]


@dataclass
class Port:
    """One netdev of an HCA, as the node showed it."""
    hca: str
    netdev: str
    up: bool                  # ibdev2netdev: the HCA's port is Up (cabled, and the far end too)
    present: bool = True      # the netdev exists (ibdev2netdev may name one the kernel lacks)
    carrier: bool = False
    operstate: str = ""
    speed_mbps: int | None = None
    mtu: int | None = None
    pci: str = ""
    firmware: str = ""
    addresses: list[tuple[str, int, bool]] = field(default_factory=list)  # (ip, prefix, by DHCP)
    owners: list[str] = field(default_factory=list)  # what persists its addresses
    nm_method: str = ""  # NetworkManager's profile on it: its ipv4.method ("auto" is DHCP)

    @property
    def cabled(self) -> bool:
        return self.up and self.present and self.carrier

    @property
    def address(self) -> tuple[str, int] | None:
        """The port's IPv4 address for a rail: the first that is neither link-local (netplan's
        link-local option) nor DHCP's."""
        usable = self.static
        return usable[0] if usable else None

    @property
    def static(self) -> list[tuple[str, int]]:
        return [(ip, p) for ip, p, dhcp in self.addresses if not dhcp and not ipaddress.ip_address(ip).is_link_local]

    @property
    def owner(self) -> str:
        if any(dhcp for *_, dhcp in self.addresses) or self.nm_method == "auto":
            return "DHCP" + (" (NetworkManager's profile: the address set by hand goes at the next reboot)"
                             if self.nm_method == "auto" and not any(d for *_, d in self.addresses) else "")
        return ", ".join(self.owners) or ("runtime only (gone at the next reboot)" if self.addresses else "")


@dataclass
class Found:
    """One node: what it said, or why it could not be asked."""
    host: str
    error: str = ""
    identity: dict[str, str] = field(default_factory=dict)
    gpus: list[dict] = field(default_factory=list)
    mem_gib: float | None = None
    mgmt_interface: str = ""
    ports: list[Port] = field(default_factory=list)

    @property
    def hostname(self) -> str:
        return self.identity.get("hostname", "")

    @property
    def cabled(self) -> list[Port]:
        return [p for p in self.ports if p.cabled]


def _int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None  # a down link's speed reads -1


def parse(host: str, stdout: str) -> Found:
    """One node's ``discover.sh`` output."""
    s = parse_sections(stdout)
    found = Found(host, identity=parse_key_values(s.get("identity", "")))
    if not s.get("gpu", "").strip().endswith("unavailable"):
        try:
            found.gpus = parse_nvidia_smi_csv(s.get("gpu", ""), GPU_FIELDS)
        except ValueError:  # a warning among the rows: the GPU is shown as not seen, the rest goes on
            found.gpus = []
    mem = parse_meminfo(s.get("meminfo", "")).get("MemTotal")
    found.mem_gib = round(mem / 2**30, 1) if mem else None
    try:
        links = {li["ifname"]: li for li in json.loads(s.get("links") or "[]")}
    except json.JSONDecodeError:
        links = {}
    mgmt = found.identity.get("mgmt", "")
    found.mgmt_interface = next((name for name, li in links.items()
                                 for a in li.get("addr_info", []) if mgmt and a.get("local") == mgmt), "")
    for hca, rail in parse_ibdev2netdev(s.get("ibdev2netdev", "")).items():
        kv = parse_key_values(s.get(f"port {rail['netdev']}", ""))
        li = links.get(rail["netdev"], {})
        addresses = [(a["local"], int(a["prefixlen"]), bool(a.get("dynamic")))
                     for a in li.get("addr_info", []) if a.get("family") == "inet"]
        owners = []
        for tool in ("netplan", "networkd", "ifupdown"):
            files = kv.get(tool, "").split()
            named, unread = [f for f in files if not f.startswith("?")], [f[1:] for f in files if f.startswith("?")]
            if named:
                owners.append(f"{tool} ({' '.join(named)})")
            elif unread:  # it may persist the address: not read as this user, so not called runtime only
                owners.append(f"{tool}? ({' '.join(unread)} not readable without root)")
        if kv.get("nm") and kv.get("nm_method") != "auto":
            owners.append(f"NetworkManager ({kv['nm']}, ipv4.method {kv.get('nm_method') or 'unknown'})")
        found.ports.append(Port(
            hca, rail["netdev"], rail["up"], present=bool(li), carrier="LOWER_UP" in li.get("flags", []),
            operstate=li.get("operstate", ""), speed_mbps=_int(kv.get("speed", "")), mtu=li.get("mtu"),
            pci=kv.get("pci", ""), firmware=kv.get("firmware", "").split(" ")[0], addresses=addresses,
            owners=owners, nm_method=kv.get("nm_method", "") if kv.get("nm") else ""))
    found.ports.sort(key=lambda p: (p.netdev.lower(), p.netdev))
    return found


def connect(hosts: Iterable[str], *, user: str | None = None, port: int | None = None, key: str | None = None,
            known_hosts: Iterable[str] = (), connect_timeout: float = 10) -> Cluster:
    """A cluster of ``hosts`` (names, addresses or ~/.ssh/config aliases) before any parameters
    file, checked as a parameters file's nodes are (one ParamsError naming each bad field); host
    keys are checked as always. The nodes are named ``node-1``... until they say their names."""
    hosts = list(hosts)
    extra = {k: v for k, v in (("user", user), ("port", port), ("key", key)) if v is not None}
    params = validate({
        # what a parameters file needs besides the nodes, valid and never used
        "name": "discovery", "model": {"name": "discovery", "path": "/nonexistent/discovery"},
        "runtime": {"image": "sparkbook/discovery"}, "serving": {"tensor_parallel_size": len(hosts)},
        "nodes": [{"name": f"node-{i + 1}", "host": h, "role": "head" if i == 0 else "worker", **extra}
                  for i, h in enumerate(hosts)],
        "ssh": {"known_hosts": list(known_hosts), "connect_timeout": connect_timeout}})
    return Cluster.from_params(params)


def discover(cluster: Cluster, timeout: float = 60) -> list[Found]:
    """Every node of ``cluster``, in one round trip each, all at once."""
    results = cluster.run(script("discover.sh"), timeout=timeout, env={"LC_ALL": "C"})
    out = []
    for node in cluster.nodes:
        r = results[node.name]
        if r.error or not r.ok:
            out.append(Found(node.host, error=r.error or r.summary()))
            continue
        try:
            out.append(parse(node.host, r.stdout))
        except (ValueError, KeyError, TypeError) as e:  # output this parser does not know
            out.append(Found(node.host, error=f"discover.sh printed what could not be read ({type(e).__name__}: {e})"))
    return out


def gpu_summary(f: Found) -> str:
    return f"{f.gpus[0].get('name')} x{len(f.gpus)}, driver {f.gpus[0].get('driver_version')}" if f.gpus else "no GPU seen"


def table(found: list[Found]) -> Table:
    """One row per HCA netdev of every node that answered."""
    rows = [[f.host, f.hostname, p.netdev, p.hca, p.pci, "cabled" if p.cabled else "Up" if p.up else "Down",
             f"{p.speed_mbps // 1000} Gb/s" if p.speed_mbps else "", p.mtu or "",
             ", ".join(f"{ip}/{prefix}" for ip, prefix, _ in p.addresses), p.owner]
            for f in found if not f.error for p in f.ports]
    return Table(["host", "hostname", "netdev", "hca", "pci", "link", "speed", "mtu", "ipv4", "persisted by"],
                 rows, title="CX-7 ports found")


def nodes_table(found: list[Found]) -> Table:
    """One row per node: what it is, or why it could not be asked."""
    rows = []
    for f in found:
        if f.error:
            rows.append([f.host, f.error, *[""] * 7])
            continue
        rows.append([f.host, f.error or f.hostname, f.identity.get("os", ""), f.identity.get("kernel", ""),
                     f.identity.get("arch", ""), gpu_summary(f), f"{f.mem_gib} GiB" if f.mem_gib else "",
                     f.mgmt_interface, f"{len(f.cabled)} of {len(f.ports)}"])
    return Table(["host", "hostname", "os", "kernel", "arch", "gpu", "memory", "management", "ports cabled"],
                 rows, title="Nodes found")
