"""Day one, second half: a parameters file from what :mod:`sparkbook.setup.discover` found.

The nodes (named by their hostnames, the first host the head) and their rails (each cabled CX-7
port with an IPv4 address of its own, ordered by subnet so that rail N is the same subnet on every
node) are written from the nodes themselves, every other section from a template (a shipped
parameters file: its comments kept). What could not be decided is written as a comment that
says why and what to do, never as a guess; a file that still does not validate is not written
(:class:`DraftError`). The layout is judged as 01 judges it
(:func:`sparkbook.params.layout.classify`).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..book.errors import SparkbookError
from ..book.project import project_root
from ..params import NAME_RE, Params, ParamsError, validate
from ..params.layout import MIXED, RING, classify
from ..params.settings import Expectations
from .discover import Found, gpu_summary

TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):")
# The addressing scheme for cabled ports without an address of their own: rail N (the node's cabled
# ports in PCIe order, the same twin on every node) on the N-th /24 from here up that holds no
# address of any node; the host number is the last octet of the node's management address (its
# position + 1 where those are not distinct).
SCHEME_FROM = ipaddress.ip_network("192.168.100.0/24")
SCHEME = (f"rail N on the N-th free /24 from {SCHEME_FROM} up, host = the last octet of the node's management "
          "address")


class DraftError(ParamsError):
    """The drafted file does not validate: its bad fields, then what was noted while drafting."""

    def __init__(self, source: str, problems: list[tuple[str, str]], notes: list[str]):
        super().__init__(source, problems)
        self.notes = notes

    def __str__(self) -> str:
        return "\n".join([super().__str__(), *(f"NOTE {n}" for n in self.notes)])


@dataclass
class Draft:
    text: str                                        # the parameters file
    params: Params                                   # ... validated
    layout: str
    notes: list[str] = field(default_factory=list)   # what was not decided, and why


def names(found: list[Found]) -> tuple[list[str], list[str]]:
    """The nodes' names: their hostnames where each is a valid and distinct name, else node-N."""
    hostnames = [f.hostname for f in found]
    if all(re.fullmatch(NAME_RE, h) for h in hostnames) and len(set(hostnames)) == len(hostnames):
        return hostnames, []
    return [f"node-{i + 1}" for i in range(len(found))], [
        f"the nodes' hostnames ({', '.join(h or '?' for h in hostnames)}) are not distinct valid names: "
        "named node-1... (rename them freely)"]


def scheme(found: list[Found]) -> tuple[list[ipaddress.IPv4Network], list[int]]:
    """:data:`SCHEME`'s subnets (one per cabled port of the node with the most) and each node's host
    number."""
    held = [ipaddress.ip_address(ip) for f in found for p in f.ports for ip, *_ in p.addresses]
    held += [ipaddress.ip_address(f.identity["mgmt"]) for f in found if _ipv4(f.identity.get("mgmt", ""))]
    subnets, net = [], SCHEME_FROM
    while len(subnets) < max((len(f.cabled) for f in found), default=0) and net.network_address.packed[0] == 192:
        if not any(a in net for a in held):
            subnets.append(net)
        net = ipaddress.ip_network((int(net.network_address) + 256, 24))
    hosts = [int(f.identity["mgmt"].rsplit(".", 1)[1]) if _ipv4(f.identity.get("mgmt", "")) else 0 for f in found]
    if len(set(hosts)) != len(hosts) or not all(0 < h < 255 for h in hosts):
        hosts = list(range(1, len(found) + 1))
    return subnets, hosts


def _ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


