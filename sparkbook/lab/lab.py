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
    lab.json                  what is up: nodes, init pids, faults
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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from ..params import Params, validate
from ..sshd import SshServer, keygen
from .image import ensure
from .nodes import (BASHRC, FABRIC_MTU, FABRIC_NS, LAB_HOME, MAX_NODES, MGMT_BRIDGE, MGMT_IF, MGMT_NET,
                    NICS, PREFIX, RAILS, RUN, SIMULATED_TOOLS, LabError, LabNode, docker, lab_nodes,
                    lab_params, params_file, sh)

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
            if not _is_init(pid, node):
                problems.append(f"{node.name}: init process {pid} is gone")
                continue
            if not _port_open(node.mgmt_ip, 22):
                problems.append(f"{node.name}: sshd does not answer on {node.mgmt_ip}:22")
            if docker(node, "info", "--format", "{{.ID}}", check=False, timeout=10).returncode != 0:
                problems.append(f"{node.name}: Docker daemon does not answer")
        return problems

    def up(self, n: int = 2, say=print) -> Path:
        """Build the lab (idempotent); returns its parameters file."""
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, sshd, dockerd)")
        if not 1 <= n <= MAX_NODES:
            raise LabError(f"--nodes must be between 1 and {MAX_NODES}")
        if any(self.home.resolve().is_relative_to(p) for p in (Path("/tmp"), Path("/dev/shm"))):
            raise LabError(f"the lab's home {self.home} must not be under /tmp or /dev/shm: each "
                           "node has its own there (set SPARKBOOK_LAB_HOME elsewhere)")
        _require("ip", "nsenter", "unshare", "dockerd", "docker", "tc", "ssh-keygen", "/usr/sbin/sshd")
        st = self.state()
        if st:
            if len(st["nodes"]) != n:
                raise LabError(f"a lab of {len(st['nodes'])} nodes is up: `sparkbook lab down` first")
            if st["faults"]:
                say(f"lab: {n} nodes up with faults applied "
                    f"({', '.join(f['kind'] + ' on ' + f['node'] for f in st['faults'])}); nothing "
                    "changed (`sparkbook lab heal` undoes them)")
                return params_file(n)
            problems = self.healthy()
            if not problems:
                say(f"lab: {n} nodes already up and healthy; nothing to change")
                return params_file(n)
            say("lab: the lab is unhealthy (" + "; ".join(problems) + "); rebuilding it")
            self.down(say=say)
        params = validate(lab_params(n), "lab parameters")
        t0 = time.monotonic()
        model_dir = ensure(params.runtime.image, say=say)
        try:
            self._up(lab_nodes(n), params, model_dir, say)
        except BaseException:
            say("lab: start-up failed; removing what was made")
            self.down(say=lambda *_: None)
            raise
        say(f"lab: {n} nodes up in {time.monotonic() - t0:.1f} s")
        return params_file(n)

    def _up(self, nodes: list[LabNode], params: Params, model_dir: Path, say) -> None:
        state = {"nodes": {}, "faults": [], "created": [], "image": params.runtime.image}
        self._save(state)  # from here on, `down` knows what to remove
        key = keygen(self.home / "id_ed25519", "sparkbook-lab")
        RUN.mkdir(parents=True, exist_ok=True)
        # Mount points the nodes bind their own directories onto.
        models_mount = Path(params.model.path).parent
        for mp in (models_mount, Path("/root/.ssh")):
            if not mp.exists():
                mp.mkdir(parents=True)
                state["created"].append(str(mp))
        if not BASHRC.exists():
            BASHRC.touch()
            state["created"].append(str(BASHRC))
        self._save(state)
        self._networks()
        servers = {}
        for node in nodes:
            self._prepare(node, nodes, params, model_dir, key)
            launcher, init = self._start_init(node, models_mount)
            state["nodes"][node.name] = {"init_pid": init, "launcher_pid": launcher,
                                         "mgmt_ip": node.mgmt_ip}
            self._save(state)
            servers[node.name] = self._start_sshd(node, key)
            self._start_dockerd(node)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(self._wait_docker, nodes))
        head = nodes[0]
        if docker(head, "image", "inspect", params.runtime.image, check=False).returncode != 0:
            raise LabError(f"the lab image {params.runtime.image} is not in the head's store")
        known = "".join(servers[n.name].known_hosts_line([n.rail_ip(0), n.rail_ip(1), n.name])
                        for n in nodes)
        (self.home / "known_hosts").write_text(known)
        for node in nodes:  # each node knows every node: head-to-worker SSH is checked too
            (node.dir / "ssh" / "known_hosts").write_text(known)
        say(f"lab: nodes {', '.join(n.name for n in nodes)} answer on SSH and Docker; "
            f"image {params.runtime.image} on {head.name} only")

    def _networks(self) -> None:
        """The management bridge (on this machine) and the fabric switch (its own namespace)."""
        if sh("ip", "link", "show", MGMT_BRIDGE, check=False).returncode != 0:
            sh("ip", "link", "add", MGMT_BRIDGE, "type", "bridge")
            sh("ip", "addr", "add", f"{MGMT_NET}.1/24", "dev", MGMT_BRIDGE)
            sh("ip", "link", "set", MGMT_BRIDGE, "up")
        if FABRIC_NS not in _netns():
            sh("ip", "netns", "add", FABRIC_NS)
            for r in range(len(RAILS)):
                br = f"{PREFIX}-rail{r}"
                sh("ip", "-n", FABRIC_NS, "link", "add", br, "type", "bridge")
                sh("ip", "-n", FABRIC_NS, "link", "set", br, "mtu", str(FABRIC_MTU), "up")

    def _prepare(self, node: LabNode, nodes: list[LabNode], params: Params, model_dir: Path,
                 key: Path) -> None:
        """The node's network namespace, links and files."""
        d = node.dir
        if d.exists():
            shutil.rmtree(d)
        for sub in ("sshd", "bin", "ssh", "models", "faults"):
            (d / sub).mkdir(parents=True)
        ns = node.netns
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        host_if = f"{PREFIX}m{node.index}"
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", MGMT_IF, "netns", ns)
        sh("ip", "link", "set", host_if, "master", MGMT_BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", f"{node.mgmt_ip}/24", "dev", MGMT_IF)
        sh("ip", "-n", ns, "link", "set", MGMT_IF, "up")
        for r, (ifname, _hca, _net) in enumerate(RAILS):
            sw_if = f"{PREFIX}{node.index}r{r}"
            sh("ip", "link", "add", sw_if, "netns", FABRIC_NS, "mtu", str(FABRIC_MTU), "type", "veth",
               "peer", "name", ifname, "netns", ns, "mtu", str(FABRIC_MTU))
            sh("ip", "-n", FABRIC_NS, "link", "set", sw_if, "master", f"{PREFIX}-rail{r}", "up")
            sh("ip", "-n", ns, "addr", "add", f"{node.rail_ip(r)}/24", "dev", ifname)
            sh("ip", "-n", ns, "link", "set", ifname, "up")
        # Simulated hardware: the tools on the node's PATH and the state they read.
        # A copy in the node's folder: the checkout may sit where the node does not see it (under
        # /tmp, which is the node's own).
        simhw = d / "bin" / "simhw.py"
        shutil.copyfile(Path(__file__).with_name("simhw.py"), simhw)
        simhw.chmod(0o755)
        for tool in SIMULATED_TOOLS:
            (d / "bin" / tool).symlink_to(simhw)
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
            f"touch {d / 'init.ready'}",
            "trap 'exit 0' TERM",
            # PID 1 reaps the orphans of the node; bash does so while it waits
            "while :; do sleep 3600 & wait $!; done",
        ]) + "\n")
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

    def _start_dockerd(self, node: LabNode) -> None:
        node.run.mkdir(parents=True, exist_ok=True)
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
        """Remove everything the lab made; returns what was removed."""
        st = self.state() or {"nodes": {}, "created": []}
        removed = []
        for name, info in st["nodes"].items():
            node = LabNode(int(name.rsplit("-", 1)[1]))
            pid = info.get("init_pid")
            if pid and _is_init(pid, node):  # a recorded pid may belong to another process by now
                # containers first, so that Docker unmounts cleanly; then the node's init, which
                # takes every process of the node (sshd, dockerd, containers) with it
                if node.docker_sock.exists():
                    ids = docker(node, "ps", "-aq", check=False, timeout=15).stdout.split()
                    if ids:
                        docker(node, "rm", "-f", "-v", *ids, check=False, timeout=60)
                os.kill(pid, signal.SIGKILL)
                removed.append(f"{name}: processes")
                for p in (pid, info.get("launcher_pid")):
                    if p:
                        _wait_gone(p)
        for ns in _netns():
            if ns.startswith(f"{PREFIX}-"):
                sh("ip", "netns", "del", ns, check=False)
                removed.append(f"namespace {ns}")
        for link in _links():
            if link.startswith(PREFIX):
                sh("ip", "link", "del", link, check=False)
                removed.append(f"link {link}")
        for ctrl in Path("/sys/fs/cgroup").glob("*"):
            for cg in sorted(ctrl.glob(f"{PREFIX}-*"), reverse=True):
                for sub in sorted(cg.rglob("*"), key=lambda p: -len(p.parts)):
                    if sub.is_dir():
                        sub.rmdir()
                cg.rmdir()
        if RUN.exists():
            shutil.rmtree(RUN, ignore_errors=True)
            removed.append(str(RUN))
        nodes_dir = self.home / "nodes"
        if nodes_dir.exists():
            shutil.rmtree(nodes_dir, ignore_errors=True)
            removed.append(str(nodes_dir))
        for path in reversed(st.get("created", [])):
            p = Path(path)
            try:
                p.unlink() if p.is_file() and p.stat().st_size == 0 else p.rmdir()
                removed.append(path)
            except OSError:
                pass
        for f in ("known_hosts", "lab.json"):
            (self.home / f).unlink(missing_ok=True)
        for f in self.home.glob("lab-*.yaml"):
            f.unlink()
        say("lab: down" + (f" (removed {len(removed)} things)" if removed else "; nothing was up"))
        return removed

    # ------------------------------------------------------------------------------ status

    def status(self) -> list[dict]:
        st = self.state()
        if not st:
            return []
        rows = []
        for node in lab_nodes(len(st["nodes"])):
            alive = _is_init(st["nodes"][node.name]["init_pid"], node)
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


