"""The local lab: N simulated DGX Spark nodes on this machine.

A lab node is a network namespace (management link, two fabric rails named like a Spark's, MTU 9000)
plus a PID, mount and UTS namespace held by a small init process. Inside it run the node's own
sshd and Docker daemon; it has its own hostname, /tmp, /dev/shm, /etc/hosts, ~/.ssh and model
directory (bind-mounted at the parameters' model path). Killing the init process ends every
process of the node, containers included, and its mounts go with its mount namespace.

Only GPU and RDMA tools are simulated (sparkbook/lab/simhw.py, on the node's PATH).

Layout on the machine:
  $SPARKBOOK_LAB_HOME (default ~/.cache/sparkbook/lab)
    id_ed25519, known_hosts   the operator's key and the lab's host keys (parameters/lab.yaml)
    lab.json                  what is up: nodes, init pids, faults, and what `lab up` made on
                              this machine (the only things `lab down` removes: host.py)
    docker-head/              the head's Docker data root: kept across up/down, holds the image
    nodes/<name>/             per node: sshd, state.json, bin/, hosts, ssh/, models/, docker/
  /run/sparkbook-lab/<name>/  per node: Docker sockets, exec root and pid files
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..nodes.sshd import SshServer, keygen
from ..params import Params, validate
from . import host
from .host import links as _links  # by this name: tests replace it
from .image import DEFAULT, ensure, seed_images, stack
from .procs import is_init, kill_init
from .nodes import (BASHRC, BOOT_ID, BOOT_MTU, FABRIC_MTU, FABRIC_NS, LAB_HOME, MAX_NODES, MGMT_BRIDGE, MGMT_IF, MGMT_NET,
                    NETPLAN, NICS, PREFIX, RAILS, RUN, VARLIB, LabError, LabNode, docker, install_tools, lab_nodes,
                    lab_params, netplan_files, params_file, sh)


class Lab:
    """The lab on this machine, as recorded in lab.json."""

    def __init__(self, home: Path = LAB_HOME):
        self.home = home
        self.state_file = home / "lab.json"

    # ------------------------------------------------------------------------------ state

    def state(self) -> dict | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def _save(self, state: dict) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)

    def nodes(self) -> list[LabNode]:
        st = self.state()
        return lab_nodes(len(st["nodes"])) if st else []

    def params(self) -> Params:
        st = self.state()
        if not st:
            raise LabError("the lab is not up: run `sparkbook lab up`")
        return validate(lab_params(len(st["nodes"])), "lab parameters")

    def init_pid(self, node: LabNode) -> int:
        st = self.state() or {}
        pid = st.get("nodes", {}).get(node.name, {}).get("init_pid")
        if not pid:
            raise LabError(f"lab node {node.name} is not up")
        return pid

    def enter(self, node: LabNode) -> list[str]:
        """The prefix that runs a command inside a node (all its namespaces)."""
        return ["nsenter", "-t", str(self.init_pid(node)), "-m", "-u", "-p", "-n", "--"]

    def node_sh(self, node: LabNode, script: str, check: bool = True, timeout: float = 60):
        return sh(*self.enter(node), "bash", "-c", script, check=check, timeout=timeout)

    # ------------------------------------------------------------------------------ up

    def healthy(self) -> list[str]:
        """Problems of the running lab (empty when every node answers SSH and Docker)."""
        st = self.state()
        if not st:
            return ["not up"]
        problems = []
        for node in lab_nodes(len(st["nodes"])):
            pid = st["nodes"][node.name]["init_pid"]
            if not is_init(pid, node):
                problems.append(f"{node.name}: init process {pid} is gone")
                continue
            if not _port_open(node.mgmt_ip, 22):
                problems.append(f"{node.name}: sshd does not answer on {node.mgmt_ip}:22")
            if docker(node, "info", "--format", "{{.ID}}", check=False, timeout=10).returncode != 0:
                problems.append(f"{node.name}: Docker daemon does not answer")
        return problems

    def up(self, n: int = 2, say=print, seed_images: bool = False, unwired: bool = False,
           vllm: str | None = None) -> Path:
        """Build the lab (idempotent); returns its parameters file. ``seed_images``: the workers
        start with the head's images (:func:`seed_images`), for tests that resize the lab.
        ``unwired``: the fabric links are cabled but carry no address and MTU 1500, and nothing
        persists one, as on a node fresh from the box (day one: `sparkbook fabric` configures them).
        ``vllm``: the lab image's vLLM release (:data:`sparkbook.lab.image.STACKS`; None: the default)."""
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, sshd, dockerd)")
        if not 1 <= n <= MAX_NODES:
            raise LabError(f"--nodes must be between 1 and {MAX_NODES}")
        if any(self.home.resolve().is_relative_to(p) for p in (Path("/tmp"), Path("/dev/shm"))):
            raise LabError(f"the lab's home {self.home} must not be under /tmp or /dev/shm: each "
                           "node has its own there (set SPARKBOOK_LAB_HOME elsewhere)")
        _require("ip", "nsenter", "unshare", "dockerd", "docker", "tc", "ssh-keygen", "/usr/sbin/sshd", "netplan")
        st = self.state()
        if st and st.get("down_failed"):  # an earlier `lab down` left some of what the lab made
            say("lab: an earlier `lab down` did not finish; finishing it first")
            self.down(say=say)
            st = None
        want = stack(vllm)
        if st:
            had = st.get("vllm", DEFAULT.vllm)
            if len(st["nodes"]) != n or st.get("unwired", False) != unwired or had != want.vllm:
                raise LabError(f"a lab of {len(st['nodes'])} {'unwired ' if st.get('unwired') else ''}nodes "
                               f"with vLLM {had} is up: `sparkbook lab down` first")
            if st["faults"]:
                say(f"lab: {n} nodes up with faults applied "
                    f"({', '.join(f['kind'] + ' on ' + f['node'] for f in st['faults'])}); nothing "
                    "changed (`sparkbook lab heal` undoes them)")
                return params_file(n)
            problems = self.healthy()
            if not problems:
                for node in lab_nodes(n):  # a lab made by an older checkout gets this one's tools
                    install_tools(node)
                say(f"lab: {n} nodes already up and healthy; nothing to change")
                return params_file(n)
            say("lab: the lab is unhealthy (" + "; ".join(problems) + "); rebuilding it")
            self.down(say=say)
        host.require_free(lab_nodes(n))
        params = validate(lab_params(n), "lab parameters")
        t0 = time.monotonic()
        model_dir = ensure(params.runtime.image, say=say, st=want)
        state = {"nodes": {}, "faults": [], "made": [], "image": params.runtime.image, "unwired": unwired,
                 "vllm": want.vllm}
        try:
            self._up(lab_nodes(n), params, model_dir, state, say, seed_images)
        except BaseException:
            say("lab: start-up failed; removing what was made")
            try:
                self.down(say=lambda *_: None)
            except LabError as e:
                say(str(e))
            raise
        say(f"lab: {n} nodes up in {time.monotonic() - t0:.1f} s")
        return params_file(n)

    def _up(self, nodes: list[LabNode], params: Params, model_dir: Path, state: dict, say,
            seed: bool) -> None:
        # Each thing is recorded right after it is made (never before: a failed `ip link add` must
        # not make `down` remove a link of that name that someone else has).
        def made(kind: str, name) -> None:
            state["made"].append({"kind": kind, "name": str(name)})
            self._save(state)

        self._save(state)
        key = keygen(self.home / "id_ed25519", "sparkbook-lab")
        # /run/sparkbook-lab is the lab's own name (the image build uses it too): removed when empty
        RUN.mkdir(parents=True, exist_ok=True)
        made("path", RUN)
        # Mount points the nodes bind their own directories onto.
        models_mount = Path(params.model.path).parent
        for mp in (models_mount, Path("/root/.ssh"), NETPLAN, VARLIB):
            if not mp.exists():
                mp.mkdir(parents=True)
                made("path", mp)
        if not BASHRC.exists():
            BASHRC.touch()
            made("path", BASHRC)
        self._networks(made)
        (self.home / "nodes").mkdir(parents=True, exist_ok=True)
        made("tree", self.home / "nodes")
        servers = {}
        for node in nodes:
            self._prepare(node, nodes, params, model_dir, key, made, state["unwired"])
            launcher, init = self._start_init(node, models_mount)
            state["nodes"][node.name] = {"init_pid": init, "launcher_pid": launcher,
                                         "mgmt_ip": node.mgmt_ip}
            self._save(state)
            servers[node.name] = self._start_sshd(node, key)
        for node in nodes:
            if seed and node.role != "head":  # before the head's daemon starts: its store is still
                seed_images(nodes[0].data_root, node.data_root)
            self._start_dockerd(node, made)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(self._wait_docker, nodes))
        head = nodes[0]
        if docker(head, "image", "inspect", params.runtime.image, check=False).returncode != 0:
            raise LabError(f"the lab image {params.runtime.image} is not in the head's store")
        known = "".join(servers[n.name].known_hosts_line([n.rail_ip(0), n.rail_ip(1), n.name])
                        for n in nodes)
        (self.home / "known_hosts").write_text(known)
        for node in nodes:  # each node knows every node (unwired: none yet); SSH between them is checked
            (node.dir / "ssh" / "known_hosts").write_text("" if state["unwired"] else known)
        say(f"lab: nodes {', '.join(n.name for n in nodes)} answer on SSH and Docker; "
            f"image {params.runtime.image} on " + ("every node (seeded from the head's)" if seed else f"{head.name} only"))

    def _networks(self, made) -> None:
        """The management bridge (on this machine) and the fabric switch (its own namespace; its
        bridges go with it)."""
        sh("ip", "link", "add", MGMT_BRIDGE, "type", "bridge")
        made("link", MGMT_BRIDGE)
        sh("ip", "addr", "add", f"{MGMT_NET}.1/24", "dev", MGMT_BRIDGE)
        sh("ip", "link", "set", MGMT_BRIDGE, "up")
        sh("ip", "netns", "add", FABRIC_NS)
        made("netns", FABRIC_NS)
        for r in range(len(RAILS)):
            br = f"{PREFIX}-rail{r}"
            sh("ip", "-n", FABRIC_NS, "link", "add", br, "type", "bridge")
            sh("ip", "-n", FABRIC_NS, "link", "set", br, "mtu", str(FABRIC_MTU), "up")

    def _prepare(self, node: LabNode, nodes: list[LabNode], params: Params, model_dir: Path,
                 key: Path, made, unwired: bool) -> None:
        """The node's network namespace, links and files (the links between the node and the
        fabric switch live in their namespaces and go with them)."""
        d = node.dir
        if d.exists():
            shutil.rmtree(d)
        for sub in ("sshd", "bin", "ssh", "models", "faults", "netplan", "varlib"):
            (d / sub).mkdir(parents=True, mode=0o700 if sub == "varlib" else 0o755)
        # What the node persists of its network (`lab reboot` brings back only that)
        for name, text in netplan_files(node, unwired).items():
            (d / "netplan" / name).write_text(text)
            (d / "netplan" / name).chmod(0o600)
        ns = node.netns
        sh("ip", "netns", "add", ns)
        made("netns", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        host_if = host.host_link(node)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", MGMT_IF, "netns", ns)
        made("link", host_if)
        sh("ip", "link", "set", host_if, "master", MGMT_BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", f"{node.mgmt_ip}/24", "dev", MGMT_IF)
        sh("ip", "-n", ns, "link", "set", MGMT_IF, "up")
        for r, (ifname, _hca, _net) in enumerate(RAILS):
            sw_if = f"{PREFIX}{node.index}r{r}"
            sh("ip", "link", "add", sw_if, "netns", FABRIC_NS, "mtu", str(FABRIC_MTU), "type", "veth",
               "peer", "name", ifname, "netns", ns, "mtu", str(FABRIC_MTU))
            sh("ip", "-n", FABRIC_NS, "link", "set", sw_if, "master", f"{PREFIX}-rail{r}", "up")
            if unwired:
                sh("ip", "-n", ns, "link", "set", ifname, "mtu", str(BOOT_MTU))
            else:
                sh("ip", "-n", ns, "addr", "add", f"{node.rail_ip(r)}/24", "dev", ifname)
            sh("ip", "-n", ns, "link", "set", ifname, "up")
        # Simulated hardware: the tools on the node's PATH and the state they read.
        install_tools(node)
        # netplan's own parser and generator, applied as the node's networkd would (simnet.py)
        shutil.copyfile(Path(__file__).with_name("simnet.py"), d / "bin" / "netplan")
        (d / "bin" / "netplan").chmod(0o755)
        guid = lambda k: f"30c5:9903:00{node.index:02x}:6a1{k}"
        (d / "state.json").write_text(json.dumps({
            "node": node.name, "simulated": True, "firmware": "28.45.4028", "speed_mbps": 200000,
            "gpu": {"name": "NVIDIA GB10", "count": 1, "driver": "580.95.05", "cuda": "13.0",
                    "bus_id": "0000000F:01:00.0", "compute_cap": "12.1"},
            "nics": [{"hca": h, "netdev": n, "bus": b, "guid": guid(k)} for k, (h, n, b) in enumerate(NICS)],
        }, indent=2))
        # A node's own ~/.bashrc, as on a fresh DGX OS: the operator's (which bash reads for every
        # SSH command) stays on the operator's machine.
        (d / "bashrc").write_text("# ~/.bashrc of a sparkbook lab node\n")
        (d / "hosts").write_text("127.0.0.1\tlocalhost\n" + "".join(
            f"{n.mgmt_ip}\t{n.name}\n" for n in nodes))
        shutil.copyfile(key, d / "ssh" / "id_ed25519")
        (d / "ssh" / "id_ed25519").chmod(0o600)
        shutil.copyfile(str(key) + ".pub", d / "ssh" / "id_ed25519.pub")
        (d / "ssh" / "authorized_keys").write_text(Path(str(key) + ".pub").read_text())
        shutil.copytree(model_dir, d / "models" / Path(params.model.path).name)
        if node.role != "head":
            (d / "docker").mkdir()

    def _start_init(self, node: LabNode, models_mount: Path) -> tuple[int, int]:
        """The node's init: PID 1 of its PID namespace, holding its mount and UTS namespaces."""
        d = node.dir
        # Lab only: the nodes share this machine's kernel, so its boot ID is theirs. A boot ID of
        # the node's own, new at every start (`lab up`, `lab reboot`), stands over the kernel's,
        # as a real node's changes at each boot: verdicts that expire with a reboot read it.
        (d / "boot_id").write_text(f"{uuid.uuid4()}\n")
        script = d / "init.sh"
        script.write_text("\n".join([
            "set -e",
            f"hostname {node.name}",
            "mount -t tmpfs -o mode=1777,size=8g tmpfs /tmp",
            "mount -t tmpfs -o mode=1777,size=8g tmpfs /dev/shm",
            f"mount --bind {d / 'models'} {models_mount}",
            f"mount --bind {d / 'hosts'} /etc/hosts",
            f"mount --bind {d / 'ssh'} /root/.ssh",
            f"mount --bind {d / 'bashrc'} {BASHRC}",
            f"mount --bind {d / 'netplan'} {NETPLAN}",
            f"mount --bind {d / 'varlib'} {VARLIB}",
            f"mount --bind {d / 'boot_id'} {BOOT_ID}",
            f"touch {d / 'init.ready'}",
            "trap 'exit 0' TERM",
            # PID 1 reaps the orphans of the node; bash does so while it waits
            "while :; do sleep 3600 & wait $!; done",
        ]) + "\n")
        # the previous boot's mark goes first: seen, it would let the node's commands (netplan
        # apply, sshd) run before this init has made its mounts, reading the machine's /etc/netplan
        (d / "init.ready").unlink(missing_ok=True)
        log = open(d / "init.log", "w")
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--fork", "--pid",
             "--mount", "--uts", "--mount-proc", "--propagation", "private", "bash", str(script)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (d / "init.ready").exists():
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                if children:
                    return proc.pid, int(children[0])
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        raise LabError(f"{node.name}: the node's init did not start: {(d / 'init.log').read_text()[-500:]}")

    def _start_sshd(self, node: LabNode, key: Path) -> SshServer:
        path = ":".join([str(node.dir / "bin"), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                         "/usr/bin", "/sbin", "/bin"])
        return SshServer(
            node.dir / "sshd", 22, address=node.mgmt_ip, listen="0.0.0.0", authorized_keys=[key],
            prefix=self.enter(node),
            set_env={"DOCKER_HOST": f"unix://{node.docker_sock}", "PATH": path,
                     "SPARKBOOK_LAB_NODE": node.name, "SPARKBOOK_LAB_STATE": str(node.dir / "state.json")},
        ).start()

    def _start_dockerd(self, node: LabNode, made) -> None:
        node.run.mkdir(parents=True, exist_ok=True)
        made("tree", node.run)
        made("cgroup", node.cgroup)  # made by the daemon for its first container; free at `up`
        (node.run / "docker.pid").unlink(missing_ok=True)  # callers stop the old daemon first
        node.data_root.mkdir(parents=True, exist_ok=True)
        args = ["dockerd", "--data-root", str(node.data_root), "--exec-root", str(node.run / "exec"),
                "--pidfile", str(node.run / "docker.pid"), "--host", f"unix://{node.docker_sock}",
                "--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
                "--userland-proxy=false", "--cgroup-parent", node.cgroup]
        # Started from inside the node and left to its init, like a system service.
        self.node_sh(node, shlex.join(args) + f" >{shlex.quote(str(node.dir / 'dockerd.log'))} 2>&1 </dev/null &")

    def _wait_docker(self, node: LabNode, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.docker_sock.exists() and docker(node, "info", "--format", "{{.ID}}", check=False,
                                                    timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        log = (node.dir / "dockerd.log").read_text()[-800:] if (node.dir / "dockerd.log").exists() else ""
        raise LabError(f"{node.name}: the Docker daemon did not start in {timeout:.0f} s: {log}")

    # ------------------------------------------------------------------------------ down

    def down(self, say=print) -> list[str]:
        """Remove what the lab recorded making (lab.json), and only that: the nodes' processes,
        then the rest newest first. Every step is tried whatever fails before it; what could not
        be removed stays recorded (the next `down`, or `up`, tries it again) and one LabError at
        the end names each. Returns what was removed."""
        st = self.state()
        if st is None:
            say("lab: down; nothing was up")
            return []
        made = st["made"] if "made" in st else host.made_by_older_lab(st)
        removed, failed, left = [], [], []
        for name, info in st["nodes"].items():
            try:
                if self._stop(LabNode(int(name.rsplit("-", 1)[1])), info):
                    removed.append(f"{name}: processes")
                info["stopped"] = True
            except (OSError, LabError, subprocess.SubprocessError) as e:
                failed.append(f"{name}'s processes: {e}")
        for item in reversed(made):
            try:
                if host.remove(item):
                    removed.append(f"{item['kind']} {item['name']}")
            except (OSError, LabError, subprocess.SubprocessError) as e:
                failed.append(f"{item['kind']} {item['name']}: {e}")
                left.insert(0, item)
        if failed:
            self._save({**st, "faults": [], "made": left, "down_failed": failed})
            say(f"lab: down did not finish: removed {len(removed)} things; {len(failed)} failed")
            raise LabError("lab down could not remove: " + "; ".join(failed) + f" (still recorded in "
                           f"{self.state_file}: `sparkbook lab down` tries them again)")
        for f in ("known_hosts", "lab.json"):
            (self.home / f).unlink(missing_ok=True)
        for f in self.home.glob("lab-*.yaml"):
            f.unlink()
        say(f"lab: down (removed {len(removed)} things)")
        return removed

    def _stop(self, node: LabNode, info: dict) -> bool:
        """End every process of a node (True), or nothing when they are gone already (False)."""
        pid = info.get("init_pid")
        if info.get("stopped") or not pid or not is_init(pid, node):
            return False  # a recorded pid may belong to another process by now
        # containers first, so that Docker unmounts cleanly (the node's own daemon: all of its
        # containers are the lab's); then the node's init, which takes every process of the node
        # (sshd, dockerd, containers) with it
        try:
            ids = docker(node, "ps", "-aq", check=False, timeout=15).stdout.split()
            if ids:
                docker(node, "rm", "-f", "-v", *ids, check=False, timeout=60)
        except subprocess.TimeoutExpired:
            pass  # a hung daemon goes with the init all the same
        kill_init(node, info)
        return True

    @contextmanager
    def as_found(self, say=print) -> Iterator["Lab"]:
        """For a benchmark that reshapes the lab: at the end, also on Ctrl-C or SIGTERM, the lab as
        it was found: as many nodes up again (rebuilt if need be), or none."""
        st = self.state()
        n = len(st["nodes"]) if st and not st.get("down_failed") else 0
        unwired = bool(st and st.get("unwired"))
        vllm = (st or {}).get("vllm", DEFAULT.vllm)
        with _sigterm_as_exit():
            try:
                yield self
            finally:
                now = self.state()
                if now and (not n or len(now["nodes"]) != n or bool(now.get("unwired")) != unwired
                            or now.get("vllm", DEFAULT.vllm) != vllm):
                    self.down(say=say)
                if n:
                    self.up(n, say=say, unwired=unwired, vllm=vllm)

    # ------------------------------------------------------------------------------ status

    def status(self) -> list[dict]:
        st = self.state()
        if not st:
            return []
        rows = []
        for node in lab_nodes(len(st["nodes"])):
            alive = is_init(st["nodes"][node.name]["init_pid"], node)
            info = docker(node, "image", "inspect", "--format", "{{.Id}}", st["image"], check=False,
                          timeout=10) if alive else None
            daemon = alive and docker(node, "info", "--format", "{{.ID}}", check=False, timeout=10).returncode == 0
            rows.append({
                "node": node.name, "role": node.role, "mgmt": node.mgmt_ip,
                "reachable": alive and _port_open(node.mgmt_ip, 22),
                "docker": "up" if daemon else "down",
                "image": (info.stdout.strip()[7:19] if info and info.returncode == 0 else "absent"),
                "faults": ", ".join(f["kind"] for f in st["faults"] if f["node"] == node.name) or "-",
            })
        return rows


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM ends the program as Ctrl-C does, through every ``finally`` (exit status 143)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _require(*tools: str) -> None:
    missing = [t for t in tools if not (shutil.which(t) or Path(t).exists())]
    if missing:
        raise LabError(f"missing on this machine: {', '.join(missing)} (scripts/bootstrap installs them)")


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    with socket.socket() as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def require_up() -> None:
    """Refuse to go on when parameters name the lab but it is not up: its addresses would then
    lead nowhere on this machine."""
    if not Lab().state() or MGMT_BRIDGE not in _links():
        raise LabError("these parameters describe the local lab, which is not up: run "
                       "`sparkbook lab up` first")
