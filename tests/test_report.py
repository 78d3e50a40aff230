"""Verdicts and the run report at eight nodes: a node × check matrix built from the real preflight
check builders over eight synthetic node reports (a rail cable out, a firewall), the details of only what did
not pass, every check kept in the JSON; one or two nodes keep the full table; the report's overview
by node and its commands grouped across nodes."""

import html
import json
import re

import nbformat
import pytest

from sparkbook.record import report
from sparkbook.book.errors import CheckFailed
from sparkbook.lab.nodes import lab_params
from sparkbook.params import validate
from sparkbook.preflight import Preflight
from sparkbook.steps import preflight as step
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN, Check, Verdict, is_node, mark, nodes_label

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
    assert len(rows) < 36 and lines[3 + len(rows):][:2] == ["", "not passed:"]  # one screen
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
    # the error carries its verdict: whoever catches it reads the rows, not the text
    assert e.value.verdict is v and [c.node for c in e.value.verdict.failures] == ["a", "b", "c"]


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
    from sparkbook.book import redact
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


# ------------------------------------------------------------------------ a received run folder

HOSTILE = "before\n\n[x](javascript:alert(1)) <script>alert(1)</script>\n\n<img src=x onerror=alert(1)> after"
# what would make the page run something: a javascript: link, a script, an event handler
LIVE = re.compile(r"""href\s*=\s*["']?\s*javascript:|<script|<img[^>]*onerror""", re.I)


def page_text(page):
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_a_value_with_a_blank_line_a_link_and_a_script_renders_inert(tmp_path):
    """Every value the page adds to the notebooks, each holding a blank line (which ends an HTML
    block in Markdown), a Markdown link to javascript:, a script and an event handler: shown as text."""
    from sparkbook.record import fingerprint
    v = Verdict(HOSTILE, [Check(HOSTILE, "spark-1", FAIL, HOSTILE, command=f"ls {HOSTILE}")],
                key_numbers=[(HOSTILE, HOSTILE)])
    out = run_folder(tmp_path, v)
    summary = json.loads((out / "summary.json").read_text())
    summary.update(deployment=HOSTILE, params=HOSTILE, started=HOSTILE, finished=HOSTILE, status=HOSTILE)
    summary["steps"][0].update(name=HOSTILE, error=HOSTILE)
    (out / "summary.json").write_text(json.dumps(summary))
    fingerprint.save(fingerprint.Fingerprint(deployment=HOSTILE, serving={"flags": [HOSTILE]},
                                             nodes=[{"name": HOSTILE, "driver": HOSTILE}]), out)
    page = report.build(out).read_text()
    assert not LIVE.search(page), page[max(LIVE.search(page).start() - 300, 0):][:600]
    # each value is there, as text: index, fingerprint, by node, key numbers, heading, error, commands
    assert page_text(page).count("[x](javascript:alert(1)) <script>alert(1)</script>") >= 10


def test_a_link_planted_in_a_received_run_folder_is_neither_written_through_nor_read(tmp_path):
    import os
    import shutil
    out = run_folder(tmp_path, Verdict("t", [Check("x", "a", PASS)], key_numbers=[("inside", "1")]))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "somefile").write_text("keep me")
    (out / "report.html").symlink_to(outside / "somefile")
    page = report.build(out)
    assert (outside / "somefile").read_text() == "keep me"
    assert page == out / "report.html" and not page.is_symlink() and "sparkbook run" in page.read_text()
    page.unlink()
    (outside / "hard").write_text("keep me too")
    os.link(outside / "hard", page)  # a hard link: renamed over, not written into
    report.build(out)
    assert (outside / "hard").read_text() == "keep me too" and "sparkbook run" in page.read_text()
    # a linked subfolder: what it points at is not read, and the page says so
    Verdict("o", [Check("y", "b", PASS)], key_numbers=[("outside", "OUTSIDE-VALUE")]).save(
        outside / "verdicts" / "01_preflight.json")
    shutil.rmtree(out / "verdicts")
    (out / "verdicts").symlink_to(outside / "verdicts")
    text = page_text(report.build(out).read_text())
    assert "OUTSIDE-VALUE" not in text and "verdicts : unreadable: a symbolic link: not followed" in text


def _edit(name, change):
    """A mutation of the run folder's file ``name``: ``change`` of its JSON (returning the new
    value), or bytes that replace it."""
    def apply(out):
        path = out / name
        if isinstance(change, bytes):
            path.write_bytes(change)
        else:
            path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return apply


def _step0(**fields):
    return lambda s: {**s, "steps": [{**s["steps"][0], **fields}]}


def _fifo(out):
    import os
    (out / "summary.json").unlink()
    os.mkfifo(out / "summary.json")


