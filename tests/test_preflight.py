"""Preflight: what each node is asked (values as arguments), a report parsed from real DGX Spark
outputs and its checks, the fabric's layout, the TCP probes of the serving ports, the scripts and
the step on this machine, the CLI; and on the lab: healthy passes, each fault fails the right check
on the right node with a remedy, a healed lab passes again."""

import fnmatch
import json
import socket
import time
from pathlib import Path

import pytest
import yaml

import sparkbook as sb
from check_rows import scan
from conftest import field_sample
from sparkbook import preflight
from sparkbook.cli import main
from sparkbook.facts.identity import INSPECT_FORMAT
from sparkbook.facts.manifest import node_script, parse_manifest
from sparkbook.nodes.workdir import login
from sparkbook.lab import faults
from sparkbook.params import validate
from sparkbook.preflight import tcp
from sparkbook.preflight.checks import GROUPS, markdown, summary
from sparkbook.preflight import nodes as node_checks
from sparkbook.preflight.collect import STALE, clock_skews, node_bundle, parse
from sparkbook.params.layout import MIXED, PAIR, RING, SWITCH, classify
from sparkbook.nodes.remote import Cluster, Result
from sparkbook.scripts import tcp_ports
from sparkbook.steps import preflight as step
from sparkbook.book.verdict import FAIL, PASS, WARN

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
LOCALHOST = ROOT / "parameters" / "localhost.yaml"


def lab_params(**model):
    """The lab's parameters, ``model`` set past validation (which refuses a model path with shell
    characters, tests/test_params_hostile.py): the node scripts must stay safe without it."""
    params = validate(yaml.safe_load(LAB.read_text()))
    return params.model_copy(update={"model": params.model.model_copy(update=model)})


def checked(params, pf):
    return {(c.check, c.node): c for c in step.checks(params, pf)}


# ------------------------------------------------------------------------------- without the lab

def test_each_node_gets_one_bundle_its_values_as_arguments():
    path = "/models/x; touch /tmp/pwned"
    params = lab_params(path=path)
    head, worker = (node_bundle(params, n) for n in params.nodes)
    assert [s for s, _ in head.parts] == ["inventory", "hardware", "ping", "in-use", "runtime",
                                          "host", "memfit", "peers-ssh"]
    assert [s for s, _ in worker.parts] == ["inventory", "hardware", "ping", "in-use", "runtime",
                                            "host", "memfit"]
    part = dict(head.parts, model=node_script(params, params.head))  # run beside the bundle
    assert part["hardware"].args == ("enp1s0f1np1", "enP2p1s0f1np1")
    # each rail to the peer's same rail, MTU 9000 less the IPv4 and ICMP headers
    assert part["ping"].args == ("8972", "enp1s0f1np1", "10.77.1.12", "enP2p1s0f1np1", "10.77.2.12")
    assert part["in-use"].args == (STALE,)
    assert part["runtime"].args == ("sparkbook-lab/vllm-cpu:latest", INSPECT_FORMAT)
    # every file by content, with the digest cache in the node's private working folder
    assert part["model"].args[:3] == (path, "all", ".sparkbook-partial")
    assert part["model"].args[3].startswith(f"/tmp/sparkbook-{login(params.head)}/lab/digests-")
    name, target, port, sep, ssh, *options = part["peers-ssh"].args
    assert (name, target, port, sep, ssh) == ("spark-2", "root@10.77.1.12", "22", "--", "ssh")
    assert "BatchMode=yes" in options
    for _, s in [*head.parts, *worker.parts, ("model", part["model"])]:
        assert not [v for v in (path, "sparkbook-lab", "10.77.", "enp1s0f1np1", "spark-2") if v in s.text], s.name
    assert str(part["model"]).startswith("python3 -I sparkbook/scripts/model_manifest.py '/models/x; touch")


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
        "@@ runtime", "@@ containers", "@@ image", json.dumps({"Id": "sha256:" + "ab" * 32}),
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
    assert report["model"] is None and report["skew_s"] is None  # the manifest runs beside the bundle
    report["model"] = parse_manifest("\n".join(["5\t-\tconfig.json", "#config.json\t" + "0" * 64, "!read\t5\t1"]))
    assert report["model"] == {"config.json": {"size": 5, "sha256": "0" * 64}}

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


