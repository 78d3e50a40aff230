"""sparkbook fabric without the lab: the netplan file it writes, judged by netplan's own parser;
what a node's plan output means; the addressing scheme of a node fresh from the box.
(tests/test_dayone.py runs plan, apply, the guard, reboots and restore on the lab.)"""

import json
import shutil
import subprocess
import time

import pytest
import yaml

from sparkbook.book.project import project_root
from sparkbook.book.verdict import FAIL
from sparkbook.nodes.remote import Result, Results
from sparkbook.params import load
from sparkbook.setup import draft, fabric, mesh
from test_discover import PAIR, port, spark

ROOT = project_root()
NETPLAN = shutil.which("netplan") or (shutil.which("netplan", path="/usr/sbin:/sbin"))


def generate(tmp_path, files: dict[str, str]) -> subprocess.CompletedProcess:
    """netplan's parser and generator on ``files`` (name -> text) in a scratch root."""
    etc = tmp_path / "etc" / "netplan"
    etc.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (etc / name).write_text(text)
        (etc / name).chmod(0o600)
    return subprocess.run([NETPLAN, "generate", "--root-dir", str(tmp_path)], capture_output=True, text=True)


@pytest.mark.skipif(not NETPLAN, reason="netplan is not installed here (scripts/bootstrap installs netplan.io)")
@pytest.mark.parametrize("name", ["lab.yaml", "dgx-spark-pair.yaml", "dgx-spark-quad.yaml"])
def test_the_file_for_every_node_of_the_shipped_parameters_passes_netplans_parser(tmp_path, name):
    params = load(ROOT / "parameters" / name)
    for i, node in enumerate(params.nodes):
        root = tmp_path / node.name
        r = generate(root, {fabric.FILE.rsplit("/", 1)[1]: fabric.render(params, node)})
        assert r.returncode == 0, r.stderr
        networks = {p.name: p.read_text() for p in (root / "run" / "systemd" / "network").glob("*.network")}
        for rail in node.rails:  # what networkd gets: the address, no DHCP, the MTU
            text = networks[f"10-netplan-{rail.interface}.network"]
            assert f"Address={rail.ip}/{rail.prefix}" in text and "DHCP" not in text
        links = "".join(p.read_text() for p in (root / "run" / "systemd" / "network").glob("*.link"))
        assert links.count(f"MTUBytes={params.expectations.mtu}") == len(node.rails)


@pytest.mark.skipif(not NETPLAN, reason="netplan is not installed here (scripts/bootstrap installs netplan.io)")
def test_netplans_parser_refuses_what_it_should_so_the_plans_check_can_fail(tmp_path):
    params = load(ROOT / "parameters" / "lab.yaml")
    text = fabric.render(params, params.nodes[0]).replace("/24", "")
    r = generate(tmp_path, {"40-sparkbook-fabric.yaml": text})
    assert r.returncode != 0 and "missing /prefixlength" in r.stderr


def plan_output(**sections) -> str:
    return "".join(f"@@ {k}\n{v}\n" for k, v in sections.items())


def link(name, mtu, *cidrs):
    return {"ifname": name, "mtu": mtu, "addr_info": [
        {"family": "inet", "local": c.split("/")[0], "prefixlen": int(c.split("/")[1]), "scope": "global"} for c in cidrs]}


