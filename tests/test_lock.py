"""One run at a time per deployment (issue 15, point 7): the lock on the head. lock.sh is run with
bash on this machine; the Python side on a `local: true` head (no SSH)."""

import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from sparkbook.nodes import lock
from sparkbook.cli import main
from sparkbook.notebook import Context
from sparkbook.params import load
from sparkbook.nodes.remote import Cluster
from sparkbook.book.step import Outcome
from sparkbook.nodes.shell import SCRIPTS
from sparkbook.nodes.workdir import workdir
from test_runner import LOCALHOST, START, notebook, step_start

SCRIPT = SCRIPTS / "lock.sh"
PROC = "8f0c2a1e-boot/pid:[4026531836]/123456"  # boot ID / PID namespace / start time
RUN_A = ["tA", "alice@ops-1", "ops-1", "4242", PROC, "/runs/a", "2026-11-30T10:00:00+00:00"]


def sh(*args: str) -> list[str]:
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def test_lock_sh_holds_one_holder_names_it_and_lets_only_it_release(tmp_path):
    assert sh("acquire", str(tmp_path), *RUN_A)[0] == "LOCK-ACQUIRED"
    held = sh("acquire", str(tmp_path), "tB", "bob@ops-2", "ops-2", "7", PROC, "/runs/b", "now")
    assert held[0] == "LOCK-HELD"
    assert {"owner=alice@ops-1", "pid=4242", f"process={PROC}", "run=/runs/a"} <= set(held)
    age = next(int(w.removeprefix("age=")) for w in held if w.startswith("age="))
    assert 0 <= age <= 5  # seconds since the acquire (a whole second can pass on a loaded machine)
    assert sh("acquire", str(tmp_path), *RUN_A)[0] == "LOCK-OURS"
    assert sh("release", str(tmp_path), "tB")[0] == "LOCK-HELD"
    took = sh("take", str(tmp_path), "tOther", "tB", "bob@ops-2", "ops-2", "7", PROC, "/b", "now")
    assert took[0] == "LOCK-HELD"
    assert sh("release", str(tmp_path), "tA") == ["LOCK-RELEASED"]
    assert sh("show", str(tmp_path)) == ["LOCK-NONE"]
    assert os.listdir(tmp_path) == []  # no temporary file left behind


def test_lock_sh_of_many_at_once_exactly_one_gets_it(tmp_path):
    def one(i):
        return sh("acquire", str(tmp_path), f"t{i}", "u@h", "h", str(i), PROC, f"/r{i}", "now")[0]
    with ThreadPoolExecutor(16) as pool:
        states = list(pool.map(one, range(32)))
    assert states.count("LOCK-ACQUIRED") == 1 and states.count("LOCK-HELD") == 31
    assert os.listdir(tmp_path) == ["lock"]


def test_lock_sh_of_many_taking_over_one_stale_lock_exactly_one_gets_it(tmp_path):
    """Runs that found the same stale lock at once: one replaces it, the others see its holder."""
    assert sh("acquire", str(tmp_path), *RUN_A)[0] == "LOCK-ACQUIRED"

    def one(i):
        return sh("take", str(tmp_path), "tA", f"t{i}", "u@h", "h", str(i), PROC, f"/r{i}", "now")[0]
    with ThreadPoolExecutor(16) as pool:
        states = list(pool.map(one, range(16)))
    assert states.count("LOCK-ACQUIRED") == 1 and states.count("LOCK-HELD") == 15
    assert os.listdir(tmp_path) == ["lock"]


@pytest.fixture
def deployment(tmp_path):
    """Parameters of a deployment of this test's own on this machine (a local head)."""
    data = yaml.safe_load(LOCALHOST.read_text())
    data["name"] = f"locktest-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    p = load(path)
    yield p
    shutil.rmtree(workdir(p, p.head), ignore_errors=True)


def other_run(deployment, *, host="ops-2.example", pid="4242", process=PROC, age_s=0,
              token="other-token"):
    """A lock file as another run left it."""
    d = Path(workdir(deployment, deployment.head))
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    (d / "lock").write_text(f"token={token}\nowner=bob@{host}\nhost={host}\npid={pid}\n"
                            f"process={process}\nrun=/home/bob/outputs/run-b\n"
                            f"started=2026-11-30T10:00:00+00:00\n")
    if age_s:
        t = time.time() - age_s
        os.utime(d / "lock", (t, t))
    return d / "lock"


