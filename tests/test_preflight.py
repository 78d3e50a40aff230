"""Preflight: what each node is asked (values as arguments), a report parsed from real DGX Spark
outputs and its checks, the scripts and the step on this machine, the CLI; and on the lab: healthy
passes, each fault fails the right check on the right node with a remedy, a healed lab passes
again."""

import json
from pathlib import Path

import pytest
import yaml

import sparkbook as sb
from conftest import field_sample
from sparkbook import preflight
from sparkbook.cli import main
from sparkbook.lab import faults
from sparkbook.params import validate
from sparkbook.preflight.collect import STALE, node_bundle, parse
from sparkbook.remote import Cluster
from sparkbook.steps import preflight as step
from sparkbook.verdict import FAIL

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
LOCALHOST = ROOT / "parameters" / "localhost.yaml"


def lab_params(**model):
    data = yaml.safe_load(LAB.read_text())
    data["model"].update(model)
    return validate(data)


def checked(params, pf):
    return {(c.check, c.node): c for c in step.checks(params, pf)}


# ------------------------------------------------------------------------------- without the lab

def test_each_node_gets_one_bundle_its_values_as_arguments():
    path = "/models/x; touch /tmp/pwned"
    params = lab_params(path=path)
    head, worker = (node_bundle(params, n) for n in params.nodes)
    assert [s for s, _ in head.parts] == ["inventory", "hardware", "ping", "in-use", "runtime", "model",
                                          "peers-ssh"]
    assert [s for s, _ in worker.parts] == ["inventory", "hardware", "ping", "in-use", "runtime", "model"]
    part = dict(head.parts)
    assert part["hardware"].args == ("enp1s0f1np1", "enP2p1s0f1np1")
    # each rail to the peer's same rail, MTU 9000 less the IPv4 and ICMP headers
    assert part["ping"].args == ("8972", "enp1s0f1np1", "10.77.1.12", "enP2p1s0f1np1", "10.77.2.12")
    assert part["in-use"].args == (STALE,)
    assert part["runtime"].args == ("docker", "sparkbook-lab/vllm-cpu:latest")
    assert part["model"].args == (path, "config")
    name, target, sep, ssh, *options = part["peers-ssh"].args
    assert (name, target, sep, ssh) == ("spark-2", "root@10.77.1.12", "--", "ssh") and "BatchMode=yes" in options
    for _, s in head.parts + worker.parts:
        assert not [v for v in (path, "sparkbook-lab", "10.77.", "enp1s0f1np1", "spark-2") if v in s.text], s.name
    assert str(part["model"]).startswith("bash sparkbook/scripts/model_manifest.sh '/models/x; touch")


def spark_output() -> str:
    """A DGX Spark's answer to its bundle, from real outputs (../shared/field-samples)."""
    links = [{"ifname": "enp1s0f1np1", "mtu": 9000, "addr_info": [
                 {"family": "inet", "local": "10.77.1.11", "prefixlen": 24}]},
             {"ifname": "enP2p1s0f1np1", "mtu": 1500, "addr_info": [
                 {"family": "inet", "local": "10.77.2.11", "prefixlen": 24}]}]
    return "\n".join([
        "@@ inventory", "@@ facts", "hostname=spark-1", "os=Ubuntu 24.04.3 LTS", "kernel=6.11.0-1016-nvidia",
        "arch=aarch64", "cpus=20", "mem_total_kb=125524048", "mem_available_kb=119000000",
        "model_disk_free_kb=3000000000", "docker_version=28.3.3",
        'docker_runtimes={"nvidia":{},"runc":{}}',
        "@@ gpu", "name, driver_version, memory.total [MiB]", "NVIDIA GB10, 580.95.05, [N/A]",
        "@@ hardware", "@@ smi", field_sample("nvidia-smi-1.txt"),
        "@@ ibdev2netdev", field_sample("ibdev2netdev-3.txt"),
        "@@ ibv_devinfo", field_sample("ibv_devinfo-1.txt"),
        "@@ ethtool enp1s0f1np1", field_sample("ethtool-speed-grep-200g-1.txt"),
        "@@ links", json.dumps(links),
        "@@ ping", "enp1s0f1np1 10.77.1.12 0", "enP2p1s0f1np1 10.77.2.12 1",
        "@@ in-use", "@@ listeners", "LISTEN 0      4096   0.0.0.0:8000   0.0.0.0:*    users:((\"python3\",pid=9,fd=3))",
        "@@ processes", "  577729 VLLM::EngineCore",
        "@@ runtime", "@@ containers", "@@ image", "sha256:" + "ab" * 32,
        "@@ model", "5\t-\tconfig.json", "#config.json\t" + "0" * 64,
        "@@ peers-ssh", "spark-2 root@10.77.1.12 0",
    ])