def test_a_plan_says_each_change_and_each_thing_that_stops_apply():
    params = load(ROOT / "parameters" / "lab.yaml")
    node = params.nodes[1]
    a, b = (r.interface for r in node.rails)
    links = json.dumps([link(a, 1500), link(b, 9000, f"{node.rails[1].ip}/24", "10.9.9.9/24")])
    p = fabric._plan_one(params, node, plan_output(
        target="absent", current="", others="/etc/netplan/60-lab-fabric.yaml\n?/etc/netplan/50-cloud-init.yaml",
        nm=f"{a}=Wired connection 1\n{b}=", generate="rc=0", links=links,
        root="alice ALL=(root) NOPASSWD: /usr/bin/bash"))
    assert p.current is None and p.diff.startswith("--- /dev/null") and f"+      - {node.rails[0].ip}/24" in p.diff
    assert p.changes == [f"{a}: addresses none -> {node.rails[0].ip}/24", f"{a}: MTU 1500 -> 9000",
                         f"{b}: addresses {node.rails[1].ip}/24, 10.9.9.9/24 -> {node.rails[1].ip}/24 (10.9.9.9/24 goes)",
                         f"{a}: NetworkManager's profile 'Wired connection 1' stops managing it (netplan marks it "
                         "unmanaged: networkd renders sparkbook's file)"]
    said = "\n".join(p.problems)
    assert "/etc/netplan/60-lab-fabric.yaml also configures a rail's interface" in said
    assert "/etc/netplan/50-cloud-init.yaml cannot be read" in said
    assert "`alice ALL=(root) NOPASSWD: /usr/bin/bash`" in said
    # the same node as planned already: nothing to change, nothing in the way
    same = json.dumps([link(r.interface, 9000, f"{r.ip}/{r.prefix}") for r in node.rails])
    p = fabric._plan_one(params, node, plan_output(target="present", current=fabric.render(params, node).rstrip("\n"),
                                                   others="", nm="", generate="rc=0", links=same, root="root"))
    assert p.unchanged and p.problems == [] and p.diff == ""
    # netplan's complaint, a missing interface, a node without netplan
    p = fabric._plan_one(params, node, plan_output(
        target="absent", others="", generate="x.yaml:5:18: Error in network definition: bad\nrc=1",
        links=json.dumps([link(a, 9000)]), root="sudo"))
    said = "\n".join(p.problems)
    assert "netplan's parser refuses the file: x.yaml:5:18: Error in network definition: bad | rc=1" in said
    assert f"{b}: no such interface on {node.name}" in said
    p = fabric._plan_one(params, node, plan_output(target="absent", generate="netplan unavailable", links="[]", root="root"))
    assert any("netplan is not installed on the node" in x for x in p.problems)


def fresh(host, hostname, mgmt):
    """A Spark fresh from the box: both twins cabled, no address, MTU 1500."""
    f = spark(host, hostname, 0)
    f.identity["mgmt"] = mgmt
    f.ports = [port("enP2p1s0f1np1", "roceP2p1s0f1", mtu=1500, owners=()),
               port("enp1s0f1np1", "rocep1s0f1", mtu=1500, owners=())]
    f.ports[0].pci, f.ports[1].pci = "0002:01:00.1", "0000:01:00.1"
    return f


def test_nodes_fresh_from_the_box_get_addresses_from_the_stated_scheme():
    d = draft.draft([fresh("a", "a", "10.0.0.21"), fresh("b", "b", "10.0.0.22")], PAIR, name="mine")
    rails = [[(r.interface, str(r.ip), r.prefix) for r in n.rails] for n in d.params.nodes]
    # rail 0 is the twin first in PCIe order on every node; the host number is the management address's
    assert rails == [[("enp1s0f1np1", "192.168.100.21", 24), ("enP2p1s0f1np1", "192.168.101.21", 24)],
                     [("enp1s0f1np1", "192.168.100.22", 24), ("enP2p1s0f1np1", "192.168.101.22", 24)]]
    assert d.text.count("PLANNED, not on the node yet") == 4 and d.layout == "direct pair, 2 nodes, 2 rails"
    assert not any("has MTU 1500" in n for n in d.notes)  # apply sets the MTU with the address
    # a scheme subnet that holds an address already is skipped; clashing host numbers become positions
    a, b = fresh("a", "a", "192.168.100.7"), fresh("b", "b", "10.1.0.7")
    d = draft.draft([a, b], PAIR, name="mine")
    assert [[str(r.ip) for r in n.rails] for n in d.params.nodes] == [["192.168.101.1", "192.168.102.1"],
                                                                    ["192.168.101.2", "192.168.102.2"]]
    # where some node already has rail addresses, the rest stays the owner's decision
    b = spark("b", "b", 12)
    d = draft.draft([fresh("a", "a", "10.0.0.21"), b], PAIR, name="mine")
    assert "PLANNED" not in d.text and "UNDECIDED" in d.text
    assert yaml.safe_load(d.text)["nodes"][0]["rails"] == []


class Refusing:
    """Nodes whose every command fails as `sudo -n` does without a sudoers line."""
    ssh = None

    def run(self, cmd, nodes=None, timeout=None):
        return Results({n.name: Result(n.name, "fabric", 3, stdout="@@ refused\nalice ALL=(root) NOPASSWD: /usr/bin/bash")
                        for n in nodes})