def test_each_group_writes_only_the_rows_it_lists_and_the_list_is_in_the_help_and_readme(capsys):
    """GROUPS (sparkbook/preflight/checks.py) is the one list of the checks: each group writes only
    rows it names (on the reports made here), it names every row the preflight source writes and
    nothing else (tests/check_rows.py's scan: an f-string's fields are ``*``), and README and the
    CLI's help show the list as it is."""
    params = lab_params()
    spark = preflight.Preflight({"spark-1": parse(spark_output())}, {"spark-2": "ssh: cannot connect"},
                                {"spark-1": "head", "spark-2": "worker"})
    four = switch(4)
    for pf, p in ((spark, params), (reports(params), params), (reports(four), four)):
        for g in GROUPS:
            names = {c.check for c in g.run(p, pf)}
            assert all(any(fnmatch.fnmatchcase(n, r) for r in g.rows) for n in names), (g.rows, names)
    written = {r.name for r in scan()[0] if r.where.startswith(("sparkbook/preflight/", "sparkbook/facts/memfit.py"))}
    listed = {r for g in GROUPS for r in g.rows}
    assert {w for w in written if not any(fnmatch.fnmatchcase(r, w) for r in listed)} == set()
    assert {r for r in listed if not any(fnmatch.fnmatchcase(r, w) for w in written)} == set()
    assert markdown() in (ROOT / "README.md").read_text(), "README's list of the checks: paste markdown()"
    with pytest.raises(SystemExit):
        main(["preflight", "--help"])
    assert " ".join(summary().split()) in " ".join(capsys.readouterr().out.split())
    assert [r[0] for r in step.what_is_checked().rows] == [", ".join(g.rows) for g in GROUPS]


def test_a_port_down_names_its_interface_in_the_remedy():
    params = lab_params()
    report = parse(spark_output().replace("PORT_ACTIVE (4)", "PORT_DOWN (1)"))
    rows = [c for c in step.checks(params, preflight.Preflight({"spark-1": report}, {}, {}))
            if c.check == "rail port"]
    assert [c.remedy.split("`")[1] for c in rows] == ["ip link set enp1s0f1np1 up", "ip link set enP2p1s0f1np1 up"]
    assert all(c.status == FAIL for c in rows)


# ------------------------------------------------------------------ the fabric's layout, TCP ports

def fabric(*rails):
    """Parameters of len(rails) nodes a, b, c...: each node's rails as "10.0.X.Y/P" (interfaces r0,
    r1...), tensor parallel across all of them."""
    data = yaml.safe_load(LAB.read_text())
    first = data["nodes"][0]
    data["nodes"] = [{**first, "name": "abcdefgh"[i], "host": f"10.9.0.{i + 1}", "role": "head" if i == 0 else "worker",
                      "rails": [{"interface": f"r{r}", "ip": a.split("/")[0], "prefix": int(a.split("/")[1])}
                                for r, a in enumerate(node)]}
                     for i, node in enumerate(rails)]
    data["serving"]["tensor_parallel_size"] = len(rails)
    return validate(data)


def switch(n):
    """n nodes, two rails each, every rail's subnet holding them all (the lab's addressing)."""
    return fabric(*([f"10.77.1.{10 + i}/24", f"10.77.2.{10 + i}/24"] for i in range(1, n + 1)))


def ring(n):
    """n Sparks cabled in a ring: node i's second rail to node i+1's first, each cable's two ends
    on a /30 of their own."""
    return fabric(*([f"10.0.{i + 1}.1/30", f"10.0.{(i + 1) % n + 1}.2/30"] for i in range(n)))


