"""The leaderboard's measurement (``benchmark.profile: spark-arena``): each cell of its grid measured
as llama-benchy 0.4.0 measures it, the tool behind the Spark Arena board, so that a row reads
against the board's (its ``runner.py``, ``client.py`` and ``results.py``, read on PyPI's 0.4.0).

The procedure of a cell (context depth D, concurrency c, prompt P and output T tokens):

- ``runs`` + 1 rounds, the first not measured (llama-benchy's per-test warm-up); a round is c
  requests sent at once and awaited together (a batch, not a closed loop);
- at D > 0 (the board runs with ``prefix_caching: true``), a round first loads the context: c
  requests of a system message of D tokens and the user turn ``"."``; then the c measured requests,
  the same system message and a user prompt of P tokens, so that the prefix cache leaves only the
  new tokens to prefill. At D = 0, one request of P tokens with the chat template;
- the chat endpoint, streamed with ``return_token_ids``; the server's own sampling and no
  ``ignore_eos`` (a reply may end before T tokens), ``max_tokens`` T;
- the latency, taken off first-response times: the mean of 3 ``GET /v1/models`` (its ``api`` mode).

The figures, by llama-benchy's definitions (a request's clocks: sent; first response, its first
event with a choice; first token, its first chunk with text; each token's time, a chunk of k
tokens spread evenly since the token before it):

- ``ttfr``, ``e2e_ttft``: first response and first token, from sending (ms); ``est_ppt``: ``ttfr``
  less the latency;
- prefill t/s of a request: its prompt tokens / ``est_ppt``, the prompt tokens being the server's
  count where it is within 20 % of the tokens sent new (P, or D for a context load), else those;
- decode t/s of a request: the tokens after the first / the time from the first to the last;
- at c > 1 the batch's totals: prompt tokens / (last first token - first send), and decode
  tokens / (last token - first first token); ``peak``: the most tokens in any 1 s window;
- a cell's figure: the mean (and population deviation) over the measured rounds of the batch
  totals at c > 1, of the requests' own speeds at c = 1; ``(req)``: over every request.

The rows are labelled as llama-benchy labels them: ``pp2048 @ d4096 (c2)`` and ``tg128 @ d4096
(c2)``, ``ctx_pp @ d4096 (c2)`` and ``ctx_tg @ d4096 (c2)`` for the context loads. sparkbook's own,
stricter figures of the same measured requests (TTFT from sending with nothing taken off, decode
tok/s over E2E - TTFT, output tok/s over the whole round) stay in the level beside them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .client import Session, Trace
from .prompts import Prompts
from .records import RequestRecord

CONTEXT_PROBE = "."  # the user turn of a context load (llama-benchy's CONTEXT_LOAD_USER_MESSAGE)
LATENCY_PROBES = 3
PEAK_WINDOW_S = 1.0
PROMPT_TOLERANCE = 0.2  # the server's prompt count is used where within 20 % of the expected


@dataclass
class Reply:
    """One request of a round: sparkbook's record and llama-benchy's marks of it."""

    record: RequestRecord
    trace: Trace

    def token_times(self) -> list[float]:
        """When each generated token came: from ``token_ids`` where every text chunk has them (a
        chunk of k tokens spread evenly since the token before), else the server's completion
        count spread evenly from the first text chunk to the last."""
        chunks, out = self.trace.chunks, []
        if not chunks:
            return out
        if all(k is not None for _, k in chunks):
            for t, k in chunks:
                if k == 1:
                    out.append(t)
                elif k:
                    base = out[-1] if out else chunks[0][0]
                    out += [base + (t - base) * (i + 1) / k for i in range(k)]
            return out
        n, first, last = self.record.output_tokens or 0, chunks[0][0], chunks[-1][0]
        if n <= 1 or len(chunks) == 1 or last <= first:
            return [first] * max(n, 0)
        return [first + (last - first) * i / (n - 1) for i in range(n)]


def metric(values: Sequence[float], scale: float = 1.0) -> dict[str, Any] | None:
    """llama-benchy's ``{mean, std, values}`` (population deviation); None when nothing was measured."""
    if not values:
        return None
    a = np.asarray(values, dtype=float) * scale
    return {"mean": float(a.mean()), "std": float(a.std()), "values": [float(x) for x in a]}


