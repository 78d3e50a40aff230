"""The lab: real SSH and Docker across simulated DGX Spark nodes (vLLM and Ray across them:
test_serving); the simulated hardware against real Spark outputs; faults and healing; nothing left
after down."""

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import field_sample
from sparkbook.facts import parsers
from sparkbook.lab import FAULTS, Lab, LabError, faults, host, lab_nodes, lab_params
from sparkbook.lab.host import leftovers
from sparkbook.params import validate
from sparkbook.nodes.remote import Cluster

ROOT = Path(__file__).resolve().parents[1]


def test_two_node_lab_is_exactly_parameters_lab_yaml():
    assert lab_params(2) == yaml.safe_load((ROOT / "parameters" / "lab.yaml").read_text())


def test_bigger_labs_add_nodes_on_their_own_addresses():
    p = lab_params(8)
    assert [n["name"] for n in p["nodes"]] == [f"spark-{i}" for i in range(1, 9)]
    ips = [r["ip"] for n in p["nodes"] for r in n["rails"]]
    assert len(set(ips)) == 16 and [n["role"] for n in p["nodes"]].count("head") == 1


def run_ok(cluster, cmd, nodes=None, timeout=120):
    res = cluster.run(cmd, nodes, timeout=timeout)
    assert res.ok, {n: r.summary() for n, r in res.items()}
    return res


def test_second_up_changes_nothing(lab):
    before = lab.state()
    said = []
    lab.up(2, say=said.append)
    assert lab.state() == before and "nothing to change" in said[-1]


def test_ssh_to_every_node_with_host_keys_checked(cluster):
    res = run_ok(cluster, "hostname; echo $SPARKBOOK_LAB_NODE; ip -br addr show enp1s0f1np1")
    for name, r in res.items():
        host, lab_name, rail = r.stdout.splitlines()
        assert host == name == lab_name and "10.77.1." in rail


def test_each_node_has_its_own_docker_daemon(cluster, params):
    res = run_ok(cluster, "docker info --format '{{.Name}} {{.DockerRootDir}}'")
    names = {n: r.stdout.split()[0] for n, r in res.items()}
    roots = {r.stdout.split()[1] for r in res.values()}
    assert names == {"spark-1": "spark-1", "spark-2": "spark-2"} and len(roots) == 2


def test_each_node_has_its_own_model_processes_and_tmp(cluster, params):
    res = run_ok(cluster, f"sha256sum {shlex.quote(params.model.path)}/config.json; ps -e | wc -l; "
                          "touch /tmp/here-$(hostname); ls /tmp")
    hashes = {r.stdout.split()[0] for r in res.values()}
    assert len(hashes) == 1  # the same model on both nodes, each in its own directory
    for name, r in res.items():
        assert int(r.stdout.splitlines()[1]) < 40  # only the node's own processes
        here = [f for f in r.stdout.splitlines()[2:] if f.startswith("here-")]
        assert here == [f"here-{name}"]  # each node's /tmp is its own


def test_fabric_rails_carry_jumbo_frames_between_nodes(cluster):
    res = run_ok(cluster, "ping -c1 -W2 -M do -s 8972 10.77.1.11 && ping -c1 -W2 -M do -s 8972 10.77.2.11",
                 ["spark-2"])
    assert "1 received" in res["spark-2"].stdout


