"""The runner, the report and the notebook convention, on small test notebooks."""

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml
from conftest import free_port
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from sparkbook.record import fingerprint
from sparkbook.runbook import runner
from sparkbook.cli import main
from sparkbook.book.errors import SparkbookError
from sparkbook.record.fingerprint import ensure as real_ensure

ROOT = Path(__file__).resolve().parents[1]
LOCALHOST = ROOT / "parameters" / "localhost.yaml"
PARAMS_CELL = "params_file = None\nrun_dir = None"


def notebook(path: Path, *sources: str) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = new_code_cell(PARAMS_CELL)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [new_markdown_cell("# test"), cell] + [new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


START = "import sparkbook as sb\nctx = sb.notebook.start(globals())"


def step_start(name: str, checks: str = "[]", title: str = "") -> str:
    """The setup cell of a notebook whose step (NAME, TITLE, checks) is defined in the cell."""
    return ("import types\nimport sparkbook as sb\nfrom sparkbook import Check\n"
            f"step = types.SimpleNamespace(NAME={name!r}, TITLE={title or name!r}, "
            f"checks=lambda params, outcome: {checks})\n"
            "ctx = sb.notebook.start(globals(), step)")


@pytest.fixture
def books(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    notebook(d / "00_first.ipynb", START, "ctx.save_json('first.json', {'name': ctx.params.name})")
    notebook(d / "01_second.ipynb", step_start("01_second", "[Check('disk', 'node-a', 'FAIL', "
                                               "'1 GB free', '100 GB', 'free some space')]", "second"),
             "ctx.conclude(sb.step.Outcome())")
    notebook(d / "02_third.ipynb", START, "open('third-ran', 'w').write('yes')")
    (d / "notes.ipynb").write_text((d / "00_first.ipynb").read_text())  # not numbered: not a step
    return d


def test_passing_run_writes_outputs_summary_and_report(books, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "passed" and [s["name"] for s in summary["steps"]] == ["00_first"]
    assert summary["steps"][0]["status"] == "passed" and summary["steps"][0]["duration_s"] > 0
    assert json.loads((out / "first.json").read_text()) == {"name": "localhost"}
    executed = nbformat.read(out / "00_first.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert f"parameters: {LOCALHOST}" in text and f"run folder: {out}" in text
    report = (out / "report.html").read_text()
    assert "00_first" in report and "PASSED" in report and "cdnjs" not in report
    assert (out / "parameters.yaml").read_text() == LOCALHOST.read_text()


def test_the_kernel_talks_over_private_unix_sockets_not_tcp_ports(books, tmp_path):
    """CI saw "Kernel died before replying to kernel_info": a TCP port jupyter_client picked was
    taken by another process before the kernel bound it. The kernel gets Unix sockets in a private
    folder instead, which the run removes."""
    notebook(books / "03_sockets.ipynb", START, "import json\nfrom ipykernel import get_connection_info\n"
             "ctx.save_json('sockets.json', get_connection_info(unpack=True))")
    out = tmp_path / "run"
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "03", "--out", str(out)]) == 0
    info = json.loads((out / "sockets.json").read_text())
    folder = Path(info["ip"]).parent
    assert info["transport"] == "ipc" and folder.name.startswith("sparkbook-kernel-")
    assert not folder.exists()  # removed with the step


def test_failing_step_stops_the_run_and_says_why(books, tmp_path):
    out = tmp_path / "run"
    code = main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--out", str(out)])
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == ["00_first", "01_second", "02_third"]
    assert steps["00_first"]["status"] == "passed"
    assert steps["01_second"]["status"] == "failed"
    err = steps["01_second"]["error"]
    assert err.startswith("CheckFailed: second: 1 check(s) failed")
    assert "disk on node-a: 1 GB free (expected 100 GB)" in err and "remedy: free some space" in err
    assert steps["02_third"] == {**steps["02_third"], "status": "skipped", "error": None}
    assert not (books / "third-ran").exists()
    assert json.loads((out / "verdicts" / "01_second.json").read_text())["status"] == "FAIL"
    report = (out / "report.html").read_text()
    assert "free some space" in report and "FAILED" in report
    # the report can be rebuilt from the folder alone
    (out / "report.html").unlink()
    assert main(["report", str(out)]) == 0 and (out / "report.html").exists()


@pytest.mark.parametrize("keep", [False, True])
def test_teardown_still_runs_after_a_failure_unless_kept(books, tmp_path, keep):
    notebook(books / "03_teardown.ipynb", START, "open('teardown-ran', 'w').write('yes')")
    out = tmp_path / "run"
    code = main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--out", str(out)]
                + (["--keep-on-failure"] if keep else []))
    summary = json.loads((out / "summary.json").read_text())
    assert code == 1 and summary["status"] == "failed"
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [
        ("00_first", "passed"), ("01_second", "failed"), ("02_third", "skipped"),
        ("03_teardown", "skipped" if keep else "passed")]
    assert (books / "teardown-ran").exists() is not keep and not (books / "third-ran").exists()


def test_a_full_disk_while_writing_the_summary_still_runs_the_teardown(books, tmp_path, monkeypatch, capsys):
    """ENOSPC on the summary after the first step: the steps after it are skipped, the teardown
    runs, the error is said and kept, the run fails."""
    notebook(books / "03_teardown.ipynb", START, "open('teardown-ran', 'w').write('yes')")
    write_text, full = Path.write_text, [True]

    def write(path, *args, **kw):
        if path.name == "summary.json.tmp" and full:
            full.clear()  # full once: the summary after the first step
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write_text(path, *args, **kw)

    monkeypatch.setattr(Path, "write_text", write)
    out = tmp_path / "run"
    code = main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert code == 1 and summary["status"] == "failed" and not full
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [
        ("00_first", "passed"), ("01_second", "skipped"), ("02_third", "skipped"), ("03_teardown", "passed")]
    assert (books / "teardown-ran").exists()
    assert "after step 00_first" in summary["error"] and "No space left on device" in summary["error"]
    assert summary["error"] in capsys.readouterr().err


def test_bad_parameters_run_nothing(books, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(LOCALHOST.read_text().replace("tensor_parallel_size: 1", "tensor_parallel_size: 0"))
    out = tmp_path / "run"
    assert main(["run", "-p", str(bad), "--notebooks", str(books), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "serving.tensor_parallel_size: Input should be greater than or equal to 1" in err
    assert "Traceback" not in err and not out.exists()


def test_unknown_step_is_refused(books, tmp_path, capsys):
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00,07",
                 "--out", str(tmp_path / "r")]) == 2
    assert "unknown step(s): 07" in capsys.readouterr().err


def test_step_selection_by_name(books, tmp_path):
    out = tmp_path / "run"
    main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "third,first", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["steps"]] == ["00_first", "02_third"]


def test_papermill_directly_with_injected_fields(tmp_path):
    """`papermill NB OUT -f parameters/X.yaml` injects the fields; the notebook validates them."""
    out = tmp_path / "out.ipynb"
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "00_inventory.ipynb"), str(out),
         "-f", str(LOCALHOST), "-p", "run_dir", str(tmp_path / "run"), "--no-progress-bar"],
        capture_output=True, text=True, cwd=ROOT / "notebooks")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = "".join(o.get("text", "") for c in nbformat.read(out, 4).cells for o in c.get("outputs", []))
    assert "parameters: injected by papermill (deployment 'localhost')" in text
    assert json.loads((tmp_path / "run" / "inventory.json").read_text())[0]["node"] == "this-machine"


