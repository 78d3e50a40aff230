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
- spin         vLLM's worker on the node busy-waits after its distributed initialisation, as a rank
               spinning in a collective that never completes does: CPU used, no log line, no
               compile (the lab image's worker reads a flag file in the node's Ray container:
               plugin/lab_faults.py); apply it once 04 has started Ray, before 05
- compile      vLLM's worker on the node compiles (g++, again and again) before its warm-up for
               --seconds (default 90), logging nothing: a long first-boot compile that is work;
               apply it once 04 has started Ray, before 05
- stale        a process left from an earlier run on the node: named VLLM::EngineCore like vLLM's
               engine, holding memory, so the simulated nvidia-smi lists it as a GPU process
- clock        the node's clock read 5 s ahead: a simulated `date` (simhost.py) on the node's PATH
               (the lab's nodes share this machine's clock)
- disk         1 GiB free on every filesystem of the node: a simulated `df` (simhost.py) on its PATH,
               which preflight's model and Docker disk figures read
- throttle     the node's GPU held at 513 MHz by a power brake (HW Slowdown, HW Power Brake
               Slowdown Active in the simulated `nvidia-smi -q`), as a Spark on a bad USB-C power
               negotiation reports it
- cpu-quota    the node's running vLLM containers held to 0.15 of a core (`docker update
               --cpus`): a server that really slows while it serves, as a GPU held down by heat or
               power mid-run does (the lab's vLLM runs on the CPU); apply it once 05 has started
               vLLM, e.g. halfway through 06's soak
- dhcp         the node's first rail on a NetworkManager profile that sets it by DHCP, as DGX OS
               ships the CX-7 ports: a simulated `nmcli` (simhost.py) on the node's PATH (the lab's
               rails are set by `ip`, which no NetworkManager manages)
- twin         the node's cable in the other QSFP port: its cabled netdevs carry the other port's
               names (enp1s0f1np1 becomes enp1s0f0np0, enP2p1s0f1np1 enP2p1s0f0np0), so ibdev2netdev
               shows the f0 twins Up and the f1 ones Down, as a Spark recabled into port 1 does
- mgmt-cut     the node's `netplan apply` takes its management address down while a file of
               sparkbook's is among its netplan files (simnet.py), as a renderer switch or a bad
               merge does on a real node: `sparkbook fabric apply`'s guard must roll it back
- slow-cable   the node's first rail (enp1s0f1np1) rate-limited at both ends (--rate) while its link,
               rate, FEC and error counters all read healthy: the silent degradation of a Spark's
               ConnectX-7 that only traffic shows (02's perftest measures it; the simulated
               ib_write_bw streams over the rail)
- link-errors  the node's first rail's rx_pcs_symbol_err_phy (symbol errors FEC could not correct)
               climbing from the moment it is applied, 40 a second, in the simulated `ethtool -S`:
               a cable that starts failing while the model serves
- xid          an Xid 119 (GSP timeout) in the node's kernel log from the moment it is applied: a
               simulated `dmesg` (simhost.py) on the node's PATH
- shard-corrupt  one byte flipped in the middle of the node's largest weights file, its size and
               modification time kept: a copy that went wrong silently, which names and sizes
               cannot tell from the head's (01 compares by SHA-256; 03 copies it again)
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from ..serving.plan import plan
from ..serving.vllm import ENGINE_TITLE
from . import drift
from .lab import Lab
from .nodes import (FABRIC_MTU, FABRIC_NS, FAULTS, HOST_TOOLS, MGMT_IF, PREFIX, RAILS, SIMULATED_TOOLS, LabError,
                    LabNode, docker, install_tools, sh)

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


@dataclass
class Site:
    """Where a fault is applied or undone, and its record (what undoing it needs, kept in lab.json)."""
    lab: Lab
    node: LabNode
    rec: dict
    port: int | None = None  # port-busy, firewall: the port asked for
    rate: str = "200mbit"  # slow-link, fec
    seconds: float = 90  # compile

    @property
    def ns(self) -> str:
        return self.node.netns

    @cached_property
    def params(self):
        return self.lab.params()


def _node_down(s: Site) -> None:
    s.rec["rails_up"] = [r for r in RAIL_NAMES if _is_up(s.ns, r)]
    for ifname in [MGMT_IF, *RAIL_NAMES]:
        sh("ip", "-n", s.ns, "link", "set", ifname, "down")


def _node_up(s: Site) -> None:
    for ifname in [MGMT_IF, *s.rec["rails_up"]]:
        sh("ip", "-n", s.ns, "link", "set", ifname, "up")


def _mtu(value: int) -> Callable[[Site], None]:
    def set_mtu(s: Site) -> None:
        for r in RAIL_NAMES:
            sh("ip", "-n", s.ns, "link", "set", r, "mtu", str(value))
    return set_mtu


def _rail_down(s: Site) -> None:
    s.rec["rail"] = RAIL_NAMES[-1]
    sh("ip", "-n", s.ns, "link", "set", s.rec["rail"], "down")


def _rail_up(s: Site) -> None:
    sh("ip", "-n", s.ns, "link", "set", s.rec["rail"], "up")


def _docker_down(s: Site) -> None:
    pidfile = s.node.run / "docker.pid"
    s.lab.node_sh(s.node, f'kill -TERM "$(cat {shlex.quote(str(pidfile))})"')
    deadline = time.monotonic() + 30
    while pidfile.exists():  # dockerd removes it when it has stopped
        if time.monotonic() > deadline:
            raise LabError(f"{s.node.name}: the Docker daemon did not stop")
        time.sleep(0.2)


def _docker_up(s: Site) -> None:
    s.lab._start_dockerd(s.node, lambda *made: None)  # recorded at `up` already
    s.lab._wait_docker(s.node)


def _port_busy(s: Site) -> None:
    s.rec["port"] = s.port or s.params.ports.api
    listener = ("import socket, time; s = socket.socket(); "
                "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                f"s.bind(('0.0.0.0', {int(s.rec['port'])})); s.listen(); time.sleep(10**9)")
    out = s.lab.node_sh(s.node, f"python3 -c {shlex.quote(listener)} </dev/null >/dev/null 2>&1 & echo $!")
    s.rec["pid"] = int(out.stdout.strip())  # in the node's PID namespace
    _wait_listening(s.lab, s.node, int(s.rec["port"]))


def _port_free(s: Site) -> None:
    s.lab.node_sh(s.node, f"kill {int(s.rec['pid'])}", check=False)


def _stale(s: Site) -> None:
    s.rec["pid"] = _stale_process(s.lab, s.node)


def _stale_gone(s: Site) -> None:
    """Only if the PID is still that process; gone (reaped) before returning."""
    s.lab.node_sh(s.node, f"pid={int(s.rec['pid'])}; if [ \"$(cat /proc/$pid/comm 2>/dev/null)\" = "
                  f"{shlex.quote(STALE_NAME[:15])} ]; then kill \"$pid\"; for _ in $(seq 50); do "
                  "[ -e /proc/$pid ] || break; sleep 0.1; done; fi", check=False)


def _simulated(tool: str, key: str, value) -> tuple[Callable[[Site], None], Callable[[Site], None]]:
    """A fault made by a simulated tool (sparkbook/lab/simhw.py, simhost.py) on the node's PATH while
    it holds, reading ``key`` of the node's state (``value``, or what it returns when the fault is
    applied: a callable); the tool's link goes with it, unless the lab always simulates the tool."""
    def make(s: Site) -> None:
        _simulate(s.node, tool, key, value() if callable(value) else value)

    def undo(s: Site) -> None:
        link = s.node.dir / "bin" / tool
        if tool not in SIMULATED_TOOLS and link.is_symlink():
            link.unlink()
        _set_state(s.node, key, None)
    return make, undo


def _twin(f1_to_f0: bool) -> Callable[[Site], None]:
    def rename(s: Site) -> None:
        for f1 in RAIL_NAMES:
            f0 = f1.replace("f1np1", "f0np0")
            old, new = (f1, f0) if f1_to_f0 else (f0, f1)
            sh("ip", "-n", s.ns, "link", "set", "dev", old, "down")
            sh("ip", "-n", s.ns, "link", "set", "dev", old, "name", new)
            sh("ip", "-n", s.ns, "link", "set", "dev", new, "up")
    return rename


def _stall(s: Site) -> None:
    p = plan(s.params)
    s.rec["pids"] = _vllm_pids(s.node, p.serve_container, p.ray_container)
    if not s.rec["pids"]:
        raise LabError(f"{s.node.name}: no vLLM process to freeze (apply `stall` once 05 has started vLLM)")
    s.lab.node_sh(s.node, shlex.join(["kill", "-STOP", *map(str, s.rec["pids"])]))


def _unstall(s: Site) -> None:
    """Those that still exist (05 may have removed their container)."""
    s.lab.node_sh(s.node, shlex.join(["kill", "-CONT", *map(str, s.rec["pids"])]) + " 2>/dev/null", check=False)


def _worker_flag(name: str) -> tuple[Callable[[Site], None], Callable[[Site], None]]:
    """A flag file the lab image's worker reads (plugin/lab_faults.py) in the node's Ray
    container: ``spin`` holds nothing, ``compile`` the seconds to compile for."""
    path = f"{WORKER_FLAGS}/{name}"

    def make(s: Site) -> None:
        container = plan(s.params).ray_container
        content = f"{s.seconds:g}" if name == "compile" else ""
        r = docker(s.node, "exec", container, "sh", "-c", 'mkdir -p "$1" && printf %s "$2" > "$3"', "sh",
                   WORKER_FLAGS, content, path, check=False)
        if r.returncode != 0:
            raise LabError(f"{s.node.name}: no Ray container {container} to flag (apply `{name}` once 04 has "
                           f"started Ray): {r.stderr.strip()[-200:]}")

    def undo(s: Site) -> None:
        docker(s.node, "exec", plan(s.params).ray_container, "rm", "-f", "--", path, check=False)
    return make, undo


def _cpu_quota(s: Site) -> None:
    s.rec["containers"] = {}  # each container's own limit kept, to give back
    p = plan(s.params)
    for name in (p.serve_container, p.ray_container):
        r = docker(s.node, "inspect", "--format", "{{.HostConfig.NanoCpus}}", name, check=False)
        if r.returncode == 0:
            docker(s.node, "update", "--cpus", str(QUOTA_CPUS), name)
            s.rec["containers"][name] = int(r.stdout.strip() or 0)
    if not s.rec["containers"]:
        raise LabError(f"{s.node.name}: no vLLM container to slow (apply `cpu-quota` once 05 has started vLLM)")


def _cpu_back(s: Site) -> None:
    """Those that still exist, back to their own limit (0: none)."""
    for name, nano in s.rec["containers"].items():
        docker(s.node, "update", "--cpus", f"{nano / 1e9:g}" if nano else UNLIMITED_CPUS, name, check=False)


def _firewall(action: str) -> Callable[[Site], None]:
    """Exactly one rule per rail, added (-I) or deleted (-D) again if it is still there."""
    def rules(s: Site) -> None:
        if action == "-I":
            s.rec["port"] = s.port or s.params.ports.ray
        for ifname in RAIL_NAMES:
            sh("ip", "netns", "exec", s.ns, "iptables", action, "INPUT", *_firewall_rule(ifname, s.rec["port"]),
               check=action == "-I")
    return rules


def _slow_link(fec: bool, rails: tuple[str, ...] = tuple(RAIL_NAMES)) -> tuple[Callable[[Site], None], Callable[[Site], None]]:
    """Both ends of each of ``rails`` rate-limited (tbf: this kernel has no netem); ``fec``: the
    simulated ethtool says the rails run without forward error correction too."""
    def ends(s: Site):
        for r, ifname in enumerate(RAIL_NAMES):
            if ifname in rails:
                yield from ((s.ns, ifname), (FABRIC_NS, f"{PREFIX}{s.node.index}r{r}"))

    def make(s: Site) -> None:
        s.rec["rate"] = s.rate
        if fec:
            _simulate(s.node, "ethtool", "fec", {ifname: "None" for ifname in RAIL_NAMES})
        for where, dev in ends(s):
            sh("ip", "netns", "exec", where, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
               "rate", s.rate, "burst", "256kb", "latency", "100ms")

    def undo(s: Site) -> None:
        if fec:
            _set_state(s.node, "fec", None)
        for where, dev in ends(s):
            sh("ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", dev, "root", check=False)
    return make, undo


# Of a core: the cpu-quota fault's. Measured on the worker of the lab's TP 2 (2026-12-01): 0.25
# slowed it 1.6x, 0.05 some 12x (so few requests then finish that a soak's last third is mostly
# of requests sent before the fault); 0.15 aims at the 3-6x a throttled GPU shows.
QUOTA_CPUS = 0.15
UNLIMITED_CPUS = "0"  # `docker update --cpus 0` lifts the limit
WORKER_FLAGS = "/tmp/sparkbook-lab-faults"  # plugin/lab_faults.py's FLAGS
STALE_NAME = ENGINE_TITLE  # what the engine's process calls itself; nvidia-smi lists it so on a Spark
# The power brake of a Spark whose USB-C power negotiation failed (the GB10 stuck at 500-850 MHz).
THROTTLE = {"reasons": ["HW Slowdown", "HW Power Brake Slowdown"], "mhz": 513}

# The link-errors fault's counter: FEC could not correct these (mlx5's counters documentation), at a
# rate a failing cable shows, and the xid fault's line, as a GB10 logged its GSP timing out
# (the Xid 119 of a DGX Spark; tests/fixtures/xid-*.txt hold real lines with their sources).
CLIMBING, CLIMB_PER_S = "rx_pcs_symbol_err_phy", 40.0
XID_LINE = ("NVRM: Xid (PCI:000f:01:00): 119, pid=4242, name=python3, Timeout after 45s of waiting for "
            "RPC response from GPU0 GSP!")

# Every fault: how it is made, how it is undone (the module's docstring says what each is).
TABLE: dict[str, tuple[Callable[[Site], None], Callable[[Site], None]]] = {
    "node-down": (_node_down, _node_up),
    "mtu": (_mtu(1500), _mtu(FABRIC_MTU)),
    "rail-down": (_rail_down, _rail_up),
    "docker-down": (_docker_down, _docker_up),
    "port-busy": (_port_busy, _port_free),
    "image-drift": (drift.image_drift, drift.image_back),
    "model-drift": (drift.model_drift, drift.model_back),
    "slow-link": _slow_link(fec=False),
    "stall": (_stall, _unstall),
    "spin": _worker_flag("spin"),
    "compile": _worker_flag("compile"),
    "firewall": (_firewall("-I"), _firewall("-D")),
    "stale": (_stale, _stale_gone),
    "clock": _simulated("date", "clock_offset_s", 5.0),
    "disk": _simulated("df", "disk_free_kb", 1 << 20),
    "throttle": _simulated("nvidia-smi", "throttle", THROTTLE),
    "fec": _slow_link(fec=True),
    "cpu-quota": (_cpu_quota, _cpu_back),
    "dhcp": _simulated("nmcli", "nm_dhcp", {"interface": RAIL_NAMES[0], "connection": "Wired connection 1"}),
    "twin": (_twin(True), _twin(False)),
    "mgmt-cut": (lambda s: _set_state(s.node, "netplan_cuts_management", True),
                 lambda s: _set_state(s.node, "netplan_cuts_management", None)),
    "slow-cable": _slow_link(fec=False, rails=(RAIL_NAMES[0],)),
    "link-errors": _simulated("ethtool", "link_errors", lambda: {
        "netdevs": [RAIL_NAMES[0]], "counter": CLIMBING, "since": time.time(), "per_s": CLIMB_PER_S}),
    "xid": _simulated("dmesg", "xid", lambda: [{"at": time.time(), "line": XID_LINE}]),
    "shard-corrupt": (drift.shard_corrupt, drift.shard_back),
}


def apply(lab: Lab, kind: str, node: str | None = None, port: int | None = None,
          rate: str = "200mbit", seconds: float = 90) -> dict:
    """Apply a fault; returns its record. Applying one that is already applied changes nothing."""
    if kind not in FAULTS:
        raise LabError(f"unknown fault {kind!r} (faults: {', '.join(FAULTS)})")
    target = _pick(lab, kind, node)
    for f in lab.state()["faults"]:
        if f["kind"] == kind and f["node"] == target.name:
            return f
    rec: dict = {"kind": kind, "node": target.name}
    TABLE[kind][0](Site(lab, target, rec, port, rate, seconds))
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
        node = next(n for n in lab.nodes() if n.name == rec["node"])
        TABLE[rec["kind"]][1](Site(lab, node, rec))
        state["faults"].remove(rec)
        lab._save(state)
        healed.append(rec)
    return healed


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
    """``tool`` on the node's PATH as simhw.py (simhost.py for a host's tool), reading ``key`` of
    the node's state. The node's simulated tools are refreshed first: a lab that is up may predate
    the tool."""
    bin_dir = node.dir / "bin"
    install_tools(node)
    _set_state(node, key, value)
    if not (bin_dir / tool).is_symlink():
        (bin_dir / tool).symlink_to(bin_dir / ("simhost.py" if tool in HOST_TOOLS else "simhw.py"))


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
