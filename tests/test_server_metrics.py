"""What the server saw during the benchmark (sparkbook.bench.server): vLLM's /metrics parsed (a real
DGX Spark sample; pages written by prometheus_client, the library vLLM exposes them with), the
sampler against a small local server whose /metrics changes and fails, nvidia-smi's power and
clocks, and the CSV and the figure of the benchmark step."""

import http.server
import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from fake_openai import FakeOpenAI
from sparkbook import notebook
from sparkbook.bench import records, server
from sparkbook.params import validate
from sparkbook.nodes.remote import Result
from sparkbook.params.settings import Benchmark
from sparkbook.steps import benchmark as step

FIXTURES = Path(__file__).parent / "fixtures"
LABELS = ("engine", "model_name")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text().split("\n", 2)[2]  # past the source and note lines


class Vllm:
    """The /metrics of a vLLM with ``engines`` engines, written by prometheus_client as vLLM does."""

    def __init__(self, engines: int = 1, kv_name: str = "vllm:kv_cache_usage_perc"):
        self.registry = CollectorRegistry()
        self.kv = Gauge(kv_name, "KV-cache usage. 1 means 100 percent usage.", LABELS, registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "running", LABELS, registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", LABELS, registry=self.registry)
        self.preempted = Counter("vllm:num_preemptions", "preemptions", LABELS, registry=self.registry)
        self.tokens = Counter("vllm:generation_tokens", "generation tokens", LABELS, registry=self.registry)
        self.engines = [(str(e), "m") for e in range(engines)]
        for e in self.engines:
            for metric in (self.kv, self.running, self.waiting, self.preempted, self.tokens):
                metric.labels(*e)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_a_real_spark_page_parses_without_taking_the_created_timestamp_for_a_count():
    values = server.parse(fixture("vllm-metrics-spark-1.txt"))
    assert values == {"kv_cache_usage": 0.0, "requests_running": 0.0, "requests_waiting": 0.0, "preemptions": 0.0}


def test_label_sets_combine_as_vllms_dashboards_do_and_the_old_kv_name_is_read():
    v = Vllm(engines=2)
    for (e, m), kv, running, pre in ((v.engines[0], 0.25, 3, 2), (v.engines[1], 0.5, 4, 1)):
        v.kv.labels(e, m).set(kv)
        v.running.labels(e, m).set(running)
        v.preempted.labels(e, m).inc(pre)
    assert "vllm:num_preemptions_created" in v.text()  # the sibling a naive reader would sum
    values = server.parse(v.text())
    assert values["kv_cache_usage"] == 0.5 and values["requests_running"] == 7 and values["preemptions"] == 3
    assert values["generation_tokens"] == 0 and values["requests_waiting"] == 0
    old = Vllm(kv_name="vllm:gpu_cache_usage_perc")
    old.kv.labels(*old.engines[0]).set(0.125)
    assert server.parse(old.text())["kv_cache_usage"] == 0.125
    assert server.parse("# HELP other x\nother_total 1\n") == {}
    with pytest.raises(ValueError):
        server.parse("<html><body>Not Found</body></html>\n")


def test_power_and_clocks_of_nvidia_smi():
    assert server.parse_gpu("11.00, 2418\n") == {"gpu_power_w": 11.0, "sm_clock_mhz": 2418.0}
    assert server.parse_gpu("40.50, 1200\n20.50, 1000\n") == {"gpu_power_w": 61.0, "sm_clock_mhz": 1100.0}
    assert server.parse_gpu("[N/A], 2418\n") == {"sm_clock_mhz": 2418.0}  # GB10 reports some fields N/A


class Page(http.server.ThreadingHTTPServer):
    """/metrics from ``text()``; answers 500 while ``failing``, 401 without ``key`` when set."""

    def __init__(self, text, key=None):
        self.text, self.key, self.failing, self.auth = text, key, False, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.auth.append(self.headers.get("Authorization"))
                code = 500 if outer.failing else 401 if outer.key and outer.auth[-1] != f"Bearer {outer.key}" else 200
                raw = outer.text().encode() if code == 200 else b"error"
                self.send_response(code)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_port}/metrics"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


def wait_for(cond, limit=5.0):
    end = time.monotonic() + limit
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    assert cond()


