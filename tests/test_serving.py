"""Serving (04, 05, 08) without the lab: the command builders for the DGX Spark pair, the node
scripts against a fake `docker`, the stall watch on real vLLM logs (the failure signatures:
test_signatures.py). On the lab: test_serving_lab.py."""

import getpass
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
from sparkbook.facts.identity import INSPECT_FORMAT
from sparkbook.params import ParamsError, load, validate
from sparkbook.facts.parsers import parse_sections
from sparkbook.book.redact import MASK
from sparkbook.nodes.remote import Cluster
from sparkbook.nodes import workdir
from sparkbook.serving import commands, deploy, plan, startup, state, vllm
from sparkbook.serving.inspection import ImageInfo, configured_options, image_checks, image_table
from sparkbook.serving.state import node_states
from sparkbook.serving.teardown import teardown
from sparkbook.nodes.shell import command_line
from sparkbook.steps import serve as serve_step
from sparkbook.book.verdict import FAIL, PASS, SKIP

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "parameters" / "dgx-spark-pair.yaml"
LAB = ROOT / "parameters" / "lab.yaml"
CANARY = "hf_CANARYcanary0123456789"


def env_of(cmd):
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "-e")


def program(cmd, image):
    """What a container runs: its --entrypoint, then the arguments after the image."""
    return [cmd[cmd.index("--entrypoint") + 1], *cmd[cmd.index(image) + 1:]]


def test_runtime_ptrace_lets_py_spy_read_the_workers_and_is_off_by_default():
    p = load(PAIR)
    traced = p.model_copy(update={"runtime": p.runtime.model_copy(update={"ptrace": True})})
    for ray in (True, False):
        cmd = commands.container_command(traced, traced.head, ray)
        assert shlex.join(["--cap-add", "SYS_PTRACE"]) in command_line(cmd)
        # a restart when it changes: the container's fingerprint holds its command
        assert commands.fingerprint(traced, traced.head, ray) != commands.fingerprint(p, p.head, ray)


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
        assert "--privileged" not in cmd and "SYS_PTRACE" not in cmd
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
    assert serve[:3] == ["docker", "exec", "-d"] and serve[5:8] == ["sparkbook-dgx-spark-pair-ray", "bash", "-c"]
    inner = shlex.split(serve[-1].split(" > ")[0])
    assert inner[:3] == ["vllm", "serve", p.model.path]
    for a, b in (("--tensor-parallel-size", "2"), ("--distributed-executor-backend", "ray"),
                 ("--reasoning-parser", "qwen3"), ("--tool-call-parser", "qwen3_coder"),
                 ("--served-model-name", "qwen3.5-122b"), ("--port", "8000"), ("--host", "spark-1.local")):
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
    from sparkbook.collectives.sweep import command as torchrun_command
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
    assert cmd[cmd.index("--env-file") + 1] == "/tmp/sparkbook-nvidia/dgx-spark-pair/secrets.env"
    rendered = plan.commands_table(p).to_text() + plan.commands_table(p)._repr_html_()
    assert CANARY not in rendered and CANARY not in json.dumps(cmd)
    assert commands.shown(["echo", CANARY]) == f"echo {MASK}"
    with_canary = commands.fingerprint(p, p.head, True)
    monkeypatch.setenv("HF_TOKEN", "hf_anotherTOKENvalue42")
    assert commands.fingerprint(p, p.head, True) == with_canary  # whether a token is set, not its value


def test_a_secret_written_in_serving_env_goes_through_the_secrets_file_only():
    """A token written in the parameters' serving.env never reaches a command line (where `ps`
    shows it to every user of the node): the secrets file carries it; a new value restarts."""
    secret = "hf_writtenINtheFILE0123456789"
    data = yaml.safe_load(PAIR.read_text())
    data["serving"]["env"] = {"HF_TOKEN": secret, "VLLM_LOGGING_LEVEL": "DEBUG"}
    p = validate(data)
    for ray in (True, False):
        cmd = commands.container_command(p, p.head, ray=ray)
        assert secret not in json.dumps(cmd) and env_of(cmd)["VLLM_LOGGING_LEVEL"] == "DEBUG"
        assert commands.secrets(p, ray)["HF_TOKEN"] == secret and "--env-file" in cmd
    assert secret not in json.dumps(commands.ray_serve_command(p))
    before = commands.fingerprint(p, p.head, False)
    data["serving"]["env"]["HF_TOKEN"] = "hf_anotherWRITTENvalue98765"
    assert commands.fingerprint(validate(data), p.head, False) != before


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


