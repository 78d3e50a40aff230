"""Every cell can be run again (issue 16): a notebook whose cells are all run twice in one kernel,
as a person does in JupyterLab, gives the same checks with the same statuses both times, whether
its parameters come from a file (nothing injected), from papermill's ``-f`` (the fields injected)
or from ``sparkbook run`` (``params_file`` and ``run_dir`` injected)."""

import json
import os
from pathlib import Path

import pytest
import yaml
from nbclient import NotebookClient
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook

from test_inventory import _params_for
from test_runner import LOCALHOST, ROOT, notebook, step_start

NOTEBOOKS = ROOT / "notebooks"
PARAMETERS = {"parameters", "injected-parameters"}


def twice(path: Path, run_dir: Path, inject: dict | None = None, again_from_setup: bool = False,
          timeout: int = 300) -> list[dict]:
    """Run every cell of ``path`` twice in one kernel (``inject``: parameters papermill puts in a
    cell of their own, tagged ``injected-parameters``, as it does; ``again_from_setup``: the
    second time from the setup cell on, without the parameters' cells); per pass, the verdict
    (``verdicts/*.json`` in ``run_dir``: each check's status, the key numbers) and the errors."""
    nb = load_notebook_node(str(path))  # as papermill reads it (every cell with its tags)
    if inject is not None:
        nb = parameterize_notebook(nb, inject)
    client = NotebookClient(nb, timeout=timeout, allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    passes = []
    with client.setup_kernel():
        for n in range(2):
            (run_dir / "verdicts" / f"{path.stem}.json").unlink(missing_ok=True)  # this pass's own
            errors = []
            for i, cell in enumerate(nb.cells):
                tags = set(cell.metadata.get("tags", ()))
                if cell.cell_type == "code" and not (n and again_from_setup and tags & PARAMETERS):
                    client.execute_cell(cell, i)
                    errors += [(i, o["ename"], o["evalue"][:300]) for o in cell.outputs
                               if o.get("output_type") == "error"]
            verdicts = {}
            for f in sorted(run_dir.glob("verdicts/*.json")):
                v = json.loads(f.read_text())
                verdicts[f.stem] = {"status": v["status"], "key_numbers": v.get("key_numbers"),
                                    "checks": [(c["check"], c["node"], c["status"]) for c in v["checks"]]}
            passes.append({"verdicts": verdicts, "errors": errors})
    return passes


# A notebook's own variables under the names of parameter fields, as 06 once had (``model = ...``)
# and any loop may make (``for name in ...``): a setup cell run again took them for injected ones.
OWN_VARIABLES = ("model = ctx.params.served_model\n"
                 "for name, nodes in [('a', ['n1'])]:\n    lab = False")


@pytest.fixture
def book(tmp_path):
    checks = "[Check('disk', 'node-a', 'PASS', '90 GB free'), Check('fan', 'node-a', 'WARN', 'loud')]"
    return notebook(tmp_path / "09_rerun.ipynb", step_start("09_rerun", checks),
                    "outcome = sb.step.Outcome()", OWN_VARIABLES,
                    "print(ctx.describe())\nctx.conclude(outcome)")


def expect_the_same_twice(passes: list[dict]) -> None:
    first, second = passes
    assert first["errors"] == [] and second["errors"] == [], passes
    assert first["verdicts"] == second["verdicts"] == {"09_rerun": {
        "status": "WARN", "key_numbers": [],
        "checks": [("disk", "node-a", "PASS"), ("fan", "node-a", "WARN")]}}


def test_nothing_injected_as_in_jupyterlab(book, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("SPARKBOOK_PARAMS", str(LOCALHOST))
    monkeypatch.setenv("SPARKBOOK_RUN_DIR", str(run_dir))
    expect_the_same_twice(twice(book, run_dir))


def test_fields_injected_by_papermill(book, tmp_path, monkeypatch):
    """``papermill NB OUT -f parameters/X.yaml``: the fields are injected; run again from the setup
    cell, start() validates what it found injected the first time, not the notebook's ``model``,
    ``name``, ``nodes`` or ``lab``."""
    run_dir = tmp_path / "run"
    monkeypatch.delenv("SPARKBOOK_PARAMS", raising=False)
    inject = {**yaml.safe_load(LOCALHOST.read_text()), "run_dir": str(run_dir)}
    expect_the_same_twice(twice(book, run_dir, inject, again_from_setup=True))


def test_params_file_injected_by_sparkbook_run(book, tmp_path, monkeypatch):
    """As ``sparkbook run`` injects: ``params_file`` and ``run_dir`` (a second start used to merge
    the notebook's ``model`` and ``name`` over the file's)."""
    run_dir = tmp_path / "run"
    passes = twice(book, run_dir, {"params_file": str(LOCALHOST), "run_dir": str(run_dir)})
    expect_the_same_twice(passes)


# ------------------------------------------------------------------ the real notebooks, no lab

def real(name: str) -> Path:
    return NOTEBOOKS / f"{name}.ipynb"


def test_inventory_twice_with_injected_fields(tmp_path, monkeypatch):
    """00 against this machine (parameters/localhost.yaml, no SSH), its fields injected."""
    run_dir = tmp_path / "run"
    monkeypatch.delenv("SPARKBOOK_PARAMS", raising=False)
    first, second = twice(real("00_inventory"), run_dir,
                          {**yaml.safe_load(LOCALHOST.read_text()), "run_dir": str(run_dir)})
    assert first["errors"] == second["errors"] == []
    assert first["verdicts"] == second["verdicts"]
    assert first["verdicts"]["00_inventory"]["checks"][0] == ("reachable", "this-machine", "PASS")


@pytest.mark.parametrize("name", ["00_inventory", "01_preflight"])
def test_inventory_and_preflight_twice_over_ssh(ssh_nodes, tmp_path, monkeypatch, name):
    """00 and 01 against three sshd on loopback, nothing injected (as in JupyterLab): the same
    checks with the same statuses both times (01 fails here: no GPU, no model; the same way)."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("SPARKBOOK_PARAMS", str(_params_for(ssh_nodes, tmp_path)))
    monkeypatch.setenv("SPARKBOOK_RUN_DIR", str(run_dir))
    first, second = twice(real(name), run_dir)
    for p in (first, second):
        # The "nodes" are this machine: their clock skew (a fraction of a second at most) is how
        # long this loaded machine took to start each SSH command, and their stale processes are
        # what other work runs here meanwhile (the lab's vLLM). The head's SSH rows to the workers
        # come in the order the probes ended (peers_ssh.sh): compared in node order.
        p["verdicts"][name]["checks"] = sorted(c for c in p["verdicts"][name]["checks"]
                                               if c[0] not in ("clock", "stale processes"))
    assert first["verdicts"] == second["verdicts"] and first["verdicts"][name]["checks"]
    assert [e[:2] for e in first["errors"]] == [e[:2] for e in second["errors"]]
    assert all(e[1] == "CheckFailed" for e in first["errors"] + second["errors"]), first["errors"]
    if name == "01_preflight":  # the three are one address: the TCP probe cannot tell them apart
        assert [c for c in first["verdicts"][name]["checks"] if c[0] == "tcp ports"] == [
            ("tcp ports", "node0, node1, node2", "SKIP")]
    statuses = {c[2] for c in first["verdicts"][name]["checks"]}
    assert ("FAIL" in statuses) == bool(first["errors"])


# ---------------------------------------------------------------------------- on the lab

@pytest.mark.skipif(not os.environ.get("SPARKBOOK_RERUN_LAB"),
                    reason="the JupyterLab test (tests/test_jupyterlab.py) runs every notebook twice in "
                    "one kernel on the lab already; SPARKBOOK_RERUN_LAB=1 runs this one too")
def test_every_notebook_twice_in_one_kernel_on_the_lab(lab, tmp_path, monkeypatch):
    """00..08 against the lab, each run twice in one kernel with nothing injected: the same checks
    with the same statuses both times (a second 03 copies nothing, a second 04/05 keeps what runs,
    a second 08 finds nothing left), and no error in either pass."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("SPARKBOOK_PARAMS", str(ROOT / "parameters" / "lab.yaml"))
    monkeypatch.setenv("SPARKBOOK_RUN_DIR", str(run_dir))
    differ = {}
    for path in sorted(NOTEBOOKS.glob("0[0-8]_*.ipynb")):
        first, second = twice(path, run_dir, timeout=1800)  # a cell's limit: 05's start-up, 07's sweep
        assert first["errors"] == [] and second["errors"] == [], (path.name, first, second)
        a, b = first["verdicts"][path.stem], second["verdicts"][path.stem]
        if (a["status"], a["checks"]) != (b["status"], b["checks"]):
            differ[path.stem] = (a, b)
    assert differ == {}