def test_the_sampler_follows_a_changing_page_and_notes_a_failure_without_stopping(tmp_path):
    v = Vllm()
    e = v.engines[0]
    said = []
    with Page(v.text) as page, server.Sampler(page.url, interval=0.02, save_to=tmp_path, say=said.append) as s:
        wait_for(lambda: len(s.rows) >= 3)
        v.running.labels(*e).set(8)
        v.waiting.labels(*e).set(2)
        v.kv.labels(*e).set(0.4)
        v.preempted.labels(*e).inc(3)
        wait_for(lambda: s.rows[-1].get("preemptions") == 3)
        page.failing = True
        wait_for(lambda: s.failures >= 3)
        page.failing = False
        v.preempted.labels(*e).inc(2)
        wait_for(lambda: s.rows[-1].get("preemptions") == 5)
    assert s.rows[0]["requests_running"] == 0 and s.rows[0]["preemptions"] == 0
    assert {"requests_running": 8, "requests_waiting": 2, "kv_cache_usage": 0.4}.items() <= s.rows[-1].items()
    pre = [r["preemptions"] for r in s.rows]
    assert pre == sorted(pre) and pre[-1] - pre[0] == 5  # the counter's delta over the run
    times = [r["t_s"] for r in s.rows]
    assert times == sorted(times) and times[0] < 0.5
    failed = [n for n in said if "failed at" in n]
    assert len(failed) == 1 and "500" in failed[0] and "later failures only counted" in failed[0], said
    assert any(f"{s.failures} of {s.samples} samples" in n for n in said), said
    saved = (tmp_path / "benchmark" / "server_metrics.csv").read_text().splitlines()
    assert saved[0].split(",") == server.COLUMNS and len(saved) == len(s.rows) + 1
    meta = json.loads((tmp_path / "benchmark" / "server_metrics.json").read_text())
    assert meta["failures"] == s.failures and meta["notes"] == s.notes


def test_the_api_key_goes_in_the_header_and_its_absence_is_named():
    v = Vllm()
    with Page(v.text, key="sk-metrics-key") as page:
        with server.Sampler(page.url, api_key="sk-metrics-key", interval=0.02, say=lambda _: None) as s:
            wait_for(lambda: len(s.rows) >= 2)
        assert set(page.auth) == {"Bearer sk-metrics-key"} and not s.failures
        said = []
        with server.Sampler(page.url, interval=0.02, say=said.append) as s:
            wait_for(lambda: s.failures >= 2)
    assert not s.rows and "401" in said[0] and "serving.api_key_env" in said[0], said


def test_a_page_that_is_not_vllms_is_named_once_and_sampling_goes_on():
    said = []
    with Page(lambda: "<html>proxy login</html>\n") as page, \
            server.Sampler(page.url, interval=0.02, say=said.append) as s:
        wait_for(lambda: s.failures >= 3)
    assert not s.rows and len(said) == 1 and "failed at" in said[0], said
    said.clear()
    with Page(lambda: "# TYPE other_total counter\nother_total 1\n") as page, \
            server.Sampler(page.url, interval=0.02, say=said.append) as s:
        wait_for(lambda: s.samples >= 3)
    assert not s.rows and not s.failures and len(said) == 1 and "none of vLLM's series" in said[0], said


def test_gpu_readings_are_sampled_marked_simulated_or_left_out_once():
    calls, said = [], []

    def reader():
        calls.append(1)
        return {"gpu_power_w@spark-1": 11.0, "sm_clock_mhz@spark-1": 2418.0}, True, {"spark-2": "exit code 255"}

    with server.Sampler("http://127.0.0.1:9/metrics", gpu=reader, gpu_nodes=["spark-1", "spark-2"], interval=5,
                        gpu_interval=0.02, say=said.append) as s:
        wait_for(lambda: len(calls) >= 3)
    gpu = [r for r in s.rows if "gpu_power_w@spark-1" in r]
    assert len(gpu) >= 3 and s.simulated and sum("simulated" in n for n in said) == 1, said
    silent = [n for n in said if "does not answer" in n]  # the worker that stays silent: named once
    assert len(silent) == 1 and "spark-2" in silent[0] and "exit code 255" in silent[0], said

    def silent():
        calls.append(1)
        raise RuntimeError("exit code 127: nvidia-smi: command not found")

    calls.clear()
    said.clear()
    with server.Sampler("http://127.0.0.1:9/metrics", gpu=silent, gpu_nodes=["spark-2"], interval=5,
                        gpu_interval=0.02, say=said.append):
        time.sleep(0.2)
    assert len(calls) == 1  # a node where it never answered is not asked again
    gpu_notes = [n for n in said if "nvidia-smi" in n]
    assert len(gpu_notes) == 1 and "spark-2" in gpu_notes[0] and "left out" in gpu_notes[0]


