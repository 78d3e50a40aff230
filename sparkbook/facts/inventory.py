"""The facts of every node, gathered by ``scripts/inventory.sh`` in one round trip per node: read
by 00_inventory, and by preflight (01) as part of its own round trip."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar, TypedDict

from ..book.step import Outcome
from ..book.tables import Table
from ..book.verdict import FAIL, PASS, WARN, Check
from ..nodes.remote import Cluster
from ..nodes.shell import Script, script
from ..params import Params
from .parsers import parse_key_values, parse_nvidia_smi_csv, parse_sections


class NodeFacts(TypedDict, total=False):
    """One node's facts (every key is set for a node that answered). Sizes in GB (GiB)."""
    hostname: str | None
    os: str | None
    kernel: str | None
    boot_id: str | None  # new at every boot (the kernel's random/boot_id): a reboot ends what was checked
    arch: str | None
    bios: str | None
    user: str | None  # the SSH user sparkbook works as, and its numeric ids
    uid: str | None
    gid: str | None
    cpus: int | None
    memory_gb: float | None
    memory_available_gb: float | None
    model_disk_free_gb: float | None
    docker: str | None  # the version, "absent" or "daemon unreachable"
    docker_root: str | None
    docker_disk_free_gb: float | None
    docker_runtimes: list[str]
    gpu_problem: str | None  # why no GPU could be listed (nvidia-smi's own words)
    gpus: int
    gpu_name: str | None
    driver: str | None
    gpu_memory: str | None  # "unified (N GB system)" on GB10


class NodeRow(NodeFacts):
    """A row of the inventory: a node and, when it answered, its facts."""
    node: str
    role: str
    reachable: bool


COLUMNS = ["node", "role", "reachable", "hostname", "os", "kernel", "arch", "cpus", "memory_gb",
           "memory_available_gb", "model_disk_free_gb", "docker", "docker_runtimes",
           "docker_disk_free_gb", "gpus", "gpu_name", "driver", "gpu_memory"]


def node_script(params: Params) -> Script:
    """``inventory.sh MODEL_DIR DOCKER_ROOT``: sections ``facts`` and ``gpu``."""
    return script("inventory.sh", params.model.path, params.runtime.docker_root or "")


def _gb(kb: str | None) -> float | None:
    try:
        return round(int(kb) / 1024 / 1024, 1)
    except (TypeError, ValueError):
        return None


def parse(stdout: str) -> NodeFacts:
    """The facts of one node from the output of ``inventory.sh`` (other sections are ignored)."""
    sections = parse_sections(stdout)
    kv = parse_key_values(sections.get("facts", ""))
    facts: NodeFacts = {
        "hostname": kv.get("hostname"), "os": kv.get("os"), "kernel": kv.get("kernel"),
        "boot_id": kv.get("boot_id") or None,
        "arch": kv.get("arch"), "bios": kv.get("bios") or None, "user": kv.get("user"), "uid": kv.get("uid"),
        "gid": kv.get("gid"), "cpus": int(kv["cpus"]) if kv.get("cpus", "").isdigit() else None,
        "memory_gb": _gb(kv.get("mem_total_kb")), "memory_available_gb": _gb(kv.get("mem_available_kb")),
        "model_disk_free_gb": _gb(kv.get("model_disk_free_kb")),
        "docker": kv.get("docker_version"), "docker_root": kv.get("docker_root"),
        "docker_disk_free_gb": _gb(kv.get("docker_disk_free_kb")),
    }
    try:
        facts["docker_runtimes"] = sorted(json.loads(kv.get("docker_runtimes") or "{}") or {})
    except json.JSONDecodeError:
        facts["docker_runtimes"] = []
    gpu = sections.get("gpu", "")
    facts["gpu_problem"] = None
    try:
        gpus = parse_nvidia_smi_csv(gpu) if gpu and not gpu.startswith("nvidia-smi") else []
    except ValueError:
        gpus = []
        facts["gpu_problem"] = gpu.strip().splitlines()[-1][:200] if gpu.strip() else "no output"
    if gpu.startswith("nvidia-smi"):
        facts["gpu_problem"] = gpu.strip()
    facts["gpus"] = len(gpus)
    facts["gpu_name"] = ", ".join(sorted({g["name"] for g in gpus if g.get("name")})) or None
    facts["driver"] = ", ".join(sorted({g["driver_version"] for g in gpus if g.get("driver_version")})) or None
    # GB10 has no separate GPU memory (nvidia-smi says [N/A]): the unified memory is the system's
    totals = [t for g in gpus if (t := g.get("memory.total"))]
    facts["gpu_memory"] = ", ".join(totals) if totals else (
        f"unified ({facts['memory_gb']} GB system)" if gpus else None)
    return facts


@dataclass
class Inventory(Outcome):
    """The facts of every node; ``inventory.json`` holds the rows."""

    FILE: ClassVar[str] = "inventory.json"
    rows: list[NodeRow]
    errors: dict[str, str]  # node -> why it could not be reached (SSH)
    command: str  # what ran on every node, as a person runs it there

    def to_json(self) -> list[NodeRow]:  # type: ignore[override]  # the file holds a list
        return self.rows

    def boots(self) -> dict[str, str]:
        return {r["node"]: b for r in self.rows if (b := r.get("boot_id"))}


def gather(params: Params, cluster: Cluster) -> Inventory:
    """The facts of every node, in parallel."""
    cmd = node_script(params)
    results = cluster.run(cmd, timeout=min(params.ssh.command_timeout, 60))
    rows: list[NodeRow] = []
    for node in params.nodes:
        r = results[node.name]
        row: NodeRow = {"node": node.name, "role": node.role, "reachable": r.error is None}
        if r.error is None:
            row.update(parse(r.stdout))
        rows.append(row)
    errors = {name: r.error for name, r in results.items() if r.error}
    return Inventory(rows, errors, str(cmd))


def checks(params: Params, inv: Inventory) -> list[Check]:
    """Every node answers; GPUs as expected and versions alike are warnings here (preflight
    checks them properly)."""
    out = []
    for node, row in zip(params.nodes, inv.rows):
        error = inv.errors.get(node.name)
        if error:
            out.append(Check("reachable", node.name, FAIL, error, "an SSH session",
                             "fix the node's host/user/key in the parameters or its sshd; see the message",
                             inv.command))
            continue
        out.append(Check("reachable", node.name, PASS, f"{row['hostname']} ({row['arch']}, {row['os']})"))
        want = params.gpus_of(node)
        if want:
            got, name = row["gpus"], row["gpu_name"]
            expected = f"{want} x {params.expectations.gpu_name or 'GPU'}"
            ok = got == want and (not params.expectations.gpu_name or name == params.expectations.gpu_name)
            out.append(Check("gpu", node.name, PASS if ok else WARN,
                             f"{got} x {name}" if got else (row["gpu_problem"] or "no GPU"), expected,
                             "" if ok else "preflight checks the GPU in detail; see 01_preflight.ipynb"))
    up = [row for row in inv.rows if row["reachable"]]
    for fact in ("arch", "os", "kernel", "driver", "docker"):
        if len({row.get(fact) for row in up}) > 1:
            out.append(Check(f"same {fact}", "all", WARN, " / ".join(f"{row['node']}: {row.get(fact)}" for row in up),
                             "the same on every node", f"align the {fact} across nodes"))
    return out


def table(rows: list[NodeRow]) -> Table:
    return Table(COLUMNS, [[", ".join(v) if isinstance(v := r.get(c), list) else v for c in COLUMNS]
                           for r in rows], title="Nodes")
