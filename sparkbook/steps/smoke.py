"""06 · Smoke test: does the served OpenAI-compatible API do what clients rely on?
(:mod:`sparkbook.smoke.api`: one request per check, looking at the structure of the answers.) Then the
burn-in (:mod:`sparkbook.smoke.burnin`) and the known answers (:mod:`sparkbook.smoke.known_answers`), each a
cell of its own whose checks join the smoke test's verdict."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..book.tables import Table
from ..book.verdict import COLOURS, Check
from ..params import Params
from ..record import fingerprint
from ..serving import health as serving_health
from ..serving.commands import api_key
from ..smoke import api as smoke, burnin, known_answers as known
from ..smoke.api import SmokeTest
from ..smoke.burnin import BurnIn
from ..smoke.known_answers import KnownAnswers

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "06_smoke_test"
TITLE = "06 smoke test"


def run(ctx: Context, **kw: Any) -> SmokeTest:
    """Every smoke check against ``params.endpoint``, with the serving parameters' reasoning and
    tool-call parsers and the API key of ``serving.api_key_env`` (``kw``: the options of
    :func:`sparkbook.smoke.api.run`, e.g. ``timeout``, or ``reasoning_budget`` for a model that thinks
    at length; by default within half of ``serving.max_model_len``). The burn-in and known answers this context already holds (a re-run cell) stay
    with the new outcome, their checks in its verdict."""
    fingerprint.ensure(ctx)
    p = ctx.params
    kw.setdefault("reasoning_budget", smoke.reasoning_budget(p.serving.max_model_len))
    outcome = smoke.run(p.endpoint, p.served_model, reasoning_parser=p.serving.reasoning_parser,
                        tool_call_parser=p.serving.tool_call_parser, api_key=api_key(p) or "EMPTY", **kw)
    outcome.burn_in = next((o for o in ctx.outcomes if isinstance(o, BurnIn)), None)
    outcome.health = next((o.health for o in ctx.outcomes if isinstance(o, SmokeTest) and o.health), None)
    outcome.known_answers = next((o for o in ctx.outcomes if isinstance(o, KnownAnswers)), None)
    return outcome


def burn_in(ctx: Context, outcome: SmokeTest, **kw: Any) -> BurnIn:
    """The burn-in with ``params.smoke`` (``kw``: :func:`sparkbook.smoke.burnin.run`'s options), kept in
    the run folder and in ``outcome``, whose verdict it joins; the serving nodes' health watched
    meanwhile (:mod:`sparkbook.serving.health`), its changes in the verdict too."""
    p = ctx.params
    with serving_health.watch(p, ctx.cluster, "burn-in") as watch:
        outcome.burn_in = ctx.record(burnin.run(p.endpoint, p.served_model, p.smoke, api_key=api_key(p) or "EMPTY", **kw))
        end = time.time()  # the soak's end, before the watch's last sample
    watch.save(ctx.run_dir)
    outcome.health = watch.summary([("the soak", end - outcome.burn_in.soak_s, end)] if outcome.burn_in.soak_s else None)
    return outcome.burn_in


def known_answers(ctx: Context, outcome: SmokeTest) -> KnownAnswers:
    """The known answers, compared with the newest earlier run of this run's fingerprint and kept
    with it (in the run folder and in ``outcome``, whose verdict it joins)."""
    p = ctx.params
    fp = fingerprint.ensure(ctx)
    key = fp.key(benchmark=False)  # the benchmark's settings change no answer
    outcome.known_answers = ctx.record(known.run(p.endpoint, p.served_model, key, ctx.run_dir,
                                                 max_tokens=p.smoke.known_answer_tokens, unread=fp.unread,
                                                 api_key=api_key(p) or "EMPTY", timeout=p.smoke.timeout_s))
    return outcome.known_answers


def table(outcome: SmokeTest) -> Table:
    """What was sent and what came back, one request a row."""
    return Table(["check", "request", "status", "observed"],
                 [[c.check, c.command, c.status, c.observed] for c in outcome.checks],
                 title=f"smoke test of {outcome.model} at {outcome.api}",
                 colour=lambda col, v: COLOURS.get(v) if col == "status" else None)


def checks(params: Params, outcome: SmokeTest) -> list[Check]:
    return list(outcome.checks) + (burnin.checks(outcome.burn_in) if outcome.burn_in else []) + \
        serving_health.checks(outcome.health, "06's burn-in") + \
        (known.checks(outcome.known_answers) if outcome.known_answers else [])
