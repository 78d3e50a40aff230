"""Verdicts and the run report at eight nodes: a node × check matrix built from the real preflight
check builders over eight synthetic node reports (a rail cable out, a firewall), the details of only what did
not pass, every check kept in the JSON; one or two nodes keep the full table; the report's overview
by node and its commands grouped across nodes."""

import html
import json
import re

import nbformat
import pytest

from sparkbook import report
from sparkbook.errors import CheckFailed
from sparkbook.lab.nodes import lab_params
from sparkbook.params import validate
from sparkbook.preflight import Preflight
from sparkbook.steps import preflight as step
from sparkbook.verdict import FAIL, PASS, SKIP, WARN, Check, Verdict, is_node, mark, nodes_label

DOWN = ("spark-5", 1)  # spark-5's second rail: its cable is out


def eight_nodes():
    data = lab_params(8)
    data["serving"].pop("nodes", None)  # one rank per node: valid for any node count
    data["serving"].update(tensor_parallel_size=8, pipeline_parallel_size=1)
    return validate(data)


def node_report(params, node):
    """What a healthy lab node reports (the fields preflight reads), but for the rail in DOWN."""
    ethtool, fec, gids, links, ibdev, ibstat, ping = {}, {}, {}, {}, {}, {}, []
    for r, rail in enumerate(node.rails):
        up = (node.name, r) != DOWN
        ethtool[rail.interface] = {"speed_mbps": 200000 if up else None, "link": up}
        fec[rail.interface] = {"configured": ["Auto"], "active": "RS" if up else None, "error": None}
        gids[rail.hca] = [{"port": 1, "index": 3, "gid": f"::ffff:{rail.ip}", "ipv4": str(rail.ip),
                           "version": "v2", "netdev": rail.interface}]
        links[rail.interface] = {"ifname": rail.interface, "mtu": 9000, "addr_info": [
            {"family": "inet", "local": str(rail.ip), "prefixlen": rail.prefix}]}
        ibdev[rail.hca] = {"port": 1, "netdev": rail.interface, "up": up}
        ibstat[rail.hca] = {"ports": {1: {"state": "Active" if up else "Down",
                                          "physical_state": "LinkUp" if up else "Disabled"}}}
        for peer in params.nodes:
            if peer.name != node.name:
                ok = up and (peer.name, r) != DOWN
                ping.append({"interface": rail.interface, "peer": str(peer.rails[r].ip), "ok": ok})
    facts = {"hostname": node.name, "os": "Ubuntu 24.04.3 LTS", "kernel": "6.11.0-1016-nvidia",
             "arch": "aarch64", "cpus": 20, "memory_gb": 119.7, "memory_available_gb": 113.5,
             "model_disk_free_gb": 3000.0, "docker_disk_free_gb": 3000.0, "docker": "28.3.3",
             "docker_runtimes": ["runc"], "gpus": 1, "gpu_name": "NVIDIA GB10", "driver": "580.95.05"}
    return {"facts": facts, "ethtool": ethtool, "fec": fec, "gids": gids, "links": links, "ibdev2netdev": ibdev, "ibstat": ibstat,
            "ibv_devinfo": None, "ping": ping, "listeners": [], "processes": [], "containers": [],
            "smi": {"driver": "580.95.05", "cuda": "13.0", "processes": [], "gpus": [
                {"index": 0, "name": "NVIDIA GB10", "bus_id": "0000000F:01:00.0", "memory": None,
                 "util_percent": 0}]},
            "image": "sha256:" + "ab" * 32, "venv": None, "skew_s": 0.01,
            "model": {"config.json": {"size": 5, "sha256": "0" * 64}},
            "peers_ssh": {p.name: (p.peer_target, True) for p in params.nodes if p.name != node.name}
            if node.role == "head" else {},
            "tcp": {"listen": {}, "accepted": {}, "probes": 7, "failed": [  # spark-3 drops Ray from spark-7
                {"peer": "spark-3", "address": params.node("spark-3").fabric_address, "port": params.ports.ray,
                 "seen": "timeout"}] if node.name == "spark-7" else []}}


