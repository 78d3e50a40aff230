"""06's known answers: recorded with the run's fingerprint; the same fingerprint answering the same
passes, answering differently fails naming the prompt, the earlier run and where; another
fingerprint is not compared.

The fake server's answers depend on how many requests it has seen: a fresh server answers the
known prompts the same way every time, one asked before answers them differently."""

import json
from pathlib import Path

import pytest
import yaml
from fake_openai import FakeOpenAI

from sparkbook.smoke import known_answers as known
from sparkbook import notebook
from sparkbook.book.errors import CheckFailed
from sparkbook.params import validate
from sparkbook.smoke.api import SmokeTest
from sparkbook.steps import smoke as step
from sparkbook.book.verdict import FAIL, PASS, SKIP


def ask(server: FakeOpenAI, run_dir: Path, key: str = "k1") -> tuple[known.KnownAnswers, object]:
    run_dir.mkdir(parents=True, exist_ok=True)
    k = known.run(server.url, "fake-model", key, run_dir, max_tokens=32, timeout=10)
    k.save(run_dir)
    [check] = known.checks(k)
    return k, check


def test_first_run_is_recorded_greedy_one_at_a_time(tmp_path):
    with FakeOpenAI() as server:
        k, check = ask(server, tmp_path / "run-1")
    assert check.status == PASS and check.observed == "recorded, first run of this fingerprint (k1)"
    assert [b["messages"][0]["content"] for b in server.requests] == list(known.PROMPTS)
    assert all(b["temperature"] == 0 and b["max_tokens"] == 32 and b["ignore_eos"] and b["return_token_ids"]
               for b in server.requests)
    assert [len(a["token_ids"]) for a in k.answers] == [32] * 4  # as the server streamed them
    saved = json.loads((tmp_path / "run-1" / "smoke" / "known_answers.json").read_text())
    assert saved["fingerprint"] == "k1" and saved["run"] == "run-1" and saved["max_tokens"] == 32
    assert [a["output_tokens"] for a in saved["answers"]] == [32] * 4 and saved["answers"][0]["text"]
    assert saved["answers"][0]["token_ids"] == [*range(1, 10), 0] * 3 + [1, 2]  # the fake's word indices
    assert [r[0] for r in known.table(k).rows] == list(known.PROMPTS)


def test_same_fingerprint_same_answers_passes(tmp_path):
    for run in ("run-1", "run-2"):
        with FakeOpenAI() as server:
            _, check = ask(server, tmp_path / run)
    assert check.status == PASS
    assert check.observed == f"4 answers the same as {tmp_path / 'run-1'} (fingerprint k1)"


def test_same_fingerprint_different_answers_fails_naming_prompt_run_and_where(tmp_path):
    with FakeOpenAI() as server:
        first, _ = ask(server, tmp_path / "run-1")
        second, check = ask(server, tmp_path / "run-2")  # the same server, further on: other words
    assert check.status == FAIL
    assert check.observed.startswith(f"4 of 4 differ from {tmp_path / 'run-1'}, the same fingerprint k1: "
                                     f"'{known.PROMPTS[0]}' at token 1 (ID 5 now, ID 1 then): now 'mat and")  # from the text's 2nd character
    assert "silent numerical corruption" in check.remedy and "Rerun 06" in check.remedy
    assert second.compared_with == str(tmp_path / "run-1")


def test_another_fingerprint_is_not_compared(tmp_path):
    with FakeOpenAI() as server:
        ask(server, tmp_path / "run-1", key="k1")
        k, check = ask(server, tmp_path / "run-2", key="k2")  # answers differ, but so does the fingerprint
    assert check.status == PASS and k.compared_with is None and not k.differences
    assert check.observed == "recorded, first run of this fingerprint (k2); not compared with 1 earlier " \
                             "run(s) of other fingerprints (newest run-1)"


