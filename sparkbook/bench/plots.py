"""The benchmark's figures: this run against earlier runs of the same model (dashed) and the
reference numbers (dotted), each saved as ``RUN_DIR/benchmark/NAME.png``.

Honest by construction: every rate axis (tok/s) starts at zero, so a few percent of noise does not
read as a trend, and where a point is the mean or median of several requests its spread is drawn
with it (p10-p90 of the requests, as error bars)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..params.settings import Reference
from .records import FOLDER, LevelResult, RequestRecord, Results

Metric = Callable[[LevelResult], float | None]
PerRequest = Callable[[RequestRecord], float | None]
SPREAD = (10, 90)  # the percentiles of the requests an error bar spans
PERCENTILE_STYLES = (("p50", "-"), ("p90", "--"), ("p99", ":"))
LATENCIES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E latency"}
THIS_RUN = "this run"  # the legend of this run's line where one line stands for all its levels


def plot(results: Results, run_dir: Path | None = None, *, earlier: Sequence[Results] = (),
         references: Sequence[Reference] = ()) -> dict[str, Any]:
    """The figures, each saved as ``RUN_DIR/benchmark/NAME.png`` when ``run_dir`` is given:
    throughput and per-user tok/s vs concurrency, latency percentiles vs concurrency, TTFT and ITL
    distributions, tok/s vs context depth, and the rate sweep; earlier runs (see
    :func:`sparkbook.bench.records.earlier`) as dashed lines, the references as horizontal lines."""
    f = _Figures(results, run_dir, earlier, references)
    if results.by_concurrency():
        f.throughput()
        f.latency()
        f.distributions()
    if results.depths:
        f.depth()
    if results.rates:
        f.rates()
    return f.figs


def _group(results: Results, group: str) -> list[LevelResult]:
    """The levels of ``group``; ``concurrency``: :meth:`~.records.Results.by_concurrency` (a
    profile's grid has no concurrency sweep: its depth-0 row stands for it)."""
    return results.by_concurrency() if group == "concurrency" else getattr(results, group)


def _xy(levels: list[LevelResult], x: str, y: Metric) -> tuple[list, list]:
    pts = [(getattr(lv, x), y(lv)) for lv in levels if y(lv) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def spread(levels: list[LevelResult], x: str, y: Metric, each: PerRequest) -> tuple[list, list, list]:
    """The points of :func:`_xy` with their error bars: from the point down to the requests' p10
    and up to their p90 (``each`` per successful request; zero where there is one request)."""
    xs, ys, low, high = [], [], [], []
    for lv in levels:
        if (v := y(lv)) is None:
            continue
        per = [w for r in lv.requests if r.ok and (w := each(r)) is not None]
        lo, hi = np.percentile(per, SPREAD) if len(per) > 1 else (v, v)
        xs.append(getattr(lv, x))
        ys.append(v)
        low.append(max(v - lo, 0.0))
        high.append(max(hi - v, 0.0))
    return xs, ys, [low, high]


class _Figures:
    def __init__(self, results: Results, run_dir: Path | None, earlier: Sequence[Results],
                 references: Sequence[Reference]):
        import matplotlib.pyplot as plt

        self.plt, self.results, self.run_dir, self.earlier = plt, results, run_dir, earlier
        self.refs = [r for r in references if r.single_user_tok_s]
        self.figs: dict[str, Any] = {}

    def lines(self, ax, group: str, x: str, y: Metric, each: PerRequest | None = None,
              keep: Callable[[LevelResult], bool] = lambda lv: True, label: str = THIS_RUN) -> None:
        """This run's ``group`` of levels (those ``keep`` takes), with the spread of ``each`` over
        the requests when given, then each earlier run's, dashed (its legend names the run, and
        ``label`` unless that is the default)."""
        levels = [lv for lv in _group(self.results, group) if keep(lv)]
        (line,) = ax.plot(*_xy(levels, x, y), marker="o", label=label)
        if each is not None:
            xs, ys, bars = spread(levels, x, y, each)
            ax.errorbar(xs, ys, yerr=bars, fmt="none", ecolor=line.get_color(), capsize=3)
        for old in self.earlier:
            xs, ys = _xy([lv for lv in _group(old, group) if keep(lv)], x, y)
            if xs:
                name = old.source or old.started
                ax.plot(xs, ys, linestyle="--", marker=".", alpha=0.6,
                        label=name if label == THIS_RUN else f"{name} {label}")

    def speeds(self, group: str, x: str, left: tuple[str, Metric, PerRequest | None],
               right: tuple[str, Metric, PerRequest | None]):
        """Two panels of tok/s over ``x`` (with the requests' spread where a per-request value is
        given); the references on the right one (a per-user speed). A grid of several
        concurrencies (a profile's) draws a line per concurrency."""
        fig, (a, b) = self.plt.subplots(1, 2, figsize=(11, 4))
        cs = sorted({lv.concurrency or 0 for lv in _group(self.results, group)})
        lines = [(lambda lv: True, THIS_RUN)]
        if x != "concurrency" and len(cs) > 1:
            lines = [(lambda lv, c=c: (lv.concurrency or 0) == c, f"c={c}") for c in cs]
        for ax, (what, y, each) in ((a, left), (b, right)):
            for keep, label in lines:
                self.lines(ax, group, x, y, each, keep=keep, label=label)
            bars = f" (bars: p{SPREAD[0]}-p{SPREAD[1]} of requests)" if each else ""
            ax.set_ylabel(what + bars)
        for i, r in enumerate(self.refs):
            b.axhline(r.single_user_tok_s, color=f"C{(i + 3) % 10}", linestyle=":",
                      label=f"{r.label}: {r.single_user_tok_s:g} tok/s")
        return fig, (a, b)

    def concurrency_axis(self, ax) -> None:
        cs = [lv.concurrency for lv in self.results.by_concurrency()]
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")

    def finish(self, name: str, fig, title: str, rates: Sequence[Any] = ()) -> None:
        """Grid, legends, the title; ``rates``: the axes of a rate, which start at zero."""
        for ax in rates:
            ax.set_ylim(bottom=0)
        for ax in fig.axes:
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        fig.suptitle(f"{title}: {self.results.model}")
        fig.tight_layout()
        if self.run_dir is not None:
            path = Path(self.run_dir) / FOLDER / f"{name}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=110)
        self.plt.close(fig)  # shown by returning it, not by pyplot's state
        self.figs[name] = fig

    def throughput(self) -> None:
        fig, axes = self.speeds("concurrency", "concurrency",
                                ("output tok/s (all users)", lambda lv: lv.output_tok_s, None),
                                ("decode tok/s per user", lambda lv: lv.per_user_tok_s,
                                 lambda r: r.decode_tok_s))
        for ax in axes:
            self.concurrency_axis(ax)
        self.finish("throughput", fig, "throughput", rates=axes)

    def latency(self) -> None:
        fig, axes = self.plt.subplots(2, 2, figsize=(11, 7))
        for ax, (m, name) in zip(axes.flat, LATENCIES.items()):
            for p, style in PERCENTILE_STYLES:
                ax.plot(*_xy(self.results.by_concurrency(), "concurrency", lambda lv: getattr(lv, m)[p]),
                        linestyle=style, marker="o", label=f"{p}")
            for old in self.earlier:
                xs, ys = _xy(old.by_concurrency(), "concurrency", lambda lv: getattr(lv, m)["p50"])
                if xs:
                    ax.plot(xs, ys, linestyle="--", marker=".", alpha=0.5,
                            label=f"p50 {old.source or old.started}")
            ax.set_ylabel(f"{name} (ms)")
            self.concurrency_axis(ax)
        self.finish("latency", fig, "latency percentiles")

    def distributions(self) -> None:
        levels = self.results.by_concurrency()
        fig, (a, b) = self.plt.subplots(1, 2, figsize=(11, 4))
        a.boxplot([[r.ttft_ms for r in lv.requests if r.ok] or [np.nan] for lv in levels])
        b.boxplot([[x for r in lv.requests if r.ok for x in r.itl_ms] or [np.nan] for lv in levels],
                  showfliers=False)
        a.set(ylabel="TTFT (ms)")
        b.set(ylabel="ITL (ms), outliers hidden")
        for ax in (a, b):
            ax.set_xticks(range(1, len(levels) + 1), [lv.label for lv in levels])
        self.finish("distributions", fig, "TTFT and ITL distributions")

    def depth(self) -> None:
        fig, axes = self.speeds("depths", "depth",
                                ("prefill tok/s", lambda lv: lv.prefill_tok_s, lambda r: r.prefill_tok_s),
                                ("decode tok/s", lambda lv: lv.decode_tok_s, lambda r: r.decode_tok_s))
        for ax in axes:
            ax.set_xlabel("context depth (tokens before the prompt)")
        self.finish("depth", fig, "speed by context depth", rates=axes)

    def rates(self) -> None:
        fig, (a, b) = self.plt.subplots(1, 2, figsize=(11, 4))
        self.lines(a, "rates", "request_rate", lambda lv: lv.output_tok_s)
        for p, style in (("p50", "-"), ("p99", ":")):
            b.plot(*_xy(self.results.rates, "request_rate", lambda lv: lv.ttft_ms[p]), linestyle=style,
                   marker="o", label=f"TTFT {p}")
        a.set(xlabel="request rate (req/s)", ylabel="output tok/s")
        b.set(xlabel="request rate (req/s)", ylabel="TTFT (ms)")
        self.finish("rates", fig, "open-loop request rate", rates=[a])
