"""06's burn-in: does the served model keep answering, request after request and under load?

A deployment that answers ``/health`` and one chat completion can still break on the fifth request
or slow down after a minute. So, after the smoke checks, 06 sends:

* ``smoke.requests`` **sequential requests of mixed lengths** (prompt and output lengths drawn from
  a seeded RNG over the ranges of :class:`~sparkbook.params.settings.Smoke`), each held to a structurally
  sane answer: exactly the requested output length (``max_tokens`` with ``ignore_eos``, as the
  server's usage counts it), text that is valid UTF-8, a finish reason;
* then a **soak**: a closed loop at ``soak_concurrency`` for ``soak_s`` seconds with no failure and
  no drift: the last third of its requests (in the order they were sent) no slower than the first
  third by more than ``drift_limit`` times at the median, or not consistently so (a one-sided rank
  test, :func:`sparkbook.book.samples.slower`). A server that slows as it runs (thermal or power
  throttling, memory pressure, a leak) shows here, before its users notice; one request delayed
  by a neighbour on a busy machine does not fail it. Below
  :data:`~sparkbook.book.samples.MIN_GROUP` requests a third, drift is not judged (a WARN).

The requests go through the benchmark's client (:class:`sparkbook.bench.client.Session`: streamed,
timed, usage and finish reason) with prompts sized by the server's own tokenizer
(:class:`sparkbook.bench.prompts.Prompts`). Kept in ``RUN_DIR/smoke/burn_in.json`` (the settings
used, every request, the soak's drift: both medians, their ratio, the rank test's p) and
``burn_in.csv`` (one row per request).
"""

from __future__ import annotations

import asyncio
import csv
import itertools
import random
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, ClassVar

import aiohttp

from ..bench.client import Answer, ServerError, Session
from ..bench.load import run_async
from ..bench.prompts import Prompts
from ..bench.records import RequestRecord, stats
from ..book.errors import SparkbookError
from ..book.progress import Progress, bar, fraction_of
from ..book.samples import ALPHA, MIN_GROUP, Slower, slower
from ..book.step import Outcome
from ..book.tables import Table
from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..params import endpoint
from ..params.settings import Smoke

CSV = "smoke/burn_in.csv"
STOP_AFTER = 3  # request errors in a row that end the sequential requests: the server is down or hangs
POST = "POST /v1/chat/completions"


@dataclass
class Row:
    """One request of the burn-in: what was asked (``*_target``), what the server's usage counted,
    and what was wrong with the answer (``problem``, empty when nothing)."""

    phase: str  # "sequential" or "soak"
    request: int  # from 1, within its phase
    prompt_target: int
    output_target: int
    ok: bool = False
    problem: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    sent_s: float = 0.0  # since the phase began
    ttft_ms: float | None = None
    e2e_ms: float | None = None


def problem(rec: RequestRecord, output_tokens: int, answer: Answer | None = None) -> str:
    """What is wrong with one answer asked for ``output_tokens`` tokens with ``ignore_eos`` (empty
    when nothing). Bytes that are not UTF-8 already fail the request in the client (its JSON parser
    decodes the raw bytes strictly: UnicodeDecodeError); a lone surrogate, which JSON lets through
    as ``\\udXXX`` or as encoded bytes, fails here, where the text is encoded strictly."""
    if not rec.ok:
        return rec.error or "failed"
    if rec.output_tokens != output_tokens:
        return (f"{rec.output_tokens} output tokens by the server's usage, not the {output_tokens} "
                "asked for (max_tokens with ignore_eos)")
    if not rec.finish_reason:
        return "no finish reason"
    if answer is not None:
        text = "".join(answer.text)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"the text is not valid UTF-8: {e.reason} at character {e.start} of {len(text)}"
    return ""


def row(phase: str, i: int, prompt_tokens: int, output_tokens: int, rec: RequestRecord,
        answer: Answer | None = None) -> Row:
    return Row(phase, i, prompt_tokens, output_tokens, rec.ok, problem(rec, output_tokens, answer),
               rec.prompt_tokens, rec.output_tokens, rec.finish_reason, round(rec.sent_s, 3),
               rec.ttft_ms, rec.e2e_ms)


