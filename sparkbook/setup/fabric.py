"""Day one: the CX-7 fabric planned, applied under a guard on each node, checked and restored.

sparkbook owns one netplan file per node, :data:`FILE`: the node's rails as the parameters give
them (interface, address, prefix), MTU ``expectations.mtu``, DHCP off. Everything else on the node
is read, never written.

- :func:`plan` (read-only, one SSH round trip per node, ``scripts/fabric.sh plan``): the file
  sparkbook would write, the diff against the node's, what else changes (addresses, MTU, the other
  netplan files that name a rail's interface, NetworkManager's profile), netplan's own parser run on
  the node's files with the new one in a scratch root, and whether apply can be root.
- :func:`apply`: every node backs up /etc/netplan and its rails' addresses and MTU, and starts a
  guard, detached, on the node itself: it writes the file, runs ``netplan apply`` and, unless
  sparkbook confirms within ``deadline`` seconds, restores the backup and re-applies. sparkbook
  confirms only over a fresh SSH connection (the management address still answers) and once the
  rails carry the planned addresses and MTU; a change that cuts the node off rolls itself back.
- :func:`restore`: the newest confirmed change undone on every node: the file as it was (or
  gone), netplan applied, the rails' addresses and MTU as before; the netplan files' SHA-256 are
  compared with those recorded before the change.

The backups live in /var/lib/sparkbook/fabric on each node (root's, mode 0700): they survive a
reboot, unlike the deployment's working folder.
"""

from __future__ import annotations

import difflib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import yaml

from ..book.errors import CheckFailed
from ..book.verdict import FAIL, PASS, Check
from ..facts.parsers import ipv4, parse_sections
from ..nodes.remote import Cluster, drop
from ..nodes.shell import script
from ..params import Node, Params

FILE = "/etc/netplan/40-sparkbook-fabric.yaml"
DEADLINE_S = 90  # the guard's: netplan apply takes seconds; a fresh SSH login a few more
SUDOERS_REMEDY = "let this user run the change as root without a password: `{line}` in a file of " \
                 "/etc/sudoers.d (`sudo visudo -f /etc/sudoers.d/sparkbook`), or run as root"


def render(params: Params, node: Node) -> str:
    """The netplan file for ``node``'s rails (netplan's YAML, version 2; networkd renders it, and
    netplan tells NetworkManager to leave these interfaces alone)."""
    ethernets = {r.interface: {"dhcp4": False, "dhcp6": False, "mtu": params.expectations.mtu,
                               "addresses": [f"{r.ip}/{r.prefix}"]} for r in node.rails}
    head = (f"# Written by `sparkbook fabric apply` ({params.name}, {node.name}): the CX-7 rails, one subnet per\n"
            "# rail, MTU as the parameters expect. Undo: `sparkbook fabric restore` (files and addresses as before).\n")
    return head + yaml.safe_dump({"network": {"version": 2, "ethernets": ethernets}}, sort_keys=False)


def _links(text: str) -> dict[str, dict]:
    try:
        return {li["ifname"]: li for li in json.loads(text or "[]")}
    except (ValueError, KeyError, TypeError):
        return {}


@dataclass
class NodePlan:
    node: Node
    text: str                                   # the file sparkbook would write
    current: str | None = None                  # the node's file of that name (None: absent)
    changes: list[str] = field(default_factory=list)    # per interface: now -> planned
    conflicts: list[str] = field(default_factory=list)  # what stops apply
    generate: str = ""                          # netplan generate's complaint ("" when it passed)
    root: str = ""                              # root, sudo, or the sudoers line apply needs
    error: str = ""                             # the node could not be read

    @property
    def diff(self) -> str:
        return "".join(difflib.unified_diff((self.current or "").splitlines(True), self.text.splitlines(True),
                                            f"{self.node.name}:{FILE} (now)" if self.current is not None
                                            else "/dev/null", f"{self.node.name}:{FILE} (planned)"))

    @property
    def unchanged(self) -> bool:
        return self.current == self.text and not self.changes

    @property
    def problems(self) -> list[str]:
        out = [self.error] if self.error else []
        out += self.conflicts
        if self.generate:
            out.append(f"netplan's parser refuses the file: {self.generate}")
        if self.root not in ("root", "sudo", ""):
            out.append("apply needs root and `sudo -n` refuses: " + SUDOERS_REMEDY.format(line=self.root))
        return out


