"""The load the benchmark puts on the server: the patterns (closed loop at a concurrency, open loop
with Poisson arrivals), one level measured with them, one level standalone (:func:`run_load`, the
load of ``vllm bench serve``) and the whole benchmark (:func:`run`)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable

from ..book.progress import Progress, bar, fraction_of
from ..params import profiles
from ..params.settings import Benchmark
from . import board
from .client import Session
from .prompts import Prompts
from .records import LevelResult, RequestRecord, Results

LAG_INTERVAL_S = 0.5  # the loop-lag probe: often enough to see a stall, rare enough to cost nothing
WARMUP_TOKENS = 32

# Sends request i; the second argument is how late it was sent against its schedule (ms; open loop)
Send = Callable[[int, float | None], Awaitable[None]]


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """When each of ``n`` requests is sent (seconds from the start) in a Poisson process of
    ``rate`` per second: exponential gaps from a seeded RNG, computed ahead so that a run repeats
    exactly and the client only sleeps against it. The first request goes at 0."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def closed_loop(send: Send, n: int, concurrency: int) -> None:
    """``concurrency`` workers, each sending its next request when its last one ends."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:  # shared: each request is taken by one worker
            await send(i, None)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))


async def open_loop(send: Send, n: int, rate: float, concurrency: int | None, seed: int,
                    t0: float) -> None:
    """Poisson arrivals at ``rate`` per second from ``t0`` (see :func:`arrival_times`), at most
    ``concurrency`` in flight when given; each request learns how late it was sent."""
    gate = asyncio.Semaphore(concurrency) if concurrency else None

    async def gated(i: int, late: float) -> None:
        if gate is None:
            return await send(i, late)
        async with gate:
            await send(i, late)

    tasks = []
    for i, at in enumerate(arrival_times(n, rate, seed)):
        wait = t0 + at - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(gated(i, (time.perf_counter() - t0 - at) * 1e3)))
    await asyncio.gather(*tasks)


class Runner:
    """What every level of a run shares: the connection pool, the prompt maker and the live
    progress, one line per level that ends as the level's summary (else the summary goes to
    ``say``)."""

    def __init__(self, session: Session, *, prompt_salt: str, progress: bool, say: Callable[[str], None]):
        self.session, self.salt, self.say = session, prompt_salt, say
        self.prompts = Prompts(session.tokenize, session.endpoint)
        self.live = Progress("benchmark") if progress else None

    def tick(self, label: str, counts: Counter, total: int, started: float) -> None:
        """The level's live line: requests done of ``total`` (``counts``: by ok) and failed."""
        if self.live is not None:
            self.live.update(label, f"{bar(counts.total(), total, started, unit='req')}  failed {counts[False]}",
                             fraction=fraction_of(counts.total(), total))

    def finish(self, label: str, lv: LevelResult) -> LevelResult:
        """The level's final line, in place of its live one (or said, without a live display)."""
        if self.live is not None:
            self.live.update(label, lv.line(labelled=False), force=True, fraction=1.0)
        else:
            self.say(lv.line())
        return lv

    async def warm(self, n: int, prompt_tokens: int, output_tokens: int, seed: int) -> list[str]:
        """Requests before measuring (first-request compilation, connections); their errors."""
        if n <= 0:
            return []
        texts = await self.prompts.batch(n, prompt_tokens, f"{seed}/{self.salt}/warmup")
        t0 = time.perf_counter()
        recs = await asyncio.gather(*(self.session.request(t, min(output_tokens, WARMUP_TOKENS), i, t0)
                                      for i, t in enumerate(texts)))
        bad = [r.error for r in recs if not r.ok]
        self.say(f"warm-up: {n - len(bad)}/{n} requests ok" + (f"; {bad[0]}" if bad else ""))
        return bad

    async def level(self, kind: str, label: str, *, prompt_tokens: int, output_tokens: int,
                    num_requests: int, concurrency: int | None, request_rate: float | None, seed: int,
                    depth: int | None = None,
                    on_request: Callable[[RequestRecord], None] | None = None) -> LevelResult:
        """Measure one level: closed loop (``concurrency`` workers) or, with ``request_rate``,
        open loop (Poisson arrivals, at most ``concurrency`` in flight when given)."""
        if request_rate is None and not concurrency:
            raise ValueError("a closed-loop level needs a concurrency of at least 1")
        lv = LevelResult(kind, label, self.session.endpoint, prompt_tokens, output_tokens, concurrency,
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

        async def send(i: int, lateness_ms: float | None) -> None:
            rec = await self.session.request(texts[i], output_tokens, i, t0)
            rec.lateness_ms = lateness_ms
            records[i] = rec
            counts[rec.ok] += 1
            self.tick(label, counts, num_requests, started)
            if on_request is not None:
                on_request(rec)

        watcher = asyncio.create_task(watch_loop())
        cpu0, t0 = time.thread_time(), time.perf_counter()
        lv.started_at = time.time()  # the same moment on the clock the server's samples share
        try:
            if request_rate is None:
                await closed_loop(send, num_requests, concurrency)
            else:
                await open_loop(send, num_requests, request_rate, concurrency, seed, t0)
        finally:
            watcher.cancel()
        duration, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        lv.summarize(records, duration, cpu, lag)
        return self.finish(label, lv)

    async def cell(self, label: str, *, depth: int, concurrency: int, prompt_tokens: int, output_tokens: int,
                   runs: int, latency: float, many: bool, seed: int) -> LevelResult:
        """One cell of a profile's grid measured the leaderboard's way (:mod:`.board`): the level
        of its measured requests with sparkbook's figures, and the board's in ``board``."""
        lv = LevelResult("depth", label, self.session.endpoint, depth + prompt_tokens, output_tokens,
                         concurrency, None, runs * concurrency, seed, depth)
        counts, started = Counter(), time.monotonic()

        def done(replies: list[board.Reply]) -> None:
            counts.update(r.record.ok for r in replies)
            self.tick(label, counts, lv.num_requests, started)

        cpu0 = time.thread_time()
        lv.started_at = time.time()
        got = await board.cell(self.session, self.prompts, depth=depth, concurrency=concurrency,
                               prompt_tokens=prompt_tokens, output_tokens=output_tokens, runs=runs,
                               latency=latency, key=f"{seed}/{self.salt}/board/{label}", many=many, done=done)
        lv.prompt_sizing = self.prompts.sizing
        lv.summarize(got.records, got.duration_s, time.thread_time() - cpu0, [])
        lv.board = got.board
        return self.finish(label, lv)


@asynccontextmanager
async def _runner(base_url: str, model: str, *, connections: int, prompt_salt: str, progress: bool,
                  say: Callable[[str], None], **client: Any) -> AsyncIterator[Runner]:
    """A :class:`Runner` on a fresh connection pool (``client``: :class:`Session`'s options),
    closed with it."""
    async with Session(base_url, model, connections=connections, **client) as session:
        runner = Runner(session, prompt_salt=prompt_salt, progress=progress, say=say)
        try:
            yield runner
        finally:
            if runner.live is not None:
                runner.live.close()


def _salt(salt: str | None) -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds") if salt is None else salt


def run_async(make: Callable[[], Awaitable[Any]]) -> Any:
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
    ``progress`` shows a live line per level (:mod:`sparkbook.book.progress`) that ends as the level's
    summary; without it the summary goes to ``say``. ``on_request`` is called in the client's
    loop with each finished request; ``prompt_salt``
    (default: now) varies the prompts between runs of the same seed (see :mod:`sparkbook.bench`)."""
    salt = _salt(prompt_salt)
    kind_label = f"{request_rate:g} req/s" if request_rate else f"c={concurrency}"

    async def main() -> LevelResult:
        async with _runner(base_url, model, connections=concurrency or num_requests, prompt_salt=salt,
                           progress=progress, say=say, endpoint=endpoint, timeout=timeout,
                           api_key=api_key, temperature=temperature) as r:
            await r.session.model_card()
            say(f"prompt sizing: {await r.prompts.probe()}")
            await r.warm(warmup, prompt_tokens, output_tokens, seed)
            return await r.level("load", kind_label, prompt_tokens=prompt_tokens,
                                 output_tokens=output_tokens, num_requests=num_requests,
                                 concurrency=concurrency, request_rate=request_rate, seed=seed,
                                 on_request=on_request)

    return run_async(main)


def run_board(base_url: str, model: str, *, depths: list[int], concurrency: list[int], prompt_tokens: int,
              output_tokens: int, runs: int = 3, seed: int = 0, warmup: int = 2, timeout: float = 600.0,
              api_key: str = "EMPTY", prompt_salt: str | None = None, progress: bool = True,
              say: Callable[[str], None] = print) -> list[LevelResult]:
    """A grid measured the leaderboard's way (:mod:`.board`), standalone: what ``llama-benchy
    --pp P --tg T --depth D... --concurrency C... --runs R --enable-prefix-caching`` measures,
    every depth at every concurrency; a level per cell, labelled as its decode row."""
    salt = _salt(prompt_salt)
    grid = profiles.Profile("grid", tuple(depths), tuple(concurrency), prompt_tokens, output_tokens, "")

    async def main() -> list[LevelResult]:
        async with _runner(base_url, model, connections=max(concurrency + [warmup]), prompt_salt=salt,
                           progress=progress, say=say, endpoint="chat", timeout=timeout, api_key=api_key,
                           temperature=None) as r:
            await r.session.model_card()
            say(f"prompt sizing: {await r.prompts.probe()}")
            await r.warm(warmup, prompt_tokens, output_tokens, seed)
            latency = await r.session.latency()
            return [await r.cell(grid.label(d, c), depth=d, concurrency=c, prompt_tokens=prompt_tokens,
                                 output_tokens=output_tokens, runs=runs, latency=latency,
                                 many=max(concurrency) > 1, seed=seed)
                    for d in depths for c in concurrency]

    return run_async(main)


def run(base_url: str, model: str, benchmark: Benchmark, *, endpoint: str = "chat",
        max_model_len: int | None = None, warmup: int = 2, depth_requests: int = 3,
        timeout: float = 600.0, api_key: str = "EMPTY", temperature: float | None = 0.0,
        prompt_salt: str | None = None, progress: bool = True,
        say: Callable[[str], None] = print) -> Results:
    """The whole benchmark of ``params.benchmark``: warm-up, single user at each context depth
    (``depth_requests`` requests each), the concurrency sweep (``max(requests_per_level, c)``
    requests at concurrency c) and the request-rate sweep (``requests_per_level`` each). With a
    ``benchmark.profile`` (:mod:`.profiles`) every context depth at every concurrency c instead,
    measured the leaderboard's way (:mod:`.board`: ``depth_requests`` measured rounds of c
    requests, in ``depths``), no separate concurrency sweep.

    Levels that would not fit ``max_model_len`` (default: what /v1/models says) are skipped and
    listed. Raises :class:`SparkbookError` when the server or the model is not there."""
    b = benchmark
    levels = [c for c in b.concurrency if c >= 1]
    connections = max(levels + ([b.requests_per_level] if b.request_rates else []) + [warmup, 1])
    started = datetime.now(timezone.utc)
    salt = _salt(prompt_salt)

    async def main() -> Results:
        async with _runner(base_url, model, connections=connections, prompt_salt=salt, progress=progress,
                           say=say, endpoint=endpoint, timeout=timeout, api_key=api_key,
                           temperature=temperature) as r:
            card = await r.session.model_card()
            limit = max_model_len or card.get("max_model_len")
            res = Results(model, r.session.api, endpoint, started.isoformat(timespec="seconds"), b.seed,
                          b.model_dump(), salt, await r.prompts.probe(), limit, warmup)
            say(f"benchmark of {model} at {r.session.api} ({endpoint}); prompt sizing: {res.prompt_sizing}")
            res.warmup_errors = await r.warm(warmup, b.prompt_tokens, b.output_tokens, b.seed)

            def too_long(tokens: int) -> str:
                if limit and tokens + b.output_tokens > limit:
                    return f"{tokens} prompt + {b.output_tokens} output tokens exceed max_model_len {limit}"
                return ""

            def skip(label: str, why: str) -> None:
                res.skipped.append(f"{label}: {why}")
                say(f"{label}: skipped ({why})")

            async def level(kind: str, label: str, tokens: int, **kw) -> LevelResult | None:
                if why := too_long(tokens):
                    return skip(label, why)
                return await r.level(kind, label, prompt_tokens=tokens, output_tokens=b.output_tokens,
                                     seed=b.seed, **kw)

            grid = profiles.get(b.profile)  # a leaderboard's grid: every depth at every concurrency
            latency = await r.session.latency() if grid else 0.0
            for d in b.context_depths:
                for c in levels if grid else [1]:
                    if not grid:
                        lv = await level("depth", f"depth {d}", d + b.prompt_tokens, num_requests=depth_requests,
                                         concurrency=1, request_rate=None, depth=d)
                    elif not (why := too_long(d + b.prompt_tokens)):
                        lv = await r.cell(grid.label(d, c), depth=d, concurrency=c, prompt_tokens=b.prompt_tokens,
                                          output_tokens=b.output_tokens, runs=depth_requests, latency=latency,
                                          many=max(levels) > 1, seed=b.seed)
                    else:
                        lv = skip(grid.label(d, c), why)
                    res.depths += [lv] if lv else []
            for c in [] if grid else levels:
                lv = await level("concurrency", f"c={c}", b.prompt_tokens,
                                 num_requests=max(b.requests_per_level, c), concurrency=c, request_rate=None)
                res.concurrency += [lv] if lv else []
            for rate in b.request_rates:
                lv = await level("rate", f"{rate:g} req/s", b.prompt_tokens,
                                 num_requests=b.requests_per_level, concurrency=None, request_rate=rate)
                res.rates += [lv] if lv else []
            res.duration_s = (datetime.now(timezone.utc) - started).total_seconds()
            return res

    return run_async(main)