def test_an_image_absent_from_the_head_or_without_vllm_fails_alone():
    p = load(PAIR)
    absent = image_checks(p, ImageInfo("img", errors={"image": "Error: No such image: img"}))
    assert [(c.check, c.status) for c in absent] == [("image", FAIL)] and "03_distribute_image" in absent[0].remedy
    why = "ModuleNotFoundError: No module named 'vllm'"
    bare = image_checks(p, ImageInfo("img", "sha256:1", errors={"inspect": why}))
    assert [(c.check, c.status, c.observed) for c in bare] == [("vLLM in the image", FAIL, why)]


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
    assert set(vllm.PHASE_CAUSES) == set(startup.ORDER)  # a likely cause for every phase
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
    assert watch.update({"a": reading(1.0, "Loading weights took 3 s"), "b": reading(190.0)}, now=230) is None
    assert watch.update({"a": reading(1.0, "Loading weights took 3 s"), "b": reading(190.0)}, now=259) is None
    stall = watch.update({"a": reading(1.01, "Loading weights took 3 s"), "b": reading(190.0)}, now=261)
    assert stall is not None and stall.node == "b" and stall.quiet_s == pytest.approx(61)
    assert stall.readings == 3 and "for 61 s (3 readings, one every 20 s); b is furthest behind" in stall.summary
    assert stall.every_s == pytest.approx(61 / 3)
    assert stall.phase == "weights" and "disk" in stall.cause  # b's log is silent: the phase a reached
    row = next(c for c in serve_step.checks(lab_like(), deploy.Deployment(stall=stall)) if c.check == "startup progress")
    assert (row.node, row.status) == ("b", FAIL) and row.observed.startswith(stall.summary) and row.remedy
    assert watch.phases == {"a": "weights", "b": ""}
    # lines that only say vLLM waits (a placement group that never fits) are no progress
    ray = startup.StallWatch(timeout=60)
    waiting = "(EngineCore pid=1) INFO [ray_utils.py:467] Waiting for creating a placement group of specs for {} seconds."
    assert ray.update({"a": reading(5.0, "No current placement group found.")}, now=0) is None
    assert ray.update({"a": reading(5.0, "No current placement group found.", waiting.format(10))}, now=10) is None
    assert ray.update({"a": reading(5.0, "No current placement group found.", waiting.format(10),
                                    waiting.format(30))}, now=40) is None
    stall = ray.update({"a": reading(5.0, "No current placement group found.", waiting.format(10),
                                     waiting.format(30), waiting.format(70))}, now=70)
    assert stall is not None and stall.phase == "ray" and "04_ray_cluster" in stall.cause


def test_one_late_reading_after_a_long_gap_is_no_stall():
    """This machine too busy to poll for 90 s (a neighbour, a swap storm): the first reading after
    the gap sees no progress, but a stall needs three readings that saw none."""
    still = startup.NodeProgress("running", 1.0, ["Loading weights took 3 s"])
    watch = startup.StallWatch(timeout=60)
    assert watch.update({"a": still}, now=0) is None
    assert watch.update({"a": still}, now=90) is None and watch.update({"a": still}, now=93) is None
    moved = startup.NodeProgress("running", 1.0, ["Loading weights took 3 s", "KV cache size: 9 tokens"])
    assert watch.update({"a": moved}, now=96) is None  # it was working all along
    for t in (150, 153):
        assert watch.update({"a": moved}, now=t) is None
    assert watch.update({"a": moved}, now=157).readings == 3


def test_among_nodes_in_one_phase_the_stall_names_the_one_whose_vllm_stopped_using_cpu():
    """Both logs reached 'weights'; a went quiet first but its vLLM still ticks (it waits), b logged
    later and then used no CPU at all (frozen, as the lab's stall fault does): b is named."""
    def reading(cpu, *tail):
        return startup.NodeProgress("running", cpu, list(tail))
    watch = startup.StallWatch(timeout=60)
    assert watch.update({"a": reading(1.0, "Loading weights took 1 s"), "b": reading(1.0)}, now=0) is None
    assert watch.update({"a": reading(1.01, "Loading weights took 1 s"),
                         "b": reading(1.5, "Loading weights took 2 s")}, now=5) is None
    for t in range(10, 60, 10):  # a's threads poll (a few ms a reading), b is stopped
        assert watch.update({"a": reading(1.01 + t / 1000, "Loading weights took 1 s"),
                             "b": reading(1.5, "Loading weights took 2 s")}, now=t) is None
    stall = watch.update({"a": reading(1.07, "Loading weights took 1 s"),
                          "b": reading(1.5, "Loading weights took 2 s")}, now=66)
    assert stall is not None and stall.node == "b" and watch.phases == {"a": "weights", "b": "weights"}


def test_a_node_whose_vllm_is_held_throughout_is_named_whatever_the_others_show():
    """Both idle (the head's rank waits in a collective and ticks no CPU either, and went quiet
    later; b's log is even a phase ahead): b's workers are stopped (state T, the lab's stall fault; D for a
    hung mount or driver call) in the last three readings, so b is named, and said so. A process
    held in one reading only (a moment's disk wait) decides nothing."""
    def reading(stuck, *tail):
        return startup.NodeProgress("running", 1.0, list(tail), stuck)
    watch = startup.StallWatch(timeout=30)
    ray = "(EngineCore pid=1) INFO [ray_utils.py:607] No current placement group found."
    assert watch.update({"a": reading(0, ray), "b": reading(0, ray, "world_size=2 rank=1")}, now=0) is None
    assert watch.update({"a": reading(0, ray, "numa warning"), "b": reading(1, ray, "world_size=2 rank=1")},
                        now=5) is None
    for t in (15, 25):
        assert watch.update({"a": reading(0, ray, "numa warning"),
                             "b": reading(1, ray, "world_size=2 rank=1")}, now=t) is None
    stall = watch.update({"a": reading(0, ray, "numa warning"), "b": reading(1, ray, "world_size=2 rank=1")},
                         now=35)
    assert stall is not None and stall.node == "b" and stall.held
    assert "b's vLLM processes are stopped or in uninterruptible sleep (state T or D)" in stall.summary
    # held in the last reading only: the usual order decides (b went quiet first), not "held"
    watch = startup.StallWatch(timeout=30)
    for t, held in ((0, 0), (5, 0), (15, 0), (25, 0), (35, 0), (45, 1)):
        stall = watch.update({"a": reading(0, ray, "numa warning" if t else ray), "b": reading(held, ray)}, now=t)
    assert stall is not None and stall.node == "b" and not stall.held and "furthest behind" in stall.summary


