"""00_inventory: parsers on real DGX Spark outputs, the node script on this machine, and the
notebook over real SSH."""

import json
import socket
from pathlib import Path

import pytest
import yaml

import sparkbook as sb
from conftest import field_sample, free_port
from sparkbook.facts import inventory
from sparkbook.cli import main
from sparkbook.params import validate
from sparkbook.facts.parsers import parse_nvidia_smi_csv, parse_sections
from sparkbook.nodes.remote import Cluster
from sparkbook.steps import inventory as step

ROOT = Path(__file__).resolve().parents[1]


def test_nvidia_smi_csv_with_repeated_headers_from_four_sparks():
    rows = parse_nvidia_smi_csv(field_sample("nvidia-smi-query-1.txt"))
    assert rows == [{"name": "NVIDIA GB10", "memory.total": None, "memory.free": None}] * 4


def test_nvidia_smi_csv_noheader_gb10():
    rows = parse_nvidia_smi_csv(field_sample("nvidia-smi-query-2.txt"),
                                ["name", "compute_cap", "driver_version", "memory.total"])
    assert rows == [{"name": "NVIDIA GB10", "compute_cap": "12.1", "driver_version": "580.159.03",
                     "memory.total": None}]


def test_nvidia_smi_csv_rejects_a_row_of_the_wrong_shape():
    with pytest.raises(ValueError, match="2 columns, expected 3"):
        parse_nvidia_smi_csv("NVIDIA GB10, 580.1\n", ["name", "driver_version", "memory.total"])


def test_inventory_parse_of_a_gb10_node():
    out = "\n".join([
        "@@ facts", "hostname=spark-1", "os=Ubuntu 24.04.3 LTS", "kernel=6.11.0-1016-nvidia",
        "arch=aarch64", "cpus=20", "mem_total_kb=125524048", "mem_available_kb=119000000",
        "model_disk_free_kb=3000000000", "docker_version=28.3.3", "docker_root=/var/lib/docker",
        "docker_disk_free_kb=3000000000", 'docker_runtimes={"io.containerd.runc.v2":{},"nvidia":{},"runc":{}}',
        "@@ gpu", "name, driver_version, memory.total [MiB]", "NVIDIA GB10, 580.95.05, [N/A]"])
    f = inventory.parse(out)
    assert (f["arch"], f["cpus"], f["gpus"], f["gpu_name"], f["driver"]) == (
        "aarch64", 20, 1, "NVIDIA GB10", "580.95.05")
    assert f["memory_gb"] == 119.7 and f["gpu_memory"] == "unified (119.7 GB system)"
    assert f["docker_runtimes"] == ["io.containerd.runc.v2", "nvidia", "runc"]


def test_inventory_parse_without_gpu_or_docker():
    f = inventory.parse("@@ facts\nhostname=h\ndocker_version=absent\ndocker_runtimes=null\n"
                        "@@ gpu\nnvidia-smi absent\n")
    assert f["gpus"] == 0 and f["gpu_problem"] == "nvidia-smi absent" and f["docker_runtimes"] == []


def test_sections():
    assert parse_sections("junk\n@@ a\n1\n2\n@@ b\n\n3\n") == {"a": "1\n2", "b": "3"}


def test_inventory_parse_of_a_failing_nvidia_smi():
    f = inventory.parse("@@ facts\nhostname=h\n@@ gpu\nNVIDIA-SMI has failed because it couldn't communicate "
                        "with the NVIDIA driver.\nnvidia-smi failed: \n")
    assert f["gpus"] == 0 and f["gpu_problem"] == "nvidia-smi failed:" and f["gpu_memory"] is None


def _lab_params(local=False, **model):
    """The lab's parameters (one local node); ``model`` set past validation, which refuses a path
    with shell characters (tests/test_params_hostile.py): the scripts must stay safe without it."""
    data = yaml.safe_load((ROOT / "parameters" / "lab.yaml").read_text())
    if local:  # one node: this machine, without SSH
        data.update(lab=False, nodes=[{"name": "here", "host": "localhost", "local": True, "role": "head"}])
        data["serving"]["tensor_parallel_size"] = 1
    params = validate(data)
    return params.model_copy(update={"model": params.model.model_copy(update=model)})


def test_values_are_arguments_never_part_of_the_script():
    path = "/models/x; touch /tmp/pwned"
    s = inventory.node_script(_lab_params(path=path))
    assert s.args == (path, "") and path not in s.text
    assert str(s) == "bash sparkbook/scripts/inventory.sh '/models/x; touch /tmp/pwned' ''"


