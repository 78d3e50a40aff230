"""`sparkbook collect`: one archive for a bug report, with no form of a secret in it, the run's
failures on top, a node that does not answer noted, the kernel log (or why it was refused), Ray's
session logs and OOM kills, `nvidia-smi -q`; a venv runtime's versions from its python; on the lab,
a running container's logs and NCCL environment.

Sources of what is collected: Ray's memory monitor lines in raylet.out ("Node memory usage above
threshold", "Killing worker ... to free up memory": github.com/ray-project/ray/pull/27716);
`ethtool -i` on a DGX Spark as tests/test_host_health.py's SPARK_ETHTOOL_I; nvidia-smi -q of a GB10
(tests/fixtures/nvidia-smi-q-gb10-1.txt, github.com/ollama/ollama/issues/13552)."""

import json
import os
import platform
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import free_port
from sparkbook.book import redact
from sparkbook.record.bugreport import collect, latest_run, target
from sparkbook.cli import main
from sparkbook.params import validate
from sparkbook.book.redact import _forms
from sparkbook.nodes.remote import Cluster
from sparkbook.serving.containers import docker_run, named
from sparkbook.serving.logs import collect_logs
from sparkbook.serving.state import remove, replace
from sparkbook.book.tables import Table
from test_serving import fake_tools

# A Hugging Face token in the variable the parameters name (not a name masked by its look), with
# characters that JSON, HTML and shell escape
CANARY = 'hf_coLLect"CANARY&<9f3a>7c1d5b8e'
ENV_NAME = "SPARKBOOK_COLLECT_HUB_CRED"
CONTAINER = "sparkbook-t-vllm"

# docker as the node scripts call it: an image, one container of the deployment that exited with
# the canary in its log and its environment (as the secrets file puts HF_TOKEN there)
DOCKER = r"""case "$*" in
  "info "*) echo '27.3.1|/var/lib/docker|{"runc":{}}';;
  "image inspect --format {{.Id}} -- img:1") echo sha256:0123456789abcdef;;
  "image inspect "*) printf 'PATH=/usr/bin\nCUDA_VERSION=13.0.1\nNCCL_VERSION=2.27.7-1\nHF_TOKEN=%s\n' "$FAKE_CANARY";;
  "run "*) echo 'VERSIONS {"python": "3.12.3", "packages": {"vllm": "0.17.1", "torch": "2.9.0+cu130", "ray": "2.54.0", "transformers": "4.57.1"}, "torch_cuda": "13.0", "nccl": "2.27.7"}';;
  "ps -a --filter label=sparkbook=t --filter label=sparkbook.owner="*" --format {{.Names}}") echo sparkbook-t-vllm;;
  "ps "*) printf 'sparkbook-t-vllm\timg:1\tExited (1) 2 minutes ago\n';;
  "inspect --format image="*) printf 'image=img:1 sha256:0123456789abcdef\nstate=exited exit=1 oom=false started=x\ncommand="vllm" ["serve"]\n';;
  "inspect "*) printf 'NCCL_SOCKET_IFNAME=eth9\nNCCL_DEBUG=INFO\nVLLM_PLUGIN_CRED=%s\nHF_TOKEN=%s\nRAY_AUTH_TOKEN=%s\nPATH=/bin\n' "$FAKE_CANARY" "$FAKE_CANARY" "$FAKE_CANARY";;
  "logs "*) printf 'INFO starting\nNCCL WARN NET/IB : got token %s\n' "$FAKE_CANARY";;
  "exec "*) script=$(printf '%s' "$5" | sed "s#/tmp/ray#$FAKE_RAY#g"); shift 5; sh -c "$script" "$@";;
  *) echo "docker: no such command here: $*" >&2; exit 1;;
esac
"""
# the kernel log: journalctl's (the previous boot's is not kept), or dmesg's, or neither for this user
JOURNALCTL = r"""case "$*" in
  *"-b -1"*) echo "Specifying boot ID or boot offset has no effect, no persistent journal was found." >&2; exit 1;;
  *) [ -z "$FAKE_JOURNAL" ] || printf '%s\n' "$FAKE_JOURNAL" "kernel: python3[4242]: argv token=$FAKE_CANARY";;
esac
"""
DMESG = r"""[ -n "$FAKE_DMESG" ] || { echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1; }
echo "$FAKE_DMESG"
"""
OOM = "kernel: Out of memory: Killed process 4242 (python3) total-vm:120000000kB, anon-rss:110000000kB"
NVIDIA_SMI = r"""[ "$1" = -q ] || exit 9
sed 1,2d "$FIXTURES/nvidia-smi-q-gb10-1.txt"
"""
ETHTOOL = r"""[ "$1" = -i ] || exit 9
printf 'driver: mlx5_core\nversion: 6.17.0-1029-nvidia\nfirmware-version: 28.45.4028 (NVD0000000087)\n'
"""
RAYLET = ("[2026-01-04 04:51:39,122 I 99866 99901] (raylet) memory_monitor.cc:71: Node memory usage above threshold, "
          "used: 120512000000, total: 121600000000, usage fraction: 0.991, threshold: 0.95\n"
          "[2026-01-04 04:51:39,260 E 99866 99901] (raylet) node_manager.cc:2926: [0] Killing worker with the latest "
          "task assigned time to free up memory. Task to be killed: ffff01000000\n"
          f"[2026-01-04 04:51:40,000 I 99866 99901] (raylet) worker env HF={CANARY}\n")


