"""`sparkbook status` and the front page (notebooks/index.ipynb): each step's state from a run
folder's summary and verdicts, the newest run folder of the deployment, the nodes now, the front
page executed without a widget frontend, and the command its run buttons start."""

import json
import os
import re
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import papermill
import pytest
import yaml

from conftest import free_port
from sparkbook.runbook import frontpage
from sparkbook.record import status
from sparkbook.cli import main
from sparkbook.params import load
from sparkbook.record.folder import RunFolder
from sparkbook.book.verdict import Check, Verdict

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
STARTED = datetime(2026, 12, 1, 2, 0, 0, tzinfo=timezone.utc)


def _params(tmp_path, name="fronttest", **changes) -> Path:
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data.update(name=name, **changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _verdict(run: Path, name: str, checks: list[Check], at: datetime) -> None:
    path = Verdict(name[:2], checks).save(run / "verdicts" / f"{name}.json")
    os.utime(path, (at.timestamp(), at.timestamp()))


def _summary(run: Path, deployment: str = "fronttest", steps=()) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(json.dumps({
        "status": "failed", "deployment": deployment, "started": STARTED.isoformat(),
        "steps": [{"step": n[:2], "name": n, "notebook": f"{n}.ipynb", "status": s, "duration_s": d,
                   "error": e} for n, s, d, e in steps]}))


def _run(tmp_path) -> Path:
    """00 passed (2 PASS, 1 WARN), 01 failed on spark-2 with its verdict, 02 failed before its
    verdict, 08 (teardown after the failure) passed; the rest skipped."""
    run = tmp_path / "run"
    _summary(run, steps=[("00_inventory", "passed", 10, None),
                         ("01_preflight", "failed", 20, "CheckFailed: 01 preflight: 1 check(s) failed\nmore"),
                         ("02_collectives", "failed", 30, "CheckFailed: collectives: rank 1 hung\n..."),
                         ("03_distribute_image", "skipped", 0, None),
                         ("08_teardown", "passed", 5, None)])
    ok = Check("reachable", "spark-1", "PASS")
    _verdict(run, "00_inventory", [ok, Check("reachable", "spark-2", "PASS"), Check("gpu", "spark-1", "WARN")],
             STARTED.replace(second=9))
    _verdict(run, "01_preflight", [ok, Check("mtu", "spark-2", "FAIL", "1500", "9000")], STARTED.replace(second=29))
    # 02's file is an earlier run's: not this run's verdict
    _verdict(run, "02_collectives", [ok], STARTED.replace(hour=1))
    return run


def test_states_times_counts_and_failures_from_a_run_folder(tmp_path):
    pic = status.picture(load(_params(tmp_path)), "p.yaml", _run(tmp_path), NOTEBOOKS)
    by = {s.name: s for s in pic.steps}
    assert [s.name for s in pic.steps][:3] == ["00_inventory", "01_preflight", "02_collectives"]
    assert (by["00_inventory"].state, by["00_inventory"].when) == ("passed", STARTED.replace(second=10))
    assert by["00_inventory"].counts == {"PASS": 2, "WARN": 1, "FAIL": 0, "SKIP": 0}
    assert (by["01_preflight"].state, by["01_preflight"].when) == ("failed", STARTED.replace(second=30))
    assert by["01_preflight"].failures() == ["mtu on spark-2: 1500"]
    # failed before its verdict: the run's error, and not the older run's passing counts
    assert by["02_collectives"].state == "failed" and by["02_collectives"].counts == {}
    assert by["02_collectives"].failures() == ["CheckFailed: collectives: rank 1 hung"]
    assert by["03_distribute_image"].state == "not run" and by["03_distribute_image"].when is None
    assert (by["08_teardown"].state, by["08_teardown"].when) == ("passed", STARTED.replace(minute=1, second=5))
    assert pic.next_step() == "01_preflight"
    text = pic.to_text()
    assert "01_preflight         failed   2026-12-01 02:00 UTC  1     0     1     0     mtu on spark-2: 1500" in text


def test_a_verdict_written_after_the_run_decides(tmp_path):
    """01 run again by hand into the same folder, after the summary's run: its verdict is newer."""
    run = _run(tmp_path)
    _verdict(run, "01_preflight", [Check("mtu", "spark-2", "PASS")], STARTED.replace(hour=3))
    _verdict(run, "05_serve", [Check("api", "all", "FAIL", "no answer")], STARTED.replace(hour=4))
    by = {s.name: s for s in status.picture(load(_params(tmp_path)), "p", run, NOTEBOOKS).steps}
    assert (by["01_preflight"].state, by["01_preflight"].when) == ("passed", STARTED.replace(hour=3))
    assert by["01_preflight"].failures() == []
    assert by["05_serve"].state == "failed" and by["05_serve"].failures() == ["api: no answer"]


def test_no_or_a_partial_run_folder_is_not_run(tmp_path):
    params = load(_params(tmp_path))
    assert {s.state for s in status.picture(params, "p", None, NOTEBOOKS).steps} == {"not run"}
    run = tmp_path / "partial"
    (run / "verdicts").mkdir(parents=True)
    (run / "verdicts" / "01_preflight.json").write_text("")  # cut short while written
    _verdict(run, "00_inventory", [Check("reachable", "this-machine", "PASS")], STARTED)
    pic = status.picture(params, "p", run, NOTEBOOKS)
    assert [s.state for s in pic.steps] == ["passed"] + ["not run"] * 8
    assert pic.unreadable == {"verdicts/01_preflight.json": "empty"}
    assert "unreadable, left out: verdicts/01_preflight.json: empty" in pic.headline().splitlines()


def _main_says(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_a_received_run_folder_that_cannot_be_read_is_one_line_not_a_traceback(tmp_path, capsys):
    """As ``sparkbook report`` reads one: a summary.json that cannot be read is exit 2 with one
    line; any other piece that cannot be read (a verdict of another shape, not UTF-8, cut short,
    a verdicts folder that is a link, a fingerprint or image inspection of another shape) is left
    out and named, one line each, and the rest is shown: exit 0."""
    params = str(_params(tmp_path))
    for name, data in [("truncated", b'{"steps": [{"step": "00"'), ("not UTF-8", b'{"steps": [], "x": "\xff"}'),
                       ("a list", b"[]"), ("steps of another shape", b'{"steps": [{"name": 3}]}'),
                       ("a duration as text", b'{"steps": [{"step": "00", "name": "00_inventory", '
                                              b'"notebook": "00_inventory.ipynb", "status": "passed", '
                                              b'"duration_s": "9.5"}]}')]:
        run = tmp_path / "bad" / name
        run.mkdir(parents=True)
        (run / "summary.json").write_bytes(data)
        code, out, err = _main_says(["status", "-p", params, "--run", str(run), "--no-nodes"], capsys)
        assert (code, out) == (2, ""), (name, out)
        assert err.startswith(f"sparkbook: {run}: not a run folder that can be read: summary.json: ")
        assert err.count("\n") == 1, (name, err)

    run = _run(tmp_path)
    (run / "verdicts" / "00_inventory.json").write_text(json.dumps({"title": "00", "checks": [{"check": "x"}]}))
    (run / "verdicts" / "01_preflight.json").write_bytes(b'{"title": "\xff"}')
    (run / "verdicts" / "05_serve.json").write_text('{"title": "05", "checks": [')
    (run / "image_inspection.json").write_text("[1, 2]")
    (run / "fingerprint.json").write_text(json.dumps({"versions": "vllm 1", "created": 3}))
    code, out, err = _main_says(["status", "-p", params, "--run", str(run), "--no-nodes"], capsys)
    assert (code, err) == (0, "")
    said = [line for line in out.splitlines() if line.startswith("unreadable, left out: ")]
    assert said == [
        "unreadable, left out: verdicts/00_inventory.json: checks[0].status: required field is missing",
        "unreadable, left out: verdicts/01_preflight.json: not UTF-8 (byte 0xff at offset 11)",
        "unreadable, left out: verdicts/05_serve.json: not JSON: Expecting value (line 1, column 28)",
        "unreadable, left out: fingerprint.json: created: Input should be a valid string (got 3) (and 1 more)",
        "unreadable, left out: image_inspection.json: not a JSON object but a list"], out
    rows = {line.split()[0]: re.split(r"\s\s+", line)[1] for line in out.splitlines() if line[:2].isdigit()}
    # what the summary says still shows; 00's and 01's counts, unreadable, are not
    assert (rows["00_inventory"], rows["01_preflight"], rows["05_serve"]) == ("passed", "failed", "not run")
    assert "mtu on spark-2" not in out and "CheckFailed: 01 preflight" in out

    # a verdicts folder that is a link (to a folder of good verdicts elsewhere): not followed
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "verdicts", elsewhere)
    (run / "verdicts").symlink_to(elsewhere)
    code, out, err = _main_says(["status", "-p", params, "--run", str(run), "--no-nodes"], capsys)
    assert (code, err) == (0, "")
    assert "unreadable, left out: verdicts: a symbolic link: not followed" in out.splitlines()


def test_text_from_a_run_folder_is_shown_as_one_line(tmp_path):
    """A summary's status or error, a check's observation, an inspection's version: a line break,
    a carriage return or an escape sequence in them does not reach the terminal as one."""
    run = tmp_path / "run"
    _summary(run, steps=[("00_inventory", "failed", 10, "first\rforged line\x1b[2J\nsecond")])
    data = json.loads((run / "summary.json").read_text())
    data["status"] = "failed\nrun folder: /elsewhere"
    (run / "summary.json").write_text(json.dumps(data))
    (run / "image_inspection.json").write_text(json.dumps({"image": "i\x1b]0;x\x07", "vllm": "1\n2"}))
    text = status.picture(load(_params(tmp_path)), "p", run, NOTEBOOKS).to_text()
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "run folder: /elsewhere" not in text.splitlines()
    assert "first\\rforged line\\x1b[2J" in text and "second" not in text
    assert "versions: vLLM 1\\n2 (image i\\x1b]0;x\\x07; image_inspection.json)" in text.splitlines()


def test_the_newest_run_folder_of_the_deployment_is_chosen(tmp_path):
    params = load(_params(tmp_path, name="alpha"))
    assert status.run_folder(params, root=tmp_path) is None
    outputs = tmp_path / "outputs"
    old, mine, other = outputs / "20261201T000000Z-alpha", outputs / "interactive-alpha", outputs / "20261201T050000Z-beta"
    _summary(old, "alpha")
    _summary(other, "beta")
    _verdict(mine, "00_inventory", [Check("reachable", "n", "PASS")], STARTED)
    for i, (folder, hour) in enumerate([(old, 1), (mine, 2), (other, 5)]):
        for p in (folder, folder / "summary.json", folder / "verdicts"):
            if p.exists():
                t = STARTED.replace(hour=hour).timestamp()
                os.utime(p, (t, t))
    assert status.run_folder(params, root=tmp_path) == mine  # beta's newer folder is not alpha's
    t = STARTED.replace(hour=3).timestamp()
    os.utime(old / "summary.json", (t, t))
    assert status.run_folder(params, root=tmp_path) == old
    assert status.run_folder(params, tmp_path / "named", root=tmp_path) == tmp_path / "named"


def test_versions_from_the_inspection_without_a_fingerprint(tmp_path):
    assert status.versions(RunFolder(tmp_path)) == ""
    (tmp_path / "image_inspection.json").write_text(json.dumps({"image": "img:1", "vllm": "0.17.0", "ray": "2.5"}))
    assert status.versions(RunFolder(tmp_path)) == "vLLM 0.17.0 · Ray 2.5 (image img:1; image_inspection.json)"


def test_status_asks_every_node_and_names_the_one_down(ssh_nodes, tmp_path, capsys):
    nodes = [n.model_dump(exclude_none=True) for n in ssh_nodes.nodes()]
    nodes.append({"name": "ghost", "host": "127.0.0.1", "port": free_port(), "user": "root",
                  "key": str(ssh_nodes.key), "role": "worker"})
    path = _params(tmp_path, nodes=nodes, ssh={"known_hosts": [str(ssh_nodes.known_hosts)], "connect_timeout": 3},
                   ports={"api": free_port()})
    data = yaml.safe_load(path.read_text())
    data["serving"]["nodes"] = ["node0"]
    path.write_text(yaml.safe_dump(data))
    t0 = time.monotonic()
    assert main(["status", "-p", str(path), "--run", str(_run(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert time.monotonic() - t0 < 60
    assert "01_preflight         failed" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("node", "ghost"))}
    assert all(" yes " in rows[f"node{i}"] for i in range(3)), out
    assert "ghost  worker  no  " in rows["ghost"] and "cannot connect" in rows["ghost"], out
    assert f"endpoint http://127.0.0.1:{data['ports']['api']}: " in out and "ready" not in out.split("endpoint")[1]


def test_run_command_is_an_argument_list(tmp_path):
    argv = frontpage.run_command(tmp_path / "p.yaml", ["03_distribute_image", "04_ray_cluster"], tmp_path / "run")
    assert argv == [sys.executable, "-m", "sparkbook.cli", "run", "--params", str(tmp_path / "p.yaml"),
                    "--steps", "03_distribute_image,04_ray_cluster", "--out", str(tmp_path / "run")]
    with pytest.raises(Exception, match="no step"):
        frontpage.run_command(tmp_path / "p.yaml", [], tmp_path / "run")


def test_one_run_at_a_time_with_its_output_masked(monkeypatch):
    monkeypatch.setenv("FRONT_TOKEN", "s3cr3t-front-value")
    lines, codes = [], []
    runner = frontpage.Runner()
    argv = [sys.executable, "-c", "import os, time; print('hello', os.environ['FRONT_TOKEN']); time.sleep(1)"]
    assert runner.start(argv, lines.append, codes.append)
    assert not runner.start(argv, lines.append, codes.append)  # the first still runs
    deadline = time.monotonic() + 30
    while not codes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert codes == [0] and lines == ["hello ********\n"]
    assert not runner.stop()  # nothing to stop now


def test_front_page_lists_the_files_and_says_a_bad_one(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: []\n")
    monkeypatch.setenv("SPARKBOOK_PARAMS", str(bad))
    page = frontpage.FrontPage()
    assert page.path == bad and bad in page.files and ROOT / "parameters" / "lab.yaml" in page.files
    said = page.look()
    assert str(bad) in repr(said) and page.pic is None and page.steps() == []


def test_front_page_notebook_runs_without_a_widget_frontend(tmp_path):
    """papermill against a tmp parameters file and run folder: the table shows, twice alike (the
    page's cell run again in the same kernel), and the page is committed without outputs."""
    committed = nbformat.read(NOTEBOOKS / "index.ipynb", 4)
    assert all(not c.get("outputs") for c in committed.cells if c.cell_type == "code")
    twice = tmp_path / "index.ipynb"
    committed.cells.append(nbformat.v4.new_code_cell(committed.cells[-1].source))
    nbformat.write(committed, twice)
    done = papermill.execute_notebook(str(twice), str(tmp_path / "out.ipynb"), cwd=str(NOTEBOOKS),
                                      parameters={"params_file": str(_params(tmp_path)),
                                                  "run_dir": str(_run(tmp_path))}, progress_bar=False)
    shown = [[o["data"]["text/plain"] for o in c.outputs if "text/html" in o.get("data", {})]
             for c in done.cells[-2:]]
    assert shown[0] == shown[1] and len(shown[0]) == 1
    assert "deployment fronttest" in shown[0][0] and "01_preflight         failed" in shown[0][0]
    html = [o["data"]["text/html"] for o in done.cells[-1].outputs if "text/html" in o.get("data", {})][0]
    assert "<a href='01_preflight.ipynb'>01_preflight</a>" in html


def test_a_summary_of_another_deployment_is_not_read_as_this_ones(tmp_path):
    """A run folder given by hand ($SPARKBOOK_RUN_DIR) where another deployment ran: its summary's
    states are not this deployment's, and the headline says so."""
    run = _run(tmp_path)
    pic = status.picture(load(_params(tmp_path, name="other")), "other.yaml", run, NOTEBOOKS)
    states = {s.name: s.state for s in pic.steps}
    assert states["08_teardown"] == status.NOT_RUN, states  # known from the summary alone
    assert pic.foreign == "fronttest" and "deployment 'fronttest', not this one's" in pic.headline()
    same = status.picture(load(_params(tmp_path)), "fronttest.yaml", run, NOTEBOOKS)
    assert same.foreign == "" and {s.name: s.state for s in same.steps}["08_teardown"] == status.PASSED


def test_the_front_page_uses_the_hand_run_folder_only_for_the_file_the_notebooks_read(tmp_path, monkeypatch):
    mine, other = _params(tmp_path), _params(tmp_path, name="other")
    monkeypatch.setenv("SPARKBOOK_PARAMS", str(mine))
    monkeypatch.setenv("SPARKBOOK_RUN_DIR", str(tmp_path / "hand"))
    page = frontpage.FrontPage()
    assert page.run_dir == str(tmp_path / "hand")
    page.path = other.resolve()  # another file chosen in the dropdown
    assert page.run_dir is None
    assert frontpage.FrontPage(run_dir=tmp_path / "given").run_dir == tmp_path / "given"


def test_stop_sends_ctrl_c_to_the_run(tmp_path):
    """*stop the run*: sparkbook run gets SIGINT (it stops its step and runs the teardown)."""
    lines, codes = [], []
    runner = frontpage.Runner()
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGINT, lambda *_: (print('got SIGINT', flush=True), sys.exit(130)))\n"
              "print('ready', flush=True)\ntime.sleep(60)")
    assert runner.start([sys.executable, "-c", script], lines.append, codes.append)
    deadline = time.monotonic() + 30
    while "ready\n" not in lines and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner.stop()
    while not codes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert codes == [130] and "got SIGINT\n" in lines, (lines, codes)