def test_the_script_on_this_machine(tmp_path):
    """inventory.sh as run on a node, here; a hostile model path is only a path."""
    params = _lab_params(local=True, path=f"{tmp_path}/m; touch {tmp_path}/pwned")
    inv = inventory.gather(params, Cluster.from_params(params))
    assert not inv.errors and not (tmp_path / "pwned").exists()
    f = inv.rows[0]
    assert f["hostname"] == socket.gethostname() and f["cpus"] >= 1
    assert f["memory_gb"] > 0 and f["model_disk_free_gb"] is not None and f["os"]
    assert f["docker"] and (f["gpus"] > 0 or f["gpu_problem"])


def test_the_step_on_this_machine(tmp_path):
    """00 against parameters/localhost.yaml (this machine, no SSH): its files and its verdict."""
    ctx = sb.notebook.start({"params_file": str(ROOT / "parameters" / "localhost.yaml"),
                             "run_dir": str(tmp_path)}, step, quiet=True)
    outcome = ctx.run()
    rows = json.loads((tmp_path / "inventory.json").read_text())
    assert [r["node"] for r in rows] == ["this-machine"] and rows[0]["reachable"]
    assert (tmp_path / "inventory.csv").read_text().startswith("node,role,reachable,hostname")
    assert step.table(outcome).rows[0][:3] == ["this-machine", "head", True]
    verdict = ctx.verdict(outcome)
    assert verdict.title == "00 inventory" and verdict.status == "PASS"
    assert [(c.check, c.node) for c in verdict.checks] == [("reachable", "this-machine")]


def test_an_unreachable_node_fails_with_the_command_a_person_runs():
    params = _lab_params()
    rows = [{"node": "spark-1", "role": "head", "reachable": True, "hostname": "s1", "arch": "aarch64",
             "os": "Ubuntu", "gpus": 1, "gpu_name": "NVIDIA GB10", "gpu_problem": None},
            {"node": "spark-2", "role": "worker", "reachable": False}]
    checks = step.checks(params, inventory.Inventory(rows, {"spark-2": "ssh: cannot connect"}, "bash x"))
    assert [(c.check, c.node, c.status) for c in checks] == [
        ("reachable", "spark-1", "PASS"), ("gpu", "spark-1", "PASS"), ("reachable", "spark-2", "FAIL")]
    assert checks[-1].observed == "ssh: cannot connect" and checks[-1].command == "bash x"


def _params_for(ssh_nodes, tmp_path, extra_nodes=()):
    nodes = [n.model_dump(exclude_none=True) for n in ssh_nodes.nodes()] + list(extra_nodes)
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data.update(name="sshtest", nodes=nodes, ssh={"known_hosts": [str(ssh_nodes.known_hosts)],
                                                  "connect_timeout": 3})
    data["expectations"] = {"gpus_per_node": 1, "gpu_name": "NVIDIA GB10"}
    data["serving"]["nodes"] = [nodes[0]["name"]]  # TP 1: one node serves
    path = tmp_path / "sshtest.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_inventory_notebook_over_ssh(ssh_nodes, tmp_path):
    out = tmp_path / "run"
    assert main(["run", "-p", str(_params_for(ssh_nodes, tmp_path)), "--steps", "00", "--out", str(out)]) == 0
    rows = json.loads((out / "inventory.json").read_text())
    assert [r["node"] for r in rows] == ["node0", "node1", "node2"]
    assert all(r["reachable"] and r["cpus"] >= 1 and r["memory_gb"] > 0 for r in rows)
    assert (out / "inventory.csv").read_text().startswith("node,role,reachable,hostname")
    verdict = json.loads((out / "verdicts" / "00_inventory.json").read_text())
    # no GPU on this machine: a warning per node, not a failure
    gpu = [c for c in verdict["checks"] if c["check"] == "gpu"]
    assert [c["status"] for c in gpu] == ["WARN"] * 3


def test_unreachable_node_fails_the_inventory_by_name(ssh_nodes, tmp_path):
    ghost = {"name": "ghost", "host": "127.0.0.1", "port": free_port(), "user": "root",
             "key": str(ssh_nodes.key), "role": "worker"}
    out = tmp_path / "run"
    assert main(["run", "-p", str(_params_for(ssh_nodes, tmp_path, [ghost])), "--steps", "00",
                 "--out", str(out)]) == 1
    step = json.loads((out / "summary.json").read_text())["steps"][0]
    assert step["status"] == "failed"
    assert "reachable on ghost: ssh root@127.0.0.1:" in step["error"] and "cannot connect" in step["error"]
    assert "node0" not in step["error"]