def test_a_second_run_is_refused_naming_the_holder(deployment, monkeypatch):
    cluster = Cluster.from_params(deployment)
    first = lock.acquire(deployment, cluster, "/runs/first")
    assert first.owned and "run=/runs/first" in Path(workdir(deployment, deployment.head), "lock").read_text()
    monkeypatch.setattr(lock, "_own_token", "another-process")
    with pytest.raises(lock.LockHeld, match=r"locked by another run: the lock .* held by "
                       r"\S+@\S+ \(pid \d+, run folder /runs/first") as refused:
        lock.acquire(deployment, cluster, "/runs/second")
    assert "another boot or PID namespace" not in str(refused.value)  # it is this one's
    first.release()
    assert lock.acquire(deployment, cluster, "/runs/second").owned


def dead_pid() -> str:
    """A pid that no process has now (its process just ended)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    return str(dead.pid)


def here(start: str = "1") -> str:
    """A lock's ``process`` of this boot and PID namespace, for a process started at ``start``."""
    return lock._process().rpartition("/")[0] + "/" + start


@pytest.mark.parametrize("holder, why", [
    ("dead", "its process .* on this machine is gone"),
    ("pid reused", "its process .* on this machine is gone"),  # a live pid, another start time
    (dict(age_s=lock.STALE_S + 60), "not refreshed for"),
])
def test_a_stale_lock_is_reported_and_taken_over(deployment, capsys, holder, why):
    import socket
    if holder == "dead":
        holder = dict(host=socket.gethostname(), pid=dead_pid(), process=here())
    elif holder == "pid reused":
        holder = dict(host=socket.gethostname(), pid=str(os.getpid()), process=here("1"))
    path = other_run(deployment, **holder)
    held = lock.acquire(deployment, Cluster.from_params(deployment), "/runs/mine")
    assert held.owned and "run=/runs/mine" in path.read_text()
    err = capsys.readouterr().err
    assert "took over the stale lock of bob@" in err and "run-b" in err
    assert __import__("re").search(why, err), err


@pytest.mark.parametrize("elsewhere", ["another PID namespace", "another boot"])
def test_a_holder_under_this_host_name_that_cannot_be_seen_is_not_taken_over(deployment, elsewhere):
    """Issue 26: a run in a container on this host's network (its own PID namespace) or on a cloned
    machine (its own boot) has this host name; its pid, free here, says nothing of it."""
    import socket
    boot, namespace, _ = lock._process().split("/")
    process = (f"{boot}/{namespace.replace(']', '7]')}/5" if elsewhere == "another PID namespace"
               else f"0000-cloned-boot/{namespace}/5")
    path = other_run(deployment, host=socket.gethostname(), pid=dead_pid(), process=process)
    with pytest.raises(lock.LockHeld, match=rf"held by bob@{socket.gethostname()} \(pid \d+.*"
                       "in another boot or PID namespace"):
        lock.acquire(deployment, Cluster.from_params(deployment), "/runs/mine")
    assert "token=other-token" in path.read_text()


def test_a_live_lock_of_another_machine_is_not_taken_over(deployment):
    other_run(deployment, age_s=lock.STALE_S - 120)
    with pytest.raises(lock.LockHeld, match="bob@ops-2.example"):
        lock.acquire(deployment, Cluster.from_params(deployment), "/runs/mine")


def test_unlock_breaks_the_lock_and_says_whose_it_was(deployment, tmp_path, capsys):
    path = other_run(deployment)
    params_file = tmp_path / "params.yaml"
    assert main(["unlock", "-p", str(params_file)]) == 0
    assert "broke the lock held by bob@ops-2.example" in capsys.readouterr().out
    assert not path.exists()
    assert main(["unlock", "-p", str(params_file)]) == 0
    assert "no lock on the head this-machine" in capsys.readouterr().out


