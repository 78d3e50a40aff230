"""Day one on the lab, as an owner lives it: two nodes fresh from the box (`lab up --unwired`: the
fabric links cabled, no address, MTU 1500, nothing persisting one), then `sparkbook discover` writes
the parameters file (planned rail addresses), `sparkbook fabric plan` shows the change, the day-one
notebook (headless) writes the same file and applies it under each node's guard, preflight and the collectives pass on the file as written,
again after every node reboots, and `fabric restore` brings back the nodes' files byte for byte and
their addresses. Last, addresses set by hand with `ip`: 01 warns that nothing persists them, and a
reboot takes them away.

The guard is proven by the lab fault mgmt-cut: spark-2's `netplan apply` takes its management
address down while sparkbook's file is there (as a renderer switch does on a real node). sparkbook
cannot reach it to confirm, so its guard restores the backup at the deadline by itself; spark-1,
applied and ready, is rolled back with it (no node half-done), and the verdict says so.
"""

import hashlib
import json
import re
import time

import papermill
import pytest

from sparkbook import preflight
from sparkbook.book.verdict import FAIL, PASS, WARN
from sparkbook.cli import main
from sparkbook.lab import faults
from sparkbook.lab.lab import _port_open
from sparkbook.lab.nodes import RAILS, LabError, sh
from sparkbook.lab.power import reboot
from sparkbook.nodes.remote import Cluster
from sparkbook.params import load
from sparkbook.record import expiry
from sparkbook.runbook.runner import run

from conftest import LAB_YAML, steps_seen

NOTEBOOKS = LAB_YAML.parents[1] / "notebooks"

pytestmark = pytest.mark.lab


