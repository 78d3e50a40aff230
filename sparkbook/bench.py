"""The benchmark client: single-user speed at several context depths, a closed-loop concurrency
sweep and an optional open-loop request-rate sweep against an OpenAI-compatible server (vLLM).

Hygiene, so that numbers compare between runs and with ``vllm bench serve`` on the same load:

- token counts come from the server's usage (streamed with ``stream_options.include_usage``),
  never from counting chunks (one chunk may carry several tokens);
- the output length is fixed: ``max_tokens = output_tokens`` with ``ignore_eos`` (as ``vllm bench
  serve`` sends it: ``min_tokens`` would add a logits processor to every decoding step);
- prompts are random words from a seeded RNG, sized to the exact token count by the server's own
  tokenizer (vLLM's ``POST /tokenize``, with the chat template for the chat endpoint); every
  request has its own prompt, so no level profits from the prefix cache of another, and a salt
  (by default the run's start time) keeps a rerun against the same server from hitting the prompts
  of the last run: pass ``prompt_salt=""`` for byte-identical prompts;
- warm-up requests run before anything is measured; one HTTP connection pool serves every level,
  sized for the highest concurrency;
- the client measures itself: the CPU time of its event-loop thread, how late it sent each
  scheduled request and how late its event loop woke up. A level where the client, not the server,
  was the bottleneck is flagged ``client_bound``.

Definitions (``vllm bench serve`` uses the same): TTFT is from sending a request to the first chunk
that carries text (answer, reasoning or tool call); ITL is the time between successive such chunks;
E2E is from sending to the end of the stream; TPOT = (E2E - TTFT) / (output tokens - 1). Per
request, decode tok/s = (output tokens - 1) / (E2E - TTFT) and prefill tok/s = prompt tokens / TTFT.
A context depth D is a prompt of D + ``benchmark.prompt_tokens`` tokens, all prefilled.

Results land in ``RUN_DIR/benchmark/``:

``results.json``: ``model``, ``base_url``, ``endpoint`` (``chat`` or ``completions``), ``started``
(UTC, ISO 8601), ``seed``, ``prompt_salt``, ``benchmark`` (the parameters used),
``prompt_sizing`` (``exact ...``
or ``estimated ...``), ``max_model_len``, ``warmup``, ``warmup_errors``, ``skipped`` (levels not
run, and why), ``duration_s``, ``source`` (the run folder's name), and ``depths``,
``concurrency``, ``rates``: lists of levels. A level: ``kind`` (``depth``, ``concurrency``,
``rate`` or ``load``), ``label``, ``endpoint``, ``depth``, ``prompt_tokens`` and
``output_tokens`` (targets), ``concurrency`` (null: unbounded), ``request_rate`` (req/s; null:
closed loop), ``num_requests``, ``seed``, ``prompt_sizing``, ``completed``, ``failures``,
``errors`` (distinct messages with counts), ``duration_s`` (first send to last end),
``request_throughput`` (req/s), ``output_tok_s`` (all output tokens / duration),
``per_user_tok_s`` (mean of the per-request decode tok/s), ``prefill_tok_s`` and
``decode_tok_s`` (medians over requests), ``prompt_tokens_mean`` and ``output_tokens_mean`` (as
the server counted them), ``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2e_ms``, ``lateness_ms`` (open
loop only), ``loop_lag_ms``: each ``{mean, p50, p90, p99}`` in milliseconds (null when nothing
was measured); ``client_cpu_s``, ``client_cpu_frac`` (of one core), ``client_bound``,
``client_note``; and ``requests``, one record per request: ``index``, ``ok``, ``error``,
``prompt_tokens``, ``output_tokens`` (from usage), ``chunks``, ``finish_reason``, ``sent_s``
(since the level started), ``lateness_ms`` (sent after its scheduled time by this much; open
loop), ``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``itl_ms`` (list), ``prefill_tok_s``,
``decode_tok_s``.

``levels.csv``: one row per level, the level's fields above without ``requests``, each latency
flattened to ``<name>_mean``, ``<name>_p50``, ``<name>_p90``, ``<name>_p99`` (e.g.
``ttft_ms_p99``) and ``errors`` joined with ``; ``.

``throughput.png``, ``latency.png``, ``distributions.png``, ``depth.png``, ``rates.png``: the
plots, with earlier runs of the same model and the reference numbers.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import aiohttp
import numpy as np

from .errors import SparkbookError
from .params import Benchmark, Reference
from .progress import Progress, bar
from . import smoke
from .smoke import urls
from .tables import Table
from .verdict import FAIL, PASS, SKIP, WARN, Check, Verdict

FOLDER = "benchmark"
PERCENTILES = (50, 90, 99)
CLIENT_CPU_LIMIT = 0.8  # of one core: the client is one event-loop thread
LATE_LIMIT_MS = 50.0  # p99 of scheduling lateness or event-loop lag
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}  # by endpoint
LAG_INTERVAL_S = 0.5  # the loop-lag probe: often enough to see a stall, rare enough to cost nothing
WARMUP_TOKENS = 32
# Common words: about one token each in real tokenizers, so a prompt reads like text.
VOCAB = tuple("""time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot right study
book eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body information back
parent face others level office door health person art war history party result change morning
reason research girl guy moment air teacher force education river stone light green small
large early young important public bad same able""".split())
PADS = (" a", ".", ",", " I", "a")  # one token each in most tokenizers: closes the last gap


def stats(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and percentiles (linear interpolation, as numpy and ``vllm bench serve``)."""
    if not len(values):
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), **{f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}}


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """When each of ``n`` requests is sent (seconds from the start) in a Poisson process of
    ``rate`` per second: exponential gaps from a seeded RNG, computed ahead so that a run repeats
    exactly and the client only sleeps against it. The first request goes at 0."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass
class RequestRecord:
    index: int
    ok: bool = False
    error: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    chunks: int = 0
    finish_reason: str | None = None
    sent_s: float = 0.0
    lateness_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None


Stats = dict[str, float | None]
STAT_FIELDS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "lateness_ms", "loop_lag_ms")


@dataclass
class LevelResult:
    kind: str
    label: str
    endpoint: str
    prompt_tokens: int
    output_tokens: int
    concurrency: int | None
    request_rate: float | None
    num_requests: int
    seed: int
    depth: int | None = None
    prompt_sizing: str = ""
    completed: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    request_throughput: float = 0.0
    output_tok_s: float = 0.0
    per_user_tok_s: float | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    prompt_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    ttft_ms: Stats = field(default_factory=lambda: stats([]))
    tpot_ms: Stats = field(default_factory=lambda: stats([]))
    itl_ms: Stats = field(default_factory=lambda: stats([]))
    e2e_ms: Stats = field(default_factory=lambda: stats([]))
    lateness_ms: Stats = field(default_factory=lambda: stats([]))
    loop_lag_ms: Stats = field(default_factory=lambda: stats([]))
    client_cpu_s: float = 0.0
    client_cpu_frac: float = 0.0
    client_bound: bool = False
    client_note: str = ""
    requests: list[RequestRecord] = field(default_factory=list)

    def summarize(self, records: list[RequestRecord], duration: float, cpu: float,
                  lag_ms: list[float]) -> "LevelResult":
        ok = [r for r in records if r.ok]
        self.requests, self.completed, self.failures = records, len(ok), len(records) - len(ok)
        self.errors = [f"{n} x {e}" for e, n in Counter(r.error for r in records if not r.ok).most_common()]
        self.duration_s = duration
        self.request_throughput = len(ok) / duration if duration else 0.0
        self.output_tok_s = sum(r.output_tokens for r in ok) / duration if duration else 0.0
        decode = [r.decode_tok_s for r in ok if r.decode_tok_s]
        prefill = [r.prefill_tok_s for r in ok if r.prefill_tok_s]
        self.per_user_tok_s = statistics.fmean(decode) if decode else None
        self.decode_tok_s = statistics.median(decode) if decode else None
        self.prefill_tok_s = statistics.median(prefill) if prefill else None
        self.prompt_tokens_mean = statistics.fmean(r.prompt_tokens for r in ok) if ok else None
        self.output_tokens_mean = statistics.fmean(r.output_tokens for r in ok) if ok else None
        self.ttft_ms = stats([r.ttft_ms for r in ok])
        self.tpot_ms = stats([r.tpot_ms for r in ok if r.tpot_ms is not None])
        self.itl_ms = stats([x for r in ok for x in r.itl_ms])
        self.e2e_ms = stats([r.e2e_ms for r in ok])
        self.lateness_ms = stats([r.lateness_ms for r in records if r.lateness_ms is not None])
        self.loop_lag_ms = stats(lag_ms)
        self.client_cpu_s, self.client_cpu_frac = cpu, cpu / duration if duration else 0.0
        why = [f"client CPU {self.client_cpu_frac:.0%} of a core"] if self.client_cpu_frac > CLIENT_CPU_LIMIT else []
        for name, s in (("scheduling lateness", self.lateness_ms), ("event-loop lag", self.loop_lag_ms)):
            if s["p99"] is not None and s["p99"] > LATE_LIMIT_MS:
                why.append(f"{name} p99 {s['p99']:.0f} ms")
        self.client_bound, self.client_note = bool(why), "; ".join(why)
        return self

    def describe(self) -> str:
        """The load, as a command line would say it."""
        path = PATHS[self.endpoint]
        how = (f"Poisson {self.request_rate:g} req/s" + (f", at most {self.concurrency} at once"
                                                         if self.concurrency else "")
               if self.request_rate else f"concurrency {self.concurrency}")
        return (f"POST {path} x{self.num_requests}, {how}, {self.prompt_tokens} prompt + "
                f"{self.output_tokens} output tokens (ignore_eos), seed {self.seed}")

    def line(self, labelled: bool = True) -> str:
        """One line for the progress log."""
        f = lambda v, fmt: "-" if v is None else format(v, fmt)
        text = (f"{self.completed}/{self.num_requests} ok in {self.duration_s:.1f} s, "
                f"{self.output_tok_s:.1f} output tok/s, {f(self.per_user_tok_s, '.1f')} tok/s/user, "
                f"TTFT p50 {f(self.ttft_ms['p50'], '.0f')} ms, ITL p50 {f(self.itl_ms['p50'], '.1f')} ms, "
                f"client CPU {self.client_cpu_frac:.0%}")
        text += f"; CLIENT-BOUND: {self.client_note}" if self.client_bound else ""
        text += f"; errors: {self.errors[0]}" if self.errors else ""
        return f"{self.label}: {text}" if labelled else text

    def flat(self) -> dict[str, Any]:
        """The level without its requests, latencies flattened: a CSV row."""
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            if k == "requests":
                continue
            if k in STAT_FIELDS:
                out.update({f"{k}_{s}": x for s, x in v.items()})
            else:
                out[k] = "; ".join(v) if k == "errors" else v
        return out

    @classmethod
    def from_json(cls, d: dict) -> "LevelResult":
        lv = cls(**_known(cls, d))
        lv.requests = [RequestRecord(**_known(RequestRecord, r)) for r in d.get("requests", [])]
        return lv


@dataclass
class Results:
    model: str
    base_url: str
    endpoint: str
    started: str
    seed: int
    benchmark: dict
    prompt_salt: str = ""
    prompt_sizing: str = ""
    max_model_len: int | None = None
    warmup: int = 0
    warmup_errors: list[str] = field(default_factory=list)
    depths: list[LevelResult] = field(default_factory=list)
    concurrency: list[LevelResult] = field(default_factory=list)
    rates: list[LevelResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    source: str = ""

    @property
    def levels(self) -> list[LevelResult]:
        return [*self.depths, *self.concurrency, *self.rates]

    def single_user(self) -> LevelResult | None:
        """The single-user level that references compare with: the shallowest context depth,
        else concurrency 1."""
        depths = sorted((lv for lv in self.depths if lv.decode_tok_s), key=lambda lv: lv.depth or 0)
        ones = [lv for lv in self.concurrency if lv.concurrency == 1 and lv.decode_tok_s]
        return (depths or ones or [None])[0]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Results":
        r = cls(**_known(cls, d))
        for k in ("depths", "concurrency", "rates"):
            setattr(r, k, [LevelResult.from_json(x) for x in d.get(k, [])])
        return r


def _known(cls, d: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


class _Fail(Exception):
    """A request the server answered with an error."""


def _error_text(raw: bytes | str) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        d = json.loads(text)
        d = d.get("error", d) if isinstance(d, dict) else d
        text = d.get("message", text) if isinstance(d, dict) else text
    except ValueError:
        pass
    return str(text).strip()[:200]


class _Prompts:
    """Random-word prompts of an exact token count by the server's tokenizer (vLLM's
    ``POST /tokenize``; for the chat endpoint with the chat template applied, so the count is the
    prompt_tokens the server will report). Without /tokenize, one token per word: an estimate."""

    def __init__(self, client: aiohttp.ClientSession, model: str, endpoint: str):
        self.client, self.model, self.endpoint = client, model, endpoint
        self.form: str | None = None  # "messages" or "prompt": how /tokenize is asked
        self.sizing = ""
        self.ratio = 1.3  # tokens per word, learnt as prompts are fitted
        self.missed = 0  # prompts that could not be brought to the exact count

    async def probe(self) -> str:
        forms = ("messages", "prompt") if self.endpoint == "chat" else ("prompt",)
        why = ""
        for form in forms:
            self.form = form
            try:
                await self.count("hello")
            except (aiohttp.ClientError, asyncio.TimeoutError, _Fail, ValueError, KeyError) as e:
                why = str(e) or type(e).__name__
                continue
            self.sizing = ("exact: /tokenize" + (" with the chat template" if form == "messages" else "")
                           + (" (without the chat template: its tokens come on top)"
                              if self.endpoint == "chat" and form == "prompt" else ""))
            return self.sizing
        self.form = None
        self.sizing = f"estimated: one token per word (no /tokenize: {why})"
        return self.sizing

    async def count(self, text: str) -> int:
        body: dict[str, Any] = {"model": self.model}
        if self.form == "messages":
            body.update(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
        else:
            body["prompt"] = text
        async with self.client.post("/tokenize", json=body) as r:
            if r.status != 200:
                raise _Fail(f"/tokenize: HTTP {r.status}: {_error_text(await r.read())}")
            return int((await r.json())["count"])

    async def make(self, tokens: int, key: str) -> str:
        rng, words = random.Random(key), []

        def text(k: int) -> str:
            while len(words) < k:
                words.append(rng.choice(VOCAB))
            return " ".join(words[:k])

        if self.form is None:
            return text(max(tokens, 1))
        # Secant steps on the number of words, then pad the last few tokens.
        k, best, tried = max(1, round(tokens / self.ratio)), (0, None), set()
        while k not in tried and len(tried) < 8:
            tried.add(k)
            c = await self.count(text(k))
            if c == tokens:
                return text(k)
            if c < tokens and (best[1] is None or c > best[1]):
                best = (k, c)
            self.ratio = max(c / k, 0.1)
            k = max(1, k + (round((tokens - c) / self.ratio) or (1 if c < tokens else -1)))
        if best[1] is None:  # even one word is too many (a tiny target under a chat template)
            self.missed += 1
            return text(1)
        out, c = text(best[0]), best[1]
        for _ in range(16):  # the gap is a token or two; a bigger one stays a miss
            if c >= tokens:
                break
            for pad in PADS:
                n = await self.count(out + pad)
                if c < n <= tokens:
                    out, c = out + pad, n
                    break
            else:
                break
        self.missed += c != tokens
        return out

    async def batch(self, n: int, tokens: int, key: str) -> list[str]:
        gate = asyncio.Semaphore(8)

        async def one(i: int) -> str:
            async with gate:
                return await self.make(tokens, f"{key}/{i}")

        return list(await asyncio.gather(*(one(i) for i in range(n))))


class _Session:
    """One connection pool, one prompt maker, one server: what every level of a run shares."""

    def __init__(self, base_url: str, model: str, *, endpoint: str, connections: int, timeout: float,
                 api_key: str, temperature: float | None, progress: bool, say: Callable[[str], None],
                 prompt_salt: str):
        if endpoint not in PATHS:
            raise ValueError(f"endpoint must be 'chat' or 'completions', not {endpoint!r}")
        self.api, root = urls(base_url)
        self.model, self.endpoint, self.temperature = model, endpoint, temperature
        self.say, self.salt = say, prompt_salt
        # one line per level, live; each ends as the level's summary
        self.live = Progress("benchmark") if progress else None
        self.path = PATHS[endpoint]
        # aiohttp (C HTTP parser: the client's CPU per token stays below `vllm bench serve`'s, which
        # uses it too); trust_env off: a proxy from the environment would be measured too
        self.client = aiohttp.ClientSession(
            base_url=root, headers={"Authorization": f"Bearer {api_key}"}, trust_env=False,
            timeout=aiohttp.ClientTimeout(total=timeout, connect=10.0),
            connector=aiohttp.TCPConnector(limit=connections + 4, keepalive_timeout=smoke.KEEPALIVE_S))
        self.prompts = _Prompts(self.client, model, endpoint)

    async def __aenter__(self) -> "_Session":
        return self

    async def __aexit__(self, *exc) -> None:
        if self.live is not None:
            self.live.close()
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
                                 "Is the server up? (the serving and smoke test steps)") from None
        card = next((c for c in cards if c.get("id") == self.model), None)
        if card is None:
            raise SparkbookError(f"benchmark: {self.model!r} is not served at {self.api} "
                                 f"(served: {', '.join(c.get('id', '?') for c in cards) or 'none'})")
        return card

    def body(self, prompt: str, output_tokens: int) -> dict:
        b: dict[str, Any] = {"model": self.model, "max_tokens": output_tokens,
                             "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        if self.temperature is not None:
            b["temperature"] = self.temperature
        if self.endpoint == "chat":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        return b

    async def request(self, prompt: str, output_tokens: int, index: int, t0: float) -> RequestRecord:
        """One streamed request, timed. Parses each SSE event with one json.loads and keeps only
        timestamps: no per-token work beyond that."""
        rec, marks, bare, usage = RequestRecord(index), [], [], None
        body = self.body(prompt, output_tokens)
        sent = time.perf_counter()
        rec.sent_s = sent - t0
        try:
            async with self.client.post(self.path, json=body) as resp:
                if resp.status != 200:
                    raise _Fail(f"HTTP {resp.status}: {_error_text(await resp.read())}")
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
                            raise _Fail(f"error in the stream: {_error_text(data)}")
                        usage = event.get("usage") or usage
                        for c in event.get("choices") or ():
                            d = c.get("delta") or c
                            if (d.get("content") or d.get("text") or d.get("reasoning_content")
                                    or d.get("reasoning") or d.get("tool_calls")):
                                marks.append(now)
                            else:  # a token with no text of its own (a special token, part of a character)
                                bare.append(now)
                            rec.finish_reason = c.get("finish_reason") or rec.finish_reason
                end = time.perf_counter()
        except _Fail as e:
            rec.error = str(e)
            return rec
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            rec.error = f"{type(e).__name__}: {e}".rstrip(": ")
            return rec
        if not usage or not usage.get("completion_tokens"):
            rec.error = "no usage in the stream (stream_options.include_usage not honoured)"
            return rec
        if not marks:  # every token was text-less (a random model can loop on a special token):
            marks = bare  # time the tokens as they came
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

    async def warm(self, n: int, prompt_tokens: int, output_tokens: int, seed: int) -> list[str]:
        """Requests before measuring (first-request compilation, connections); their errors."""
        if n <= 0:
            return []
        texts = await self.prompts.batch(n, prompt_tokens, f"{seed}/{self.salt}/warmup")
        t0 = time.perf_counter()
        recs = await asyncio.gather(*(self.request(t, min(output_tokens, WARMUP_TOKENS), i, t0)
                                      for i, t in enumerate(texts)))
        bad = [r.error for r in recs if not r.ok]
        self.say(f"warm-up: {n - len(bad)}/{n} requests ok" + (f"; {bad[0]}" if bad else ""))
        return bad

    async def level(self, kind: str, label: str, *, prompt_tokens: int, output_tokens: int,
                    num_requests: int, concurrency: int | None, request_rate: float | None, seed: int,
                    depth: int | None = None,
                    on_request: Callable[[RequestRecord], None] | None = None) -> LevelResult:
        """Measure one level: closed loop (``concurrency`` workers, each sending its next request
        when the last one ends) or, with ``request_rate``, open loop (Poisson arrivals, at most
        ``concurrency`` in flight when given)."""
        if request_rate is None and not concurrency:
            raise ValueError("a closed-loop level needs a concurrency of at least 1")
        lv = LevelResult(kind, label, self.endpoint, prompt_tokens, output_tokens, concurrency,
                         request_rate, num_requests, seed, depth)
        missed = self.prompts.missed
        texts = await self.prompts.batch(num_requests, prompt_tokens, f"{seed}/{self.salt}/{kind}/{label}")
        missed = self.prompts.missed - missed
        lv.prompt_sizing = self.prompts.sizing + (f"; {missed} prompt(s) off the exact count" if missed else "")
        counts, started = Counter(), time.monotonic()
        records: list[RequestRecord] = [RequestRecord(i, error="not sent") for i in range(num_requests)]
        lag: list[float] = []

        async def watch_loop() -> None:  # how late the event loop wakes: the client's own delay
            while True:
                t = time.perf_counter()
                await asyncio.sleep(LAG_INTERVAL_S)
                lag.append((time.perf_counter() - t - LAG_INTERVAL_S) * 1e3)

        async def one(i: int, lateness_ms: float | None) -> None:
            rec = await self.request(texts[i], output_tokens, i, t0)
            rec.lateness_ms = lateness_ms
            records[i] = rec
            counts[rec.ok] += 1
            if self.live is not None:
                self.live.update(label, f"{bar(counts.total(), num_requests, started, unit='req')}"
                                        f"  failed {counts[False]}")
            if on_request is not None:
                on_request(rec)

        watcher = asyncio.create_task(watch_loop())
        cpu0, t0 = time.thread_time(), time.perf_counter()
        try:
            if request_rate is None:
                todo = iter(range(num_requests))

                async def worker() -> None:
                    for i in todo:  # shared: each request is taken by one worker
                        await one(i, None)

                await asyncio.gather(*(worker() for _ in range(min(concurrency, num_requests))))
            else:
                gate = asyncio.Semaphore(concurrency) if concurrency else None

                async def gated(i: int, late: float) -> None:
                    if gate is None:
                        return await one(i, late)
                    async with gate:
                        await one(i, late)

                tasks = []
                for i, at in enumerate(arrival_times(num_requests, request_rate, seed)):
                    wait = t0 + at - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    tasks.append(asyncio.create_task(gated(i, (time.perf_counter() - t0 - at) * 1e3)))
                await asyncio.gather(*tasks)
        finally:
            watcher.cancel()
        duration, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        lv.summarize(records, duration, cpu, lag)
        if self.live is not None:
            self.live.update(label, lv.line(labelled=False), force=True)
        else:
            self.say(lv.line())
        return lv


def _salt(salt: str | None) -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds") if salt is None else salt


def _run_async(make: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine on a fresh event loop in a thread of its own: a notebook's kernel already
    runs a loop in the main thread (asyncio.run would refuse), and the client's CPU time is then
    that thread's alone. Interrupting the kernel cancels the run."""
    box: dict[str, Any] = {}

    async def main() -> Any:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        return await make()

    def target() -> None:
        try:
            box["result"] = asyncio.run(main())
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="sparkbook-bench", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.2)
    except KeyboardInterrupt:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["task"].cancel)
        t.join(30)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_load(base_url: str, model: str, *, prompt_tokens: int, output_tokens: int,
             concurrency: int | None, num_requests: int, request_rate: float | None = None,
             seed: int = 0, endpoint: str = "chat", warmup: int = 1, timeout: float = 600.0,
             api_key: str = "EMPTY", temperature: float | None = 0.0, prompt_salt: str | None = None,
             progress: bool = True, say: Callable[[str], None] = print,
             on_request: Callable[[RequestRecord], None] | None = None) -> LevelResult:
    """One level of load, standalone: the same load as ``vllm bench serve --dataset-name random
    --random-input-len P --random-output-len O --ignore-eos --num-prompts N --max-concurrency C
    [--request-rate R] --seed S`` (``endpoint="completions"`` for its default endpoint).

    Closed loop with ``concurrency`` when ``request_rate`` is None; otherwise Poisson arrivals at
    ``request_rate`` per second, at most ``concurrency`` in flight (None: unbounded).
    ``progress`` shows a live line per level (:mod:`sparkbook.progress`) that ends as the level's
    summary; without it the summary goes to ``say``. ``on_request`` is called in the client's
    loop with each finished request; ``prompt_salt``
    (default: now) varies the prompts between runs of the same seed (see the module docstring)."""
    salt = _salt(prompt_salt)
    kind_label = f"{request_rate:g} req/s" if request_rate else f"c={concurrency}"

    async def main() -> LevelResult:
        async with _Session(base_url, model, endpoint=endpoint, connections=concurrency or num_requests,
                            timeout=timeout, api_key=api_key, temperature=temperature,
                            progress=progress, say=say, prompt_salt=salt) as s:
            await s.model_card()
            say(f"prompt sizing: {await s.prompts.probe()}")
            await s.warm(warmup, prompt_tokens, output_tokens, seed)
            return await s.level("load", kind_label, prompt_tokens=prompt_tokens,
                                 output_tokens=output_tokens, num_requests=num_requests,
                                 concurrency=concurrency, request_rate=request_rate, seed=seed,
                                 on_request=on_request)

    return _run_async(main)


