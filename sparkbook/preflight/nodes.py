"""Preflight checks of each node itself: sameness across nodes, the GPU and its memory, what still
runs from an earlier deployment, the container runtime, the clock, the head's ports and disk."""

from __future__ import annotations

from typing import Iterator

from ..params import Params
from ..parsers import listener
from ..serving.commands import container_name
from ..verdict import FAIL, PASS, SKIP, WARN, Check, run_step
from .collect import Preflight

SKEW_WARN_S, SKEW_FAIL_S = 0.5, 2.0


def sameness(params: Params, pf: Preflight) -> Iterator[Check]:
    """OS, arch and kernel alike on every node (mismatches break NCCL and CUDA); the driver and the
    firmware, with their ranges, are host.versions'."""
    for fact in ("os", "arch", "kernel"):
        seen = {n.name: pf.nodes[n.name]["facts"].get(fact) for n in pf.up(params)}
        ok = len(set(seen.values())) <= 1
        yield Check(f"same {fact}", "all", PASS if ok else WARN,
                    " / ".join(f"{k}: {val}" for k, val in seen.items()), "the same on every node",
                    "" if ok else f"align the {fact} across nodes (mismatches break NCCL and CUDA)")


def gpus(params: Params, pf: Preflight) -> Iterator[Check]:
    """Per node: the GPUs, the memory for the model and nothing left holding GPU memory."""
    e = params.expectations
    for node in pf.up(params):
        d = pf.nodes[node.name]
        f, smi = d["facts"], d["smi"]
        want = params.gpus_of(node)
        if not want:
            yield Check("gpu", node.name, SKIP, "no GPU expected on this node")
        elif smi is None or not smi["gpus"]:
            yield Check("gpu", node.name, FAIL, f.get("gpu_problem") or "nvidia-smi shows no GPU",
                        f"{want} x {e.gpu_name or 'GPU'}", "install or fix the NVIDIA driver; reboot",
                        "nvidia-smi")
        else:
            names = [g["name"] for g in smi["gpus"]]
            ok = len(names) == want and (not e.gpu_name or all(n == e.gpu_name for n in names))
            yield Check("gpu", node.name, PASS if ok else FAIL, f"{len(names)} x {', '.join(sorted(set(names)))}",
                        f"{want} x {e.gpu_name or 'GPU'}", "" if ok else "check expectations.gpu_name "
                        "and gpus_per_node, or the node's GPUs", "nvidia-smi")
            unified = all(g["memory"] is None for g in smi["gpus"])
            avail = f.get("memory_available_gb")
            seen = (f"unified memory: {avail} GB available of {f.get('memory_gb')} GB (/proc/meminfo; "
                    "nvidia-smi reports GPU memory as not supported on GB10)") if avail else \
                "unified memory: available memory not reported (MemAvailable in /proc/meminfo)"
            yield Check("memory", node.name, PASS if avail else WARN,
                        seen if unified else ", ".join(str(g["memory"]) for g in smi["gpus"]),
                        "memory free for the model", "" if avail else "check /proc/meminfo on the node")
        holders = [f"{p['pid']} {p['name']} {p['memory_mib']}MiB" for p in (smi or {}).get("processes", [])
                   if p["type"] == "C"]
        running = [c for c in d["containers"] if len(c) >= 2 and (
            c[0] in (container_name(params, False), container_name(params, True)) or c[1] == params.runtime.image)]
        found = holders + [f"container {c[0]} ({c[1]})" for c in running] + d["processes"][:3]
        yield Check("stale processes", node.name, FAIL if found else PASS,
                    "; ".join(found)[:300] if found else "no vLLM, Ray or serving container running",
                    "nothing holding GPU memory",
                    "stop them first: " + run_step("08_teardown") + ", or `docker rm -f` the container and "
                    "kill the processes"
                    if found else "", "nvidia-smi; ps; docker ps")


def runtime(params: Params, pf: Preflight) -> Iterator[Check]:
    """Docker with the NVIDIA runtime, or vLLM in the venv."""
    for node in pf.up(params):
        d = pf.nodes[node.name]
        f = d["facts"]
        if params.runtime.kind == "docker":
            ok = f.get("docker") not in (None, "", "absent", "daemon unreachable")
            yield Check("docker", node.name, PASS if ok else FAIL, f"Docker {f.get('docker') or 'not reported'}",
                        "a running Docker daemon", "" if ok else "start Docker (`sudo systemctl start "
                        "docker`) and let the user run it (docker group)", "docker version")
            if not params.runtime.gpus:
                yield Check("nvidia runtime", node.name, SKIP, "containers get no GPUs (runtime.gpus: false)")
            else:
                has = "nvidia" in f.get("docker_runtimes", [])
                yield Check("nvidia runtime", node.name, PASS if has else FAIL,
                            ", ".join(f.get("docker_runtimes") or []) or "none", "nvidia registered",
                            "" if has else "install nvidia-container-toolkit and run "
                            "`sudo nvidia-ctk runtime configure --runtime=docker`", "docker info")
        else:
            venv = d["venv"]
            ok = bool(venv) and venv[:1].isdigit()
            yield Check("venv", node.name, PASS if ok else FAIL, f"vllm {venv}",
                        f"vllm importable in {params.runtime.venv}", "" if ok else "create the venv with "
                        "vllm on this node")


def clocks(params: Params, pf: Preflight) -> Iterator[Check]:
    for node in pf.up(params):
        skew = pf.nodes[node.name]["skew_s"]
        if skew is None:
            continue
        status = FAIL if abs(skew) > SKEW_FAIL_S else WARN if abs(skew) > SKEW_WARN_S else PASS
        yield Check("clock", node.name, status, f"{skew:+.3f} s against this machine",
                    f"within ±{SKEW_WARN_S} s", "" if status == PASS else "enable NTP on every node "
                    "(`timedatectl set-ntp true`)", "date +%s.%N")


def ports(params: Params, pf: Preflight) -> Iterator[Check]:
    """No listener yet on the head's API, Ray, dashboard and master ports."""
    head = params.head
    if head.name not in pf.nodes:
        return
    wanted = params.ports.model_dump()
    busy = [f"{name} {port}: {seen}" for name, port in wanted.items()
            if (seen := listener(pf.nodes[head.name]["listeners"], port))]
    yield Check("ports free", head.name, FAIL if busy else PASS, "; ".join(busy) or
                ", ".join(f"{k} {p}" for k, p in wanted.items()) + " free",
                "no listener on the API, Ray, dashboard and master ports",
                "stop what listens there (08_teardown.ipynb, or the process shown), or change `ports` "
                "in the parameters" if busy else "", "ss -ltnp")


def disks(params: Params, pf: Preflight) -> Iterator[Check]:
    need = max(params.expectations.min_disk_gb, 0)
    for node in pf.up(params):
        f = pf.nodes[node.name]["facts"]
        for what, free in (("model disk", f.get("model_disk_free_gb")), ("docker disk", f.get("docker_disk_free_gb"))):
            if free is None:
                continue
            ok = free >= need
            yield Check(what, node.name, PASS if ok else FAIL, f"{free} GB free", f"≥ {need} GB",
                        "" if ok else "free space, or point the model path / Docker root elsewhere")