def deployment(tmp_path, unreachable_port=None):
    """Parameters of deployment ``t``: this machine as the head; a worker nobody answers for."""
    nodes = [{"name": "n1", "host": "localhost", "local": True, "role": "head",
              "rails": [{"interface": "enp1s0f1np1", "ip": "10.0.0.1", "hca": "rocep1s0f1"}]}]
    if unreachable_port:
        nodes.append({"name": "n2", "host": "127.0.0.1", "port": unreachable_port, "role": "worker",
                      "key": str(tmp_path / "no-key"),
                      "rails": [{"interface": "enp1s0f1np1", "ip": "10.0.0.2", "hca": "rocep1s0f1"}]})
    return {"name": "t", "nodes": nodes, "runtime": {"kind": "docker", "image": "img:1"},
            "model": {"name": "m", "path": str(tmp_path / "models" / "m"), "hf_token_env": ENV_NAME},
            "serving": {"tensor_parallel_size": len(nodes), "executor": "mp"},
            "expectations": {"gpus_per_node": 0}}


def run_folder(root, data, name="20260101T000000Z-t"):
    """A failed run of ``data``'s deployment, the canary in a log, a JSON and a secrets file."""
    run = root / "outputs" / name
    (run / "verdicts").mkdir(parents=True)
    (run / "logs" / "n1").mkdir(parents=True)
    (run / "parameters.yaml").write_text(yaml.safe_dump(data))
    (run / "summary.json").write_text(json.dumps({
        "status": "failed", "deployment": data["name"], "steps": [
            {"name": "01_preflight", "status": "passed", "error": None},
            {"name": "02_collectives", "status": "failed", "error": "CheckFailed: busbw below the bar"}]}))
    (run / "verdicts" / "02_collectives.json").write_text(json.dumps({"title": "02", "checks": [
        {"check": "busbw", "node": "n1", "status": "FAIL", "observed": "3.1 GB/s", "expected": ">= 20 GB/s",
         "remedy": "check the RoCE transport", "command": ""},
        {"check": "ring", "node": "n1", "status": "WARN", "observed": "slow start", "expected": "",
         "remedy": "", "command": ""}]}))
    (run / "logs" / "n1" / "collectives.log").write_text(f"NCCL INFO token={CANARY}\nNCCL INFO done\n")
    (run / "preflight.json").write_text(json.dumps({"n1": {"env": {"HF": CANARY}}}))
    (run / "secrets.env").write_text(f"HF_TOKEN={CANARY}\n")
    (run / "report.html").write_text("<html>the report</html>")
    (run / "collectives.png").write_bytes(b"\x89PNG\r\n\x1a\n\0")
    return run