def record(run_dir: Path, key: str, recorded: str, token_ids: list[int], text: str = "one two",
           max_tokens: int = 32, prompt: str = known.PROMPTS[0], error: str = "") -> None:
    path = run_dir / known.KnownAnswers.FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"fingerprint": key, "recorded": recorded, "max_tokens": max_tokens, "answers": [
        {"prompt": prompt, "text": text, "token_ids": token_ids, "error": error}]}))


def test_token_ids_are_compared_with_the_newest_run_of_the_fingerprint(tmp_path):
    now = [{"prompt": known.PROMPTS[0], "text": "one two", "token_ids": [5, 6, 7], "error": ""}]
    record(tmp_path / "old", "k1", "2026-01-01T00:00:00+00:00", [5, 6, 9])
    record(tmp_path / "new", "k1", "2026-02-01T00:00:00+00:00", [5, 6, 7])
    record(tmp_path / "newest-other", "k2", "2026-03-01T00:00:00+00:00", [1])
    (tmp_path / "broken" / "smoke").mkdir(parents=True)
    (tmp_path / "broken" / known.KnownAnswers.FILE).write_text("{not json")
    assert known.compare(now, "k1", tmp_path / "this", 32) == \
        (str(tmp_path / "new"), 1, [], [str(tmp_path / "newest-other")])
    (tmp_path / "new" / known.KnownAnswers.FILE).unlink()
    folder, n, diffs, _ = known.compare(now, "k1", tmp_path / "this", 32)
    assert folder == str(tmp_path / "old") and n == 1
    assert diffs == [f"'{known.PROMPTS[0]}' at token 3 (ID 7 now, ID 9 then): now 'one two', then 'one two'"]


def test_an_earlier_run_with_nothing_to_compare_is_passed_over(tmp_path):
    now = [{"prompt": known.PROMPTS[0], "text": "one two", "token_ids": [5, 6, 7], "error": ""}]
    record(tmp_path / "old", "k1", "2026-01-01T00:00:00+00:00", [5, 6, 9])
    record(tmp_path / "failed", "k1", "2026-02-01T00:00:00+00:00", [5, 6, 7], error="HTTP 500: injected failure")
    record(tmp_path / "other-prompts", "k1", "2026-03-01T00:00:00+00:00", [5, 6, 7], prompt="No longer asked.")
    folder, n, diffs, _ = known.compare(now, "k1", tmp_path / "this", 32)
    assert (folder, n) == (str(tmp_path / "old"), 1) and len(diffs) == 1  # the difference is found
    (tmp_path / "old" / known.KnownAnswers.FILE).unlink()
    assert known.compare(now, "k1", tmp_path / "this", 32) == (None, 0, [], [])  # recorded, the first
    # a row says how many were compared, and how many not
    k = known.KnownAnswers("k1", "this", "m", 32, now + [{**now[0], "prompt": known.PROMPTS[1]}],
                           compared_with="old", compared=1)
    assert known.checks(k)[0].observed == "1 answers the same as old (fingerprint k1); 1 not compared " \
                                          "(not answered there)"


def test_every_request_has_a_cache_salt_of_its_own(tmp_path):
    """A prompt asked before (an earlier 06 against the same server) is not answered from vLLM's
    prefix cache: another prefill path could flip a greedy token."""
    with FakeOpenAI() as server:
        known.ask(server.url, "fake-model", max_tokens=4)
        known.ask(server.url, "fake-model", max_tokens=4)
    salts = [b.get("cache_salt") for b in server.requests]
    assert len(salts) == 8 and all(isinstance(x, str) and x.startswith("sparkbook-known-") for x in salts)
    assert len(set(salts)) == 8