def _plan_one(params: Params, node: Node, out: str) -> NodePlan:
    p = NodePlan(node, render(params, node))
    s = parse_sections(out)
    target = s.get("target", "").strip()
    if target == "unreadable":
        p.error = f"{FILE} exists but is root's alone and `sudo -n` refuses to read it"
    # sections drop the newline before the next section: the file's last one is put back
    p.current = s.get("current", "") + "\n" if target == "present" else None
    links = _links(s.get("links", ""))
    for r in node.rails:
        link = links.get(r.interface)
        if link is None:
            p.conflicts.append(f"{r.interface}: no such interface on {node.name} (discover shows its ports)")
            continue
        now, want = ipv4(link, "global"), f"{r.ip}/{r.prefix}"
        if now != [want]:
            p.changes.append(f"{r.interface}: addresses {', '.join(now) or 'none'} -> {want}"
                             + (f" ({', '.join(a for a in now if a != want)} goes)" if any(a != want for a in now) else ""))
        if link.get("mtu") != params.expectations.mtu:
            p.changes.append(f"{r.interface}: MTU {link.get('mtu')} -> {params.expectations.mtu}")
    for f in s.get("others", "").split():
        if f.startswith("?"):
            p.conflicts.append(f"{f[1:]} cannot be read (root's, and `sudo -n` refuses): it may configure a rail too")
        else:
            p.conflicts.append(f"{f} also configures a rail's interface: netplan would merge both (addresses "
                               "added up): remove that interface from it, or `sparkbook fabric` cannot own the rails")
    for line in s.get("nm", "").splitlines():
        iface, _, conn = line.partition("=")
        if conn.strip():
            p.changes.append(f"{iface}: NetworkManager's profile {conn.strip()!r} stops managing it (netplan marks it "
                             "unmanaged: networkd renders sparkbook's file)")
    gen = s.get("generate", "").strip()
    if gen == "netplan unavailable":
        p.generate = "netplan is not installed on the node (`sudo apt install netplan.io`)"
    elif not gen.endswith("rc=0"):
        p.generate = " | ".join(ln for ln in gen.splitlines() if ln.strip())[-600:]
    p.root = s.get("root", "").strip()
    return p


def plan(params: Params, cluster: Cluster | None = None) -> list[NodePlan]:
    """Each node's plan (nodes with no rails in the parameters are left out)."""
    cluster = cluster or Cluster.from_params(params)
    nodes = [n for n in params.nodes if n.rails]
    if not nodes:
        raise CheckFailed("no node has rails in the parameters: `sparkbook discover` writes them (planned "
                          "addresses where a cabled port has none)")
    results = cluster.run(lambda n: script("fabric.sh", "plan", FILE, render(params, n),
                                           *(r.interface for r in n.rails)), nodes, timeout=60)
    out = []
    for node in nodes:
        r = results[node.name]
        out.append(_plan_one(params, node, r.stdout) if r.ok else
                   NodePlan(node, render(params, node), error=f"not read: {r.summary()}"))
    return out


@dataclass
class Outcome:
    node: str
    status: str       # confirmed, unchanged, rolled-back, restored, unreachable, refused
    seen: str = ""
    command: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("confirmed", "unchanged", "restored", "nothing to restore")


def _status(cluster: Cluster, node: Node, txn: str) -> tuple[dict | None, str]:
    """The change's state on the node over a fresh SSH connection, or why it could not be read."""
    drop(node, cluster.ssh)
    r = cluster.run_on(node, script("fabric.sh", "status", txn), timeout=15)
    return (parse_sections(r.stdout), "") if r.ok else (None, r.summary())


def _rails_as_planned(params: Params, node: Node, links_json: str) -> list[str]:
    links, wrong = _links(links_json), []
    for r in node.rails:
        link = links.get(r.interface, {})
        if f"{r.ip}/{r.prefix}" not in ipv4(link, "global"):
            wrong.append(f"{r.interface} has {', '.join(ipv4(link, 'global')) or 'no address'}, not {r.ip}/{r.prefix}")
        if link.get("mtu") != params.expectations.mtu:
            wrong.append(f"{r.interface} has MTU {link.get('mtu')}, not {params.expectations.mtu}")
    return wrong


def _until_applied(params: Params, cluster: Cluster, p: NodePlan, txn: str, deadline_s: int,
                   t0: float) -> tuple[str, str]:
    """Where the node's change stands, over fresh SSH connections until shortly before its guard's
    deadline: ("ready", "") once applied with the rails as planned; ("wrong", why) applied but not
    as planned; ("rolled-back", why) its guard restored already (netplan apply failed); ("silent",
    the last SSH error) the node never answered."""
    last = "no answer"
    while time.monotonic() < t0 + deadline_s - 5:
        s, err = _status(cluster, p.node, txn)
        if s is None:
            last = err
            time.sleep(2)
            continue
        state = s.get("state", "").strip()
        if state in ("applying", "rolling-back"):
            time.sleep(0.5)
        elif state == "rolled-back":
            return "rolled-back", s.get("why", "").strip()
        else:
            wrong = _rails_as_planned(params, p.node, s.get("links", ""))
            return ("wrong", "after netplan apply " + "; ".join(wrong)) if wrong else ("ready", "")
    return "silent", last


