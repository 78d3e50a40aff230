"""Day one, before 00 (notebooks/day_one.ipynb; `sparkbook discover` and `sparkbook fabric` over
the same functions): the nodes read and the parameters file written from them
(:mod:`sparkbook.setup.discover`, :mod:`sparkbook.setup.draft`), then the fabric planned and, when
asked, applied under each node's guard, with SSH between the nodes over the rails
(:mod:`sparkbook.setup.fabric`, :mod:`sparkbook.setup.mesh`)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..book.errors import CheckFailed, SparkbookError
from ..book.verdict import Verdict
from ..notebook import conclude, open_cluster  # noqa: F401  (conclude: the notebook's and the CLI's)
from ..params import load
from ..setup import discover as nodes
from ..setup import draft, fabric, mesh

TITLE = "day one"
# 01's rows about the fabric: what `sparkbook fabric doctor` shows
DOCTOR = ("fabric layout", "rail map", "rail port", "rail rate", "rail mtu", "rail address", "rail gid", "path mtu",
          "rail dhcp", "rail persisted")


def discover(hosts: Iterable[str], output: str | Path, *, template: str | Path | None = None,
             name: str = "discovered", user: str | None = None, port: int | None = None, key: str | None = None,
             known_hosts: Iterable[str] = (), force: bool = False, connect_timeout: float = 10,
             say=print) -> Path:
    """Ask every node what it is and write the parameters file (the other sections from
    ``template``); returns its path. Nothing is written unless every node answers."""
    hosts = list(hosts)
    template = Path(template) if template else draft.default_template(len(hosts))
    if not template.is_file():
        raise SparkbookError(f"no template {template}: name a parameters file with --template")
    output = Path(output)
    draft.writable(output, force)
    cluster = nodes.connect(hosts, user=user, port=port, key=key, known_hosts=list(known_hosts),
                            connect_timeout=connect_timeout)
    found = nodes.discover(cluster)
    say(nodes.nodes_table(found).to_text())
    failed = [f for f in found if f.error]
    if failed:
        raise CheckFailed("\n".join([f"FAIL {f.host}: {f.error}" for f in failed] +
                                    ["nothing was written: every node must answer"]))
    say(nodes.table(found).to_text())
    d = draft.draft(found, template.read_text(), name=name, user=user, port=port, key=key,
                    known_hosts=list(known_hosts) or None)
    path = draft.write(d, output, force=force)
    say(f"layout: {d.layout}")
    for note in d.notes:
        say(f"NOTE {note}")
    say(f"parameters: {path} (validated; the sections besides the nodes from {template})")
    return path


def fabric_step(params_file: str | Path, command: str = "plan", deadline_s: int = fabric.DEADLINE_S,
                say=print) -> Verdict:
    """``plan`` (nothing written: the verdict is whether it can be applied), ``apply``, ``restore``,
    or ``doctor`` (01's fabric rows: who persists each rail, DHCP, MTU, the RoCE GID by type, the
    path MTU to every peer); the verdict's rows, one per node and part."""
    params = load(params_file)
    cluster = open_cluster(params)
    if command == "doctor":
        from .. import preflight
        rows = [c for c in preflight.checks(params, preflight.gather(params, cluster)) if c.check in DOCTOR]
        return Verdict("fabric doctor", rows)
    if command == "restore":
        rows = fabric.checks(mesh.restore(params, cluster), "ssh mesh restore") + \
            fabric.checks(fabric.restore(params, cluster), "fabric restore")
        return Verdict(f"fabric {command}", rows)
    plans, peers = fabric.plan(params, cluster), mesh.plan(params, cluster)
    say(fabric.describe(plans) + "\n" + mesh.describe(peers))
    if command == "plan":
        return Verdict("fabric plan", fabric.plan_checks(plans, peers))
    rows = fabric.checks(fabric.apply(params, plans, deadline_s=deadline_s, cluster=cluster, say=say), "fabric apply")
    if all(c.status == "PASS" for c in rows):
        rows += fabric.checks(mesh.apply(params, cluster), "ssh mesh")
    return Verdict(f"fabric {command}", rows)