@pytest.fixture
def canary(tmp_path, monkeypatch):
    monkeypatch.setattr(redact, "_named", set())  # the parameters register their variable's name
    monkeypatch.setattr(redact, "_values", set())
    monkeypatch.setenv(ENV_NAME, CANARY)
    monkeypatch.setenv("FAKE_CANARY", CANARY)
    monkeypatch.setenv("FAKE_JOURNAL", OOM)
    monkeypatch.setenv("FAKE_DMESG", "")
    monkeypatch.setenv("FIXTURES", str(Path(__file__).parent / "fixtures"))
    logs = tmp_path / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text(RAYLET)
    (logs / "gcs_server.out").write_text("[2026-01-04 04:50:00,000 I 1 1] (gcs_server) gcs_server.cc:1: started\n")
    monkeypatch.setenv("FAKE_RAY", str(tmp_path / "ray"))
    return fake_tools(tmp_path, monkeypatch, docker=DOCKER, journalctl=JOURNALCTL, dmesg=DMESG,
                      ethtool=ETHTOOL, **{"nvidia-smi": NVIDIA_SMI})


def members(archive):
    with tarfile.open(archive) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}


def test_the_archive_holds_no_form_of_the_secret_and_names_the_failures(tmp_path, canary):
    data = deployment(tmp_path, unreachable_port=free_port())
    params = validate(data)
    run = run_folder(tmp_path, data)
    archive = collect(run, params, Cluster.from_params(params))

    assert archive.parent == run and archive.name.startswith("bug-report-") and archive.name.endswith(".tar.gz")
    assert archive.stat().st_mode & 0o777 == 0o600
    files = members(archive)
    forms = {f.encode() for f in _forms(CANARY) | {CANARY[:8]}}
    leaks = [(name, f) for name, text in files.items() for f in forms if f in text or f in name.encode()]
    assert leaks == []
    assert CANARY.encode() not in archive.read_bytes()

    # the listing: the run's text files (not the report, the plot or the secrets file), the nodes'
    # sections, the unreachable node's error
    run_part = {n for n in files if n.startswith("run/")}
    assert run_part == {"run/parameters.yaml", "run/summary.json", "run/preflight.json",
                        "run/verdicts/02_collectives.json", "run/logs/n1/collectives.log"}
    assert {"summary.md", "versions.json", "environment.json", "nodes/n2/unreachable.txt",
            "nodes/n1/facts.txt", "nodes/n1/image.txt", "nodes/n1/runtime_versions.txt",
            f"nodes/n1/container_{CONTAINER}.txt", f"nodes/n1/container_env_{CONTAINER}.txt",
            f"nodes/n1/{CONTAINER}.log", "nodes/n1/processes.txt", "nodes/n1/smi-q.txt",
            "nodes/n1/memlock.txt", "nodes/n1/kernel_log.txt", f"nodes/n1/{CONTAINER}.raylet.out",
            f"nodes/n1/{CONTAINER}.gcs_server.out", f"nodes/n1/{CONTAINER}.oom-kills.txt"} <= set(files)
    assert not [n for n in files if n.startswith("nodes/n2/") and n != "nodes/n2/unreachable.txt"]
    assert b"NCCL WARN NET/IB" in files[f"nodes/n1/{CONTAINER}.log"]
    # the kernel log (the previous boot's is not kept here: no file), nvidia-smi -q whole, Ray's logs
    assert OOM.encode() in files["nodes/n1/kernel_log.txt"] and "nodes/n1/kernel_log_previous_boot.txt" not in files
    assert b"Clocks Event Reasons" in files["nodes/n1/smi-q.txt"]
    assert b"(gcs_server) gcs_server.cc:1: started" in files[f"nodes/n1/{CONTAINER}.gcs_server.out"]
    oom = files[f"nodes/n1/{CONTAINER}.oom-kills.txt"].decode().splitlines()
    assert len(oom) == 2 and "usage above threshold" in oom[0] and "Killing worker" in oom[1]

    summary = files["summary.md"].decode()
    assert "step 02_collectives: failed: CheckFailed: busbw below the bar" in summary
    assert "| 02_collectives | busbw | n1 | 3.1 GB/s | >= 20 GB/s | check the RoCE transport |" in summary
    assert "slow start" not in summary and "1 check(s) warned" in summary
    assert "## Nodes not reached" in summary and "- n2: ssh " in summary and "cannot connect" in summary
    assert "| vLLM | 0.17.1 |" in summary and "| NCCL (torch) | 2.27.7 |" in summary
    assert "| CUDA_VERSION (image) | 13.0.1 |" in summary
    # nvidia-smi -q's header (inventory's CSV query fails here) and the rail's firmware (ethtool -i)
    assert "| GPU driver | 580.95.05 |" in summary and "| CUDA (driver) | 13.0 |" in summary
    assert "| CX-7 firmware | enp1s0f1np1: 28.45.4028 |" in summary
    assert "Kernel log not read" not in summary
    assert f"| n1 | {CONTAINER} | img:1 | exited exit=1 oom=false" in summary
    assert "nodes/n2/unreachable.txt" in summary  # the listing

    env = json.loads(files["environment.json"])["n1"]
    assert env["containers"][CONTAINER]["NCCL_SOCKET_IFNAME"] == "eth9"
    assert env["containers"][CONTAINER]["VLLM_PLUGIN_CRED"] == redact.MASK  # known here: masked
    assert "HF_TOKEN" not in env["containers"][CONTAINER] and "RAY_AUTH_TOKEN" not in env["containers"][CONTAINER]
    assert env["set by sparkbook"]["RAY_AUTH_MODE"] == "token"
    assert env["image"] == {"CUDA_VERSION": "13.0.1", "NCCL_VERSION": "2.27.7-1"}

    # the image's versions: read without GPUs, its entrypoint replaced, never pulled
    run_call = next(c for c in canary.read_text().splitlines() if c.startswith("docker run "))
    assert "--entrypoint python3" in run_call and "--pull never" in run_call and "--gpus" not in run_call
    assert "--label sparkbook=t" in run_call