def test_a_spark_report_and_its_checks():
    params = lab_params()
    report = parse(spark_output())
    assert report["facts"]["gpu_name"] == "NVIDIA GB10" and report["smi"]["driver"].startswith("580.")
    assert report["ibdev2netdev"]["rocep1s0f1"] == {"port": 1, "netdev": "enp1s0f1np1", "up": True}
    assert report["ibstat"] is None and report["ibv_devinfo"]["rocep1s0f1"]["ports"][1]["state"] == "PORT_ACTIVE"
    assert report["ethtool"]["enP2p1s0f1np1"] == {"speed_mbps": 200000, "link": None}
    assert report["ping"][1] == {"interface": "enP2p1s0f1np1", "peer": "10.77.2.12", "ok": False}
    assert report["processes"] == ["577729 VLLM::EngineCore"] and report["peers_ssh"] == {
        "spark-2": ("root@10.77.1.12", True)}
    assert report["model"] == {"config.json": {"size": 5, "sha256": "0" * 64}} and report["skew_s"] is None

    pf = preflight.Preflight({"spark-1": report}, {"spark-2": "ssh root@10.77.0.12: cannot connect"},
                             {"spark-1": "head", "spark-2": "worker"})
    c = checked(params, pf)
    status = {k: v.status for k, v in c.items()}
    assert status[("ssh", "spark-2")] == FAIL and status[("node checks", "spark-2")] == "SKIP"
    assert status[("ssh head→worker", "spark-2")] == "PASS"
    assert status[("gpu", "spark-1")] == "PASS" and "unified memory" in c[("memory", "spark-1")].observed
    assert status[("stale processes", "spark-1")] == FAIL
    assert "VLLM::EngineCore 89093MiB" in c[("stale processes", "spark-1")].observed
    assert status[("rail mtu", "spark-1")] == FAIL and "mtu 1500" in c[("rail mtu", "spark-1")].observed
    assert status[("path mtu", "spark-1")] == FAIL and status[("ports free", "spark-1")] == FAIL
    assert "api 8000: 0.0.0.0:8000" in c[("ports free", "spark-1")].observed
    assert status[("image", "spark-1")] == "PASS" and status[("model", "spark-1")] == "PASS"
    assert status[("docker", "spark-1")] == "PASS" and status[("hf token", "local")] == "SKIP"
    assert not any(k[1] == "spark-2" for k in c if k[0] not in ("ssh", "ssh head→worker", "node checks"))
    # the first rows, in the verdict's order
    assert [k[0] for k in c][:4] == ["ssh", "ssh", "ssh head→worker", "same os"]
    for check in c.values():
        assert check.status != FAIL or check.remedy, check


def test_a_port_down_names_its_interface_in_the_remedy():
    params = lab_params()
    report = parse(spark_output().replace("PORT_ACTIVE (4)", "PORT_DOWN (1)"))
    rows = [c for c in step.checks(params, preflight.Preflight({"spark-1": report}, {}, {}))
            if c.check == "rail port"]
    assert [c.remedy.split("`")[1] for c in rows] == ["ip link set enp1s0f1np1 up", "ip link set enP2p1s0f1np1 up"]
    assert all(c.status == FAIL for c in rows)