def peak(times: Sequence[float], window: float = PEAK_WINDOW_S) -> float:
    """The most tokens in any ``window`` seconds, per second; over a shorter span, its own rate."""
    ts = sorted(times)
    if not ts:
        return 0.0
    span = ts[-1] - ts[0]
    if 0 < span < window:
        return len(ts) / span
    best, j = 0, 0
    for i, t in enumerate(ts):
        while j < i and ts[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best / window


def decode_tokens(times: Sequence[float]) -> int:
    return sum(t > times[0] for t in times) if len(times) > 1 else 0


def figures(rounds: Sequence[Sequence[Reply]], expected: int, latency: float, concurrency: int) -> dict:
    """A phase's figures over its measured rounds (see the module): ``pp`` (``t_s``, ``t_s_req``,
    ``ttfr``, ``est_ppt``, ``e2e_ttft``) and ``tg`` (``t_s``, ``t_s_req``, ``peak_ts``,
    ``peak_ts_req``), each a :func:`metric` or None."""
    v: dict[str, list[float]] = {k: [] for k in (
        "pp", "tg", "ttfr", "est_ppt", "e2e_ttft", "pp_total", "tg_total", "peak", "peak_req")}
    for replies in rounds:
        ok = [r for r in replies if r.record.ok]
        if not ok:
            continue
        prompts, starts, firsts, lasts, decoded, every = 0, [], [], [], 0, []
        for r in ok:
            tr, times = r.trace, r.token_times()
            got = r.record.prompt_tokens or 0
            n = got if got > 0 and abs(got - expected) < expected * PROMPT_TOLERANCE else expected
            prompts += n
            starts.append(tr.sent)
            every += times
            lasts.append(times[-1] if times else tr.end)
            if times:
                v["peak_req"].append(peak(times))
            ttfr = tr.first_response - tr.sent if tr.first_response else 0.0
            if tr.first_response:
                v["ttfr"].append(ttfr)
            if tr.chunks:
                first = tr.chunks[0][0]
                firsts.append(first)
                est = max(0.0, ttfr - latency)
                v["e2e_ttft"].append(first - tr.sent)
                v["est_ppt"].append(est)
                if est > 0:
                    v["pp"].append(n / est)
            k = decode_tokens(times)
            decoded += k
            if len(times) > 1 and k and times[-1] > times[0]:
                v["tg"].append(k / (times[-1] - times[0]))
        if firsts:
            if max(firsts) > min(starts):
                v["pp_total"].append(prompts / (max(firsts) - min(starts)))
            if decoded and max(lasts) > min(firsts):
                v["tg_total"].append(decoded / (max(lasts) - min(firsts)))
        if every:
            v["peak"].append(peak(every))
    many = concurrency > 1
    return {"pp": {"t_s": metric(v["pp_total"] if many else v["pp"]), "t_s_req": metric(v["pp"]),
                   "ttfr": metric(v["ttfr"], 1e3), "est_ppt": metric(v["est_ppt"], 1e3),
                   "e2e_ttft": metric(v["e2e_ttft"], 1e3)},
            "tg": {"t_s": metric(v["tg_total"] if many else v["tg"]), "t_s_req": metric(v["tg"]),
                   "peak_ts": metric(v["peak"]), "peak_ts_req": metric(v["peak_req"])}}


def rows(depth: int, concurrency: int, prompt_tokens: int, output_tokens: int, measured: dict,
         context: dict | None, many: bool) -> list[dict[str, Any]]:
    """The cell's rows of llama-benchy's table, under its test names (``many``: the suite has a
    concurrency above 1, so every name carries ``(cN)``): the context load's first, when there
    was one. A phase with no prefill (or decode) figure has no row of it."""
    c = f" (c{concurrency})" if many else ""
    d = f" @ d{depth}" if depth else ""
    out = []
    for pp_name, tg_name, fig in ((f"ctx_pp @ d{depth}{c}", f"ctx_tg @ d{depth}{c}", context),
                                  (f"pp{prompt_tokens}{d}{c}", f"tg{output_tokens}{d}{c}", measured)):
        if fig is None:
            continue
        pp, tg = fig["pp"], fig["tg"]
        if pp["t_s"]:
            out.append({"test_name": pp_name,
                        "t_s": pp["t_s"], "t_s_req": pp["t_s_req"], "peak_ts": None, "peak_ts_req": None,
                        "ttfr": pp["ttfr"], "est_ppt": pp["est_ppt"], "e2e_ttft": pp["e2e_ttft"]})
        if tg["t_s"] or tg["peak_ts"]:
            out.append({"test_name": tg_name,
                        "t_s": tg["t_s"], "t_s_req": tg["t_s_req"], "peak_ts": tg["peak_ts"],
                        "peak_ts_req": tg["peak_ts_req"], "ttfr": None, "est_ppt": None, "e2e_ttft": None})
    return out


async def batch(session: Session, asks: Sequence[str], contexts: Sequence[str | None], output_tokens: int,
                t0: float, first: int) -> list[Reply]:
    """One round's requests of a phase, sent at once (numbered from ``first``)."""
    async def one(i: int, ask: str, context: str | None) -> Reply:
        tr = Trace()
        rec = await session.request(ask, output_tokens, first + i, t0, context=context, exact=False, trace=tr)
        return Reply(rec, tr)

    return list(await asyncio.gather(*(one(i, a, c) for i, (a, c) in enumerate(zip(asks, contexts)))))


@dataclass
class Cell:
    """A measured cell: the measured requests' records (for sparkbook's own figures), the seconds
    their rounds took, and the board's figures and rows."""

    records: list[RequestRecord]
    duration_s: float
    board: dict[str, Any]


async def cell(session: Session, prompts: Prompts, *, depth: int, concurrency: int, prompt_tokens: int,
               output_tokens: int, runs: int, latency: float, key: str, many: bool,
               done: Any = None) -> Cell:
    """One cell as llama-benchy runs it (see the module). ``done``: called with each measured
    round's replies (progress)."""
    if session.endpoint != "chat":
        raise ValueError("the board's measurement runs on the chat endpoint (llama-benchy's)")
    measured: list[list[Reply]] = []
    loads: list[list[Reply]] = []
    records: list[RequestRecord] = []
    duration, t0 = 0.0, time.perf_counter()
    for r in range(runs + 1):
        contexts: list[str | None] = (await prompts.batch(concurrency, depth, f"{key}/{r}/context", form="prompt")
                                      if depth else [None] * concurrency)
        asks = await prompts.batch(concurrency, prompt_tokens, f"{key}/{r}/prompt",
                                   form="prompt" if depth else None)
        if depth:
            loaded = await batch(session, [CONTEXT_PROBE] * concurrency, contexts, output_tokens, t0, 0)
        start = time.perf_counter()
        replies = await batch(session, asks, contexts, output_tokens, t0, len(records))
        if r == 0:
            continue  # llama-benchy's warm-up round
        duration += time.perf_counter() - start
        measured.append(replies)
        records += [x.record for x in replies]
        loads += [loaded] if depth else []
        if done is not None:
            done(replies)
    if depth:  # sparkbook's prefill tok/s of a cached context: the tokens sent new, over TTFT
        for rec in records:
            if rec.ok and rec.prompt_tokens and rec.ttft_ms:
                rec.prefill_tok_s = max(rec.prompt_tokens - depth, 1) / (rec.ttft_ms / 1e3)
    fig = figures(measured, prompt_tokens, latency, concurrency)
    ctx = figures(loads, depth, latency, concurrency) if depth else None
    board = {"latency_ms": latency * 1e3, "runs": runs, "measured": fig, "context": ctx,
             "rows": rows(depth, concurrency, prompt_tokens, output_tokens, fig, ctx, many)}
    return Cell(records, duration, board)