def test_simulated_tools_parse_like_real_spark_outputs(cluster):
    res = run_ok(cluster, "nvidia-smi; echo @@; nvidia-smi --query-gpu=name,driver_version,memory.total "
                          "--format=csv; echo @@; ibdev2netdev; echo @@; ibv_devinfo; echo @@; ibstat; "
                          "echo @@; ethtool enp1s0f1np1", ["spark-1"])
    r = res["spark-1"]
    assert "sparkbook lab: simulated" in r.stderr
    table, csv, ibdev, devinfo, ibstat, ethtool = r.stdout.split("@@\n")
    real = parsers.parse_nvidia_smi_table(field_sample("nvidia-smi-6.txt"))
    sim = parsers.parse_nvidia_smi_table(table)
    assert [g["name"] for g in sim["gpus"]] == [g["name"] for g in real["gpus"]] == ["NVIDIA GB10"]
    assert sim["gpus"][0]["memory"] is None and real["gpus"][0]["memory"] is None  # Not Supported
    assert sim["driver"] and "sparkbook lab: simulated" in table.splitlines()[0]
    assert parsers.parse_nvidia_smi_csv(csv) == [{"name": "NVIDIA GB10", "driver_version": sim["driver"],
                                                  "memory.total": None}]
    real_ib = parsers.parse_ibdev2netdev(field_sample("ibdev2netdev-3.txt"))  # cable in port 1
    assert parsers.parse_ibdev2netdev(ibdev) == real_ib
    real_dev = parsers.parse_ibv_devinfo(field_sample("ibv_devinfo-1.txt"))
    sim_dev = parsers.parse_ibv_devinfo(devinfo)
    assert set(sim_dev) == set(real_dev)
    assert sim_dev["rocep1s0f1"]["ports"][1]["state"] == "PORT_ACTIVE"
    assert sim_dev["rocep1s0f1"]["ports"][1]["active_mtu"] == 4096  # netdev MTU 9000
    assert sim_dev["rocep1s0f0"]["ports"][1]["state"] == "PORT_DOWN"  # no cable in port 0
    assert {k: v for k, v in sim_dev["rocep1s0f1"].items() if k != "ports" and "guid" not in k} == \
        {k: v for k, v in real_dev["rocep1s0f1"].items() if k != "ports" and "guid" not in k}
    port = parsers.parse_ibstat(ibstat)["rocep1s0f1"]["ports"][1]
    assert (port["state"], port["physical_state"], port["rate"], port["link_layer"]) == (
        "Active", "LinkUp", 200, "Ethernet")
    real_speed = parsers.parse_ethtool(field_sample("ethtool-speed-grep-200g-1.txt"))
    assert parsers.parse_ethtool(ethtool)["enp1s0f1np1"]["speed_mbps"] == \
        real_speed["enp1s0f1np1"]["speed_mbps"] == 200000


def test_inventory_notebook_on_the_lab(lab, tmp_path):
    from sparkbook.cli import main
    out = tmp_path / "run"
    assert main(["run", "-p", str(ROOT / "parameters" / "lab.yaml"), "--steps", "00", "--out", str(out)]) == 0
    rows = {r["node"]: r for r in json.loads((out / "inventory.json").read_text())}
    for name in ("spark-1", "spark-2"):
        assert (rows[name]["hostname"], rows[name]["gpus"], rows[name]["gpu_name"]) == (name, 1, "NVIDIA GB10")
        assert rows[name]["gpu_memory"].startswith("unified")  # GB10: [N/A] from nvidia-smi
    verdict = json.loads((out / "verdicts" / "00_inventory.json").read_text())
    assert verdict["status"] == "PASS"


def _observe(cluster, params, kind):
    """What the command a preflight check would use shows for each fault (on spark-2)."""
    if kind == "node-down":
        return cluster.run("true", ["spark-2"], timeout=10)["spark-2"].error is not None
    if kind == "mtu":
        out = run_ok(cluster, "ip -j link show enp1s0f1np1", ["spark-2"])["spark-2"].stdout
        mtu = json.loads(out)[0]["mtu"]
        ping = cluster.run("ping -c1 -W2 -M do -s 8972 10.77.1.12", ["spark-1"])["spark-1"]
        return mtu == 1500 and not ping.ok
    if kind == "rail-down":
        out = run_ok(cluster, "ibdev2netdev; ethtool enP2p1s0f1np1", ["spark-2"])["spark-2"].stdout
        return (not parsers.parse_ibdev2netdev(out)["roceP2p1s0f1"]["up"]
                and parsers.parse_ethtool(out)["enP2p1s0f1np1"]["speed_mbps"] is None)
    if kind == "docker-down":
        return not cluster.run("docker info", ["spark-2"])["spark-2"].ok
    if kind == "port-busy":
        out = run_ok(cluster, "ss -ltnH", ["spark-1"])["spark-1"].stdout
        return any(line.split()[3].endswith(f":{params.ports.api}") for line in out.splitlines())
    if kind == "image-drift":
        res = cluster.run(["docker", "image", "inspect", "--format", "{{.Id}}", params.runtime.image])
        return res["spark-2"].ok and res["spark-1"].stdout != res["spark-2"].stdout
    if kind == "model-drift":
        res = run_ok(cluster, f"sha256sum {shlex.quote(params.model.path)}/config.json")
        return res["spark-1"].stdout.split()[0] != res["spark-2"].stdout.split()[0]
    if kind == "slow-link":
        out = run_ok(cluster, "tc qdisc show dev enp1s0f1np1", ["spark-2"])["spark-2"].stdout
        return " tbf " in f" {out} " and "rate 200Mbit" in out
    if kind == "firewall":
        out = run_ok(cluster, "iptables -S INPUT", ["spark-2"])["spark-2"].stdout
        return f"--dport {params.ports.ray}" in out and "sparkbook-lab firewall" in out


