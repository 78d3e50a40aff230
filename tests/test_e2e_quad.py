"""The whole runbook on a 4-node lab, 00 to 08, the way a Spark owner with four boxes on a switch
runs it: tensor parallel 2 x pipeline parallel 2 over the Ray executor, with the parameters file
that `sparkbook lab up --nodes 4` writes. The session's 2-node lab is taken down for it (the new
workers come up holding the head's images: tests/conftest.py's `resized`), and a 2-node test run
after it gets its 2 nodes back."""

import csv
import json
import re
import urllib.request

import pytest
import yaml

from conftest import resized
from jupyterlab_harness import light_params
from sparkbook.lab import faults, params_file
from sparkbook.params import load
from sparkbook.runbook.runner import run

STEPS = ["00_inventory", "01_preflight", "02_collectives", "03_distribute_image", "04_ray_cluster",
         "05_serve", "06_smoke_test", "07_benchmark", "08_teardown"]
NODES = [f"spark-{i}" for i in range(1, 5)]
SLOW_NODE = "spark-3"


@pytest.fixture(scope="module")
def quad_runs(lab, tmp_path_factory):
    """The whole runbook on 4 nodes; then 04, 05, a chat request and 08 with only spark-1 and
    spark-3 serving (tensor parallel 2), the other two left out of Ray and vLLM. The parameters are the lab's 4-node
    file made lighter as the JupyterLab test does (fewer benchmark levels, a shorter all-reduce
    sweep; the soak as it is, long enough to judge its drift): what 4 nodes prove is the layout,
    the fan-out and the two-stage engine, not the numbers."""
    with resized(lab, 4):
        out = tmp_path_factory.mktemp("quad")
        light, data = out.parent / "quad.yaml", light_params(params_file(4))
        # a soak long enough to judge (the file's), after the light sequential burn-in
        data["smoke"] = {**yaml.safe_load(params_file(4).read_text())["smoke"], "requests": data["smoke"]["requests"]}
        light.write_text(yaml.safe_dump(data))
        whole = run(light, out=out)
        data = yaml.safe_load(light.read_text())
        data["serving"].update(nodes=["spark-1", "spark-3"], pipeline_parallel_size=1)
        subset_file = out.parent / "quad-subset.yaml"
        subset_file.write_text(yaml.safe_dump(data))
        subset = tmp_path_factory.mktemp("quad-subset") / "run"  # beside no other run: 05's gate reads those
        served = run(subset_file, steps="04,05", out=subset, report=False)
        # one chat request through the two stages' all-reduce between spark-1 and spark-3 (06's
        # checks are the whole runbook's above; here the layout is what is new)
        chat = _post(load(subset_file).endpoint + "/v1/chat/completions", {
            "model": data["model"]["path"], "max_tokens": 8, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Hi"}]}) if served["status"] == "passed" else None
        torn = run(subset_file, steps="08", out=subset, report=False)
        # one slowed link among four (issue 31): spark-3's first rail shaped at both ends, its
        # counters clean; 02 alone, after the whole run (the image is on every node)
        slow = tmp_path_factory.mktemp("quad-slow-link") / "run"
        faults.apply(lab, "slow-cable", SLOW_NODE, rate="400mbit")
        try:
            slowed = run(light, steps="02", out=slow, report=False)
        finally:
            faults.heal(lab, "slow-cable")
        return (out, whole), (subset, served["steps"] + torn["steps"], chat), (slow, slowed)


def _post(url, data):
    req = urllib.request.Request(url, json.dumps(data).encode(), {"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def quad_run(quad_runs):
    return quad_runs[0]


def verdict(out, step):
    return json.loads((out / "verdicts" / f"{step}.json").read_text())


def test_every_step_passes_on_four_nodes(quad_run):
    out, summary = quad_run
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [(s, "passed") for s in STEPS], \
        json.dumps(summary, indent=2)


def test_tp2_pp2_ran_one_ray_worker_per_node_in_a_two_stage_engine(quad_run):
    out, _ = quad_run
    params = yaml.safe_load((out / "parameters.yaml").read_text())
    s = params["serving"]
    assert (s["tensor_parallel_size"], s["pipeline_parallel_size"], s["executor"]) == (2, 2, "ray")
    serving = json.loads((out / "serving.json").read_text())
    assert serving["ray_workers"] == {n: 1 for n in NODES}
    # the engine's own configuration line (Ray folds the workers' similar lines into one, so
    # which rank's "PP rank 1" line shows is chance): 4 workers, one per node, two stages
    log = (out / "logs" / "spark-1" / "vllm-serve.log").read_text(errors="replace")
    assert re.search(r"tensor_parallel_size=2, pipeline_parallel_size=2\b", log), "no PP 2 engine in the log"
    smoke = {c["check"]: c["status"] for c in verdict(out, "06_smoke_test")["checks"]}
    assert set(smoke.values()) == {"PASS"}, smoke


def test_preflight_names_the_switch_and_reaches_the_serving_ports_between_all_nodes(quad_run):
    out, _ = quad_run
    checks = verdict(out, "01_preflight")["checks"]
    layout = [c for c in checks if c["check"] == "fabric layout"]
    assert len(layout) == 1 and layout[0]["status"] == "PASS" and "switch" in layout[0]["observed"]
    tcp = {c["node"]: c["status"] for c in checks if c["check"].startswith("tcp")}
    assert tcp == {n: "PASS" for n in NODES}
    # the parity table: every fact shown for all 4 nodes, alike (the lab's nodes share one machine)
    with open(out / "parity.csv", newline="") as f:
        parity = list(csv.DictReader(f))
    assert [r["parity"] for r in parity] == ["same"] * len(parity) and len(parity) >= 12
    assert all(r[n] not in ("", "-") for r in parity for n in NODES if r["fact"] != "BIOS")


def test_inventory_lists_every_nodes_cx7_ports_and_the_rails_are_the_cabled_ones(quad_run):
    """00's ports table (`sparkbook discover`'s reading) on 4 nodes: each node's two cabled twins
    at its rail addresses, the two uncabled ones Down, and nothing that differs from the rails."""
    out, _ = quad_run
    with open(out / "ports.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cabled = sorted((r["hostname"], r["netdev"], r["ipv4"]) for r in rows if r["link"] == "cabled")
    assert cabled == sorted((n, i, f"10.77.{k}.{10 + j}/24") for j, n in enumerate(NODES, 1)
                            for k, i in ((1, "enp1s0f1np1"), (2, "enP2p1s0f1np1")))
    assert sorted(r["link"] for r in rows if r["link"] != "cabled") == ["Down"] * 8
    shown = json.dumps(json.loads((out / "00_inventory.ipynb").read_text())["cells"])
    assert "the parameters' rails are the cabled ports" in shown


def test_the_report_shows_a_node_by_check_matrix(quad_run):
    out, _ = quad_run
    html = (out / "report.html").read_text()
    assert "sparkbook-by-node" in html and html.count("sparkbook-matrix") >= 3  # 00, 01, 08 at least
    assert all(f">{n}<" in html for n in NODES)


def test_a_subset_serves_while_the_other_nodes_stay_out_of_ray_and_vllm(quad_runs):
    out, steps, chat = quad_runs[1]
    assert [(s["name"], s["status"]) for s in steps] == [
        (s, "passed") for s in ("04_ray_cluster", "05_serve", "08_teardown")], steps
    assert chat["usage"]["completion_tokens"] == 8, chat
    serving = json.loads((out / "serving.json").read_text())
    assert serving["ray_workers"] == {"spark-1": 1, "spark-3": 1}
    ray = {c["node"] for c in verdict(out, "04_ray_cluster")["checks"] if c["check"] == "in the Ray cluster"}
    assert ray == {"spark-1", "spark-3"}


def test_compare_of_the_two_and_four_node_runs_renders_both_and_their_layouts(full_run, quad_run):
    """`sparkbook compare` of two real runs: the 2-node runbook (tests/test_e2e.py's, TP 2) and this
    4-node one (TP 2 x PP 2), side by side: not comparable, for the layout and the node count; both
    in the history (they are sibling folders, of one deployment); each run's start-up time, as
    measured, in the table; no form of the canaries; the page renders in headless Chromium with
    every plot loaded."""
    from conftest import API_KEY, CANARY
    from sparkbook.cli import main
    from sparkbook.book.redact import _forms
    from test_compare import render
    (two, _), (four, _) = full_run, quad_run
    assert main(["compare", str(two), str(four)]) == 0
    page_path = two / "compare.html"
    page = page_path.read_text()
    forms = {f for c in (CANARY, API_KEY) for f in _forms(c) | {c[:8]}}
    assert [f for f in forms if f in page] == []
    comparable = page.split("<h2>Comparable?</h2>")[1].split("<h2>")[0]
    assert "not comparable" in comparable, comparable
    assert re.search(r"pipeline parallel: 1 -(&gt;|>) 2", comparable) and re.search(r"\bnodes: 2 -(&gt;|>) 4", comparable), comparable
    history = page.split("<h2>History")[1]
    assert two.name in history and four.name in history
    for run_dir in (two, four):
        seconds = json.loads((run_dir / "serving.json").read_text())["seconds"]
        assert f"{seconds:.1f} s (" in page
    render(page_path, [two.name, four.name], images=4)


def test_one_slowed_link_among_four_is_named_by_02(quad_runs):
    """spark-3's cable on the first rail at 400 Mbit/s, every counter clean: 02 fails, and both of
    its ways of looking name spark-3: the cables measured one by one (all of spark-3's links slow
    both ways, the others at rate: the reboot remedy), and the all-reduce of each pair of nodes after
    the 4-node one fell below its bar (every pair with spark-3 slow, the other three at the bar)."""
    out, summary = quad_runs[2]
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [("02_collectives", "failed")], summary
    checks = verdict(out, "02_collectives")["checks"]
    at_fault = [c for c in checks if c["check"] == "link at fault"]
    assert [(c["node"], c["status"]) for c in at_fault] == [(SLOW_NODE, "FAIL")] * 2, at_fault
    cables, pairs = at_fault
    assert "enp1s0f1np1: every link through spark-3 is slow (3 of 3" in cables["observed"]
    assert "reboot both nodes" in cables["remedy"]
    assert "every pair with spark-3 is slow (3 of 3)" in pairs["observed"]
    slow_links = sorted(c["node"] for c in checks if c["check"] == "rdma" and c["status"] == "FAIL")
    assert slow_links == ["spark-1, spark-3", "spark-2, spark-3", "spark-3, spark-4"]
    assert all("slow both ways" in c["observed"] for c in checks if c["check"] == "rdma" and c["status"] == "FAIL")
    slow_pairs = sorted(c["node"] for c in checks if c["check"] == "pair all-reduce" and c["status"] == "FAIL")
    assert slow_pairs == slow_links
    with open(out / "rdma.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len({(r["interface"], r["from"], r["to"]) for r in rows if r["test"] != "both"}) == 2 * 12