def test_notebook_without_injection_uses_env_params(books, tmp_path):
    """As in JupyterLab: nothing injected; $SPARKBOOK_PARAMS names the file."""
    out = tmp_path / "out.ipynb"
    env = {**os.environ, "SPARKBOOK_PARAMS": str(LOCALHOST), "SPARKBOOK_RUN_DIR": str(tmp_path / "r")}
    proc = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute",
                           str(books / "00_first.ipynb"), "--output", str(out)],
                          capture_output=True, text=True, env=env, cwd=books)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = "".join(o.get("text", "") for c in nbformat.read(out, 4).cells for o in c.get("outputs", []))
    assert f"parameters: {LOCALHOST}" in text
    assert (tmp_path / "r" / "first.json").exists()


def test_injected_bad_field_fails_the_cell_with_the_path(tmp_path):
    out = tmp_path / "out.ipynb"
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "00_inventory.ipynb"), str(out),
         "-f", str(LOCALHOST), "-y", "ports: {api: eighty}", "--no-progress-bar"],
        capture_output=True, text=True, cwd=ROOT / "notebooks")
    assert proc.returncode != 0
    assert "ports.api: Input should be a valid integer" in proc.stderr, proc.stderr[-2000:]
    # the failure is the validation message, not a wall of frames
    executed = nbformat.read(out, 4)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "ParamsError"
    assert not any(".py" in line for line in errors[0]["traceback"])