def test_every_fault_is_made_and_undone_by_its_row_and_described():
    """One row per fault name the CLI offers (lab/nodes.py's FAULTS), each a pair: make, undo."""
    assert tuple(faults.TABLE) == FAULTS
    assert all(callable(make) and callable(undo) for make, undo in faults.TABLE.values())
    assert not [k for k in FAULTS if f"\n- {k} " not in faults.__doc__], "a fault the docstring does not describe"


@pytest.mark.parametrize("kind", ["node-down", "mtu", "rail-down", "docker-down", "port-busy",
                                  "image-drift", "model-drift", "slow-link", "firewall"])
def test_fault_is_observable_and_heal_undoes_it(lab, cluster, params, kind):
    assert not _observe(cluster, params, kind), "the fault shows before it is applied"
    rec = faults.apply(lab, kind)
    try:
        assert rec["node"] == ("spark-1" if kind == "port-busy" else "spark-2")
        assert _observe(cluster, params, kind), f"{kind} is not observable"
        assert kind in {r["faults"] for r in lab.status() if r["node"] == rec["node"]}
    finally:
        assert faults.heal(lab, kind) == [rec]
    assert not _observe(cluster, params, kind), f"heal did not undo {kind}"
    assert lab.state()["faults"] == []


def test_down_leaves_nothing_and_up_again_with_the_image_on_the_head_only(lab, params):
    lab.down(say=lambda *_: None)
    assert leftovers() == []
    lab.up(2, say=lambda *_: None)
    assert lab.healthy() == []
    res = Cluster.from_params(params).run(["docker", "image", "inspect", "--format", "{{.Id}}",
                                           params.runtime.image])
    assert res["spark-1"].ok and not res["spark-2"].ok


def test_down_leaves_links_and_namespaces_it_did_not_make(lab):
    """Named like the lab's, made by someone else: `lab down` leaves them."""
    host.sh("ip", "link", "add", "sbk-theirs", "type", "veth", "peer", "name", "sbk-theirs-p")
    host.sh("ip", "netns", "add", "sbk-theirs")
    try:
        removed = lab.down(say=lambda *_: None)
        assert removed and not [r for r in removed if "theirs" in r]
        assert sorted(leftovers()) == ["link sbk-theirs", "link sbk-theirs-p", "namespace sbk-theirs"]
    finally:
        host.sh("ip", "link", "del", "sbk-theirs", check=False)
        host.sh("ip", "netns", "del", "sbk-theirs", check=False)
        # the worker holding the serving image again, as the session's first run left it (else
        # the next serving test copies its 4 GB: about 110 s on 2 cores)
        lab.up(2, say=lambda *_: None, seed_images=True)


def test_down_finishes_past_a_busy_cgroup_and_the_next_down_ends_it(lab):
    quiet = lambda *_: None  # noqa: E731
    node = lab.nodes()[1]
    hierarchy = next(d for d in (host.CGROUP_ROOT / "pids", host.CGROUP_ROOT) if (d / "cgroup.procs").exists())
    held = hierarchy / node.cgroup / "held"  # the node's cgroup, with a process that outlives the node
    held.mkdir(parents=True, exist_ok=True)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        (held / "cgroup.procs").write_text(str(sleeper.pid))
        with pytest.raises(LabError, match=f"lab down could not remove: cgroup {node.cgroup}: .*busy"):
            lab.down(say=quiet)
        assert lab.state()["made"] == [{"kind": "cgroup", "name": node.cgroup}]
        assert [x for x in leftovers() if not x.startswith("cgroup ")] == []  # the rest is gone
    finally:
        sleeper.kill()
        sleeper.wait()
    assert f"cgroup {node.cgroup}" in lab.down(say=quiet)
    assert leftovers() == [] and lab.state() is None
    lab.up(2, say=quiet, seed_images=True)  # as above