def reports(params, ping_ok=lambda node, peer: True, tcp_report=None):
    """A report per node of ``params`` with every ping it is sent answered as ``ping_ok`` says."""
    names = {str(r.ip): n.name for n in params.nodes for r in n.rails}
    out = {}
    for node in params.nodes:
        args = dict(node_bundle(params, node).parts)["ping"].args[1:]
        report = parse("@@ smi\nnvidia-smi unavailable")
        report["ping"] = [{"interface": i, "peer": a, "ok": ping_ok(node.name, names[a])}
                          for i, a in zip(args[::2], args[1::2])]
        report["tcp"] = tcp_report(node) if tcp_report else None
        out[node.name] = report
    return preflight.Preflight(out, {}, {n.name: n.role for n in params.nodes})


def test_the_layout_the_rails_draw():
    assert (classify(lab_params()).kind, str(classify(lab_params()))) == (PAIR, "direct pair, 2 nodes, 2 rails")
    assert str(classify(switch(4))) == "switch, 4 nodes, 2 rails" and classify(switch(8)).kind == SWITCH
    assert classify(ring(3)).kind == classify(ring(4)).kind == RING
    assert str(classify(ring(4))) == "ring/mesh (unsupported), 4 nodes, 2 rails"
    # one node's first rail on a subnet of its own: no layout
    assert classify(fabric(["10.0.1.1/24"], ["10.0.1.2/24"], ["10.0.7.3/24"])).kind == MIXED
    assert classify(fabric(["10.0.1.1/24"], ["10.0.2.2/24"])).kind == MIXED
    assert classify(fabric(["10.0.1.1/24"])).kind == ""


def test_each_rail_pings_the_peers_on_its_subnet():
    """On a switch, every peer's same rail; in a ring, the other end of each cable only."""
    ping = dict(node_bundle(switch(4), switch(4).nodes[0]).parts)["ping"].args
    assert ping[1:] == ("r0", "10.77.1.12", "r0", "10.77.1.13", "r0", "10.77.1.14",
                        "r1", "10.77.2.12", "r1", "10.77.2.13", "r1", "10.77.2.14")
    three = ring(3)
    assert dict(node_bundle(three, three.nodes[0]).parts)["ping"].args[1:] == ("r0", "10.0.1.2", "r1", "10.0.2.1")


def layout_row(params, pf):
    return [c for c in step.checks(params, pf) if c.check == "fabric layout"]


def test_the_layout_check_one_row():
    params = switch(4)
    [row] = layout_row(params, reports(params))
    assert (row.node, row.status, row.observed) == ("all", PASS, "switch, 4 nodes, 2 rails (10.77.1.0/24, 10.77.2.0/24)")
    # pings lost between two nodes: the switch is not confirmed (the path mtu rows FAIL)
    pf = reports(params, lambda node, peer: {node, peer} != {"a", "c"})
    [row] = layout_row(params, pf)
    assert row.status == WARN and "not confirmed: 4 of 24 rail pings unanswered" in row.observed
    # a ring: named unsupported, not failed; its pings reach the cables' other ends
    three = ring(3)
    [row] = layout_row(three, reports(three))
    assert row.status == WARN and row.observed.startswith("ring/mesh (unsupported), 3 nodes, 2 rails: 10.0.1.0/30: a, c")
    assert "switch" in row.remedy
    assert not [c for c in step.checks(three, reports(three)) if c.status == FAIL and c.check in ("fabric layout", "path mtu")]
    mixed = fabric(["10.0.1.1/24"], ["10.0.1.2/24"], ["10.0.7.3/24"])
    [row] = layout_row(mixed, reports(mixed))
    assert row.status == FAIL and "10.0.7.0/24: c" in row.observed and row.remedy
    assert layout_row(fabric(["10.0.1.1/24"]), reports(fabric(["10.0.1.1/24"]))) == []


