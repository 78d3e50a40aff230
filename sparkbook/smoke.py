"""The smoke test of a served model: does the OpenAI-compatible API do what clients rely on?

Every check looks at the *structure* of the answers, never at their content: the lab serves a
random-weight model whose text is noise, and a real model's text varies from run to run. What is
checked: the model is listed; a chat completion answers with usage; a streamed one sends chunks and
its usage (``stream_options.include_usage``); with a reasoning parser the reasoning arrives apart
from the answer; a forced tool call has arguments that parse as JSON and match the tool's schema;
``max_tokens`` and ``stop`` are honoured; an unknown model name is refused quickly, not hung on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import openai

from . import endpoint
from .step import Outcome
from .verdict import FAIL, PASS, SKIP, WARN, Check

PROMPT = "Say hello in one short sentence."
UNKNOWN_MODEL = "sparkbook-no-such-model"
STOP = "e"  # a letter almost any text holds, so that the stop is really exercised
# A tool whose arguments have few valid values, so that even a random-weight model, forced through
# guided decoding, writes a short complete object before max_tokens.
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "strict": True,  # the arguments follow the schema (guided decoding), as OpenAI defines it
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
REACH = "is vLLM up and listening on this address? (the serving step, `docker logs` on the head)"


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
    verdict; no file of its own)."""

    api: str
    model: str
    checks: list[Check] = field(default_factory=list)


def _short(text: str | None, n: int = 40) -> str:
    text = text or ""
    return repr(text if len(text) <= n else text[: n - 1] + "…")


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

    def chat(self, **kw):
        return self.client.chat.completions.create(
            model=kw.pop("model", self.model), messages=[{"role": "user", "content": PROMPT}], **kw)

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
        api_key: str = "EMPTY") -> SmokeTest:
    """Smoke-test the model served at ``base_url`` (``http://HOST:PORT`` or ``.../v1``).

    ``reasoning_parser`` and ``tool_call_parser`` are the serving parameters: a reasoning parser
    makes the reasoning check meaningful (SKIP otherwise). ``timeout`` bounds each request;
    ``node`` fills the checks' node column."""
    s = _Smoke(base_url, model, node, timeout, api_key, reasoning_parser, tool_call_parser)
    # Qwen3-style templates: with thinking off the prompt already closes the reasoning, so guided
    # decoding of tool arguments starts at once (a random model would never close it itself).
    no_thinking = {"chat_template_kwargs": {"enable_thinking": False}} if reasoning_parser else {}
    post = "POST /v1/chat/completions"

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
        r = s.chat(max_tokens=64)
        msg = r.choices[0].message
        thought, content = reasoning_of(msg), msg.content or ""
        leaked = [t for t in ("<think>", "</think>") if t in content]
        if leaked:
            return FAIL, f"{' and '.join(leaked)} left in the answer {_short(content)}", \
                f"the reasoning parser {reasoning_parser!r} did not split the output: is it the " \
                "model's parser (serving.reasoning_parser)?"
        if thought:
            return PASS, f"reasoning {_short(thought)} apart from answer {_short(content)}", ""
        return WARN, f"no reasoning field; answer {_short(content)}", \
            "inconclusive: the model wrote no reasoning block (a random-weight model seldom does); " \
            "with a real reasoning model, check serving.reasoning_parser"

    def tool():
        r = s.chat(max_tokens=512, tools=[TOOL], extra_body=no_thinking or None,
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
        calls = r.choices[0].message.tool_calls or []
        fix = "named tool calls use guided decoding: see the server's log" + (
            "" if tool_call_parser else "; recent vLLM needs serving.tool_call_parser for them")
        if not calls:
            return FAIL, f"no tool call (finish {r.choices[0].finish_reason}, content " \
                         f"{_short(r.choices[0].message.content)})", fix
        f = calls[0].function
        if f.name != "get_weather":
            return FAIL, f"called {f.name!r} instead of 'get_weather'", fix
        try:
            args = json.loads(f.arguments)
        except ValueError:
            cut = " (cut at max_tokens)" if r.choices[0].finish_reason == "length" else ""
            return FAIL, f"arguments are not JSON{cut}: {_short(f.arguments, 80)}", fix
        errors = schema_errors(args, TOOL["function"]["parameters"])
        if errors:
            return FAIL, f"arguments {_short(f.arguments, 60)} break the schema: {'; '.join(errors)}", fix
        return PASS, f"get_weather({f.arguments})", ""

    def max_tokens():
        r = s.chat(max_tokens=8)
        n = r.usage.completion_tokens if r.usage else None
        if n is None:
            return FAIL, "no usage in the answer", "see the chat completion check"
        ok = 0 < n <= 8
        return (PASS if ok else FAIL), f"{n} completion tokens, finish {r.choices[0].finish_reason}", \
            "" if ok else "the server generated past max_tokens"

    def stop():
        r = s.chat(max_tokens=64, stop=[STOP])
        c = r.choices[0]
        text = (c.message.content or "") + reasoning_of(c.message)
        if STOP in text:
            return FAIL, f"{STOP!r} in the output {_short(text)}", "the server ignored the stop string"
        hit = c.finish_reason == "stop" and getattr(c, "stop_reason", None) == STOP
        how = f"stopped at {STOP!r}" if hit else f"{STOP!r} never generated (inconclusive)"
        return PASS, f"{how}; output {_short(text)}, finish {c.finish_reason}", ""

    def unknown():
        t = min(timeout, 10.0)
        start = time.monotonic()
        try:
            s.client.with_options(timeout=t).chat.completions.create(
                model=UNKNOWN_MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=4)
        except (openai.NotFoundError, openai.BadRequestError) as e:
            return PASS, f"HTTP {e.status_code} in {time.monotonic() - start:.2f} s: {_message(e)}", ""
        except openai.APITimeoutError:
            return FAIL, f"no answer within {t:g} s", "the server hangs on an unknown model name"
        return FAIL, "answered as if the model existed", \
            "something in front of vLLM ignores the model name: clients cannot tell models apart"

    checks = [
        s.check("model listed", "GET /v1/models", f"{model} listed", models),
        s.check("chat completion", f"{post}: 1 user message, max_tokens 32",
                "an answer (content or reasoning) and usage with prompt and completion tokens", chat),
        s.check("streamed chat", f"{post}: stream, stream_options.include_usage, max_tokens 32",
                "chunks with text, then a usage chunk", stream),
    ]
    if reasoning_parser:
        checks.append(s.check("reasoning", f"{post}: max_tokens 64 (reasoning parser {reasoning_parser})",
                              "reasoning in reasoning_content/reasoning, not in the answer", reasoning))
    else:
        checks.append(Check("reasoning", node, SKIP, "no reasoning parser (serving.reasoning_parser)",
                            "reasoning apart from the answer"))
    checks += [
        s.check("tool call", f"{post}: tools [get_weather], tool_choice get_weather, max_tokens 512"
                + (", enable_thinking false" if no_thinking else ""),
                "a get_weather call with JSON arguments matching its schema", tool),
        s.check("max_tokens", f"{post}: max_tokens 8", "1 to 8 completion tokens", max_tokens),
        s.check("stop", f"{post}: stop [{STOP!r}], max_tokens 64", f"no {STOP!r} in the output", stop),
        s.check("unknown model", f"{post}: model {UNKNOWN_MODEL!r}", "HTTP 404 or 400 within 10 s", unknown),
    ]
    return SmokeTest(s.api, model, checks)
