"""Serving (04, 05, 08) without the lab: the command builders for the DGX Spark pair, the node
scripts against a fake `docker`, the stall watch on real vLLM logs (the failure signatures:
test_signatures.py). On the lab: test_serving_lab.py."""

import json
from contextlib import contextmanager
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml


from conftest import field_sample
from sparkbook.params import ParamsError, load, validate
from sparkbook.redact import MASK
from sparkbook.remote import Cluster, command_line
from sparkbook.serving import commands, deploy, startup, state
from sparkbook.serving.inspection import ImageInfo, configured_options, image_checks, image_table
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


def program(cmd, image):
    """What a container runs: its --entrypoint, then the arguments after the image."""
    return [cmd[cmd.index("--entrypoint") + 1], *cmd[cmd.index(image) + 1:]]


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
        ray = program(cmd, p.runtime.image)
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
    serve = program(cmd, p.runtime.image)
    assert serve[:2] == ["vllm", "serve"] and "--headless" in serve
    assert serve[serve.index("--node-rank") + 1] == "1"
    assert serve[serve.index("--master-addr") + 1] == "192.168.100.10"
    assert "--port" not in serve
    hserve = commands.serve_args(p, head)
    assert "--headless" not in hserve and hserve[hserve.index("--node-rank") + 1] == "0"
    assert [g[0].name for g in commands.groups(p.nodes, ray=False)] == ["spark-2", "spark-1"]
    assert [g[0].name for g in commands.groups(p.nodes, ray=True)] == ["spark-1", "spark-2"]


def test_every_container_names_its_program_whatever_the_images_entrypoint():
    """vllm/vllm-openai images declare ENTRYPOINT ["vllm", "serve"]: a command after the image
    would be appended to it. Each sparkbook container sets its own entrypoint, or runs its whole
    command through runtime.entrypoint; extra docker_args come before the image."""
    from sparkbook.collectives import command as torchrun_command
    p = load(PAIR)
    for cmd, first in ((commands.container_command(p, p.head, ray=True), ["ray", "start"]),
                       (commands.container_command(p, p.head, ray=False), ["vllm", "serve"]),
                       (torchrun_command(p, p.head), ["torchrun"])):
        assert cmd.count("--entrypoint") == 1 and program(cmd, p.runtime.image)[:len(first)] == first
    wrapped = p.model_copy(update={"runtime": p.runtime.model_copy(update={
        "entrypoint": "/opt/nvidia/nvidia_entrypoint.sh", "docker_args": ["--cpus=8", "--pids-limit=4096"]})})
    cmd = commands.container_command(wrapped, wrapped.head, ray=True)
    image_at = cmd.index(wrapped.runtime.image)
    assert cmd[image_at - 2:image_at] == ["--entrypoint", "/opt/nvidia/nvidia_entrypoint.sh"]
    assert cmd[image_at + 1:image_at + 4] == ["ray", "start", "--block"]
    assert cmd.index("--cpus=8") < image_at and cmd.index("--pids-limit=4096") < image_at


def test_docker_args_that_sparkbook_sets_or_that_split_are_refused():
    data = yaml.safe_load(PAIR.read_text())
    data["runtime"].update(docker_args=["--network=none", "-v", "/a:/b", "--cpus=2"], entrypoint="--rm")
    with pytest.raises(ParamsError) as e:
        validate(data, "pair")
    text = str(e.value)
    assert "--network is set by sparkbook" in text and "'-v' (write each as one item" in text
    assert "'/a:/b'" in text and "--cpus=2" not in text and "runtime.entrypoint" in text


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