def rails(f: Found, name: str, mtu: int, planned: tuple[list[ipaddress.IPv4Network], int] | None = None
          ) -> tuple[list[dict], list[str], list[str]]:
    """A node's rails (cabled ports with an address of their own, ordered by subnet; with
    ``planned`` = (:func:`scheme`'s subnets, the node's host number), also those without, at the
    scheme's address), the commented lines for cabled ports it could not decide, and notes (a port
    whose MTU is not the ``mtu`` 01 expects among them)."""
    out, undecided, notes = [], [], []
    by_pci = sorted(f.cabled, key=lambda p: (p.pci, p.netdev))
    for p in f.cabled:
        if p.mtu and p.mtu != mtu and not (p.address is None and planned):
            notes.append(f"{name}: {p.netdev} has MTU {p.mtu}, not {mtu}: 01's rail mtu row will fail until "
                         "it is raised at both ends of the cable")
        if p.address is None and planned and by_pci.index(p) < len(planned[0]):
            net = planned[0][by_pci.index(p)]
            ip = str(net[planned[1]])
            out.append({"interface": p.netdev, "ip": ip, "prefix": net.prefixlen, "hca": p.hca, "_seen": p,
                        "_planned": True})
            notes.append(f"{name}: {p.netdev} has no address of its own: planned {ip}/{net.prefixlen}, MTU {mtu} "
                         f"({SCHEME}); `sparkbook fabric plan` shows the change, `sparkbook fabric apply` makes it")
            continue
        if p.address is None:
            why = ("its address comes from DHCP" if any(d for *_, d in p.addresses) else
                   "it has only a link-local address" if p.addresses else "it has no IPv4 address")
            undecided.append(f"# - {{interface: {p.netdev}, ip: UNDECIDED, prefix: 24, hca: {p.hca}}}"
                             f"  # cabled, but {why}")
            notes.append(f"{name}: {p.netdev} is cabled but {why}: give it a static address on its own subnet "
                         "(one subnet per rail), then add the rail")
            continue
        ip, prefix = p.address
        if p.owner.startswith("runtime only"):
            notes.append(f"{name}: {p.netdev}'s address {ip}/{prefix} is set at runtime only: nothing persists it, "
                         "so it is gone at the next reboot")
        elif p.nm_method == "auto":
            notes.append(f"{name}: {p.netdev}'s address {ip}/{prefix} sits on a NetworkManager profile that asks DHCP: "
                         "make the profile static (01's rail dhcp row gives the nmcli command)")
        out.append({"interface": p.netdev, "ip": ip, "prefix": prefix, "hca": p.hca, "_seen": p})
    out.sort(key=lambda r: (ipaddress.ip_interface(f"{r['ip']}/{r['prefix']}").network, r["interface"]))
    return out, undecided, notes


def _common_subnets(nodes: list[dict], undecided: dict[str, list[str]], notes: list[str]) -> None:
    """Keep as rails only the subnets every node has a rail on (rail N is one subnet everywhere);
    the others become commented lines with a note. Where every node has rails but no subnet is
    common to all (a ring) they are left as found, for the layout to say what they draw."""
    def net(r):
        return ipaddress.ip_interface(f"{r['ip']}/{r['prefix']}").network
    common = set.intersection(*({net(r) for r in n["rails"]} for n in nodes)) if nodes else set()
    if not common and all(n["rails"] for n in nodes):
        return
    for n in nodes:
        for r in [r for r in n["rails"] if net(r) not in common]:
            n["rails"].remove(r)
            undecided[n["name"]].append(f"# - {_scalar({k: r[k] for k in ('interface', 'ip', 'prefix', 'hca')})}"
                                        f"  # its subnet {net(r)} is not on every node")
            notes.append(f"{n['name']}: {r['interface']} ({r['ip']}/{r['prefix']}) is left out: its subnet is not on "
                         "every node (cable the same twins on every node, one subnet per rail)")


