"""Reversible faults for drills and tests. Each is a real change of a lab node (its links, its
daemon, its files, its listeners), so the commands that preflight uses see it as they would on a
Spark; `heal` undoes it. Applied faults are kept in lab.json.

- node-down    the node's links go down: it no longer answers
- mtu          the node's fabric rails back to MTU 1500
- rail-down    the node's second rail (enP2p1s0f1np1) down; ibdev2netdev and friends show it
- docker-down  the node's Docker daemon stopped
- port-busy    a listener on a port of the node (default: the API port, on the head)
- image-drift  a different image under the configured tag on the node
- model-drift  a changed model file (config.json) on the node
- slow-link    the node's fabric rails rate-limited (tbf; this kernel has no netem)
- fec          the node's fabric rails without forward error correction, as a Spark's came up after
               its cable was moved: the simulated `ethtool --show-fec` says None, and the rails are
               rate-limited as slow-link does (--rate)
- firewall     TCP to one port (default: the Ray port) dropped on the node's fabric rails, as a
               host firewall does; ping still passes
- stall        vLLM's processes on the node frozen (SIGSTOP), as a rank hung in NCCL looks: apply
               it once vLLM starts (05); Ray's own daemons keep running
- stale        a process left from an earlier run on the node: named VLLM::EngineCore like vLLM's
               engine, holding memory, so the simulated nvidia-smi lists it as a GPU process
- clock        the node's clock read 5 s ahead: a simulated `date` (simhw.py) on the node's PATH
               (the lab's nodes share this machine's clock)
- disk         1 GiB free on every filesystem of the node: a simulated `df` (simhw.py) on its PATH,
               which preflight's model and Docker disk figures read
- throttle     the node's GPU held at 513 MHz by a power brake (HW Slowdown, HW Power Brake
               Slowdown Active in the simulated `nvidia-smi -q`), as a Spark on a bad USB-C power
               negotiation reports it
- cpu-quota    the node's running vLLM containers held to 0.15 of a core (`docker update
               --cpus`): a server that really slows while it serves, as a GPU held down by heat or
               power mid-run does (the lab's vLLM runs on the CPU); apply it once 05 has started
               vLLM, e.g. halfway through 06's soak
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import tarfile
import time
from pathlib import Path

from ..serving.commands import container_name
from .lab import Lab
from .nodes import FABRIC_MTU, FABRIC_NS, FAULTS, MGMT_IF, PREFIX, RAILS, LabError, LabNode, docker, sh

RAIL_NAMES = [r[0] for r in RAILS]


def _pick(lab: Lab, kind: str, name: str | None) -> LabNode:
    nodes = lab.nodes()
    if not nodes:
        raise LabError("the lab is not up: run `sparkbook lab up`")
    if name is None:  # port-busy blocks the head; everything else hits the first worker
        return nodes[0] if kind == "port-busy" or len(nodes) == 1 else nodes[1]
    for n in nodes:
        if n.name == name:
            return n
    raise LabError(f"no lab node {name!r} (nodes: {', '.join(n.name for n in nodes)})")


def apply(lab: Lab, kind: str, node: str | None = None, port: int | None = None,
          rate: str = "200mbit") -> dict:
    """Apply a fault; returns its record. Applying one that is already applied changes nothing."""
    if kind not in FAULTS:
        raise LabError(f"unknown fault {kind!r} (faults: {', '.join(FAULTS)})")
    target = _pick(lab, kind, node)
    state = lab.state()
    for f in state["faults"]:
        if f["kind"] == kind and f["node"] == target.name:
            return f
    params = lab.params()
    rec: dict = {"kind": kind, "node": target.name}
    ns = target.netns
    if kind == "node-down":
        rec["rails_up"] = [r for r in RAIL_NAMES if _is_up(ns, r)]
        for ifname in [MGMT_IF, *RAIL_NAMES]:
            sh("ip", "-n", ns, "link", "set", ifname, "down")
    elif kind == "mtu":
        for r in RAIL_NAMES:
            sh("ip", "-n", ns, "link", "set", r, "mtu", "1500")
    elif kind == "rail-down":
        rec["rail"] = RAIL_NAMES[-1]
        sh("ip", "-n", ns, "link", "set", rec["rail"], "down")
    elif kind == "docker-down":
        pidfile = target.run / "docker.pid"
        lab.node_sh(target, f'kill -TERM "$(cat {shlex.quote(str(pidfile))})"')
        deadline = time.monotonic() + 30
        while pidfile.exists():  # dockerd removes it when it has stopped
            if time.monotonic() > deadline:
                raise LabError(f"{target.name}: the Docker daemon did not stop")
            time.sleep(0.2)
    elif kind == "port-busy":
        rec["port"] = port or params.ports.api
        listener = ("import socket, time; s = socket.socket(); "
                    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                    f"s.bind(('0.0.0.0', {int(rec['port'])})); s.listen(); time.sleep(10**9)")
        out = lab.node_sh(target, f"python3 -c {shlex.quote(listener)} </dev/null >/dev/null 2>&1 & echo $!")
        rec["pid"] = int(out.stdout.strip())  # in the node's PID namespace
        _wait_listening(lab, target, int(rec["port"]))
    elif kind == "stale":
        rec["pid"] = _stale_process(lab, target)
    elif kind == "throttle":  # nvidia-smi is simulated already: only its state changes
        _simulate(target, "nvidia-smi", "throttle", THROTTLE)
    elif kind in SIMULATED:
        rec["tool"], rec["key"], value = SIMULATED[kind]
        _simulate(target, rec["tool"], rec["key"], value)
    elif kind == "image-drift":
        image = params.runtime.image
        r = docker(target, "image", "inspect", "--format", "{{.Id}}", image, check=False)
        rec["previous"] = r.stdout.strip() if r.returncode == 0 else None
        tar_path = target.dir / "faults" / "drift.tar"
        with tarfile.open(tar_path, mode="w") as tar:
            data = f"image drift made by `sparkbook lab fault` at {time.time()}\n".encode()
            info = tarfile.TarInfo("sparkbook-lab-drift")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        drift = docker(target, "import", str(tar_path), image)
        rec["drift"] = drift.stdout.strip()
    elif kind == "model-drift":
        cfg = target.dir / "models" / Path(params.model.path).name / "config.json"
        backup = target.dir / "faults" / "config.json"
        backup.write_bytes(cfg.read_bytes())
        data = json.loads(cfg.read_text())
        data["sparkbook_lab_drift"] = time.time()
        cfg.write_text(json.dumps(data, indent=2))
        rec["file"], rec["backup"] = str(cfg), str(backup)
    elif kind == "stall":
        rec["pids"] = _vllm_pids(target, container_name(params, False), container_name(params, True))
        if not rec["pids"]:
            raise LabError(f"{target.name}: no vLLM process to freeze (apply `stall` once 05 has started vLLM)")
        lab.node_sh(target, shlex.join(["kill", "-STOP", *map(str, rec["pids"])]))
    elif kind == "cpu-quota":  # each container's own limit kept, to give back
        rec["containers"] = {}
        for name in (container_name(params, False), container_name(params, True)):
            r = docker(target, "inspect", "--format", "{{.HostConfig.NanoCpus}}", name, check=False)
            if r.returncode == 0:
                docker(target, "update", "--cpus", str(QUOTA_CPUS), name)
                rec["containers"][name] = int(r.stdout.strip() or 0)
        if not rec["containers"]:
            raise LabError(f"{target.name}: no vLLM container to slow (apply `cpu-quota` once 05 has started vLLM)")
    elif kind == "firewall":
        rec["port"] = port or params.ports.ray
        for ifname in RAIL_NAMES:
            sh("ip", "netns", "exec", ns, "iptables", "-I", "INPUT", *_firewall_rule(ifname, rec["port"]))
    elif kind in ("slow-link", "fec"):
        rec["rate"] = rate
        if kind == "fec":
            _simulate(target, "ethtool", "fec", {ifname: "None" for ifname in RAIL_NAMES})
        for r, ifname in enumerate(RAIL_NAMES):
            for where, dev in ((ns, ifname), (FABRIC_NS, f"{PREFIX}{target.index}r{r}")):
                sh("ip", "netns", "exec", where, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                   "rate", rate, "burst", "256kb", "latency", "100ms")
    state = lab.state()
    state["faults"].append(rec)
    lab._save(state)
    return rec


def heal(lab: Lab, kind: str | None = None) -> list[dict]:
    """Undo the applied faults (of one kind, or all), newest first; returns what was healed."""
    if kind is not None and kind not in FAULTS:
        raise LabError(f"unknown fault {kind!r} (faults: {', '.join(FAULTS)})")
    state = lab.state()
    if not state:
        raise LabError("the lab is not up: run `sparkbook lab up`")
    healed = []
    for rec in reversed(list(state["faults"])):
        if kind and rec["kind"] != kind:
            continue
        _undo(lab, rec)
        state["faults"].remove(rec)
        lab._save(state)
        healed.append(rec)
    return healed


def _undo(lab: Lab, rec: dict) -> None:
    node = next(n for n in lab.nodes() if n.name == rec["node"])
    ns, kind = node.netns, rec["kind"]
    if kind == "node-down":
        for ifname in [MGMT_IF, *rec["rails_up"]]:
            sh("ip", "-n", ns, "link", "set", ifname, "up")
    elif kind == "mtu":
        for r in RAIL_NAMES:
            sh("ip", "-n", ns, "link", "set", r, "mtu", str(FABRIC_MTU))
    elif kind == "rail-down":
        sh("ip", "-n", ns, "link", "set", rec["rail"], "up")
    elif kind == "docker-down":
        lab._start_dockerd(node, lambda *made: None)  # recorded at `up` already
        lab._wait_docker(node)
    elif kind == "port-busy":
        lab.node_sh(node, f"kill {int(rec['pid'])}", check=False)
    elif kind == "stale":  # only if the PID is still that process; gone (reaped) before returning
        lab.node_sh(node, f"pid={int(rec['pid'])}; if [ \"$(cat /proc/$pid/comm 2>/dev/null)\" = "
                    f"{shlex.quote(STALE_NAME[:15])} ]; then kill \"$pid\"; for _ in $(seq 50); do "
                    "[ -e /proc/$pid ] || break; sleep 0.1; done; fi", check=False)
    elif kind == "throttle":
        _set_state(node, "throttle", None)
    elif kind in SIMULATED:
        link = node.dir / "bin" / rec["tool"]
        if link.is_symlink():
            link.unlink()
        _set_state(node, rec["key"], None)
    elif kind == "image-drift":
        image = lab.params().runtime.image
        if rec["previous"]:
            docker(node, "tag", rec["previous"], image)
        else:
            docker(node, "rmi", image, check=False)
        docker(node, "rmi", rec["drift"], check=False)
    elif kind == "model-drift":
        Path(rec["file"]).write_bytes(Path(rec["backup"]).read_bytes())
    elif kind in ("slow-link", "fec"):
        if kind == "fec":
            _set_state(node, "fec", None)
        for r, ifname in enumerate(RAIL_NAMES):
            for where, dev in ((ns, ifname), (FABRIC_NS, f"{PREFIX}{node.index}r{r}")):
                sh("ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", dev, "root", check=False)
    elif kind == "firewall":  # exactly the rules added (one each), if they are still there
        for ifname in RAIL_NAMES:
            sh("ip", "netns", "exec", ns, "iptables", "-D", "INPUT", *_firewall_rule(ifname, rec["port"]), check=False)
    elif kind == "cpu-quota":  # those that still exist, back to their own limit (0: none)
        for name, nano in rec["containers"].items():
            docker(node, "update", "--cpus", f"{nano / 1e9:g}" if nano else UNLIMITED_CPUS, name, check=False)
    elif kind == "stall":  # those that still exist (05 may have removed their container)
        lab.node_sh(node, shlex.join(["kill", "-CONT", *map(str, rec["pids"])]) + " 2>/dev/null", check=False)


def _wait_listening(lab: Lab, node: LabNode, port: int, timeout: float = 30) -> None:
    """Until something listens on ``port`` on ``node``: a Python started in the background binds
    it only once it has started (seconds on a busy machine)."""
    deadline = time.monotonic() + timeout
    while not lab.node_sh(node, f"ss -ltnH 'sport = :{port}'", check=False).stdout.strip():
        if time.monotonic() > deadline:
            raise LabError(f"{node.name}: nothing listens on port {port} {timeout:.0f} s after the fault started")
        time.sleep(0.2)


# Ray's own processes in the Ray container: not vLLM's, and the cluster must stay up.
RAY_OWN = re.compile(r"raylet|gcs_server|dashboard|log_monitor|monitor\.py|runtime_env|ray start|ray::IDLE")


def _vllm_pids(node: LabNode, serve_container: str, ray_container: str) -> list[int]:
    """vLLM's processes on ``node`` (PIDs of its PID namespace): every process of the mp serving
    container, and those of the Ray container that are not Ray's own."""
    pids = []
    for container in (serve_container, ray_container):
        r = docker(node, "top", container, "-eo", "pid,args", check=False)
        for line in r.stdout.splitlines()[1:] if r.returncode == 0 else []:
            pid, _, args = line.strip().partition(" ")
            if container == serve_container or not RAY_OWN.search(args):
                pids.append(int(pid))
    return pids


