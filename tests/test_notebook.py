"""The notebook context: a step's outcome is recorded once, its gates join the verdict, and the
verdict carries the outcomes' key numbers."""

import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sparkbook.book.errors import CheckFailed
from sparkbook.notebook import Context
from sparkbook.params import load
from sparkbook.book.step import Outcome
from sparkbook.book.verdict import Check

import test_lock

deployment = test_lock.deployment  # a fixture: a deployment of the test's own on this machine

LOCALHOST = Path(__file__).resolve().parents[1] / "parameters" / "localhost.yaml"


@dataclass
class Counted(Outcome):
    FILE = "counted.json"
    saves: int = 0

    def save(self, run_dir):
        self.saves += 1
        return super().save(run_dir)

    def key_numbers(self):
        return [("saves", str(self.saves))]


def step(*checks):
    return types.SimpleNamespace(NAME="09_test", TITLE="test", run=lambda ctx: Counted(),
                                 checks=lambda params, outcome: list(checks))


def test_an_outcome_is_saved_once_and_its_key_numbers_and_gates_reach_the_verdict(tmp_path):
    ctx = Context(load(LOCALHOST), "test", tmp_path, step(Check("after", "n", "PASS")))
    ctx.gate([Check("before", "n", "PASS")], key="image")
    outcome = ctx.run()
    ctx.conclude(outcome)
    assert outcome.saves == 1 and (tmp_path / "counted.json").exists()
    verdict = ctx.verdict(outcome)
    assert [c.check for c in verdict.checks] == ["before", "after"]
    assert verdict.key_numbers == [("saves", "1")]
    assert (tmp_path / "verdicts" / "09_test.json").exists()


def test_a_failed_gate_ends_the_step_with_its_checks(tmp_path):
    ctx = Context(load(LOCALHOST), "test", tmp_path, step())
    with pytest.raises(CheckFailed, match="image gone"):
        ctx.gate([Check("image", "n", "FAIL", "image gone")], key="image")
    assert '"FAIL"' in (tmp_path / "verdicts" / "09_test.json").read_text()


def test_lab_parameters_are_refused_while_the_lab_is_down(monkeypatch):
    """Nothing is sent to the lab's addresses when no lab is there: they lead nowhere here."""
    from sparkbook.lab import LabError, lab as lab_module
    from sparkbook.notebook import open_cluster
    from sparkbook.params import validate
    monkeypatch.setattr(lab_module, "_links", lambda: [])  # no lab bridge on this machine
    with pytest.raises(LabError, match="sparkbook lab up"):
        open_cluster(validate(lab_module.lab_params(2)))
    assert [n.name for n in open_cluster(load(LOCALHOST)).nodes] == ["this-machine"]


# ------------------------------------------------------------- a setup cell run again (issue 16)

def test_a_setup_cell_run_again_takes_no_variable_of_the_notebook_for_a_parameter(tmp_path, monkeypatch):
    """Run again in the same namespace, start() reads the parameters as the first time: a variable
    the notebook set meanwhile under a field's name (06 once had ``model = ...``) is its own."""
    from sparkbook.notebook import start
    monkeypatch.setenv("SPARKBOOK_PARAMS", str(LOCALHOST))
    for ns in ({"params_file": None, "run_dir": str(tmp_path)},  # nothing injected: $SPARKBOOK_PARAMS
               {"params_file": str(LOCALHOST), "run_dir": str(tmp_path)},  # as `sparkbook run` injects
               {"params_file": None, "run_dir": str(tmp_path),  # papermill -f: the fields injected
                **yaml.safe_load(LOCALHOST.read_text())}):
        first = start(ns, step(), quiet=True)
        ns.update(model=first.params.served_model, name="a loop's variable", nodes=["n1"])
        again = start(ns, step(), quiet=True)
        assert again.params == first.params and again.source == first.source


def test_a_setup_cell_run_again_with_nothing_injected_failed_before(tmp_path, monkeypatch):
    """Without what the first start() found, the notebook's ``model`` is taken for an injected
    field (the ParamsError of issue 16): the namespace's memory is what tells them apart."""
    from sparkbook.notebook import STARTED, start
    from sparkbook.params import ParamsError
    monkeypatch.setenv("SPARKBOOK_PARAMS", str(LOCALHOST))
    ns = {"params_file": None, "run_dir": str(tmp_path)}
    start(ns, step(), quiet=True)
    ns["model"] = "/models/none"
    start(ns, step(), quiet=True)
    del ns[STARTED]
    with pytest.raises(ParamsError, match="model"):
        start(ns, step(), quiet=True)


def test_a_gate_the_run_made_is_replaced_by_the_next_run(tmp_path):
    """05's run gates on the memory fit; a run again that does not gate leaves no stale gate."""
    runs = iter([[Check("memory fit", "n", "WARN", "tight")], None])

    def run(ctx):
        gate = next(runs)
        if gate:
            ctx.gate(gate, key="memory")
        return Counted()
    s = step(Check("after", "n", "PASS"))
    s.run = run
    ctx = Context(load(LOCALHOST), "test", tmp_path, s)
    ctx.gate([Check("image", "n", "PASS")], key="image")
    assert [c.check for c in ctx.verdict(ctx.run()).checks] == ["image", "memory fit", "after"]
    assert [c.check for c in ctx.verdict(ctx.run()).checks] == ["image", "after"]


def test_a_setup_cell_run_again_gives_the_earlier_contexts_lock_back(deployment, tmp_path):
    """The earlier context of a state-changing step gives its lock back before the new one takes
    it: no second holder in one kernel whose heartbeat, after the new one concludes, finds the lock
    gone ("no longer this run's")."""
    from sparkbook.notebook import start
    from sparkbook.nodes.workdir import workdir
    from test_lock import step as step_named
    lock_file = Path(workdir(deployment, deployment.head), "lock")
    ns = {"params_file": str(tmp_path / "params.yaml"), "run_dir": str(tmp_path / "run")}
    first = start(ns, step_named("05_serve"), quiet=True)
    held = first.held
    assert held is not None and held.owned and lock_file.exists()
    again = start(ns, step_named("05_serve"), quiet=True)
    assert first.held is None and not held.owned and held._stop.is_set()
    assert again.held is not None and again.held.owned and lock_file.exists()
    again.conclude(Counted())
    assert not lock_file.exists()
