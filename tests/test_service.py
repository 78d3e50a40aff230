"""Day two, the service (issue 29), without the lab: its containers' commands, the basis it is
installed from, its checks, and the supervisor (scripts/service.sh) run for real with stand-ins
for Ray and vllm serve."""

import json
import os
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from sparkbook.book.errors import CheckFailed
from sparkbook.book.verdict import FAIL, PASS, WARN, Check, Verdict
from sparkbook.lab import lab_params
from sparkbook.nodes.shell import SCRIPTS
from sparkbook.params import validate
from sparkbook.serving import service
from sparkbook.serving.commands import FINGERPRINT, SERVE_FP, SERVICE
from sparkbook.serving.plan import plan, service_command, service_secrets
from sparkbook.serving.state import NodeService, parse_service_state
from sparkbook.steps import day_two

IMAGE = "sha256:" + "ab" * 32


def _params(**serving):
    data = lab_params(2)
    data["name"] = "svc"
    data["serving"].update(serving)
    return validate(data)


def _env(cmd):
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "-e")


def _labels(cmd):
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--label")


def test_each_node_runs_its_ray_container_pinned_by_id_under_the_restart_policy(monkeypatch):
    monkeypatch.setenv("SPARKBOOK_TEST_KEY", "k-secret-1")
    params = _params(api_key_env="SPARKBOOK_TEST_KEY")
    p = plan(params)
    head, worker = params.serving_nodes
    cmds = {n.name: service_command(params, n, IMAGE) for n in (head, worker)}
    for n, cmd in cmds.items():
        assert cmd[cmd.index("--name") + 1] == p.ray_container
        assert cmd[cmd.index("--restart") + 1] == "unless-stopped" and cmd[cmd.index("--log-driver") + 1] == "local"
        at = cmd.index("--entrypoint")
        assert cmd[at:at + 4] == ["--entrypoint", "bash", IMAGE, "-c"]  # the image by ID, not the tag
        assert cmd[at + 4] == (SCRIPTS / "service.sh").read_text() and cmd[at + 5] == "service.sh"
        labels = _labels(cmd)
        assert labels[SERVICE] == IMAGE and labels[FINGERPRINT] == p.nodes[n].ray.fingerprint  # 04 keeps it
        assert "k-secret-1" not in " ".join(cmd) and cmd[cmd.index("--env-file") + 1].endswith("/secrets.env")
        mounts = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-v"]
        assert mounts == [f"{params.model.path}:{params.model.path}:ro"]  # not the working folder in /tmp
    head_env, worker_env = _env(cmds[head.name]), _env(cmds[worker.name])
    assert head_env["SPARKBOOK_SERVICE_ROLE"] == "head" and worker_env["SPARKBOOK_SERVICE_ROLE"] == "worker"
    assert head_env["SPARKBOOK_SERVICE_NODES"] == "2" and "SPARKBOOK_SERVICE_SERVE" not in worker_env
    assert head_env["SPARKBOOK_SERVICE_SERVE"].startswith("vllm serve ")
    assert "--distributed-executor-backend ray" in head_env["SPARKBOOK_SERVICE_SERVE"]
    assert head_env[SERVE_FP] == p.nodes[head.name].serve_fingerprint  # 05 reads it: it keeps the service
    assert worker_env["SPARKBOOK_SERVICE_HEAD"] == f"{head.fabric_address}:{params.ports.ray}"
    assert worker_env["SPARKBOOK_SERVICE_RAY"].startswith("ray start --block --node-ip-address ")
    # the API key only on the head, which runs vllm serve; Ray's token on both
    assert service_secrets(params, head, "tok")["VLLM_API_KEY"] == "k-secret-1"
    assert "VLLM_API_KEY" not in service_secrets(params, worker, "tok")
    assert service_secrets(params, worker, "tok")["RAY_AUTH_TOKEN"] == "tok"