def _firewall_rule(ifname: str, port: int) -> list[str]:
    """The firewall fault's rule on one rail, as added and as deleted."""
    return ["-i", ifname, "-p", "tcp", "--dport", str(int(port)), "-m", "comment", "--comment",
            "sparkbook-lab firewall", "-j", "DROP"]


# Of a core: the cpu-quota fault's. Measured on the worker of the lab's TP 2 (2026-12-01): 0.25
# slowed it 1.6x, 0.05 some 12x (so few requests then finish that a soak's last third is mostly
# of requests sent before the fault); 0.15 aims at the 3-6x a throttled GPU shows.
QUOTA_CPUS = 0.15
UNLIMITED_CPUS = "0"  # `docker update --cpus 0` lifts the limit
# What vLLM's engine process calls itself (setproctitle); nvidia-smi lists it so on a Spark.
STALE_NAME = "VLLM::EngineCore"
# Faults made by a simulated tool (sparkbook/lab/simhw.py) on the node's PATH while they hold:
# the tool, the key of the node's state it reads, the value.
SIMULATED = {"clock": ("date", "clock_offset_s", 5.0), "disk": ("df", "disk_free_kb", 1 << 20)}
# The power brake of a Spark whose USB-C power negotiation failed (the GB10 stuck at 500-850 MHz).
THROTTLE = {"reasons": ["HW Slowdown", "HW Power Brake Slowdown"], "mhz": 513}