def test_the_scripts_on_this_machine():
    """The bundle as two nodes run it, both this machine, their rails on the loopback."""
    data = yaml.safe_load(LOCALHOST.read_text())
    data["nodes"] = [{"name": f"here-{i}", "host": "localhost", "local": True, "role": role,
                      "rails": [{"interface": "lo", "ip": f"127.0.0.{i}", "prefix": 8}]}
                     for i, role in ((1, "head"), (2, "worker"))]
    data["expectations"]["mtu"] = 1500
    params = validate(data)
    pf = preflight.gather(params, Cluster.from_params(params))
    assert set(pf.nodes) == {"here-1", "here-2"} and not pf.errors
    here = pf.nodes["here-1"]
    assert here["facts"]["hostname"] and here["links"]["lo"]["mtu"] > 0
    assert here["ping"] == [{"interface": "lo", "peer": "127.0.0.2", "ok": True}]
    assert set(here["peers_ssh"]) == {"here-2"}
    assert pf.nodes["here-2"]["peers_ssh"] == {} and abs(here["skew_s"]) < 5
    assert here["model"] is None  # /models/none
    path_mtu = [c for c in step.checks(params, pf) if c.check == "path mtu"]
    assert [(c.node, c.status) for c in path_mtu] == [("here-1", "PASS"), ("here-2", "PASS")]


def test_the_step_and_the_cli_on_this_machine(tmp_path, capsys):
    """01 against parameters/localhost.yaml (this machine, no SSH): its file, its table, its
    verdict; `sparkbook preflight` exits 1 (no model at /models/none)."""
    ctx = sb.notebook.start({"params_file": str(LOCALHOST), "run_dir": str(tmp_path)}, step, quiet=True)
    outcome = ctx.run()
    saved = json.loads((tmp_path / "preflight.json").read_text())
    assert list(saved) == ["this-machine"] and set(saved["this-machine"]) == set(preflight.NodeReport.__annotations__)
    assert step.table(outcome).rows[0][:3] == ["this-machine", "head", True]
    verdict = ctx.verdict(outcome)
    assert verdict.title == "01 preflight" and ("model", "this-machine") in {(c.check, c.node) for c in verdict.failures}
    assert main(["preflight", "-p", str(LOCALHOST)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("01 preflight: FAIL") and "FAIL model on this-machine: /models/none absent" in out


# ------------------------------------------------------------------------------------ on the lab

def failures(params):
    pf = preflight.gather(params, Cluster.from_params(params))
    return {(c.check, c.node): c for c in preflight.checks(params, pf) if c.status == FAIL}


def test_healthy_lab_passes_from_the_cli(lab, capsys):
    assert main(["preflight", "-p", str(LAB)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("01 preflight: WARN") or out.startswith("01 preflight: PASS")
    assert "path mtu" in out and "FAIL" not in out


# fault -> the checks that must fail, on the node the fault hits
EXPECTED = {
    # the peers' path-MTU pings towards the broken node fail too: both directions are checked
    "node-down": {("ssh", "spark-2"), ("ssh head→worker", "spark-2"), ("path mtu", "spark-1")},
    "mtu": {("rail mtu", "spark-2"), ("path mtu", "spark-2"), ("path mtu", "spark-1")},
    "rail-down": {("rail map", "spark-2"), ("rail port", "spark-2"), ("rail rate", "spark-2"),
                  ("path mtu", "spark-2"), ("path mtu", "spark-1")},
    "docker-down": {("docker", "spark-2")},
    "port-busy": {("ports free", "spark-1")},
    "image-drift": {("image", "spark-2")},
    "model-drift": {("model", "spark-2")},
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_fault_fails_the_right_check_on_the_right_node(lab, params, kind):
    faults.apply(lab, kind)
    try:
        failed = failures(params)
    finally:
        faults.heal(lab, kind)
    assert EXPECTED[kind] <= set(failed), f"{kind}: failed {sorted(failed)}"
    unexpected = {k for k in failed if k not in EXPECTED[kind]}
    assert not unexpected, f"{kind} also failed {sorted(unexpected)}"
    for c in failed.values():
        assert c.remedy, f"{c.check} on {c.node} has no remedy"
    if kind == "port-busy":
        assert str(params.ports.api) in failed[("ports free", "spark-1")].observed
    if kind == "model-drift":
        assert "config.json" in failed[("model", "spark-2")].observed
    assert failures(params) == {}, f"the lab still fails after healing {kind}"


def test_cli_exits_1_and_names_the_remedy(lab, capsys):
    faults.apply(lab, "mtu")
    try:
        assert main(["preflight", "-p", str(LAB)]) == 1
    finally:
        faults.heal(lab, "mtu")
    out = capsys.readouterr().out
    assert "FAIL rail mtu on spark-2: enp1s0f1np1: mtu 1500" in out and "ip link set" in out
