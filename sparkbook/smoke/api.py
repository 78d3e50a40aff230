"""The smoke test of a served model: does the OpenAI-compatible API do what clients rely on?

Every check looks at the *structure* of the answers, never at their wording, which varies from model
to model and run to run. What is checked: the model is listed; a chat completion answers with usage;
a streamed one sends chunks and its usage (``stream_options.include_usage``); with a reasoning
parser, the reasoning arrives apart from the answer, with room for a thinking model to finish; with
``tool_choice`` ``"auto"`` and a prompt that needs the tool, the model's call comes back through the
server's tool-call parser with arguments valid against the tool's schema (only ``auto`` proves the
configured parser matches the model: a ``required`` or named tool choice is answered by guided
decoding, which vLLM may format and parse itself), and a ``required`` call is checked apart;
``max_tokens`` and ``stop`` are honoured; an unknown model name is refused quickly, not hung on.

The prompts and the tool are in :mod:`sparkbook.smoke.prompts`, where the lab's tiny model learns
to answer them (``sparkbook/lab/make_model.py``), so that the lab proves these checks for real.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import httpx
import openai

from ..book.step import Outcome
from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..params import endpoint
from ..serving import vllm as engine
from .prompts import HELLO, NO_THINKING, REASONING, THINKING, TOOL, TOOL_NAME, TOOL_PROMPT

if TYPE_CHECKING:
    from .burnin import BurnIn
    from .known_answers import KnownAnswers

UNKNOWN_MODEL = "sparkbook-no-such-model"
STOP = "e"  # a letter almost any text holds, so that the stop is really exercised
# max_tokens of the requests a thinking model may reason through first (the reasoning check and the
# tool calls): room for a few hundred tokens of reasoning on a short question, with a wide margin.
REASONING_BUDGET = 2048


def reasoning_budget(max_model_len: int | None) -> int:
    """REASONING_BUDGET, or half the served context where that is less: the prompt and max_tokens
    of a request must fit in it (vLLM 0.17.1 refuses a request that does not with HTTP 400, "a
    maximum input length of 0 tokens", where 0.32 serves it: measured in the lab on 2026-12-06)."""
    return min(REASONING_BUDGET, max_model_len // 2) if max_model_len else REASONING_BUDGET
# How tool calls look in text when no parser took them out (Hermes/Qwen, Mistral, Llama 3, Kimi and
# DeepSeek, XML-style function tags): a call left in the content is the parser's failure.
CALL_MARKS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<|tool_call", "<｜tool", "<function")
# ... or the tool's name as a call: get_weather(...), {"name": "get_weather", ...}, "get_weather": {...}
NAMED_CALL = re.compile(rf'{TOOL_NAME}\s*\(|"{TOOL_NAME}"[^{{}}]{{0,40}}{{|{{[^{{}}]{{0,40}}"{TOOL_NAME}"')
REACH = ("is vLLM up and listening on this address? `docker logs` on the head; "
         "run 05_serve.ipynb (`sparkbook run -p FILE --steps 05`)")


def reasoning_of(obj: Any) -> str:
    """The reasoning text of a message or delta: vLLM has named the field ``reasoning_content``
    and ``reasoning`` across versions."""
    return getattr(obj, "reasoning_content", None) or getattr(obj, "reasoning", None) or ""


def schema_errors(value: Any, schema: dict) -> list[str]:
    """Why ``value`` does not match the JSON schema (empty when it does)."""
    from jsonschema.validators import validator_for

    cls = validator_for(schema)
    return [e.message for e in cls(schema).iter_errors(value)]


@dataclass
class SmokeTest(Outcome):
    """What the smoke test sent and what it made of each answer: one check per request (kept in the
    verdict; no file of its own); then, when 06 ran them, its burn-in and known answers (each kept
    in a file of its own, ``smoke/``), whose checks join the verdict."""

    api: str
    model: str
    checks: list[Check] = field(default_factory=list)
    burn_in: BurnIn | None = None
    known_answers: KnownAnswers | None = None
    health: dict | None = None  # the serving nodes' health during the burn-in (sparkbook.serving.health)


def _short(text: str | None, n: int = 40) -> str:
    text = text or ""
    return repr(text if len(text) <= n else text[: n - 1] + "…")


def judge_reasoning(thought: str, content: str, finish: str | None, budget: int,
                    parser: str | None) -> tuple[str, str, str]:
    """(status, observed, remedy) of a reasoning answer: ``thought`` from the reasoning field,
    ``content`` the answer, ``finish`` its finish_reason under max_tokens ``budget``. PASS when they
    come apart; FAIL when the reasoning markup is left in the answer, when there is no reasoning at
    all or nothing but reasoning although the model finished; WARN only when the reasoning never
    closed within the budget (inconclusive)."""
    cut = finish == "length"
    seen = f"reasoning {_short(thought)}, answer {_short(content)}, finish {finish}"
    not_its = f"the reasoning parser {parser!r} is not the model's (serving.reasoning_parser)"
    if "</think>" in content or ("<think>" in content and not cut):
        return FAIL, f"reasoning markup left in the answer: {seen}", f"{not_its}: it did not split the output"
    if thought and content.strip():
        return PASS, f"apart: {seen}", ""
    if cut:
        return WARN, f"the reasoning did not close within max_tokens {budget}: {seen}", \
            f"inconclusive: give the model more room (reasoning_budget, e.g. {budget * 4})"
    if thought:
        return FAIL, f"the model finished, and its whole output came back as reasoning: {seen}", \
            "clients get no answer: the parser found no end of the reasoning. A model that does not " \
            f"think needs no reasoning parser; one that does needs its own ({not_its})"
    if content:
        return FAIL, f"no reasoning, only an answer: {seen}", \
            "a reasoning parser is set, yet nothing came back as reasoning: does the model think " \
            f"(some only when asked, through chat_template_kwargs)? If it does, {not_its}"
    return FAIL, f"empty answer: {seen}", "see the server's log for the request"


def written_call(text: str) -> bool:
    """Whether ``text`` holds a tool call written out (a marker, or the tool's name as a call), not
    merely the tool's name in a sentence."""
    return any(mark in text for mark in CALL_MARKS) or NAMED_CALL.search(text) is not None


def call_problem(calls: list, finish: str | None) -> str:
    """What is wrong with the tool calls of an answer (empty when the first is a get_weather call
    whose arguments are JSON valid against the tool's schema)."""
    f = calls[0].function
    if f.name != TOOL_NAME:
        return f"called {f.name!r} instead of {TOOL_NAME!r}"
    try:
        args = json.loads(f.arguments)
    except ValueError:
        cut = " (cut at max_tokens)" if finish == "length" else ""
        return f"arguments are not JSON{cut}: {_short(f.arguments, 80)}"
    errors = schema_errors(args, TOOL["function"]["parameters"])
    if errors:
        return f"arguments {_short(f.arguments, 60)} break the schema: {'; '.join(errors)}"
    return ""


class _Smoke:
    def __init__(self, base_url: str, model: str, node: str, timeout: float, api_key: str,
                 reasoning_parser: str | None, tool_call_parser: str | None):
        self.api, _ = endpoint.urls(base_url)
        # no retries: a retried failure would hide a hang or double the time to see it; straight
        # to the server, never through a proxy from this machine's environment
        pool = httpx.Limits(keepalive_expiry=endpoint.KEEPALIVE_S)
        self.client = openai.OpenAI(base_url=self.api, api_key=api_key, timeout=timeout, max_retries=0,
                                    http_client=openai.DefaultHttpxClient(trust_env=False, limits=pool))
        self.model, self.node, self.timeout = model, node, timeout
        self.reasoning_parser, self.tool_call_parser = reasoning_parser, tool_call_parser
        self.unreachable = ""

    def chat(self, prompt: str = HELLO, **kw):
        return self.client.chat.completions.create(
            model=kw.pop("model", self.model), messages=[{"role": "user", "content": prompt}], **kw)

    def check(self, name: str, command: str, expected: str,
              fn: Callable[[], tuple[str, str, str]]) -> Check:
        """Run one check; an API error is its FAIL, with what the server said."""
        if self.unreachable:
            return Check(name, self.node, SKIP, f"not run: {self.unreachable}", expected, command=command)
        try:
            status, observed, remedy = fn()
        except openai.APIConnectionError as e:  # APITimeoutError is one
            timed_out = isinstance(e, openai.APITimeoutError)
            observed = f"no answer within {self.timeout:g} s" if timed_out else f"cannot connect to {self.api}: {e}"
            if not timed_out:
                self.unreachable = "the server is unreachable"
            status, remedy = FAIL, REACH
        except openai.APIStatusError as e:
            status, observed = FAIL, f"HTTP {e.status_code}: {_message(e)}"
            remedy = "see the server's log for the request"
        return Check(name, self.node, status, observed, expected, remedy, command)


def _message(e: openai.APIStatusError) -> str:
    body = e.body if isinstance(e.body, dict) else {}  # the client unwraps {"error": {...}}
    return str(body.get("message") or e.message)[:200]


def run(base_url: str, model: str, *, reasoning_parser: str | None = None,
        tool_call_parser: str | None = None, timeout: float = 120.0, node: str = "api",
        api_key: str = "EMPTY", reasoning_budget: int = REASONING_BUDGET) -> SmokeTest:
    """Smoke-test the model served at ``base_url`` (``http://HOST:PORT`` or ``.../v1``).

    ``reasoning_parser`` and ``tool_call_parser`` are the serving parameters: a reasoning parser
    makes the reasoning check meaningful (SKIP otherwise), a tool-call parser the ``auto`` tool call
    (vLLM refuses ``auto`` without one). ``timeout`` bounds each request (for the streamed reasoning
    check, each wait for a chunk); ``reasoning_budget`` is the max_tokens of the requests a thinking
    model may reason through first; ``node`` fills the checks' node column."""
    s = _Smoke(base_url, model, node, timeout, api_key, reasoning_parser, tool_call_parser)
    no_thinking = {"chat_template_kwargs": NO_THINKING} if reasoning_parser else {}
    post = "POST /v1/chat/completions"
    budget = f"max_tokens {reasoning_budget}"

    def models():
        ids = [m.id for m in s.client.models.list().data]
        if model in ids:
            return PASS, f"{model} among {len(ids)} model(s)", ""
        return FAIL, f"served: {', '.join(ids) or 'none'}", \
            "the name clients use must be the served name (serving.served_model_name, else model.path)"

    def chat():
        r = s.chat(max_tokens=32)
        msg, u = r.choices[0].message, r.usage
        answer = msg.content or reasoning_of(msg)
        seen = f"{_short(answer)}, finish {r.choices[0].finish_reason}"
        if not answer:
            return FAIL, f"empty answer ({seen})", "see the server's log for the request"
        if u is None or not u.prompt_tokens or not u.completion_tokens:
            return FAIL, f"no usage with prompt and completion tokens (usage {u}); answer {seen}", \
                "clients and the benchmark count tokens from usage: is this vLLM's OpenAI server?"
        return PASS, f"{u.prompt_tokens} prompt + {u.completion_tokens} completion tokens; {seen}", ""

    def stream():
        chunks, texts, usage = 0, [], None
        for chunk in s.chat(max_tokens=32, stream=True, stream_options={"include_usage": True}):
            chunks += 1
            usage = chunk.usage or usage
            for c in chunk.choices:
                texts.append((c.delta.content or "") + reasoning_of(c.delta))
        with_text = sum(bool(t) for t in texts)
        seen = f"{chunks} chunks, {with_text} with text, text {_short(''.join(texts))}"
        if not with_text:
            return FAIL, f"no text streamed ({seen})", "see the server's log for the request"
        if usage is None or not usage.completion_tokens:
            return FAIL, f"no usage chunk ({seen})", \
                "stream_options.include_usage must be honoured: the benchmark counts tokens from it"
        return PASS, f"{seen}; usage {usage.prompt_tokens} + {usage.completion_tokens} tokens", ""

    def reasoning():
        # streamed: a long reasoning keeps sending chunks, so `timeout` bounds silence, not length
        thought, said, finish = [], [], None
        for chunk in s.chat(REASONING, max_tokens=reasoning_budget, stream=True,
                            extra_body={"chat_template_kwargs": THINKING}):
            for c in chunk.choices:
                thought.append(reasoning_of(c.delta))
                said.append(c.delta.content or "")
                finish = c.finish_reason or finish
        return judge_reasoning("".join(thought), "".join(said), finish, reasoning_budget, reasoning_parser)

    def ask_tool(choice: str):
        return s.chat(TOOL_PROMPT, max_tokens=reasoning_budget, tools=[TOOL], tool_choice=choice,
                      extra_body=no_thinking or None).choices[0]

    def tool_auto():
        c = ask_tool("auto")
        calls, finish = c.message.tool_calls or [], c.finish_reason
        not_its = f"the tool-call parser {tool_call_parser!r} is not the model's (serving.tool_call_parser)"
        if not calls:
            text = (c.message.content or "") + reasoning_of(c.message)
            seen = f"{_short(text, 80)}, finish {finish}"
            if finish == "length":  # still thinking, or cut while writing the call: no parser takes it
                return WARN, f"no tool call within {budget}: {seen}", \
                    f"inconclusive: give the model more room (reasoning_budget, e.g. {reasoning_budget * 4})"
            if written_call(text):
                return FAIL, f"no tool call, but the model wrote one as text: {seen}", \
                    f"{not_its}: it did not take out the call the model wrote"
            return WARN, f"the model answered without calling {TOOL_NAME}: {seen}", \
                "not proven: the parser was not exercised. Does the model call tools (its chat " \
                "template must render them)?"
        problem = call_problem(calls, finish)
        if problem:
            return FAIL, problem, f"the parser took out a malformed call: see the server's log; {not_its}?"
        args = calls[0].function.arguments
        if finish != "tool_calls":
            return FAIL, f"{TOOL_NAME}({args}) with finish {finish}, not tool_calls", \
                "clients run the tools when finish_reason is tool_calls: see the server's log"
        return PASS, f"{TOOL_NAME}({args}) taken out by the {tool_call_parser} parser, finish tool_calls", ""

    def tool_required():
        c = ask_tool("required")
        calls = c.message.tool_calls or []
        fix = "tool_choice required is answered by guided decoding: see the server's log" + (
            "" if tool_call_parser else "; recent vLLM needs serving.tool_call_parser for it")
        if not calls:
            return FAIL, f"no tool call (finish {c.finish_reason}, content {_short(c.message.content)})", fix
        problem = call_problem(calls, c.finish_reason)
        if problem:
            return FAIL, problem, fix
        return PASS, f"{TOOL_NAME}({calls[0].function.arguments}), finish {c.finish_reason}", ""

    def max_tokens():
        r = s.chat(max_tokens=8)
        n = r.usage.completion_tokens if r.usage else None
        if n is None:
            return FAIL, "no usage in the answer", "see the chat completion check"
        ok = 0 < n <= 8
        return (PASS if ok else FAIL), f"{n} completion tokens, finish {r.choices[0].finish_reason}", \
            "" if ok else "the server generated past max_tokens"

    def stop():
        # proved against a reference: the same greedy request without the stop string writes it,
        # so an answer without it, ended by the stop, is the stop's doing (not a model that never
        # wrote the letter)
        def text_of(c):
            return (c.message.content or "") + reasoning_of(c.message)
        reference = text_of(s.chat(max_tokens=64, temperature=0).choices[0])
        c = s.chat(max_tokens=64, stop=[STOP], temperature=0).choices[0]
        text = text_of(c)
        if STOP in text:
            return FAIL, f"{STOP!r} in the output {_short(text)}", "the server ignored the stop string"
        if STOP not in reference:
            return WARN, f"inconclusive: the same request without stop wrote no {STOP!r} either " \
                f"({_short(reference)})", "nothing proved: the model never wrote the stop string"
        at = reference.index(STOP)
        # vLLM names what stopped an answer (stop_reason: the stop string, else null for the end of
        # sequence); finish "stop" alone is also what an end of sequence gives
        if "stop_reason" not in (c.model_extra or {}):
            if c.finish_reason == "stop":
                return WARN, f"finish stop, but the server reports no stop_reason: an end of sequence " \
                    f"reads the same; output {_short(text)}", "not vLLM? nothing proved the stop"
            reason = None
        else:
            reason = c.model_extra["stop_reason"]
        if c.finish_reason != "stop" or reason != STOP:
            return FAIL, f"finish {c.finish_reason}, stop_reason {reason!r}: the output {_short(text)} " \
                f"was not ended by {STOP!r}, which the same request without stop wrote at character " \
                f"{at}", "the server ignored the stop string"
        return PASS, f"stopped at {STOP!r} (finish stop, stop_reason {reason!r}); without stop the same " \
            f"request wrote it at character {at}; output {_short(text)}", ""

    def unknown():
        t = min(timeout, 10.0)
        start = time.monotonic()
        try:
            s.client.with_options(timeout=t).chat.completions.create(
                model=UNKNOWN_MODEL, messages=[{"role": "user", "content": HELLO}], max_tokens=4)
        except (openai.NotFoundError, openai.BadRequestError) as e:
            return PASS, f"HTTP {e.status_code} in {time.monotonic() - start:.2f} s: {_message(e)}", ""
        except openai.APITimeoutError:
            return FAIL, f"no answer within {t:g} s", "the server hangs on an unknown model name"
        return FAIL, "answered as if the model existed", \
            "something in front of vLLM ignores the model name: clients cannot tell models apart"

    def key_required():
        # the key must have reached vLLM: without it, the same request is refused
        try:
            s.client.with_options(api_key="EMPTY").models.list()
        except openai.AuthenticationError as e:
            return PASS, f"HTTP {e.status_code} without the key; the checks above passed with it", ""
        return FAIL, "GET /v1/models answered without the key", \
            f"vLLM requires no key: did {engine.API_KEY} reach the serving container (05's secrets file)?"

    def tools(choice: str) -> str:
        return f"{post}: tools [{TOOL_NAME}], tool_choice {choice}, {budget}" + (
            ", thinking off" if no_thinking else "")

    call = f"a {TOOL_NAME} call with JSON arguments matching its schema"
    checks = [
        s.check("model listed", "GET /v1/models", f"{model} listed", models),
        s.check("chat completion", f"{post}: 1 user message, max_tokens 32",
                "an answer (content or reasoning) and usage with prompt and completion tokens", chat),
        s.check("streamed chat", f"{post}: stream, stream_options.include_usage, max_tokens 32",
                "chunks with text, then a usage chunk", stream),
    ]
    if reasoning_parser:
        checks.append(s.check("reasoning", f"{post}: stream, thinking on, {budget} (reasoning parser "
                              f"{reasoning_parser})", "reasoning in reasoning_content/reasoning, then "
                              "an answer apart from it", reasoning))
    else:
        checks.append(Check("reasoning", node, SKIP, "no reasoning parser (serving.reasoning_parser)",
                            "reasoning apart from the answer"))
    expected_auto = f"{call}, taken out by the tool-call parser, finish tool_calls"
    if tool_call_parser:
        checks.append(s.check("tool call (auto)", tools("auto"), expected_auto, tool_auto))
    else:
        checks.append(Check("tool call (auto)", node, SKIP, "no tool-call parser (serving.tool_call_parser): "
                            "vLLM answers tool_choice auto only with one", expected_auto))
    checks += [
        s.check("tool call (required)", tools("required"), call, tool_required),
        s.check("max_tokens", f"{post}: max_tokens 8", "1 to 8 completion tokens", max_tokens),
        s.check("stop", f"{post} x2: temperature 0, max_tokens 64, without then with stop [{STOP!r}]",
                f"without stop, {STOP!r} in the output; with it, none and finish stop", stop),
        s.check("unknown model", f"{post}: model {UNKNOWN_MODEL!r}", "HTTP 404 or 400 within 10 s", unknown),
    ]
    if api_key != "EMPTY":
        checks.append(s.check("API key required", "GET /v1/models without the key", "HTTP 401", key_required))
    return SmokeTest(s.api, model, checks)
