"""The lab's nodes and names: where each node lives on this machine, its addresses, its Docker
daemon, and the parameters of an N-node lab. Used by the lab (lab.py), its image build (image.py)
and its faults; imports nothing else of the lab."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..book.errors import SparkbookError
from ..book.project import project_root

LAB_HOME = Path(os.environ.get("SPARKBOOK_LAB_HOME", "~/.cache/sparkbook/lab")).expanduser()
RUN = Path("/run/sparkbook-lab")
PREFIX = "sbk"  # namespaces, links and cgroups the lab makes start with this
MGMT_BRIDGE, MGMT_NET, MGMT_IF = f"{PREFIX}-mgmt", "10.77.0", "enP7s7"
FABRIC_NS = f"{PREFIX}-fabric"
# The rails of a Spark whose QSFP cable sits in the second port: (netdev, HCA, lab subnet)
RAILS = (("enp1s0f1np1", "rocep1s0f1", "10.77.1"), ("enP2p1s0f1np1", "roceP2p1s0f1", "10.77.2"))
# All four CX-7 functions of a Spark, as ibdev2netdev lists them; only the f1 pair is cabled here.
NICS = (("rocep1s0f0", "enp1s0f0np0", "0000:01:00.0"), ("rocep1s0f1", "enp1s0f1np1", "0000:01:00.1"),
        ("roceP2p1s0f0", "enP2p1s0f0np0", "0002:01:00.0"), ("roceP2p1s0f1", "enP2p1s0f1np1", "0002:01:00.1"))
FABRIC_MTU = 9000
BOOT_MTU = 1500  # what a NIC comes up with when nothing persists another
NETPLAN = Path("/etc/netplan")  # each node binds its own folder here (its persisted network)
VARLIB = Path("/var/lib/sparkbook")  # ... and here: sparkbook's fabric backups, kept across reboots
BASHRC = Path("/root/.bashrc")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # ... and here: a boot ID of its own (see Lab._start_init)
MAX_NODES = 32
FAULTS = ("node-down", "mtu", "rail-down", "docker-down", "port-busy", "image-drift",
          "model-drift", "slow-link", "stall", "spin", "compile", "firewall", "stale", "clock", "disk",
          "throttle", "fec", "cpu-quota", "dhcp", "twin", "mgmt-cut", "slow-cable", "link-errors", "xid",
          "shard-corrupt")
SIMULATED_TOOLS = ("nvidia-smi", "ibdev2netdev", "ibstat", "ibv_devinfo", "ethtool", "show_gids")
PERFTEST_TOOLS = ("ib_write_bw", "ib_write_lat")  # simperf.py: a real stream over the rail
HOST_TOOLS = ("date", "df", "nmcli", "dmesg")  # simhost.py: linked only while a fault needs one
TEMPLATE = project_root() / "parameters" / "lab.yaml"


class LabError(SparkbookError):
    pass


def sh(*cmd: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Run a command on this machine; a failure says the command and what it printed."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise LabError(f"lab: `{' '.join(cmd)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}")
    return r


@dataclass(frozen=True)
class LabNode:
    index: int  # 1-based

    @property
    def name(self) -> str:
        return f"spark-{self.index}"

    @property
    def role(self) -> str:
        return "head" if self.index == 1 else "worker"

    @property
    def mgmt_ip(self) -> str:
        return f"{MGMT_NET}.{10 + self.index}"

    def rail_ip(self, r: int) -> str:
        return f"{RAILS[r][2]}.{10 + self.index}"

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def dir(self) -> Path:
        return LAB_HOME / "nodes" / self.name

    @property
    def run(self) -> Path:
        return RUN / self.name

    @property
    def docker_sock(self) -> Path:
        return self.run / "docker.sock"

    @property
    def data_root(self) -> Path:
        # The head keeps its images across up/down: the lab image is built into it once.
        return LAB_HOME / "docker-head" if self.role == "head" else self.dir / "docker"

    @property
    def cgroup(self) -> str:
        return f"{PREFIX}-{self.name}"


def netplan_files(node: LabNode, unwired: bool) -> dict[str, str]:
    """A lab node's /etc/netplan at `lab up`: its management address, as an installer leaves it,
    and, unless the lab is unwired, both rails at MTU 9000, as an owner who configured the fabric
    by hand leaves them (mode 600, as netplan wants them)."""
    def netplan(ethernets: dict) -> str:
        return yaml.safe_dump({"network": {"version": 2, "ethernets": ethernets}}, sort_keys=False)
    files = {"01-lab-management.yaml": netplan({MGMT_IF: {"addresses": [f"{node.mgmt_ip}/24"]}})}
    if not unwired:
        files["60-lab-fabric.yaml"] = netplan({
            ifname: {"mtu": FABRIC_MTU, "addresses": [f"{node.rail_ip(r)}/24"]}
            for r, (ifname, _hca, _net) in enumerate(RAILS)})
    return files


def lab_nodes(n: int) -> list[LabNode]:
    return [LabNode(i) for i in range(1, n + 1)]


def lab_params(n: int = 2) -> dict:
    """The parameters of an N-node lab: parameters/lab.yaml with N generated nodes. With N=2 this is
    exactly parameters/lab.yaml (a test checks it)."""
    data = yaml.safe_load(TEMPLATE.read_text())
    first = data["nodes"][0]
    nodes = []
    for node in lab_nodes(n):
        nodes.append({**copy.deepcopy(first), "name": node.name, "host": node.mgmt_ip, "role": node.role,
                      "rails": [{**first["rails"][r], "ip": node.rail_ip(r)} for r in range(len(RAILS))]})
    data["nodes"] = nodes
    if n != 2:
        data["description"] = f"Local lab, {n} simulated DGX Spark node{'s' if n > 1 else ''}, tiny Qwen3 model, " + serving_layout(data, n)
    return data


def serving_layout(data: dict, n: int) -> str:
    """Serving on an N-node lab, set in ``data``: the tiny model (2 layers, 2 KV heads) splits at
    most 2 ways by tensor and 2 by pipeline, so at most 4 nodes serve (the first ones); 3 nodes
    serve on 2. Returns the layout in words."""
    k = 1 << (min(n, 4).bit_length() - 1)
    tp, pp = min(2, k), max(1, k // 2)
    s = data["serving"]
    s["tensor_parallel_size"], s["pipeline_parallel_size"] = tp, pp
    if k < n:
        s["nodes"] = [node["name"] for node in data["nodes"][:k]]
    return (f"TP {tp} x PP {pp} over the Ray executor"
            + (f" on {k} of the {n} nodes" if k < n else ""))


def params_file(n: int) -> Path:
    """The parameters file for an N-node lab: parameters/lab.yaml for 2, else a generated one."""
    if n == 2:
        return TEMPLATE
    path = LAB_HOME / f"lab-{n}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Generated by `sparkbook lab up --nodes {n}` from parameters/lab.yaml.\n"
                    + yaml.safe_dump(lab_params(n), sort_keys=False))
    return path


def docker_at(sock: Path, *args: str, check: bool = True, timeout: float = 120,
              **kw) -> subprocess.CompletedProcess:
    """The docker CLI against the daemon listening on ``sock``."""
    return sh("docker", "--host", f"unix://{sock}", *args, check=check, timeout=timeout, **kw)


def docker(node: LabNode, *args: str, **kw) -> subprocess.CompletedProcess:
    """The docker CLI against a node's own daemon, from this machine."""
    return docker_at(node.docker_sock, *args, **kw)


def running_nodes(home: Path = LAB_HOME) -> list[LabNode]:
    """The nodes of the lab that is up (its lab.json), or none (also when a `lab down` did not
    finish: the file then records only what is left to remove)."""
    try:
        state = json.loads((home / "lab.json").read_text())
    except (OSError, ValueError):
        return []
    return [] if state.get("down_failed") else lab_nodes(len(state["nodes"]))


def install_tools(node: LabNode) -> None:
    """The simulated hardware tools on the node's PATH (its ``bin/``): simhw.py's and simperf.py's
    (simhost.py's are linked by the faults that need them),
    each a copy in the node's folder (the checkout may sit where the node does not see it: under
    /tmp, which is the node's own), each tool a link to its program. Idempotent."""
    bin_dir = node.dir / "bin"
    for program, tools in (("simhw.py", SIMULATED_TOOLS), ("simperf.py", PERFTEST_TOOLS), ("simhost.py", ())):
        fresh = bin_dir / f".{program}.new"
        shutil.copyfile(Path(__file__).with_name(program), fresh)
        fresh.chmod(0o755)
        fresh.replace(bin_dir / program)
        for tool in tools:
            if not (bin_dir / tool).is_symlink():
                (bin_dir / tool).symlink_to(bin_dir / program)