def run(base_url: str, model: str, benchmark: Benchmark, *, endpoint: str = "chat",
        max_model_len: int | None = None, warmup: int = 2, depth_requests: int = 3,
        timeout: float = 600.0, api_key: str = "EMPTY", temperature: float | None = 0.0,
        prompt_salt: str | None = None, progress: bool = True,
        say: Callable[[str], None] = print) -> Results:
    """The whole benchmark of ``params.benchmark``: warm-up, single user at each context depth
    (``depth_requests`` requests each), the concurrency sweep (``max(requests_per_level, c)``
    requests at concurrency c) and the request-rate sweep (``requests_per_level`` each).

    Levels that would not fit ``max_model_len`` (default: what /v1/models says) are skipped and
    listed. Raises :class:`SparkbookError` when the server or the model is not there."""
    b = benchmark
    levels = [c for c in b.concurrency if c >= 1]
    connections = max(levels + ([b.requests_per_level] if b.request_rates else []) + [warmup, 1])
    started = datetime.now(timezone.utc)
    salt = _salt(prompt_salt)

    async def main() -> Results:
        async with _Session(base_url, model, endpoint=endpoint, connections=connections,
                            timeout=timeout, api_key=api_key, temperature=temperature,
                            progress=progress, say=say, prompt_salt=salt) as s:
            card = await s.model_card()
            limit = max_model_len or card.get("max_model_len")
            res = Results(model, s.api, endpoint, started.isoformat(timespec="seconds"), b.seed,
                          b.model_dump(), salt, await s.prompts.probe(), limit, warmup)
            say(f"benchmark of {model} at {s.api} ({endpoint}); prompt sizing: {res.prompt_sizing}")
            res.warmup_errors = await s.warm(warmup, b.prompt_tokens, b.output_tokens, b.seed)

            async def level(kind: str, label: str, tokens: int, **kw) -> LevelResult | None:
                if limit and tokens + b.output_tokens > limit:
                    why = f"{tokens} prompt + {b.output_tokens} output tokens exceed max_model_len {limit}"
                    res.skipped.append(f"{label}: {why}")
                    say(f"{label}: skipped ({why})")
                    return None
                return await s.level(kind, label, prompt_tokens=tokens, output_tokens=b.output_tokens,
                                     seed=b.seed, **kw)

            for d in b.context_depths:
                lv = await level("depth", f"depth {d}", d + b.prompt_tokens, num_requests=depth_requests,
                                 concurrency=1, request_rate=None, depth=d)
                res.depths += [lv] if lv else []
            for c in levels:
                lv = await level("concurrency", f"c={c}", b.prompt_tokens,
                                 num_requests=max(b.requests_per_level, c), concurrency=c, request_rate=None)
                res.concurrency += [lv] if lv else []
            for rate in b.request_rates:
                lv = await level("rate", f"{rate:g} req/s", b.prompt_tokens,
                                 num_requests=b.requests_per_level, concurrency=None, request_rate=rate)
                res.rates += [lv] if lv else []
            res.duration_s = (datetime.now(timezone.utc) - started).total_seconds()
            return res

    return _run_async(main)