def test_what_was_read_with_the_platform_stubbed_warns_but_never_fails():
    """Options and architectures read with the platform stubbed (the engine did not import without
    a GPU) may differ from the real platform's: a mismatch is a WARN that says so, never a FAIL."""
    p = load(PAIR)
    opts = configured_options(p)
    why = "RuntimeError: Failed to infer device type"
    info = ImageInfo("img", "sha256:1", vllm="0.17.0", ray="2.54.0", options=[o for o in opts if o != "--reasoning-parser"],
                     architectures=["LlamaForCausalLM"], model_architectures=["Qwen3_5MoeForCausalLM"],
                     stubbed={"options": why, "architectures": why})
    checks = {c.check: c for c in image_checks(p, info, need_ray=True)}
    assert not failures(checks.values())
    for name in ("vllm serve options", "model architecture"):
        assert checks[name].status == "WARN" and "platform stubbed" in checks[name].observed
        assert why in checks[name].observed
    fine = ImageInfo("img", "sha256:1", vllm="0.17.0", ray="2.54.0", options=opts,
                     architectures=["Qwen3_5MoeForCausalLM"], model_architectures=["Qwen3_5MoeForCausalLM"],
                     stubbed={"options": why})
    assert {c.check: c.status for c in image_checks(p, fine)}["vllm serve options"] == "PASS"
    rows = {r[0]: r[1] for r in image_table(fine).rows}
    assert rows["options read with the platform stubbed"] == why


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


@contextmanager
def busy_and_idle():
    """The PIDs of two real processes: one that has used 0.3 s of CPU, one that has used none."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.3: pass\nprint('burnt', flush=True)\n"
                             "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen(["sleep", "30"])
    try:
        assert busy.stdout.readline().strip() == "burnt"
        yield busy.pid, idle.pid
    finally:
        for proc in (busy, idle):
            proc.kill()
            proc.wait()


TAIL_DOCKER = """case "$1" in
  inspect) echo "$FAKE_STATE";;
  exec) [ -n "$FAKE_SERVE_UP" ];;
  top) printf 'PID COMMAND\\n%s raylet --node-ip-address x\\n%s python3 vllm-like\\n' "$FAKE_RAYLET" "$FAKE_VLLM";;
  logs) echo "last line of the container";;
esac
"""


@pytest.mark.parametrize("executor,docker_state,serve_up,expected", [
    ("ray", "running 0 false", "1", "running"),
    ("ray", "running 0 false", "", "serve-exited"),  # the Ray container lives on, vllm serve died
    ("ray", "exited 137 true", "", "exited with code 137, killed for memory (OOM)"),
    ("mp", "exited 143 false", "", "exited with code 143, killed by a signal"),
    ("mp", "running 0 false", "", "running")])
def test_progress_readings_tell_a_dead_server_from_a_live_one(tmp_path, monkeypatch, executor, docker_state,
                                                              serve_up, expected):
    fake_tools(tmp_path, monkeypatch, docker=TAIL_DOCKER)
    monkeypatch.setenv("FAKE_STATE", docker_state)
    monkeypatch.setenv("FAKE_SERVE_UP", serve_up)
    # two real processes stand for Ray's raylet and a vLLM worker: only vLLM's CPU time counts (Ray)
    with busy_and_idle() as (busy, idle):
        monkeypatch.setenv("FAKE_RAYLET", str(busy if executor == "mp" else idle))
        monkeypatch.setenv("FAKE_VLLM", str(idle if executor == "mp" else busy))
        params = local_params(executor)
        reading = startup.read_progress(params, Cluster.from_params(params))["this-machine"]
    assert reading.status == expected
    assert reading.cpu_s is not None and reading.cpu_s >= 0.25  # the busy one, whichever it plays
    assert reading.tail == ([] if executor == "ray" else ["last line of the container"])
    assert reading.dead == (expected not in ("running",))


ENGINE_AND_WORKER_DOCKER = """case "$1" in
  inspect) echo "running 0 false";;
  top) printf 'PID COMMAND\\n%s VLLM::EngineCore\\n%s VLLM::Worker_TP0\\n' "$FAKE_ENGINE" "$FAKE_WORKER";;