def test_the_lab_image_declares_vllm_serve_as_its_entrypoint_like_vllm_openai(lab, params):
    """So that every lab run proves sparkbook's containers name their own program."""
    head = Cluster.from_params(params).run_on(params.head, ["docker", "image", "inspect", "--format",
                                                            "{{json .Config.Entrypoint}}", params.runtime.image])
    assert json.loads(head.stdout) == ["vllm", "serve"]


# ------------------------------------------------------------------- what the lab makes and removes

# `ip -j route show table all` and `ip -j addr show` (iproute2 6.1) on a Debian 12 development
# machine, trimmed to the fields read
HOST_ROUTES = [
    {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0", "flags": []},
    {"dst": "192.0.2.0/24", "dev": "eth0", "protocol": "kernel", "scope": "link", "prefsrc": "192.0.2.2"},
    {"type": "local", "dst": "127.0.0.0/8", "dev": "lo", "table": "local", "protocol": "kernel"},
    {"type": "local", "dst": "192.0.2.2", "dev": "eth0", "table": "local", "protocol": "kernel"},
    {"type": "broadcast", "dst": "192.0.2.255", "dev": "eth0", "table": "local", "protocol": "kernel"},
    {"dst": "fd00::/64", "dev": "eth0", "protocol": "kernel", "metric": 256},
    {"dst": "default", "gateway": "fd00::1", "dev": "eth0", "metric": 1024},
    {"type": "multicast", "dst": "ff00::/8", "dev": "eth0", "table": "local", "protocol": "kernel"},
]
HOST_ADDRS = [
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8},
                                   {"family": "inet6", "local": "::1", "prefixlen": 128}]},
    {"ifname": "ifb0", "addr_info": []},
    {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "192.0.2.2", "prefixlen": 24},
                                     {"family": "inet6", "local": "fd00::2", "prefixlen": 64}]},
]


def test_address_conflicts_name_every_route_and_address_over_the_lab_subnet():
    assert host.address_conflicts(HOST_ROUTES, HOST_ADDRS) == []
    routes = HOST_ROUTES + [
        {"dst": "10.0.0.0/8", "gateway": "192.0.2.1", "dev": "eth0"},     # broader: the lab would take a part
        {"dst": "10.77.0.7", "dev": "tun0"},                              # one host
        {"dst": "10.77.1.0/24", "dev": "br1"},                            # a rail subnet: the nodes' own
        {"dst": "10.78.0.0/16", "dev": "br2"},                            # next door
    ]
    addrs = HOST_ADDRS + [{"ifname": "vpn0", "addr_info": [{"family": "inet", "local": "10.77.0.200",
                                                             "prefixlen": 32}]},
                          {"ifname": "eth1", "addr_info": [{"family": "inet", "local": "10.76.255.1",
                                                             "prefixlen": 24}]}]
    assert host.address_conflicts(routes, addrs) == [
        "route 10.0.0.0/8 gateway 192.0.2.1 dev eth0 overlaps the lab's 10.77.0.0/24",
        "route 10.77.0.7 dev tun0 overlaps the lab's 10.77.0.0/24",
        "address 10.77.0.200/32 on vpn0 overlaps the lab's 10.77.0.0/24",
    ]


class FakeHost:
    """``sh`` for the lab's host module: the machine's links and namespaces, and the commands run."""

    def __init__(self, links=(), netns=(), routes=HOST_ROUTES, addrs=HOST_ADDRS, fail=()):
        self.links, self.netns, self.routes, self.addrs = list(links), list(netns), routes, addrs
        self.fail, self.calls = set(fail), []

    def __call__(self, *cmd, check=True, timeout=60, **kw):
        out = ""
        if cmd[:3] == ("ip", "-j", "link"):
            out = json.dumps([{"ifname": li} for li in self.links])
        elif cmd[:3] == ("ip", "netns", "list"):
            out = "".join(f"{ns} (id: {i})\n" for i, ns in enumerate(self.netns))
        elif cmd[:3] == ("ip", "-j", "route"):
            out = json.dumps(self.routes)
        elif cmd[:3] == ("ip", "-j", "addr"):
            out = json.dumps(self.addrs)
        else:
            self.calls.append(cmd)
            if cmd in self.fail:
                raise LabError(f"lab: `{' '.join(cmd)}` failed (2): Device or resource busy")
            if cmd[:3] == ("ip", "link", "del"):
                self.links.remove(cmd[3])
            elif cmd[:3] == ("ip", "netns", "del"):
                self.netns.remove(cmd[3])
        return subprocess.CompletedProcess(cmd, 0, out, "")