def _settle(params: Params, cluster: Cluster, p: NodePlan, txn: str, deadline_s: int, t0: float,
            state: str, why: str, others_failed: list[str]) -> Outcome:
    """Confirm a node's change when every node's is ready; otherwise see it rolled back (asked, or
    by its guard at the deadline) and say why."""
    node, command = p.node, f"fabric.sh apply {FILE} ... {deadline_s} {txn}"
    if state in ("ready", "wrong"):
        confirm = state == "ready" and not others_failed
        reason = why or f"rolled back with the others: the change failed on {', '.join(others_failed)} (no node is left half-done)"
        drop(node, cluster.ssh)
        r = cluster.run_on(node, script("fabric.sh", *(("confirm", txn) if confirm else ("abort", txn, reason))), timeout=90)
        after = parse_sections(r.stdout).get("state", "").strip()
        if confirm and after == "confirmed":
            return Outcome(node.name, "confirmed", "; ".join(p.changes) or "file written; addresses already as planned", command)
        status = "unconfirmed" if after != "rolled-back" else "held-back" if state == "ready" else "rolled-back"
        return Outcome(node.name, status,
                       (reason if not confirm else f"the confirmation was not taken ({r.summary()})") +
                       f"; the guard's state: {after or '?'}", command)
    if state == "rolled-back":
        return Outcome(node.name, "rolled-back", f"the node's guard rolled the change back: {why}", command)
    # Silent: the guard restores at its deadline; give it time, then ask again.
    while time.monotonic() < t0 + deadline_s + 45:
        time.sleep(3)
        s, _ = _status(cluster, node, txn)
        if s is not None and s.get("state", "").strip() == "rolled-back":
            return Outcome(node.name, "cut-off",
                           f"after netplan apply the node did not answer a fresh SSH connection to {node.host} ({why}): "
                           f"the change cut its management address. Its guard restored the files and re-applied them "
                           f"at the deadline ({s.get('why', '').strip()}); it answers again", command)
    return Outcome(node.name, "unreachable",
                   f"the node has not answered SSH since netplan apply ({why}), {deadline_s + 45} s; its guard should "
                   "have restored the files at the deadline", command)


def apply(params: Params, plans: list[NodePlan], deadline_s: int = DEADLINE_S,
          cluster: Cluster | None = None, say=print) -> list[Outcome]:
    """Apply the plans on every node at once, each under its own guard, and confirm them only when
    every node's is applied as planned; otherwise every node is rolled back. Returns each node's
    outcome."""
    cluster = cluster or Cluster.from_params(params)
    if deadline_s < 15:
        raise CheckFailed(f"fabric apply: a deadline of {deadline_s} s leaves the guard no time to be confirmed "
                          "(netplan apply, then a fresh SSH login): give 15 s or more")
    bad = [f"- {p.node.name}: {x}" for p in plans for x in p.problems]
    if bad:
        raise CheckFailed("fabric apply: the plan cannot be applied\n" + "\n".join(bad))
    todo = [p for p in plans if not p.unchanged]
    outcomes = [Outcome(p.node.name, "unchanged", "the node's file and rails are as planned") for p in plans if p.unchanged]
    if not todo:
        return outcomes
    txn = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{params.name}"
    say(f"fabric: applying on {', '.join(p.node.name for p in todo)}; each node's guard restores it unless "
        f"sparkbook confirms within {deadline_s} s")
    t0 = time.monotonic()
    started = cluster.run(lambda n: script("fabric.sh", "apply", FILE, next(p.text for p in todo if p.node is n),
                                           deadline_s, txn, *(r.interface for r in n.rails)),
                          [p.node for p in todo], timeout=deadline_s / 2)  # time left to confirm the others
    # A start whose SSH answer was lost (the change may have cut the connection) is watched like
    # the others: its guard may run. A start the node answered with an error is refused.
    watch = [p for p in todo if started[p.node.name].ok or started[p.node.name].error]
    outcomes += [Outcome(p.node.name, "refused", started[p.node.name].summary(), started[p.node.name].command)
                 for p in todo if p not in watch]
    with ThreadPoolExecutor(max_workers=max(1, len(watch))) as pool:
        states = list(pool.map(lambda p: _until_applied(params, cluster, p, txn, deadline_s, t0), watch))
        failed = [o.node for o in outcomes if o.status == "refused"] + \
            [p.node.name for p, (st, _) in zip(watch, states) if st != "ready"]
        outcomes += list(pool.map(lambda a: _settle(params, cluster, a[0], txn, deadline_s, t0, *a[1], failed),
                                  zip(watch, states)))
    order = [n.name for n in params.nodes]
    return sorted(outcomes, key=lambda o: order.index(o.node))