def test_a_rank_spinning_while_its_peer_waits_is_a_stall_and_a_compile_is_not():
    """Its own CPU climbing, its log silent, nothing compiling: in the distributed initialisation
    (where nothing compiles) that is a spin, called within the timeout, named and said so; a rank
    whose compilers work for five times the timeout is not; its own CPU alone after the weights is
    work while a peer works too, a spin once it is the only node at work."""
    def reading(cpu, compile_s, *tail):
        return startup.NodeProgress("running", cpu, list(tail), compile_s=compile_s)
    init = "(RayWorkerWrapper pid=9) INFO world_size=2 rank=1 distributed_init_method=tcp://x"
    watch = startup.StallWatch(timeout=30)
    stall = None
    for t in range(0, 60, 5):  # b spins a core, a waits (no CPU), neither logs
        stall = watch.update({"a": reading(2.0, 0.0, "world_size=2 rank=0"), "b": reading(2.0 + t, 0.0, init)},
                             now=t)
        if stall:
            break
    assert stall is not None and t <= 35 and stall.node == "b" and stall.spinning and not stall.held
    assert stall.phase == "distributed init" and stall.cause.startswith("a rank spinning")
    assert "NCCL/gloo initialisation" in stall.cause  # and the phase's own cause
    assert "b's vLLM workers are spinning: using CPU in their own threads" in stall.summary
    # the same in a phase that compiles, with the compile in b's compilers (g++, ptxas, nvcc): work
    weights = ["Loading weights took 3 s", "Available KV cache memory: 1 GiB"]
    watch = startup.StallWatch(timeout=30)
    for t in range(0, 150, 5):
        assert watch.update({"a": reading(2.0, 0.0, *weights), "b": reading(2.0 + t / 10, 4.0 + t, *weights)},
                            now=t) is None
    # after the weights, b's own CPU alone is work while a works too (both compile in-process) ...
    watch = startup.StallWatch(timeout=30)
    for t in range(0, 150, 5):
        assert watch.update({"a": reading(2.0 + t, 0.0, *weights), "b": reading(2.0 + t, 0.0, *weights)},
                            now=t) is None
    # ... and a spin once a is idle: the only node at work waits on the others, or they on it
    stall = None
    for t in range(150, 220, 5):
        stall = stall or watch.update({"a": reading(152.0, 0.0, *weights), "b": reading(2.0 + t, 0.0, *weights)},
                                      now=t)
    assert stall is not None and stall.node == "b" and stall.spinning and stall.phase == "kv cache"
    # a spinning node whose own log says nothing yet: the stall's phase is the furthest node's,
    # its cause the spin's alone (not the cause of a phase the other node reached)
    watch = startup.StallWatch(timeout=30)
    stall = None
    for t in range(0, 60, 5):
        stall = stall or watch.update({"a": reading(2.0, 0.0, *weights), "b": reading(2.0 + t, 0.0)}, now=t)
    assert stall.node == "b" and stall.spinning and stall.phase == "kv cache" and stall.cause == startup.SPIN_CAUSE
    # a single node: its own CPU after the weights is work however long (no peer to wait on)
    watch = startup.StallWatch(timeout=30)
    for t in range(0, 150, 5):
        assert watch.update({"b": reading(2.0 + t, 0.0, *weights)}, now=t) is None


def test_the_progress_script_counts_compilers_and_finished_children_as_compiling(tmp_path):
    """serving_progress.sh on this machine, its docker a stand-in: a busy process listed as
    ``cc1plus`` counts under @@ compile, not @@ cpu; a worker that ran a busy child and reaped it
    counts its child's CPU under @@ compile and its own under @@ cpu."""
    import textwrap
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
                               "while time.process_time() - t < 0.4: pass'])\nprint('reaped', flush=True)\n"
                               "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "reaped"
        with busy_and_idle() as (busy, _):
            fake = tmp_path / "docker"
            fake.write_text(textwrap.dedent(f"""\
                #!/bin/sh
                case "$1" in
                  inspect) echo "running 0 false" ;;
                  top) echo "PID COMMAND"; echo "{busy} /usr/lib/gcc/aarch64-linux-gnu/13/cc1plus -O2 k.cpp"
                       echo "{parent.pid} ray::RayWorkerWrapper.execute_method" ;;
                  logs) echo "a log line" ;;
                esac
                """))
            fake.chmod(0o755)
            script = Path(commands.__file__).parents[1] / "scripts" / "serving_progress.sh"
            out = subprocess.run(["bash", str(script), "c", "ray-worker", "5"], capture_output=True, text=True,
                                 env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}, check=True).stdout
        sections = parse_sections(out.partition("\n")[2])
        assert float(sections["compile"]) >= 0.6, out  # cc1plus's 0.3 s and the reaped child's 0.4 s
        assert float(sections["cpu"]) < 0.3, out  # the worker's own: starting Python, not its child's
    finally:
        parent.kill()
        parent.wait()