@pytest.mark.parametrize("dmesg, says", [
    ("[ 12.5] mlx5_core 0000:01:00.1 enp1s0f1np1: Link down", "[ 12.5] mlx5_core 0000:01:00.1 enp1s0f1np1: Link down"),
    ("", "refused: journalctl -k showed nothing to"),
])
def test_the_kernel_log_falls_back_to_dmesg_and_says_when_refused(tmp_path, canary, monkeypatch, dmesg, says):
    """An SSH user outside the adm group reads no kernel journal; with kernel.dmesg_restrict, no
    dmesg either: sparkbook uses no sudo, and the report says what the owner can attach."""
    monkeypatch.setenv("FAKE_JOURNAL", "")
    monkeypatch.setenv("FAKE_DMESG", dmesg)
    params = validate(deployment(tmp_path))
    files = members(collect(run_folder(tmp_path, deployment(tmp_path)), params, Cluster.from_params(params)))
    log = files["nodes/n1/kernel_log.txt"].decode()
    assert log.startswith(says)
    summary = files["summary.md"].decode()
    if not dmesg:
        assert "Operation not permitted" in log and "sudo dmesg | tail -n 2000" in log
        assert "## Kernel log not read" in summary and "- n1: refused: journalctl -k" in summary
    else:
        assert "Kernel log not read" not in summary


def test_a_venv_runtime_reports_the_venv_python_versions(tmp_path, canary):
    """runtime.kind venv (set after validation: the parameters refuse it until serving implements
    it): the versions come from the venv's python (this one here), no image is asked for."""
    params = validate(deployment(tmp_path))
    params = params.model_copy(update={"runtime": params.runtime.model_copy(
        update={"kind": "venv", "venv": sys.prefix, "image": None})})
    files = members(collect(run_folder(tmp_path, deployment(tmp_path)), params, Cluster.from_params(params)))
    v = json.loads(files["versions.json"])["n1"]
    assert v["Python (venv)"] == platform.python_version() and v["packages"]["pydantic"]
    assert "image ID" not in v and "Python (image)" not in v and "nodes/n1/image.txt" not in files
    assert not [c for c in canary.read_text().splitlines() if c.startswith(("docker run ", "docker image "))]
    assert f"| runtime | venv {sys.prefix} |" in files["summary.md"].decode()