def _stale_process(lab: Lab, node: LabNode) -> int:
    """A process on ``node`` named like vLLM's engine (its command line and its comm, which the
    simulated nvidia-smi reads), holding 32 MiB; its PID in the node's PID namespace."""
    code = (f"import time; held = b'x' * (32 << 20); open('/proc/self/comm', 'w').write({STALE_NAME!r}); "
            "time.sleep(10**9)")
    out = lab.node_sh(node, f"exec -a {shlex.quote(STALE_NAME)} \"$(python3 -c 'import sys; print(sys.executable)')\" "
                      f"-c {shlex.quote(code)} </dev/null >/dev/null 2>&1 & echo $!")
    time.sleep(0.3)
    return int(out.stdout.strip())


def _simulate(node: LabNode, tool: str, key: str, value) -> None:
    """``tool`` on the node's PATH as simhw.py, reading ``key`` of the node's state. The node's copy
    of simhw.py is refreshed first: a lab that is up may predate the tool."""
    bin_dir = node.dir / "bin"
    fresh = bin_dir / ".simhw.py.new"
    shutil.copyfile(Path(__file__).with_name("simhw.py"), fresh)
    fresh.chmod(0o755)
    fresh.replace(bin_dir / "simhw.py")
    _set_state(node, key, value)
    if not (bin_dir / tool).is_symlink():
        (bin_dir / tool).symlink_to(bin_dir / "simhw.py")


def _set_state(node: LabNode, key: str, value) -> None:
    """Set (None: remove) one key of the node's state, which the simulated tools read."""
    path = node.dir / "state.json"
    data = json.loads(path.read_text())
    if value is None:
        data.pop(key, None)
    else:
        data[key] = value
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def _is_up(ns: str, ifname: str) -> bool:
    out = sh("ip", "-n", ns, "-j", "link", "show", ifname).stdout
    return "UP" in json.loads(out)[0].get("flags", [])
