"""Serving (04, 05, 08): the command builders for the DGX Spark pair (offline), the node scripts
against a fake `docker`, failure signatures on real vLLM logs, then on the lab: 04 forms a Ray
cluster, 05 serves TP 2 across both nodes (twice: the second run changes nothing), 08 leaves
nothing; a worker killed during start-up and a busy port fail 05 naming the node and the cause."""

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
from sparkbook.lab import faults
from sparkbook.lab.lab import docker
from sparkbook.params import load, validate
from sparkbook.parsers import listener
from sparkbook.redact import MASK
from sparkbook.remote import Cluster, command_line
from sparkbook.runner import run
from sparkbook.serving import commands, deploy, state
from sparkbook.serving.inspection import ImageInfo, configured_options, image_checks
from sparkbook.serving.logs import match_signature
from sparkbook.serving.ray import form_ray_cluster
from sparkbook.serving.state import node_states
from sparkbook.serving.teardown import teardown
from sparkbook.steps import serve as serve_step
from sparkbook.verdict import FAIL

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "parameters" / "dgx-spark-pair.yaml"
LAB = ROOT / "parameters" / "lab.yaml"
CANARY = "hf_CANARYcanary0123456789"


def env_of(cmd):
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "-e")


def failures(checks):
    return [c for c in checks if c.status == FAIL]


def test_spark_pair_containers_have_what_multi_node_serving_needs():
    p = load(PAIR)
    for node, ip in zip(p.nodes, ("192.168.100.10", "192.168.100.11")):
        cmd = commands.container_command(p, node)
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
    head, worker = (commands.container_command(p, n) for n in p.nodes)
    assert "--head" in head and "--address" not in head
    assert worker[worker.index("--address") + 1] == "192.168.100.10:6379"
    serve = commands.ray_serve_command(p)
    assert serve[:3] == ["docker", "exec", "-d"] and serve[5:8] == [commands.RAY_CONTAINER, "bash", "-c"]
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
    cmd = commands.container_command(p, worker)
    assert "--privileged" in cmd and "--device" not in cmd
    serve = cmd[cmd.index(p.runtime.image) + 1:]
    assert serve[:2] == ["vllm", "serve"] and "--headless" in serve
    assert serve[serve.index("--node-rank") + 1] == "1"
    assert serve[serve.index("--master-addr") + 1] == "192.168.100.10"
    assert "--port" not in serve
    hserve = commands.serve_args(p, head)
    assert "--headless" not in hserve and hserve[hserve.index("--node-rank") + 1] == "0"
    assert [g[0].name for g in commands.groups(p.nodes, ray=False)] == ["spark-2", "spark-1"]
    assert [g[0].name for g in commands.groups(p.nodes, ray=True)] == ["spark-1", "spark-2"]


def test_odd_values_stay_one_argument_and_secrets_never_appear(monkeypatch):
    p = load(PAIR)
    odd = ["--chat-template", "a b; touch /tmp/pwned $(id)", "--override-generation-config", '{"x": "y z"}']
    p = p.model_copy(update={"serving": p.serving.model_copy(update={
        "extra_args": odd, "env": {"WEIRD": "it's \"quoted\" $HOME"}})})
    monkeypatch.setenv("HF_TOKEN", CANARY)
    cmd = commands.container_command(p, p.head)
    assert shlex.split(command_line(cmd)) == cmd
    inner = commands.ray_serve_command(p)
    assert shlex.split(command_line(inner)) == inner
    assert shlex.split(inner[-1].split(" > ")[0])[-4:] == odd
    assert env_of(cmd)["WEIRD"] == "it's \"quoted\" $HOME"
    assert cmd[cmd.index("--env-file") + 1] == commands.ENV_FILE
    rendered = commands.commands_table(p).to_text() + commands.commands_table(p)._repr_html_()
    assert CANARY not in rendered and CANARY not in json.dumps(cmd)
    assert commands.shown(["echo", CANARY]) == f"echo {MASK}"
    with_canary = commands.fingerprint(p, p.head, True)
    monkeypatch.setenv("HF_TOKEN", "hf_anotherTOKENvalue42")
    assert commands.fingerprint(p, p.head, True) == with_canary  # whether a token is set, not its value


def test_configured_options_are_checked_against_the_image():
    p = load(PAIR)
    opts = configured_options(p)
    assert {"--tensor-parallel-size", "--reasoning-parser", "--enable-auto-tool-choice"} <= set(opts)
    info = ImageInfo("img", "sha256:1", vllm="0.17.0", ray="2.54.0",
                            options=[o for o in opts if o != "--reasoning-parser"],
                            architectures=["LlamaForCausalLM"], model_architectures=["Qwen3_5MoeForCausalLM"])
    failed = {c.check: c for c in failures(image_checks(p, info, need_ray=True))}
    assert "--reasoning-parser" in failed["vllm serve options"].observed
    assert "Qwen3_5MoeForCausalLM" in failed["model architecture"].observed
    assert "Ray in the image" not in failed
    no_ray = image_checks(p, ImageInfo("img", "sha256:1", vllm="0.17.0", options=opts), need_ray=True)
    assert [c.check for c in failures(no_ray)] == ["Ray in the image"]