def test_a_table_as_markdown():
    t = Table(["check", "observed"], [["a|b", "two\nlines"], ["none", None]], title="T")
    assert t.to_markdown() == ("**T**\n\n| check | observed |\n|---|---|\n| a\\|b | two lines |\n| none |  |")
    assert Table(["x"]).to_markdown() == "| x |\n|---|"


def test_a_secret_never_leaves_the_node(tmp_path, canary, monkeypatch):
    """Variables named like a secret are dropped on the node: even a token this machine does not
    know (another kernel's Ray token) never reaches the archive."""
    monkeypatch.delenv(ENV_NAME)
    monkeypatch.setenv("FAKE_CANARY", "unknown-here-9c2e4b7d1f")
    params = validate(deployment(tmp_path))
    archive = collect(run_folder(tmp_path, deployment(tmp_path)), params, Cluster.from_params(params))
    files = members(archive)
    assert [n for n, t in files.items() if b"TOKEN=unknown-here" in t] == []
    assert b"HF_TOKEN" not in files["nodes/n1/image_env.txt"]
    assert b"TOKEN" not in files[f"nodes/n1/container_env_{CONTAINER}.txt"]
    # by its name alone: a variable not named like a secret, its value unknown here, is kept
    assert b"VLLM_PLUGIN_CRED=unknown-here" in files[f"nodes/n1/container_env_{CONTAINER}.txt"]


