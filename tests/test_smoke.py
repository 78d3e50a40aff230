"""The smoke test against a fake vLLM: each check passes on a healthy server and fails on the fault
it exists for."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import free_port
from fake_openai import FakeOpenAI

from sparkbook.params import endpoint
from sparkbook import notebook
from sparkbook.smoke import api as smoke
from sparkbook.book.errors import CheckFailed
from sparkbook.params import validate
from sparkbook.smoke.prompts import NO_THINKING, REASONING, THINKING, TOOL, TOOL_PROMPT
from sparkbook.steps import smoke as step
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN, Verdict


def rows(outcome: smoke.SmokeTest) -> dict:
    return {c.check: c for c in outcome.checks}


def check(server: FakeOpenAI, **kw) -> dict:
    return rows(smoke.run(server.url, "fake-model", timeout=5, **kw))


def sent(server: FakeOpenAI, prompt: str) -> list[dict]:
    return [b for b in server.requests if b["messages"][-1]["content"] == prompt]


def test_healthy_server_passes_every_check_and_says_what_it_sent():
    with FakeOpenAI() as server:
        outcome = smoke.run(server.url + "/v1/", "fake-model", timeout=5, tool_call_parser="hermes")
    r = rows(outcome)
    v = Verdict(step.TITLE, step.checks(None, outcome))
    assert v.title == "06 smoke test" and v.status == PASS, v.to_text()
    assert outcome.api == server.url + "/v1" and outcome.model == "fake-model"
    assert {c.status for n, c in r.items() if n != "reasoning"} == {PASS}
    assert r["reasoning"].status == SKIP
    assert all(c.node == "api" and c.command for n, c in r.items() if n != "reasoning")
    assert "stopped at 'e' (finish stop, stop_reason 'e'); without stop the same request wrote it at " \
        "character" in r["stop"].observed
    assert "404" in r["unknown model"].observed
    for name in ("tool call (auto)", "tool call (required)"):
        assert json.loads(r[name].observed.removeprefix("get_weather(").split(")")[0]) == \
            {"city": "Paris", "unit": "celsius"}
    assert "taken out by the hermes parser, finish tool_calls" in r["tool call (auto)"].observed
    stream = next(b for b in server.requests if b.get("stream"))
    assert stream["stream_options"] == {"include_usage": True}
    auto, required = sent(server, TOOL_PROMPT)
    assert auto["tool_choice"] == "auto" and required["tool_choice"] == "required"
    assert auto["tools"] == required["tools"] == [TOOL] and auto["max_tokens"] == smoke.REASONING_BUDGET
    assert "chat_template_kwargs" not in auto  # only with a reasoning parser


def test_missing_usage_fails_the_chat_checks():
    with FakeOpenAI(usage=False) as server:
        r = check(server)
    assert r["chat completion"].status == FAIL and "no usage" in r["chat completion"].observed
    assert r["streamed chat"].status == FAIL and "no usage chunk" in r["streamed chat"].observed
    assert r["max_tokens"].status == FAIL


@pytest.mark.parametrize("fault, words", [("invalid-json", "not JSON"), ("schema-mismatch", "break the schema")])
def test_bad_tool_arguments_fail(fault, words):
    with FakeOpenAI(tool_args=fault) as server:
        r = check(server, tool_call_parser="hermes")
    for name in ("tool call (auto)", "tool call (required)"):
        assert r[name].status == FAIL and words in r[name].observed, r[name]


def test_a_parser_that_is_not_the_models_fails_the_auto_call_only():
    """The call the model writes stays in the text; guided decoding still answers `required`."""
    with FakeOpenAI(tool_format="other") as server:
        r = check(server, tool_call_parser="hermes")
    auto = r["tool call (auto)"]
    assert auto.status == FAIL and "wrote one as text: '[TOOL_CALLS]get_weather" in auto.observed
    assert "'hermes' is not the model's (serving.tool_call_parser)" in auto.remedy
    assert r["tool call (required)"].status == PASS


def test_a_model_that_answers_without_calling_proves_nothing():
    with FakeOpenAI(tool_format="none") as server:
        auto = check(server, tool_call_parser="hermes")["tool call (auto)"]
    assert auto.status == WARN and "without calling get_weather" in auto.observed
    assert auto.remedy.startswith("not proven")


@pytest.mark.parametrize("text, call", [
    ('get_weather(city="Paris", unit="celsius")', True),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', True),
    ('<tool_call>\n<function=get_weather>', True),
    ("[TOOL_CALLS]", True),
    ("I would use the get_weather tool (it needs a city), but I cannot.", False),
    ("It is sunny in Paris.", False),
])
def test_written_call(text, call):
    assert smoke.written_call(text) is call


def test_a_call_without_finish_reason_tool_calls_fails():
    with FakeOpenAI(tool_finish="stop") as server:
        auto = check(server, tool_call_parser="hermes")["tool call (auto)"]
    assert auto.status == FAIL and "finish stop, not tool_calls" in auto.observed


def test_without_a_tool_call_parser_auto_is_skipped_and_a_refused_required_fails():
    with FakeOpenAI(tool_parser=False) as server:
        r = check(server)
    assert r["tool call (auto)"].status == SKIP and "serving.tool_call_parser" in r["tool call (auto)"].observed
    required = r["tool call (required)"]
    assert required.status == FAIL and "HTTP 400" in required.observed and "--tool-call-parser" in required.observed
    assert [b["tool_choice"] for b in server.requests if "tools" in b] == ["required"]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_thinking_model_passes_under_either_field_name(field):
    with FakeOpenAI(thinks=6, reasoning_field=field) as server:
        r = check(server, reasoning_parser="qwen3", tool_call_parser="hermes")
        reasoning, = sent(server, REASONING)
        tools = sent(server, TOOL_PROMPT)
    assert r["reasoning"].status == PASS and r["reasoning"].observed.startswith("apart: reasoning"), r["reasoning"]
    assert {c.status for c in r.values()} == {PASS}, [c for c in r.values() if c.status != PASS]
    assert reasoning["stream"] and reasoning["max_tokens"] == smoke.REASONING_BUDGET
    assert reasoning["chat_template_kwargs"] == THINKING
    assert [b["chat_template_kwargs"] for b in tools] == [NO_THINKING, NO_THINKING]  # the calls come at once


def test_reasoning_markup_left_in_the_answer_fails():
    with FakeOpenAI(thinks=6) as server:  # a thinking model served without the parser
        leaked = check(server, reasoning_parser="qwen3")["reasoning"]
    assert leaked.status == FAIL and "markup left in the answer" in leaked.observed
    assert "answer '<think>" in leaked.observed and "'qwen3' is not the model's" in leaked.remedy


@pytest.mark.parametrize("field", ["reasoning", None])  # a parser that keeps unclosed reasoning apart, or not
def test_reasoning_that_does_not_close_within_the_budget_is_inconclusive(field):
    with FakeOpenAI(thinks=100, reasoning_field=field) as server:
        short = check(server, reasoning_parser="qwen3", reasoning_budget=32)
        enough = check(server, reasoning_parser="qwen3")
    assert short["reasoning"].status == WARN and "did not close within max_tokens 32" in short["reasoning"].observed
    assert short["reasoning"].remedy.startswith("inconclusive") and "reasoning_budget" in short["reasoning"].remedy
    assert enough["reasoning"].status == (PASS if field else FAIL)


def test_no_reasoning_or_nothing_but_reasoning_fails():
    with FakeOpenAI(reasoning_field="reasoning") as server:  # the model does not think
        none = check(server, reasoning_parser="qwen3")["reasoning"]
    with FakeOpenAI(thinks=6, closes_thinking=False, reasoning_field="reasoning") as server:
        only = check(server, reasoning_parser="qwen3")["reasoning"]
    assert none.status == FAIL and "no reasoning, only an answer" in none.observed
    assert only.status == FAIL and "whole output came back as reasoning" in only.observed


@pytest.mark.parametrize("thinks", [100, 0])
def test_a_tool_call_that_max_tokens_cuts_is_inconclusive(thinks):
    """Crowded out by thinking (without a reasoning parser no request turns thinking off), or cut
    while the model writes it: no parser can take out an unfinished call."""
    with FakeOpenAI(thinks=thinks) as server:
        auto = check(server, tool_call_parser="hermes", reasoning_budget=8)["tool call (auto)"]
    assert auto.status == WARN and "no tool call within max_tokens 8" in auto.observed
    assert ("<tool_call>" in auto.observed) is (thinks == 0)


def test_judge_reasoning_of_an_empty_answer():
    assert smoke.judge_reasoning("", "", "stop", 64, "qwen3")[0] == FAIL
    assert smoke.judge_reasoning("thinking", "", "length", 64, "qwen3")[0] == WARN


def test_ignored_max_tokens_and_stop_fail():
    with FakeOpenAI(extra_tokens=3, honour_stop=False) as server:
        r = check(server)
    assert r["max_tokens"].status == FAIL and "11 completion tokens" in r["max_tokens"].observed
    assert r["stop"].status == FAIL and "'e' in the output" in r["stop"].observed


def test_a_stop_is_proved_only_against_a_reference_that_writes_it():
    """A model that never writes 'e' shows no 'e' with or without the stop: nothing is proved
    (WARN). A proxy that deletes the stop string instead of stopping at it hides it from the text;
    the answer then ends at the model's end of sequence, and vLLM's stop_reason (null, not the
    string) gives it away (FAIL)."""
    with FakeOpenAI(words=("cat", "sat", "on", "a", "mat")) as server:
        r = check(server)
    assert r["stop"].status == WARN and "inconclusive: the same request without stop wrote no 'e'" \
        in r["stop"].observed
    with FakeOpenAI(strip_stop=True) as server:
        r = check(server)
    assert r["stop"].status == FAIL and "finish stop, stop_reason None" in r["stop"].observed, r["stop"]
    assert "was not ended by 'e', which the same request without stop wrote at character" in r["stop"].observed
    sent_stop = [b for b in server.requests if b.get("max_tokens") == 64 and "tools" not in b]
    assert [b.get("stop") for b in sent_stop[-2:]] == [None, ["e"]]
    assert {b["temperature"] for b in sent_stop[-2:]} == {0}


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
    schema = TOOL["function"]["parameters"]
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


def test_the_reasoning_budget_fits_the_served_context(tmp_path):
    """A reasoning request's max_tokens fits in serving.max_model_len with its prompt: vLLM 0.17.1
    refuses one that does not (the lab's 2048-token context and the default budget of 2048)."""
    assert smoke.reasoning_budget(None) == smoke.REASONING_BUDGET == smoke.reasoning_budget(262144)
    assert smoke.reasoning_budget(2048) == 1024
    with FakeOpenAI(thinks=4, reasoning_field="reasoning") as server:
        outcome = context(tmp_path, server.url, reasoning_parser="qwen3", max_model_len=2048).run(timeout=5)
    assert any("max_tokens 1024" in row[1] for row in step.table(outcome).rows), step.table(outcome).rows


def test_the_step_runs_and_concludes_with_the_parameters_of_serving(tmp_path):
    """The notebook's cells: ctx.run(), step.table, ctx.conclude."""
    with FakeOpenAI(thinks=4, reasoning_field="reasoning") as server:
        ctx = context(tmp_path, server.url, reasoning_parser="qwen3", tool_call_parser="hermes")
        outcome = ctx.run(timeout=5, reasoning_budget=512)
    table = step.table(outcome)
    requests = [row[1] for row in table.rows]
    assert "POST /v1/chat/completions x2: temperature 0, max_tokens 64, without then with stop ['e']" in requests
    assert "POST /v1/chat/completions: tools [get_weather], tool_choice auto, max_tokens 512, thinking off" \
        in requests
    verdict = ctx.verdict(outcome)
    ctx.conclude(outcome)
    assert verdict.title == "06 smoke test" and verdict.status == PASS, verdict.to_text()
    r = rows(outcome)  # the serving parameters' parsers
    assert r["reasoning"].status == PASS and r["tool call (auto)"].status == PASS
    saved = json.loads((tmp_path / "verdicts" / "06_smoke_test.json").read_text())
    assert len(saved["checks"]) == 9 and saved["key_numbers"] == []
    # no file of its own, as before; and no run fingerprint: conftest's no_fingerprint stands for it
    # (the real one would run the node scripts on this machine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdicts"]


def test_the_step_fails_on_a_failed_check(tmp_path):
    with FakeOpenAI(usage=False) as server:
        ctx = context(tmp_path, server.url)
        outcome = ctx.run(timeout=5)
    with pytest.raises(CheckFailed, match="smoke test: 3 check"):
        ctx.conclude(outcome)


def test_the_step_sends_the_api_key_of_the_parameters(tmp_path, monkeypatch):
    """A vLLM that requires a key (VLLM_API_KEY): the step sends the one serving.api_key_env names,
    and proves the key reached vLLM (the one request without it is refused); without the key every
    request is refused, and a vLLM that never got the key fails that proof."""
    key = "sk-sparkbook-smoke-key-0123456789"
    monkeypatch.setenv("SPARKBOOK_API_HOSTS", "127.0.0.1")  # the fake vLLM: where the key may go
    monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", key)
    with FakeOpenAI(api_key=key) as server:
        outcome = context(tmp_path, server.url, api_key_env="SPARKBOOK_TEST_API_KEY").run(timeout=5)
        assert server.refused == 1  # the proof's own request
        refused = context(tmp_path / "without", server.url).run(timeout=5)
        assert server.refused > 1
    with FakeOpenAI() as open_server:
        unprotected = context(tmp_path / "open", open_server.url, api_key_env="SPARKBOOK_TEST_API_KEY").run(timeout=5)
    assert {c.status for c in outcome.checks} <= {PASS, SKIP}, [c for c in outcome.checks if c.status == FAIL]
    assert rows(outcome)["API key required"].status == PASS
    assert rows(unprotected)["API key required"].status == FAIL
    assert "API key required" not in rows(refused)
    assert rows(refused)["model listed"].status == FAIL and "401" in rows(refused)["model listed"].observed