def test_path_mtu_is_one_row_per_rail_naming_the_silent_peers():
    params = switch(8)
    pf = reports(params, lambda node, peer: peer != "e")
    rows = [c for c in step.checks(params, pf) if c.check == "path mtu"]
    assert len(rows) == 8 * 2
    a = [c for c in rows if c.node == "a"]
    assert [c.status for c in a] == [FAIL, FAIL]
    assert a[0].observed == "r0 → e (10.77.1.15): no reply (6 of 7 peers answered)"
    assert a[0].command == "ping -M do -s 8972 -I r0 10.77.1.15"
    e = [c for c in rows if c.node == "e"]
    assert [(c.status, c.observed) for c in e] == [(PASS, "r0 → 7 peers: ok"), (PASS, "r1 → 7 peers: ok")]


def test_the_gathered_layout_is_a_key_number():
    assert preflight.Preflight({}, layout="switch, 4 nodes, 2 rails").key_numbers() == [("layout", "switch, 4 nodes, 2 rails")]
    assert preflight.Preflight({}).key_numbers() == []


def test_the_tcp_probe_each_node_runs():
    params = switch(3)
    a, b, c = params.nodes
    cmd = tcp.command(params, b, params.nodes)
    assert cmd[:3] == ["python3", "-c", tcp.SCRIPT.read_text()]  # the file's text: no value in it
    assert json.loads(cmd[3]) == {"address": "10.77.1.12", "ports": [6379, 29501, 29502, 8000, 40000],
                                  "timeout": tcp.TIMEOUT_S, "window": tcp.WINDOW_S,
                                  "peers": [["a", "10.77.1.11"], ["c", "10.77.1.13"]]}
    data = params.model_dump(mode="json")
    data["collectives"]["master_port"] = 8000
    assert tcp.serving_ports(validate(data)) == {6379: "ray", 29501: "master", 8000: "all-reduce/api", 40000: "ephemeral"}


def test_the_tcp_probe_output_parsed():
    out = {"listen": {"6379": "listening"}, "accepted": {"6379": 1}, "probes": 2,
           "failed": [{"peer": "b", "address": "10.77.1.12", "port": 6379, "seen": "timeout"}]}
    assert tcp.parse(Result("a", "python3 ...", 0, "noise\n" + json.dumps(out) + "\n")) == out
    assert tcp.parse(Result("a", "python3 ...", 127, "", "bash: python3: command not found")) == {
        "error": "exit code 127: bash: python3: command not found"}
    assert tcp.parse(Result("a", "python3 ...", None, error="ssh a: connection timed out")) == {
        "error": "ssh a: connection timed out"}
    assert tcp.parse(Result("a", "python3 ...", 0, "[1]")) == {"error": "exit code 0: [1]"}


def tcp_rows(params, pf):
    return [c for c in step.checks(params, pf) if c.check == "tcp ports"]