def test_sparkbook_run_is_refused_while_another_run_holds_the_lock(deployment, tmp_path, capsys):
    other_run(deployment)
    d = tmp_path / "notebooks"
    d.mkdir()
    notebook(d / "05_serve.ipynb", START, "open('serve-ran', 'w').write('yes')")
    out = tmp_path / "outputs" / "run"
    assert main(["run", "-p", str(tmp_path / "params.yaml"), "--notebooks", str(d), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "lock" in err and "bob@ops-2.example" in err and "/home/bob/outputs/run-b" in err
    assert not (d / "serve-ran").exists() and not out.exists()


def test_the_runs_kernels_pass_and_the_lock_is_released_at_the_end(deployment, tmp_path):
    """The kernels of `sparkbook run` pass the run's lock (a notebook of a state-changing step
    checks it); after the run the lock is gone."""
    d = tmp_path / "notebooks"
    d.mkdir()
    lock_file = Path(workdir(deployment, deployment.head), "lock")
    notebook(d / "04_ray_cluster.ipynb", step_start("04_ray_cluster"),
             f"import pathlib\nassert ctx.held is not None and not ctx.held.owned\n"
             f"pathlib.Path({str(tmp_path / 'seen')!r}).write_text(pathlib.Path({str(lock_file)!r}).read_text())",
             "ctx.conclude(sb.step.Outcome())")
    out = tmp_path / "run"
    assert main(["run", "-p", str(tmp_path / "params.yaml"), "--notebooks", str(d), "--out", str(out)]) == 0
    seen = (tmp_path / "seen").read_text()
    assert f"run={out}" in seen and f"pid={os.getpid()}" in seen  # the runner holds it, not the kernel
    assert not lock_file.exists() and "SPARKBOOK_LOCK" not in os.environ


def step(name):
    import types
    return types.SimpleNamespace(NAME=name, TITLE=name, run=lambda ctx: Outcome(),
                                 checks=lambda params, outcome: [])


def test_a_notebook_of_a_state_changing_step_takes_the_lock_and_gives_it_back(deployment, tmp_path):
    lock_file = Path(workdir(deployment, deployment.head), "lock")
    ctx = Context(deployment, "test", tmp_path, step("05_serve"))
    ctx.run()
    assert f"pid={os.getpid()}" in lock_file.read_text()
    ctx.conclude(Outcome())
    assert not lock_file.exists()
    failing = step("05_serve")
    failing.run = lambda ctx: 1 / 0
    with pytest.raises(ZeroDivisionError):  # a cell that fails in JupyterLab keeps no lock
        Context(deployment, "test", tmp_path, failing).run()
    assert not lock_file.exists()
    # a step that does not change the nodes leaves the lock alone
    other_run(deployment)
    Context(deployment, "test", tmp_path, step("06_smoke_test")).run()
    with pytest.raises(lock.LockHeld, match="lock"):
        Context(deployment, "test", tmp_path, step("08_teardown")).run()


def test_an_interactive_kernel_that_exits_gives_the_lock_back(deployment, tmp_path):
    """A notebook run by hand whose step stopped before it concluded: the lock goes when its
    kernel (here: a Python process) exits."""
    lock_file = Path(workdir(deployment, deployment.head), "lock")
    code = ("import sys, types\nfrom sparkbook.notebook import Context\nfrom sparkbook.params import load\n"
            "from sparkbook.book.step import Outcome\n"
            "s = types.SimpleNamespace(NAME='03_distribute_image', TITLE='t', run=lambda ctx: Outcome(),"
            " checks=lambda p, o: [])\n"
            f"ctx = Context(load({str(tmp_path / 'params.yaml')!r}), 'x', {str(tmp_path)!r}, s)\n"
            f"ctx.run()\nprint(open({str(lock_file)!r}).read())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != lock.ENV})
    assert r.returncode == 0, r.stderr
    assert "run=" + str(tmp_path) in r.stdout and not lock_file.exists()



@pytest.mark.parametrize("lost", ["taken over", "broken"])
def test_a_notebook_whose_lock_was_lost_stops_before_it_changes_the_nodes_again(deployment, tmp_path, lost):
    """Issue 26: a run that finds its lock someone else's (or gone) raises at its next gate or
    work, instead of saying so and going on beside the other run."""
    lock_file = Path(workdir(deployment, deployment.head), "lock")
    work = []
    serve = step("05_serve")
    serve.run = lambda ctx: work.append("ran") or Outcome()
    ctx = Context(deployment, "test", tmp_path, serve)
    ctx.run()
    assert work == ["ran"] and f"pid={os.getpid()}" in lock_file.read_text()
    if lost == "taken over":
        other_run(deployment)
    else:
        lock_file.unlink()  # sparkbook unlock
    said = "bob@ops-2.example .* took it over" if lost == "taken over" else "it was broken"
    for action in (ctx.run, lambda: ctx.gate([])):
        with pytest.raises(lock.LockLost, match=f"no longer this run's: {said}.*stops here"):
            action()
    assert work == ["ran"]
    assert ("token=other-token" in lock_file.read_text()) if lost == "taken over" else not lock_file.exists()


def test_a_kernel_of_a_run_whose_lock_was_lost_stops(deployment, monkeypatch):
    """A kernel of `sparkbook run` passes the run's lock only while it is still the run's: one that
    was broken is not taken anew, one taken over is not passed."""
    monkeypatch.setenv(lock.ENV, "the-runs-token")
    cluster = Cluster.from_params(deployment)
    lock_file = Path(workdir(deployment, deployment.head), "lock")
    with pytest.raises(lock.LockLost, match="it was broken"):
        lock.acquire(deployment, cluster, "/runs/mine")
    assert not lock_file.exists()
    other_run(deployment)
    with pytest.raises(lock.LockLost, match="bob@ops-2.example .* took it over"):
        lock.acquire(deployment, cluster, "/runs/mine")
    other_run(deployment, token="the-runs-token")
    assert not lock.acquire(deployment, cluster, "/runs/mine").owned
