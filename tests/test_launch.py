"""Cluster bring-up: the command builders for the DGX Spark pair (offline), failure signatures on
real vLLM logs, then on the lab: 04 forms a Ray cluster, 05 serves TP 2 across both nodes (twice:
the second run changes nothing), 08 leaves nothing; a worker killed during start-up and a busy port
fail 05 naming the node and the cause."""

import json
import os
import re
import shlex
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml


from conftest import field_sample
from sparkbook import launch
from sparkbook.lab import faults
from sparkbook.lab.lab import docker
from sparkbook.params import load, validate
from sparkbook.parsers import listener
from sparkbook.redact import MASK
from sparkbook.remote import Cluster, command_line
from sparkbook.runner import run

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "parameters" / "dgx-spark-pair.yaml"
LAB = ROOT / "parameters" / "lab.yaml"
CANARY = "hf_CANARYcanary0123456789"


def env_of(cmd):
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "-e")


def test_spark_pair_containers_have_what_multi_node_serving_needs():
    p = load(PAIR)
    for node, ip in zip(p.nodes, ("192.168.100.10", "192.168.100.11")):
        cmd = launch.container_command(p, node)
        text = command_line(cmd)
        for flags in (["--network", "host"], ["--ipc", "host"], ["--gpus", "all"], ["--shm-size", "16g"],
                      ["--ulimit", "memlock=-1"], ["--device", "/dev/infiniband"], ["--cap-add", "IPC_LOCK"]):
            assert shlex.join(flags) in text, flags
        assert "--privileged" not in cmd
        assert f"{p.model.path}:{p.model.path}:ro" in cmd
        env = env_of(cmd)
        assert env["VLLM_HOST_IP"] == ip
        for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES"):
            assert env[k] == "enp1s0f1np1"
        assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env["NCCL_IB_GID_INDEX"] == "3"
        assert env["RAY_memory_monitor_refresh_ms"] == "0"
        ray = cmd[cmd.index(p.runtime.image) + 1:]
        assert ray[:3] == ["ray", "start", "--block"] and ray[ray.index("--node-ip-address") + 1] == ip
        assert ray[ray.index("--num-gpus") + 1] == "1" and "--object-store-memory" in ray
    head, worker = (launch.container_command(p, n) for n in p.nodes)
    assert "--head" in head and "--address" not in head
    assert worker[worker.index("--address") + 1] == "192.168.100.10:6379"
    serve = launch.ray_serve_command(p)
    assert serve[:3] == ["docker", "exec", "-d"] and serve[5:8] == [launch.RAY_CONTAINER, "bash", "-c"]
    inner = shlex.split(serve[-1].split(" > ")[0])
    assert inner[:3] == ["vllm", "serve", p.model.path]
    for a, b in (("--tensor-parallel-size", "2"), ("--distributed-executor-backend", "ray"),
                 ("--reasoning-parser", "qwen3"), ("--tool-call-parser", "qwen3_coder"),
                 ("--served-model-name", "qwen3.5-122b"), ("--port", "8000")):
        assert inner[inner.index(a) + 1] == b
    assert inner.count("--enable-auto-tool-choice") == 1 and "--nnodes" not in inner


def test_privileged_only_when_asked_and_mp_starts_headless_workers_first():
    p = load(PAIR)
    p = p.model_copy(update={"runtime": p.runtime.model_copy(update={"privileged": True}),
                             "serving": p.serving.model_copy(update={"executor": "mp"})})
    head, worker = p.nodes
    cmd = launch.container_command(p, worker)
    assert "--privileged" in cmd and "--device" not in cmd
    serve = cmd[cmd.index(p.runtime.image) + 1:]
    assert serve[:2] == ["vllm", "serve"] and "--headless" in serve
    assert serve[serve.index("--node-rank") + 1] == "1"
    assert serve[serve.index("--master-addr") + 1] == "192.168.100.10"
    assert "--port" not in serve
    hserve = launch.serve_args(p, head)
    assert "--headless" not in hserve and hserve[hserve.index("--node-rank") + 1] == "0"
    assert [g[0].name for g in launch._groups(p, p.nodes, ray=False)] == ["spark-2", "spark-1"]
    assert [g[0].name for g in launch._groups(p, p.nodes, ray=True)] == ["spark-1", "spark-2"]