def test_a_refusing_node_fails_each_row_on_that_node_with_what_was_seen():
    params = load(ROOT / "parameters" / "lab.yaml")
    rows = (fabric.checks(mesh.apply(params, Refusing()), "ssh mesh")
            + fabric.checks(mesh.restore(params, Refusing()), "ssh mesh restore")
            + fabric.checks(fabric.restore(params, Refusing()), "fabric restore"))
    assert [(c.check, c.node, c.status) for c in rows] == [
        (what, n, FAIL) for what in ("ssh mesh", "ssh mesh restore", "fabric restore") for n in ("spark-1", "spark-2")]
    assert all("NOPASSWD" in c.observed for c in rows) and all(c.remedy for c in rows)


def test_the_doctor_shows_rows_01_writes():
    """`sparkbook fabric doctor` is 01's fabric rows alone: each name it keeps is a row 01 writes."""
    from sparkbook.preflight.checks import GROUPS
    from sparkbook.steps.day_one import DOCTOR
    assert set(DOCTOR) <= {r for g in GROUPS for r in g.rows}


def test_a_plan_that_cannot_be_applied_fails_its_row_per_node():
    params = load(ROOT / "parameters" / "lab.yaml")
    node = params.nodes[0]
    bad = fabric._plan_one(params, node, plan_output(target="absent", generate="netplan unavailable", links="[]", root="root"))
    rows = fabric.plan_checks([bad], [])
    assert [(c.check, c.node, c.status) for c in rows] == [("fabric plan", node.name, FAIL)]
    assert "netplan is not installed" in rows[0].observed and rows[0].remedy


class LostStart:
    """spark-2's change cuts its management address before the SSH answer to the start comes
    back: the start times out and the node is silent until its guard rolls back at the deadline.
    spark-1 applies as planned. The clock is fake: sleeping moves it."""

    def __init__(self, params, deadline):
        self.params, self.deadline, self.now, self.ssh, self.said = params, deadline, 0.0, None, []

    def monotonic(self):
        return self.now

    def __getattr__(self, name):  # strftime, gmtime: the real ones
        return getattr(time, name)

    def sleep(self, s):
        self.now += s

    def run(self, cmd, nodes=None, timeout=None):
        out = {n.name: Result(n.name, "fabric.sh apply", 0, stdout="@@ started\n/x") for n in nodes}
        out["spark-2"] = Result("spark-2", "fabric.sh apply", None, error=f"timed out after {timeout} s", timed_out=True)
        self.now += timeout
        return Results(out)

    def run_on(self, node, cmd, timeout=None):
        verb = cmd.args[0]
        self.said.append((node.name, verb))
        if node.name == "spark-2":
            if self.now < self.deadline:
                return Result(node.name, "fabric.sh status", None, error="connection timed out")
            return Result(node.name, "fabric.sh status", 0, stdout="@@ state\nrolled-back\n@@ why\nno confirmation\n")
        links = json.dumps([link(r.interface, 9000, f"{r.ip}/{r.prefix}") for r in node.rails])
        applied = "applied" if self.now < self.deadline else "rolled-back"  # its guard's deadline
        state = {"status": applied, "abort": "rolled-back"}.get(verb, verb)
        return Result(node.name, "fabric.sh", 0, stdout=plan_output(state=state, links=links))


def test_a_start_whose_answer_the_change_swallowed_is_watched_and_named_cut_off(monkeypatch):
    """CI: the guard's `netplan apply` cut spark-2's management address before the SSH answer to
    the start came back. That node is watched like the others (its guard runs), named cut-off when
    its guard has rolled back, and the other node is rolled back with it."""
    params = load(ROOT / "parameters" / "lab.yaml")
    fake = LostStart(params, deadline=20)
    monkeypatch.setattr(fabric, "time", fake)
    monkeypatch.setattr(fabric, "drop", lambda node, ssh: None)
    plans = [fabric._plan_one(params, n, plan_output(
        target="absent", current="", others="", nm="", generate="rc=0", root="root",
        links=json.dumps([link(r.interface, 1500) for r in n.rails]))) for n in params.nodes]
    out = fabric.apply(params, plans, deadline_s=20, cluster=fake, say=lambda *_: None)
    assert [(o.node, o.status) for o in out] == [("spark-1", "held-back"), ("spark-2", "cut-off")]
    assert "did not answer a fresh SSH connection" in out[1].seen and "Its guard restored" in out[1].seen
    assert ("spark-1", "abort") in fake.said and ("spark-1", "confirm") not in fake.said