# ---- results: files, tables, verdict, plots ----------------------------------------------------

def save(results: Results, run_dir: Path) -> dict[str, Path]:
    """``results.json`` (everything, with every request) and ``levels.csv`` (a row per level) in
    ``RUN_DIR/benchmark/``; the schema is in this module's docstring."""
    out = Path(run_dir) / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    results.source = Path(run_dir).name
    paths = {"json": out / "results.json", "csv": out / "levels.csv"}
    paths["json"].write_text(json.dumps(results.to_json(), indent=1) + "\n")
    rows = [lv.flat() for lv in results.levels]
    Table(list(rows[0]) if rows else ["label"], [list(r.values()) for r in rows]).write_csv(paths["csv"])
    return paths


def load(path: Path) -> Results:
    """Results from a ``results.json`` (or a run folder holding ``benchmark/results.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / FOLDER / "results.json"
    return Results.from_json(json.loads(path.read_text()))


def earlier(outputs: Path, model: str, *, exclude: Path | None = None) -> list[Results]:
    """The results of earlier runs of the same model under ``outputs/*/benchmark/``, oldest first;
    ``exclude`` names the current run folder. Unreadable files are passed over."""
    found = []
    for p in sorted(Path(outputs).glob(f"*/{FOLDER}/results.json")):
        if exclude is not None and p.parent.parent.resolve() == Path(exclude).resolve():
            continue
        try:
            r = load(p)
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if r.model == model:
            r.source = r.source or p.parent.parent.name
            found.append(r)
    return sorted(found, key=lambda r: r.started)


