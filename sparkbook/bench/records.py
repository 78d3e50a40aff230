"""What the benchmark measures and keeps: one record per request, a level's statistics, a run's
results, and their files in ``RUN_DIR/benchmark/`` (the definitions are in :mod:`sparkbook.bench`).

``results.json``: ``model``, ``base_url``, ``endpoint`` (``chat`` or ``completions``), ``started``
(UTC, ISO 8601), ``seed``, ``prompt_salt``, ``benchmark`` (the parameters used),
``prompt_sizing`` (``exact ...``
or ``estimated ...``), ``max_model_len``, ``warmup``, ``warmup_errors``, ``skipped`` (levels not
run, and why), ``duration_s``, ``source`` (the run folder's name), ``ceiling`` (what the
single-user decode speed is held against, :mod:`sparkbook.bench.ceiling`; null when not judged),
and ``depths``,
``concurrency``, ``rates``: lists of levels. A level: ``kind`` (``depth``, ``concurrency``,
``rate`` or ``load``), ``label``, ``endpoint``, ``depth``, ``prompt_tokens`` and
``output_tokens`` (targets), ``concurrency`` (null: unbounded), ``request_rate`` (req/s; null:
closed loop), ``num_requests``, ``seed``, ``prompt_sizing``, ``completed``, ``failures``,
``errors`` (distinct messages with counts), ``duration_s`` (first send to last end),
``started_at`` (when its first send was timed, seconds since the epoch: the clock of
``server_metrics.json``'s ``t0_epoch``),
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

A level of a ``benchmark.profile`` grid also has ``board``: the cell measured the leaderboard's way
(:mod:`sparkbook.bench.board`): ``latency_ms``, ``runs``, ``measured`` and ``context`` (the
figures of the measured requests and of the context loads) and ``rows`` (llama-benchy's table
rows: ``test_name`` and each of ``t_s``, ``t_s_req``, ``peak_ts``, ``peak_ts_req``, ``ttfr``,
``est_ppt``, ``e2e_ttft`` as ``{mean, std, values}`` or null). ``llama-benchy.csv``: those rows in
llama-benchy's own CSV columns (``model``, ``test_name``, ``t_s_mean``, ``t_s_std``, ...).

``levels.csv``: one row per level, the level's fields above without ``requests``, each latency
flattened to ``<name>_mean``, ``<name>_p50``, ``<name>_p90``, ``<name>_p99`` (e.g.
``ttft_ms_p99``) and ``errors`` joined with ``; ``.

``throughput.png``, ``latency.png``, ``distributions.png``, ``depth.png``, ``rates.png``: the
plots, with earlier runs of the same model and the reference numbers.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence, TypedDict

import numpy as np

from ..book.redact import mask
from ..book.samples import high
from ..book.step import Outcome
from ..book.tables import Table

FOLDER = "benchmark"
CSV = "levels.csv"
PERCENTILES = (50, 90, 99)  # those of Stats
CLIENT_CPU_LIMIT = 0.8  # of one core: the client is one event-loop thread
LATE_LIMIT_MS = 50.0  # p99 of scheduling lateness or event-loop lag
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}  # by endpoint
# llama-benchy 0.4.0's table (its results.py): the metrics of a row, and its CSV's columns
BOARD_METRICS = ("t_s", "t_s_req", "peak_ts", "peak_ts_req", "ttfr", "est_ppt", "e2e_ttft")
BOARD_CSV = ("model", "test_name", *(f"{k}_{s}" for k in BOARD_METRICS for s in ("mean", "std")))
BOARD_FILE = "llama-benchy.csv"


class Stats(TypedDict):
    """A latency's mean and percentiles in milliseconds (None when nothing was measured)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


