"""SSH between the nodes over the fabric (the image and model copies go node to node): every node's
user knows every other node's host key under that node's rail addresses, and accepts every other
node's key. Host-key checking stays on: a host key is read by the node itself from its own sshd
(``ssh-keyscan 127.0.0.1`` over this machine's checked SSH connection), never from the network
between the nodes.

Every line sparkbook adds ends with the comment ``sparkbook:DEPLOYMENT`` (:func:`mark`), and a key
pair it makes for a user who had none carries it too: :func:`restore` removes exactly those.
``scripts/ssh_mesh.sh`` does the work on the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..facts.parsers import parse_sections
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..params import Node, Params
from .fabric import Outcome


def mark(params: Params) -> str:
    return f"sparkbook:{params.name}"


@dataclass
class MeshPlan:
    node: Node
    known: list[str] = field(default_factory=list)       # lines for the user's ~/.ssh/known_hosts
    authorized: list[str] = field(default_factory=list)  # lines for ~/.ssh/authorized_keys
    keygen: bool = False                                  # the user has no key pair: one is made
    error: str = ""


def _hosts(peer: Node) -> list[str]:
    return [str(r.ip) if not peer.port or peer.port == 22 else f"[{r.ip}]:{peer.port}" for r in peer.rails]


def _known(lines: str) -> set[tuple[str, str]]:
    """(host, key) pairs a known_hosts text holds (hashed names cannot be read: never matched)."""
    out = set()
    for line in lines.splitlines():
        words = line.split()
        if len(words) >= 3 and not line.startswith("#"):
            if words[0].startswith("@"):
                words = words[1:]
            out |= {(h, words[2]) for h in words[0].split(",")}
    return out


def plan(params: Params, cluster: Cluster | None = None) -> list[MeshPlan]:
    """What each node's two files would gain (read-only, one round trip per node)."""
    cluster = cluster or Cluster.from_params(params)
    nodes = [n for n in params.nodes if n.rails]
    results = cluster.run(lambda n: script("ssh_mesh.sh", "read", n.port or 22), nodes, timeout=30)
    seen = {n.name: parse_sections(results[n.name].stdout) for n in nodes if results[n.name].ok}
    out, m = [], mark(params)
    for node in nodes:
        p = MeshPlan(node)
        out.append(p)
        if node.name not in seen:
            p.error = f"not read: {results[node.name].summary()}"
            continue
        mine = seen[node.name]
        known = _known(mine.get("known_hosts", ""))
        keys = {tuple(li.split()[:2]) for li in mine.get("authorized_keys", "").splitlines() if len(li.split()) >= 2}
        p.keygen = not mine.get("pubkey", "").strip()
        for peer in nodes:
            if peer is node or peer.name not in seen:
                continue
            theirs = seen[peer.name]
            for line in theirs.get("hostkeys", "").splitlines():
                words = line.split()
                if len(words) >= 3:
                    hosts = [h for h in _hosts(peer) if (h, words[2]) not in known]
                    if hosts:
                        p.known.append(f"{','.join(hosts)} {words[1]} {words[2]} {m}")
            pub = theirs.get("pubkey", "").split()
            if len(pub) >= 2 and tuple(pub[:2]) not in keys:
                p.authorized.append(f"{pub[0]} {pub[1]} {m}")
            # a peer without a key pair: its own plan says keygen; apply makes it, then plans again
        if not seen[node.name].get("hostkeys", "").strip():
            p.error = f"its sshd answered no ssh-keyscan on 127.0.0.1:{node.port or 22}"
    return out


def describe(plans: list[MeshPlan]) -> str:
    out = []
    for p in plans:
        user = p.node.user or "the SSH user"
        head = f"== {p.node.name}: SSH over the fabric for {user}"
        if p.error:
            out.append(f"{head}: {p.error}")
            continue
        if not (p.known or p.authorized or p.keygen):
            out.append(f"{head}: no change")
            continue
        out.append(head)
        if p.keygen:
            out.append("+ ~/.ssh/id_ed25519 (a key pair: the user has none)")
        out += [f"+ ~/.ssh/known_hosts: {ln[:70]}…{ln[-30:]}" for ln in p.known]
        out += [f"+ ~/.ssh/authorized_keys: {ln[:50]}…{ln[-30:]}" for ln in p.authorized]
    return "\n".join(out)


def apply(params: Params, cluster: Cluster | None = None) -> list[Outcome]:
    """Make the key pairs that are missing, then add every line the plan names."""
    cluster = cluster or Cluster.from_params(params)
    plans = plan(params, cluster)
    if any(p.keygen for p in plans):
        cluster.run(script("ssh_mesh.sh", "add", mark(params), "", ""), [p.node for p in plans if p.keygen],
                    timeout=30).check("making SSH key pairs")
        plans = plan(params, cluster)
    todo = [p for p in plans if not p.error and (p.known or p.authorized)]
    results = cluster.run(lambda n: script("ssh_mesh.sh", "add", mark(params), *(
        "\n".join(getattr(p, f)) for p in todo if p.node is n for f in ("known", "authorized"))),
        [p.node for p in todo], timeout=30)
    out = []
    for p in plans:
        r = results.get(p.node.name)
        if p.error:
            out.append(Outcome(p.node.name, "refused", p.error))
        elif r is None:
            out.append(Outcome(p.node.name, "unchanged", "every other node's host key and key known already"))
        else:
            out.append(Outcome(p.node.name, "confirmed" if r.ok else "refused",
                               f"{len(p.known)} known_hosts and {len(p.authorized)} authorized_keys line(s) added"
                               if r.ok else r.summary(), r.command))
    return out


def restore(params: Params, cluster: Cluster | None = None) -> list[Outcome]:
    """Remove what :func:`apply` added, on every node with rails."""
    cluster = cluster or Cluster.from_params(params)
    nodes = [n for n in params.nodes if n.rails]
    results = cluster.run(script("ssh_mesh.sh", "remove", mark(params)), nodes, timeout=30)
    return [Outcome(n.name, "restored" if results[n.name].ok else "refused",
                    results[n.name].stdout.strip().replace("\n", "; ") or "nothing of sparkbook's",
                    results[n.name].command) for n in nodes]