def _run(base: Path, name: str, taken: datetime, serve=PASS, smoke=PASS, fingerprints=None, deployment="svc"):
    d = base / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"deployment": deployment, "steps": []}))
    for step, status in (("05_serve", serve), ("06_smoke_test", smoke)):
        if status:
            Verdict(step, [Check("x", "spark-1", status)], taken=taken.isoformat(timespec="seconds")).save(
                d / "verdicts" / f"{step}.json")
    (d / "serving.json").write_text(json.dumps({"action": "started", "ready": True, "fingerprints": fingerprints}))
    return d


def test_the_basis_is_the_newest_run_where_05_and_06_passed_with_these_parameters(tmp_path):
    params = _params()
    fps = plan(params).serve_fingerprints()
    t = datetime(2026, 12, 5, 9, tzinfo=timezone.utc)
    old = _run(tmp_path, "old", t, serve=WARN, fingerprints=fps)  # passed with a warning
    _run(tmp_path, "newer-failed", t + timedelta(hours=1), smoke=FAIL, fingerprints=fps)
    _run(tmp_path, "newer-no-06", t + timedelta(hours=2), smoke=None, fingerprints=fps)
    _run(tmp_path, "other-deployment", t + timedelta(hours=3), fingerprints=fps, deployment="else")
    assert day_two.basis(params, tmp_path) == (old, None)
    newest = _run(tmp_path, "newest", t + timedelta(hours=4), fingerprints=fps)
    assert day_two.basis(params, tmp_path) == (newest, None)
    assert day_two.basis(params, tmp_path, old)[0] == old  # named
    with pytest.raises(CheckFailed, match="have not both passed in run .*newer-failed"):
        day_two.basis(params, tmp_path, tmp_path / "newer-failed")
    changed = _run(tmp_path, "changed", t + timedelta(hours=5), fingerprints={"spark-1": "0" * 16})
    with pytest.raises(CheckFailed, match="the parameters changed since changed"):
        day_two.basis(params, tmp_path, changed)
    with pytest.raises(CheckFailed, match="run 05 and 06 first"):
        day_two.basis(params, tmp_path / "nothing")


def test_the_checks_fail_by_node_for_a_missing_stopped_or_unpinned_container_and_an_endpoint_down():
    params = _params()
    ok = NodeService("sparkbook-svc-ray", "running", 0, "2026-12-05T09:00:00", IMAGE, IMAGE, "root", 2)
    out = service.Service("status", nodes={"spark-1": ok, "spark-2": NodeService()}, ready=False,
                          seen="ConnectionRefusedError")
    rows = {(c.check, c.node): c for c in service.checks(params, out)}
    assert rows[("service", "spark-1")].status == PASS and "vllm serve started 2 time(s)" in rows[("service", "spark-1")].observed
    assert rows[("service", "spark-2")].status == FAIL and "service install" in rows[("service", "spark-2")].remedy
    assert rows[("service endpoint", "spark-1")].status == FAIL
    assert "ConnectionRefusedError" in rows[("service endpoint", "spark-1")].observed
    other = NodeService("sparkbook-svc-ray", "restarting", 3, "", "sha256:" + "cd" * 32, IMAGE, "root", 0)
    out = service.Service("status", nodes={"spark-1": ok, "spark-2": other}, ready=True, models=["m"])
    row = {(c.check, c.node): c for c in service.checks(params, out)}[("service", "spark-2")]
    assert row.status == FAIL and "not the pinned" in row.observed and "restarting" in row.observed
    gone = service.Service("removed", nodes={"spark-1": NodeService(), "spark-2": other})
    rows = {(c.check, c.node): c.status for c in service.checks(params, gone)}
    assert rows == {("service removed", "spark-1"): PASS, ("service removed", "spark-2"): FAIL}