def stats(values: Sequence[float]) -> Stats:
    """Mean and percentiles (linear interpolation, as numpy and ``vllm bench serve``)."""
    if not len(values):
        return Stats(mean=None, p50=None, p90=None, p99=None)
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = (float(x) for x in np.percentile(a, PERCENTILES))
    return Stats(mean=float(a.mean()), p50=p50, p90=p90, p99=p99)


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
    started_at: float | None = None  # epoch s (time.time()) beside the level's timer; None in old results
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
    board: dict | None = None  # a profile's cell measured the leaderboard's way (sparkbook.bench.board)
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
        late = [r.lateness_ms for r in records if r.lateness_ms is not None]
        for name, values in (("scheduling lateness", late), ("event-loop lag", lag_ms)):
            # one late sample (a stall of this machine) is not a client-bound level: judged on
            # a p99 that one outlier cannot set (samples.high)
            if (value := high(values)) is not None and value > LATE_LIMIT_MS:
                why.append(f"{name} p99 {value:.0f} ms of {len(values)} samples")
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
            if k in ("requests", "board"):
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
class Results(Outcome):
    """A whole benchmark run: the outcome of the benchmark step."""

    FILE = f"{FOLDER}/results.json"

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
    ceiling: dict | None = None  # sparkbook.bench.ceiling.estimate's, when a bandwidth is expected
    health: dict | None = None  # the serving nodes' health during the levels (sparkbook.serving.health)

    @property
    def levels(self) -> list[LevelResult]:
        return [*self.depths, *self.concurrency, *self.rates]

    def by_concurrency(self) -> list[LevelResult]:
        """The levels by concurrency at the plain prompt: the concurrency sweep, or a profile's
        (which has none) depth-0 row of its grid."""
        return self.concurrency or [lv for lv in self.depths if lv.depth == 0]

    def single_user(self) -> LevelResult | None:
        """The single-user level that references compare with: the shallowest context depth (at
        concurrency 1: a profile's grid has others), else concurrency 1."""
        depths = sorted((lv for lv in self.depths if lv.decode_tok_s and lv.concurrency == 1),
                        key=lambda lv: lv.depth or 0)
        ones = [lv for lv in self.concurrency if lv.concurrency == 1 and lv.decode_tok_s]
        return (depths or ones or [None])[0]

    def key_numbers(self) -> list[tuple[str, str]]:
        """Single-user speed (the level the references are compared with) and the peak output
        throughput by concurrency (:meth:`by_concurrency`)."""
        out = []
        one = self.single_user()
        if one:
            out.append(("single user", f"{one.decode_tok_s:.1f} tok/s decode, "
                        f"{one.prefill_tok_s or 0:.0f} tok/s prefill at {one.label}"))
        conc = [lv for lv in self.by_concurrency() if lv.output_tok_s]
        if conc:
            best = max(conc, key=lambda lv: lv.output_tok_s)
            out.append(("peak throughput", f"{best.output_tok_s:.0f} output tok/s at concurrency "
                        f"{best.concurrency} (TTFT p50 {best.ttft_ms['p50'] or 0:.0f} ms)"))
        return out

    def save(self, run_dir: Path) -> Path:
        """``results.json`` (everything, with every request; ``source`` becomes the run folder's
        name) and ``levels.csv`` (a row per level) in ``RUN_DIR/benchmark/``; the path of the
        first."""
        path = Path(run_dir) / self.FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        self.source = Path(run_dir).name
        path.write_text(mask(json.dumps(self.to_json(), indent=1)) + "\n")
        rows = [lv.flat() for lv in self.levels]
        Table(list(rows[0]) if rows else ["label"], [list(r.values()) for r in rows]).write_csv(
            path.with_name(CSV))
        if board := self.board_rows():
            Table(list(BOARD_CSV), [[r["model"], r["test_name"], *(
                (r[k] or {}).get(s) for k in BOARD_METRICS for s in ("mean", "std"))] for r in board]
                  ).write_csv(path.with_name(BOARD_FILE))
        return path

    def board_rows(self) -> list[dict[str, Any]]:
        """The rows of llama-benchy's table for a profile's cells measured the board's way, in
        the order it prints them, each with the model."""
        return [{"model": self.model, **r} for lv in self.depths if lv.board for r in lv.board["rows"]]

    @classmethod
    def from_json(cls, d: dict) -> "Results":
        r = cls(**_known(cls, d))
        for k in ("depths", "concurrency", "rates"):
            setattr(r, k, [LevelResult.from_json(x) for x in d.get(k, [])])
        return r


def _known(cls, d: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def load(path: Path) -> Results:
    """Results from a ``results.json`` (or a run folder holding ``benchmark/results.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / Results.FILE
    return Results.from_json(json.loads(path.read_text()))


def earlier(outputs: Path, model: str, *, exclude: Path | None = None) -> list[Results]:
    """The results of earlier runs of the same model under ``outputs/*/benchmark/``, oldest first;
    ``exclude`` names the current run folder. Unreadable files are passed over."""
    found = []
    for p in sorted(Path(outputs).glob(f"*/{Results.FILE}")):
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