def test_tcp_checks_one_row_per_node_and_a_fail_per_blocked_port():
    params = switch(3)

    def report(node):  # b drops the Ray port: a and c see their connections time out
        failed = [] if node.name == "b" else [
            {"peer": "b", "address": "10.77.1.12", "port": 6379, "seen": "timeout"}]
        return {"listen": {}, "accepted": {}, "probes": 8, "failed": failed}

    rows = tcp_rows(params, reports(params, tcp_report=report))
    assert [(c.node, c.status) for c in rows] == [("a", PASS), ("b", FAIL), ("b", FAIL), ("c", PASS)]
    assert rows[0].observed == "ray 6379, master 29501, all-reduce 29502, api 8000, ephemeral 40000 on 10.77.1.11: reached from 2 peers"
    fail = rows[1]
    assert fail.observed == ("a → b 10.77.1.12:6379 (ray): no answer within 2 s: dropped by a firewall (filtered)")
    assert "`sudo ufw allow from 10.77.1.0/24`" in fail.remedy and fail.remedy.startswith("on b")
    assert fail.command.startswith("on a: timeout 2 bash -c '</dev/tcp/10.77.1.12/6379'")
    assert rows[2].observed.startswith("c → b 10.77.1.12:6379 (ray): ")

    # refused where b could not listen; a node whose probe could not run: a WARN, not a FAIL
    def report2(node):
        if node.name == "c":
            return {"error": "exit code 127: bash: python3: command not found"}
        failed = [] if node.name == "b" else [
            {"peer": "b", "address": "10.77.1.12", "port": 8000, "seen": "refused"}]
        return {"listen": {"8000": "error: Cannot assign requested address"}, "probes": 8, "failed": failed}

    rows = tcp_rows(params, reports(params, tcp_report=report2))
    # c never listened: only its WARN, no PASS and no failures blamed on a firewall of c's
    assert [(c.node, c.status) for c in rows] == [("c", WARN), ("a", PASS), ("b", FAIL)]
    assert rows[1].observed.endswith("reached from 1 peer")
    assert rows[2].observed.endswith("refused: rejected by a firewall, or nothing listens there "
                                     "(b could not listen there: error: Cannot assign requested address)")
    assert tcp_rows(params, reports(params)) == []  # not probed (one node, or a ring)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tcp_probe_script_stops_at_its_deadline():
    """Nothing listens at the peer's address: refused after the window; a port taken by another
    program is reported busy; the script exits by its deadline all the same."""
    taken, port = socket.socket(), free_port()
    taken.bind(("127.0.0.1", port))
    taken.listen()
    free = free_port()
    try:
        start = time.monotonic()
        out = tcp_ports.main({"address": "127.0.0.1", "ports": [port, free], "timeout": 0.5, "window": 0.5,
                              "peers": [["ghost", "127.0.0.9"]]})
        took = time.monotonic() - start
    finally:
        taken.close()
    assert out["listen"] == {str(port): "busy", str(free): "listening"} and out["accepted"] == {str(free): 0}
    assert out["probes"] == 2 and [(f["port"], f["seen"]) for f in out["failed"]] == sorted([(port, "refused"), (free, "refused")])
    assert 0.5 <= took < 0.5 + 0.5 + 1 + 0.5


def test_nodes_sharing_a_fabric_address_are_not_probed_and_say_why():
    """One machine reached on two SSH ports (a test's sshd, containers): one of them alone could
    listen on the address, so the probe is not run and one SKIP row names them."""
    data = yaml.safe_load(LOCALHOST.read_text())
    data["nodes"] = [{"name": name, "host": host, "port": port, "user": "root", "role": role}
                     for name, host, port, role in (("a", "127.0.0.1", 2201, "head"),
                                                    ("b", "127.0.0.1", 2202, "worker"),
                                                    ("c", "127.0.0.3", 22, "worker"))]
    data["serving"]["nodes"] = ["a"]
    params = validate(data)
    assert tcp.shared(params.nodes) == {"127.0.0.1": ["a", "b"]}
    assert tcp.shared(params.nodes[1:]) == {}
    rows = tcp_rows(params, reports(params))
    assert [(c.node, c.status) for c in rows] == [("a, b", "SKIP")]
    assert "a, b share the fabric address 127.0.0.1" in rows[0].observed


def test_the_scripts_on_this_machine():
    """The bundle as two nodes run it, both this machine, their rails on the loopback."""
    data = yaml.safe_load(LOCALHOST.read_text())
    data["nodes"] = [{"name": f"here-{i}", "host": "localhost", "local": True, "role": role,
                      "rails": [{"interface": "lo", "ip": f"127.0.0.{10 + i}", "prefix": 8}]}
                     for i, role in ((1, "head"), (2, "worker"))]
    data["expectations"]["mtu"] = 1500
    data["serving"]["nodes"] = ["here-1"]
    params = validate(data)
    pf = preflight.gather(params, Cluster.from_params(params))
    assert set(pf.nodes) == {"here-1", "here-2"} and not pf.errors
    here = pf.nodes["here-1"]
    assert here["facts"]["hostname"] and here["links"]["lo"]["mtu"] > 0
    assert here["ping"] == [{"interface": "lo", "peer": "127.0.0.12", "ok": True}]
    assert set(here["peers_ssh"]) == {"here-2"}
    assert pf.nodes["here-2"]["peers_ssh"] == {} and abs(here["skew_s"]) < 5
    assert here["model"] is None  # /models/none
    path_mtu = [c for c in step.checks(params, pf) if c.check == "path mtu"]
    assert [(c.node, c.status) for c in path_mtu] == [("here-1", "PASS"), ("here-2", "PASS")]
    # each listened on its own address and reached the other's serving ports
    assert here["tcp"]["failed"] == [] and here["tcp"]["probes"] == 5 and pf.layout == "direct pair, 2 nodes, 1 rail"
    assert all(state in ("listening", "busy") for state in here["tcp"]["listen"].values())
    assert [(c.node, c.status) for c in tcp_rows(params, pf)] == [("here-1", "PASS"), ("here-2", "PASS")]


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
    # TCP to the Ray port dropped on spark-2's rails: ping passes, spark-1's connection times out
    "firewall": {("tcp ports", "spark-2")},
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
    if kind == "firewall":
        c = failed[("tcp ports", "spark-2")]
        assert c.observed.startswith(f"spark-1 → spark-2 10.77.1.12:{params.ports.ray} (ray): no answer")
        assert "`sudo ufw allow from 10.77.1.0/24`" in c.remedy
    assert failures(params) == {}, f"the lab still fails after healing {kind}"


