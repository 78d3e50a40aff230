"""`sparkbook lab reboot NODE...`: a lab node restarted as a machine restarts.

Everything the node ran goes (its init, and with it sshd, dockerd, the containers' processes, the
node's /tmp and /dev/shm); everything set at runtime goes (every global address on its links, the
rails' MTU back to what a NIC comes up with); then the node boots: a new init, its persisted network
brought back by `netplan apply` (its own /etc/netplan, simnet.py), sshd with the same host key, and
dockerd, which restarts the containers whose restart policy asks for it. What the node holds on disk
stays: its images, its model, /var/lib/sparkbook, its netplan files.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .lab import Lab
from .procs import is_init, kill_init
from .nodes import BOOT_MTU, RAILS, LabError, LabNode, sh


def reboot(lab: Lab, names: list[str], say=print) -> dict[str, float]:
    """Reboot the named nodes (all at once); returns each one's seconds until SSH and Docker answer
    again."""
    st = lab.state()
    if not st:
        raise LabError("the lab is not up: run `sparkbook lab up`")
    by_name = {n.name: n for n in lab.nodes()}
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise LabError(f"no lab node {', '.join(map(repr, unknown)) or 'named'} (nodes: {', '.join(by_name)})")
    nodes = [by_name[n] for n in dict.fromkeys(names)]
    t0 = time.monotonic()
    for node in nodes:
        _power_off(node, st["nodes"][node.name])
    models_mount = Path(lab.params().model.path).parent
    key = lab.home / "id_ed25519"
    took, lock = {}, threading.Lock()

    def boot(node: LabNode) -> None:
        launcher, init = lab._start_init(node, models_mount)
        with lock:
            st = lab.state()
            st["nodes"][node.name].update(init_pid=init, launcher_pid=launcher)
            st["nodes"][node.name].pop("stopped", None)
            lab._save(st)
        env = f"SPARKBOOK_LAB_STATE={node.dir / 'state.json'} PATH={node.dir / 'bin'}:$PATH"
        r = lab.node_sh(node, f"{env} netplan apply", check=False)
        if r.returncode:
            raise LabError(f"{node.name}: netplan apply at boot failed: {(r.stderr or r.stdout).strip()[-500:]}")
        (node.dir / "sshd" / "sshd.pid").unlink(missing_ok=True)
        lab._start_sshd(node, key)
        lab._start_dockerd(node, made=lambda *_: None)  # its folders and cgroup are recorded already
        lab._wait_docker(node)
        took[node.name] = time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(boot, nodes))
    say("lab: rebooted " + ", ".join(f"{n} ({s:.1f} s)" for n, s in took.items()))
    return took


def _power_off(node: LabNode, info: dict) -> None:
    """The node's processes and runtime state gone; its disk kept."""
    if info.get("init_pid") and is_init(info["init_pid"], node):
        kill_init(node, info)
    links = json.loads(sh("ip", "-n", node.netns, "-j", "link", "show").stdout)
    for link in links:
        if link["ifname"] != "lo":
            sh("ip", "-n", node.netns, "addr", "flush", "dev", link["ifname"], "scope", "global")
    for ifname, *_ in RAILS:
        sh("ip", "-n", node.netns, "link", "set", "dev", ifname, "mtu", str(BOOT_MTU))
    # /run is a tmpfs on a real machine: the daemon's sockets, pid files and exec root go
    if node.run.exists():
        shutil.rmtree(node.run)