def test_the_parameters_token_variable_is_masked_whatever_its_name(tmp_path, monkeypatch):
    from sparkbook.book import redact
    from sparkbook.params import load
    secret = "hf_customNAMEsecret98765"
    monkeypatch.setenv("SPARKBOOK_HUGGINGFACE_CRED", secret)  # a name the pattern does not catch
    monkeypatch.setattr(redact, "_named", set())
    assert secret in redact.mask(f"x {secret} y")
    data = yaml.safe_load(LOCALHOST.read_text())
    data["model"]["hf_token_env"] = "SPARKBOOK_HUGGINGFACE_CRED"
    (tmp_path / "custom.yaml").write_text(yaml.safe_dump(data))
    load(tmp_path / "custom.yaml")
    assert redact.mask(f"x {secret} y") == f"x {redact.MASK} y"


def test_report_key_numbers_commands_and_masked_secrets(books, tmp_path, monkeypatch):
    from sparkbook.record import report
    secret = "hf_reportSECRET123456"
    monkeypatch.setenv("HF_TOKEN", secret)
    notebook(books / "03_leaky.ipynb", step_start("03_leaky", "[Check('thing', 'node-a', 'PASS', "
                                                  "'ok', '', '', 'docker exec x true')]"),
             f"print('token {secret} in an output')\n"
             "from dataclasses import dataclass\n"
             "@dataclass\n"
             "class Leaks(sb.step.Outcome):\n"
             "    FILE = 'leaks.json'\n"
             "    tokens: int = 1\n"
             "    def key_numbers(self):\n"
             "        return [('leaks', f'{self.tokens} token')]\n"
             "ctx.conclude(Leaks())")
    out = tmp_path / "run"
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00,03",
                 "--out", str(out)]) == 0
    assert json.loads((out / "leaks.json").read_text()) == {"tokens": 1}
    assert dict(report.key_numbers(out)) == {"leaks": "1 token"}
    assert report.commands(out) == [("03_leaky", "node-a", "docker exec x true")]
    html = report.build(out).read_text()
    assert secret not in html and "********" in html
    assert secret not in (out / "03_leaky.ipynb").read_text()
    assert "sparkbook-key-numbers" in html and "docker exec x true" in html


def test_run_folders_are_private_and_unique_even_within_one_second(books, tmp_path, monkeypatch, capsys):
    """Two runs started in the same second get a folder each, readable by their owner alone."""
    from datetime import datetime

    from sparkbook.runbook import runner

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 30, 12, 0, 0, tzinfo=tz)

    monkeypatch.setattr(runner, "datetime", Frozen)
    monkeypatch.setattr(runner, "project_root", lambda: tmp_path)
    for _ in range(2):
        assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00"]) == 0
    folders = sorted((tmp_path / "outputs").iterdir())
    assert [f.name for f in folders] == ["20261130T120000Z-localhost", "20261130T120000Z-localhost-2"]
    for f in folders:
        assert f.stat().st_mode & 0o777 == 0o700
        assert json.loads((f / "summary.json").read_text())["run_dir"] == str(f)
    out = tmp_path / "given"
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00", "--out", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"  # a folder sparkbook did not make: its mode is not sparkbook's to change
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00", "--out", str(shared)]) == 0
    assert shared.stat().st_mode & 0o777 == 0o755
    assert f"others may read the run folder {shared}" in capsys.readouterr().err