def thirds(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    """The first and the last third of the requests that succeeded, in the order they were sent
    (both empty when fewer than three succeeded)."""
    done = sorted((r for r in rows if r.ok and r.e2e_ms is not None), key=lambda r: r.sent_s)
    k = len(done) // 3
    return (done[:k], done[-k:]) if k else ([], [])


def drift(rows: list[Row]) -> Slower | None:
    """How much slower the soak's last third ran than its first (end-to-end latency)."""
    first, last = thirds(rows)
    return slower([r.e2e_ms for r in first], [r.e2e_ms for r in last])


def lengths(s: Smoke, limit: int | None) -> list[tuple[int, int]]:
    """(prompt, output) tokens of each sequential request: drawn from ``s.seed``, the prompt cut so
    that both fit ``limit`` (the server's max_model_len) where one is known."""
    rng, out = random.Random(s.seed), []
    for _ in range(s.requests):
        p, o = rng.randint(*s.prompt_tokens), rng.randint(*s.output_tokens)
        out.append((fit(p, o, limit), o))
    return out


def fit(prompt_tokens: int, output_tokens: int, limit: int | None) -> int:
    return max(1, min(prompt_tokens, limit - output_tokens)) if limit else prompt_tokens


@dataclass
class BurnIn(Outcome):
    """The burn-in's requests and what the verdict makes of them (:func:`checks`)."""

    FILE: ClassVar[str] = "smoke/burn_in.json"

    api: str
    model: str
    settings: dict  # the Smoke section it ran with
    started: str = ""
    prompt_sizing: str = ""
    error: str = ""  # why nothing was sent (the server could not be asked for its models)
    stopped: str = ""  # why the sequential requests ended early
    soak_skipped: str = ""  # why there was no soak
    soak_s: float = 0.0  # how long the soak ran
    sequential: list[Row] = field(default_factory=list)
    soak: list[Row] = field(default_factory=list)

    @property
    def drift(self) -> Slower | None:
        return drift(self.soak)

    @property
    def third(self) -> int:
        """Requests in each third of the soak."""
        return len(thirds(self.soak)[0])

    def to_json(self) -> dict:
        d = self.drift
        return {**super().to_json(), "drift": d and {**asdict(d), "ratio": d.ratio, "per_third": self.third}}

    def key_numbers(self) -> list[tuple[str, str]]:
        seq = f"{sum(not r.problem for r in self.sequential)}/{self.settings['requests']} sequential"
        soak = f"{sum(not r.problem for r in self.soak)}/{len(self.soak)} soak requests passed"
        out = [("burn-in", f"{seq}, {soak}")]
        d = self.drift
        return out + ([("soak drift (median E2E)", f"{d.ratio:.2f}x")] if d and d.enough else [])

    def save(self, run_dir: Path) -> Path | None:
        path = super().save(run_dir)
        with open(run_dir / CSV, "w", newline="") as f:
            w = csv.DictWriter(f, [x.name for x in fields(Row)])
            w.writeheader()
            w.writerows(asdict(r) for r in self.sequential + self.soak)
        return path


def run(base_url: str, model: str, s: Smoke, *, api_key: str = "EMPTY", progress: bool = True,
        say: Callable[[str], None] = print) -> BurnIn:
    """The burn-in of the model served at ``base_url`` with the settings ``s`` (``params.smoke``).
    The sequential requests end early after :data:`STOP_AFTER` errors in a row; any of them failing
    skips the soak. ``progress`` shows a live line per phase (:mod:`sparkbook.book.progress`)."""
    salt = datetime.now(timezone.utc).isoformat(timespec="microseconds")  # new prompts every run
    b = BurnIn(endpoint.urls(base_url)[0], model, s.model_dump(mode="json"), started=salt)

    async def main() -> BurnIn:
        async with Session(base_url, model, endpoint="chat", connections=s.soak_concurrency,
                           timeout=s.timeout_s, api_key=api_key) as session:
            try:
                limit = (await session.model_card()).get("max_model_len")
            except SparkbookError as e:
                b.error = str(e).splitlines()[0]
                b.soak_skipped = "not run: nothing was sent"
                return b
            prompts = Prompts(session.tokenize, "chat")
            b.prompt_sizing = await prompts.probe()
            live = Progress("burn-in") if progress else None
            try:
                await sequential(b, session, prompts, s, salt, limit, live)
                if any(r.problem for r in b.sequential):
                    b.soak_skipped = "not run: the sequential requests failed"
                elif s.soak_s <= 0:
                    b.soak_skipped = "not run: smoke.soak_s is 0"
                else:
                    await soak(b, session, prompts, s, salt, limit, live)
            finally:
                if live is not None:
                    live.close()
        if not progress:
            say(f"burn-in: {', '.join(v for _, v in b.key_numbers())}")
        return b

    return run_async(main)


async def send(session: Session, prompts: Prompts, prompt_tokens: int, output_tokens: int, key: str,
               i: int, t0: float, answer: Answer | None = None) -> RequestRecord:
    """One request with a new prompt of ``prompt_tokens`` (random words from ``key``); a prompt
    that cannot be sized (the server's /tokenize failed) is the request's error."""
    try:
        text = await prompts.make(prompt_tokens, key)
    except (aiohttp.ClientError, asyncio.TimeoutError, ServerError) as e:
        return RequestRecord(i, error=f"sizing the prompt with /tokenize: {str(e) or type(e).__name__}")
    return await session.request(text, output_tokens, i, t0, answer)


async def sequential(b: BurnIn, session: Session, prompts: Prompts, s: Smoke, salt: str,
                     limit: int | None, live: Progress | None) -> None:
    started, errors = time.monotonic(), 0
    t0 = time.perf_counter()
    for i, (p, o) in enumerate(lengths(s, limit), 1):
        answer = Answer()
        rec = await send(session, prompts, p, o, f"{s.seed}/{salt}/burn-in/{i}", i, t0, answer)
        b.sequential.append(r := row("sequential", i, p, o, rec, answer))
        if live is not None:
            failed = sum(bool(x.problem) for x in b.sequential)
            live.update("sequential", f"{bar(i, s.requests, started, unit='req')}  failed {failed}",
                        force=i == s.requests, fraction=fraction_of(i, s.requests))
        errors = 0 if r.ok else errors + 1
        if errors >= STOP_AFTER:
            b.stopped = f"stopped after {STOP_AFTER} errors in a row"
            return


async def soak(b: BurnIn, session: Session, prompts: Prompts, s: Smoke, salt: str,
               limit: int | None, live: Progress | None) -> None:
    """A closed loop at ``s.soak_concurrency`` until ``s.soak_s`` seconds have passed (requests in
    flight then finish), each request with a new prompt of the same length."""
    p, o = fit(s.soak_prompt_tokens, s.soak_output_tokens, limit), s.soak_output_tokens
    numbers, t0 = itertools.count(1), time.perf_counter()
    deadline = t0 + s.soak_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            i = next(numbers)
            rec = await send(session, prompts, p, o, f"{s.seed}/{salt}/soak/{i}", i, t0)
            b.soak.append(row("soak", i, p, o, rec))
            if live is not None:
                took = time.perf_counter() - t0
                live.update("soak", f"{min(took, s.soak_s):.0f} of {s.soak_s:g} s at concurrency "
                            f"{s.soak_concurrency}  {len(b.soak)} requests  failed "
                            f"{sum(bool(r.problem) for r in b.soak)}", fraction=fraction_of(took, s.soak_s))

    await asyncio.gather(*(worker() for _ in range(s.soak_concurrency)))
    b.soak_s = round(time.perf_counter() - t0, 3)
    b.soak.sort(key=lambda r: r.request)


def _span(values: list[int | None]) -> str:
    known = [v for v in values if v is not None]
    return "-" if not known else str(known[0]) if min(known) == max(known) else f"{min(known)}-{max(known)}"


def checks(b: BurnIn) -> list[Check]:
    """The verdict's rows: "burn-in sequential", "soak" and "soak drift"."""
    s = Smoke.model_validate(b.settings)
    n, bad = s.requests, [r for r in b.sequential if r.problem]
    asked = f"{POST} x{n}: stream, max_tokens with ignore_eos, prompt {s.prompt_tokens[0]}-" \
            f"{s.prompt_tokens[1]} and output {s.output_tokens[0]}-{s.output_tokens[1]} tokens (seed {s.seed})"
    expected = f"{n} answers, each with exactly its max_tokens output tokens, valid UTF-8 and a finish reason"
    logs = "see the serving container's log on the head around that request (05's `docker logs`)"
    if b.error:
        seq = Check("burn-in sequential", "api", FAIL, f"not run: {b.error}", expected,
                    "is the server up? (the smoke checks above, 05_serve.ipynb)", asked)
    elif bad:
        r = bad[0]
        more = f"; {len(bad)} of {len(b.sequential)} sent failed (requests " \
               f"{', '.join(str(x.request) for x in bad[:10])})" if len(bad) > 1 else ""
        remedy = "the server does not honour max_tokens with ignore_eos: is something in front of " \
                 "vLLM?" if r.ok and "output tokens" in r.problem else logs
        seq = Check("burn-in sequential", "api", FAIL,
                    f"request {r.request} of {n} (prompt {r.prompt_target} tokens, output "
                    f"{r.output_target}): {r.problem}{more}" + (f"; {b.stopped}" if b.stopped else ""),
                    expected, remedy, asked)
    else:
        finishes = ", ".join(sorted({r.finish_reason or "" for r in b.sequential}))
        seq = Check("burn-in sequential", "api", PASS,
                    f"{n}/{n}: prompt {_span([r.prompt_tokens for r in b.sequential])} and output "
                    f"{_span([r.output_tokens for r in b.sequential])} tokens by usage, each as asked; "
                    f"valid UTF-8; finish {finishes}", expected, command=asked)
    soak_asked = f"{POST}: closed loop at concurrency {s.soak_concurrency} for {s.soak_s:g} s, prompt " \
                 f"{s.soak_prompt_tokens} and output {s.soak_output_tokens} tokens"
    soak_expected = "no failure"
    drift_expected = (f"the last third's median E2E at most {s.drift_limit:g}x the first third's, or "
                      f"the difference not consistent (rank test p ≥ {ALPHA:g}); at least {MIN_GROUP} "
                      "requests a third")
    if b.soak_skipped:
        return [seq, Check("soak", "api", SKIP, b.soak_skipped, soak_expected, command=soak_asked),
                Check("soak drift", "api", SKIP, b.soak_skipped, drift_expected)]
    fails = [r for r in b.soak if r.problem]
    seen = f"{len(b.soak)} requests in {b.soak_s:.0f} s at concurrency {s.soak_concurrency}"
    if fails:
        soak_row = Check("soak", "api", FAIL, f"{len(fails)} of {seen} failed; first: request "
                         f"{fails[0].request}: {fails[0].problem}", soak_expected, logs, soak_asked)
    else:
        soak_row = Check("soak", "api", PASS, f"{seen}, none failed", soak_expected, command=soak_asked)
    return [seq, soak_row, drift_check(b, s.drift_limit, drift_expected)]


def drift_check(b: BurnIn, limit: float, expected: str) -> Check:
    """FAIL only for a slowdown that is both large (the medians' ratio over ``limit``) and
    consistent (the rank test): one delayed request moves neither. Too few requests: a WARN."""
    d = b.drift
    if d is None or not d.enough:
        return Check("soak drift", "api", WARN, f"{b.third} requests in each third of the soak: too few "
                     f"samples to judge drift (at least {MIN_GROUP})", expected,
                     "a longer soak (smoke.soak_s) or shorter answers (smoke.soak_output_tokens)")
    seen = (f"median E2E {d.earlier_median:.0f} ms in the first third, {d.later_median:.0f} ms in the "
            f"last ({b.third} requests each): {d.ratio:.2f}x, rank test p = {d.p:.2g}")
    if d.significant(limit):
        return Check("soak drift", "api", FAIL, seen, expected,
                     "the server slows as it runs: thermal or power throttling (`nvidia-smi -q -d "
                     "PERFORMANCE` on the nodes), memory pressure or swap, or a leak; rerun 06 to confirm")
    if d.ratio > limit:
        return Check("soak drift", "api", WARN, seen + ": slower, but not consistently", expected,
                     "a few requests were delayed (a busy machine?); rerun 06 to confirm")
    return Check("soak drift", "api", PASS, seen, expected)


def table(b: BurnIn) -> Table:
    """Each phase in a row (and the soak's first and last thirds): requests, failures, lengths by
    usage, end-to-end latency."""
    def line(name: str, rows: list[Row]) -> list:
        e2e = stats([r.e2e_ms for r in rows if r.ok and r.e2e_ms is not None])
        ms = [f"{v:.0f}" if v is not None else "-" for v in (e2e["p50"], e2e["p99"])]
        return [name, len(rows), sum(bool(r.problem) for r in rows), _span([r.prompt_tokens for r in rows]),
                _span([r.output_tokens for r in rows]), *ms]

    first, last = thirds(b.soak)
    rows = [line("sequential", b.sequential), line("soak", b.soak)]
    if first:
        rows += [line("soak: first third", first), line("soak: last third", last)]
    return Table(["phase", "requests", "failed", "prompt tokens", "output tokens", "E2E p50 ms", "E2E p99 ms"],
                 rows, title=f"burn-in of {b.model} at {b.api}")