@pytest.fixture(scope="module")
def preflight8():
    params = eight_nodes()
    pf = Preflight({n.name: node_report(params, n) for n in params.nodes}, {},
                   {n.name: n.role for n in params.nodes})
    return Verdict(step.TITLE, step.checks(params, pf))


def test_eight_nodes_read_as_a_matrix_with_the_failures_detailed(preflight8):
    v = preflight8
    nodes = [f"spark-{i}" for i in range(1, 9)]
    assert v.nodes() == nodes and len(v.checks) > 150  # what a table of one row per check would show
    text = v.to_text()
    lines = text.splitlines()
    assert lines[0] == v.headline() and lines[1].split() == ["check", *nodes]
    rows = {r.name: r for r in v.rows()}
    matrix = lines[3:3 + len(rows)]
    assert len(rows) < 30 and lines[3 + len(rows):][:2] == ["", "not passed:"]
    column = lambda row, node: _cell(lines[1], row, node, matrix)
    # a node's checks of one kind are one cell: spark-5's rails, one of them down
    assert column("rail port", "spark-5") == "FAIL 1/2" and column("rail port", "spark-4") == "ok ×2"
    assert column("rail mtu", "spark-5") == "ok ×2"
    assert all(column("path mtu", n).startswith("FAIL") for n in nodes)
    assert column("tcp ports", "spark-3") == "FAIL" and column("tcp ports", "spark-7") == "ok"
    # the head's checks in its column only; the cluster's rows across, with what they saw
    assert column("ports free", "spark-1") == "ok" and rows["ports free"].cells.keys() == {"spark-1"}
    assert rows["same os"].scope == "all" and re.search(r"^same os\s+ok spark-1: Ubuntu", text, re.M)
    assert re.search(r"^hf token\s+skip \(local\) the model needs no token$", text, re.M)
    assert rows["ssh head→worker"].cells.keys() == set(nodes[1:]) and column("ssh head→worker", "spark-1") == ""
    # below: only what did not pass, alike nodes as one entry, the remedy once per kind
    details = "\n".join(lines[5 + len(rows):])
    assert "- SKIP nvidia runtime on all 8 nodes: containers get no GPUs" in details
    assert "- FAIL rail port on spark-5: roceP2p1s0f1: state Down, physical Disabled" in details
    assert "\n    all but spark-5: enP2p1s0f1np1 → spark-5 (10.77.2.15): no reply" in details
    assert details.count("remedy: MTU 9000 must hold end to end") == 1
    assert "- FAIL tcp ports on spark-3: spark-7 → spark-3 10.77.1.13:6379 (ray)" in details
    assert "PASS" not in details and " ok " not in details


def _cell(head, row, node, matrix):
    """The text under ``node``'s heading on the matrix line of ``row``."""
    line = next(ln for ln in matrix if ln.startswith(row + "  "))
    start = head.index(node)
    return line[start:].split("  ")[0].strip() if len(line) > start else ""


def test_the_html_matrix_colours_each_cell_and_keeps_what_passed_on_hover(preflight8):
    page = preflight8._repr_html_()
    assert "sparkbook-matrix" in page and page.count("<tr>") < 30 + 20  # the matrix's rows, the details' rows
    assert "<th style='text-align:left;vertical-align:top'>spark-8</th>" in page
    assert "#cf222e;color:#fff;padding:0 4px;border-radius:3px;white-space:nowrap'>FAIL 1/2</b>" in page
    assert "title='PASS rail rate: enp1s0f1np1: 200000Mb/s&#10;PASS rail rate: enP2p1s0f1np1:" in page
    assert "colspan='8'" in page and "class='sparkbook-details'" in page
    assert "<b>all but spark-5</b>: enP2p1s0f1np1 → spark-5 (10.77.2.15): no reply" in page
    assert "<code>ping -M do -s 8972 -I enP2p1s0f1np1 10.77.2.15</code>" in page


def test_the_json_keeps_every_check_and_reads_back(preflight8, tmp_path):
    saved = json.loads(preflight8.save(tmp_path / "v.json").read_text())
    assert len(saved["checks"]) == len(preflight8.checks)
    again = Verdict.from_json(saved)
    assert again == preflight8 and again.to_text() == preflight8.to_text()