def restore(params: Params, cluster: Cluster | None = None) -> list[Outcome]:
    """Undo the newest confirmed change on every node with rails."""
    cluster = cluster or Cluster.from_params(params)
    nodes = [n for n in params.nodes if n.rails]
    results = cluster.run(script("fabric.sh", "restore"), nodes, timeout=120)
    out = []
    for node in nodes:
        r = results[node.name]
        s = parse_sections(r.stdout)
        if not r.ok:
            out.append(Outcome(node.name, "refused", r.summary(), r.command))
        elif "nothing" in s:
            out.append(Outcome(node.name, "nothing to restore", s["nothing"].strip(), r.command))
        else:
            same = s.get("identical", "").strip()
            addrs = {i: ipv4(li, "global") for i, li in _links(s.get("links", "")).items() if i in {x.interface for x in node.rails}}
            seen = (f"change {s.get('change', '').strip()} undone; rails now "
                    + "; ".join(f"{i}: {', '.join(a) or 'no address'}" for i, a in addrs.items()))
            out.append(Outcome(node.name, "restored" if same == "yes" else "differs",
                               seen + ("" if same == "yes" else f"; netplan files differ from before: {same}"), r.command))
    return out


def checks(outcomes: list[Outcome], what: str) -> list[Check]:
    """One verdict row per node."""
    remedy = {"rolled-back": "read the reason: fix the parameters' rails or the node's other network files, then plan again",
              "cut-off": "find what takes the management address down when netplan applies (`sudo netplan apply` on the "
                         "node's console, `journalctl -u systemd-networkd -u NetworkManager`; a renderer switch, or a "
                         "file that also names the management interface), then plan again",
              "held-back": "nothing on this node: its change was rolled back because another node's failed; fix that "
                           "node, then apply again",
              "unconfirmed": "read /var/lib/sparkbook/fabric/<change>/guard.log on the node",
              "unreachable": "reach the node on its console or BMC: `sudo bash` the guard's folder's put-back, or restore "
                             "/var/lib/sparkbook/fabric/<change>/netplan/ into /etc/netplan and `sudo netplan apply`",
              "refused": "see what was seen (root through `sudo -n`, the node's SSH)",
              "differs": "compare /etc/netplan with the backup in /var/lib/sparkbook/fabric/<change>/netplan"}
    return [Check(what, o.node, PASS if o.ok else FAIL, o.seen, o.status if o.ok else "confirmed",
                  "" if o.ok else remedy.get(o.status, ""), o.command) for o in outcomes]


def describe(plans: list[NodePlan]) -> str:
    """The plans as text: per node the diff, what else changes, and what stops apply."""
    out = []
    for p in plans:
        out.append(f"== {p.node.name} ({p.node.host}): " + ("no change" if p.unchanged and not p.problems else
                                                             "cannot apply" if p.problems else "changes"))
        if p.diff:
            out.append(p.diff.rstrip("\n"))
        out += [f"  change: {c}" for c in p.changes]
        out += [f"  PROBLEM: {x}" for x in p.problems]
        if not p.problems:
            out.append("  netplan generate (the node's parser, the node's files with this one): ok")
    return "\n".join(out)


def plan_checks(plans: list[NodePlan], peers: list) -> list[Check]:
    """The plan's verdict, one row per node: whether apply can go ahead (``peers``: the
    :class:`sparkbook.setup.mesh.MeshPlan` of each node)."""
    errors = {p.node.name: p.error for p in peers if p.error}
    rows = []
    for p in plans:
        problems = p.problems + ([f"SSH between the nodes: {errors[p.node.name]}"] if p.node.name in errors else [])
        seen = "; ".join(problems) or ("; ".join(p.changes) if p.changes else "no change" if p.unchanged else "file written")
        rows.append(Check("fabric plan", p.node.name, FAIL if problems else PASS, seen,
                          "a plan apply can make (netplan's parser passes, no other file owns a rail, root)",
                          "fix each problem named, then plan again" if problems else "", f"fabric.sh plan {FILE} ..."))
    return rows
