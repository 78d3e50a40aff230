"""Ctrl-C and SIGTERM during `sparkbook run` (issue 15, point 6): the running step stops, the
teardown runs, the summary says `interrupted`, no traceback, exit 130 or 143; a second signal
skips the teardown and says what may still run. `sparkbook run` runs as a process of its own, in a
session of its own, so that a signal to its process group is Ctrl-C in a terminal."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sparkbook.runbook.interrupt import GRACE_S
import test_lock
from test_runner import ROOT, START, notebook

pytestmark = pytest.mark.slow

SERVE = ("import pathlib, time\npathlib.Path(ctx.run_dir, 'serve-started').write_text('yes')\n"
         "time.sleep(120)")
# a cell that does not end on an interrupt, as one waiting for a remote command in a thread: it
# ignores SIGINT while it runs (a KeyboardInterrupt caught in a loop could still land between two
# of its statements, outside the try, and end the cell before the grace time)
STUCK = ("import pathlib, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
         "pathlib.Path(ctx.run_dir, 'serve-started').write_text('yes')\ntime.sleep(120)")
TEARDOWN = ("import pathlib, time\npathlib.Path(ctx.run_dir, 'teardown-started').write_text('yes')\n"
            "time.sleep(3)\npathlib.Path(ctx.run_dir, 'teardown-ran').write_text('yes')")


deployment = test_lock.deployment  # a fixture: parameters of a deployment of the test's own


@pytest.fixture
def params_file(request, tmp_path):
    request.getfixturevalue("deployment")
    return tmp_path / "params.yaml"


def books(tmp_path: Path, serve: str = SERVE) -> Path:
    d = tmp_path / "notebooks"
    d.mkdir()
    notebook(d / "00_first.ipynb", START)
    notebook(d / "05_serve.ipynb", START, serve)
    notebook(d / "06_after.ipynb", START, "open('after-ran', 'w').write('yes')")
    notebook(d / "08_teardown.ipynb", START, TEARDOWN)
    return d


def wait_for(path: Path, proc: subprocess.Popen, limit: float = 90) -> None:
    end = time.monotonic() + limit
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path.name}: {proc.communicate()}"
        assert time.monotonic() < end, f"no {path.name} within {limit} s"
        time.sleep(0.2)


def interrupt(tmp_path, params_file, sig, group, *extra, serve=SERVE, second=False):
    """Run, signal once 05 runs (and once more when the teardown started, with ``second``);
    return the exit code, stderr and the summary."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkbook.cli", "run", "-p", str(params_file), "--notebooks",
         str(books(tmp_path, serve)), "--out", str(out), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    send = (lambda: os.killpg(proc.pid, sig)) if group else (lambda: proc.send_signal(sig))
    try:
        wait_for(out / "serve-started", proc)
        send()
        if second:
            wait_for(out / "teardown-started", proc)
            send()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err, json.loads((out / "summary.json").read_text())


def statuses(summary):
    return [(s["name"], s["status"]) for s in summary["steps"]]


@pytest.mark.parametrize("sig, group, code", [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],
                         ids=["ctrl-c-to-the-process-group", "sigterm-to-sparkbook-alone"])
def test_a_signal_stops_the_step_runs_the_teardown_and_exits_128_plus_it(tmp_path, params_file, sig,
                                                                           group, code):
    t0 = time.monotonic()
    rc, err, summary = interrupt(tmp_path, params_file, sig, group)
    assert rc == code, err[-3000:]
    assert time.monotonic() - t0 < 60  # the 120 s cell did not run to its end
    assert summary["status"] == "interrupted" and summary["signal"] == sig.name
    assert statuses(summary) == [("00_first", "passed"), ("05_serve", "interrupted"),
                                 ("06_after", "skipped"), ("08_teardown", "passed")]
    assert summary["steps"][1]["error"] == f"stopped by {sig.name}"
    assert (tmp_path / "run" / "teardown-ran").exists()
    assert not (tmp_path / "notebooks" / "after-ran").exists()
    assert "Traceback" not in err and "ZMQError" not in err, err[-3000:]
    assert f"sparkbook: {sig.name}: stopping 05_serve" in err and "Executing Cell" not in err, err[-3000:]
    assert (tmp_path / "run" / "report.html").exists()


def test_a_second_signal_skips_the_teardown_and_says_what_may_still_run(tmp_path, params_file):
    rc, err, summary = interrupt(tmp_path, params_file, signal.SIGINT, True, second=True)
    assert rc == 130
    assert statuses(summary)[-1] == ("08_teardown", "interrupted")
    assert not (tmp_path / "run" / "teardown-ran").exists()
    assert "sparkbook: SIGINT again: stopping 08_teardown now, without the teardown" in err, err[-3000:]
    name = yaml.safe_load(params_file.read_text())["name"]
    assert (f"the vLLM containers of deployment '{name}' (label sparkbook={name}) may still run "
            f"on this-machine; remove them with `sparkbook run -p {params_file} --steps teardown`") in err
    assert "Traceback" not in err, err[-3000:]


def test_keep_on_failure_keeps_the_deployment_after_an_interrupt_too(tmp_path, params_file):
    rc, err, summary = interrupt(tmp_path, params_file, signal.SIGTERM, False, "--keep-on-failure")
    assert rc == 143 and statuses(summary)[-1] == ("08_teardown", "skipped")
    assert not (tmp_path / "run" / "teardown-started").exists() and "may still run" in err


def test_a_cell_that_does_not_stop_is_killed_after_the_grace_time(tmp_path, params_file):
    t0 = time.monotonic()
    rc, err, summary = interrupt(tmp_path, params_file, signal.SIGINT, True, serve=STUCK)
    assert rc == 130 and time.monotonic() - t0 < GRACE_S + 45
    assert statuses(summary)[1:] == [("05_serve", "interrupted"), ("06_after", "skipped"),
                                     ("08_teardown", "passed")]
    assert f"did not stop within {GRACE_S:.0f} s" in err and "Traceback" not in err, err[-3000:]
    # what the killed kernel's process says (ipykernel's ZMQError at shutdown, say) is in its log
    assert (tmp_path / "run" / "logs" / "kernel-05_serve.log").exists()


def test_on_the_lab_ctrl_c_during_05_tears_down_and_another_run_meanwhile_is_refused(lab, params,
                                                                                       cluster, tmp_path):
    """The issue's case: Ctrl-C during 05 on real (lab) nodes. Meanwhile a second run is refused by
    the lock, naming this one; after the signal 08 removes what 04 and 05 started."""
    from test_serving_lab import LAB, nothing_left
    from sparkbook.distribution.image import ensure_image
    ensure_image(params, cluster, say=lambda *_: None)  # 04 needs the image on every node
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkbook.cli", "run", "-p", str(LAB), "--steps", "04,05,08",
         "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(out / "05_serve.ipynb", proc, limit=300)
        second = subprocess.run(
            [sys.executable, "-m", "sparkbook.cli", "run", "-p", str(LAB), "--steps", "08",
             "--out", str(tmp_path / "second")], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "lock" in second.stderr and f"run folder {out}" in second.stderr, second.stderr[-3000:]
        time.sleep(5)  # 05 is starting vLLM
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 130, err[-3000:]
    assert statuses(summary) == [("04_ray_cluster", "passed"), ("05_serve", "interrupted"),
                                 ("08_teardown", "passed")]
    assert "Traceback" not in err, err[-3000:]
    nothing_left(params, cluster)