def table(results: Results) -> Table:
    def n(v: float | None, fmt: str = ".1f") -> str:
        return "" if v is None else format(v, fmt)

    rows = [[lv.label, f"{lv.completed}/{lv.num_requests}", n(lv.output_tok_s), n(lv.per_user_tok_s),
             n(lv.prefill_tok_s, ".0f"), n(lv.decode_tok_s), n(lv.ttft_ms["p50"], ".0f"),
             n(lv.ttft_ms["p99"], ".0f"), n(lv.tpot_ms["p50"]), n(lv.itl_ms["p50"]), n(lv.itl_ms["p99"]),
             n(lv.e2e_ms["p50"], ".0f"), f"{lv.client_cpu_frac:.0%}", "yes" if lv.client_bound else ""]
            for lv in results.levels]
    return Table(["level", "ok", "out tok/s", "tok/s/user", "prefill tok/s", "decode tok/s",
                  "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "ITL p50 ms", "ITL p99 ms",
                  "E2E p50 ms", "client CPU", "client-bound"], rows,
                 title=f"benchmark: {results.model} ({results.endpoint}, prompts {results.prompt_sizing})")


def verdict(results: Results, references: Sequence[Reference] = (), node: str = "api") -> Verdict:
    """Each level completed without failures (FAIL), with the fixed output length (WARN); the
    client was not the bottleneck (WARN); single-user decode against each reference (WARN when
    below: informational, the hardware and model decide, not the deployment)."""
    v = Verdict("benchmark")
    for lv in results.levels:
        expected = f"{lv.num_requests} requests complete, {lv.output_tokens} output tokens each"
        if lv.failures:
            v.add(Check(f"load {lv.label}", node, FAIL, f"{lv.failures}/{lv.num_requests} failed: "
                        + "; ".join(lv.errors[:3]), expected,
                        "see the server's log (docker logs on the head): a prompt over max_model_len, "
                        "KV cache exhausted, a crashed worker, or a request timeout (timeout=)",
                        lv.describe()))
        elif lv.output_tokens_mean != lv.output_tokens:
            v.add(Check(f"load {lv.label}", node, WARN, f"{lv.output_tokens_mean:g} output tokens on "
                        "average", expected, "the server ignored ignore_eos: the levels "
                        "are not comparable (is it vLLM?)", lv.describe()))
        else:
            v.add(Check(f"load {lv.label}", node, PASS, f"{lv.completed}/{lv.num_requests} ok, "
                        f"{lv.output_tok_s:.1f} output tok/s", expected, command=lv.describe()))
    for s in results.skipped:
        label, why = s.split(": ", 1)
        v.add(Check(f"load {label}", node, SKIP, why, "fits the model's context",
                    "raise serving.max_model_len or lower benchmark.context_depths"))
    if not results.levels:
        v.add(Check("benchmark", node, FAIL, "no level was measured", "at least one level",
                    "check benchmark.context_depths, concurrency and max_model_len"))
    if results.prompt_sizing.startswith("estimated"):
        v.add(Check("prompt sizing", node, WARN, results.prompt_sizing, "exact token counts",
                    "the server has no /tokenize (not vLLM?): prompt lengths are estimates; the "
                    "server's counts are in prompt_tokens_mean"))
    bound = [lv for lv in results.levels if lv.client_bound]
    v.add(Check("load generator", "client", WARN if bound else PASS,
                "; ".join(f"{lv.label}: {lv.client_note}" for lv in bound) or
                f"at most {max((lv.client_cpu_frac for lv in results.levels), default=0):.0%} of a core",
                f"client CPU under {CLIENT_CPU_LIMIT:.0%} of a core, lateness p99 under {LATE_LIMIT_MS:g} ms",
                "the client, not the server, limited these levels: run the benchmark from a less "
                "loaded machine or with fewer levels at once" if bound else ""))
    one = results.single_user()
    for ref in references:
        if ref.single_user_tok_s is None:
            continue
        name = f"single user vs {ref.label}"
        if one is None:
            v.add(Check(name, node, SKIP, "no single-user level measured", f"≥ {ref.single_user_tok_s:g} tok/s"))
            continue
        ok = one.decode_tok_s >= ref.single_user_tok_s
        v.add(Check(name, node, PASS if ok else WARN, f"{one.decode_tok_s:.1f} decode tok/s ({one.label})",
                    f"≥ {ref.single_user_tok_s:g} tok/s (benchmark.references)",
                    "" if ok else "informational: below the reference; compare the model, "
                    "quantization, versions and settings the reference used", one.describe()))
    return v


