"""The smoke test against a fake vLLM: each check passes on a healthy server and fails on the fault
it exists for."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import free_port
from fake_openai import FakeOpenAI

from sparkbook import endpoint, notebook, smoke
from sparkbook.errors import CheckFailed
from sparkbook.params import validate
from sparkbook.steps import smoke as step
from sparkbook.verdict import FAIL, PASS, SKIP, WARN, Verdict


def rows(outcome: smoke.SmokeTest) -> dict:
    return {c.check: c for c in outcome.checks}


def check(server: FakeOpenAI, **kw) -> dict:
    return rows(smoke.run(server.url, "fake-model", timeout=5, **kw))


def test_healthy_server_passes_every_check_and_says_what_it_sent():
    with FakeOpenAI() as server:
        outcome = smoke.run(server.url + "/v1/", "fake-model", timeout=5)
    r = rows(outcome)
    v = Verdict(step.TITLE, step.checks(None, outcome))
    assert v.title == "smoke test" and v.status == PASS, v.to_text()
    assert outcome.api == server.url + "/v1" and outcome.model == "fake-model"
    assert {c.status for n, c in r.items() if n != "reasoning"} == {PASS}
    assert r["reasoning"].status == SKIP
    assert all(c.node == "api" and c.command for n, c in r.items() if n != "reasoning")
    assert "stopped at 'e'" in r["stop"].observed
    assert "404" in r["unknown model"].observed
    assert json.loads(r["tool call"].observed.removeprefix("get_weather(").removesuffix(")")) == \
        {"city": "Paris", "unit": "celsius"}
    stream = next(b for b in server.requests if b.get("stream"))
    assert stream["stream_options"] == {"include_usage": True}
    tool = next(b for b in server.requests if "tools" in b)
    assert tool["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "chat_template_kwargs" not in tool  # only with a reasoning parser


def test_missing_usage_fails_the_chat_checks():
    with FakeOpenAI(usage=False) as server:
        r = check(server)
    assert r["chat completion"].status == FAIL and "no usage" in r["chat completion"].observed
    assert r["streamed chat"].status == FAIL and "no usage chunk" in r["streamed chat"].observed
    assert r["max_tokens"].status == FAIL


@pytest.mark.parametrize("fault, words", [("invalid-json", "not JSON"), ("schema-mismatch", "break the schema")])
def test_bad_tool_arguments_fail(fault, words):
    with FakeOpenAI(tool_args=fault) as server:
        r = check(server)
    assert r["tool call"].status == FAIL and words in r["tool call"].observed, r["tool call"]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_apart_from_the_answer_passes_under_either_field_name(field):
    with FakeOpenAI(reasoning_field=field) as server:
        r = check(server, reasoning_parser="qwen3")
        tool = next(b for b in server.requests if "tools" in b)
    assert r["reasoning"].status == PASS, r["reasoning"]
    assert r["chat completion"].status == PASS and r["streamed chat"].status == PASS
    assert tool["chat_template_kwargs"] == {"enable_thinking": False}


def test_reasoning_markup_left_in_the_answer_fails_and_no_reasoning_is_inconclusive():
    with FakeOpenAI(leak_think=True) as server:
        leaked = check(server, reasoning_parser="qwen3")["reasoning"]
    with FakeOpenAI() as server:
        none = check(server, reasoning_parser="qwen3")["reasoning"]
    assert leaked.status == FAIL and "<think>" in leaked.observed
    assert none.status == WARN and "inconclusive" in none.remedy


def test_ignored_max_tokens_and_stop_fail():
    with FakeOpenAI(extra_tokens=3, honour_stop=False) as server:
        r = check(server)
    assert r["max_tokens"].status == FAIL and "11 completion tokens" in r["max_tokens"].observed
    assert r["stop"].status == FAIL and "'e' in the output" in r["stop"].observed


def test_unknown_model_that_hangs_fails_within_the_timeout():
    with FakeOpenAI(hang_unknown_model=5) as server:
        r = rows(smoke.run(server.url, "fake-model", timeout=1))
    assert r["unknown model"].status == FAIL and "no answer within 1 s" in r["unknown model"].observed
    assert r["chat completion"].status == PASS


def test_model_served_under_another_name_fails_the_listing():
    with FakeOpenAI(model="other") as server:
        r = check(server)
    assert r["model listed"].status == FAIL and "served: other" in r["model listed"].observed
    assert r["chat completion"].status == FAIL and "HTTP 404" in r["chat completion"].observed
    assert r["unknown model"].status == PASS


def test_unreachable_server_fails_once_and_skips_the_rest():
    r = rows(smoke.run(f"http://127.0.0.1:{free_port()}", "fake-model", timeout=2))
    assert r["model listed"].status == FAIL and "cannot connect" in r["model listed"].observed
    assert {c.status for n, c in r.items() if n != "model listed"} == {SKIP}


def test_schema_errors():
    schema = smoke.TOOL["function"]["parameters"]
    assert smoke.schema_errors({"city": "Paris", "unit": "celsius"}, schema) == []
    assert smoke.schema_errors({"city": "Rome", "unit": "celsius"}, schema)
    assert smoke.schema_errors({"city": "Paris"}, schema) == ["'unit' is a required property"]


def test_urls_accept_either_form():
    assert endpoint.urls("http://h:8000") == ("http://h:8000/v1", "http://h:8000")
    assert endpoint.urls("http://h:8000/v1/") == ("http://h:8000/v1", "http://h:8000")


def context(tmp_path, url: str, **serving) -> notebook.Context:
    data = yaml.safe_load((Path(__file__).parents[1] / "parameters" / "localhost.yaml").read_text())
    data["serving"].update(api_url=url, served_model_name="fake-model", **serving)
    return notebook.Context(validate(data), "test", tmp_path, step)


def test_the_step_runs_and_concludes_with_the_parameters_of_serving(tmp_path):
    """The notebook's cells: ctx.run(), step.table, ctx.conclude."""
    with FakeOpenAI(reasoning_field="reasoning") as server:
        ctx = context(tmp_path, server.url, reasoning_parser="qwen3")
        outcome = ctx.run(timeout=5)
    table = step.table(outcome)
    assert "POST /v1/chat/completions: stop ['e'], max_tokens 64" in [row[1] for row in table.rows]
    verdict = ctx.verdict(outcome)
    ctx.conclude(outcome)
    assert verdict.title == "smoke test" and verdict.status == PASS, verdict.to_text()
    assert rows(outcome)["reasoning"].status == PASS  # the serving parameters' reasoning parser
    saved = json.loads((tmp_path / "verdicts" / "06_smoke_test.json").read_text())
    assert len(saved["checks"]) == 8 and saved["key_numbers"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdicts"]  # no file of its own, as before


def test_the_step_fails_on_a_failed_check(tmp_path):
    with FakeOpenAI(usage=False) as server:
        ctx = context(tmp_path, server.url)
        outcome = ctx.run(timeout=5)
    with pytest.raises(CheckFailed, match="smoke test: 3 check"):
        ctx.conclude(outcome)