def test_the_state_script_lines_parse():
    line = "sparkbook-svc-ray\trunning\t1\t2026-12-05T09:00:00.1Z\tsha256:aa\tsha256:aa\troot\t3\n"
    (s,) = parse_service_state(line + "garbage\n")
    assert (s.name, s.state, s.restarts, s.image == s.pinned, s.owner, s.engine_starts) == (
        "sparkbook-svc-ray", "running", 1, True, "root", 3)


def test_install_refuses_the_mp_executor_before_it_touches_a_node(tmp_path):
    class NoCluster:
        def __getattr__(self, name):
            raise AssertionError("no node may be asked")
    with pytest.raises(CheckFailed, match="only the Ray executor"):
        service.install(_params(executor="mp"), NoCluster(), tmp_path)


@pytest.fixture
def supervisor(tmp_path):
    """scripts/service.sh as the head's PID-1 program, with stand-ins: `ray start` sleeps, `python3`
    lists the alive nodes of a file, and the engine writes its PID and sleeps (in a process group of
    its own, with a child, as vllm serve's engine core is)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text("#!/bin/sh\nsed 's/^/ALIVE /' \"$ALIVE_FILE\"\n")
    (bin_ / "python3").chmod(0o755)
    alive = tmp_path / "alive"
    alive.write_text("n1\n")
    engine = (f"echo $$ >> {tmp_path / 'engines'}; sleep 1000 & echo $! >> {tmp_path / 'children'}; wait")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "ALIVE_FILE": str(alive),
           "SPARKBOOK_SERVICE_ROLE": "head", "SPARKBOOK_SERVICE_RAY": "sleep 1000",
           "SPARKBOOK_SERVICE_HEAD": "127.0.0.1:1", "SPARKBOOK_SERVICE_SERVE": engine,
           "SPARKBOOK_SERVICE_NODES": "2", "SPARKBOOK_SERVICE_CHECK_S": "1"}
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen(["bash", str(SCRIPTS / "service.sh")], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    yield tmp_path, alive, proc
    proc.terminate()
    try:
        proc.wait(timeout=40)
    finally:
        os.killpg(proc.pid, 9) if proc.poll() is None else None
        for f in ("children", "engines"):
            for pid in (tmp_path / f).read_text().split() if (tmp_path / f).exists() else []:
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass


def _until(what, timeout=30):
    t0 = time.monotonic()
    while not what():
        assert time.monotonic() - t0 < timeout, "not within the time"
        time.sleep(0.2)


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False


def test_the_supervisor_waits_for_every_node_and_restarts_the_engine_when_it_dies_or_a_node_leaves(supervisor):
    d, alive, proc = supervisor
    time.sleep(2)
    assert not (d / "engines").exists()  # 1 of 2 nodes: no engine yet
    alive.write_text("n1\nn2\n")
    _until(lambda: (d / "engines").exists())
    first, = (d / "engines").read_text().split()
    child, = (d / "children").read_text().split()
    os.kill(int(first), 9)  # the engine dies: its group (the child) is stopped, and it starts again
    _until(lambda: len((d / "engines").read_text().split()) == 2, timeout=40)
    assert not _alive(child)
    second = (d / "engines").read_text().split()[1]
    alive.write_text("n1\nn3\n")  # n2 rebooted: back under a new ID, the engine must start over
    _until(lambda: not _alive(second), timeout=20)
    _until(lambda: len((d / "engines").read_text().split()) == 3, timeout=40)
    log = (d / "log").read_text()
    assert "1 of 2 nodes alive in Ray: waiting" in log and "the engine ended" in log
    assert "1 node(s) the engine started with left Ray: stopping the engine" in log
    assert "starting the engine again in 5 s" in log and "starting the engine again in 10 s" in log
    proc.terminate()  # docker stop: the engine's group and Ray stopped, exit 0
    assert proc.wait(timeout=40) == 0
    assert not any(_alive(p) for p in (d / "engines").read_text().split() + (d / "children").read_text().split())