def _scalar(value: Any) -> str:
    """``value`` as YAML on one line, quoted where it must be: what a node printed cannot change
    the file's structure."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip().removesuffix("...").strip()


def nodes_yaml(found: list[Found], nodes: list[dict[str, Any]], undecided: dict[str, list[str]]) -> str:
    """The ``nodes:`` block, each node and rail with what was seen as a comment."""
    lines = ["nodes:"]
    for f, n in zip(found, nodes):
        lines.append(f"  # {f.hostname or f.host}: {f.identity.get('os', '?')}, kernel {f.identity.get('kernel', '?')}, "
                     f"{f.identity.get('arch', '?')}, {gpu_summary(f)}, {f.mem_gib} GiB; management "
                     f"{f.mgmt_interface or '?'}")
        lines.append(f"  - name: {_scalar(n['name'])}")
        lines += [f"    {key}: {_scalar(n[key])}" for key in ("host", "user", "port", "key") if n.get(key) is not None]
        lines.append(f"    role: {n['role']}")
        lines.append("    rails:" + ("" if n["rails"] else " []"))  # comments alone would read as null
        for r in n["rails"]:
            p = r["_seen"]
            speed = f"{p.speed_mbps // 1000} Gb/s" if p.speed_mbps else "speed unknown"
            rail = {k: r[k] for k in ("interface", "ip", "prefix", "hca")}
            seen = "PLANNED, not on the node yet (sparkbook fabric apply)" if r.get("_planned") else p.owner or "no owner"
            lines.append(f"      - {_scalar(rail)}  # {p.pci or 'pci ?'}, {speed}, mtu {p.mtu}; {seen}")
        lines += [f"      {u}" for u in undecided[n["name"]]]
    return "\n".join(lines) + "\n"


def _blocks(text: str) -> list[tuple[str, str]]:
    """A YAML file's top-level entries as (key, text), the comments above an entry in its text."""
    out: list[tuple[str, list[str]]] = [("", [])]
    pending: list[str] = []
    for line in text.splitlines(keepends=True):
        if m := TOP_KEY.match(line):
            out.append((m[1], pending + [line]))
            pending = []
        elif not line.strip() or line.startswith("#"):
            pending.append(line)
        else:
            out[-1][1].extend(pending + [line])
            pending = []
    out[-1][1].extend(pending)
    return [(k, "".join(v)) for k, v in out]


def _known_hosts(block: str, files: list[str]) -> str:
    """The ``ssh:`` block with ``known_hosts`` set to ``files``."""
    line = f"  known_hosts: {_scalar(files)}"
    if re.search(r"(?m)^  known_hosts:", block):  # its value, on its line or as a block list below it
        return re.sub(r"(?m)^  known_hosts:.*(\n(    .*|  - .*))*$", lambda _: line, block)
    return re.sub(r"(?m)^ssh:.*$", lambda m: f"{m[0]}\n{line}", block, count=1)


