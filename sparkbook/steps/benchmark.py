"""07 · Benchmark: single-user speed by context depth, the concurrency sweep and the request-rate
sweep against the served model (:mod:`sparkbook.bench`), kept in the run folder's ``benchmark/``
with plots against earlier runs and the references."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..bench import (ceiling, checks as bench_checks, load, plots as bench_plots, records,
                     server as bench_server)
from ..bench.records import Results
from ..book.tables import Table
from ..book.verdict import Check
from ..params import Params
from ..record import fingerprint
from ..serving import health as serving_health
from ..serving.commands import api_key

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "07_benchmark"
TITLE = "07 benchmark"


def run(ctx: Context, **kw: Any) -> Results:
    """The whole benchmark of ``params.benchmark`` against ``params.endpoint`` (``kw``: the
    options of :func:`sparkbook.bench.load.run`), with the API key of ``serving.api_key_env``; what
    the server saw meanwhile is sampled (:mod:`sparkbook.bench.server`)."""
    fingerprint.ensure(ctx)
    p, key = ctx.params, api_key(ctx.params)
    # the model's config.json from the head for the plausibility ceiling (bench.ceiling), before the load
    limit = ceiling.fetch(p, ctx.cluster) if p.expectations.memory_bandwidth_gbs else None
    with bench_server.for_run(p, lambda: ctx.cluster, ctx.run_dir, api_key=key, say=kw.get("say", print)), \
            serving_health.watch(p, ctx.cluster, "benchmark") as watch:
        res = load.run(p.endpoint, p.served_model, p.benchmark, max_model_len=p.serving.max_model_len,
                       api_key=key or "EMPTY", **kw)
    res.ceiling = limit
    watch.save(ctx.run_dir)
    res.health = watch.summary([(lv.label, lv.started_at, lv.started_at + lv.duration_s)
                                for lv in res.levels if lv.started_at is not None])
    return res


def table(outcome: Results) -> Table:
    def n(v: float | None, fmt: str = ".1f") -> str:
        return "" if v is None else format(v, fmt)

    rows = [[lv.label, f"{lv.completed}/{lv.num_requests}", n(lv.output_tok_s), n(lv.per_user_tok_s),
             n(lv.prefill_tok_s, ".0f"), n(lv.decode_tok_s), n(lv.ttft_ms["p50"], ".0f"),
             n(lv.ttft_ms["p99"], ".0f"), n(lv.tpot_ms["p50"]), n(lv.itl_ms["p50"]), n(lv.itl_ms["p99"]),
             n(lv.e2e_ms["p50"], ".0f"), f"{lv.client_cpu_frac:.0%}", "yes" if lv.client_bound else ""]
            for lv in outcome.levels]
    return Table(["level", "ok", "out tok/s", "tok/s/user", "prefill tok/s", "decode tok/s",
                  "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "ITL p50 ms", "ITL p99 ms",
                  "E2E p50 ms", "client CPU", "client-bound"], rows,
                 title=f"benchmark: {outcome.model} ({outcome.endpoint}, prompts {outcome.prompt_sizing})")


def board_table(outcome: Results) -> Table | None:
    """With a ``benchmark.profile``: its cells as the leaderboard's tool prints them (llama-benchy
    0.4.0's table: mean ± deviation over the runs; :mod:`sparkbook.bench.board`); None without."""
    found = outcome.board_rows()
    if not found:
        return None

    def f(m: dict | None) -> str:
        return "" if m is None else f"{m['mean']:.2f} ± {m['std']:.2f}"

    return Table(["test", "t/s (total)", "t/s (req)", "peak t/s", "peak t/s (req)", "ttfr (ms)", "est_ppt (ms)",
                  "e2e_ttft (ms)"], [[r["test_name"], *(f(r[k]) for k in records.BOARD_METRICS)] for r in found],
                 title=f"{outcome.benchmark.get('profile')}: measured as the leaderboard measures "
                       "(llama-benchy 0.4.0's procedure and columns)")


def checks(params: Params, outcome: Results) -> list[Check]:
    return bench_checks.checks(outcome, params.benchmark.references) + ceiling.checks(outcome) + \
        serving_health.checks(outcome.health, "07's levels")


def plots(ctx: Context, outcome: Results) -> dict[str, Any]:
    """The figures (saved in ``RUN_DIR/benchmark/``), with the earlier runs of the same model in
    the run folder's parent (``outputs/``) and ``benchmark.references``."""
    earlier = records.earlier(ctx.run_dir.parent, outcome.model, exclude=ctx.run_dir)
    figs = bench_plots.plot(outcome, ctx.run_dir, earlier=earlier, references=ctx.params.benchmark.references)
    server = bench_server.plot(outcome, ctx.run_dir)  # what the server saw; None when nothing was sampled
    return figs | ({"server": server} if server is not None else {})
