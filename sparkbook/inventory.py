"""00_inventory: the facts of every node, gathered in one round trip per node."""

from __future__ import annotations

import json
from typing import Any

from .params import Params
from .parsers import parse_key_values, parse_nvidia_smi_csv, parse_sections
from .remote import Cluster, Result, sh
from .tables import Table
from .verdict import FAIL, PASS, WARN, Check, Verdict

GPU_FIELDS = ["name", "driver_version", "memory.total"]

# Free space of the filesystem that holds PATH, or of its nearest existing parent (the model
# directory may not exist yet).
_DF = 'p={path}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -Pk "$p" | awk \'NR==2 {{print $4}}\''


def script(params: Params) -> str:
    """One bash script printing every fact as sections; every value from the parameters is quoted."""
    docker_root = params.runtime.docker_root
    return "\n".join([
        "export LC_ALL=C",
        "echo '@@ facts'",
        'echo "hostname=$(hostname)"',
        '( . /etc/os-release 2>/dev/null; echo "os=${PRETTY_NAME:-unknown}" )',
        'echo "kernel=$(uname -r)"',
        'echo "arch=$(uname -m)"',
        'echo "cpus=$(nproc)"',
        "awk '/^MemTotal:/ {print \"mem_total_kb=\"$2} /^MemAvailable:/ {print \"mem_available_kb=\"$2}' /proc/meminfo",
        'echo "model_disk_free_kb=$(' + sh(_DF, path=params.model.path) + ')"',
        "if command -v docker >/dev/null 2>&1; then",
        # one call: version, data root and runtimes ('|' does not occur in them)
        "  info=$(docker info --format '{{.ServerVersion}}|{{.DockerRootDir}}|{{json .Runtimes}}' 2>/dev/null)",
        '  v=${info%%|*}; echo "docker_version=${v:-daemon unreachable}"',
        '  rest=${info#*|}; root=${rest%%|*}; [ -n "$info" ] || root=""',
        *(["  root=" + sh("{r}", r=docker_root)] if docker_root else []),
        '  [ -n "$root" ] && echo "docker_root=$root" && echo "docker_disk_free_kb=$(' + _DF.format(path='"$root"') + ')"',
        '  [ -n "$info" ] && echo "docker_runtimes=${rest#*|}"',
        "else echo docker_version=absent; fi",
        "echo '@@ gpu'",
        "if command -v nvidia-smi >/dev/null 2>&1; then",
        "  err=$(mktemp)",
        f"  nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader 2>\"$err\" ||"
        ' echo "nvidia-smi failed: $(tail -n 1 "$err")"; rm -f "$err"',
        "else echo 'nvidia-smi absent'; fi",
    ])


def _gb(kb: str | None) -> float | None:
    try:
        return round(int(kb) / 1024 / 1024, 1)
    except (TypeError, ValueError):
        return None


def parse(stdout: str) -> dict[str, Any]:
    """The facts of one node from the script's output."""
    sections = parse_sections(stdout)
    kv = parse_key_values(sections.get("facts", ""))
    facts: dict[str, Any] = {
        "hostname": kv.get("hostname"), "os": kv.get("os"), "kernel": kv.get("kernel"),
        "arch": kv.get("arch"), "cpus": int(kv["cpus"]) if kv.get("cpus", "").isdigit() else None,
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
        gpus = parse_nvidia_smi_csv(gpu, GPU_FIELDS) if gpu and not gpu.startswith("nvidia-smi") else []
    except ValueError:
        gpus = []
        facts["gpu_problem"] = gpu.strip().splitlines()[-1][:200] if gpu.strip() else "no output"
    if gpu.startswith("nvidia-smi"):
        facts["gpu_problem"] = gpu.strip()
    facts["gpus"] = len(gpus)
    facts["gpu_name"] = ", ".join(sorted({g["name"] for g in gpus if g["name"]})) or None
    facts["driver"] = ", ".join(sorted({g["driver_version"] for g in gpus if g["driver_version"]})) or None
    # GB10 has no separate GPU memory (nvidia-smi says [N/A]): the unified memory is the system's
    totals = [g["memory.total"] for g in gpus if g["memory.total"]]
    facts["gpu_memory"] = ", ".join(totals) if totals else (
        f"unified ({facts['memory_gb']} GB system)" if gpus else None)
    return facts


def gather(params: Params, cluster: Cluster | None = None) -> tuple[list[dict[str, Any]], dict[str, Result]]:
    """Facts of every node (in parallel), and the raw results."""
    cluster = cluster or Cluster.from_params(params)
    results = cluster.run(script(params), timeout=min(params.ssh.command_timeout, 60))
    rows = []
    for node in params.nodes:
        r = results[node.name]
        row: dict[str, Any] = {"node": node.name, "role": node.role, "reachable": r.error is None}
        if r.error is None:
            row.update(parse(r.stdout))
        rows.append(row)
    return rows, results


def verdict(params: Params, rows: list[dict[str, Any]], results: dict[str, Result]) -> Verdict:
    v = Verdict("00 inventory")
    for node, row in zip(params.nodes, rows):
        r = results[node.name]
        if r.error:
            v.add(Check("reachable", node.name, FAIL, r.error, "an SSH session",
                        "fix the node's host/user/key in the parameters or its sshd; see the message",
                        r.command.splitlines()[0] + " ..."))
            continue
        v.add(Check("reachable", node.name, PASS, f"{row['hostname']} ({row['arch']}, {row['os']})"))
        want = params.gpus_of(node)
        if want:
            got, name = row["gpus"], row["gpu_name"]
            expected = f"{want} x {params.expectations.gpu_name or 'GPU'}"
            ok = got == want and (not params.expectations.gpu_name or name == params.expectations.gpu_name)
            v.add(Check("gpu", node.name, PASS if ok else WARN,
                        f"{got} x {name}" if got else (row["gpu_problem"] or "no GPU"), expected,
                        "" if ok else "preflight checks the GPU in detail; see 01_preflight"))
    for fact in ("arch", "os", "kernel", "driver", "docker"):
        seen = {row.get(fact) for row in rows if row["reachable"]}
        if len(seen) > 1:
            v.add(Check(f"same {fact}", "all", WARN, " / ".join(
                f"{row['node']}: {row.get(fact)}" for row in rows if row["reachable"]),
                "the same on every node", f"align the {fact} across nodes"))
    return v


def table(rows: list[dict[str, Any]]) -> Table:
    return Table(COLUMNS, [[", ".join(v) if isinstance(v := r.get(c), list) else v for c in COLUMNS]
                           for r in rows], title="Nodes")


COLUMNS = ["node", "role", "reachable", "hostname", "os", "kernel", "arch", "cpus", "memory_gb",
           "memory_available_gb", "model_disk_free_gb", "docker", "docker_runtimes",
           "docker_disk_free_gb", "gpus", "gpu_name", "driver", "gpu_memory"]