def test_an_incomplete_fingerprint_is_not_compared(tmp_path):
    with FakeOpenAI() as server:
        ask(server, tmp_path / "run-1", key="k1")
        (tmp_path / "run-2").mkdir()
        k = known.run(server.url, "fake-model", "k1", tmp_path / "run-2", max_tokens=32, timeout=10,
                      unread={"spark-2": "ssh: connection refused"})  # answers differ: not compared
    [check] = known.checks(k)
    assert check.status == SKIP and k.compared_with is None and not k.differences
    assert check.observed == "not compared: fingerprint incomplete (spark-2: ssh: connection refused); " \
                             "4 answers recorded"
    assert len(k.answers) == 4 and all(a["text"] for a in k.answers)


def test_first_difference():
    a = {"text": "Mercury, Venus, Earth", "token_ids": None}
    assert known.first_difference(a, dict(a)) == ""
    assert known.first_difference(a, {"text": "Mercury, Venus, Mars"}) == "at character 17: now 'Earth', then 'Mars'"
    assert known.first_difference({"text": "ab", "token_ids": [1, 2]}, {"text": "ab", "token_ids": [1, 2, 3]}) \
        .startswith("at token 3 (the end now, ID 3 then)")
    # another max_tokens: the shorter answer is compared with the start of the longer
    assert known.first_difference({"text": "ab", "token_ids": [1, 2]}, {"text": "abc", "token_ids": [1, 2, 3]},
                                  prefix=True) == ""
    assert known.first_difference({"text": "ab", "token_ids": [1, 4]}, {"text": "abc", "token_ids": [1, 2, 3]},
                                  prefix=True).startswith("at token 2 (ID 4 now, ID 2 then)")


def test_a_request_that_fails_fails_the_row():
    with FakeOpenAI(fail_requests={2}) as server:
        k = known.KnownAnswers("k1", "run", "fake-model", 32, known.ask(server.url, "fake-model", max_tokens=32))
    [check] = known.checks(k)
    assert check.status == FAIL and check.observed == f"'{known.PROMPTS[1]}': HTTP 500: injected failure"


class Key:
    unread: dict = {}

    def key(self, benchmark: bool = True) -> str:
        assert benchmark is False  # the benchmark's settings change no answer
        return "k-step"


def test_the_notebook_cell_keeps_it_with_the_fingerprint_and_joins_the_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr(step.fingerprint, "ensure", lambda ctx: Key())
    data = yaml.safe_load((Path(__file__).parents[1] / "parameters" / "localhost.yaml").read_text())
    data["serving"].update(served_model_name="fake-model")
    for run, fresh in (("run-1", True), ("run-2", True), ("run-3", False)):
        with FakeOpenAI() as server:
            if not fresh:
                known.ask(server.url, "fake-model", max_tokens=8)  # moves the fake's words on
            data["serving"]["api_url"] = server.url
            ctx = notebook.Context(validate(data), "test", tmp_path / run, step)
            (tmp_path / run).mkdir()
            outcome = SmokeTest(server.url + "/v1", "fake-model")
            k = step.known_answers(ctx, outcome)
        assert outcome.known_answers is k and k.fingerprint == "k-step"
        assert (tmp_path / run / "smoke" / "known_answers.json").is_file()
        if fresh:
            ctx.conclude(outcome)
    saved = json.loads((tmp_path / "run-2" / "verdicts" / "06_smoke_test.json").read_text())
    assert [(c["check"], c["status"]) for c in saved["checks"]] == [("known answers", "PASS")]
    assert "the same as" in saved["checks"][0]["observed"] and "run-1" in saved["checks"][0]["observed"]
    with pytest.raises(CheckFailed, match="known answers"):
        ctx.conclude(outcome)
    # the "Requests" cell run again: the new SmokeTest keeps the known answers, and their FAIL
    monkeypatch.setattr(step.smoke, "run", lambda *a, **kw: SmokeTest("api", "fake-model"))
    again = ctx.run()
    assert again is not outcome and again.known_answers is k and again.burn_in is None
    with pytest.raises(CheckFailed, match="known answers"):
        ctx.conclude(again)