def test_a_verdict_that_checked_nothing_reads_skip_not_pass():
    skipped = Verdict("06 smoke test", [Check("reasoning", "api", SKIP, "no reasoning parser"),
                                        Check("soak", "api", SKIP, "smoke.soak_s is 0")])
    assert skipped.status == SKIP and skipped.headline() == "06 smoke test: SKIP (2 SKIP): nothing was checked"
    assert Verdict("t").status == SKIP and Verdict("t").headline() == "t: SKIP (no checks): nothing was checked"
    skipped.raise_for_failures()  # nothing failed either: the cell goes on
    assert skipped.add(Check("model listed", "api", PASS)).status == PASS


def test_one_or_two_nodes_keep_the_full_table():
    checks = [Check("gpu", "a", PASS, "1 x GB10"), Check("gpu", "b", FAIL, "none", "1 x GB10", "fix it"),
              Check("same os", "all", PASS, "a: x / b: x")]
    v = Verdict("t", checks)
    assert not v.is_matrix and v.to_text() == v.table().to_text() and "1 x GB10" in v.to_text()
    assert v._repr_html_() == v.table()._repr_html_()
    v.add(Check("gpu", "c", PASS, "1 x GB10"))
    assert v.is_matrix and v.to_text().splitlines()[1].split() == ["check", "a", "b", "c"]


def test_names_that_carry_a_node_share_a_row_and_lists_of_nodes_span():
    nodes = [f"node-{i}" for i in (1, 2, 3, 10)]
    checks = [Check(f"tcp ray → {peer}", n, PASS if peer != "node-10" else FAIL, "x", remedy="open it")
              for n in nodes for peer in nodes if peer != n]
    checks.append(Check("cleanup", "node-1, node-2", FAIL, "left running"))
    checks.append(Check("node-1.lab.example reachable", "node-1", PASS))  # not node-1's name
    checks.append(Check("layout", None, PASS, "a switch"))  # the cluster's, as "all" is
    v = Verdict("t", checks)
    rows = {r.name: r for r in v.rows()}
    assert list(rows) == ["tcp ray → *", "cleanup", "node-1.lab.example reachable", "layout"]
    assert rows["layout"].scope == "all" and re.search(r"^layout\s+ok a switch$", v.to_text(), re.M)
    assert [c.check for c in rows["tcp ray → *"].cells["node-2"]] == [
        "tcp ray → node-1", "tcp ray → node-3", "tcp ray → node-10"]
    assert rows["cleanup"].scope == "node-1, node-2" and v.nodes() == nodes
    assert "cleanup  FAIL (node-1, node-2) left running" in re.sub(r" {2,}", "  ", v.to_text())
    failed = next(g for g in v.details() if g.name == "tcp ray → *")
    assert failed.seen == {("tcp ray → node-10", "x", ""): ["node-1", "node-2", "node-3"]}
    assert "- FAIL tcp ray → node-10 on all but node-10: x" in v.to_text()


def test_failures_raise_once_per_kind_with_the_remedy():
    v = Verdict("t", [Check("disk", n, FAIL, "1 GB free", "100 GB", "free some space") for n in "abc"]
                + [Check("clock", "a", WARN, "+0.7 s")])
    with pytest.raises(CheckFailed) as e:
        v.raise_for_failures()
    assert str(e.value).splitlines() == ["t: 3 check(s) failed", "- FAIL disk on all 3 nodes: 1 GB free "
                                         "(expected 100 GB)", "  remedy: free some space"]


def test_a_cell_marks_the_worst_status_and_how_many_share_it():
    v = Verdict("t", [Check("x", n, s) for n, s in [("a", PASS), ("a", SKIP), ("b", WARN), ("b", FAIL),
                                                       ("b", FAIL), ("c", PASS)]])
    assert v.to_text().splitlines()[3].split() == ["x", "skip", "1/2", "FAIL", "2/3", "ok"]
    assert nodes_label(["a", "b"], ["a", "b", "c", "d"]) == "a, b"
    assert nodes_label(["a", "b", "c"], ["a", "b", "c", "d"]) == "all but d"