def test_the_progress_script_counts_stopped_workers(tmp_path):
    """serving_progress.sh on this machine, its docker a stand-in listing one worker process that
    is really stopped (SIGSTOP) and one that runs: @@ stuck is 1."""
    import signal
    import subprocess
    import textwrap
    stopped = subprocess.Popen(["sleep", "60"])
    running = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        fake = tmp_path / "docker"
        fake.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            case "$1" in
              inspect) echo "running 0 false" ;;
              top) echo "PID COMMAND"; echo "{stopped.pid} ray::RayWorkerProc"; echo "{running.pid} ray::RayWorkerProc" ;;
              logs) echo "a log line" ;;
            esac
            """))
        fake.chmod(0o755)
        for _ in range(50):  # the stop lands a moment after the signal
            if open(f"/proc/{stopped.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T":
                break
            time.sleep(0.05)
        script = Path(commands.__file__).parents[1] / "scripts" / "serving_progress.sh"
        out = subprocess.run(["bash", str(script), "c", "ray-worker", "5"], capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}, check=True).stdout
        assert parse_sections(out.partition("\n")[2])["stuck"].strip() == "1", out
    finally:
        for proc in (stopped, running):
            proc.kill()
            proc.wait()


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
    # the engine's too: this "container" is this machine, where a lab's real vLLM engines may run
    # (remove_serving's `pkill -9 -f SERVE|ENGINE` killed a lab deployment's EngineCore once)
    monkeypatch.setattr(deploy, "ENGINE_PATTERN", f"[{mark[0]}]{mark[1:]}-engine")
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


# A docker of containers as files: $FAKE_DOCKER/NAME holds the deployment its `sparkbook` label
# names, then the login its `sparkbook.owner` label names (absent: no owner label).
# `--filter label=sparkbook=X` lists X's; the key alone (`label=sparkbook`) lists them all.
DOCKER = r"""d=$FAKE_DOCKER
for a; do last=$a; done
want=
for a; do case $a in label=sparkbook) want='*';; label=sparkbook=*) want=${a#label=sparkbook=};; esac; done
case "$1" in
  ps) for f in "$d"/*; do
        [ -e "$f" ] || continue; n=${f##*/}
        case $(cat "$f") in $want) ;; *) continue;; esac
        case "$*" in *"{{.ID}}"*) echo "$n $n";; *"{{.Names}}\t"*) printf '%s\trunning\tfp1\n' "$n";;
                     *"{{.Names}}"*) echo "$n";; *) echo "$n";; esac
      done;;
  rm) shift; for n; do case $n in -*) ;; *) rm -f "$d/$n";; esac; done;;
  container) [ -e "$d/$last" ] || exit 1
             case "$*" in *sparkbook.owner*) sed -n 2p "$d/$last";; *) sed -n 1p "$d/$last";; esac;;
  inspect) shift 3; for n; do echo "/$n sha256:new"; done;;
  image) echo '{"Id":"sha256:new","RootFS":{"Layers":["sha256:l1"]},"Config":null}';;
  run) env_file=$(printf '%s\n' "$@" | sed -n '/^--env-file$/{n;p;}')
       if [ -n "$env_file" ]; then cp "$env_file" "$d/../env-file-seen"; stat -c %a "$env_file" > "$d/../env-file-mode"; fi
       for a; do case $a in sparkbook=*) label=${a#sparkbook=};; sparkbook.owner=*) owner=${a#sparkbook.owner=};; esac; done
       name=$(printf '%s\n' "$@" | sed -n '/^--name$/{n;p;}'); printf '%s\n%s\n' "$label" "$owner" > "$d/$name"; echo new-id;;
  logs) [ -e "$d/$last" ] && echo "the last words of $last" && exit 0
        echo "Error response from daemon: No such container: $last" >&2; exit 1;;
  exec) [ -n "$FAKE_EXEC" ] && shift 2 && exec "$@"
        echo "Error response from daemon: No such container: $2" >&2; exit 1;;