esac
"""


def test_only_the_workers_cpu_counts_where_vllm_names_them(tmp_path, monkeypatch):
    """The engine polls while it waits for a hung rank: its CPU time is no progress."""
    fake_tools(tmp_path, monkeypatch, docker=ENGINE_AND_WORKER_DOCKER)
    with busy_and_idle() as (busy, idle):
        monkeypatch.setenv("FAKE_ENGINE", str(busy))
        monkeypatch.setenv("FAKE_WORKER", str(idle))
        params = local_params("mp")
        reading = startup.read_progress(params, Cluster.from_params(params))["this-machine"]
    assert reading.status == "running" and reading.cpu_s is not None and reading.cpu_s < 0.1


def test_start_up_phases_follow_a_real_spark_log():
    lines = field_sample("vllm-ray-head-startup-1.txt").splitlines()
    seen, phase = [], ""
    for line in lines:
        new = startup.phase_of([line], phase)
        if new != phase:
            seen.append(new)
            phase = new
    # the order vLLM 0.16 went through on a Spark pair, none skipped by a word in the config dump
    assert seen == ["ray", "distributed init", "weights", "compile", "kv cache", "graph capture", "api"]
    assert startup.phase_of(["(RayWorkerWrapper pid=1) INFO world_size=2 rank=1"], "kv cache") == "kv cache"


def test_ray_workers_lines_in_the_heads_log_count_for_their_own_node():
    """On a real Spark pair's head log, the worker's lines (ip=192.168.100.11) are spark-2's."""
    p = load(PAIR)
    lines = [ln for ln in field_sample("vllm-ray-head-startup-1.txt").splitlines() if ln.strip()]
    readings = {"spark-1": startup.NodeProgress("running", 1.0, list(lines)),
                "spark-2": startup.NodeProgress("running", 1.0, [])}
    startup.attribute_ray_lines(p, readings)
    worker, head = readings["spark-2"].tail, readings["spark-1"].tail
    assert worker and all("ip=192.168.100.11" in ln for ln in worker)
    assert not [ln for ln in head if "ip=192.168.100.11" in ln] and len(head) + len(worker) == len(lines)
    assert startup.phase_of(worker) == "kv cache" and startup.phase_of(head) == "api"


