"""The lab's footprint on this machine: what `lab up` would collide with, what it records making,
and how each recorded thing is removed.

`lab up` records in lab.json every link, namespace, cgroup, folder and file it makes on this
machine, right after making it; `lab down` removes those and nothing else, so a link or namespace of
the same kind of name that someone else made stays. Before making anything, `lab up` refuses to
start when its management subnet (the only one it adds to this machine's own namespace: the rails
live in the nodes' namespaces) overlaps a route or an address here, or when one of the names it
would make is taken. `leftovers` lists anything named like the lab's (for tests and benchmarks).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import shutil
import time
from pathlib import Path

from .nodes import FABRIC_NS, LAB_HOME, MGMT_BRIDGE, MGMT_NET, PREFIX, RUN, LabError, LabNode, sh

CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_NETS = (f"{MGMT_NET}.0/24",)  # the subnets `lab up` adds to this machine's namespace


def netns() -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def links() -> list[str]:
    out = sh("ip", "-j", "link", "show", check=False).stdout
    return [li["ifname"] for li in json.loads(out or "[]")]


def host_link(node: LabNode) -> str:
    """The host's end of a node's management link (on the management bridge)."""
    return f"{PREFIX}m{node.index}"


def cgroup_dirs(name: str) -> list[Path]:
    """The cgroup ``name`` under every hierarchy of this machine (cgroup v2, or each v1 controller)."""
    return [p for p in (CGROUP_ROOT / name, *CGROUP_ROOT.glob(f"*/{name}")) if p.is_dir()]


# ---------------------------------------------------------------------------------- conflicts

def address_conflicts(routes: list[dict], addrs: list[dict], nets=HOST_NETS) -> list[str]:
    """Routes and addresses (``ip -j route show table all``, ``ip -j addr``) that overlap ``nets``.

    A broader route overlapping one of them counts too (10.0.0.0/8 via a gateway): the lab's /24
    would take those destinations from it. Default routes and IPv6 are left out."""
    mine = [ipaddress.ip_network(n) for n in nets]
    found = []
    for r in routes:
        try:
            dst = ipaddress.ip_network(r.get("dst", ""), strict=False)
        except ValueError:  # "default", or an unparsable entry
            continue
        hit = next((n for n in mine if dst.version == 4 and dst.prefixlen and dst.overlaps(n)), None)
        if hit:
            kind = f"{r['type']} " if r.get("type") else ""  # local, broadcast, blackhole...
            via = "".join(f" {k} {r[k]}" for k in ("gateway", "dev", "table") if r.get(k))
            found.append(f"route {kind}{r['dst']}{via} overlaps the lab's {hit}")
    for link in addrs:
        for a in link.get("addr_info", []):
            if a.get("family") != "inet":
                continue
            net = ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
            hit = next((n for n in mine if net.overlaps(n)), None)
            if hit:
                found.append(f"address {a['local']}/{a['prefixlen']} on {link.get('ifname')} overlaps "
                             f"the lab's {hit}")
    return found


def conflicts(nodes: list[LabNode]) -> list[str]:
    """What on this machine keeps a lab of ``nodes`` from starting: overlapping routes and
    addresses, and the names it would make that are taken."""
    routes = json.loads(sh("ip", "-j", "route", "show", "table", "all").stdout or "[]")
    addrs = json.loads(sh("ip", "-j", "addr", "show").stdout or "[]")
    found = address_conflicts(routes, addrs)
    have_links, have_ns = set(links()), set(netns())
    found += [f"link {li} exists" for li in [MGMT_BRIDGE, *map(host_link, nodes)] if li in have_links]
    found += [f"network namespace {ns} exists" for ns in [FABRIC_NS, *(n.netns for n in nodes)]
              if ns in have_ns]
    found += [f"cgroup {d} exists" for n in nodes for d in cgroup_dirs(n.cgroup)]
    return found


def require_free(nodes: list[LabNode]) -> None:
    """Refuse to start a lab of ``nodes`` (LabError) when ``conflicts`` finds anything, naming each."""
    found = conflicts(nodes)
    if found:
        raise LabError("lab up refused, this machine already has: " + "; ".join(found) + ". The lab "
                       f"adds {', '.join(HOST_NETS)} here and makes those names; it removes only what "
                       "its own lab.json records, so anything left by hand must go by hand (`ip link "
                       "del NAME`, `ip netns del NAME`, `rmdir` the cgroup)")


# ---------------------------------------------------------------------------------- removal

def remove(item: dict) -> bool:
    """Remove one thing the lab recorded making. False when there was nothing to remove: it is
    gone already (a link goes with its peer's namespace), or it is a mount point someone has put
    things in since. Raises OSError or LabError when it cannot."""
    kind, name = item["kind"], item["name"]
    if kind == "link":
        if name not in links():
            return False
        sh("ip", "link", "del", name)
    elif kind == "netns":
        if name not in netns():
            return False
        sh("ip", "netns", "del", name)
    elif kind == "cgroup":
        dirs = cgroup_dirs(name)
        for d in dirs:
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [d]:
                _rmdir_when_idle(sub)
        return bool(dirs)
    elif kind == "tree":
        if not Path(name).exists():
            return False
        shutil.rmtree(name)
    elif kind == "path":  # a mount point or an empty file made for a bind mount
        p = Path(name)
        try:
            if p.is_dir():
                p.rmdir()
            elif p.stat().st_size == 0:
                p.unlink()
        except FileNotFoundError:
            return False
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
        return not p.exists()  # something put there since is not the lab's: it stays
    else:
        raise LabError(f"unknown kind {kind!r} in lab.json")
    return True


def _rmdir_when_idle(d: Path, timeout: float = 5) -> None:
    """rmdir a cgroup, waiting a moment while it is busy (its last processes still exiting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def made_by_older_lab(state: dict) -> list[dict]:
    """What a lab started by an older sparkbook (whose lab.json has no ``made`` list) made, in
    order: the same fixed names every such lab used."""
    nodes = [LabNode(int(name.rsplit("-", 1)[1])) for name in state.get("nodes", {})]
    made = [{"kind": "path", "name": p} for p in state.get("created", [])]
    made += [{"kind": "path", "name": str(RUN)}, {"kind": "link", "name": MGMT_BRIDGE},
             {"kind": "netns", "name": FABRIC_NS}]
    if nodes:
        made.append({"kind": "tree", "name": str(nodes[0].dir.parent)})
    for n in nodes:
        made += [{"kind": "netns", "name": n.netns}, {"kind": "link", "name": host_link(n)},
                 {"kind": "tree", "name": str(n.run)}, {"kind": "cgroup", "name": n.cgroup}]
    return made


def leftovers() -> list[str]:
    """Anything named like the lab's still on this machine: namespaces, links, processes, mounts,
    listeners, cgroups, run files. Empty after `lab down` (unless someone else made a thing of such
    a name: it shows here, and `down` leaves it)."""
    found = [f"namespace {ns}" for ns in netns() if ns.startswith(f"{PREFIX}-")]
    found += [f"link {li}" for li in links() if li.startswith(PREFIX)]
    marks = (str(LAB_HOME / "nodes"), str(LAB_HOME / "docker-head"), str(RUN))
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in marks):
            found.append(f"process {proc.name}: {cmd[:120]}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if any(m in line for m in marks):
            found.append(f"mount {line.split()[4]}")
    listen = sh("ss", "-ltnH", check=False).stdout
    found += [f"listener {ln.split()[3]}" for ln in listen.splitlines() if f" {MGMT_NET}." in f" {ln.split()[3]}"]
    found += [f"cgroup {cg}" for pattern in (f"{PREFIX}-*", f"*/{PREFIX}-*") for cg in CGROUP_ROOT.glob(pattern)]
    if RUN.exists():
        found.append(str(RUN))
    if (LAB_HOME / "nodes").exists():
        found.append(str(LAB_HOME / "nodes"))
    return found