esac
"""


@pytest.fixture
def docker_of(tmp_path, monkeypatch):
    """The fake docker above, its containers (name -> deployment, or "deployment/owner"), the
    calls it got; the working folder of every deployment under tmp_path."""
    from sparkbook.nodes import workdir
    folder = tmp_path / "containers"
    folder.mkdir()
    monkeypatch.setenv("FAKE_DOCKER", str(folder))
    monkeypatch.setattr(workdir, "workdir", lambda params, node: str(tmp_path / "work" / params.name))
    calls = fake_tools(tmp_path, monkeypatch, docker=DOCKER, ss="")

    def containers(**have):
        for name, deployment in have.items():
            (folder / name).write_text(deployment.replace("/", "\n") + "\n")
        return {f.name: f.read_text().splitlines()[0] for f in folder.iterdir()}
    containers.calls = calls
    return containers


def test_a_container_starts_in_place_of_its_own_never_of_anothers(docker_of, monkeypatch):
    """`docker rm -f NAME` only when NAME is this deployment's container; another's is left, and
    the start refused naming it. The working folder is made private first."""
    from sparkbook.book.errors import CheckFailed
    monkeypatch.delenv("HF_TOKEN", raising=False)
    local = local_params("mp")
    name = commands.container_name(local, False)
    assert name == "sparkbook-localhost-vllm"
    cluster = Cluster.from_params(local)
    state.start(local, cluster, local.nodes, ray=False, say=lambda *_: None)
    assert docker_of() == {name: "localhost"}
    said = docker_of.calls.read_text().splitlines()
    assert not [c for c in said if c.startswith("docker rm")]  # nothing was there to remove
    assert said[-1] == " ".join(commands.container_command(local, local.head))
    state.start(local, cluster, local.nodes, ray=False, say=lambda *_: None)  # in place of its own
    assert f"docker rm -f -- {name}" in docker_of.calls.read_text()
    (Path(docker_of.calls).parent / "calls").write_text("")
    me = getpass.getuser()
    for theirs, why in ((f"someone-else/{me}", "label sparkbook is someone-else"),  # another deployment's
                        ("localhost/nobody", f"label sparkbook.owner is nobody, not {me}")):  # another user's
        docker_of(**{name: theirs})
        with pytest.raises(CheckFailed, match=f"REPLACE-REFUSED a container named {name} exists whose {why}"):
            state.start(local, cluster, local.nodes, ray=False, say=lambda *_: None)
        kept = (Path(docker_of.calls).parent / "containers" / name).read_text()
        assert kept == theirs.replace("/", "\n") + "\n"
        assert not [c for c in docker_of.calls.read_text().splitlines() if c.startswith(("docker rm", "docker run"))]


def test_node_state_reads_this_deployments_containers_fingerprints_and_images(docker_of, monkeypatch):
    fake_tools(Path(docker_of.calls).parent, monkeypatch,
               ss='echo "LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:((\\"vllm\\",pid=7,fd=3))"\n')
    docker_of(**{"sparkbook-localhost-vllm": "localhost", "sparkbook-other-vllm": "other"})
    local = local_params("mp")
    st = node_states(local, Cluster.from_params(local))["this-machine"]
    assert st.error is None
    assert st.containers == {"sparkbook-localhost-vllm": ("running", "fp1")}  # not the other deployment's
    assert st.runs == {"sparkbook-localhost-vllm": "sha256:new"}
    assert st.image.id == "sha256:new" and st.current("sparkbook-localhost-vllm", "fp1")
    assert not st.current("sparkbook-localhost-vllm", "fp2")
    assert [c.check for c in state.port_conflicts(local, {"this-machine": st})] == ["port free"]
    said = docker_of.calls.read_text()
    assert "--filter label=sparkbook=localhost --format {{.Names}}\\t{{.State}}\\t{{.Label \"sparkbook.record.fingerprint\"}}" in said
    assert f"docker image inspect --format {INSPECT_FORMAT} -- {local.runtime.image}" in said


def test_teardown_keeps_the_logs_then_removes_only_this_deployments_containers(docker_of, tmp_path):
    """08 removes its own deployment's containers and the secrets file an interrupted start left;
    a second deployment's container on the same node survives."""
    from sparkbook.steps import teardown as step
    docker_of(**{"sparkbook-localhost-vllm": "localhost", "sparkbook-other-vllm": "other"})
    local = local_params("mp")
    secrets = Path(workdir.secrets_path(local, local.head))
    secrets.parent.mkdir(parents=True)
    secrets.write_text("HF_TOKEN=x\n")
    out = teardown(local, Cluster.from_params(local), tmp_path / "run")
    assert out.removed == {"this-machine": ["sparkbook-localhost-vllm"]}
    assert not (out.remaining or out.listeners or out.errors)
    assert docker_of() == {"sparkbook-other-vllm": "other"} and not secrets.exists()
    logs = tmp_path / "run" / "logs" / "this-machine"
    assert (logs / "sparkbook-localhost-vllm.log").read_text() == "the last words of sparkbook-localhost-vllm"
    assert not (logs / "sparkbook-localhost-ray.log").exists() and not (logs / "ray_status.log").exists()
    assert {c.status for c in step.checks(local, out)} == {"PASS"}
    assert step.table(out).rows == [["this-machine", "sparkbook-localhost-vllm", "none", "none"]]
    assert "--filter label=sparkbook=localhost" in step.checks(local, out)[0].command


def test_the_serving_outcome_names_its_start_up_time_and_its_checks_the_cause():
    from sparkbook.serving.logs import Diagnosis
    p = load(PAIR)
    ready = deploy.Deployment(action="started", ready=True, seconds=41.6, models=[p.served_model],
                              executor="ray", ray_workers={"spark-1": 1, "spark-2": 1})
    assert ready.key_numbers() == [("vLLM start-up", "ready in 42 s (started)")]
    # the API answers on the head's management address without a key: said
    assert [(c.check, c.status) for c in serve_step.checks(p, ready)] == [
        ("endpoint ready", "PASS"), ("served model", "PASS"), ("vLLM's Ray workers", "PASS"), ("API key", "WARN")]
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
    table = plan.commands_table(p)
    assert [row[0] for row in table.rows] == ["spark-1", "spark-3", "spark-1"]  # Ray x2, then vllm serve
    rec = lambda ip: {"ip": ip, "alive": True, "resources": {"CPU": 2, "GPU": 1}}  # noqa: E731
    rc = RayCluster(nodes={"spark-1": rec("10.77.1.11"), "spark-3": rec("10.77.1.13"), "spark-2": rec("10.77.1.12")})
    got = {(c.node, c.status) for c in ray_cluster.checks(p, rc)}
    assert got == {("spark-2", "FAIL"), ("spark-1", "PASS"), ("spark-3", "PASS")}
    mp = validate({**d, "serving": {**d["serving"], "executor": "mp"}})
    args = commands.serve_args(mp, mp.node("spark-3"))
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--node-rank") + 1] == "1"