def test_odd_values_stay_one_argument_and_secrets_never_appear(monkeypatch):
    p = load(PAIR)
    odd = ["--chat-template", "a b; touch /tmp/pwned $(id)", "--override-generation-config", '{"x": "y z"}']
    p = p.model_copy(update={"serving": p.serving.model_copy(update={
        "extra_args": odd, "env": {"WEIRD": "it's \"quoted\" $HOME"}})})
    monkeypatch.setenv("HF_TOKEN", CANARY)
    cmd = launch.container_command(p, p.head)
    assert shlex.split(command_line(cmd)) == cmd
    inner = launch.ray_serve_command(p)
    assert shlex.split(command_line(inner)) == inner
    assert shlex.split(inner[-1].split(" > ")[0])[-4:] == odd
    assert env_of(cmd)["WEIRD"] == "it's \"quoted\" $HOME"
    assert cmd[cmd.index("--env-file") + 1] == launch.ENV_FILE
    rendered = launch.commands_table(p).to_text() + launch.commands_table(p)._repr_html_()
    assert CANARY not in rendered and CANARY not in json.dumps(cmd)
    assert launch.shown(["echo", CANARY]) == f"echo {MASK}"
    with_canary = launch.fingerprint(p, p.head, True)
    monkeypatch.setenv("HF_TOKEN", "hf_anotherTOKENvalue42")
    assert launch.fingerprint(p, p.head, True) == with_canary  # whether a token is set, not its value


def test_configured_options_are_checked_against_the_image():
    p = load(PAIR)
    opts = launch.configured_options(p)
    assert {"--tensor-parallel-size", "--reasoning-parser", "--enable-auto-tool-choice"} <= set(opts)
    info = launch.ImageInfo("img", "sha256:1", vllm="0.17.0", ray="2.54.0",
                            options=[o for o in opts if o != "--reasoning-parser"],
                            architectures=["LlamaForCausalLM"], model_architectures=["Qwen3_5MoeForCausalLM"])
    v = launch.image_verdict(p, info, need_ray=True)
    failed = {c.check: c for c in v.failures}
    assert "--reasoning-parser" in failed["vllm serve options"].observed
    assert "Qwen3_5MoeForCausalLM" in failed["model architecture"].observed
    assert "Ray in the image" not in failed
    no_ray = launch.image_verdict(p, launch.ImageInfo("img", "sha256:1", vllm="0.17.0", options=opts),
                                  need_ray=True)
    assert [c.check for c in no_ray.failures] == ["Ray in the image"]


FAKE_DOCKER = """#!/bin/sh
case "$1" in
  inspect) echo "$FAKE_STATE";;
  exec) [ -n "$FAKE_SERVE_UP" ];;
  logs) echo "last line of the container";;
esac
"""


@pytest.mark.parametrize("executor,state,serve_up,expected", [
    ("ray", "running 0 false", "1", "running"),
    ("ray", "running 0 false", "", "serve-exited"),  # the Ray container lives on, vllm serve died
    ("ray", "exited 137 true", "", "exited with code 137, killed for memory (OOM)"),
    ("mp", "exited 143 false", "", "exited with code 143, killed by a signal"),
    ("mp", "running 0 false", "", "running")])