# ------------------------------------------------------------- the node scripts, with a fake docker

def fake_tools(tmp_path, monkeypatch, **tools):
    """Programs named after their keyword (``docker="..."``), first on the PATH of the commands run
    on this machine; each logs its arguments to ``tmp_path/calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text(f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >> "{tmp_path}/calls"\n{body}')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / "calls"


def local_params(executor):
    """parameters/localhost.yaml (this machine as the one node) with ``executor``."""
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data["serving"]["executor"] = executor
    return validate(data)


TAIL_DOCKER = """case "$1" in
  inspect) echo "$FAKE_STATE";;
  exec) [ -n "$FAKE_SERVE_UP" ];;
  logs) echo "last line of the container";;
esac
"""


@pytest.mark.parametrize("executor,docker_state,serve_up,expected", [
    ("ray", "running 0 false", "1", "running"),
    ("ray", "running 0 false", "", "serve-exited"),  # the Ray container lives on, vllm serve died
    ("ray", "exited 137 true", "", "exited with code 137, killed for memory (OOM)"),
    ("mp", "exited 143 false", "", "exited with code 143, killed by a signal"),
    ("mp", "running 0 false", "", "running")])
def test_log_tails_tell_a_dead_server_from_a_live_one(tmp_path, monkeypatch, executor, docker_state, serve_up,
                                                       expected):
    fake_tools(tmp_path, monkeypatch, docker=TAIL_DOCKER)
    monkeypatch.setenv("FAKE_STATE", docker_state)
    monkeypatch.setenv("FAKE_SERVE_UP", serve_up)
    params = local_params(executor)
    tails = deploy.log_tails(params, Cluster.from_params(params))
    assert tails["this-machine"] == (expected, "" if executor == "ray" else "last line of the container")


def test_ray_containers_outlive_serving_changes_and_vllm_serve_carries_its_fingerprint(tmp_path, monkeypatch):
    p = load(PAIR)
    changed = p.model_copy(update={"serving": p.serving.model_copy(update={"max_model_len": 4096})})
    for n in p.nodes:  # a serving change restarts vllm serve, not the Ray cluster
        assert commands.fingerprint(changed, n, True) == commands.fingerprint(p, n, True)
    assert commands.fingerprint(changed, p.head, False) != commands.fingerprint(p, p.head, False)

    # vllm serve as started by ray_serve_command, in a "container" that is this machine: a
    # process whose command line holds the pattern, with the environment `docker exec -e` gives
    mark = f"sparkbook-test-serve-{os.getpid()}"
    monkeypatch.setattr(deploy, "SERVE_PATTERN", f"[{mark[0]}]{mark[1:]}")
    fake_tools(tmp_path, monkeypatch, docker='[ "$1" = exec ] && shift 2 && exec "$@"\n')
    local = local_params("ray")
    cluster = Cluster.from_params(local)
    assert deploy.serving_fingerprint(local, cluster) is None  # not running
    cmd = commands.ray_serve_command(local)
    fp = cmd[cmd.index("-e") + 1]
    assert fp == f"{commands.SERVE_FP}={commands.fingerprint(local, local.head, False)}"
    name, value = fp.split("=", 1)
    proc = subprocess.Popen(["sh", "-c", f"sleep 30; : {mark}"], env={**os.environ, name: value})
    try:
        time.sleep(0.2)
        assert deploy.serving_fingerprint(local, cluster) == commands.fingerprint(local, local.head, False)
        deploy.remove_serving(local, cluster)  # stopped, and waited for
        proc.wait(timeout=5)
        assert deploy.serving_fingerprint(local, cluster) is None
    finally:
        proc.kill()
        proc.wait()


def test_a_container_starts_in_place_of_the_old_one(tmp_path, monkeypatch):
    calls = fake_tools(tmp_path, monkeypatch, docker='[ "$1" = run ] && echo new-container-id\n')
    monkeypatch.setattr(state, "LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    local = local_params("mp")
    state.start(local, Cluster.from_params(local), local.nodes, ray=False, say=lambda *_: None)
    rm, run_ = calls.read_text().splitlines()
    assert rm == "docker rm -f sparkbook-vllm"
    assert run_ == " ".join(commands.container_command(local, local.head))


STATE_DOCKER = """case "$1 $2" in
  "ps -a") printf 'sparkbook-vllm\\trunning\\tfp1\\nsparkbook-ray\\texited\\t\\n';;
  "ps -aq") printf 'id1\\nid2\\n';;
  "inspect --format") printf '/sparkbook-vllm sha256:new\\n/sparkbook-ray sha256:old\\n';;
  "image inspect") echo sha256:new;;