# ------------------------------------------------------------- binds, keys and secrets (issue 15)

def lab_like(**serving):
    from sparkbook.lab import lab_params
    d = lab_params(2)
    d["serving"].update(serving)
    return validate(d)


def test_the_control_plane_binds_loopback_and_the_api_the_heads_management_address():
    """Ray's dashboard and Jobs API on the head's loopback (never 0.0.0.0); Ray's token mode on;
    vLLM's API on serving.bind, by default the address this machine reaches the head on."""
    p = lab_like()
    for node in p.nodes:
        ray = program(commands.container_command(p, node, ray=True), p.runtime.image)
        assert "0.0.0.0" not in ray and ray[ray.index("--node-ip-address") + 1] == node.fabric_address
        assert env_of(commands.container_command(p, node, ray=True))["RAY_AUTH_MODE"] == "token"
    head = program(commands.container_command(p, p.head, ray=True), p.runtime.image)
    assert head[head.index("--dashboard-host") + 1] == "127.0.0.1"
    serve = commands.serve_args(p, p.head)
    assert serve[serve.index("--host") + 1] == "10.77.0.11" == p.head.host
    anywhere = lab_like(bind="0.0.0.0")
    assert commands.serve_args(anywhere, anywhere.head)[serve.index("--host") + 1] == "0.0.0.0"
    assert commands.fingerprint(anywhere, anywhere.head, False) != commands.fingerprint(p, p.head, False)


