"""01_preflight and `sparkbook preflight`: every known multi-node failure, checked before launch.

One script per node gathers everything in one SSH round trip (all nodes at once); the checks then
compare what each node reported with the parameters and with the other nodes. Each check is a row:
check, node, status, observed, expected, remedy.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from . import inventory
from .manifest import diff_manifests, manifest_script, parse_manifest
from .params import Node, Params
from .parsers import (listener, parse_ethtool, parse_ibdev2netdev, parse_ibstat, parse_ibv_devinfo,
                      parse_nvidia_smi_table, parse_sections)
from .remote import Cluster, Result, command_line, peer_ssh, sh
from .tables import short_id
from .verdict import FAIL, PASS, SKIP, WARN, Check, Verdict

SKEW_WARN_S, SKEW_FAIL_S = 0.5, 2.0
# Processes that hold GPU memory when left over from an earlier run.
STALE = r"vllm|VLLM::|raylet|gcs_server|ray::|torchrun"


def script(params: Params, node: Node) -> str:
    """Everything preflight needs from one node; every value from the parameters is quoted."""
    mtu = params.expectations.mtu
    peers = [n for n in params.nodes if n.name != node.name]
    lines = [inventory.script(params), "export LC_ALL=C"]
    lines += ["echo '@@ smi'", "nvidia-smi 2>/dev/null || echo 'nvidia-smi unavailable'"]
    lines += ["echo '@@ ibdev2netdev'", "ibdev2netdev 2>/dev/null || echo 'ibdev2netdev unavailable'",
              # port states: ibstat (infiniband-diags), else ibv_devinfo (rdma-core)
              "if command -v ibstat >/dev/null; then echo '@@ ibstat'; ibstat 2>/dev/null; "
              "else echo '@@ ibv_devinfo'; ibv_devinfo 2>/dev/null || echo 'ibv_devinfo unavailable'; fi"]
    for rail in node.rails:
        lines += [sh("echo '@@ ethtool '{i}", i=rail.interface), sh("ethtool {i} 2>/dev/null", i=rail.interface)]
    lines += ["echo '@@ links'", "ip -j addr show 2>/dev/null || echo '[]'"]
    # Path MTU: a don't-fragment ping of MTU-28 bytes on each rail to every peer's same rail.
    lines.append("echo '@@ ping'")
    for r, rail in enumerate(node.rails):
        for peer in peers:
            if r < len(peer.rails):
                # until the first reply, up to 3 s: one lost packet (a first ARP on a busy node) is no verdict
                lines.append(sh("( ping -c 1 -i 0.2 -w 3 -M do -s {s} -I {i} {ip} >/dev/null 2>&1; echo {i} {ip} $? ) &",
                                s=mtu - 28, i=rail.interface, ip=peer.rails[r].ip))
    lines.append("wait")
    lines += ["echo '@@ listeners'", "ss -ltnpH 2>/dev/null || ss -ltnH"]
    lines += ["echo '@@ processes'", sh("ps -eo pid=,args= | grep -E {p} | grep -v grep || true", p=STALE)]
    if params.runtime.kind == "docker":
        lines += ["echo '@@ containers'",
                  "docker ps --format '{{.Names}}\\t{{.Image}}\\t{{.Status}}' 2>/dev/null || true",
                  "echo '@@ image'",
                  sh("docker image inspect --format '{{{{.Id}}}}' {img} 2>/dev/null || echo absent",
                     img=params.runtime.image)]
    else:
        lines += ["echo '@@ venv'", sh("{py} -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -n 1",
                                       py=f"{params.runtime.venv}/bin/python")]
    lines += ["echo '@@ model'", manifest_script(params.model.path, params.model.verify == "all").program()]
    if node.role == "head":
        lines.append("echo '@@ peers-ssh'")
        for peer in peers:
            lines.append(f"( {command_line(peer_ssh(peer))} true >/dev/null 2>&1; "
                         + sh("echo {n} {t} $? ) &", n=peer.name, t=peer.peer_target))
        lines.append("wait")
    return "\n".join(lines)


def collect(params: Params, cluster: Cluster | None = None) -> tuple[dict[str, dict], dict[str, Result]]:
    """Run the scripts on all nodes at once; returns the parsed data and raw results by node."""
    cluster = cluster or Cluster.from_params(params)
    results = cluster.run(lambda n: script(params, n), timeout=min(params.ssh.command_timeout, 60))
    data = {n.name: parse(results[n.name].stdout) for n in params.nodes if results[n.name].error is None}
    # Clock skew: once the connections are open, a bare `date` costs one short round trip; the
    # node read its clock at about the middle of it.
    sent = time.time()
    clocks = cluster.run("date +%s.%N", list(data), timeout=10)
    for name, r in clocks.items():
        try:
            data[name]["skew_s"] = float(r.stdout) - (sent + r.duration / 2)
        except ValueError:
            data[name]["skew_s"] = None
    return data, results


def parse(stdout: str) -> dict[str, Any]:
    s = parse_sections(stdout)
    out: dict[str, Any] = {"facts": inventory.parse(stdout)}
    smi = s.get("smi", "")
    out["smi"] = None if smi.endswith("unavailable") else parse_nvidia_smi_table(smi)
    for tool, parser in (("ibdev2netdev", parse_ibdev2netdev), ("ibstat", parse_ibstat),
                         ("ibv_devinfo", parse_ibv_devinfo)):
        text = s.get(tool)
        out[tool] = None if text is None or text.endswith("unavailable") else parser(text)
    out["ethtool"] = {}
    for key, text in s.items():
        if key.startswith("ethtool "):
            out["ethtool"].update({k or key.split()[1]: v for k, v in parse_ethtool(text).items()})
    try:
        out["links"] = {li["ifname"]: li for li in json.loads(s.get("links") or "[]")}
    except json.JSONDecodeError:
        out["links"] = {}
    out["ping"] = [{"interface": p[0], "peer": p[1], "ok": p[2] == "0"}
                   for p in (ln.split() for ln in s.get("ping", "").splitlines()) if len(p) == 3]
    out["listeners"] = s.get("listeners", "").splitlines()
    out["processes"] = [ln.strip() for ln in s.get("processes", "").splitlines() if ln.strip()]
    out["containers"] = [ln.split("\t") for ln in s.get("containers", "").splitlines() if ln.strip()]
    img = s.get("image", "").strip()
    out["image"] = None if img in ("", "absent") else img
    out["venv"] = s.get("venv")
    out["model"] = parse_manifest(s.get("model", "absent"))
    out["peers_ssh"] = {p[0]: (p[1], p[2] == "0") for p in (ln.split() for ln in s.get("peers-ssh", "").splitlines())
                        if len(p) == 3}
    return out


def checks(params: Params, data: dict[str, dict], results: dict[str, Result]) -> Verdict:
    """All checks, from the collected data."""
    v = Verdict("01 preflight")
    e = params.expectations
    up = [n for n in params.nodes if n.name in data]
    head = params.head
    # --- SSH
    for node in params.nodes:
        r = results[node.name]
        if r.error:
            v.add(Check("ssh", node.name, FAIL, r.error, "an SSH session (BatchMode, host key known)",
                        "bring the node up, or fix its host/user/key/known_hosts; every other check "
                        "of this node is skipped", "ssh ..."))
        else:
            v.add(Check("ssh", node.name, PASS, "answers", "an SSH session"))
    if head.name in data:
        for peer, (target, ok) in data[head.name]["peers_ssh"].items():
            v.add(Check("ssh head→worker", peer, PASS if ok else FAIL,
                        f"{head.name} → {target}: {'answers' if ok else 'refused or unreachable'}",
                        "key-based SSH from the head, host key known",
                        "" if ok else f"on {head.name}: ssh-copy-id {target}, then ssh {target} once "
                        "to check and accept its host key",
                        f"ssh -o BatchMode=yes -o ConnectTimeout=5 {target} true"))
    # --- node basics, same across nodes
    for fact in ("os", "arch", "kernel", "driver"):
        seen = {n.name: data[n.name]["facts"].get(fact) for n in up}
        ok = len(set(seen.values())) <= 1
        v.add(Check(f"same {fact}", "all", PASS if ok else WARN,
                    " / ".join(f"{k}: {val}" for k, val in seen.items()), "the same on every node",
                    "" if ok else f"align the {fact} across nodes (mismatches break NCCL and CUDA)"))
    # --- GPU, memory, stale processes
    for node in up:
        d, f = data[node.name], data[node.name]["facts"]
        want = params.gpus_of(node)
        if not want:
            v.add(Check("gpu", node.name, SKIP, "no GPU expected on this node"))
        elif d["smi"] is None or not d["smi"]["gpus"]:
            v.add(Check("gpu", node.name, FAIL, f.get("gpu_problem") or "nvidia-smi shows no GPU",
                        f"{want} x {e.gpu_name or 'GPU'}", "install or fix the NVIDIA driver; reboot",
                        "nvidia-smi"))
        else:
            names = [g["name"] for g in d["smi"]["gpus"]]
            ok = len(names) == want and (not e.gpu_name or all(n == e.gpu_name for n in names))
            v.add(Check("gpu", node.name, PASS if ok else FAIL, f"{len(names)} x {', '.join(sorted(set(names)))}",
                        f"{want} x {e.gpu_name or 'GPU'}", "" if ok else "check expectations.gpu_name "
                        "and gpus_per_node, or the node's GPUs", "nvidia-smi"))
            unified = all(g["memory"] is None for g in d["smi"]["gpus"])
            avail = f.get("memory_available_gb")
            v.add(Check("memory", node.name, PASS if avail else WARN,
                        (f"unified memory: {avail} GB available of {f.get('memory_gb')} GB (/proc/meminfo; "
                         "nvidia-smi reports GPU memory as not supported on GB10)") if unified else
                        ", ".join(str(g["memory"]) for g in d["smi"]["gpus"]), "memory free for the model"))
        stale = d["processes"]
        holders = [f"{p['pid']} {p['name']} {p['memory_mib']}MiB" for p in (d["smi"] or {}).get("processes", [])
                   if p["type"] == "C"]
        running = [c for c in d.get("containers", []) if len(c) >= 2 and (
            c[0] == params.runtime.container_name or c[1] == params.runtime.image)]
        found = holders + [f"container {c[0]} ({c[1]})" for c in running] + stale[:3]
        v.add(Check("stale processes", node.name, FAIL if found else PASS,
                    "; ".join(found)[:300] if found else "no vLLM, Ray or serving container running",
                    "nothing holding GPU memory",
                    "stop them first: 08_teardown, or `docker rm -f` the container and kill the processes"
                    if found else "", "nvidia-smi; ps; docker ps"))
    # --- container runtime
    for node in up:
        d, f = data[node.name], data[node.name]["facts"]
        if params.runtime.kind == "docker":
            ok = f.get("docker") not in (None, "", "absent", "daemon unreachable")
            v.add(Check("docker", node.name, PASS if ok else FAIL, f"Docker {f.get('docker')}",
                        "a running Docker daemon", "" if ok else "start Docker (`sudo systemctl start "
                        "docker`) and let the user run it (docker group)", "docker version"))
            if not params.runtime.gpus:
                v.add(Check("nvidia runtime", node.name, SKIP, "containers get no GPUs (runtime.gpus: false)"))
            else:
                has = "nvidia" in f.get("docker_runtimes", [])
                v.add(Check("nvidia runtime", node.name, PASS if has else FAIL,
                            ", ".join(f.get("docker_runtimes") or []) or "none", "nvidia registered",
                            "" if has else "install nvidia-container-toolkit and run "
                            "`sudo nvidia-ctk runtime configure --runtime=docker`", "docker info"))
        else:
            ok = d.get("venv") and d["venv"][:1].isdigit()
            v.add(Check("venv", node.name, PASS if ok else FAIL, f"vllm {d.get('venv')}",
                        f"vllm importable in {params.runtime.venv}", "" if ok else "create the venv with "
                        "vllm on this node"))
    # --- RoCE fabric, per rail
    for node in up:
        d = data[node.name]
        for r, rail in enumerate(node.rails):
            where = f"{rail.interface}"
            ib = (d["ibdev2netdev"] or {}).get(rail.hca) if rail.hca else None
            if rail.hca:
                if d["ibdev2netdev"] is None:
                    v.add(Check("rail map", node.name, FAIL, "ibdev2netdev unavailable",
                                f"{rail.hca} ==> {where} (Up)", "install the Mellanox/DOCA tools (ibdev2netdev)"))
                else:
                    ok = bool(ib) and ib["netdev"] == rail.interface and ib["up"]
                    seen = f"{rail.hca} ==> {ib['netdev']} ({'Up' if ib['up'] else 'Down'})" if ib else f"no HCA {rail.hca}"
                    v.add(Check("rail map", node.name, PASS if ok else FAIL, seen, f"{rail.hca} ==> {where} (Up)",
                                "" if ok else f"check the QSFP cable and that {rail.hca} belongs to "
                                f"{where} (ibdev2netdev); the link must be Up", "ibdev2netdev"))
                port = _port_state(d, rail.hca)
                if port:
                    ok = port[0] and port[1]
                    v.add(Check("rail port", node.name, PASS if ok else FAIL,
                                f"{rail.hca}: state {port[2]}, physical {port[3]}",
                                "ACTIVE, LinkUp", "" if ok else "the port is down: reseat the cable, check "
                                "the peer's port and `ip link set {where} up`", port[4]))
            speed = d["ethtool"].get(rail.interface, {}).get("speed_mbps")
            want = int(e.link_rate_gbps * 1000)
            v.add(Check("rail rate", node.name, PASS if speed == want else FAIL,
                        f"{where}: {speed}Mb/s" if speed else f"{where}: no link speed",
                        f"{want}Mb/s", "" if speed == want else "a degraded or down link: pin the switch "
                        "port (or both ends) to the expected speed and check the cable", f"ethtool {where}"))
            link = d["links"].get(rail.interface)
            mtu = link.get("mtu") if link else None
            v.add(Check("rail mtu", node.name, PASS if mtu == e.mtu else FAIL,
                        f"{where}: mtu {mtu}" if link else f"no interface {where}", f"mtu {e.mtu}",
                        "" if mtu == e.mtu else f"`sudo ip link set {where} mtu {e.mtu}` and make it "
                        "permanent in netplan, on every node", f"ip link show {where}"))
            addrs = [f"{a['local']}/{a['prefixlen']}" for a in (link or {}).get("addr_info", [])
                     if a.get("family") == "inet"]
            want_addr = f"{rail.ip}/{rail.prefix}"
            v.add(Check("rail address", node.name, PASS if want_addr in addrs else FAIL,
                        f"{where}: {', '.join(addrs) or 'no IPv4 address'}", want_addr,
                        "" if want_addr in addrs else f"assign {want_addr} to {where} (netplan), or fix "
                        "the parameters", f"ip addr show {where}"))
            for ping in sorted(d["ping"], key=lambda p: p["peer"]):
                if ping["interface"] != rail.interface:
                    continue
                peer_ip, ok = ping["peer"], ping["ok"]
                peer = next((p.name for p in params.nodes for pr in p.rails if str(pr.ip) == peer_ip), peer_ip)
                v.add(Check("path mtu", node.name, PASS if ok else FAIL,
                            f"{where} → {peer} ({peer_ip}): {'ok' if ok else 'no reply'}",
                            f"{e.mtu - 28}-byte don't-fragment ping answered",
                            "" if ok else f"MTU {e.mtu} must hold end to end on this rail: every node's "
                            "interface and any switch port; check that the peer's link is up",
                            f"ping -M do -s {e.mtu - 28} -I {where} {peer_ip}"))
    subnets = [str(r.network) for r in params.head.rails]
    v.add(Check("rail subnets", "all", PASS, ", ".join(subnets) or "no rails", "one subnet per rail; "
                "addresses unique (checked when the parameters were validated)"))
    # --- time
    for node in up:
        skew = data[node.name].get("skew_s")
        if skew is None:
            continue
        status = FAIL if abs(skew) > SKEW_FAIL_S else WARN if abs(skew) > SKEW_WARN_S else PASS
        v.add(Check("clock", node.name, status, f"{skew:+.3f} s against this machine",
                    f"within ±{SKEW_WARN_S} s", "" if status == PASS else "enable NTP on every node "
                    "(`timedatectl set-ntp true`)", "date +%s.%N"))
    # --- ports on the head
    if head.name in data:
        busy = []
        for name, port in params.ports.model_dump().items():
            seen = listener(data[head.name]["listeners"], port)
            if seen:
                busy.append(f"{name} {port}: {seen}")
        v.add(Check("ports free", head.name, FAIL if busy else PASS, "; ".join(busy) or
                    ", ".join(f"{k} {p}" for k, p in params.ports.model_dump().items()) + " free",
                    "no listener on the API, Ray, dashboard and master ports",
                    "stop what listens there (08_teardown, or the process shown), or change `ports` "
                    "in the parameters" if busy else "", "ss -ltnp"))
    # --- disk
    need = max(e.min_disk_gb, 0)
    for node in up:
        f = data[node.name]["facts"]
        for what, free in (("model disk", f.get("model_disk_free_gb")), ("docker disk", f.get("docker_disk_free_gb"))):
            if free is None:
                continue
            ok = free >= need
            v.add(Check(what, node.name, PASS if ok else FAIL, f"{free} GB free", f"≥ {need} GB",
                        "" if ok else "free space, or point the model path / Docker root elsewhere"))
    # --- image
    if params.runtime.kind == "docker":
        ref = data.get(head.name, {}).get("image")
        for node in up:
            img = data[node.name]["image"]
            if node.name == head.name:
                ok = img is not None
                v.add(Check("image", node.name, PASS if ok else FAIL, short_id(img) if ok else "absent",
                            f"{params.runtime.image} on the head", "" if ok else
                            f"`docker pull {params.runtime.image}` (or build it) on the head",
                            f"docker image inspect {params.runtime.image}"))
            elif img is None:
                v.add(Check("image", node.name, WARN, "absent: to distribute", short_id(ref),
                            "03_distribute_image sends it from the head"))
            else:
                ok = img == ref
                v.add(Check("image", node.name, PASS if ok else FAIL, short_id(img), short_id(ref),
                            "" if ok else f"a different image under {params.runtime.image}: "
                            "03_distribute_image replaces it with the head's",
                            f"docker image inspect {params.runtime.image}"))
    # --- model
    ref_m = data.get(head.name, {}).get("model")
    for node in up:
        m = data[node.name]["model"]
        if m is None:
            status = FAIL if node.name == head.name else WARN
            v.add(Check("model", node.name, status, f"{params.model.path} absent",
                        "the model on every node", "download it on the head (huggingface-cli download "
                        f"{params.model.name} --local-dir {params.model.path}); 03 copies it to the workers"))
        elif node.name == head.name or ref_m is None:
            v.add(Check("model", node.name, PASS, f"{len(m)} files, {sum(f['size'] for f in m.values()) / 1e9:.2f} GB",
                        "the model on every node"))
        else:
            diff = diff_manifests(ref_m, m)
            v.add(Check("model", node.name, FAIL if diff else PASS,
                        "differs: " + ", ".join(diff[:6]) + (" ..." if len(diff) > 6 else "") if diff
                        else f"identical to {head.name} ({len(m)} files)", f"identical to {head.name}",
                        "03_distribute_image (model sync) copies the differing files from the head"
                        if diff else "", f"find {params.model.path} -type f; sha256sum"))
    # --- HF token (never printed)
    env = params.model.hf_token_env
    if params.model.needs_token:
        ok = bool(os.environ.get(env))
        v.add(Check("hf token", "local", PASS if ok else FAIL, f"${env} {'is set (hidden)' if ok else 'is not set'}",
                    f"${env} set on this machine", "" if ok else f"export {env}=... (from huggingface.co "
                    "settings) before starting Jupyter or sparkbook"))
    else:
        v.add(Check("hf token", "local", SKIP, "the model needs no token"))
    for node in params.nodes:  # checks that could not run
        if node.name not in data:
            v.add(Check("node checks", node.name, SKIP, "not reachable: see the ssh check"))
    return v


def _port_state(d: dict, hca: str) -> tuple | None:
    """(active, linkup, state, physical, command) from ibstat, else ibv_devinfo."""
    st = (d.get("ibstat") or {}).get(hca)
    if st and 1 in st["ports"]:
        p = st["ports"][1]
        return (p.get("state") == "Active", p.get("physical_state") == "LinkUp", p.get("state"),
                p.get("physical_state"), f"ibstat {hca}")
    dev = (d.get("ibv_devinfo") or {}).get(hca)
    if dev and 1 in dev["ports"]:
        p = dev["ports"][1]
        active = p.get("state") == "PORT_ACTIVE"
        return (active, active, p.get("state"), p.get("phys_state", "LinkUp" if active else "?"), f"ibv_devinfo -d {hca}")
    return None




def run(params: Params, cluster: Cluster | None = None) -> tuple[Verdict, dict[str, dict]]:
    data, results = collect(params, cluster)
    return checks(params, data, results), data
