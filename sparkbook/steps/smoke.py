"""06 · Smoke test: does the served OpenAI-compatible API do what clients rely on?
(:mod:`sparkbook.smoke`: one request per check, looking at the structure of the answers.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import smoke
from ..params import Params
from ..serving.commands import api_key
from ..smoke import SmokeTest
from ..tables import Table
from ..verdict import COLOURS, Check

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "06_smoke_test"
TITLE = "smoke test"


def run(ctx: Context, **kw: Any) -> SmokeTest:
    """Every smoke check against ``params.endpoint``, with the serving parameters' reasoning and
    tool-call parsers and the API key of ``serving.api_key_env`` (``kw``: the options of
    :func:`sparkbook.smoke.run`, e.g. ``timeout``, or ``reasoning_budget`` for a model that thinks
    at length)."""
    p = ctx.params
    return smoke.run(p.endpoint, p.served_model, reasoning_parser=p.serving.reasoning_parser,
                     tool_call_parser=p.serving.tool_call_parser, api_key=api_key(p) or "EMPTY", **kw)


def table(outcome: SmokeTest) -> Table:
    """What was sent and what came back, one request a row."""
    return Table(["check", "request", "status", "observed"],
                 [[c.check, c.command, c.status, c.observed] for c in outcome.checks],
                 title=f"smoke test of {outcome.model} at {outcome.api}",
                 colour=lambda col, v: COLOURS.get(v) if col == "status" else None)


def checks(params: Params, outcome: SmokeTest) -> list[Check]:
    return list(outcome.checks)
