"""Where a stalled node's workers are: worker_stacks.sh on this machine (its docker a stand-in,
its processes real), py-spy's dump read into the phase (sparkbook.facts.stacks) on a dump captured
on the lab, and the py-spy binary fetched and checked by its digest (serving/stacks.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkbook.facts import stacks
from sparkbook.serving import stacks as sampling

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "sparkbook" / "scripts" / "worker_stacks.sh"
DUMP = ROOT / "tests" / "fixtures" / "stacks" / "pyspy-gloo-all-reduce-1.txt"


def dump() -> str:
    return DUMP.read_text().split("\n", 1)[1]  # without the line that says where it was captured


def test_a_pyspy_dump_names_the_collective_a_rank_waits_in():
    threads = stacks.parse_pyspy(dump())
    assert [(t.tid, t.state, t.name) for t in threads] == [(99, "idle", "MainThread"), (100, "idle", "MainThread")]
    assert threads[0].frames[0] == "all_reduce (torch/distributed/distributed_c10d.py:3252)"
    assert threads[1].frames[0] == "rank_main (probe.py:11)"  # the rank that never joined
    sample = stacks.Sample(stacks=threads)
    assert sample.phase() == ("collective", "all_reduce (torch/distributed/distributed_c10d.py:3252)")
    # inside the process groups' set-up, a collective is the set-up's
    init = stacks.Thread(7, "MainThread", frames=["barrier (torch/distributed/distributed_c10d.py:4100)",
                                                  "init_process_group (torch/distributed/distributed_c10d.py:1500)"])
    assert stacks.Sample(stacks=[init]).phase()[0] == "distributed init"
    # the lab's frozen rank, stopped while it allocated its KV cache (tests/test_serving_lab.py)
    kv = stacks.Thread(127, "MainThread", frames=["allocate_kv_cache (vllm/v1/worker/utils.py:596)"])
    assert stacks.Sample(stacks=[kv]).phase()[0] == "kv cache"


def test_the_busiest_threads_stack_is_read_first_and_said_with_its_share():
    text = ("@@ threads\n99 R 0.97 ray::RayWorkerProc\n101 S 0.00 gloo-pair\n100 S 0.00 python3\n"
            "@@ py-spy 4242\n" + dump())
    sample = stacks.parse_sample(text)
    assert sample.busiest.tid == 99 and sample.pyspy == ""
    assert sample.summary() == ("busiest thread 'ray::RayWorkerProc' (R, 97% of a core); Python stack: in "
                                "collective at all_reduce (torch/distributed/distributed_c10d.py:3252)")
    without = stacks.parse_sample("@@ threads\n5 R 1.00 python3\n@@ no-py-spy no py-spy for riscv64\n")
    assert without.summary() == "busiest thread 'python3' (R, 100% of a core); no Python stack (no py-spy for riscv64)"


@pytest.fixture
def worker_and_idle():
    """A real worker process that spins for a few seconds, and one that sleeps."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 8\nwhile time.time() < end: pass"])
    idle = subprocess.Popen(["sleep", "30"])
    yield busy.pid, idle.pid
    for proc in (busy, idle):
        proc.kill()
        proc.wait()


def test_the_script_reads_each_workers_threads_and_its_dump_by_its_pid_in_the_container(tmp_path, worker_and_idle):
    """docker's stand-in lists both as vLLM workers, copies py-spy, and runs it as the container
    would (printing the lab's dump for the PID it is given): the spinning thread's share is near
    one core, the sleeping one's near none; py-spy is asked for the PID the worker has in its
    own namespace (NSpid) and removed after."""
    busy, idle = worker_and_idle
    log = tmp_path / "docker.log"
    (tmp_path / "docker").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {log}
        case "$1" in
          top) echo "PID COMMAND"; echo "{busy} VLLM::Worker_TP0"; echo "{idle} VLLM::Worker_TP1" ;;
          cp) exit 0 ;;
          exec) [ "$4" = dump ] && cat {DUMP} ;;
        esac
        """))
    (tmp_path / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(SCRIPT), "vllm", "/opt/py-spy"], capture_output=True, text=True,
                         env=env, check=True, timeout=60).stdout
    sample = stacks.parse_sample(out)
    shares = {t.tid: t.cpu_share for t in sample.threads}
    assert shares[busy] > 0.5 and shares[idle] < 0.1, out
    assert sample.phase()[0] == "collective" and len(sample.stacks) == 4  # two workers, two threads each
    calls = log.read_text()
    assert f"--pid {busy}\n" in calls and "cp -- /opt/py-spy vllm:/tmp/sparkbook-py-spy" in calls
    assert calls.rstrip().endswith("rm -f -- /tmp/sparkbook-py-spy")
    out = subprocess.run(["bash", str(SCRIPT), "vllm"], capture_output=True, text=True, env=env, check=True).stdout
    assert "@@ no-py-spy no py-spy for this node" in out and "@@ py-spy" not in out


def test_pyspy_is_fetched_once_and_refused_when_its_wheel_is_not_the_one_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKBOOK_CACHE", str(tmp_path))
    binary, why = sampling.pyspy_binary("x86_64")
    if binary is None and "could not be fetched" in why:
        pytest.skip(f"no package index reachable from this machine: {why}")
    assert binary is not None, why
    assert binary.stat().st_mode & 0o111
    assert sampling.pyspy_binary("x86_64") == (binary, "")  # the second time from the cache
    assert sampling.pyspy_binary("riscv64") == (None, "no py-spy for riscv64")
    monkeypatch.setitem(sampling.WHEELS, "aarch64", ("manylinux2014_aarch64", "0" * 64))
    assert sampling.pyspy_binary("aarch64") == (None, "py-spy 0.4.3's wheel for aarch64 does not have its recorded digest")
