"""What the server saw during the benchmark: vLLM's Prometheus ``/metrics`` sampled about every
second in a background thread (KV cache use, requests running and waiting, preemptions, tokens
generated) and, where ``nvidia-smi`` answers on the serving nodes, each node's GPU power and SM
clock every few seconds (a throttling worker slows a tensor-parallel group as much as the head);
kept in ``RUN_DIR/benchmark/`` and drawn on one time axis with the output throughput of the
request records.

``server_metrics.csv``: one row per sample, ``t_s`` (seconds since the sampler's start) and one
column per series (empty where that sample did not read it): ``kv_cache_usage`` (fraction of the KV
cache blocks in use, 0-1), ``requests_running``, ``requests_waiting``, ``preemptions`` and
``generation_tokens`` (the server's counters as read, since its start), ``gpu_power_w@NODE`` and
``sm_clock_mhz@NODE``. ``server_metrics.json``: where they came from, ``t0_epoch`` (the sampler's
start, seconds since the epoch: a level's ``started_at`` minus it places the level on the axis) and
what was noted (a /metrics that failed, a node without nvidia-smi, a simulated one).
``server.png``: the figure.

The series' names, and how their label sets combine, are the engine's
(:data:`sparkbook.serving.vllm.METRICS`, with their source).
"""

from __future__ import annotations

import csv
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from ..book.tables import Table
from ..facts.parsers import parse_nvidia_smi_csv
from ..params import Params, endpoint
from ..serving import vllm as engine
from .records import FOLDER, Results

CSV, META, FIGURE = "server_metrics.csv", "server_metrics.json", "server"
INTERVAL_S, GPU_INTERVAL_S, TIMEOUT_S = 1.0, 5.0, 5.0  # a server busy with the benchmark answers late
SERIES = engine.METRICS  # column -> (sample names, the first present wins; how label sets combine)
GPU_QUERY = ("power.draw", "clocks.sm")
GPU = {"gpu_power_w": "power.draw", "sm_clock_mhz": "clocks.sm"}
COLUMNS = ["t_s", *SERIES]  # then GPU's columns, each as COLUMN@NODE, for the nodes that answered
SIMULATED = "sparkbook lab: simulated"  # what the lab's tools say on stderr


