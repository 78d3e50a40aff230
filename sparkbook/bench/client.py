"""The benchmark's HTTP client: one connection pool to the server, and one timed, streamed request
(``request``: what went in, a :class:`~sparkbook.bench.records.RequestRecord` out), as vLLM's
``benchmarks/lib/endpoint_request_func.py`` has it."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..book.errors import SparkbookError
from ..params import endpoint as served_api
from .records import PATHS, RequestRecord

# The fields of a streamed choice that carry what the model said
SAID = ("content", "text", "reasoning_content", "reasoning", "tool_calls")


class ServerError(Exception):
    """A request the server answered with an error."""


def error_text(raw: bytes | str) -> str:
    """What an error answer says: its ``error.message`` when it is JSON, else its text."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        d = json.loads(text)
        d = d.get("error", d) if isinstance(d, dict) else d
        text = d.get("message", text) if isinstance(d, dict) else text
    except ValueError:
        pass
    return str(text).strip()[:200]


@dataclass
class Answer:
    """What an answer said, kept only when asked for (``Session.request(..., answer=Answer())``):
    its text (reasoning and content, in order) and, where the server returns them, its token IDs
    (vLLM's ``return_token_ids``, 0.10.2 on; other servers ignore the field)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


@dataclass
class Trace:
    """A request as llama-benchy 0.4.0 times it (``client.py``), kept when asked for
    (``Session.request(..., trace=Trace())``, :mod:`sparkbook.bench.board`): when it was sent, its
    first event with a choice (``first_response``), and each chunk whose delta carries text
    (content or reasoning) with its time and its number of tokens (``token_ids``; None where the
    server sent none), and when the stream ended."""

    sent: float = 0.0
    first_response: float | None = None
    chunks: list[tuple[float, int | None]] = field(default_factory=list)
    end: float = 0.0

    def see(self, now: float, choice: dict, delta: dict) -> None:
        if self.first_response is None:
            self.first_response = now
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            ids = choice.get("token_ids")
            self.chunks.append((now, len(ids) if isinstance(ids, list) else None))


class Session:
    """One connection pool to one server for one model: what every request of a run shares."""

    def __init__(self, base_url: str, model: str, *, endpoint: str, connections: int, timeout: float,
                 api_key: str = "EMPTY", temperature: float | None = 0.0):
        if endpoint not in PATHS:
            raise ValueError(f"endpoint must be 'chat' or 'completions', not {endpoint!r}")
        self.api, root = served_api.urls(base_url)
        self.model, self.endpoint, self.temperature = model, endpoint, temperature
        self.path = PATHS[endpoint]
        # aiohttp (C HTTP parser: the client's CPU per token stays below `vllm bench serve`'s, which
        # uses it too); trust_env off: a proxy from the environment would be measured too
        self.client = aiohttp.ClientSession(
            base_url=root, headers={"Authorization": f"Bearer {api_key}"}, trust_env=False,
            timeout=aiohttp.ClientTimeout(total=timeout, connect=10.0),
            connector=aiohttp.TCPConnector(limit=connections + 4, keepalive_timeout=served_api.KEEPALIVE_S))

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.close()

    async def model_card(self) -> dict:
        """The served model's entry of /v1/models (vLLM's has max_model_len); fails when the
        server is unreachable or does not serve the model."""
        try:
            async with self.client.get("/v1/models") as r:
                r.raise_for_status()
                cards = (await r.json())["data"]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
            raise SparkbookError(f"benchmark: cannot list the models at {self.api}: {e}\n"
                                 "Is the server up? (05_serve.ipynb, 06_smoke_test.ipynb)") from None
        card = next((c for c in cards if c.get("id") == self.model), None)
        if card is None:
            raise SparkbookError(f"benchmark: {self.model!r} is not served at {self.api} "
                                 f"(served: {', '.join(c.get('id', '?') for c in cards) or 'none'})")
        return card

    async def tokenize(self, form: str, text: str) -> int:
        """vLLM's ``POST /tokenize``: the token count of ``text`` as a user message with the chat
        template applied (``form="messages"``) or as a bare prompt (``"prompt"``)."""
        body: dict[str, Any] = {"model": self.model}
        if form == "messages":
            body.update(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
        else:
            body["prompt"] = text
        async with self.client.post("/tokenize", json=body) as r:
            if r.status != 200:
                raise ServerError(f"/tokenize: HTTP {r.status}: {error_text(await r.read())}")
            return int((await r.json())["count"])

    def body(self, prompt: str, output_tokens: int, *, context: str | None = None,
             exact: bool = True) -> dict:
        """The request. ``exact``: exactly ``output_tokens`` (``ignore_eos``) at the session's
        temperature; otherwise the server's own sampling, and a reply may end at EOS (as
        llama-benchy asks). ``context``: a system message before the prompt (chat only)."""
        b: dict[str, Any] = {"model": self.model, "max_tokens": output_tokens,
                             "stream": True, "stream_options": {"include_usage": True}}
        if exact:
            b["ignore_eos"] = True
            if self.temperature is not None:
                b["temperature"] = self.temperature
        if self.endpoint == "chat":
            b["messages"] = ([{"role": "system", "content": context}] if context else []) + [
                {"role": "user", "content": prompt}]
        elif context:
            raise ValueError("a context (system message) needs the chat endpoint")
        else:
            b["prompt"] = prompt
        return b

    async def latency(self, n: int = 3) -> float:
        """The mean seconds of ``n`` GET /v1/models: llama-benchy's ``--latency-mode api``, which
        it takes off its first-response and first-token times."""
        took = []
        for _ in range(n):
            t = time.perf_counter()
            async with self.client.get("/v1/models") as r:
                await r.read()
            took.append(time.perf_counter() - t)
        return sum(took) / n

    async def request(self, prompt: str, output_tokens: int, index: int, t0: float,
                      answer: Answer | None = None, cache_salt: str | None = None, *,
                      context: str | None = None, exact: bool = True,
                      trace: Trace | None = None) -> RequestRecord:
        """One streamed request, timed. Parses each SSE event with one json.loads and keeps only
        timestamps: no per-token work beyond that, unless ``answer`` asks for the text too, or
        ``trace`` for llama-benchy's marks. ``cache_salt``: vLLM's (0.9 on; other servers ignore
        it): the prompt shares no prefix-cache block with a request of another salt. ``context``
        and ``exact``: see :meth:`body`."""
        rec, marks, usage = RequestRecord(index), [], None
        body = self.body(prompt, output_tokens, context=context, exact=exact)
        if answer is not None or trace is not None:
            body["return_token_ids"] = True
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        sent = time.perf_counter()
        rec.sent_s = sent - t0
        if trace is not None:
            trace.sent = sent
        try:
            async with self.client.post(self.path, json=body) as resp:
                if resp.status != 200:
                    raise ServerError(f"HTTP {resp.status}: {error_text(await resp.read())}")
                buf = b""
                async for piece in resp.content.iter_any():  # whatever arrived: one or more events
                    now = time.perf_counter()
                    *lines, buf = (buf + piece).split(b"\n")
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            break
                        event = json.loads(data)
                        if "error" in event or event.get("object") == "error":
                            raise ServerError(f"error in the stream: {error_text(data)}")
                        usage = event.get("usage") or usage
                        for c in event.get("choices") or ():
                            d = c.get("delta") or c
                            # a generated token, with text or without (a special token, part of a
                            # character), as vllm bench serve times it; not the chat role's
                            # announcement nor an empty chunk that only says why the answer ended
                            if any(d.get(k) for k in SAID) or not (d.get("role") or c.get("finish_reason")):
                                marks.append(now)
                            rec.finish_reason = c.get("finish_reason") or rec.finish_reason
                            if trace is not None:
                                trace.see(now, c, d)
                            if answer is not None:
                                answer.text.append((d.get("reasoning_content") or d.get("reasoning") or "")
                                                   + (d.get("content") or d.get("text") or ""))
                                answer.token_ids += c.get("token_ids") or ()
                end = time.perf_counter()
                if trace is not None:
                    trace.end = end
        except ServerError as e:
            rec.error = str(e)
            return rec
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            rec.error = f"{type(e).__name__}: {e}".rstrip(": ")
            return rec
        if not usage or not usage.get("completion_tokens"):
            rec.error = "no usage in the stream (stream_options.include_usage not honoured)"
            return rec
        if not marks:
            rec.error = "no token streamed"
            return rec
        rec.prompt_tokens, rec.output_tokens = usage.get("prompt_tokens"), usage["completion_tokens"]
        rec.chunks = len(marks)
        ttft, e2e = marks[0] - sent, end - sent
        rec.ttft_ms, rec.e2e_ms = ttft * 1e3, e2e * 1e3
        rec.itl_ms = [round((b - a) * 1e3, 3) for a, b in zip(marks, marks[1:])]
        if rec.output_tokens > 1 and e2e > ttft:
            rec.tpot_ms = (e2e - ttft) * 1e3 / (rec.output_tokens - 1)
            rec.decode_tok_s = (rec.output_tokens - 1) / (e2e - ttft)
        if rec.prompt_tokens and ttft > 0:
            rec.prefill_tok_s = rec.prompt_tokens / ttft
        rec.ok = True
        return rec