def draft(found: list[Found], template: str, *, name: str, user: str | None = None, port: int | None = None,
          key: str | None = None, known_hosts: list[str] | None = None, plan: bool = True) -> Draft:
    """The parameters file for the nodes ``found`` (every one answered), other sections from the
    text of ``template``. ``plan``: on nodes fresh from the box (no cabled port on any node has an
    address of its own) every cabled port gets one from :data:`SCHEME`; where some have, the others
    are left undecided (their subnet is the owner's choice)."""
    node_names, notes = names(found)
    plan = plan and not any(p.address for f in found for p in f.cabled)
    mtu = ((yaml.safe_load(template) or {}).get("expectations") or {}).get("mtu") or Expectations().mtu
    nodes, undecided = [], {}
    subnets, hosts = scheme(found)
    for i, (f, n) in enumerate(zip(found, node_names)):
        r, u, more = rails(f, n, mtu, (subnets, hosts[i]) if plan else None)
        notes += more
        undecided[n] = u
        nodes.append({"name": n, "host": f.host, "user": user, "port": port, "key": key,
                      "role": "head" if i == 0 else "worker", "rails": r})
    _common_subnets(nodes, undecided, notes)
    stamp = datetime.date.today().isoformat()
    out = []
    for k, block in _blocks(template):
        if k == "name":
            block = re.sub(r"(?m)^name:.*$", lambda _: f"name: {_scalar(name)}", block)
        elif k == "description":
            said = f"{len(nodes)} nodes found by sparkbook discover on {stamp}"
            block = re.sub(r"(?m)^description:.*$", lambda _: f"description: {_scalar(said)}", block)
        elif k == "nodes":
            block = "\n# Written by `sparkbook discover` from what each node showed; comments say what was seen.\n" + \
                nodes_yaml(found, nodes, undecided)
        elif k == "ssh" and known_hosts:
            block = _known_hosts(block, known_hosts)
        out.append(block)
    if known_hosts and "ssh" not in {k for k, _ in _blocks(template)}:
        out.append(_known_hosts("\nssh:\n", known_hosts))
    text = "".join(out)
    data = yaml.safe_load(text)
    total = sum(max(len(f.gpus), 1) for f in found)
    serving = data.setdefault("serving", {})
    tp, pp = serving.get("tensor_parallel_size", 1), serving.get("pipeline_parallel_size", 1)
    if tp * pp != total and not serving.get("nodes") and total % pp == 0:
        line = f"  tensor_parallel_size: {total // pp}"
        if re.search(r"(?m)^  tensor_parallel_size:", text):
            text = re.sub(r"(?m)^  tensor_parallel_size:.*$", lambda _: line, text)
        else:
            text = re.sub(r"(?m)^serving:.*$", lambda m: f"{m[0]}\n{line}", text, count=1)
        notes.append(f"serving.tensor_parallel_size set to {total // pp}: {total} GPUs across the nodes (the "
                     f"template had {tp} x pipeline {pp})")
    try:
        params = validate(yaml.safe_load(text), source=f"the drafted file for {', '.join(f.host for f in found)}")
    except ParamsError as e:  # nothing is written; what was noted says why as much as the fields do
        raise DraftError(e.source, e.problems, notes) from e
    layout = classify(params)
    if layout.kind == RING:
        notes.append(f"{layout}: sparkbook supports a direct pair or a switch; a ring of cabled Sparks is not supported yet")
    elif layout.kind == MIXED:
        notes.append(f"{layout}: a rail's subnet does not hold the other nodes: check the cabling and the addresses")
    return Draft(text, params, str(layout) if layout.kind else "one node", notes)


def default_template(nodes: int) -> Path:
    """The shipped parameters file the other sections come from: the Spark pair's, or for more
    nodes the four behind a switch."""
    return project_root() / "parameters" / ("dgx-spark-pair.yaml" if nodes <= 2 else "dgx-spark-quad.yaml")


def writable(path: Path, force: bool = False) -> None:
    """An existing file is someone's: kept unless ``force``."""
    if path.exists() and not force:
        raise SparkbookError(f"{path} exists: choose another path (-o) or pass --force to replace it")


def write(d: Draft, path: Path, force: bool = False) -> Path:
    """Write the drafted file (see :func:`writable`)."""
    writable(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(d.text)
    tmp.replace(path)
    return path


def differences(params: Params, found: list[Found]) -> list[str]:
    """Where a parameters file's rails and the ports the nodes show disagree (``found`` in the
    order of ``params.nodes``): a rail on a port that is not cabled, a cabled port with an address
    of its own that is no rail, an address that is not the port's."""
    out = []
    for node, f in zip(params.nodes, found):
        if f.error:
            out.append(f"{node.name}: not read ({f.error})")
            continue
        ports = {p.netdev: p for p in f.ports}
        railed = {r.interface for r in node.rails}
        for r in node.rails:
            p = ports.get(r.interface)
            if p is None or not p.cabled:
                out.append(f"{node.name}: rail {r.interface} is {'not an HCA port' if p is None else 'not cabled'}")
            elif (str(r.ip), r.prefix) not in p.static:
                seen = ", ".join(f"{ip}/{prefix}" for ip, prefix in p.static) or "no address of its own"
                out.append(f"{node.name}: rail {r.interface} is {r.ip}/{r.prefix} in the parameters, {seen} on the node")
        out += [f"{node.name}: {p.netdev} is cabled and has {p.address[0]}/{p.address[1]}, but is no rail"
                for p in f.cabled if p.address and p.netdev not in railed]
    return out