def _require(*tools: str) -> None:
    missing = [t for t in tools if not (shutil.which(t) or Path(t).exists())]
    if missing:
        raise LabError(f"missing on this machine: {', '.join(missing)} (scripts/bootstrap installs them)")


def _netns() -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = sh("ip", "-j", "link", "show", check=False).stdout
    return [li["ifname"] for li in json.loads(out or "[]")]


def _port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    with socket.socket() as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def _is_init(pid: int, node: LabNode) -> bool:
    """Whether ``pid`` is still this node's init (and not a process that reuses the number)."""
    try:
        return str(node.dir / "init.sh") in (Path(f"/proc/{pid}/cmdline").read_bytes()
                                             .replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not; one of ours is reaped here)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def require_up() -> None:
    """Refuse to go on when parameters name the lab but it is not up: its addresses would then
    lead nowhere on this machine."""
    if not Lab().state() or MGMT_BRIDGE not in _links():
        raise LabError("these parameters describe the local lab, which is not up: run "
                       "`sparkbook lab up` first")


def leftovers() -> list[str]:
    """Anything of a lab still on this machine: namespaces, links, processes, mounts, listeners,
    cgroups, run files. Empty after `lab down`."""
    found = [f"namespace {ns}" for ns in _netns() if ns.startswith(f"{PREFIX}-")]
    found += [f"link {li}" for li in _links() if li.startswith(PREFIX)]
    marks = (str(LAB_HOME / "nodes"), str(LAB_HOME / "docker-head"), str(RUN))
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in marks):
            found.append(f"process {proc.name}: {cmd[:120]}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if any(m in line for m in marks):
            found.append(f"mount {line.split()[4]}")
    listen = sh("ss", "-ltnH", check=False).stdout
    found += [f"listener {ln.split()[3]}" for ln in listen.splitlines() if f" {MGMT_NET}." in f" {ln.split()[3]}"]
    found += [f"cgroup {cg}" for cg in Path("/sys/fs/cgroup").glob(f"*/{PREFIX}-*")]
    if RUN.exists():
        found.append(str(RUN))
    if (LAB_HOME / "nodes").exists():
        found.append(str(LAB_HOME / "nodes"))
    return found