class Cluster:
    """Answers each node with its Result, all nodes of a call at once (remote.Cluster.run's shape)."""

    def __init__(self, *results):
        self.results, self.asked = {r.node: r for r in results}, []

    def run(self, cmd, nodes, **kw):
        self.asked.append((list(nodes), cmd, kw.get("timeout")))
        return {n: self.results[n] for n in nodes}


def test_the_gpu_reader_asks_every_serving_node_at_once_and_sees_the_lab_mark():
    lab = Cluster(Result("spark-1", "", 0, "11.00, 2418\n", "[sparkbook lab: simulated nvidia-smi on spark-1]\n"),
                  Result("spark-2", "", 0, "12.50, 1200\n", "[sparkbook lab: simulated nvidia-smi on spark-2]\n"))
    assert server.gpu_reader(lambda: lab, ["spark-1", "spark-2"])() == (
        {"gpu_power_w@spark-1": 11.0, "sm_clock_mhz@spark-1": 2418.0,
         "gpu_power_w@spark-2": 12.5, "sm_clock_mhz@spark-2": 1200.0}, True, {})
    assert lab.asked == [(["spark-1", "spark-2"], ["nvidia-smi", "--query-gpu=power.draw,clocks.sm",
                                                   "--format=csv,noheader,nounits"], 10)]  # one fan-out a tick
    throttled = Cluster(Result("spark-1", "", 0, "38.12, 2405\n", ""),
                        Result("spark-2", "", 127, "", "bash: nvidia-smi: command not found\n"))
    values, simulated, silent = server.gpu_reader(lambda: throttled, ["spark-1", "spark-2"])()
    assert values == {"gpu_power_w@spark-1": 38.12, "sm_clock_mhz@spark-1": 2405.0} and simulated is False
    assert list(silent) == ["spark-2"] and "command not found" in silent["spark-2"]
    gone = Cluster(Result("spark-1", "", 127, "", "bash: nvidia-smi: command not found\n"))
    with pytest.raises(RuntimeError, match="spark-1: exit code 127.*command not found"):
        server.gpu_reader(lambda: gone, ["spark-1"])()


def test_each_nodes_power_and_clock_is_saved_and_drawn_as_a_line_of_its_own(tmp_path):
    readings = iter([({"gpu_power_w@spark-1": 30.0 + i, "sm_clock_mhz@spark-1": 2400.0,
                       "gpu_power_w@spark-2": 20.0, "sm_clock_mhz@spark-2": 1100.0 - i}, False, {})
                     for i in range(1000)])
    with server.Sampler("http://127.0.0.1:9/metrics", gpu=lambda: next(readings), gpu_nodes=["spark-1", "spark-2"],
                        interval=5, gpu_interval=0.02, save_to=tmp_path, say=lambda _: None) as s:
        wait_for(lambda: sum("gpu_power_w@spark-2" in r for r in s.rows) >= 3)
    header = (tmp_path / "benchmark" / "server_metrics.csv").read_text().splitlines()[0].split(",")
    assert header == server.COLUMNS + ["gpu_power_w@spark-1", "sm_clock_mhz@spark-1", "gpu_power_w@spark-2",
                                       "sm_clock_mhz@spark-2"]
    cols, meta = server.load(tmp_path)
    assert meta["gpu_nodes"] == ["spark-1", "spark-2"] and (cols["sm_clock_mhz@spark-2"] < 1100).any()
    fig = server.plot(records.Results("m", "http://x", "chat", "", 0, {}), tmp_path)
    power, clock = fig.axes[4], fig.axes[5]
    assert [line.get_label() for line in power.get_lines()][:2] == ["spark-1: power", "spark-2: power"]
    assert [line.get_label() for line in clock.get_lines()][:2] == ["spark-1: SM clock", "spark-2: SM clock"]