esac
"""


def test_node_state_reads_containers_fingerprints_and_images(tmp_path, monkeypatch):
    calls = fake_tools(tmp_path, monkeypatch, docker=STATE_DOCKER,
                       ss='echo "LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:((\\"vllm\\",pid=7,fd=3))"\n')
    local = local_params("mp")
    st = node_states(local, Cluster.from_params(local))["this-machine"]
    assert st.error is None
    assert st.containers == {"sparkbook-vllm": ("running", "fp1"), "sparkbook-ray": ("exited", "")}
    assert st.runs == {"sparkbook-vllm": "sha256:new", "sparkbook-ray": "sha256:old"}
    assert st.image == "sha256:new" and st.current("sparkbook-vllm", "fp1")
    assert not st.current("sparkbook-vllm", "fp2") and not st.running("sparkbook-ray")
    assert [c.check for c in state.port_conflicts(local, {"this-machine": st})] == ["port free"]
    said = calls.read_text()
    assert "--filter label=sparkbook --format {{.Names}}\\t{{.State}}\\t{{.Label \"sparkbook.fingerprint\"}}" in said
    assert "docker inspect --format {{.Name}} {{.Image}} id1 id2" in said
    assert f"docker image inspect --format {{{{.Id}}}} -- {local.runtime.image}" in said


TEARDOWN_DOCKER = """up="$(dirname "$0")/up"
case "$1 $2" in
  "ps -a") [ -e "$up" ] && printf 'sparkbook-vllm\\trunning\\tfp1\\n';;
  "ps -aq") [ -e "$up" ] && echo id1;;
  "rm -f") rm -f "$up";;
  "logs --timestamps") [ "$3" = sparkbook-vllm ] && echo "the last words" && exit
                       echo "Error response from daemon: No such container: $3" >&2; exit 1;;
  exec*) echo "Error response from daemon: No such container: $2" >&2; exit 1;;