def test_cli_exits_1_and_names_the_remedy(lab, capsys):
    faults.apply(lab, "mtu")
    try:
        assert main(["preflight", "-p", str(LAB)]) == 1
    finally:
        faults.heal(lab, "mtu")
    out = capsys.readouterr().out
    assert "FAIL rail mtu on spark-2: enp1s0f1np1: mtu 1500" in out and "ip link set" in out


def test_a_model_fetched_from_the_hub_may_be_absent_before_03():
    """model.source hf: 03 downloads it onto the head, so its absence is a WARN, not a FAIL."""
    from sparkbook.preflight.artifacts import model
    from sparkbook.preflight.collect import Preflight
    for source, head_status in (("head", "FAIL"), ("hf", "WARN")):
        params = lab_params(source=source)
        pf = Preflight({n.name: {"model": None} for n in params.nodes}, {}, {n.name: n.role for n in params.nodes})
        got = {c.node: (c.status, c.remedy) for c in model(params, pf)}
        assert got["spark-1"][0] == head_status and got["spark-2"][0] == "WARN"
        assert ("downloads" in got["spark-1"][1]) == (source == "hf")


def test_relays_check_ssh_to_the_workers_they_feed():
    """Past distribution.parallel workers, 03 relays the image worker to worker along a tree of the
    workers that lack it then: preflight checks every worker-to-worker hop; at most parallel
    workers, none."""
    from sparkbook.lab import lab_params as lab_of
    from sparkbook.preflight.collect import node_bundle, ssh_peers
    params = validate(lab_of(8))
    names = lambda p, node: [n.name for n in ssh_peers(p, p.node(node))]  # noqa: E731
    assert names(params, "spark-1") == [f"spark-{i}" for i in range(2, 9)]
    assert names(params, "spark-5") == [f"spark-{i}" for i in (2, 3, 4, 6, 7, 8)]
    assert "peers-ssh" in [s for s, _ in node_bundle(params, params.node("spark-2")).parts]
    small = validate(lab_of(4))
    assert names(small, "spark-2") == [] and names(small, "spark-1") == ["spark-2", "spark-3", "spark-4"]
    assert "peers-ssh" not in [s for s, _ in node_bundle(small, small.node("spark-2")).parts]


def test_a_workers_extra_model_files_are_a_warning_not_a_difference():
    """Another model in the worker's model folder is not the head's to impose: preflight names the
    extras as a WARN, and the model still counts as identical (03 never deletes them)."""
    from sparkbook.preflight.artifacts import model
    from sparkbook.preflight.collect import Preflight
    params = lab_params()
    head = {"config.json": {"size": 10, "sha256": "a"}}
    worker = {**head, "other/model.safetensors": {"size": 99, "sha256": "b"}}
    pf = Preflight({"spark-1": {"model": head}, "spark-2": {"model": worker}}, {},
                   {n.name: n.role for n in params.nodes})
    got = {(c.check, c.node): c for c in model(params, pf)}
    assert got[("model", "spark-2")].status == "PASS"
    extra = got[("model extras", "spark-2")]
    assert extra.status == "WARN" and "other/model.safetensors" in extra.observed and "delete_extras" in extra.remedy