def parse(text: str) -> dict[str, float]:
    """One ``/metrics`` text: each series of :data:`SERIES` combined over its label sets; those the
    text lacks are left out. Raises ValueError on text that is not the Prometheus format."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append(s.value)
    out = {}
    for column, (names, combine) in SERIES.items():
        name = next((n for n in names if n in found), None)
        if name is not None:
            out[column] = float(combine(found[name]))
    return out


def parse_gpu(text: str) -> dict[str, float]:
    """``nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits``: power summed
    over the GPUs, SM clock their mean; a value the GPU does not report ([N/A]) left out."""
    rows = parse_nvidia_smi_csv(text, list(GPU_QUERY))
    out = {}
    for column, field in GPU.items():
        vals = [float(r[field].split()[0]) for r in rows if r.get(field)]
        if vals:
            out[column] = sum(vals) if field == "power.draw" else sum(vals) / len(vals)
    return out


# (the reading by COLUMN@NODE, whether simulated, why each node without a reading has none)
GpuReader = Callable[[], "tuple[dict[str, float], bool, dict[str, str]]"]


def gpu_reader(cluster: Callable[[], Any], nodes: Sequence[str]) -> GpuReader:
    """Per call, one ``nvidia-smi`` query on all ``nodes`` at once through ``cluster()`` (a
    :class:`sparkbook.nodes.remote.Cluster`, opened at the first call); raises when no node answers."""
    cmd = ["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"]

    def read() -> tuple[dict[str, float], bool, dict[str, str]]:
        values, simulated, silent = {}, False, {}
        for node, r in cluster().run(cmd, list(nodes), timeout=10).items():
            got = parse_gpu(r.stdout) if r.ok else {}
            if not got:
                silent[node] = r.summary(2) if not r.ok else f"no power or clock in {r.stdout.strip()[:80]!r}"
            values.update({f"{column}@{node}": v for column, v in got.items()})
            simulated |= bool(got) and SIMULATED in r.stderr
        if not values:
            raise RuntimeError("; ".join(f"{n}: {why}" for n, why in silent.items()))
        return values, simulated, silent
    return read


class Sampler:
    """Samples ``metrics_url`` every ``interval`` s and, given ``gpu`` (see :func:`gpu_reader`),
    the GPUs of ``gpu_nodes`` every ``gpu_interval`` s, each in a thread of its own, between
    :meth:`start` and :meth:`stop` (or as a context manager). A sample that fails is noted, never
    fatal; ``say`` hears the notes at :meth:`stop` (said from the threads, they would break into the
    benchmark's live progress line)."""

    def __init__(self, metrics_url: str, *, api_key: str | None = None, gpu: GpuReader | None = None,
                 gpu_nodes: Sequence[str] = (), interval: float = INTERVAL_S,
                 gpu_interval: float = GPU_INTERVAL_S, save_to: Path | None = None,
                 say: Callable[[str], None] = print):
        self.url, self.gpu, self.gpu_nodes, self.say = metrics_url, gpu, list(gpu_nodes), say
        self.interval, self.gpu_interval, self.save_to = interval, gpu_interval, save_to
        # a proxy from the environment would be measured too (as the benchmark client has it)
        self.http = httpx.Client(timeout=TIMEOUT_S, trust_env=False,
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        self.rows: list[dict[str, float]] = []
        self.notes: list[str] = []
        self.failures = self.samples = 0
        self.simulated = self._gpu_answered = False
        self._kinds: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.t0 = self.t0_epoch = 0.0

    def note(self, text: str, once: str = "") -> None:
        """Keep ``text`` (said at :meth:`stop`); with ``once``, only the first note of that kind."""
        if once and once in self._kinds:
            return
        self._kinds.add(once)
        self.notes.append(text)

    def _loop(self, every: float, once: Callable[[], bool]) -> None:
        while once() and not self._stop.wait(every):
            pass

    def _metrics(self) -> bool:
        t = time.monotonic() - self.t0
        self.samples += 1
        try:
            r = self.http.get(self.url)
            r.raise_for_status()
            values = parse(r.text)
        except Exception as e:  # whatever the connection or the page does, the benchmark goes on
            self.failures += 1
            why = (" (the API key: serving.api_key_env)" if isinstance(e, httpx.HTTPStatusError)
                   and e.response.status_code in (401, 403) else "")
            what = (str(e).splitlines() or [type(e).__name__])[0][:160]
            self.note(f"GET {self.url} failed at {t:.0f} s: {what}{why}; later failures only counted",
                      once="metrics")
            return True
        if values:
            self.rows.append({"t_s": round(t, 3), **values})
        else:
            self.note(f"{self.url} has none of vLLM's series ({', '.join(SERIES)})", once="empty")
        return True

    def _gpu(self) -> bool:
        t = time.monotonic() - self.t0
        try:
            values, simulated, silent = self.gpu()
        except Exception as e:  # SSH or the tool, on the nodes; the benchmark goes on without it
            self.note(f"nvidia-smi on {', '.join(self.gpu_nodes) or 'the nodes'} does not answer "
                      f"({str(e)[:240]}): GPU power and clocks left out", once="gpu")
            return self._gpu_answered  # never answered: not asked again
        self._gpu_answered = True
        for node, why in silent.items():
            self.note(f"nvidia-smi on {node} does not answer ({why[:160]}): its GPU power and clocks "
                      "left out", once=f"gpu {node}")
        if simulated:
            self.simulated = True
            self.note(f"nvidia-smi on {', '.join(self.gpu_nodes)} is simulated (the lab): power and "
                      "clocks are not measured", once="simulated")
        self.rows.append({"t_s": round(t, 3), **values})
        return True

    def start(self) -> "Sampler":
        self.t0, self.t0_epoch = time.monotonic(), time.time()  # samples by the first, levels by the second
        loops = [(self.interval, self._metrics)] + ([(self.gpu_interval, self._gpu)] if self.gpu else [])
        for every, once in loops:
            t = threading.Thread(target=self._loop, args=(every, once), daemon=True,
                                 name=f"sparkbook-server-{once.__name__.strip('_')}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(TIMEOUT_S + 15)
        self.http.close()
        if self.failures and self.failures < self.samples:
            self.note(f"{self.failures} of {self.samples} samples of {self.url} failed")
        for text in self.notes:
            self.say(f"server metrics: {text}")

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self.save_to is not None:
            self.save(self.save_to)

    def save(self, run_dir: Path) -> Path:
        """``server_metrics.csv`` (rows by time) and ``server_metrics.json`` in
        ``RUN_DIR/benchmark/``; the CSV's path."""
        folder = Path(run_dir) / FOLDER
        rows = sorted(self.rows, key=lambda r: r["t_s"])
        seen = {c for r in rows for c in r}
        columns = COLUMNS + [c for c in (f"{g}@{n}" for n in self.gpu_nodes for g in GPU) if c in seen]
        path = Table(columns, [[r.get(c) for c in columns] for r in rows]).write_csv(folder / CSV)
        meta = {"metrics_url": self.url, "interval_s": self.interval, "t0_epoch": self.t0_epoch,
                "samples": self.samples, "failures": self.failures,
                "gpu_nodes": self.gpu_nodes if self.gpu else [],
                "gpu_interval_s": self.gpu_interval if self.gpu else None,
                "gpu_simulated": self.simulated, "notes": self.notes}
        (folder / META).write_text(json.dumps(meta, indent=1) + "\n")
        return path


def for_run(params: Params, cluster: Callable[[], Any], run_dir: Path, *, api_key: str | None,
            say: Callable[[str], None] = print) -> Sampler:
    """The sampler of a benchmark of ``params``' endpoint, saving into ``run_dir`` when it stops:
    the API root's /metrics, and nvidia-smi on each serving node where the parameters expect a
    GPU."""
    nodes = [n.name for n in params.serving_nodes if params.gpus_of(n)]
    return Sampler(endpoint.urls(params.endpoint)[1] + "/metrics", api_key=api_key,
                   gpu=gpu_reader(cluster, nodes) if nodes else None, gpu_nodes=nodes, save_to=run_dir, say=say)


def load(run_dir: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The saved samples, column -> values (NaN where a row lacks it; every column of
    :data:`COLUMNS`, and the GPU's of the nodes that answered), and the metadata; empty when
    nothing was saved."""
    folder = Path(run_dir) / FOLDER
    if not (folder / CSV).is_file():
        return {}, {}
    with (folder / CSV).open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    names = dict.fromkeys([*COLUMNS, *(reader.fieldnames or [])])
    cols = {c: np.array([float(r[c]) if r.get(c) else np.nan for r in rows]) for c in names}
    meta = json.loads((folder / META).read_text()) if (folder / META).is_file() else {}
    return cols, meta


def gpu_columns(cols: dict[str, np.ndarray]) -> dict[str, dict[str, str]]:
    """Node -> {GPU column: its CSV column} of the GPU series that hold a value, nodes in order."""
    out: dict[str, dict[str, str]] = {}
    for c, values in cols.items():
        name, at, node = c.partition("@")
        if at and name in GPU and np.isfinite(values).any():
            out.setdefault(node, {})[name] = c
    return out


def level_windows(results: Results, t0_epoch: float | None) -> tuple[list[tuple[str, float, float]], bool]:
    """Each level's (label, start, end) in seconds since the sampler's start (``t0_epoch``,
    :data:`META`'s), and whether they are exact: from the levels' ``started_at`` on the same clock
    when every level has it, else placed end to end, the last ending with the benchmark
    (approximate: the pauses between levels, prompt sizing, are not known)."""
    levels = results.levels
    if t0_epoch and levels and all(lv.started_at is not None for lv in levels):
        return [(lv.label, lv.started_at - t0_epoch, lv.started_at - t0_epoch + lv.duration_s)
                for lv in levels], True
    out, end = [], results.duration_s or sum(lv.duration_s for lv in levels)
    for lv in reversed(levels):
        out.append((lv.label, end - lv.duration_s, end))
        end -= lv.duration_s
    return out[::-1], False


def output_rate(results: Results, windows: Sequence[tuple[str, float, float]],
                width: float) -> tuple[np.ndarray, np.ndarray]:
    """Output tok/s over time from the request records: each completed request's output tokens
    spread evenly over its decoding (first token to end), summed in bins of ``width`` s; (bin
    centres, tok/s)."""
    spans = []
    for lv, (_, start, _) in zip(results.levels, windows):
        for r in lv.requests:
            if r.ok and r.output_tokens and r.e2e_ms is not None:
                a = start + r.sent_s + (r.ttft_ms or 0.0) / 1e3
                spans.append((a, max(start + r.sent_s + r.e2e_ms / 1e3, a + 1e-6), r.output_tokens))
    if not spans:
        return np.array([]), np.array([])
    a, b, n = (np.array(x, dtype=float) for x in zip(*spans))
    edges = np.arange(0.0, b.max() + width, width)
    overlap = np.clip(np.minimum(b[:, None], edges[None, 1:]) - np.maximum(a[:, None], edges[None, :-1]), 0, None)
    tokens = (overlap / (b - a)[:, None] * n[:, None]).sum(axis=0)
    return (edges[:-1] + edges[1:]) / 2, tokens / width


def plot(results: Results, run_dir: Path) -> Any | None:
    """``RUN_DIR/benchmark/server.png``: output tok/s (the client's, from the request records, and
    the server's, from its token counter), KV cache use, requests running and waiting, preemptions
    since the start and, where read, each node's GPU power and SM clock, over time, the levels'
    starts marked. None (nothing drawn) when no sample was saved."""
    cols, meta = load(run_dir)
    if not cols or not len(cols["t_s"]):
        return None
    import matplotlib.pyplot as plt

    t = cols["t_s"]
    windows, exact = level_windows(results, meta.get("t0_epoch"))
    gpu = gpu_columns(cols)
    fig, axes = plt.subplots(4 + bool(gpu), 1, figsize=(11, 2.3 * (4 + bool(gpu))), sharex=True)
    a = axes[0]
    end = max([t.max()] + [w[2] for w in windows])
    x, rate = output_rate(results, windows, max(1.0, end / 150))
    a.plot(x, rate, drawstyle="steps-mid", label="client: output tok/s (request records)")
    counter = _series(cols, "generation_tokens")
    if len(counter[0]) > 1:
        dt = np.diff(counter[0])
        a.plot(counter[0][1:], np.diff(counter[1]) / np.where(dt > 0, dt, np.nan), alpha=0.7,
               label=f"server: generation tok/s ({SERIES['generation_tokens'][0][0]})")
    a.set_ylabel("output tok/s")
    _draw(axes[1], cols, {"kv_cache_usage": "KV cache use (%)"}, scale=100)
    _draw(axes[2], cols, {"requests_running": "running", "requests_waiting": "waiting"})
    axes[2].set_ylabel("requests")
    tp, pre = _series(cols, "preemptions")
    since = pre - pre[0] if len(pre) else pre
    axes[3].plot(tp, since, drawstyle="steps-post", label="preemptions since the start")
    axes[3].set(ylabel="preemptions", ylim=(0, max([1.0, *since]) * 1.05))  # none: 0 to 1, not 0 to 0.05
    if gpu:  # a colour per node: power solid (left axis), SM clock dashed (right axis)
        mark = " (simulated)" if meta.get("gpu_simulated") else ""
        power, clock = axes[4], None
        for i, (node, have) in enumerate(gpu.items()):
            if "gpu_power_w" in have:
                _draw(power, cols, {have["gpu_power_w"]: f"{node}: power"}, marker=".", color=f"C{i}")
            if "sm_clock_mhz" in have:
                clock = clock or power.twinx()
                _draw(clock, cols, {have["sm_clock_mhz"]: f"{node}: SM clock"}, marker="x", markersize=3,
                      linestyle="--", color=f"C{i}")
        power.set_ylabel(f"GPU power (W){mark}")
        if clock is not None:
            clock.set_ylabel(f"SM clock (MHz){mark}")
    for ax in fig.axes:
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        for _, start, _ in windows:
            ax.axvline(start, color="grey", linewidth=0.8, linestyle=":")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    for label, start, _ in windows:
        axes[0].annotate(label, (start, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                         rotation=90, va="top", ha="right")
    axes[-1].set_xlabel("seconds since the benchmark's start"
                        + ("" if exact else " (level starts approximate: placed end to end)"))
    fig.suptitle(f"what the server saw: {results.model}")
    fig.tight_layout()
    fig.savefig(Path(run_dir) / FOLDER / f"{FIGURE}.png", dpi=110)
    plt.close(fig)
    return fig


def _series(cols: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(cols[name])
    return cols["t_s"][ok], cols[name][ok]


def _draw(ax, cols: dict[str, np.ndarray], names: dict[str, str], scale: float = 1.0, **kw) -> None:
    for name, label in names.items():
        x, y = _series(cols, name)
        ax.plot(x, y * scale, label=label, **kw)
        if len(names) == 1:
            ax.set_ylabel(label)
