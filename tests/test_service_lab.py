"""Day two on the lab: the deployment that passed 05 and 06, installed as a service, survives what
owners live through, and the bounds it keeps are measured here.

03-06 pass into a run folder; `sparkbook service install` takes it from there (the Ray containers
again, on the image pinned by ID, under Docker's restart policy, with the supervisor ordering the
start). Then: vllm serve killed (the supervisor starts it again), the head rebooted, a worker
rebooted, both rebooted (`lab reboot`: the node's processes and /run gone, its dockerd and sshd
started again, which starts the service's container). After each, the endpoint answers within
BOUND_S, and at the end 06 passes on it again with the same known answers as the run it was
installed from. `sparkbook service remove` then leaves no service container and nothing on the
API port.
"""

import json
import re
import time

import papermill
import pytest
import yaml

from sparkbook.book.errors import CheckFailed
from sparkbook.cli import main
from sparkbook.facts.parsers import listener
from sparkbook.lab import docker
from sparkbook.lab.power import reboot
from sparkbook.params import load, validate
from sparkbook.runbook.runner import run
from sparkbook.serving.deploy import healthy, serve
from sparkbook.serving.plan import plan
from sparkbook.serving.state import node_states, service_states
from sparkbook.serving.vllm import SERVE_PATTERN

from conftest import LAB_YAML, steps_seen

NOTEBOOKS = LAB_YAML.parents[1] / "notebooks"

pytestmark = pytest.mark.lab

BOUND_S = 300  # from the event to an endpoint that answers with its model again (measured: see README)


def back_within(params, bound=BOUND_S) -> float:
    """Seconds until the endpoint answers again (asserted within ``bound``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound:
        if healthy(params).ready:
            return time.monotonic() - t0
        time.sleep(2)
    raise AssertionError(f"the service did not answer within {bound} s: {healthy(params).seen}")


def down_within(params, bound=60) -> None:
    t0 = time.monotonic()
    while healthy(params).ready:
        assert time.monotonic() - t0 < bound, "still serving"
        time.sleep(0.5)


def test_the_service_comes_back_after_a_crash_and_every_reboot_and_06_passes_again(
        lab, cluster, boots_checked, tmp_path, capsys):
    params = load(LAB_YAML)
    basis = tmp_path / "basis"
    summary = run(LAB_YAML, steps="03,04,05,06", out=basis, report=False)
    assert summary["status"] == "passed", steps_seen(summary)
    took = {}
    try:
        t0 = time.monotonic()
        assert main(["service", "install", "-p", str(LAB_YAML), "--run", str(basis)]) == 0
        took["install"] = time.monotonic() - t0
        shown = capsys.readouterr().out
        assert "service install: PASS" in shown
        image = node_states(params, cluster)["spark-1"].image.id
        nodes = service_states(params, cluster)
        assert {n: (s.state, s.pinned) for n, s in nodes.items()} == {
            "spark-1": ("running", image), "spark-2": ("running", image)}

        # vllm serve killed: the supervisor starts it again (the PID its log names)
        name, head_node = plan(params).ray_container, lab.nodes()[0]
        log = docker(head_node, "logs", name).stdout
        engine = re.findall(r"^sparkbook-service: the engine started \(pid (\d+)\)$", log, re.M)[-1]
        assert SERVE_PATTERN.replace("[v]", "v") in docker(head_node, "exec", name, "ps", "-o", "args=", "-p",
                                                            engine).stdout
        docker(head_node, "exec", name, "kill", "-KILL", engine)
        down_within(params)
        took["vllm serve killed"] = back_within(params)

        for who in (["spark-1"], ["spark-2"], ["spark-1", "spark-2"]):
            t0 = time.monotonic()
            reboot(lab, who, say=lambda *_: None)
            down_within(params)  # a worker's reboot too: vLLM, or else the supervisor, stops the engine
            back_within(params, BOUND_S - (time.monotonic() - t0))
            took[f"reboot {' and '.join(who)}"] = time.monotonic() - t0  # from the reboot to the answer
        with capsys.disabled():
            print("\nservice on the lab: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))

        # status, from the day-two notebook (headless) as from the CLI
        done = papermill.execute_notebook(
            str(NOTEBOOKS / "day_two.ipynb"), str(tmp_path / "day_two.ipynb"), cwd=str(NOTEBOOKS),
            progress_bar=False, parameters={"params_file": str(LAB_YAML), "command": "status"})
        shown = "".join(o.get("text", "") for c in done.cells if c.cell_type == "code" for o in c.outputs)
        assert "service status: PASS (3 PASS)" in shown
        assert main(["service", "status", "-p", str(LAB_YAML)]) == 0
        assert "service status: PASS" in capsys.readouterr().out
        head = service_states(params, cluster)["spark-1"]
        assert head.engine_starts >= 2 and head.pinned == image  # started again after the kill, at least

        after = tmp_path / "after"
        summary = run(LAB_YAML, steps="06", out=after, report=False)
        assert summary["status"] == "passed", steps_seen(summary)
        then, now = (json.loads((d / "smoke" / "known_answers.json").read_text()) for d in (basis, after))
        assert now["compared_with"] and now["compared"] == len(then["answers"]) and not now["differences"]
        assert [a.get("text") for a in now["answers"]] == [a.get("text") for a in then["answers"]]
        # 05 keeps the service: it is what 05 would have started
        assert run(LAB_YAML, steps="05", out=tmp_path / "kept", report=False)["status"] == "passed"
        assert json.loads((tmp_path / "kept" / "serving.json").read_text())["action"] == "kept"
        # ... and refuses to replace it: the supervisor would start its own vllm serve beside 05's
        data = yaml.safe_load(LAB_YAML.read_text())
        data["serving"]["max_model_len"] = 1024
        with pytest.raises(CheckFailed, match="kept as a service on spark-1, spark-2"):
            serve(validate(data), cluster, tmp_path / "changed", say=lambda *_: None)
        assert healthy(params).ready
    finally:
        assert main(["service", "remove", "-p", str(LAB_YAML)]) == 0
    assert "service remove: PASS" in capsys.readouterr().out
    for node in lab.nodes():
        left = docker(node, "ps", "-a", "--filter", "label=sparkbook.service", "-q").stdout.strip()
        assert left == "", node.name
    st = node_states(params, cluster)["spark-1"]
    assert not listener(st.listeners, params.ports.api) and not st.containers
