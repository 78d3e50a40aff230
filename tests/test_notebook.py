"""The notebook context: a step's outcome is recorded once, its gates join the verdict, and the
verdict carries the outcomes' key numbers."""

import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkbook.errors import CheckFailed
from sparkbook.notebook import Context
from sparkbook.params import load
from sparkbook.step import Outcome
from sparkbook.verdict import Check

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
