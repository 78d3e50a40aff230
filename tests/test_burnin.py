"""06's burn-in against the fake vLLM: a healthy server passes; a failed request, a wrong length, a
server that slows as it runs or is not there fails, naming what; the drift arithmetic both ways."""

import csv
import json
from pathlib import Path

import pytest
import yaml
from conftest import free_port
from fake_openai import FakeOpenAI

from sparkbook.smoke import burnin
from sparkbook import notebook
from sparkbook.bench.client import Answer
from sparkbook.bench.records import RequestRecord
from sparkbook.smoke.burnin import Row
from sparkbook.book.errors import CheckFailed
from sparkbook.params import ParamsError, validate
from sparkbook.book.samples import MIN_GROUP
from sparkbook.params.settings import Smoke
from sparkbook.smoke.api import SmokeTest
from sparkbook.steps import smoke as step
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN, Check

SHORT = dict(requests=8, prompt_tokens=(8, 64), output_tokens=(4, 16), soak_s=1.0, soak_concurrency=2,
             soak_prompt_tokens=16, soak_output_tokens=8, timeout_s=10)


def burn(server: FakeOpenAI, **kw) -> tuple[burnin.BurnIn, dict]:
    b = burnin.run(server.url, "fake-model", Smoke(**{**SHORT, **kw}), progress=False, say=lambda _: None)
    return b, {c.check: c for c in burnin.checks(b)}


