"""Day two, the upgrade gate (issue 29), without the lab: the candidate run held against the
baseline run (steps, known answers, single-user decode and peak throughput), and the tag the
previous image is kept under."""

import json

from sparkbook.book.verdict import FAIL, PASS, WARN
from sparkbook.lab import lab_params
from sparkbook.params import validate
from sparkbook.runbook import upgrade

from test_compare import make_run


def _answers(d, texts):
    (d / "smoke").mkdir(exist_ok=True)
    (d / "smoke" / "known_answers.json").write_text(json.dumps({"answers": [
        {"prompt": f"prompt {i}", "text": t} for i, t in enumerate(texts)]}))


def _rows(checks):
    return {c.check: c for c in checks}


def test_a_candidate_that_answers_the_same_at_the_same_speed_passes_the_gate(tmp_path):
    base = make_run(tmp_path, "base", started="2026-12-05T10:00:00+00:00", tok_s=(4.4, 9.1))
    cand = make_run(tmp_path, "cand", started="2026-12-05T11:00:00+00:00", tok_s=(4.2, 9.3))
    _answers(base, ["one two", "A B C"])
    _answers(cand, ["one two", "A B C"])
    summary = {"steps": [{"name": n, "status": "passed"} for n in ("03_x", "04_x", "05_x", "06_x", "07_x")]}
    rows = _rows(upgrade.gate(base, cand, summary, 0.9))
    assert {k: r.status for k, r in rows.items()} == {
        "upgrade steps": PASS, "upgrade known answers": PASS, "upgrade single-user decode": PASS,
        "upgrade peak output throughput": PASS}
    assert rows["upgrade single-user decode"].observed == "4.2 tok/s, 0.95x the baseline's 4.4"


def test_a_failed_step_another_answer_or_a_slower_candidate_fails_the_gate_by_name(tmp_path):
    base = make_run(tmp_path, "base", started="2026-12-05T10:00:00+00:00", tok_s=(4.4, 9.1))
    cand = make_run(tmp_path, "cand", started="2026-12-05T11:00:00+00:00", tok_s=(2.0, 9.0))
    _answers(base, ["one two", "A B C"])
    _answers(cand, ["one two", "A B D"])
    summary = {"steps": [{"name": "06_smoke_test", "status": "failed"}, {"name": "07_benchmark", "status": "skipped"}]}
    rows = _rows(upgrade.gate(base, cand, summary, 0.9))
    assert rows["upgrade steps"].status == FAIL
    assert rows["upgrade steps"].observed == "06_smoke_test failed, 07_benchmark skipped"
    assert rows["upgrade known answers"].status == WARN and rows["upgrade known answers"].observed == "differ for: 'prompt 1'"
    assert rows["upgrade single-user decode"].status == FAIL and "0.45x" in rows["upgrade single-user decode"].observed
    assert rows["upgrade peak output throughput"].status == PASS  # 9.0 of 9.1
    # a candidate with no 06 and no 07 (an earlier step failed)
    empty = tmp_path / "empty"
    empty.mkdir()
    rows = _rows(upgrade.gate(base, empty, summary, 0.9))
    assert rows["upgrade known answers"].status == FAIL and "gave none" in rows["upgrade known answers"].observed
    assert rows["upgrade single-user decode"].status == FAIL
    assert rows["upgrade single-user decode"].observed == "none: 07 did not run on the candidate"


def test_a_baseline_without_07_fails_the_numbers_it_cannot_compare(tmp_path):
    base = make_run(tmp_path, "base", started="2026-12-05T10:00:00+00:00", tok_s=None)
    cand = make_run(tmp_path, "cand", started="2026-12-05T11:00:00+00:00")
    rows = _rows(upgrade.gate(base, cand, {"steps": []}, 0.9))
    assert rows["upgrade single-user decode"].status == FAIL and "has no 07 result" in rows["upgrade single-user decode"].observed


def test_the_previous_image_is_kept_in_the_repository_of_the_tag():
    data = lab_params(2)
    for image, kept in (("hellohal2064/vllm-qwen3.5-gb10:latest", "hellohal2064/vllm-qwen3.5-gb10:sparkbook-previous"),
                        ("registry:5000/team/vllm", "registry:5000/team/vllm:sparkbook-previous"),
                        ("nvcr.io/nvidia/vllm:25.11-py3", "nvcr.io/nvidia/vllm:sparkbook-previous")):
        data["runtime"]["image"] = image
        assert upgrade.keep_tag(validate(data)) == kept