def netplan_files(lab) -> dict[str, str]:
    """Every lab node's netplan files (the folder its init binds on /etc/netplan) by SHA-256."""
    return {f"{n.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for n in lab.nodes() for p in sorted((n.dir / "netplan").glob("*.yaml"))}


def rails(lab) -> dict[str, tuple]:
    """Each node's rails as (global IPv4 addresses, MTU), read in its namespace."""
    out = {}
    for n in lab.nodes():
        links = {li["ifname"]: li for li in json.loads(sh("ip", "-n", n.netns, "-j", "addr", "show").stdout)}
        for ifname, *_ in RAILS:
            li = links[ifname]
            out[f"{n.name}/{ifname}"] = (tuple(f"{a['local']}/{a['prefixlen']}" for a in li["addr_info"]
                                               if a["family"] == "inet" and a["scope"] == "global"), li["mtu"])
    return out


def steps_pass(params_file, out, steps):
    summary = run(params_file, steps=steps, out=out, report=False)
    assert summary["status"] == "passed", steps_seen(summary)


@pytest.fixture
def fresh_from_the_box(lab):
    """The session's lab as two nodes fresh from the box; afterwards, whatever happened in the test,
    the session's wired lab again (the tests after this one expect it, and a failure here must not
    become theirs)."""
    lab.down(say=lambda *_: None)
    lab.up(2, say=lambda *_: None, seed_images=True, unwired=True)
    yield lab
    for last in (False, False, True):  # a process of a rebooted node still ending holds its cgroup: the next down ends it
        try:
            lab.down(say=lambda *_: None)
            break
        except LabError:
            if last:
                raise
            time.sleep(5)
    lab.up(2, say=lambda *_: None)


def test_discover_plan_apply_reboot_and_restore_on_nodes_fresh_from_the_box(
        fresh_from_the_box, boots_checked, tmp_path, capsys):
    lab = fresh_from_the_box
    files, addresses = netplan_files(lab), rails(lab)
    assert all(a == ((), 1500) for a in addresses.values()) and len(files) == 2  # management files only
    wired = load(LAB_YAML)
    node = wired.nodes[0]
    out = tmp_path / "dayone.yaml"
    assert main(["discover", *(n.host for n in wired.nodes), "--user", node.user, "--key", node.key,
                 "--known-hosts", wired.ssh.known_hosts[0], "--template", str(LAB_YAML), "--name", "dayone",
                 "-o", str(out)]) == 0
    params = load(out)
    assert [[f"{r.interface}={r.ip}" for r in n.rails] for n in params.nodes] == [
        ["enp1s0f1np1=192.168.100.11", "enP2p1s0f1np1=192.168.101.11"],
        ["enp1s0f1np1=192.168.100.12", "enP2p1s0f1np1=192.168.101.12"]]
    capsys.readouterr()

    assert main(["fabric", "plan", "-p", str(out)]) == 0
    shown = capsys.readouterr().out
    assert shown.count("+++ ") == 2 and "enp1s0f1np1: MTU 1500 -> 9000" in shown and "nothing written" in shown
    assert netplan_files(lab) == files and rails(lab) == addresses

    # The guard: spark-2's apply cuts its management address; its own guard heals it at the deadline.
    faults.apply(lab, "mgmt-cut", "spark-2")
    try:
        assert main(["fabric", "apply", "-p", str(out), "--deadline", "20"]) == 1
    finally:
        faults.heal(lab, "mgmt-cut")
    shown = capsys.readouterr().out
    assert re.search(r"FAIL fabric apply on spark-2: after netplan apply the node did not answer a fresh SSH "
                     r"connection to 10\.77\.0\.12 .*the change cut its management address\. Its guard restored", shown)
    assert "FAIL fabric apply on spark-1: rolled back with the others: the change failed on spark-2" in shown
    assert _port_open("10.77.0.12", 22)
    assert netplan_files(lab) == files and rails(lab) == addresses

    # Applied by the day-one notebook, headless: discover again (the same file), plan, apply.
    done = papermill.execute_notebook(
        str(NOTEBOOKS / "day_one.ipynb"), str(tmp_path / "day_one.ipynb"), cwd=str(NOTEBOOKS), progress_bar=False,
        parameters={"hosts": [n.host for n in wired.nodes], "output": str(out), "force": True, "name": "dayone",
                    "template": str(LAB_YAML), "user": node.user, "key": node.key,
                    "known_hosts": wired.ssh.known_hosts, "apply": True})
    shown = "".join(o.get("text", "") for c in done.cells if c.cell_type == "code" for o in c.outputs)
    assert load(out).nodes == params.nodes  # the same file as the CLI wrote
    assert "fabric apply: PASS (4 PASS)" in shown  # the netplan file, then SSH over the rails, on both nodes
    assert re.search(r"ssh mesh +spark-1 +PASS +1 known_hosts and 0 authorized_keys", shown)  # one lab key
    known = (lab.nodes()[0].dir / "ssh" / "known_hosts").read_text()
    assert known.startswith("192.168.100.12,192.168.101.12 ssh-ed25519 ") and known.endswith(" sparkbook:dayone\n")
    capsys.readouterr()
    assert main(["fabric", "plan", "-p", str(out)]) == 0  # applied: nothing left to change
    shown = capsys.readouterr().out
    assert "== spark-1 (10.77.0.11): no change" in shown and "== spark-2: SSH over the fabric for root: no change" in shown
    applied = rails(lab)
    assert applied["spark-2/enP2p1s0f1np1"] == (("192.168.101.12/24",), 9000)
    steps_pass(out, tmp_path / "run1", "01,02")

    # The cable moved to the other QSFP port on spark-2: 01 names the port that is Up instead.
    faults.apply(lab, "twin", "spark-2")
    try:
        rows = [c for c in preflight.checks(params, preflight.gather(params, Cluster.from_params(params)))
                if c.check == "rail map" and c.status == FAIL]
    finally:
        faults.heal(lab, "twin")
    assert [c.node for c in rows] == ["spark-2", "spark-2"]
    assert "Up instead: rocep1s0f0 ==> enp1s0f0np0 (Up)" in rows[0].observed
    assert "the cable sits in another port" in rows[0].remedy and "sparkbook discover" in rows[0].remedy

    # run1's preflight holds until a node boots again (its boot ID, which each lab node has of its own)
    def booted(run_dir):
        return [(c.node, c.status) for c in expiry.holds(params, lambda: Cluster.from_params(params), run_dir)
                if c.check == "booted since"]
    assert booted(tmp_path / "run1") == [("spark-1", PASS), ("spark-2", PASS)]

    took = reboot(lab, ["spark-1", "spark-2"], say=lambda *_: None)
    assert rails(lab) == applied and max(took.values()) < 60  # what the netplan file persists came back
    assert booted(tmp_path / "run1") == [("spark-1", FAIL), ("spark-2", FAIL)]
    # ... so 05, run on its own beside run1, stops at its gate, before any image is touched
    summary = run(out, steps="05", out=tmp_path / "serve-after-reboot", report=False)
    assert ("05_serve", "failed") in [(s["name"], s["status"]) for s in summary["steps"]]
    gate = json.loads((tmp_path / "serve-after-reboot" / "verdicts" / "05_serve.json").read_text())["checks"]
    assert [(c["node"], c["status"]) for c in gate if c["check"] == "booted since"] == [
        ("spark-1", "FAIL"), ("spark-2", "FAIL")]
    assert {c["check"] for c in gate} == {"01_preflight holds", "booted since"}  # nothing else ran
    steps_pass(out, tmp_path / "run2", "01")

    assert main(["fabric", "restore", "-p", str(out)]) == 0
    assert "fabric restore: PASS (4 PASS)" in capsys.readouterr().out
    assert netplan_files(lab) == files and rails(lab) == addresses
    assert all((n.dir / "ssh" / "known_hosts").read_text() == "" for n in lab.nodes())

    # What owners do by hand: the rails' addresses set with `ip`. 01 warns that nothing persists them,
    # and a reboot takes them away.
    for n, node in zip(lab.nodes(), params.nodes):
        for rail in node.rails:
            sh("ip", "-n", n.netns, "addr", "add", f"{rail.ip}/{rail.prefix}", "dev", rail.interface)
            sh("ip", "-n", n.netns, "link", "set", "dev", rail.interface, "mtu", "9000")
    rows = [c for c in preflight.checks(params, preflight.gather(params, Cluster.from_params(params)))
            if c.check == "rail persisted"]
    assert [(c.node, c.status) for c in rows] == [("spark-1", WARN)] * 2 + [("spark-2", WARN)] * 2
    assert "set at runtime only" in rows[0].observed and "sparkbook fabric apply" in rows[0].remedy
    reboot(lab, ["spark-2"], say=lambda *_: None)
    now = rails(lab)
    assert now["spark-2/enp1s0f1np1"] == ((), 1500) and now["spark-1/enp1s0f1np1"] == (("192.168.100.11/24",), 9000)