def plot(results: Results, run_dir: Path | None = None, *, earlier: Sequence[Results] = (),
         references: Sequence[Reference] = ()) -> dict[str, Any]:
    """The figures, each saved as ``RUN_DIR/benchmark/NAME.png`` when ``run_dir`` is given:
    throughput and per-user tok/s vs concurrency, latency percentiles vs concurrency, TTFT and ITL
    distributions, tok/s vs context depth, and the rate sweep; earlier runs (see :func:`earlier`)
    as dashed lines, the references as horizontal lines."""
    import matplotlib.pyplot as plt

    refs = [r for r in references if r.single_user_tok_s]
    figs: dict[str, Any] = {}

    def xy(levels: list[LevelResult], x: str, y: Callable[[LevelResult], float | None]):
        pts = [(getattr(lv, x), y(lv)) for lv in levels if y(lv) is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    def lines(ax, group: str, x: str, y: Callable[[LevelResult], float | None]) -> None:
        ax.plot(*xy(getattr(results, group), x, y), marker="o", label="this run")
        for old in earlier:
            xs, ys = xy(getattr(old, group), x, y)
            if xs:
                ax.plot(xs, ys, linestyle="--", marker=".", alpha=0.6, label=old.source or old.started)

    def ref_lines(ax) -> None:
        for i, r in enumerate(refs):
            ax.axhline(r.single_user_tok_s, color=f"C{(i + 3) % 10}", linestyle=":",
                       label=f"{r.label}: {r.single_user_tok_s:g} tok/s")

    def finish(name: str, fig, title: str):
        for ax in fig.axes:
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        fig.suptitle(f"{title}: {results.model}")
        fig.tight_layout()
        if run_dir is not None:
            path = Path(run_dir) / FOLDER / f"{name}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=110)
        plt.close(fig)  # shown by returning it, not by pyplot's state
        figs[name] = fig

    cs = [lv.concurrency for lv in results.concurrency]

    def concurrency_axis(ax) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")

    if results.concurrency:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        lines(a, "concurrency", "concurrency", lambda lv: lv.output_tok_s)
        lines(b, "concurrency", "concurrency", lambda lv: lv.per_user_tok_s)
        ref_lines(b)
        for ax, what in ((a, "output tok/s (all users)"), (b, "decode tok/s per user")):
            ax.set_ylabel(what)
            concurrency_axis(ax)
        finish("throughput", fig, "throughput")

        fig, axes = plt.subplots(2, 2, figsize=(11, 7))
        names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E latency"}
        for ax, (m, name) in zip(axes.flat, names.items()):
            for p, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                ax.plot(*xy(results.concurrency, "concurrency", lambda lv: getattr(lv, m)[p]),
                        linestyle=style, marker="o", label=f"{p}")
            for old in earlier:
                xs, ys = xy(old.concurrency, "concurrency", lambda lv: getattr(lv, m)["p50"])
                if xs:
                    ax.plot(xs, ys, linestyle="--", marker=".", alpha=0.5,
                            label=f"p50 {old.source or old.started}")
            ax.set_ylabel(f"{name} (ms)")
            concurrency_axis(ax)
        finish("latency", fig, "latency percentiles")

        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        labels = [lv.label for lv in results.concurrency]
        a.boxplot([[r.ttft_ms for r in lv.requests if r.ok] or [np.nan] for lv in results.concurrency])
        b.boxplot([[x for r in lv.requests if r.ok for x in r.itl_ms] or [np.nan]
                   for lv in results.concurrency], showfliers=False)
        a.set(ylabel="TTFT (ms)")
        b.set(ylabel="ITL (ms), outliers hidden")
        for ax in (a, b):
            ax.set_xticks(range(1, len(labels) + 1), labels)
        finish("distributions", fig, "TTFT and ITL distributions")

    if results.depths:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        lines(a, "depths", "depth", lambda lv: lv.prefill_tok_s)
        lines(b, "depths", "depth", lambda lv: lv.decode_tok_s)
        ref_lines(b)
        for ax, what in ((a, "prefill tok/s"), (b, "decode tok/s")):
            ax.set(xlabel="context depth (tokens before the prompt)", ylabel=what)
        finish("depth", fig, "single user by context depth")

    if results.rates:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        lines(a, "rates", "request_rate", lambda lv: lv.output_tok_s)
        for p, style in (("p50", "-"), ("p99", ":")):
            b.plot(*xy(results.rates, "request_rate", lambda lv: lv.ttft_ms[p]), linestyle=style,
                   marker="o", label=f"TTFT {p}")
        a.set(xlabel="request rate (req/s)", ylabel="output tok/s")
        b.set(xlabel="request rate (req/s)", ylabel="TTFT (ms)")
        finish("rates", fig, "open-loop request rate")
    return figs
