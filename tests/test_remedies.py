"""Every remedy a failing check prints, rendered: preflight's check groups on reports with every fact
broken (the tools absent, wrong or down, each in the shapes the parsers give), and the other steps'
checks on failed outcomes. Each FAIL or WARN row must say what to do, name its node, and carry no
unformatted `{name}`, no `None` and no empty parentheses (issue 17: the `rail port` remedy of a
port that is down printed a literal `{where}`)."""

import re
from pathlib import Path

import yaml

from sparkbook import preflight
from sparkbook.facts.inventory import Inventory
from sparkbook.params import validate
from sparkbook.facts.parsers import parse_fec_sections
from sparkbook.preflight.collect import Preflight, parse
from sparkbook.serving.commands import container_name
from sparkbook.serving.deploy import Deployment
from sparkbook.serving.listeners import Listener
from sparkbook.serving.logs import Diagnosis
from sparkbook.serving.ray import RayCluster
from sparkbook.serving.startup import Stall
from sparkbook.serving.teardown import Teardown
from sparkbook.facts.signatures import SIGNATURES
from sparkbook.steps import inventory, ray_cluster, serve, teardown
from sparkbook.book.verdict import FAIL, PASS, SCOPES, WARN, Check, Verdict

LAB = Path(__file__).resolve().parents[1] / "parameters" / "lab.yaml"
FEC_OFF = LAB.parents[1] / "tests" / "fixtures" / "ethtool-show-fec-spark-none-1.txt"
PLACEHOLDER = re.compile(r"\{[A-Za-z_][\w.\[\]'\"]*(![rsa])?(:[^{}]*)?\}")  # a field never formatted
EMPTY = re.compile(r"\(\s*\)")
NONE = re.compile(r"\bNone\b")
# Rows whose observed text may quote a tool's own "None" (ethtool prints FEC "None").
QUOTES_NONE = re.compile(r"\bfec\b", re.I)
# A step named by its number ("03", "08_teardown", "03_distribute_image.ipynb"), not inside a word, a
# version, an address, a time or `--steps 03`: a remedy must name it by its notebook's file, which
# the HTML verdict links (issue 16).
STEP_NAMED = re.compile(r"(?<![\w./:-])(?<!--steps )0\d(_\w+)?(\.ipynb)?(?![\w-]|[.:]\d)")
NOTEBOOKS = {p.name for p in (LAB.parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def unlinked_steps(text: str) -> list[str]:
    """The steps ``text`` names other than by an existing notebook's file name."""
    return [m[0] for m in STEP_NAMED.finditer(text) if m[0] not in NOTEBOOKS]


def params_with(**sections):
    """parameters/lab.yaml with some of its sections' fields replaced."""
    data = yaml.safe_load(LAB.read_text())
    for section, fields in sections.items():
        data[section] = {**data.get(section, {}), **fields} if isinstance(fields, dict) else fields
    return validate(data)


def defects(rows, names) -> list[str]:
    """What is wrong with the FAIL and WARN rows as a person reads them."""
    found = []
    for c in rows:
        if c.status not in (FAIL, WARN):
            continue
        where = f"{c.status} {c.check} on {c.node}"
        if not c.remedy.strip():
            found.append(f"{where}: no remedy")
        if not (c.node in names or c.node in SCOPES):
            found.append(f"{where}: names no node")
        for field in ("check", "observed", "expected", "remedy", "command"):
            text = getattr(c, field)
            if PLACEHOLDER.search(text):
                found.append(f"{where}: unformatted placeholder in {field}: {text!r}")
            if field != "command" and EMPTY.search(text):  # a command may hold `$(...)` or a call
                found.append(f"{where}: empty parentheses in {field}: {text!r}")
            if NONE.search(text) and (field != "observed" or not QUOTES_NONE.search(c.check + " " + text)):
                found.append(f"{where}: None in {field}: {text!r}")
        if unlinked_steps(c.remedy):
            found.append(f"{where}: a step named without its notebook file ({unlinked_steps(c.remedy)}): "
                         f"{c.remedy!r}")
    return found


def rendered(rows, names):
    """The FAIL and WARN rows, asserted free of defects."""
    found = defects(rows, names)
    assert not found, "\n".join(found)
    return [c for c in rows if c.status in (FAIL, WARN)]


def bare():
    """A report with nothing installed (the tools' 'unavailable' markers) to break further."""
    return parse("@@ smi\nnvidia-smi unavailable")


def facts(**kw):
    base = {"hostname": "h", "os": "Ubuntu 24.04.3 LTS", "kernel": "6.11.0-1016-nvidia", "arch": "aarch64",
            "cpus": 20, "memory_gb": 119.7, "memory_available_gb": 113.5, "model_disk_free_gb": 3000.0,
            "docker": "28.3.3", "docker_root": "/var/lib/docker", "docker_disk_free_gb": 3000.0,
            "docker_runtimes": ["nvidia", "runc"], "gpu_problem": None, "gpus": 1, "gpu_name": "NVIDIA GB10",
            "driver": "580.95.05", "gpu_memory": "unified (119.7 GB system)"}
    return {**base, **kw}


def broken_head(params):
    """spark-1, the head: a wrong GPU and a stale engine on it, the runtime down, every rail broken,
    the API port taken, the clock off, the disks full, no image, no model, no SSH to the worker."""
    r = bare()
    r["facts"] = facts(memory_available_gb=None, model_disk_free_gb=1.0, docker_disk_free_gb=2.0,
                       docker="daemon unreachable", docker_runtimes=[])
    r["smi"] = {"driver": "580.95.05", "cuda": "13.0",
                "gpus": [{"index": 0, "name": "NVIDIA H100", "bus_id": "0000000F:01:00.0", "memory": None,
                          "util_percent": 0}],
                "processes": [{"gpu": 0, "pid": 577729, "type": "C", "name": "VLLM::EngineCore", "memory_mib": 89093}]}
    rail0, rail1 = params.head.rails
    r["ibdev2netdev"] = None
    r["ibstat"] = {rail0.hca: {"ports": {1: {"state": "Down", "physical_state": "Disabled", "rate": 40}}},
                   rail1.hca: {"ports": {1: {"state": "Down", "physical_state": "Polling", "rate": None}}}}
    r["ethtool"] = {rail0.interface: {"speed_mbps": None, "link": False}}
    r["links"] = {rail0.interface: {"ifname": rail0.interface, "mtu": 1500, "operstate": "DOWN", "addr_info": []}}
    r["ping"] = [{"interface": rail0.interface, "peer": "10.77.1.12", "ok": False},
                 {"interface": rail1.interface, "peer": "10.77.2.12", "ok": False}]
    r["listeners"] = [f'LISTEN 0 4096 0.0.0.0:{params.ports.api} 0.0.0.0:* users:(("python3",pid=9,fd=3))']
    r["processes"] = ["577729 VLLM::EngineCore"]
    r["containers"] = [[container_name(params, True), params.runtime.image, "Up 3 hours"]]
    r["image"], r["model"] = None, None
    r["peers_ssh"] = {"spark-2": ("root@10.77.1.12", False)}
    r["skew_s"] = 5.2
    r["host"] = {"gpus": [{"bus_id": "0000000F:01:00.0", "pstate": "P0", "reasons": {"HW Slowdown": True, "SW Power Cap": True},
                           "clocks": {"Graphics": 600, "SM": 600}, "max_clocks": {"Graphics": 3003, "SM": 3003}}],
                 "memlock": {"soft": "8192", "hard": "8192"}, "swap_kb": {"total": 16 << 20, "free": 1 << 20},
                 "firmware": {rail0.interface: "28.45.4028", rail1.interface: "28.39.1002"}}
    r["tcp"] = {"listen": {str(params.ports.ray): "listening"}, "accepted": {}, "probes": 5,
                "failed": [{"peer": "spark-2", "address": "10.77.1.12", "port": params.ports.ray, "seen": "timeout"}]}
    return r


def broken_worker(params):
    """spark-2: another OS, kernel and driver, no GPU, its rails mapped wrong and down (ibv_devinfo
    only), a slow link, a drifted image and model, a slightly skewed clock, a busy port."""
    r = bare()
    r["facts"] = facts(os="Ubuntu 22.04.5 LTS", kernel="6.8.0-1", driver="575.57.08", arch="x86_64",
                       gpus=0, gpu_name=None, gpu_problem="NVIDIA-SMI has failed because it couldn't "
                       "communicate with the NVIDIA driver.")
    rail0, rail1 = params.nodes[1].rails
    r["ibdev2netdev"] = {rail0.hca: {"port": 1, "netdev": "enp1s0f0np0", "up": False}}
    r["ibv_devinfo"] = {rail0.hca: {"ports": {1: {"state": "PORT_DOWN", "phys_state": "DISABLED"}}},
                        rail1.hca: {"ports": {1: {"state": "PORT_INIT"}}}}
    r["ethtool"] = {rail0.interface: {"speed_mbps": 100000, "link": True},
                    rail1.interface: {"speed_mbps": 200000, "link": True}}
    r["links"] = {i: {"ifname": i, "mtu": 9000, "operstate": "UP",
                      "addr_info": [{"family": "inet", "local": "10.9.9.9", "prefixlen": 16}]}
                  for i in (rail0.interface, rail1.interface)}
    r["image"] = "sha256:" + "cd" * 32
    r["model"] = {"config.json": {"size": 6, "sha256": "1" * 64}, "other/model.safetensors": {"size": 9, "sha256": "2" * 64}}
    r["skew_s"] = -1.1
    # a 200 Gb/s rail without FEC, as a Spark printed it after re-cabling
    r["fec"] = parse_fec_sections({f"fec {rail1.interface}": FEC_OFF.read_text().split("\n", 2)[2].replace(
        "enp1s0f0np0", rail1.interface)})
    r["host"] = {"gpus": None, "memlock": None, "swap_kb": None, "firmware": {rail0.interface: "28.45.4028"}}
    r["tcp"] = {"listen": {str(params.ports.ray): "error: [Errno 98] Address already in use"}, "accepted": {},
                "probes": 5, "failed": [{"peer": "spark-1", "address": "10.77.1.11", "port": params.ports.api,
                                         "seen": "refused"}]}
    return r


def head_model():
    return {"config.json": {"size": 5, "sha256": "0" * 64}}


def scenarios():
    """(name, params, preflight) with every check group failing or warning somewhere."""
    docker = params_with(runtime={"gpus": True, "rdma": True},
                         model={"needs_token": True, "hf_token_env": "SPARKBOOK_TEST_NO_TOKEN"},
                         expectations={"driver": ">=590", "firmware": ">=28.45"})
    head, worker = broken_head(docker), broken_worker(docker)
    everything = Preflight({"spark-1": head, "spark-2": worker}, {}, {"spark-1": "head", "spark-2": "worker"})

    # the head's image and model present: the worker's then differ; the worker's TCP probe failed to run
    head2, worker2 = broken_head(docker), broken_worker(docker)
    head2["image"], head2["model"] = "sha256:" + "ab" * 32, head_model()
    worker2["tcp"] = {"error": "python3: command not found"}
    drifted = Preflight({"spark-1": head2, "spark-2": worker2}, {}, {})

    hf = params_with(model={"source": "hf", "name": "Qwen/Qwen3-0.6B"})
    head3, worker3 = broken_head(hf), broken_worker(hf)
    head3["image"], worker3["image"] = "sha256:" + "ab" * 32, None
    to_fetch = Preflight({"spark-1": head3, "spark-2": worker3}, {}, {})

    unreachable = Preflight({"spark-1": broken_head(docker)}, {"spark-2": "ssh root@10.77.0.12: timed out"}, {})
    return [("everything broken", docker, everything), ("worker drifted", docker, drifted),
            ("model to fetch, image to copy", hf, to_fetch), ("a node unreachable", docker, unreachable),
            *layouts()]


def layouts():
    """A ring, rails on no common layout, and a switch whose pings went unanswered."""
    data = yaml.safe_load(LAB.read_text())
    first = data["nodes"][0]

    def fabric(*rails):
        d = {**data, "nodes": [{**first, "name": f"n{i}", "host": f"10.9.0.{i + 1}", "role": "head" if i == 0 else "worker",
                                "rails": [{"interface": f"r{k}", "ip": a.split("/")[0], "prefix": int(a.split("/")[1])}
                                          for k, a in enumerate(node)]} for i, node in enumerate(rails)]}
        d["serving"] = {**data["serving"], "tensor_parallel_size": 1, "nodes": ["n0"]}
        params = validate(d)
        reports = {}
        for n in params.nodes:
            r = bare()
            r["ping"] = [{"interface": rail.interface, "peer": "10.0.0.250", "ok": False} for rail in n.rails]
            reports[n.name] = r
        return params, Preflight(reports, {}, {})

    ring = fabric(*([f"10.0.{i + 1}.1/30", f"10.0.{(i + 1) % 3 + 1}.2/30"] for i in range(3)))
    mixed = fabric(["10.0.1.1/24", "10.0.2.1/24"], ["10.0.1.2/24", "10.0.3.2/24"], ["10.0.4.3/24", "10.0.2.3/24"])
    switch = fabric(*([f"10.0.1.{i}/24", f"10.0.2.{i}/24"] for i in (1, 2, 3)))
    return [("ring", *ring), ("mixed rails", *mixed), ("switch, pings lost", *switch)]


# Check groups whose failing rows this test must have rendered (a group that stops failing here,
# say after a rename, must be noticed).
EXPECTED_ROWS = {"ssh", "ssh head→worker", "same os", "same kernel", "same driver", "same arch", "gpu", "memory",
                 "stale processes", "docker", "nvidia runtime", "fabric layout", "rail map", "rail port",
                 "rail rate", "rail mtu", "rail address", "path mtu", "tcp ports", "clock", "ports free",
                 "model disk", "docker disk", "image", "model", "model extras", "hf token",
                 "rail fec", "rail gid", "driver", "firmware", "same firmware", "gpu clocks", "swap"}


def test_every_failing_preflight_row_renders_its_remedy(monkeypatch):
    monkeypatch.delenv("SPARKBOOK_TEST_NO_TOKEN", raising=False)
    seen, found = set(), []
    for name, params, pf in scenarios():
        rows = preflight.checks(params, pf)
        found += [f"{name}: {d}" for d in defects(rows, {n.name for n in params.nodes})]
        shown = {c.check for c in rows if c.status in (FAIL, WARN)}
        assert shown, f"{name}: nothing failed"
        seen |= shown
    assert not found, "\n".join(dict.fromkeys(found))
    assert EXPECTED_ROWS <= seen, f"never rendered failing: {sorted(EXPECTED_ROWS - seen)}"


def test_a_port_that_is_down_names_its_interface_in_the_remedy():
    """The issue's case: both the ibstat and the ibv_devinfo paths."""
    params = params_with()
    pf = Preflight({"spark-1": broken_head(params), "spark-2": broken_worker(params)}, {}, {})
    ports = [c for c in preflight.checks(params, pf) if c.check == "rail port"]
    assert [(c.node, c.status) for c in ports] == [("spark-1", FAIL), ("spark-1", FAIL), ("spark-2", FAIL),
                                                   ("spark-2", FAIL)]
    for c, node in zip(ports, params.nodes[:1] * 2 + params.nodes[1:] * 2):
        assert any(f"ip link set {r.interface} up" in c.remedy for r in node.rails), c.remedy


def test_the_check_itself_fails_on_a_bad_remedy():
    """The renderer catches each kind of defect (else the tests above could not fail)."""
    from sparkbook.book.verdict import Check
    names = {"spark-1"}
    for bad in (Check("x", "spark-1", FAIL, "seen", "want", ""),
                Check("x", "spark-1", FAIL, "seen", "want", "`ip link set {where} up`"),
                Check("x", "spark-1", WARN, "None GB free", "want", "free space"),
                Check("x", "spark-1", FAIL, "seen", "want", "fix the driver ()"),
                Check("x", "spark-1", FAIL, "seen", "want", "03 copies it"),
                Check("x", "spark-1", FAIL, "seen", "want", "stop it (08_teardown)"),
                Check("x", "spark-1", FAIL, "seen", "want", "run 09_nothing.ipynb"),
                Check("x", "spark-9", FAIL, "seen", "want", "fix it")):
        assert len(defects([bad], names)) == 1, bad
    assert rendered([Check("x", "spark-1", PASS, "None", "", "")], names) == []
    fine = Check("x", "spark-1", WARN, "seen", "want", "run 03_distribute_image.ipynb (`sparkbook run -p FILE "
                 "--steps 03`) at 08:07 on 10.77.0.12, vLLM 0.17.0, ports 8000-8001, up 0.05 s")
    assert rendered([fine], names) == [fine]


# ------------------------------------------------------------------------------ the other steps

def test_inventory_failures_render():
    params = params_with()
    rows = [{"node": "spark-1", "role": "head", "reachable": True, **facts(gpus=0, gpu_name=None,
             gpu_problem="nvidia-smi absent")},
            {"node": "spark-2", "role": "worker", "reachable": False}]
    outcome = Inventory(rows, {"spark-2": "ssh root@10.77.0.12: connection refused"}, "bash inventory.sh /models")
    shown = rendered(inventory.checks(params, outcome), {"spark-1", "spark-2"})
    assert {(c.check, c.node) for c in shown} == {("reachable", "spark-2"), ("gpu", "spark-1")}
    two = Inventory([rows[0], {**rows[0], "node": "spark-2", "kernel": "6.8.0-1"}], {}, "bash inventory.sh")
    assert [c.check for c in rendered(inventory.checks(params, two), {"spark-1", "spark-2"})
            if c.node == "all"] == ["same kernel"]


def test_teardown_failures_render():
    params = params_with()
    outcome = Teardown(remaining={"spark-1": [container_name(params, True)]},
                       listeners={"spark-1": [f"api {params.ports.api}: 0.0.0.0:{params.ports.api} python3"]},
                       errors={"spark-2": "ssh: timed out"})
    shown = rendered(teardown.checks(params, outcome), {"spark-1", "spark-2"})
    assert {(c.check, c.node) for c in shown} == {("containers removed", "spark-1"), ("ports released", "spark-1"),
                                                  ("reachable", "spark-2")}


def test_ray_cluster_failures_render():
    params = params_with(runtime={"gpus": True})
    names = {"spark-1", "spark-2", "spark-3"}
    missing = RayCluster(nodes={"spark-3": {"ip": "10.77.1.13", "alive": True, "resources": {}}},
                         missing=["spark-1", "spark-2"], error="ray status: connection refused")
    shown = rendered(ray_cluster.checks(params, missing), names)
    assert [(c.node, c.status) for c in shown] == [("spark-3", FAIL), ("spark-1", FAIL), ("spark-2", FAIL)]
    no_gpu = RayCluster(nodes={n: {"ip": f"10.77.1.1{i + 1}", "alive": True, "resources": {"CPU": 20}}
                               for i, n in enumerate(("spark-1", "spark-2"))}, version="2.49.2",
                        listeners={"spark-1": [Listener("ray", "0.0.0.0", 8265, "dashboard"),
                                               Listener("ray", "0.0.0.0", 6379, "gcs_server")]})
    shown = rendered(ray_cluster.checks(params, no_gpu), names)
    assert {"GPUs in Ray", "Ray token authentication", "bound addresses"} <= {c.check for c in shown}


def test_serving_failures_render():
    params = params_with(serving={**yaml.safe_load(LAB.read_text())["serving"], "bind": "0.0.0.0"})
    names = {"spark-1", "spark-2"}
    failed = Deployment(seen="HTTP 503", stopped={"spark-2": "exited (137)"}, logs={"spark-1": "logs/spark-1"},
                        stall=Stall("spark-2", "weights", 62.0, "Loading safetensors checkpoint shards: 40%",
                                    "the weights load from a slow disk"),
                        diagnosis=[Diagnosis("spark-1", "NCCL could not connect", "NCCL WARN connect failed",
                                             "check the rails (01_preflight.ipynb)", "logs/spark-1")])
    shown = rendered(serve.checks(params, failed), names)
    assert {c.check for c in shown} == {"serving container", "startup progress", "startup"}
    unknown = Deployment(seen="HTTP 503", logs={"spark-1": "logs/spark-1", "spark-2": "logs/spark-2"})
    assert [c.check for c in rendered(serve.checks(params, unknown), names)] == ["startup"]
    refused = Deployment(key_refused=True, seen="HTTP 401")
    assert [c.check for c in rendered(serve.checks(params, refused), names)] == ["API key"]
    wrong = Deployment(ready=True, models=["other"], action="started", ray_workers_error="no state API")
    assert {"served model", "vLLM's Ray workers"} <= {c.check for c in rendered(serve.checks(params, wrong), names)}


def test_every_log_signature_has_a_formatted_cause_and_remedy():
    for sig in SIGNATURES:
        for text in (sig.cause, sig.remedy):
            assert text.strip() and not PLACEHOLDER.search(text) and not EMPTY.search(text), (sig.name, text)
        assert not unlinked_steps(sig.remedy), (sig.name, sig.remedy)


# ------------------------------------------------------------------------------ remedies that link

def test_an_image_missing_on_a_worker_links_to_03():
    """Preflight's survey: the worker lacks the image; the remedy names 03's notebook and how to run
    it, the HTML verdict links it (relative: beside the notebook, or in the run folder), the text
    stays text."""
    name, params, pf = next(sc for sc in scenarios() if sc[0] == "model to fetch, image to copy")
    row = next(c for c in preflight.checks(params, pf) if (c.check, c.node) == ("image", "spark-2"))
    assert row.status == WARN and row.observed.startswith("absent")
    assert row.remedy.startswith("run 03_distribute_image.ipynb (`sparkbook run -p FILE --steps 03`)"), row.remedy
    v = Verdict("01 preflight", [row])
    assert "<a href='03_distribute_image.ipynb'>03_distribute_image.ipynb</a>" in v._repr_html_()
    assert "03_distribute_image.ipynb" in v.to_text() and "<a " not in v.to_text()


def test_the_matrix_links_remedies_too():
    """Three nodes or more: the details under the matrix link the step as the table does."""
    rows = [Check("image", n, WARN, "absent", "x", "run 03_distribute_image.ipynb") for n in ("a", "b", "c")]
    v = Verdict("01 preflight", rows)
    assert v.is_matrix and "<a href='03_distribute_image.ipynb'>" in v._repr_html_()
    assert "<a " not in v.to_text()


def test_only_existing_steps_in_text_are_linked():
    """A notebook that does not exist, a path, a longer word and an attribute stay as they are; a
    stem without .ipynb links to the notebook."""
    from sparkbook.book.verdict import link_steps
    page = ("<td title='04_ray_cluster.ipynb'>09_nothing.ipynb, a/05_serve.ipynb, 05_served, 08_teardown, "
            "06_smoke_test.ipynb's</td>")
    assert link_steps(page) == ("<td title='04_ray_cluster.ipynb'>09_nothing.ipynb, a/05_serve.ipynb, 05_served, "
                                "<a href='08_teardown.ipynb'>08_teardown</a>, "
                                "<a href='06_smoke_test.ipynb'>06_smoke_test.ipynb</a>'s</td>")