def test_down_removes_only_what_it_recorded_and_finishes_whatever_fails(tmp_path, monkeypatch):
    fake = FakeHost(links=["eth0", "sbk-mgmt", "sbkm1", "sbkm2", "sbk-theirs"],
                    netns=["sbk-fabric", "sbk-spark-1", "sbk-spark-2", "sbk-theirs"],
                    fail=[("ip", "link", "del", "sbkm2")])
    monkeypatch.setattr(host, "sh", fake)
    mount_point, nodes = tmp_path / "models", tmp_path / "nodes"
    mount_point.mkdir()
    (nodes / "spark-1").mkdir(parents=True)
    made = [{"kind": "path", "name": str(mount_point)}, {"kind": "link", "name": "sbk-mgmt"},
            {"kind": "netns", "name": "sbk-fabric"}, {"kind": "tree", "name": str(nodes)}]
    for i in (1, 2):
        made += [{"kind": "netns", "name": f"sbk-spark-{i}"}, {"kind": "link", "name": f"sbkm{i}"}]
    lab = Lab(tmp_path)
    lab._save({"nodes": {}, "faults": [], "image": "x", "made": made})
    with pytest.raises(LabError, match="lab down could not remove: link sbkm2: .*Device or resource busy"):
        lab.down(say=lambda *_: None)
    # every other step ran, newest first; nothing it did not record was touched
    assert fake.calls == [("ip", "link", "del", "sbkm2"), ("ip", "netns", "del", "sbk-spark-2"),
                          ("ip", "link", "del", "sbkm1"), ("ip", "netns", "del", "sbk-spark-1"),
                          ("ip", "netns", "del", "sbk-fabric"), ("ip", "link", "del", "sbk-mgmt")]
    assert fake.links == ["eth0", "sbkm2", "sbk-theirs"] and fake.netns == ["sbk-theirs"]
    assert not nodes.exists() and not mount_point.exists()
    # what failed stays recorded; the next down finishes it
    assert lab.state()["made"] == [{"kind": "link", "name": "sbkm2"}] and lab.state()["down_failed"]
    fake.fail.clear()
    assert lab.down(say=lambda *_: None) == ["link sbkm2"]
    assert lab.state() is None and fake.links == ["eth0", "sbk-theirs"]


def test_down_keeps_a_mount_point_someone_has_filled_since(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "sh", FakeHost())
    ssh_dir = tmp_path / "ssh"
    (ssh_dir / "theirs").mkdir(parents=True)
    lab = Lab(tmp_path)
    lab._save({"nodes": {}, "faults": [], "image": "x", "made": [{"kind": "path", "name": str(ssh_dir)}]})
    assert lab.down(say=lambda *_: None) == [] and (ssh_dir / "theirs").is_dir() and lab.state() is None


def test_up_refuses_on_an_address_or_name_conflict_before_making_anything(monkeypatch):
    from sparkbook.lab import lab as lab_module
    routes = HOST_ROUTES + [{"dst": "10.77.0.0/16", "dev": "wg0", "protocol": "static"}]
    monkeypatch.setattr(host, "sh", FakeHost(links=["eth0", "sbkm2"], netns=["sbk-fabric"], routes=routes))
    monkeypatch.setattr(lab_module, "_require", lambda *_: None)
    monkeypatch.setattr(lab_module.os, "geteuid", lambda: 0)
    monkeypatch.setattr(lab_module, "ensure", lambda *_a, **_k: pytest.fail("nothing may be built"))
    home = Path("/nonexistent/sparkbook-lab-test")
    with pytest.raises(LabError) as e:
        Lab(home).up(2, say=lambda *_: None)
    assert str(e.value).startswith("lab up refused, this machine already has: route 10.77.0.0/16 dev wg0 "
                                   "overlaps the lab's 10.77.0.0/24; link sbkm2 exists; network namespace "
                                   "sbk-fabric exists")
    assert not home.exists()


