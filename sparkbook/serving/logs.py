"""Node logs and the failures they name: every node's container logs collected into the run
folder (``logs/<node>/``) before anything is removed, and one table of known failure signatures in
vLLM, NCCL and Ray logs (sparkbook.facts.signatures), matched to name a cause and its remedy (05, and
08 keeps the logs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..book.redact import mask
from ..facts import signatures
from ..facts.logread import file_lines
from ..facts.parsers import parse_sections
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..nodes.workdir import serve_log
from ..params import Params
from .plan import plan


@dataclass
class Diagnosis:
    """The likely cause of a failure on one node, from its logs."""
    node: str
    cause: str
    evidence: str
    remedy: str
    logs: str  # the folder of the node's logs


def collect_logs(params: Params, cluster: Cluster, run_dir: Path, containers: list[str] | None = None,
                 tag: str = "") -> dict[str, Path]:
    """Every node's sparkbook container logs, vllm serve's log, `ray status` and process list into
    ``run_dir/logs/<node>/`` (before anything is removed); ``tag`` prefixes the files' names."""
    p = plan(params)
    names = containers or [p.ray_container, p.serve_container]
    out = {}
    for node, r in cluster.run(lambda n: script("collect_logs.sh", params.name, p.ray_container,
                                                       serve_log(params, n), *names),
                               timeout=60).items():
        folder = run_dir / "logs" / node
        folder.mkdir(parents=True, exist_ok=True)
        sections = parse_sections(r.stdout) if r.ok else {"error": r.summary()}
        for key, text in sections.items():
            # a container's log is kept even when empty (it said nothing); absent ones are skipped
            if "No such container" in text[:200] or not (text.strip() or key.startswith("docker logs")):
                continue
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", key.replace("docker logs ", ""))
            fname = stem if stem.endswith(".log") else stem + ".log"
            (folder / (f"{tag}-{fname}" if tag else fname)).write_text(mask(text))
        out[node] = folder
    return out


def diagnose(params: Params, cluster: Cluster, run_dir: Path) -> list[Diagnosis]:
    """Collect every node's logs, then name the likely cause per node from known signatures: each
    log file is read on its own (a warning is void only if the same log goes on), and the most
    specific signature found in any of them is the node's cause."""
    found = []
    for node, folder in collect_logs(params, cluster, run_dir).items():
        hit = signatures.most_specific({p.name: file_lines(p) for p in sorted(folder.glob("*.log"))  # read as it goes
                                        if not p.name.startswith("previous-") and p.name != "processes.log"})
        if hit:
            found.append(Diagnosis(node, hit.cause, f"{hit.evidence} ({hit.where})", hit.remedy,
                                   str(folder)))
    return found