esac
"""


def test_teardown_keeps_the_logs_then_removes_every_container(tmp_path, monkeypatch):
    from sparkbook.serving import teardown as removal
    from sparkbook.steps import teardown as step
    calls = fake_tools(tmp_path, monkeypatch, docker=TEARDOWN_DOCKER, ss="")
    (tmp_path / "bin" / "up").touch()
    env_file = tmp_path / "secrets.env"
    env_file.write_text("HF_TOKEN=x\n")
    monkeypatch.setattr(removal, "ENV_FILE", str(env_file))
    local = local_params("mp")
    out = teardown(local, Cluster.from_params(local), tmp_path / "run")
    assert out.removed == {"this-machine": ["sparkbook-vllm"]}
    assert not (out.remaining or out.listeners or out.errors)
    assert "docker rm -f id1" in calls.read_text() and not env_file.exists()
    logs = tmp_path / "run" / "logs" / "this-machine"
    assert (logs / "sparkbook-vllm.log").read_text() == "the last words"
    assert not (logs / "sparkbook-ray.log").exists() and not (logs / "ray_status.log").exists()
    assert "sparkbook-vllm" in (logs / "containers.log").read_text() and (logs / "processes.log").exists()
    assert {c.status for c in step.checks(local, out)} == {"PASS"}
    assert step.table(out).rows == [["this-machine", "sparkbook-vllm", "none", "none"]]


def test_the_serving_outcome_names_its_start_up_time_and_its_checks_the_cause():
    from sparkbook.serving.logs import Diagnosis
    p = load(PAIR)
    ready = deploy.Deployment(action="started", ready=True, seconds=41.6, models=[p.served_model])
    assert ready.key_numbers() == [("vLLM start-up", "ready in 42 s (started)")]
    assert [(c.check, c.status) for c in serve_step.checks(p, ready)] == [("endpoint ready", "PASS"),
                                                                          ("served model", "PASS")]
    killed = deploy.Deployment(action="restarted", seconds=90, stopped={"spark-2": "exited with code 137"},
                               diagnosis=[Diagnosis("spark-1", "out of memory", "CUDA out of memory", "lower", "x")])
    assert killed.key_numbers() == [("vLLM start-up", "not ready after 90 s (restarted)")]
    assert [(c.check, c.node) for c in failures(serve_step.checks(p, killed))] == [
        ("serving container", "spark-2"), ("startup", "spark-1")]
    assert "killed" in serve_step.checks(p, killed)[0].remedy
    assert json.loads(json.dumps(killed.to_json()))["diagnosis"][0]["cause"] == "out of memory"
    silent = deploy.Deployment(action="started", seen="not ready after 1800 s", logs={"spark-1": "logs/spark-1"})
    assert [c.check for c in serve_step.checks(p, silent)] == ["startup"]
    assert serve_step.table(silent).rows[1] == ["ready", "no"]


def test_signatures_on_real_vllm_logs():
    cause, line, remedy = match_signature(field_sample("vllm-error-ray-channel-timeout-1.txt"))
    assert "timed out" in cause and "RayChannelTimeoutError" in line and "02_collectives" in remedy
    cause, line, _ = match_signature(field_sample("vllm-warning-tp-exceeds-gpus-1.txt"))
    assert "exceeds the GPUs" in cause and "Tensor parallel size (2)" in line
    assert match_signature(field_sample("vllm-ray-worker-startup-1.txt")) is None
    assert "port" in match_signature("ERROR [Errno 98] Address already in use")[0]
    capture = "INFO Capturing CUDA graph shapes: 10%\nINFO model loaded\nINFO Capturing CUDA graph shapes: 50%"
    assert "CUDA graphs" in match_signature(capture)[0]
    assert match_signature(capture + "\nINFO Graph capturing finished\nINFO Starting API") is None


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
    states = node_states(params, cluster)
    assert all(not s.containers for s in states.values()), states
    for s in states.values():
        assert not [p for p in params.ports.model_dump().values() if listener(s.listeners, p)]


def test_worker_killed_during_startup_fails_naming_it_with_both_logs(lab, params, cluster, tmp_path):
    from sparkbook.distribution.image import ensure_image
    ensure_image(params, cluster, say=lambda *_: None)
    worker = lab.nodes()[1]
    box = {}
    t0 = time.monotonic()
    serving = threading.Thread(target=lambda: box.update(dep=deploy.serve(params, cluster, tmp_path,
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
    failed = {(c.check, c.node): c for c in failures(serve_step.checks(params, dep))}
    assert "killed" in failed[("serving container", "spark-2")].observed
    for node in ("spark-1", "spark-2"):
        assert (tmp_path / "logs" / node / "sparkbook-vllm.log").stat().st_size > 0
    assert all(not s.containers for s in node_states(params, cluster).values()), "left running"


def test_busy_port_fails_before_any_container_starts(lab, params, cluster, tmp_path):
    faults.apply(lab, "port-busy")
    try:
        dep = deploy.serve(params, cluster, tmp_path, say=lambda *_: None)
        started = {n: s.containers for n, s in node_states(params, cluster).items()}
    finally:
        faults.heal(lab, "port-busy")
    failed = failures(serve_step.checks(params, dep))
    assert [(c.check, c.node) for c in failed] == [("port free", "spark-1")]
    assert f"port {params.ports.api}" in failed[0].observed and failed[0].remedy
    assert all(not c for c in started.values()), started


def test_a_worker_without_the_heads_image_fails_before_anything_starts(lab, params, cluster, tmp_path):
    from sparkbook.distribution.image import ensure_image
    from sparkbook.errors import CheckFailed
    ensure_image(params, cluster, say=lambda *_: None)
    teardown(params, cluster, tmp_path)  # nothing serving that would be kept
    worker, image = lab.nodes()[1], params.runtime.image
    docker(worker, "tag", image, "sbk-test-keep:latest")  # the layers stay: restored by a tag
    try:
        seen = {}
        docker(worker, "rmi", image)  # the tag only
        with pytest.raises(CheckFailed) as absent:
            deploy.serve(params, cluster, tmp_path, say=lambda *_: None)
        seen["absent"] = {n: s.containers for n, s in node_states(params, cluster).items()}
        # another image under the tag: the same layers, another ID
        docker(worker, "build", "-q", "-t", image, "-", input="FROM sbk-test-keep:latest\nLABEL x=1\n")
        with pytest.raises(CheckFailed) as other:
            form_ray_cluster(params, cluster, tmp_path, say=lambda *_: None)
        seen["other"] = {n: s.containers for n, s in node_states(params, cluster).items()}
    finally:
        docker(worker, "tag", "sbk-test-keep:latest", image)
        docker(worker, "rmi", "sbk-test-keep:latest", check=False)
        docker(worker, "image", "prune", "-f", check=False)
    assert "- spark-2: the image is not there" in str(absent.value)
    assert re.search(r"^- spark-2: holds [0-9a-f]{12} under the tag, the head [0-9a-f]{12}$", str(other.value), re.M)
    for e in (absent, other):
        assert "spark-1" not in str(e.value) and "remedy: run 03_distribute_image" in str(e.value)
    assert all(not c for s in seen.values() for c in s.values()), seen
