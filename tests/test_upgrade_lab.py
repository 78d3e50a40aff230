"""Day two on the lab: a service moved to a new image only through the gate, with the cheap
candidates the issue names. The baseline: 03-07 pass, the service is installed from that run.
Then a candidate that is the same image with one more layer passes the gate and is promoted (the
service runs it; every node keeps the previous image); then a candidate whose ``vllm`` is a wrapper
that adds an argument (as community images' wrappers do) fails 05, before 06 and 07 judge a
configuration nobody asked for, and the upgrade rolls back by itself to the image that served
last, which 06 verifies. (The candidate with a broken tool parser, which fails 06, goes through the
gate in benchmarks/upgrade_versions.py.) A small benchmark grid keeps 07 short (the gate reads its
single-user and peak levels).
"""

import json
import time

import pytest
import yaml

from sparkbook.cli import main
from sparkbook.lab import candidates, docker
from sparkbook.params import load
from sparkbook.runbook.runner import run
from sparkbook.serving.deploy import healthy
from sparkbook.serving.state import node_states, service_states

from conftest import LAB_YAML, steps_seen

pytestmark = pytest.mark.lab


def small_bench(tmp_path):
    data = yaml.safe_load(LAB_YAML.read_text())
    data["benchmark"].update(context_depths=[0], concurrency=[1, 4], requests_per_level=4)
    path = tmp_path / "lab-upgrade.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def vllm_version(run_dir):
    """The vLLM version 05 recorded from the engine's start-up line."""
    return json.loads((run_dir / "serving.json").read_text())["ran"]["spark-1"]["version"]


def test_a_good_candidate_is_promoted_and_a_wrapped_one_rolled_back_by_itself(lab, cluster, tmp_path, capsys):
    params_file = small_bench(tmp_path)
    params, outputs = load(params_file), tmp_path / "outputs"
    head = lab.nodes()[0]
    image = params.runtime.image
    summary = run(params_file, steps="03,04,05,06,07", out=outputs / "baseline", report=False)
    assert summary["status"] == "passed", steps_seen(summary)
    previous = node_states(params, cluster)["spark-1"].image.id
    good = candidates.layered(head, image, "sbk-candidate:good")
    candidates.wrapped(head, image, "sbk-candidate:wrapped")
    took = {}
    try:
        assert main(["service", "install", "-p", str(params_file), "--run", str(outputs / "baseline")]) == 0
        capsys.readouterr()

        # the same image with one more layer: through the gate, promoted (the bound is loose: the
        # two runs' 07 levels share the lab's 2 cores with whatever else runs)
        t0 = time.monotonic()
        code = main(["service", "upgrade", "-p", str(params_file), "--image", "sbk-candidate:good",
                     "--min-ratio", "0.5", "--outputs", str(outputs)])
        took["promoted"] = time.monotonic() - t0
        shown = capsys.readouterr().out
        assert code == 0, shown
        assert "service upgrade: PASS" in shown and "promoted: the service runs sbk-candidate:good" in shown
        assert {n: s.pinned for n, s in service_states(params, cluster).items()} == {"spark-1": good, "spark-2": good}
        for node in lab.nodes():  # every node keeps the image that served before
            kept = docker(node, "image", "inspect", "--format", "{{.Id}}", image.rsplit(":", 1)[0] + ":sparkbook-previous")
            assert kept.stdout.strip() == previous, node.name

        # a wrapper that adds --max-num-seqs 7 to vllm serve: 05 fails on the configuration that
        # ran, and the upgrade rolls back to the good one
        t0 = time.monotonic()
        code = main(["service", "upgrade", "-p", str(params_file), "--image", "sbk-candidate:wrapped",
                     "--min-ratio", "0.5", "--outputs", str(outputs)])
        took["rolled back"] = time.monotonic() - t0
        shown = capsys.readouterr().out
        assert code == 1, shown
        assert "FAIL upgrade on all: rolled back to " + good[:19] + " (06 passed on it): the gate failed (" in shown
        assert "upgrade steps: 05_serve failed" in shown
        candidate = sorted(outputs.glob("*-upgrade-candidate"))[-1]
        served = json.loads((candidate / "verdicts" / "05_serve.json").read_text())["checks"]
        assert [(c["node"], c["status"], c["observed"]) for c in served if c["check"] == "configuration that ran"] == [
            ("spark-1", "FAIL", f"vLLM {vllm_version(candidate)}: max_num_seqs=7, not asked")], served
        assert {n: s.pinned for n, s in service_states(params, cluster).items()} == {"spark-1": good, "spark-2": good}
        assert node_states(params, cluster)["spark-2"].image.id == good  # the tag names it again everywhere
        assert healthy(params).ready
        with capsys.disabled():
            print("\nupgrade on the lab: " + ", ".join(f"{k} in {v:.0f} s" for k, v in took.items()))
    finally:
        main(["service", "remove", "-p", str(params_file)])
        for node in lab.nodes():
            docker(node, "tag", previous, image, check=False)
            docker(node, "rmi", "sbk-candidate:good", "sbk-candidate:wrapped", image.rsplit(":", 1)[0] + ":sparkbook-previous",
                   check=False)
            docker(node, "image", "prune", "-f", check=False)
