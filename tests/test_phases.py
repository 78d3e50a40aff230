"""The phase an engine's start-up log reached (sparkbook.facts.phases): SGLang's on real public
logs (tests/fixtures/phases/, each naming its source), vLLM's on a real DGX Spark pair's log, and
`sparkbook diagnose` saying it."""

import json
from pathlib import Path

from conftest import field_sample

from sparkbook.cli import main
from sparkbook.facts import phases

ROOT = Path(__file__).resolve().parents[1]
PHASE_LOGS = ROOT / "tests" / "fixtures" / "phases"
LOGS = ROOT / "tests" / "fixtures" / "logs"


def lines_of(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# source: https://") and lines[1].startswith("# note: ")
    return lines[2:]


def test_sglang_start_ups_are_read_phase_by_phase():
    one = lines_of(PHASE_LOGS / "sglang-startup-1.txt")
    assert phases.reached(one).engine == "sglang"
    begun = next(i for i, ln in enumerate(one) if "Init torch distributed begin" in ln)
    # stopped after the distributed initialisation began (the seed's hang): in distributed init
    cut = phases.reached(one[:begun + 4])
    assert (cut.engine, cut.phase, cut.line) == ("sglang", "distributed init", begun + 1)
    assert phases.reached(one).phase == "weights"
    assert phases.reached(lines_of(PHASE_LOGS / "sglang-startup-2.txt")).phase == "graph capture"
    three = phases.reached(lines_of(PHASE_LOGS / "sglang-startup-3.txt"))
    assert (three.engine, three.phase) == ("sglang", "api") and "Capture cuda graph end" in three.text


def test_a_vllm_start_up_on_two_sparks_reaches_the_api_and_phases_never_go_back():
    lines = field_sample("vllm-ray-head-startup-1.txt").splitlines()
    done = phases.reached(lines)
    assert (done.engine, done.phase) == ("vllm", "api")
    weights = next(i for i, ln in enumerate(lines) if "Loading weights" in ln or "Loading safetensors" in ln)
    assert phases.reached(lines[:weights + 1]).phase == "weights"
    assert phases.reached(lines[:weights + 1] + ["INFO world_size=2 rank=1"]).phase == "weights"


def test_diagnose_says_how_far_a_start_up_got(capsys):
    log = LOGS / "cross-node-init-hang-1.txt"
    assert main(["diagnose", str(PHASE_LOGS / "sglang-startup-1.txt")]) == 0
    # where the phase began: the distributed init's end (two header lines, then its seventh line)
    assert "sglang start-up reached 'weights' at line 9: " in capsys.readouterr().out
    assert main(["diagnose", "--json", str(log)]) == 1
    report = json.loads(capsys.readouterr().out)[0]
    assert report["engine"] == "sglang" and report["findings"][0]["name"] == "cross-node-init-hang"