# ------------------------------------------------------------------------------------ the report

def run_folder(tmp_path, verdict):
    """A run folder as `sparkbook run` leaves it: the summary, the executed notebook whose last
    cell showed the verdict, and the verdict's JSON."""
    out = tmp_path / "run"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("ctx.conclude(outcome)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/html": verdict._repr_html_(), "text/plain": verdict.to_text()})]
    nb.cells = [nbformat.v4.new_markdown_cell("# 01 · Preflight"), cell]
    nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                       language_info={"name": "python"})
    out.mkdir()
    nbformat.write(nb, out / "01_preflight.ipynb")
    verdict.save(out / "verdicts" / "01_preflight.json")
    (out / "summary.json").write_text(json.dumps({
        "deployment": "lab", "params": "lab-8.yaml", "status": "failed", "started": "t0", "finished": "t1",
        "steps": [{"step": 1, "name": "01_preflight", "notebook": "01_preflight.ipynb", "status": "failed",
                   "duration_s": 9.5, "error": "CheckFailed: 01 preflight: 16 check(s) failed"}]}))
    return out


def test_the_report_at_eight_nodes_shows_the_matrix_an_overview_by_node_and_grouped_commands(
        preflight8, tmp_path):
    out = run_folder(tmp_path, preflight8)
    page = report.build(out).read_text()
    assert "sparkbook-matrix" in page and "FAIL 1/2" in page
    overview = page.split("sparkbook-by-node")[1].split("</table>")[0]
    assert overview.count("<tr>") == 2 and overview.count("<th>") == 1 + 8 + 1  # step, nodes, cluster
    cells = re.findall(r"nowrap.>([^<]*)</b>", overview)
    by_node = [[c for c in preflight8.checks if c.node == n] for n in preflight8.nodes()]
    assert cells == [mark(cs) for cs in by_node] + [mark([c for c in preflight8.checks if not is_node(c.node)])]
    fails = [sum(c.status == FAIL for c in cs) for cs in by_node]
    assert max(range(8), key=fails.__getitem__) == 4 and cells[4] == f"FAIL {fails[4]}/{len(by_node[4])}"
    ran = report.commands(out)
    assert len(ran) < 40 < len({(c.node, c.command) for c in preflight8.checks if c.command})
    assert ("01_preflight", "all 8 nodes", "ethtool enp1s0f1np1") in ran
    assert ("01_preflight", "all but spark-5", "ping -M do -s 8972 -I enP2p1s0f1np1 10.77.2.15") in ran


def test_the_report_masks_every_form_of_a_secret(tmp_path, monkeypatch):
    """A secret a cell printed (HTML-escaped in the page), one an HTML output escaped itself, one in
    markdown (where emphasis would split it), one cut by the index's error column."""
    from sparkbook import redact
    secret = 'pw_"Zorblax&<Q>_9v_Lm\'k'  # a quote, markup and underscores
    monkeypatch.setattr(redact, "_values", set())
    redact.protect_value(secret)
    v = Verdict("t", [Check("x", "a", PASS)])
    out = run_folder(tmp_path, v)
    nb = nbformat.read(out / "01_preflight.ipynb", 4)
    nb.cells.append(nbformat.v4.new_markdown_cell(f"the key is {secret} here"))
    nb.cells.append(nbformat.v4.new_code_cell("print(key)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text=f"key={secret}\n"),
        nbformat.v4.new_output("display_data", data={"text/html": f"<b>{html.escape(secret)}</b>",
                                                     "text/plain": secret})]))
    nbformat.write(nb, out / "01_preflight.ipynb")
    summary = json.loads((out / "summary.json").read_text())
    summary["steps"][0]["error"] = "CheckFailed: " + "x" * 137 + secret  # the index shows 10 of it
    (out / "summary.json").write_text(json.dumps(summary))
    page = report.build(out).read_text()
    assert "Zorblax" not in page and secret[:8] not in page and html.escape(secret[:8]) not in page
    assert page.count(redact.MASK) >= 4