def test_an_ssh_alias_or_a_name_binds_the_api_to_the_address_this_machine_resolves(tmp_path, monkeypatch):
    """An address, never a name the head resolves itself (its own name is often 127.0.1.1 there)."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host sbk-test-alias-head\n  HostName 192.0.2.44\n"
                                              "Host sbk-test-named-head\n  HostName localhost\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    data = yaml.safe_load(PAIR.read_text())
    for host, bind in (("sbk-test-alias-head", "192.0.2.44"), ("sbk-test-named-head", "127.0.0.1"),
                       ("sbk-unresolvable.invalid", "sbk-unresolvable.invalid")):
        data["nodes"][0]["host"] = host
        assert commands.api_bind(validate(data)) == bind, host


def test_the_api_key_reaches_vllm_through_the_secrets_file_only(monkeypatch):
    key = "sk-sparkbook-canary-key-0123456789"
    monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", key)
    for executor in ("ray", "mp"):
        p = lab_like(api_key_env="SPARKBOOK_TEST_API_KEY", executor=executor)
        assert commands.secrets(p, False)["VLLM_API_KEY"] == key
        assert "VLLM_API_KEY" not in commands.secrets(p, True, "ray-token")  # Ray's containers: no key
        cmd = commands.ray_serve_command(p) if executor == "ray" else commands.container_command(p, p.head)
        assert cmd[cmd.index("--env-file") + 1] == workdir.secrets_path(p, p.head)
        shown = plan.commands_table(p).to_text() + json.dumps(cmd)
        assert key not in shown and "--api-key" not in shown
    from sparkbook.book.redact import mask
    assert mask(f"key: {key}") == f"key: {MASK}"  # masked once read, whatever the variable's name


def test_a_missing_key_variable_is_refused_before_anything_starts(monkeypatch):
    from sparkbook.book.errors import CheckFailed
    monkeypatch.delenv("SPARKBOOK_TEST_API_KEY", raising=False)
    with pytest.raises(CheckFailed, match="SPARKBOOK_TEST_API_KEY, which is not set"):
        deploy.serve(lab_like(api_key_env="SPARKBOOK_TEST_API_KEY"), None, Path("unused"))


def test_the_readiness_wait_sends_the_key_and_stops_at_once_when_it_is_refused(monkeypatch):
    """With --api-key, 05 used to wait out the whole start-up limit: /v1/models answered 401."""
    from fake_openai import FakeOpenAI
    key = "sk-sparkbook-wait-key-0123456789"
    monkeypatch.setenv("SPARKBOOK_API_HOSTS", "127.0.0.1")  # the fake vLLM: where the key may go
    with FakeOpenAI(model="m", api_key=key) as server:
        p = lab_like(api_url=server.url, api_key_env="SPARKBOOK_TEST_API_KEY")
        monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", key)
        assert deploy.healthy(p) == (True, ["m"], "ready", False, True)
        monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", "sk-not-the-servers-key-000")
        dep = deploy.Deployment()
        t0 = time.monotonic()
        deploy.wait_ready(p, None, dep, timeout=60)  # no node is read: the refusal ends the wait first
        assert time.monotonic() - t0 < 5 and dep.key_refused and not dep.ready
        assert list(dep.timeline["api"]) == ["port open"]  # it answered, but was never ready
        assert "HTTP 401" in dep.seen and "not the one vLLM requires" in dep.seen
        failed = failures(serve_step.checks(p, dep))
        assert [c.check for c in failed] == ["API key"]
        no_key = deploy.healthy(lab_like(api_url=server.url))
        assert no_key.refused and "serving.api_key_env" in no_key.seen


def test_the_start_up_timeline_counts_from_the_launch_each_phase_and_the_apis_milestones(monkeypatch):
    """05's timeline: when each node's log first reached each phase, when the API's port first
    answered (a 503 while loading), when it was ready, and the first token of a real request."""
    from fake_openai import FakeOpenAI
    from sparkbook.serving.startup import NodeProgress
    answers = iter([deploy.Health(False, [], "URLError: [Errno 111] Connection refused"),
                    deploy.Health(False, [], "/health answered 503", answered=True),
                    deploy.Health(True, ["m"], "ready", answered=True)])
    lines = iter([["INFO Loading weights took 3.1 s"], ["INFO Available KV cache memory: 1 GiB"]])
    monkeypatch.setattr(deploy, "healthy", lambda params: next(answers))
    monkeypatch.setattr(deploy, "read_progress", lambda params, cluster: {
        "spark-1": NodeProgress("running", 1.0, next(lines))})
    monkeypatch.setattr(deploy.time, "sleep", lambda s: None)
    p, dep = lab_like(), deploy.Deployment()
    launched = time.monotonic() - 20  # vllm serve launched 20 s before the wait began
    deploy.wait_ready(p, None, dep, timeout=60, launched=launched)
    assert dep.ready and list(dep.timeline) == ["api", "spark-1"]
    assert list(dep.timeline["spark-1"]) == ["weights", "kv cache"] and list(dep.timeline["api"]) == ["port open", "ready"]
    assert 20 <= dep.timeline["spark-1"]["weights"] <= dep.timeline["api"]["port open"] <= dep.timeline["api"]["ready"] < 30
    dep.action, dep.seconds = "started", 25.0
    assert dict(dep.key_numbers())["start-up timeline"].startswith("port open 2") and "ready 2" in dict(dep.key_numbers())["start-up timeline"]
    with FakeOpenAI(model="m") as server:  # the first token: one real request comes back
        assert deploy.first_token(lab_like(api_url=server.url), "m")
    assert not deploy.first_token(lab_like(api_url="http://127.0.0.1:9"), "m", timeout=5)


def test_secrets_go_through_a_private_file_removed_after_the_start(docker_of, monkeypatch, tmp_path):
    """The HF token, the API key (vLLM) and Ray's own token (a new one per Ray cluster, masked)
    reach the containers through a mode-600 file that is gone once they run; no docker command
    line holds them."""
    from sparkbook.book.redact import mask
    hf, key = "hf_sparkbookCANARY0123456789", "sk-sparkbook-file-key-0123456789"
    monkeypatch.setenv("HF_TOKEN", hf)
    monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", key)
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data["serving"].update(executor="mp", api_key_env="SPARKBOOK_TEST_API_KEY")
    local = validate(data)
    cluster = Cluster.from_params(local)
    state.start(local, cluster, local.nodes, ray=False, say=lambda *_: None)
    seen = (tmp_path / "env-file-seen").read_text()
    assert f"HF_TOKEN={hf}\n" in seen and f"VLLM_API_KEY={key}\n" in seen
    assert (tmp_path / "env-file-mode").read_text().strip() == "600"
    assert not Path(workdir.secrets_path(local, local.head)).exists()
    said = docker_of.calls.read_text()
    assert hf not in said and key not in said and "--env-file" in said
    state.start(local, cluster, local.nodes, ray=True, say=lambda *_: None)
    seen = dict(line.split("=", 1) for line in (tmp_path / "env-file-seen").read_text().splitlines())
    ray_token = seen["RAY_AUTH_TOKEN"]
    assert len(ray_token) >= 32 and mask(ray_token) == MASK and "VLLM_API_KEY" not in seen
    assert ray_token not in docker_of.calls.read_text()


def test_the_listeners_are_read_inside_this_deployments_containers(docker_of, monkeypatch):
    """listeners.sh runs its reader in each container of the deployment (here: this machine, as
    `docker exec` of the fake runs it here): a socket on loopback and one on every interface."""
    import socket
    from sparkbook.serving.listeners import read_listeners
    monkeypatch.setenv("FAKE_EXEC", "1")
    monkeypatch.setenv("HF_TOKEN", CANARY)  # held by the reader's own process here
    docker_of(**{"sparkbook-localhost-vllm": "localhost", "sparkbook-other-vllm": "other"})
    local = local_params("mp")
    with socket.socket() as lo, socket.socket() as every:
        lo.bind(("127.0.0.1", 0))
        every.bind(("0.0.0.0", 0))
        lo.listen()
        every.listen()
        found, held = read_listeners(local, Cluster.from_params(local))
        found = found["this-machine"]
        mine = {(li.address, li.port) for li in found}
        assert ("127.0.0.1", lo.getsockname()[1]) in mine and ("0.0.0.0", every.getsockname()[1]) in mine
    assert {li.container for li in found} == {"sparkbook-localhost-vllm"}  # not the other deployment's
    assert "HF_TOKEN" in held["this-machine"]  # named, never its value
    assert "sparkbook-other-vllm" not in docker_of.calls.read_text().split("docker exec")[-1]


def test_the_secrets_the_containers_hold_are_judged_against_the_parameters(monkeypatch):
    """05's row "secrets in the containers": the names the parameters give each serving node's
    containers (Ray executor: the head's Ray container also runs vllm serve with the API key; a
    secret written in serving.env too), held by some process of them, or the missing one named."""
    from sparkbook.serving.listeners import secret_checks
    monkeypatch.setenv("HF_TOKEN", CANARY)
    monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", "sk-sparkbook-held-key-0123456789")
    p = lab_like(api_key_env="SPARKBOOK_TEST_API_KEY", env={"WANDB_API_KEY": "wandb-secret-0123456789"})
    head, worker = p.nodes[0], p.nodes[1]
    assert commands.held_secrets(p, head) == ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RAY_AUTH_TOKEN",
                                              "VLLM_API_KEY", "WANDB_API_KEY"]
    assert "VLLM_API_KEY" not in commands.held_secrets(p, worker)
    held = {head.name: commands.held_secrets(p, head), worker.name: ["HF_TOKEN", "RAY_AUTH_TOKEN"]}
    rows = {c.node: c for c in secret_checks(p, held)}
    assert rows[head.name].status == PASS and rows[head.name].observed == "all 5 held"
    bad = rows[worker.name]
    assert bad.status == FAIL and bad.observed.startswith("missing: HUGGING_FACE_HUB_TOKEN, WANDB_API_KEY")
    assert "08_teardown" in bad.remedy and "clean environment" in bad.remedy
    monkeypatch.delenv("HF_TOKEN")
    mp = lab_like(executor="mp")
    assert [c.status for c in secret_checks(mp, {"spark-1": [], "spark-2": []})] == [SKIP, SKIP]


def test_bound_addresses_fail_where_sparkbook_chose_and_warn_where_nothing_offers_a_choice():
    from sparkbook.serving.listeners import Listener, checks, table
    p = lab_like()
    fabric = [Listener("sparkbook-lab-ray", "10.77.1.11", 6379, "gcs_server"),
              Listener("sparkbook-lab-ray", "127.0.0.1", 8265, "python3"),
              Listener("sparkbook-lab-ray", "10.77.0.11", 8000, "vllm")]
    assert [(c.node, c.status) for c in checks(p, {"spark-1": fabric})] == [("spark-1", "PASS")]
    open_ = fabric + [Listener("sparkbook-lab-ray", "0.0.0.0", 43211, "raylet")]
    got = checks(p, {"spark-1": open_})
    assert [c.status for c in got] == ["WARN"] and "0.0.0.0:43211 raylet" in got[0].observed
    exposed = [Listener("sparkbook-lab-ray", "0.0.0.0", 8265, "python3"),
               Listener("sparkbook-lab-ray", "::", 8000, "vllm")]
    bad = checks(p, {"spark-1": exposed})
    assert [c.status for c in bad] == ["FAIL"]
    assert "8265" in bad[0].observed and "8000" in bad[0].observed
    asked = lab_like(bind="0.0.0.0")  # serving.bind 0.0.0.0: the API on every interface is what was asked
    assert [c.status for c in checks(asked, {"spark-1": [Listener("c", "0.0.0.0", 8000, "vllm")]})] == ["PASS"]
    assert [c.status for c in checks(p, {"spark-2": []})] == ["WARN"]  # nothing read is no proof
    rows = table(p, {"spark-1": open_}).rows
    assert ["spark-1", "sparkbook-lab-ray", "127.0.0.1", 8265, "python3", "Ray dashboard and Jobs API", "loopback"] in rows
    assert rows[-1][-1] == "every interface"


def test_04_says_whether_the_images_ray_requires_its_token_and_shows_every_bound_address():
    from sparkbook.serving.listeners import Listener
    from sparkbook.serving.ray import RayCluster
    from sparkbook.steps import ray_cluster
    p = lab_like()
    rec = lambda ip: {"ip": ip, "alive": True, "resources": {"CPU": 2, "GPU": 1}}  # noqa: E731
    up = {"spark-1": rec("10.77.1.11"), "spark-2": rec("10.77.1.12")}
    bound = {"spark-1": [Listener("sparkbook-lab-ray", "127.0.0.1", 8265, "python3")],
             "spark-2": [Listener("sparkbook-lab-ray", "10.77.1.12", 40123, "raylet")]}
    for version, status in (("2.60.0", "PASS"), ("2.49.2", "WARN")):
        got = {(c.check, c.node): c.status for c in ray_cluster.checks(p, RayCluster(nodes=up, version=version,
                                                                                     listeners=bound))}
        assert got[("Ray token authentication", "spark-1")] == status
        assert got[("bound addresses", "spark-1")] == got[("bound addresses", "spark-2")] == "PASS"
    assert len(ray_cluster.listeners_table(p, RayCluster(nodes=up, listeners=bound)).rows) == 2