def test_a_lab_json_of_an_older_sparkbook_is_taken_down_by_its_fixed_names():
    made = host.made_by_older_lab({"nodes": {"spark-1": {}, "spark-2": {}}, "created": ["/models"]})
    assert {m["name"] for m in made if m["kind"] == "link"} == {"sbk-mgmt", "sbkm1", "sbkm2"}
    assert {m["name"] for m in made if m["kind"] == "netns"} == {"sbk-fabric", "sbk-spark-1", "sbk-spark-2"}
    assert {m["name"] for m in made if m["kind"] == "cgroup"} == {"sbk-spark-1", "sbk-spark-2"}
    assert made[0] == {"kind": "path", "name": "/models"}  # removed last


class CountingLab(Lab):
    """A lab whose up and down only count nodes (for ``as_found``)."""

    def __init__(self, n: int, vllm: str = "0.32.0"):
        super().__init__(Path("/nonexistent/sparkbook-lab-test"))
        self.n, self.vllm, self.calls = n, vllm, []

    def state(self):
        return {"nodes": {f"spark-{i}": {} for i in range(1, self.n + 1)}, "faults": [],
                "vllm": self.vllm} if self.n else None

    def down(self, say=print):
        self.calls.append("down")
        self.n = 0
        return []

    def up(self, n=2, say=print, unwired=False, vllm=None):
        self.vllm = vllm or "0.32.0"
        self.calls.append(f"up {n}" + (" unwired" if unwired else "") + (f" vllm {vllm}" if vllm else ""))
        self.n = n


@pytest.mark.parametrize("before", [2, 0])
def test_a_benchmark_leaves_the_lab_as_it_found_it_even_on_ctrl_c_or_sigterm(before):
    handler = signal.getsignal(signal.SIGTERM)
    for stop in (KeyboardInterrupt, "SIGTERM"):
        lab = CountingLab(before)
        with pytest.raises(KeyboardInterrupt if stop is KeyboardInterrupt else SystemExit) as e:
            with lab.as_found():
                lab.down()
                lab.up(8)
                if stop == "SIGTERM":
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)  # the signal arrives before this ends
                raise stop
        assert lab.n == before and lab.calls[2:] == (["down", "up 2 vllm 0.32.0"] if before else ["down"])
        if stop == "SIGTERM":
            assert e.value.code == 143
    assert signal.getsignal(signal.SIGTERM) == handler


def test_a_benchmark_that_changed_the_labs_vllm_brings_back_the_one_it_found():
    lab = CountingLab(2, vllm="0.17.1")
    with lab.as_found():
        lab.down()
        lab.up(2, vllm="0.32.0")
    assert lab.calls[2:] == ["down", "up 2 vllm 0.17.1"] and lab.vllm == "0.17.1"


# ------------------------------------------------------------------- a clean lab for the tests

class LitteredLab:
    """A lab whose spark-1 holds a vLLM container (listening on the API port), and maybe a vLLM
    process outside any container that survives it."""

    def __init__(self, stray=False):
        self.containers = {"spark-1": [("3f2a", "sparkbook-lab-vllm")], "spark-2": []}
        self.stray, self.calls = stray, []

    def nodes(self):
        return lab_nodes(2)

    def params(self):
        return validate(lab_params(2))

    def state(self):
        return {"nodes": {"spark-1": {}, "spark-2": {}}, "faults": []}

    def node_sh(self, node, script, check=True, timeout=60):
        serving = bool(self.containers[node.name]) or (self.stray and node.name == "spark-1")
        out = {"ps -eo pid=,args=": "    1 bash init.sh\n   40 /usr/sbin/sshd -f sshd_config\n"
                                    + ("  812 python3 -m vllm.entrypoints.openai.api_server\n" if serving else ""),
               "ss -ltnpH": "LISTEN 0 128 10.77.0.11:22 0.0.0.0:* users:((\"sshd\",pid=40,fd=3))\n"
                            + ("LISTEN 0 2048 10.77.0.11:8000 0.0.0.0:* users:((\"python3\",pid=812,fd=9))\n"
                               if serving else "")}[script]
        return subprocess.CompletedProcess(script, 0, out, "")

    def docker(self, node, *args, **kw):
        self.calls.append((node.name, *args))
        if args[:2] == ("ps", "-a"):
            assert "label=sparkbook" in args  # the lab's own daemons: every sparkbook container
            out = "".join(f"{cid} {name}\n" for cid, name in self.containers[node.name])
            return subprocess.CompletedProcess(args, 0, out, "")
        assert args[:3] == ("rm", "-f", "-v")
        self.containers[node.name] = [c for c in self.containers[node.name] if c[0] not in args[3:]]
        return subprocess.CompletedProcess(args, 0, "", "")

    def down(self, say=print):
        self.calls.append("down")
        self.stray = False
        self.containers = {"spark-1": [], "spark-2": []}

    def up(self, n=2, say=print):
        self.calls.append(f"up {n}")


