"""Preflight checks of each node itself: sameness across nodes, the GPU and its memory, what still
runs from an earlier deployment, the container runtime, the clock, the head's ports and disk."""

from __future__ import annotations

from typing import Iterator

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check, run_step
from ..facts.parsers import listener
from ..params import Params
from ..serving.plan import plan
from .collect import CLOCK_READS, Preflight

SKEW_WARN_S, SKEW_FAIL_S = 0.5, 2.0


def _user(f: dict) -> str | None:
    return f"{f['user']} ({f.get('uid')}:{f.get('gid')})" if f.get("user") else None


# fact -> how to read it, and the remedy where nodes differ (01's parity table shows them together)
SAME = {
    "os": (lambda d: d["facts"].get("os"), "align the OS release across nodes (mismatches break NCCL and CUDA)"),
    "arch": (lambda d: d["facts"].get("arch"), "use nodes of one architecture: one image serves them all"),
    "kernel": (lambda d: d["facts"].get("kernel"), "align the kernel across nodes (the DGX OS updates), then reboot"),
    "bios": (lambda d: d["facts"].get("bios"), "update every node's firmware to the same release (DGX OS updates, "
             "`sudo fwupdmgr update`), then reboot"),
    "docker": (lambda d: d["facts"].get("docker"), "install the same Docker release on every node"),
    "cuda": (lambda d: (d.get("smi") or {}).get("cuda"), "install the same NVIDIA driver (it sets the CUDA version) "
             "on every node, then reboot"),
    "user": (lambda d: _user(d["facts"]), "log in as the same user, with the same UID and GID, on every node "
             "(`id` on each): files one node copies to another keep their numeric owner"),
}


def sameness(params: Params, pf: Preflight) -> Iterator[Check]:
    """OS, arch, kernel, BIOS, Docker, the driver's CUDA and the SSH user (name, UID, GID) alike on
    every node that shows them (01's parity table shows them all side by side); the driver and the
    firmware, with their ranges, are host.versions'."""
    for fact, (read, remedy) in SAME.items():
        seen = {n.name: read(pf.nodes[n.name]) for n in pf.up(params)}
        ok = len({v for v in seen.values() if v}) <= 1
        yield Check(f"same {fact}", "all", PASS if ok else WARN,
                    " / ".join(f"{k}: {val or 'not shown'}" for k, val in seen.items()), "the same on every node",
                    "" if ok else remedy)


def gpus(params: Params, pf: Preflight) -> Iterator[Check]:
    """Per node: the GPUs, the memory for the model and nothing left holding GPU memory."""
    e, planned = params.expectations, plan(params)
    ours = (planned.serve_container, planned.ray_container)
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
                        "the memory reported (whether the model fits it: the memory fit row)",
                        "" if avail else "check /proc/meminfo on the node")
        holders = [f"{p['pid']} {p['name']} {p['memory_mib']}MiB" for p in (smi or {}).get("processes", [])
                   if p["type"] == "C"]
        running = [c for c in d["containers"] if len(c) >= 2 and (
            c[0] in ours or c[1] == params.runtime.image)]
        found = holders + [f"container {c[0]} ({c[1]})" for c in running] + d["processes"][:3]
        yield Check("stale processes", node.name, FAIL if found else PASS,
                    "; ".join(found)[:300] if found else "no vLLM, Ray or serving container running",
                    "nothing holding GPU memory",
                    "stop them first: " + run_step("08_teardown") + ", or `docker rm -f` the container and "
                    "kill the processes"
                    if found else "", "nvidia-smi; ps; docker ps")


def runtime(params: Params, pf: Preflight) -> Iterator[Check]:
    """Docker with the NVIDIA runtime."""
    for node in pf.up(params):
        f = pf.nodes[node.name]["facts"]
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


def clocks(params: Params, pf: Preflight) -> Iterator[Check]:
    for node in pf.up(params):
        skew, error = pf.nodes[node.name]["skew_s"], pf.nodes[node.name].get("skew_error_s") or 0.0
        if skew is None:
            continue
        # judged by what the round trip proves: FAIL only when even the nearest clock the
        # uncertainty allows is off by more than the limit; too uncertain to tell is a WARN
        nearest = max(abs(skew) - error, 0.0)
        status = FAIL if nearest > SKEW_FAIL_S else WARN if abs(skew) > SKEW_WARN_S else PASS
        observed = (f"{skew:+.3f} s ± {error:.3f} against this machine (the shortest of "
                    f"{CLOCK_READS} round trips)")
        if status == WARN and (nearest <= SKEW_WARN_S or abs(skew) > SKEW_FAIL_S):
            observed += ": the round trips were too slow to judge it (a busy machine?)"
        yield Check("clock", node.name, status, observed, f"within ±{SKEW_WARN_S} s",
                    "" if status == PASS else "enable NTP on every node (`timedatectl set-ntp true`)",
                    "date +%s.%N")


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