def test_a_healthy_server_passes_with_the_lengths_asked_for_and_keeps_every_request(tmp_path):
    with FakeOpenAI(token_delay=0.004) as server:
        b, rows = burn(server, drift_limit=3.0)  # 3: wall-clock jitter of a test machine, not drift
    assert {c.status for c in rows.values()} == {PASS}, rows
    plan = burnin.lengths(Smoke(**SHORT), 4096)
    sent = server.requests[:8]
    assert [(r.prompt_target, r.output_target) for r in b.sequential] == plan
    assert [body["max_tokens"] for body in sent] == [o for _, o in plan] and all(x["ignore_eos"] for x in sent)
    assert len({o for _, o in plan}) > 1 and len({p for p, _ in plan}) > 1  # mixed lengths
    assert [r.prompt_tokens for r in b.sequential] == [p for p, _ in plan]  # exact, by /tokenize
    assert b.third >= MIN_GROUP and b.third == len(b.soak) // 3
    seq = rows["burn-in sequential"].observed
    assert seq.startswith("8/8: prompt") and "valid UTF-8; finish length" in seq
    assert "none failed" in rows["soak"].observed and "x" in rows["soak drift"].observed
    b.save(tmp_path)
    saved = json.loads((tmp_path / "smoke" / "burn_in.json").read_text())
    assert saved["settings"]["requests"] == 8 and len(saved["sequential"]) == 8
    with open(tmp_path / "smoke" / "burn_in.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 8 + len(b.soak) and table[0]["phase"] == "sequential" and table[-1]["phase"] == "soak"
    assert dict(b.key_numbers())["burn-in"].startswith("8/8 sequential")
    assert [row[0] for row in burnin.table(b).rows] == ["sequential", "soak", "soak: first third", "soak: last third"]


def test_the_sixth_request_failing_fails_the_burn_in_naming_it():
    with FakeOpenAI(fail_requests={6}) as server:
        b, rows = burn(server)
    seq = rows["burn-in sequential"]
    plan = burnin.lengths(Smoke(**SHORT), 4096)
    assert seq.status == FAIL
    assert seq.observed.startswith(f"request 6 of 8 (prompt {plan[5][0]} tokens, output {plan[5][1]}): "
                                   "HTTP 500: injected failure"), seq.observed
    assert len(b.sequential) == 8  # the rest were still sent
    assert rows["soak"].status == SKIP and "sequential requests failed" in rows["soak"].observed
    assert rows["soak drift"].status == SKIP and not b.soak


def test_a_request_failing_during_the_soak_fails_it_naming_it():
    with FakeOpenAI(fail_requests={10}) as server:  # the 8 sequential requests are 1-8
        _, rows = burn(server)
    soak = rows["soak"]
    assert rows["burn-in sequential"].status == PASS and soak.status == FAIL, soak
    assert "1 of " in soak.observed and "HTTP 500: injected failure" in soak.observed


def test_a_server_that_writes_past_max_tokens_fails():
    with FakeOpenAI(extra_tokens=1) as server:
        _, rows = burn(server, soak_s=0)
    seq = rows["burn-in sequential"]
    assert seq.status == FAIL and seq.observed.startswith("request 1 of 8")
    assert "by the server's usage, not the" in seq.observed and "8 sent failed" in seq.observed
    assert "ignore_eos" in seq.remedy


def test_a_server_that_slows_as_it_runs_fails_the_drift():
    # the fake's 21st generation request on (the soak's 13th) writes ten times slower
    with FakeOpenAI(token_delay=lambda n: 0.002 if n <= 20 else 0.02) as server:
        b, rows = burn(server, requests=8, soak_s=1.5)
    assert rows["soak"].status == PASS and rows["soak drift"].status == FAIL, rows["soak drift"]
    assert b.drift.ratio > 3 and b.drift.p < 0.01 and "throttling" in rows["soak drift"].remedy
    assert f"({b.third} requests each): " in rows["soak drift"].observed
    assert "rank test p = " in rows["soak drift"].observed


def test_one_request_delayed_by_a_neighbour_does_not_fail_the_drift():
    """The README's first command failed this way on a busy machine: 9 requests a third, the
    slowest of the last third 4.9x the first's slowest. The median and the rank test do not move."""
    last = [300.0] * 8 + [4400.0]
    b, check = drift([300.0] * 9 + [310.0] * 9 + last, limit=3.0)
    assert check.status == PASS, check
    assert b.drift.ratio == 1.0 and "(9 requests each)" in check.observed


def test_a_slowdown_that_is_large_but_not_consistent_is_a_warning():
    # the last third's median moves (5 of 9 slow) but the rank test cannot tell it from chance
    first = [100.0, 400.0] * 4 + [100.0]
    last = [100.0] * 4 + [401.0] * 5
    b, check = drift(first + [200.0] * 9 + last, limit=1.5)
    assert b.drift.ratio > 1.5 and b.drift.p >= 0.01 and check.status == WARN, check
    assert "not consistently" in check.observed


def test_no_server_fails_at_once_and_sends_nothing():
    b = burnin.run(f"http://127.0.0.1:{free_port()}", "fake-model", Smoke(**SHORT), progress=False,
                   say=lambda _: None)
    rows = {c.check: c for c in burnin.checks(b)}
    assert rows["burn-in sequential"].status == FAIL and "not run: " in rows["burn-in sequential"].observed
    assert rows["soak"].status == SKIP and not b.sequential


def rows_at(e2e_ms: list[float]) -> list[Row]:
    return [Row("soak", i + 1, 16, 8, ok=True, sent_s=i * 0.1, e2e_ms=v) for i, v in enumerate(e2e_ms)]


def drift(e2e_ms: list[float], limit: float = 1.5):
    b = burnin.BurnIn("api", "m", Smoke().model_dump(mode="json"), soak=rows_at(e2e_ms))
    return b, burnin.drift_check(b, limit, "")


def test_drift_compares_the_medians_of_the_first_and_last_thirds_in_sending_order():
    steady = [100.0, 101.0] * 4 + [110.0] * 8 + [120.0, 121.0] * 4
    slowing = [100.0, 101.0] * 4 + [150.0] * 8 + [200.0, 201.0] * 4
    b, check = drift(steady)
    assert (b.drift.earlier_median, b.drift.later_median, b.third) == (100.5, 120.5, 8)
    assert check.status == PASS, check
    b, check = drift(slowing)
    assert round(b.drift.ratio, 2) == 2.0 and b.drift.p < 0.001 and check.status == FAIL
    assert "median E2E 100 ms in the first third, 200 ms in the last (8 requests each)" in check.observed
    assert drift(slowing, limit=2.5)[1].status == PASS
    # the order requests were sent in decides the thirds, not the order they were recorded in
    shuffled = list(reversed(rows_at(slowing)))
    first, last = burnin.thirds(shuffled)
    assert {r.e2e_ms for r in first} == {100.0, 101.0} and {r.e2e_ms for r in last} == {200.0, 201.0}
    # failed requests are not timed; too few to judge is a warning, never a failure
    assert burnin.thirds(rows_at([1.0, 2.0])) == ([], [])
    few = drift([100.0] * 7 + [100.0] * 7 + [900.0] * 7)
    assert few[1].status == WARN and "too few samples to judge drift (at least 8)" in few[1].observed
    assert b.to_json()["drift"]["per_third"] == 8 and b.to_json()["drift"]["p"] < 0.001


def test_problem_of_an_answer():
    rec = RequestRecord(1, ok=True, output_tokens=8, finish_reason="length")
    assert burnin.problem(rec, 8, Answer(["fine ", "text é"])) == ""
    assert "not valid UTF-8" in burnin.problem(rec, 8, Answer(["bad \ud800 half"]))
    assert burnin.problem(RequestRecord(1, ok=True, output_tokens=8), 8) == "no finish reason"
    assert burnin.problem(rec, 7).startswith("8 output tokens by the server's usage, not the 7")
    assert burnin.problem(RequestRecord(1, error="HTTP 500: x"), 8) == "HTTP 500: x"


def test_lengths_are_seeded_and_fit_the_model():
    s = Smoke(requests=50, prompt_tokens=(10, 3000), output_tokens=(5, 300), seed=3)
    other = Smoke(**{**s.model_dump(), "seed": 4})
    assert burnin.lengths(s, None) == burnin.lengths(s, None) != burnin.lengths(other, None)
    assert all(10 <= p <= 3000 and 5 <= o <= 300 for p, o in burnin.lengths(s, None))
    assert all(p + o <= 1024 for p, o in burnin.lengths(s, 1024))


def test_the_settings():
    lab = yaml.safe_load((Path(__file__).parents[1] / "parameters" / "lab.yaml").read_text())
    assert validate(lab).smoke.soak_s < Smoke().soak_s  # the lab soaks briefly
    with pytest.raises(ParamsError, match="smoke.prompt_tokens"):
        validate({**lab, "smoke": {"prompt_tokens": [100, 10]}})
    assert Smoke().requests == 20 and Smoke().drift_limit == 1.5 and Smoke().soak_concurrency == 4


def context(tmp_path, url: str, **smoke) -> notebook.Context:
    data = yaml.safe_load((Path(__file__).parents[1] / "parameters" / "localhost.yaml").read_text())
    data["serving"].update(api_url=url, served_model_name="fake-model")
    data["smoke"] = {**SHORT, "drift_limit": 3.0, **smoke}
    return notebook.Context(validate(data), "test", tmp_path, step)


def test_the_notebook_cells_keep_it_and_its_checks_join_the_verdict(tmp_path, monkeypatch):
    """06's cells: the smoke checks (test_smoke.py runs them; one stands for them here), then
    step.burn_in, then the verdict."""
    with FakeOpenAI(token_delay=0.004) as server:
        ctx = context(tmp_path, server.url)
        outcome = ctx.record(SmokeTest(server.url + "/v1", "fake-model", [Check("model listed", "api", PASS)]))
        b = step.burn_in(ctx, outcome, progress=False)
    assert outcome.burn_in is b and (tmp_path / "smoke" / "burn_in.csv").is_file()
    ctx.conclude(outcome)
    saved = json.loads((tmp_path / "verdicts" / "06_smoke_test.json").read_text())
    names = [c["check"] for c in saved["checks"]]
    # and this machine's health, watched while it served (sparkbook/serving/health.py)
    assert names == ["model listed", "burn-in sequential", "soak", "soak drift", "serving health"], names
    assert saved["status"] == "PASS" and (tmp_path / "health" / "burn-in.csv").is_file()
    assert dict(saved["key_numbers"])["burn-in"].startswith("8/8 sequential")

    # the "Requests" cell run again: a new SmokeTest, whose verdict still holds the burn-in's checks
    monkeypatch.setattr(step.fingerprint, "ensure", lambda ctx: None)
    monkeypatch.setattr(step.smoke, "run", lambda *a, **kw: SmokeTest("api", "fake-model", [
        Check("model listed", "api", PASS)]))
    again = ctx.run()
    assert again is not outcome and again.burn_in is b and again.known_answers is None
    ctx.conclude(again)
    saved = json.loads((tmp_path / "verdicts" / "06_smoke_test.json").read_text())
    assert [c["check"] for c in saved["checks"]] == names

    with FakeOpenAI(fail_requests={3}) as server:  # the smoke checks passed (not sent again here)
        ctx = context(tmp_path / "failing", server.url, soak_s=0)
        outcome = SmokeTest(server.url + "/v1", "fake-model")
        step.burn_in(ctx, outcome, progress=False)
    with pytest.raises(CheckFailed, match="burn-in sequential"):
        ctx.conclude(outcome)