def _link(out):
    (out / "summary.json").rename(out / "real.json")
    (out / "summary.json").symlink_to(out / "real.json")


def _huge(out):
    from sparkbook.record import folder as runfolder
    (out / "summary.json").write_bytes(b" " * (runfolder.MAX_BYTES + 1) + b"{}")


# (what, mutation, the one line sparkbook report says: an error, or in the page)
MALFORMED = [
    ("truncated", _edit("summary.json", b'{"deployment": "lab", "steps": [{"st'),
     "summary.json: not JSON: Unterminated string starting at (line 1, column 34)"),
    ("a list", _edit("summary.json", b"[]"), "summary.json: not a JSON object but a list"),
    ("not UTF-8", _edit("summary.json", b'\xff{"steps": []}'), "summary.json: not UTF-8 (byte 0xff at offset 0)"),
    ("nested too deep", _edit("summary.json", b"[" * 100_000 + b"]" * 100_000),
     "summary.json: not JSON that can be read: nested too deep"),
    ("a text for a number", _edit("summary.json", _step0(duration_s="9.5")),
     "summary.json: steps[0].duration_s: Input should be a valid number (got '9.5')"),
    ("no steps", _edit("summary.json", lambda s: {"deployment": "lab"}), "summary.json: steps: required field is missing"),
    ("steps of numbers", _edit("summary.json", lambda s: {**s, "steps": [1]}),
     "summary.json: steps[0]: Input should be a JSON object (got 1)"),
    ("a notebook outside", _edit("summary.json", _step0(notebook="../../outside.ipynb")),
     "summary.json: steps[0].notebook: must name a file in the run folder itself (got '../../outside.ipynb')"),
    ("a FIFO", _fifo, "summary.json: not a regular file"),
    ("a link", _link, "summary.json: a symbolic link: not followed"),
    ("huge", _huge, "summary.json: too large: 67108867 bytes (at most 67108864 are read)"),
    # pieces below the summary: the page shows the rest and names them
    ("a check's status", _edit("verdicts/01_preflight.json", lambda v: {**v, "checks": [{**v["checks"][0], "status": "MAYBE"}]}),
     "verdicts/01_preflight.json : unreadable: checks[0].status: Input should be 'PASS', 'WARN', 'FAIL' or 'SKIP'"),
    ("a key number's pair", _edit("verdicts/01_preflight.json", lambda v: {**v, "key_numbers": [["alone"]]}),
     "verdicts/01_preflight.json : unreadable: key_numbers[0]: List should have at least 2 items after validation, not 1"),
    ("a truncated verdict", _edit("verdicts/01_preflight.json", b'{"title": "t", "checks": [{'),
     "verdicts/01_preflight.json : unreadable: not JSON: Expecting property name enclosed in double quotes"),
    ("a truncated notebook", _edit("01_preflight.ipynb", b'{"cells": ['),
     "01_preflight.ipynb : unreadable: not JSON: Expecting value (line 1, column 12)"),
    ("a notebook's cells", _edit("01_preflight.ipynb", lambda nb: {**nb, "cells": "none"}),
     "01_preflight.ipynb : unreadable: cells: Input should be a valid list (got 'none')"),
    ("a notebook's cell", _edit("01_preflight.ipynb", lambda nb: {**nb, "cells": [{"cell_type": "code"}]}),
     "01_preflight.ipynb : unreadable: not a notebook: "),
    ("a fingerprint's node", _edit("fingerprint.json", b'{"nodes": [{"driver": "580"}]}'),
     "fingerprint.json : unreadable: nodes[0].name: required field is missing"),
    ("a fingerprint's flags", _edit("fingerprint.json", b'{"serving": {"flags": "--enforce-eager"}}'),
     "fingerprint.json : unreadable: serving.flags: Input should be a valid list"),
]