def test_notes_are_kept_during_sampling_and_said_when_it_stops():
    """Said from the sampler's threads, a note would break into the benchmark's live progress line."""
    said = []
    with Page(lambda: "<html>proxy login</html>\n") as page:
        s = server.Sampler(page.url, interval=0.02, say=said.append).start()
        wait_for(lambda: s.failures >= 2)
        assert s.notes and said == []
        s.stop()
    assert said == [f"server metrics: {n}" for n in s.notes]


def level(label, requests, duration, started_at=None):
    return records.LevelResult("concurrency", label, "chat", 16, 10, 2, None, len(requests), 0,
                               duration_s=duration, requests=requests, started_at=started_at)


def test_levels_on_the_time_axis_and_the_output_rate_keeps_every_token():
    reqs = [records.RequestRecord(i, ok=True, output_tokens=10, sent_s=i * 0.5, ttft_ms=100.0, e2e_ms=1100.0)
            for i in range(4)]
    res = records.Results("m", "http://x", "chat", "", 0, {}, concurrency=[level("c=1", reqs[:2], 2.0),
                                                                          level("c=2", reqs[2:], 3.0)])
    res.duration_s = 6.0
    windows, exact = server.level_windows(res, 1.7e9)  # results without started_at (older runs)
    assert not exact and windows == [("c=1", 1.0, 3.0), ("c=2", 3.0, 6.0)]  # end to end, ending with the run
    x, rate = server.output_rate(res, windows, 0.5)
    assert rate.sum() * 0.5 == pytest.approx(40) and rate[x < 1.0].sum() == 0
    t0 = 1.7e9  # the sampler's start; each level's on the same clock
    exact_res = records.Results("m", "http://x", "chat", "", 0, {}, concurrency=[
        level("c=1", reqs[:2], 2.0, started_at=t0 + 0.5), level("c=2", reqs[2:], 3.0, started_at=t0 + 2.75)])
    assert server.level_windows(exact_res, t0) == ([("c=1", 0.5, 2.5), ("c=2", 2.75, 5.75)], True)
    assert not server.level_windows(exact_res, None)[1]  # a sampler that saved no start: placed end to end


def test_the_step_samples_the_servers_metrics_and_draws_them(tmp_path):
    """07 against a fake vLLM whose /metrics follows its load: the CSV, the figure among 07's."""
    data = yaml.safe_load((Path(__file__).parents[1] / "parameters" / "localhost.yaml").read_text())
    bench = Benchmark(context_depths=[], concurrency=[1, 4], request_rates=[], requests_per_level=6,
                      prompt_tokens=16, output_tokens=25, references=[])
    v = Vllm()
    with FakeOpenAI(token_delay=0.01) as fake:
        def page():
            busy = len(fake.requests) % 4  # any value that changes while the fake works
            v.running.labels(*v.engines[0]).set(busy)
            v.kv.labels(*v.engines[0]).set(0.01 * busy)
            return v.text()
        fake.metrics = page
        data["serving"].update(api_url=fake.url, served_model_name="fake-model")
        data["benchmark"] = bench.model_dump()
        ctx = notebook.Context(validate(data), "test", tmp_path / "run-1", step)
        outcome = ctx.run(warmup=0, progress=False, say=lambda *_: None)
    figs = step.plots(ctx, outcome)
    assert "server" in figs and (ctx.run_dir / "benchmark" / "server.png").stat().st_size > 0
    cols, meta = server.load(ctx.run_dir)
    assert len(cols["t_s"]) >= 2 and meta["metrics_url"] == fake.url + "/metrics" and meta["gpu_nodes"] == []
    assert (cols["requests_running"] >= 0).all() and not meta["failures"]
    # one clock: each level placed where it ran, after the sampler's start, in order, none overlapping
    windows, exact = server.level_windows(outcome, meta["t0_epoch"])
    assert exact and [w[0] for w in windows] == ["c=1", "c=4"], windows
    assert 0 <= windows[0][1] < windows[0][2] <= windows[1][1] < windows[1][2] <= cols["t_s"].max() + 1.5, windows
    assert not (ctx.run_dir / "fingerprint.json").exists()  # conftest's no_fingerprint: no node script ran here


def test_no_figure_when_nothing_was_sampled(tmp_path):
    res = records.Results("m", "http://x", "chat", "", 0, {})
    assert server.plot(res, tmp_path) is None
    server.Sampler("http://127.0.0.1:9/metrics", say=lambda _: None).save(tmp_path)  # a header only
    assert server.plot(res, tmp_path) is None