def test_every_file_of_the_run_folder_is_masked(books, tmp_path, monkeypatch):
    """Secrets from the environment and those written in the parameters file are masked in every
    file the run leaves: verdicts, logs, step outputs, the parameters' copy, the summary."""
    env_secret, written = "hf_environmentSECRET42", "sk-writtenINparams-777"
    monkeypatch.setenv("HF_TOKEN", env_secret)
    data = yaml.safe_load(LOCALHOST.read_text())
    data["serving"]["env"] = {"MY_API_KEY": written}
    params = tmp_path / "secret.yaml"
    params.write_text(yaml.safe_dump(data))
    leak = (f"import json, pathlib\nd = pathlib.Path(ctx.run_dir)\n"
            f"s = {env_secret!r} + ' ' + {written!r}\n"
            "(d / 'verdicts').mkdir(exist_ok=True)\n(d / 'logs').mkdir(exist_ok=True)\n"
            "(d / 'verdicts' / '04_leak.json').write_text(json.dumps({'observed': s}))\n"
            "(d / 'logs' / 'serve.log').write_text(s + '\\n')\n"
            "(d / 'preflight.json').write_text(json.dumps([{'command': 'x --api-key ' + s}]))\n"
            "raise RuntimeError('failed with ' + s)")
    notebook(books / "04_leak.ipynb", START, leak)
    out = tmp_path / "run"
    assert main(["run", "-p", str(params), "--notebooks", str(books), "--steps", "04", "--out", str(out)]) == 1
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"04_leak.json", "serve.log", "preflight.json", "parameters.yaml", "summary.json",
            "04_leak.ipynb", "report.html"} <= {p.name for p in files}
    for p in files:
        text = p.read_text()
        assert env_secret not in text and written not in text, p
    assert "********" in (out / "logs" / "serve.log").read_text()


def test_the_run_takes_the_fingerprint_no_step_took_and_fails_nothing_without_it(books, tmp_path, monkeypatch,
                                                                                 capsys):
    """Issue 19: a fingerprint in every run folder: 06 and 07 take it; `sparkbook run` takes it
    after the steps where none did (before the report, which shows it), with a short timeout; one
    that cannot be taken is said and fails nothing."""
    asked = []

    def ensure(ctx, timeout):
        asked.append((ctx.run_dir, timeout))
        return fingerprint.save(fingerprint.Fingerprint(deployment=ctx.params.name), ctx.run_dir)

    monkeypatch.setattr(fingerprint, "ensure", ensure)
    out = tmp_path / "run"
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00", "--out", str(out)]) == 0
    assert asked == [(out, runner.FINGERPRINT_TIMEOUT_S)] and fingerprint.load(out).deployment == "localhost"
    assert "sparkbook-fingerprint" in (out / "report.html").read_text()
    # the folder holds one (a step took it): kept
    main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "02", "--out", str(out)])
    assert len(asked) == 1

    def down(ctx, timeout):
        raise SparkbookError("the lab is down: `sparkbook lab up`")

    monkeypatch.setattr(fingerprint, "ensure", down)
    out = tmp_path / "run-2"
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "00", "--out", str(out)]) == 0
    assert "sparkbook: no run fingerprint: SparkbookError: the lab is down" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["status"] == "passed" and (out / "report.html").exists()


def test_a_node_that_does_not_answer_leaves_an_unread_fingerprint_at_once(books, tmp_path, monkeypatch):
    """A run that failed at 00, its node not listening: the real fingerprint names it unread, at once."""
    monkeypatch.setattr(fingerprint, "ensure", real_ensure)
    (tmp_path / "known_hosts").write_text("")
    data = yaml.safe_load(LOCALHOST.read_text())
    data["nodes"] = [{"name": "spark-1", "host": "127.0.0.1", "port": free_port(), "user": "nobody", "role": "head"}]
    data["ssh"] = {"known_hosts": [str(tmp_path / "known_hosts")], "connect_timeout": 5}
    params_file = tmp_path / "down.yaml"
    params_file.write_text(yaml.safe_dump(data))
    out, t0 = tmp_path / "run", time.monotonic()
    assert main(["run", "-p", str(params_file), "--notebooks", str(books), "--steps", "00", "--out", str(out)]) == 0
    fp = fingerprint.load(out)
    assert "spark-1" in fp.unread and "cannot connect" in fp.unread["spark-1"], fp.unread
    assert time.monotonic() - t0 < 60