@pytest.mark.parametrize("mutation,expected", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_malformed_run_folder_is_said_in_one_line_without_a_traceback(tmp_path, capsys, mutation, expected):
    import signal
    from sparkbook.cli import main
    out = run_folder(tmp_path, Verdict("t", [Check("x", "a", PASS)], key_numbers=[("k", "v")]))
    (out / "fingerprint.json").write_text("{}")
    mutation(out)

    def hung(*_):
        raise TimeoutError("sparkbook report hung (a FIFO opened for reading?)")
    signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        code = main(["report", str(out)])
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err
    if code == 0:  # the page, with what it could not read named at its top
        assert err == ""
        top = page_text((out / "report.html").read_text().split("sparkbook-unreadable", 1)[1].split("</ul>")[0])
        assert expected in re.sub(r"\s+", " ", top), top
    else:
        assert code == 2 and err == f"sparkbook: {out}: not a run folder that can be read: {expected}\n", err


# what a received notebook may carry as HTML of its own, in each place nbconvert renders it from
PLANTED = ("<script>alert(1)</script><img src=x onerror=alert(2)><a href='javascript:alert(3)'>j</a>"
           "<iframe src='https://evil.example/'></iframe><form action='https://evil.example/'><input></form>"
           "<b style='background:url(https://evil.example/beacon.png)' onclick='alert(4)'>styled</b>"
           "<img src='https://evil.example/pixel.png'><style>body{background:url(https://evil.example/)}</style>"
           "<object data='https://evil.example/x'></object><svg onload='alert(5)'></svg>")
# anything that runs, or fetches from the network, when the page opens or is clicked
ACTIVE = re.compile(r"<script|<iframe|<form|<object|<style>body|<svg|\bon[a-z]+\s*=|javascript:|"
                    r"evil\.example/(?:beacon|pixel)?", re.I)


def test_html_a_received_notebook_carries_is_shown_without_anything_that_runs_or_fetches(tmp_path):
    """A received notebook's own HTML, in a Markdown cell, an HTML output, a Markdown output, an
    SVG output and a raw HTML cell: nothing that runs or fetches is left; the text and a plain
    link stay. The page's own part (the index, its links to each step) is untouched."""
    out = run_folder(tmp_path, Verdict("t", [Check("x", "a", PASS)]))
    nb = nbformat.read(out / "01_preflight.ipynb", as_version=4)
    code = nbformat.v4.new_code_cell("x")
    code.outputs = [nbformat.v4.new_output("display_data", data={"text/html": PLANTED + "<p>kept text</p>"}),
                    nbformat.v4.new_output("display_data", data={"text/markdown": PLANTED}),
                    nbformat.v4.new_output("display_data", data={"image/svg+xml": f"<svg onload='alert(6)'>{PLANTED}</svg>"})]
    raw = nbformat.v4.new_raw_cell(PLANTED, metadata={"raw_mimetype": "text/html"})
    pixel = "data:image/png;base64,iVBORw0KGgo="
    nb.cells += [nbformat.v4.new_markdown_cell(f"[docs](https://example.org/docs) {PLANTED}"
                                               f"<a href='data:text/html,x'>d</a><img src='{pixel}' alt='own'>"),
                 code, raw]
    nbformat.write(nb, out / "01_preflight.ipynb")
    page = report.build(out).read_text()
    body = page.split("</head>", 1)[1]
    assert not ACTIVE.search(body), body[max(ACTIVE.search(body).start() - 200, 0):][:400]
    assert "kept text" in body and "styled" in body and 'href="https://example.org/docs"' in body
    assert 'href="#step-1"' in body  # the index still links to the step's heading
    assert f'src="{pixel}"' in body and "data:text/html" not in body  # its own image; no data link


def test_the_report_keeps_every_status_colour_of_the_verdicts(preflight8, tmp_path):
    """The sanitiser keeps the colours the matrix and the check table set, each one (nbconvert's
    own sanitiser dropped nearly all of them)."""
    from sparkbook.book.verdict import COLOURS
    out = run_folder(tmp_path, preflight8)
    shown = preflight8._repr_html_()
    page = report.build(out).read_text()
    for colour in set(COLOURS.values()):
        made = len(re.findall(rf"(?:background-)?color:\s*{re.escape(colour)}", shown))
        kept = len(re.findall(rf"(?:background-)?color:\s*{re.escape(colour)}", page))
        assert made and kept >= made, (colour, made, kept)


def test_a_step_whose_kernel_never_started_still_gets_a_report(tmp_path):
    """papermill saves the notebook of a step whose kernel did not answer in time without a
    language_info (seen on a loaded machine: "Kernel didn't respond in 60 seconds"); the page takes
    the language from a step whose kernel started, or none, and builds (it raised
    NotebookValidationError from an empty language_info and ended `sparkbook run` with a traceback)."""
    out = run_folder(tmp_path, Verdict("t", [Check("x", "a", PASS)]))
    never = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sparkbook as sb")])
    nbformat.write(never, out / "00_inventory.ipynb")
    summary = json.loads((out / "summary.json").read_text())
    summary["steps"].insert(0, {"step": 0, "name": "00_inventory", "notebook": "00_inventory.ipynb",
                                "status": "failed", "duration_s": 61.3,
                                "error": "RuntimeError: Kernel didn't respond in 60 seconds"})
    (out / "summary.json").write_text(json.dumps(summary))
    page = report.build(out).read_text()
    assert re.search(r"Kernel didn(&#x27;|&#39;|')t respond in 60 seconds", page)
    (out / "01_preflight.ipynb").unlink()  # no step's kernel started: no language at all
    summary["steps"] = summary["steps"][:1]
    (out / "summary.json").write_text(json.dumps(summary))
    assert "00_inventory" in report.build(out).read_text()