@pytest.mark.parametrize("stray", [False, True])
def test_the_session_lab_is_made_clean_and_says_what_it_found(monkeypatch, stray):
    import conftest
    lab = LitteredLab(stray)
    monkeypatch.setattr(conftest, "docker", lab.docker)
    said = []
    conftest.clean_lab(lab, say=said.append, settle=0)
    assert ("spark-1", "rm", "-f", "-v", "3f2a") in lab.calls
    assert said[0].startswith("lab: found at session start, left by an earlier run: spark-1: container "
                              "sparkbook-lab-vllm, process 812 python3 -m vllm.entrypoints")
    assert "listener on api port 8000: 10.77.0.11:8000" in said[0] and "spark-2" not in said[0]
    if stray:  # a vLLM process outside any container: the lab is rebuilt, and that is said
        assert said[1].startswith("lab: still there without a container: spark-1: process 812")
        assert lab.calls[-2:] == ["down", "up 2"]
    else:
        assert len(said) == 1 and "down" not in lab.calls
    assert conftest.lab_litter(lab) == {}


def test_a_clean_lab_is_left_as_it_is(monkeypatch):
    import conftest
    lab = LitteredLab()
    lab.containers["spark-1"] = []
    monkeypatch.setattr(conftest, "docker", lab.docker)
    said = []
    conftest.clean_lab(lab, say=said.append, settle=0)
    assert said == [] and not [c for c in lab.calls if c[1] == "rm" or c in ("down", "up 2")]


def test_seeded_worker_stores_link_the_heads_image_layers_and_leave_its_containers(tmp_path):
    """seed_images (the resized test labs): a worker's Docker store holds the head's image
    metadata and every image layer as hard links (owners and modes kept), with the overlay2
    short-name links; the head's container layers and mounts stay behind; removing the worker's
    copy leaves the head's."""
    from sparkbook.lab.image import seed_images
    head, worker = tmp_path / "head", tmp_path / "worker"
    store = head / "image" / "overlay2"
    (store / "imagedb" / "content").mkdir(parents=True)
    (store / "imagedb" / "content" / "img").write_text("{}")
    (store / "repositories.json").write_text('{"Repositories": {}}')
    (store / "layerdb" / "mounts" / "container1").mkdir(parents=True)
    chain = store / "layerdb" / "sha256" / "chain1"
    chain.mkdir(parents=True)
    (chain / "cache-id").write_text("layer1")
    layer = head / "overlay2" / "layer1"
    (layer / "diff" / "etc").mkdir(parents=True)
    (layer / "diff" / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.chown(layer / "diff" / "etc", 0, 8)
    (layer / "link").write_text("SHORT1\n")
    (head / "overlay2" / "container1-rw" / "diff").mkdir(parents=True)
    (worker).mkdir()
    seed_images(head, worker)
    copied = worker / "overlay2" / "layer1" / "diff" / "etc" / "passwd"
    assert copied.stat().st_ino == (layer / "diff" / "etc" / "passwd").stat().st_ino
    assert (worker / "overlay2" / "layer1" / "diff" / "etc").stat().st_gid == 8
    assert os.readlink(worker / "overlay2" / "l" / "SHORT1") == "../layer1/diff"
    assert (worker / "image" / "overlay2" / "layerdb" / "sha256" / "chain1" / "cache-id").read_text() == "layer1"
    assert (worker / "image" / "overlay2" / "imagedb" / "content" / "img").exists()
    assert (worker / "image" / "overlay2" / "repositories.json").exists()
    assert not (worker / "overlay2" / "container1-rw").exists()
    assert not (worker / "image" / "overlay2" / "layerdb" / "mounts").exists()
    copied.unlink()
    assert (layer / "diff" / "etc" / "passwd").read_text().startswith("root:")