def test_log_tails_tell_a_dead_server_from_a_live_one(tmp_path, monkeypatch, executor, state, serve_up,
                                                       expected):
    (tmp_path / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_STATE", state)
    monkeypatch.setenv("FAKE_SERVE_UP", serve_up)
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data["serving"]["executor"] = executor
    params = validate(data)
    tails = launch.log_tails(params, Cluster.from_params(params))
    assert tails["this-machine"][0] == expected


def test_ray_containers_outlive_serving_changes_and_vllm_serve_carries_its_fingerprint(tmp_path, monkeypatch):
    p = load(PAIR)
    changed = p.model_copy(update={"serving": p.serving.model_copy(update={"max_model_len": 4096})})
    for n in p.nodes:  # a serving change restarts vllm serve, not the Ray cluster
        assert launch.fingerprint(changed, n, True) == launch.fingerprint(p, n, True)
    assert launch.fingerprint(changed, p.head, False) != launch.fingerprint(p, p.head, False)

    # vllm serve as started by ray_serve_command, in a "container" that is this machine: a
    # process whose command line holds the pattern, with the environment `docker exec -e` gives
    mark = f"sparkbook-test-serve-{os.getpid()}"
    monkeypatch.setattr(launch, "SERVE_PATTERN", f"[{mark[0]}]{mark[1:]}")
    (tmp_path / "docker").write_text('#!/bin/sh\n[ "$1" = exec ] && shift 2 && exec "$@"\n')
    (tmp_path / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data["serving"]["executor"] = "ray"
    local = validate(data)
    cluster = Cluster.from_params(local)
    assert launch.serving_fingerprint(local, cluster) is None  # not running
    cmd = launch.ray_serve_command(local)
    fp = cmd[cmd.index("-e") + 1]
    assert fp == f"{launch.SERVE_FP}={launch.fingerprint(local, local.head, False)}"
    name, value = fp.split("=", 1)
    proc = subprocess.Popen(["sh", "-c", f"sleep 30; : {mark}"], env={**os.environ, name: value})
    try:
        time.sleep(0.2)
        assert launch.serving_fingerprint(local, cluster) == launch.fingerprint(local, local.head, False)
    finally:
        proc.kill()
        proc.wait()


def test_signatures_on_real_vllm_logs():
    cause, line, remedy = launch.match_signature(field_sample("vllm-error-ray-channel-timeout-1.txt"))
    assert "timed out" in cause and "RayChannelTimeoutError" in line and "02_collectives" in remedy
    cause, line, _ = launch.match_signature(field_sample("vllm-warning-tp-exceeds-gpus-1.txt"))
    assert "exceeds the GPUs" in cause and "Tensor parallel size (2)" in line
    assert launch.match_signature(field_sample("vllm-ray-worker-startup-1.txt")) is None
    assert "port" in launch.match_signature("ERROR [Errno 98] Address already in use")[0]
    capture = "INFO Capturing CUDA graph shapes: 10%\nINFO model loaded\nINFO Capturing CUDA graph shapes: 50%"
    assert "CUDA graphs" in launch.match_signature(capture)[0]
    assert launch.match_signature(capture + "\nINFO Graph capturing finished\nINFO Starting API") is None


# ------------------------------------------------------------------------------------- on the lab

def _post(url, data, timeout=60):
    req = urllib.request.Request(url, json.dumps(data).encode(), {"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=timeout) as r:
        return json.loads(r.read())


def test_ray_cluster_then_tp2_serving_twice_then_teardown_leaves_nothing(lab, params, cluster, tmp_path):
    summary = run(LAB, steps="03,04,05", out=tmp_path, report=False)
    assert summary["status"] == "passed", summary
    ray = json.loads((tmp_path / "verdicts" / "04_ray_cluster.json").read_text())
    assert {(c["check"], c["node"]) for c in ray["checks"] if c["status"] == "PASS"} >= {
        ("in the Ray cluster", "spark-1"), ("in the Ray cluster", "spark-2")}
    assert json.loads((tmp_path / "serving.json").read_text())["action"] in ("started", "restarted")
    chat = _post(f"{params.endpoint}/v1/chat/completions", {
        "model": params.model.path, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}],
        "ignore_eos": True})
    assert chat["usage"]["completion_tokens"] == 16
    head_log = cluster.run(["docker", "logs", params.runtime.container_name], [params.head])["spark-1"]
    assert "world_size=2" in head_log.stdout + head_log.stderr

    again = tmp_path / "again"
    assert run(LAB, steps="05", out=again, report=False)["status"] == "passed"
    assert json.loads((again / "serving.json").read_text())["action"] == "kept"

    # a newer build under the tag on the head, copied by 03: the deployment is not kept
    image, head = params.runtime.image, lab.nodes()[0]
    for node in lab.nodes():
        docker(node, "tag", image, "sbk-test-keep:latest")
    docker(head, "build", "-q", "-t", image, "-", input="FROM sbk-test-keep:latest\nLABEL x=2\n")
    try:
        newer = tmp_path / "newer"
        assert run(LAB, steps="03,05", out=newer, report=False)["status"] == "passed"
        assert json.loads((newer / "serving.json").read_text())["action"] == "restarted"
        assert run(LAB, steps="08", out=tmp_path, report=False)["status"] == "passed"
    finally:
        for node in lab.nodes():
            docker(node, "tag", "sbk-test-keep:latest", image)
            docker(node, "rmi", "sbk-test-keep:latest", check=False)
            docker(node, "image", "prune", "-f", check=False)
    assert (tmp_path / "logs" / "spark-2" / "sparkbook-vllm.log").stat().st_size > 0
    states = launch.state(params, cluster)
    assert all(not s.containers for s in states.values()), states
    for s in states.values():
        assert not [p for p in params.ports.model_dump().values() if listener(s.listeners, p)]


def test_worker_killed_during_startup_fails_naming_it_with_both_logs(lab, params, cluster, tmp_path):
    from sparkbook import distribute
    distribute.ensure_image(params, cluster, say=lambda *_: None)
    worker = lab.nodes()[1]
    box = {}
    t0 = time.monotonic()
    serving = threading.Thread(target=lambda: box.update(dep=launch.serve(params, cluster, tmp_path,
                                                                          say=lambda *_: None)))
    serving.start()
    # killed once it runs and has said something: during start-up, not before it
    while docker(worker, "inspect", "--format", "{{.State.Status}}", params.runtime.container_name,
                 check=False).stdout.strip() != "running" and time.monotonic() - t0 < 60:
        time.sleep(0.3)
    while time.monotonic() - t0 < 120:
        said = docker(worker, "logs", params.runtime.container_name, check=False)
        if (said.stdout + said.stderr).strip():
            break
        time.sleep(1)
    docker(worker, "kill", params.runtime.container_name)
    serving.join(params.serving.startup_timeout + 60)
    took = time.monotonic() - t0
    dep = box["dep"]
    assert not dep.ready and took < params.serving.startup_timeout
    failed = {(c.check, c.node): c for c in launch.serve_verdict(params, dep).failures}
    assert "killed" in failed[("serving container", "spark-2")].observed
    for node in ("spark-1", "spark-2"):
        assert (tmp_path / "logs" / node / "sparkbook-vllm.log").stat().st_size > 0
    assert all(not s.containers for s in launch.state(params, cluster).values()), "left running"


def test_busy_port_fails_before_any_container_starts(lab, params, cluster, tmp_path):
    faults.apply(lab, "port-busy")
    try:
        dep = launch.serve(params, cluster, tmp_path, say=lambda *_: None)
        started = {n: s.containers for n, s in launch.state(params, cluster).items()}
    finally:
        faults.heal(lab, "port-busy")
    failed = launch.serve_verdict(params, dep).failures
    assert [(c.check, c.node) for c in failed] == [("port free", "spark-1")]
    assert f"port {params.ports.api}" in failed[0].observed and failed[0].remedy
    assert all(not c for c in started.values()), started


def test_a_worker_without_the_heads_image_fails_before_anything_starts(lab, params, cluster, tmp_path):
    from sparkbook import distribute
    from sparkbook.errors import CheckFailed
    distribute.ensure_image(params, cluster, say=lambda *_: None)
    launch.teardown(params, cluster, tmp_path)  # nothing serving that would be kept
    worker, image = lab.nodes()[1], params.runtime.image
    docker(worker, "tag", image, "sbk-test-keep:latest")  # the layers stay: restored by a tag
    try:
        seen = {}
        docker(worker, "rmi", image)  # the tag only
        with pytest.raises(CheckFailed) as absent:
            launch.serve(params, cluster, tmp_path, say=lambda *_: None)
        seen["absent"] = {n: s.containers for n, s in launch.state(params, cluster).items()}
        # another image under the tag: the same layers, another ID
        docker(worker, "build", "-q", "-t", image, "-", input="FROM sbk-test-keep:latest\nLABEL x=1\n")
        with pytest.raises(CheckFailed) as other:
            launch.form_ray_cluster(params, cluster, tmp_path, say=lambda *_: None)
        seen["other"] = {n: s.containers for n, s in launch.state(params, cluster).items()}
    finally:
        docker(worker, "tag", "sbk-test-keep:latest", image)
        docker(worker, "rmi", "sbk-test-keep:latest", check=False)
        docker(worker, "image", "prune", "-f", check=False)
    assert "- spark-2: the image is not there" in str(absent.value)
    assert re.search(r"^- spark-2: holds [0-9a-f]{12} under the tag, the head [0-9a-f]{12}$", str(other.value), re.M)
    for e in (absent, other):
        assert "spark-1" not in str(e.value) and "remedy: run 03_distribute_image" in str(e.value)
    assert all(not c for s in seen.values() for c in s.values()), seen