class SlowOnce:
    """A cluster whose clock reads take 3 s once (a stalled channel on a busy machine) and 10 ms
    else; the node's clock is ``skew`` s ahead of this machine's."""

    def __init__(self, skew: float, slow_reads: int = 1):
        self.skew, self.slow, self.reads = skew, slow_reads, 0

    def run(self, command, names, timeout):
        self.reads += 1
        took = 3.0 if self.reads <= self.slow else 0.01
        # the node read its clock at the start of the slow round trip: half of it off the midpoint
        return {n: Result(n, str(command), 0, stdout=f"{1000.0 + self.skew:.6f}\n", started=1000.0,
                          duration=took) for n in names}


def test_one_slow_clock_read_makes_no_skew_and_an_uncertain_one_only_warns():
    params = lab_params()
    skew, error = clock_skews(SlowOnce(0.0), ["spark-1"])["spark-1"]
    assert abs(skew) < 0.01 and error == 0.005  # the shortest of the round trips decides
    pf = preflight.Preflight({"spark-1": {"skew_s": 0.0, "skew_error_s": 0.005}}, {}, {"spark-1": "head"})
    row = next(c for c in node_checks.clocks(params, pf))
    assert row.status == PASS and row.observed == "+0.000 s ± 0.005 against this machine (the shortest of 5 round trips)"
    # every read slow: 2.5 s could be 1 s, so not a FAIL, and said
    skew, error = clock_skews(SlowOnce(2.5, slow_reads=5), ["spark-1"])["spark-1"]
    assert error == 1.5
    pf.nodes["spark-1"].update(skew_s=skew, skew_error_s=error)
    row = next(c for c in node_checks.clocks(params, pf))
    assert row.status == WARN and "too slow to judge it" in row.observed
    pf.nodes["spark-1"].update(skew_s=5.0, skew_error_s=0.005)  # the clock fault's 5 s, read quickly
    assert next(c for c in node_checks.clocks(params, pf)).status == FAIL


def test_ctrl_c_while_the_nodes_hash_returns_at_once_and_drops_their_connections(monkeypatch):
    """The manifests run beside the bundle in a thread: an interrupt must not wait minutes for
    the hashing to finish; dropping each node's connection ends its remote command."""
    import threading
    import time
    from sparkbook.nodes.remote import Cluster
    from sparkbook.preflight import collect
    params = sb.params.load(ROOT / "parameters" / "dgx-spark-pair.yaml")
    release, dropped = threading.Event(), []
    monkeypatch.setattr(collect, "manifests", lambda *a: release.wait(30) or {})
    monkeypatch.setattr(collect, "drop", lambda node, ssh: dropped.append(node.name) or release.set())

    class Interrupted(Cluster):
        def run(self, *a, **kw):
            raise KeyboardInterrupt
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        collect.gather(params, Interrupted(params.nodes))
    assert time.monotonic() - start < 5 and dropped == ["spark-1", "spark-2"]


def test_the_model_row_says_what_hashing_read_and_what_came_from_the_cache():
    from sparkbook.preflight import artifacts
    from sparkbook.preflight.collect import Preflight
    params = sb.params.load(LAB)
    model = {"a.safetensors": {}, "b.safetensors": {}, "config.json": {}}

    def said(read):
        pf = Preflight({"spark-2": {"model": model, "model_read": read}}, {}, {}, "")
        return artifacts.how(params, pf, "spark-2")
    assert said((0, 0)) == "by SHA-256; hashing read 0 B, every digest cached"
    assert said((2048, 1)).endswith("(1 file(s), 2 cached)")
    assert said((4096, 3)).endswith("(3 file(s), none cached)")
    assert said(None) == "by SHA-256"