def test_a_stall_is_called_when_no_node_moves_naming_the_node_furthest_behind():
    def reading(cpu, *tail):
        return startup.NodeProgress("running", cpu, list(tail))
    watch = startup.StallWatch(timeout=60)
    assert watch.update({"a": reading(1.0, "world_size=2 rank=0"), "b": reading(1.0)}, now=0) is None
    # b compiles silently (CPU only), a logs: no stall however long
    for t in range(10, 200, 10):
        assert watch.update({"a": reading(1.0, "world_size=2 rank=0", f"line {t}"),
                             "b": reading(1.0 + t)}, now=t) is None
    # b freezes at 190 (no CPU), a logs once more at 200 then waits on it: called 60 s after a's last move
    assert watch.update({"a": reading(1.0, "Loading weights took 3 s"), "b": reading(190.0)}, now=200) is None
    assert watch.update({"a": reading(1.0, "Loading weights took 3 s"), "b": reading(190.0)}, now=259) is None
    stall = watch.update({"a": reading(1.01, "Loading weights took 3 s"), "b": reading(190.0)}, now=261)
    assert stall is not None and stall.node == "b" and stall.quiet_s == pytest.approx(61)
    assert stall.phase == "weights" and "disk" in stall.cause  # b's log is silent: the phase a reached
    assert watch.phases == {"a": "weights", "b": ""}
    # lines that only say vLLM waits (a placement group that never fits) are no progress
    ray = startup.StallWatch(timeout=60)
    waiting = "(EngineCore pid=1) INFO [ray_utils.py:467] Waiting for creating a placement group of specs for {} seconds."
    assert ray.update({"a": reading(5.0, "No current placement group found.")}, now=0) is None
    assert ray.update({"a": reading(5.0, "No current placement group found.", waiting.format(10))}, now=10) is None
    stall = ray.update({"a": reading(5.0, "No current placement group found.", waiting.format(10),
                                     waiting.format(30), waiting.format(70))}, now=70)
    assert stall is not None and stall.phase == "ray" and "04_ray_cluster" in stall.cause


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
    ready = deploy.Deployment(action="started", ready=True, seconds=41.6, models=[p.served_model],
                              executor="ray", ray_workers={"spark-1": 1, "spark-2": 1})
    assert ready.key_numbers() == [("vLLM start-up", "ready in 42 s (started)")]
    assert [(c.check, c.status) for c in serve_step.checks(p, ready)] == [
        ("endpoint ready", "PASS"), ("served model", "PASS"), ("vLLM's Ray workers", "PASS")]
    # vLLM that did not start its workers through Ray (a fallback): named, not passed
    fell_back = deploy.Deployment(action="started", ready=True, models=[p.served_model], executor="ray",
                                  ray_workers={"spark-1": 0, "spark-2": 0})
    assert [(c.check, c.observed) for c in failures(serve_step.checks(p, fell_back))] == [
        ("vLLM's Ray workers", "0 (spark-1: 0, spark-2: 0)")]
    unlisted = deploy.Deployment(ready=True, models=[p.served_model], ray_workers_error="no state API")
    assert serve_step.checks(p, unlisted)[-1].status == "WARN"
    killed = deploy.Deployment(action="restarted", seconds=90, stopped={"spark-2": "exited with code 137"},
                               diagnosis=[Diagnosis("spark-1", "out of memory", "CUDA out of memory", "lower", "x")])
    assert killed.key_numbers() == [("vLLM start-up", "not ready after 90 s (restarted)")]
    assert [(c.check, c.node) for c in failures(serve_step.checks(p, killed))] == [
        ("serving container", "spark-2"), ("startup", "spark-1")]
    assert "killed" in serve_step.checks(p, killed)[0].remedy
    assert json.loads(json.dumps(killed.to_json()))["diagnosis"][0]["cause"] == "out of memory"
    silent = deploy.Deployment(action="started", seen="not ready after 1800 s", logs={"spark-1": "logs/spark-1"})
    assert [c.check for c in serve_step.checks(p, silent)] == ["startup"]
    assert serve_step.table(silent).rows[2] == ["ready", "no"]


def test_a_subset_serves_and_a_node_outside_it_in_the_ray_cluster_fails():
    """serving.nodes [spark-1, spark-3] of a 4-node lab: only they start containers (mp ranks 0 and
    1, --nnodes 2); a Ray node that joined from spark-2 would offer its GPU to vLLM: a FAIL."""
    from sparkbook.lab import lab_params
    from sparkbook.serving.ray import RayCluster
    from sparkbook.steps import ray_cluster
    d = lab_params(4)
    d["serving"].update(nodes=["spark-1", "spark-3"], pipeline_parallel_size=1)
    p = validate(d)
    table = commands.commands_table(p)
    assert [row[0] for row in table.rows] == ["spark-1", "spark-3", "spark-1"]  # Ray x2, then vllm serve
    rec = lambda ip: {"ip": ip, "alive": True, "resources": {"CPU": 2, "GPU": 1}}  # noqa: E731
    rc = RayCluster(nodes={"spark-1": rec("10.77.1.11"), "spark-3": rec("10.77.1.13"), "spark-2": rec("10.77.1.12")})
    got = {(c.node, c.status) for c in ray_cluster.checks(p, rc)}
    assert got == {("spark-2", "FAIL"), ("spark-1", "PASS"), ("spark-3", "PASS")}
    mp = validate({**d, "serving": {**d["serving"], "executor": "mp"}})
    args = commands.serve_args(mp, mp.node("spark-3"))
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--node-rank") + 1] == "1"