# a cell that prints, and whose kernel process writes to its own stderr, as the kernel's logger
# does; under pytest ipykernel leaves fd 2 as it is (it checks PYTEST_CURRENT_TEST, which the
# kernel inherits), elsewhere a cell's fd 2 is ipykernel's pipe to the cell's stderr stream
NOISY = ("import os\nprint('hello from the cell')\n"
         "os.write(2, ('kernel-process-line ' + os.environ['HF_TOKEN'] + '\\n').encode())\n"
         "get_ipython().kernel.log.warning('kernel-log-line')")


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
def test_the_terminal_shows_steps_and_cells_and_the_kernels_own_output_goes_to_a_log(
        books, tmp_path, capfd, monkeypatch, verbose):
    secret = "hf_kernelSTDERRsecret31337"
    monkeypatch.setenv("HF_TOKEN", secret)
    notebook(books / "04_noisy.ipynb", START, NOISY)
    out = tmp_path / "run"
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "04", "--out", str(out)]
                + (["-v"] if verbose else [])) == 0
    err = capfd.readouterr().err
    assert "== step 04_noisy: running" in err and "== step 04_noisy: passed in" in err
    assert f"run folder: {out}" in err and "hello from the cell" in err
    assert secret not in err
    log = out / "logs" / "kernel-04_noisy.log"
    if verbose:  # papermill's lines and the kernel's own stderr (masked), as before
        assert "Executing Cell 3" in err and "Input Notebook:" in err, err
        assert "kernel-process-line ********" in err and "kernel-log-line" in err, err
        assert not log.exists()
    else:
        assert "Executing Cell" not in err and "Ending Cell" not in err and "Input Notebook" not in err, err
        assert "kernel-process-line" not in err and "kernel-log-line" not in err, err
        text = log.read_text()
        assert "kernel-process-line ********" in text and "kernel-log-line" in text and secret not in text
        assert log.stat().st_mode & 0o777 == 0o600


# a display updated in place over ~3 s (Progress in a kernel), and an ipywidgets widget
PROGRESS = ("import time\nfrom sparkbook.book.progress import Progress\n"
            "with Progress('copy', interval=0) as p:\n"
            "    for i in range(7):\n"
            "        p.update('node-a', f'state {i}')\n"
            "        time.sleep(0.5)\n"
            "import ipywidgets\ndisplay(ipywidgets.IntSlider(value=3))")


@pytest.mark.parametrize("every", [0.2, 100.0])
def test_a_display_updated_in_place_reaches_the_terminal_throttled(books, tmp_path, capfd, monkeypatch,
                                                                    every):
    """nbclient logs no display update: the engine does, per display at most every UPDATE_EVERY_S,
    and the last state when the cell ends; no widget state is saved (the report loads no JS)."""
    from sparkbook.runbook import engine
    monkeypatch.setattr(engine, "UPDATE_EVERY_S", every)
    # a run started from the front page inherits its JupyterLab kernel's session name: the run's
    # kernels must not take it (Progress would draw widgets nobody sees, and update no text)
    monkeypatch.setenv("JPY_SESSION_NAME", "index.ipynb")
    notebook(books / "04_progress.ipynb", START, PROGRESS)
    out = tmp_path / "run"
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "04", "--out", str(out)]) == 0
    err = capfd.readouterr().err
    shown = [i for i in range(7) if f"node-a: state {i}" in err]
    if every < 1:
        assert shown[0] == 0 and shown[-1] == 6 and len(shown) >= 4, err
    else:
        assert shown == [0, 6], err  # the first state and, when the cell ended, the last
    executed = nbformat.read(out / "04_progress.ipynb", as_version=4)
    assert "IntSlider" in json.dumps(executed.cells[-1].outputs)  # the widget was displayed
    assert "widgets" not in executed.metadata
    assert "html-manager" not in (out / "report.html").read_text()


# a display whose last change comes just after one was shown, then nothing for a while: a hang
QUIET = ("import time\nfrom IPython.display import display\n"
         "h = display({'text/plain': 'phase one'}, raw=True, display_id=True)\ntime.sleep(0.2)\n"
         "h.update({'text/plain': 'phase two'}, raw=True)\ntime.sleep(4)\nprint('after the quiet')")


def test_a_display_that_goes_quiet_shows_its_last_state_without_waiting_for_the_cell(
        books, tmp_path, capfd, monkeypatch):
    """A change held back by the throttle reaches the terminal when its time comes, not only with
    the next update or at the cell's end: a stalled step shows where it stalled."""
    from sparkbook.runbook import engine
    monkeypatch.setattr(engine, "UPDATE_EVERY_S", 1.0)
    notebook(books / "04_quiet.ipynb", START, QUIET)
    assert main(["run", "-p", str(LOCALHOST), "--notebooks", str(books), "--steps", "04",
                 "--out", str(tmp_path / "run")]) == 0
    err = capfd.readouterr().err
    assert "phase one" in err and err.count("phase two") == 1, err
    assert err.index("phase two") < err.index("after the quiet"), err