def test_the_cli_collects_the_newest_run_with_its_own_parameters(tmp_path, canary, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "parameters").mkdir()
    (tmp_path / "notebooks").mkdir()
    older = run_folder(tmp_path, deployment(tmp_path), "20250101T000000Z-t")
    newer = run_folder(tmp_path, deployment(tmp_path))
    past = time.time() - 3600
    for p in (older, older / "summary.json", older / "verdicts"):
        os.utime(p, (past, past))
    assert latest_run(root=tmp_path) == newer
    assert latest_run("t", root=tmp_path) == newer
    with pytest.raises(Exception, match="no run folder of deployment 'other'"):
        latest_run("other", root=tmp_path)

    assert main(["collect"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith(str(newer / "bug-report-")) and os.path.isfile(printed)

    with pytest.raises(Exception, match="no such run folder"):
        target(tmp_path / "outputs" / "gone", None)
    (older / "parameters.yaml").unlink()
    with pytest.raises(Exception, match="no parameters.yaml: name the parameters with -p FILE"):
        target(older, None)


# the node as 05/08's log collection (collect_logs.sh) sees it: docker lists the deployment's
# container when asked for its label, another deployment's too when asked for the key alone, and
# another program's too when not filtered; ps, asked for the uid column,
# lists a process of this login and one of another login with a secret in its arguments
LOGS_DOCKER = r"""case "$*" in
  "ps -a --filter label=sparkbook=t --format "*) printf 'sparkbook-t-vllm\timg:1\tExited (1) 2 minutes ago\n';;
  "ps -a --filter label=sparkbook --format "*) printf 'sparkbook-t-vllm\timg:1\tExited (1) 2 minutes ago\nsparkbook-other-vllm\timg:2\tUp 1 hour\n';;
  "ps "*) printf 'sparkbook-t-vllm\timg:1\tExited (1) 2 minutes ago\nsparkbook-other-vllm\timg:2\tUp 1 hour\nothers-db\tpostgres:16\tUp 3 days\n';;
  "logs "*) echo 'INFO starting';;
  *) echo "docker: no such command here: $*" >&2; exit 1;;
esac
"""
OTHERS_SECRET = "OTHER-LOGIN-SECRET-5a7c"
PS = r"""[ "$*" = "-eo pid,ppid,etime,rss,uid,args --sort=-rss" ] || { echo "ps: not asked so: $*" >&2; exit 9; }
me=$(id -u)
printf '    PID    PPID     ELAPSED   RSS   UID COMMAND\n'
printf '   4242       1    01:02:03 90000 %5d python3 -m vllm.entrypoints.openai.api_server --port 8000\n' "$me"
printf '   5151       1       12:00 80000 %5d /usr/bin/mysql -u admin -p%s\n' "$((me + 1))" "$FAKE_OTHERS_ARG"
"""


def test_log_collection_shows_another_logins_process_by_its_program_and_only_sparkbooks_containers(
        tmp_path, monkeypatch):
    """processes.log and containers.log land in the run folder, and so in shared reports: a process
    of this login (the SSH user) keeps its arguments, another login's shows its program alone (its
    command line may hold its secrets); only the deployment's containers are listed (not another
    deployment's on the same node, whose owner did not share it)."""
    monkeypatch.setenv("FAKE_OTHERS_ARG", OTHERS_SECRET)
    fake_tools(tmp_path, monkeypatch, docker=LOGS_DOCKER, ps=PS)
    params = validate(deployment(tmp_path))
    folder = collect_logs(params, Cluster.from_params(params), tmp_path / "run")["n1"]
    processes = (folder / "processes.log").read_text().splitlines()
    assert processes[0].split() == ["PID", "PPID", "ELAPSED", "RSS", "UID", "COMMAND"]
    assert processes[1].split()[5:] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"]
    assert processes[2] == f"5151 1 12:00 80000 {os.getuid() + 1} /usr/bin/mysql" and len(processes) == 3
    assert [p.name for p in folder.iterdir() if OTHERS_SECRET in p.read_text()] == []
    assert (folder / "containers.log").read_text() == "sparkbook-t-vllm\timg:1\tExited (1) 2 minutes ago"


# ------------------------------------------------------------------------------------------ lab

def test_collect_on_the_lab_reads_a_running_container(lab, params, cluster, tmp_path):
    """A container of the deployment on the head (which holds the lab's image): its log and NCCL
    environment are in the archive, with every node's versions and the image's, read in seconds."""
    head, name = params.head, named(params, "collect-test")
    run = docker_run(params, head, name, ["sh", "-c", "echo collect-test says hi; sleep 120"])
    started = cluster.run_on(head, replace(params, head, name, run), timeout=60)
    try:
        assert started.ok, started.summary()
        t0 = time.monotonic()
        files = members(collect(run_folder(tmp_path, {"name": params.name}), params, cluster))
        assert time.monotonic() - t0 < 60
        assert b"collect-test says hi" in files[f"nodes/{head.name}/{name}.log"]
        env = json.loads(files["environment.json"])
        assert env[head.name]["containers"][name]["NCCL_SOCKET_IFNAME"] == head.rails[0].interface
        assert env[head.name]["containers"][name]["NCCL_IB_HCA"] == ",".join(r.hca for r in head.rails)
        versions = json.loads(files["versions.json"])
        for node in params.nodes:  # the simulated tools' driver, CUDA and firmware
            v = versions[node.name]
            assert v["GPU driver"] == "580.95.05" and v["CUDA (driver)"] == "13.0", v
            assert "28.45.4028" in v["CX-7 firmware"] and v["kernel"] and v["Docker"], v
            assert files[f"nodes/{node.name}/kernel_log.txt"].strip(), node.name  # the log, or why not
            assert b"Clocks Event Reasons" in files[f"nodes/{node.name}/smi-q.txt"], node.name
        v = versions[head.name]
        assert v["image ID"].startswith("sha256:") and v["vLLM"] and v["torch"] and v["Python (image)"], v
        summary = files["summary.md"].decode()
        assert "## Nodes not reached" not in summary and "| busbw |" in summary
        assert f"| {head.name} | {name} | {params.runtime.image} | running" in summary
    finally:
        cluster.run_on(head, remove(params, name)(head), timeout=60)
