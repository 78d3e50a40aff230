"""The lab: real SSH and Docker across simulated DGX Spark nodes (vLLM and Ray across them:
test_serving); the simulated hardware against real Spark outputs; faults and healing; nothing left
after down."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from conftest import field_sample
from sparkbook import parsers
from sparkbook.lab import faults
from sparkbook.lab import lab_params
from sparkbook.lab.lab import leftovers
from sparkbook.remote import Cluster

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


def test_the_lab_image_declares_vllm_serve_as_its_entrypoint_like_vllm_openai(lab, params):
    """So that every lab run proves sparkbook's containers name their own program."""
    head = Cluster.from_params(params).run_on(params.head, ["docker", "image", "inspect", "--format",
                                                            "{{json .Config.Entrypoint}}", params.runtime.image])
    assert json.loads(head.stdout) == ["vllm", "serve"]
