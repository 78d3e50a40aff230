"""The benchmark client against a fake vLLM: what it measures, how it sizes prompts and schedules
requests, how it counts failures, and what it saves, plots and concludes."""

import asyncio
import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from fake_openai import FakeOpenAI

from sparkbook.params import endpoint
from sparkbook import notebook
from sparkbook.bench import checks, client, load, plots, records
from sparkbook.book.errors import SparkbookError
from sparkbook.params import validate
from sparkbook.params.settings import Benchmark, Reference
from sparkbook.steps import benchmark as step
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN, Verdict

QUIET = dict(progress=False, say=lambda *_: None)


def level(server, **kw) -> records.LevelResult:
    args = dict(prompt_tokens=16, output_tokens=4, concurrency=1, num_requests=2, warmup=0, seed=1,
                prompt_salt="")
    return load.run_load(server.url, "fake-model", **{**args, **kw}, **QUIET)


def verdict(results, references=()) -> Verdict:
    return Verdict(step.TITLE, checks.checks(results, references))


def test_stats_are_numpy_percentiles():
    s = records.stats([1.0, 2.0, 3.0, 4.0])
    assert s == pytest.approx({"mean": 2.5, "p50": 2.5, "p90": 3.7, "p99": 3.97})
    assert records.stats([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_level_summary_from_known_requests():
    R = records.RequestRecord
    recs = [R(0, ok=True, prompt_tokens=10, output_tokens=5, ttft_ms=100, e2e_ms=500, tpot_ms=100,
              itl_ms=[100, 100, 100, 100], decode_tok_s=10, prefill_tok_s=100),
            R(1, ok=True, prompt_tokens=10, output_tokens=5, ttft_ms=300, e2e_ms=500, tpot_ms=50,
              itl_ms=[50, 50, 50, 50], decode_tok_s=20, prefill_tok_s=33.3),
            R(2, error="HTTP 500: boom"), R(3, error="HTTP 500: boom")]
    lv = records.LevelResult("concurrency", "c=2", "chat", 10, 5, 2, None, 4, 0)
    lv.summarize(recs, duration=2.0, cpu=1.8, lag_ms=[1.0] * 90 + [200.0] * 10)
    assert (lv.completed, lv.failures, lv.errors) == (2, 2, ["2 x HTTP 500: boom"])
    assert lv.output_tok_s == 5.0 and lv.request_throughput == 1.0  # 10 tokens, 2 requests in 2 s
    assert lv.per_user_tok_s == 15.0 and lv.decode_tok_s == 15.0
    assert lv.ttft_ms["p50"] == 200 and lv.ttft_ms["mean"] == 200
    assert lv.itl_ms == records.stats([100] * 4 + [50] * 4)  # pooled over requests
    assert lv.lateness_ms["p99"] is None  # closed loop: nothing scheduled
    assert lv.client_bound and "client CPU 90%" in lv.client_note and "event-loop lag" in lv.client_note
    row = lv.flat()
    assert row["ttft_ms_p50"] == 200 and row["errors"] == "2 x HTTP 500: boom" and "requests" not in row
    assert "event-loop lag p99 200 ms of 100 samples" in lv.client_note


def test_one_stall_of_this_machine_does_not_make_a_level_client_bound():
    """One event-loop lag or one late send (a busy neighbour) sets a p99 of few samples alone:
    the flag needs two."""
    R = records.RequestRecord
    recs = [R(i, ok=True, prompt_tokens=10, output_tokens=5, e2e_ms=10, ttft_ms=1,
              lateness_ms=900.0 if i == 3 else 1.0)
            for i in range(16)]
    lv = records.LevelResult("rate", "r=8", "chat", 10, 5, None, 8.0, 16, 0)
    lv.summarize(recs, duration=2.0, cpu=0.2, lag_ms=[1.0] * 40 + [700.0])
    assert not lv.client_bound and lv.lateness_ms["p99"] > 50, lv.client_note
    recs[4].lateness_ms = 800.0  # two late: a pattern
    lv.summarize(recs, duration=2.0, cpu=0.2, lag_ms=[1.0] * 40 + [700.0])
    assert lv.client_bound and lv.client_note == "scheduling lateness p99 800 ms of 16 samples"


def test_poisson_schedule_is_reproducible_and_has_the_rate():
    a = load.arrival_times(20001, 5.0, seed=7)
    assert a == load.arrival_times(20001, 5.0, seed=7) and a != load.arrival_times(20001, 5.0, seed=8)
    assert a[0] == 0 and all(x < y for x, y in zip(a, a[1:]))
    assert a[-1] / 20000 == pytest.approx(1 / 5.0, rel=0.02)
    gaps = np.diff(a)
    assert np.std(gaps) == pytest.approx(np.mean(gaps), rel=0.05)  # exponential: sd = mean


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_prompts_hit_the_exact_token_count_and_differ(endpoint):
    with FakeOpenAI() as server:
        lv = level(server, prompt_tokens=37, num_requests=5, endpoint=endpoint)
        bodies = server.requests
    assert lv.failures == 0 and [r.prompt_tokens for r in lv.requests] == [37] * 5, lv.requests
    assert lv.prompt_sizing.startswith("exact") and "off the exact count" not in lv.prompt_sizing
    key = "messages" if endpoint == "chat" else "prompt"
    assert len({json.dumps(b[key]) for b in bodies}) == 5  # no prefix shared between requests
    with FakeOpenAI() as again, FakeOpenAI() as salted:
        level(again, prompt_tokens=37, num_requests=5, endpoint=endpoint)
        lv = level(salted, prompt_tokens=37, num_requests=5, endpoint=endpoint, prompt_salt="run 2")
    assert [b[key] for b in again.requests] == [b[key] for b in bodies]  # seeded
    assert not {json.dumps(b[key]) for b in salted.requests} & {json.dumps(b[key]) for b in bodies}
    assert [r.prompt_tokens for r in lv.requests] == [37] * 5


def test_without_tokenize_prompts_are_estimated_and_said_so():
    with FakeOpenAI(tokenize=False) as server:
        lv = level(server, prompt_tokens=37)
    assert lv.failures == 0 and lv.prompt_sizing.startswith("estimated")
    assert lv.prompt_tokens_mean != 37  # the toy tokenizer counts 2-3 tokens per word


def test_fixed_output_length_and_token_counts_from_usage_not_chunks():
    with FakeOpenAI(eos_after=3, tokens_per_chunk=3) as server:
        lv = level(server, output_tokens=12, endpoint="completions")
        body = server.requests[0]
    assert body["max_tokens"] == 12 and body["ignore_eos"] is True and "min_tokens" not in body
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert all(r.output_tokens == 12 and r.chunks == 4 and len(r.itl_ms) == 3 for r in lv.requests)
    assert lv.output_tokens_mean == 12


def test_missing_usage_is_a_failed_request():
    with FakeOpenAI(usage=False) as server:
        lv = level(server)
    assert lv.completed == 0 and lv.failures == 2 and "no usage in the stream" in lv.errors[0]


def test_latencies_follow_the_servers_delays():
    # TTFT 150 ms after the headers; requests alternate 20 ms and 80 ms between tokens
    with FakeOpenAI(ttft=0.15, token_delay=lambda n: 0.02 if n % 2 else 0.08) as server:
        lv = level(server, output_tokens=6, num_requests=4)
    assert lv.failures == 0
    assert all(r.ttft_ms >= 150 for r in lv.requests)  # the first token, not the headers
    assert all(r.e2e_ms >= r.ttft_ms + 5 * 18 for r in lv.requests)
    # 10 gaps of 20 ms and 10 of 80 ms; a gap seen by the client can be a little shorter than the
    # server's sleep (the chunk before it read a little late), hence 90 %. On a busy machine a gap can
    # also be longer (the client scheduled late), so the split is judged by each request's median of
    # 5 gaps, which one late gap cannot move, and the pooled figures only from below
    itl = lv.itl_ms
    assert itl["p50"] >= 18 and 72 <= itl["p90"] <= itl["p99"] and itl["mean"] >= 45
    medians = sorted(np.median(r.itl_ms) for r in lv.requests)
    assert all(len(r.itl_ms) == 5 for r in lv.requests)
    assert 18 <= medians[0] <= medians[1] < 50 < 72 <= medians[2]
    slow = [r for r in lv.requests if np.median(r.itl_ms) > 50]
    assert len(slow) == 2 and all(r.decode_tok_s <= 1000 / 72 and r.tpot_ms >= 72 for r in slow)


def test_open_loop_records_lateness_and_flags_a_blocked_client():
    blocked = []

    def block_once(rec):  # runs in the client's loop: stalls it like a CPU-bound client would
        if not blocked:
            blocked.append(rec.index)
            time.sleep(0.4)

    with FakeOpenAI() as server:
        lv = level(server, request_rate=10.0, concurrency=None, num_requests=8, on_request=block_once)
        closed = level(server)
    assert lv.failures == 0 and all(r.lateness_ms is not None and r.lateness_ms > -1 for r in lv.requests)
    assert max(r.lateness_ms for r in lv.requests) >= 200
    assert lv.client_bound and "scheduling lateness" in lv.client_note
    assert all(r.lateness_ms is None for r in closed.requests) and closed.lateness_ms["p50"] is None


@pytest.mark.parametrize("client_keepalive", [0.1, 30.0])
def test_idle_connections_are_not_reused_past_the_keepalive(monkeypatch, client_keepalive):
    """A server that closes idle connections (vLLM's: after 5 s) races a client reusing one; the
    client retires idle connections before the server's limit. The control (a client that keeps
    them 30 s) shows the failure the limit avoids."""
    monkeypatch.setattr(endpoint, "KEEPALIVE_S", client_keepalive)

    async def two_requests(url):
        async with client.Session(url, "fake-model", endpoint="chat", connections=1, timeout=10) as s:
            first = await s.request("hello there", 4, 0, time.perf_counter())
            await asyncio.sleep(0.5)  # idle: past the server's keep-alive
            return first, await s.request("hello again", 4, 1, time.perf_counter())

    with FakeOpenAI(keep_alive=0.25) as fake:
        first, second = asyncio.run(two_requests(fake.url))
    assert first.ok
    if client_keepalive < 0.25:
        assert second.ok and (fake.connections, fake.dropped) == (2, 0)
    else:
        assert not second.ok and "ServerDisconnected" in second.error and fake.dropped == 1


def test_progress_shows_a_line_per_level_ending_in_its_summary(capsys):
    with FakeOpenAI() as server:
        load.run_load(server.url, "fake-model", prompt_tokens=16, output_tokens=4, concurrency=2,
                      num_requests=4, warmup=0, say=lambda *_: None)
    out = capsys.readouterr().out
    assert out.startswith("benchmark\n") and "\n  c=2: 4/4 ok in" in out


def test_runs_inside_a_running_event_loop():  # as a notebook cell does: the kernel runs a loop
    async def cell():
        return level(server)

    with FakeOpenAI() as server:
        lv = asyncio.run(cell())
    assert lv.completed == 2


def test_unknown_model_and_unreachable_server_raise():
    with FakeOpenAI(model="other") as server:
        with pytest.raises(SparkbookError, match="'fake-model' is not served.*served: other"):
            level(server)
    with pytest.raises(SparkbookError, match="cannot list the models"):
        load.run_load("http://127.0.0.1:9", "m", prompt_tokens=4, output_tokens=2, concurrency=1,
                      num_requests=1, **QUIET)


BENCH = Benchmark(context_depths=[0, 100], concurrency=[1, 2], prompt_tokens=16, output_tokens=4,
                  requests_per_level=4, request_rates=[20.0], seed=3,
                  references=[Reference(label="slow box", single_user_tok_s=1.0),
                              Reference(label="fast box", single_user_tok_s=1e6)])


def test_full_run_with_failures_skips_and_references(tmp_path):
    # requests 1-2 warm up, 3-4 are depth 0, 5-8 c=1, 9-12 c=2, 13-16 the rate: 5, 10, 15 fail
    with FakeOpenAI(max_model_len=64, fail_every=5) as server:
        res = load.run(server.url, "fake-model", BENCH, warmup=2, depth_requests=2, **QUIET)
    assert [lv.label for lv in res.levels] == ["depth 0", "c=1", "c=2", "20 req/s"]
    assert [lv.failures for lv in res.levels] == [0, 1, 1, 1]
    assert res.skipped == ["depth 100: 116 prompt + 4 output tokens exceed max_model_len 64"]
    assert res.concurrency[1].num_requests == 4 and res.concurrency[1].concurrency == 2
    v = verdict(res, BENCH.references)
    r = {c.check: c for c in v.checks}
    assert v.status == FAIL and r["load depth 0"].status == PASS
    assert r["load c=1"].status == FAIL and "HTTP 500: injected failure" in r["load c=1"].observed
    assert "concurrency 1" in r["load c=1"].command and r["load depth 100"].status == SKIP
    assert r["single user vs slow box"].status == PASS and r["single user vs fast box"].status == WARN
    assert "depth 0" in r["single user vs fast box"].observed


def test_verdict_passes_a_clean_run_and_warns_on_a_busy_client():
    with FakeOpenAI() as server:
        res = load.run(server.url, "fake-model", BENCH.model_copy(update={"request_rates": []}),
                       warmup=1, depth_requests=1, **QUIET)
    v = verdict(res)
    assert v.status == PASS, v.to_text()
    res.concurrency[0].client_bound, res.concurrency[0].client_note = True, "client CPU 95% of a core"
    generator = next(c for c in verdict(res).checks if c.check == "load generator")
    assert generator.status == WARN and "c=1: client CPU 95%" in generator.observed


def test_no_level_that_fits_fails_and_prompts_sized_without_tokenize_warn():
    with FakeOpenAI(tokenize=False, max_model_len=8) as server:
        res = load.run(server.url, "fake-model", BENCH, warmup=0, depth_requests=1, **QUIET)
    r = {c.check: c for c in verdict(res).checks}
    assert (r["benchmark"].status, r["benchmark"].observed) == (FAIL, "no level was measured")
    assert r["prompt sizing"].status == WARN and "no /tokenize" in r["prompt sizing"].observed


def test_save_load_earlier_and_plots(tmp_path):
    outputs = tmp_path / "outputs"
    with FakeOpenAI() as server:
        old = load.run(server.url, "fake-model", BENCH, warmup=0, depth_requests=1, **QUIET)
        new = load.run(server.url, "fake-model", BENCH, warmup=0, depth_requests=1, **QUIET)
    other = records.Results.from_json({**old.to_json(), "model": "another-model"})
    old.save(outputs / "run-old")
    other.save(outputs / "run-other")
    (outputs / "run-broken" / "benchmark").mkdir(parents=True)
    (outputs / "run-broken" / "benchmark" / "results.json").write_text("{")
    path = new.save(outputs / "run-new")

    assert path == outputs / "run-new" / "benchmark" / "results.json"
    data = json.loads(path.read_text())
    assert data["model"] == "fake-model" and data["source"] == "run-new"
    assert len(data["concurrency"][1]["requests"]) == 4 and data["concurrency"][1]["requests"][0]["itl_ms"]
    with (path.parent / "levels.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [row["label"] for row in table] == ["depth 0", "depth 100", "c=1", "c=2", "20 req/s"]
    assert {"ttft_ms_p99", "itl_ms_p50", "output_tok_s", "client_bound", "failures"} <= set(table[0])
    assert records.load(outputs / "run-new").to_json() == new.to_json()

    found = records.earlier(outputs, "fake-model", exclude=outputs / "run-new")
    assert [r.source for r in found] == ["run-old"]
    figs = plots.plot(new, outputs / "run-new", earlier=found, references=BENCH.references)
    assert set(figs) == {"throughput", "latency", "distributions", "depth", "rates"}
    assert all((outputs / "run-new" / "benchmark" / f"{n}.png").stat().st_size > 0 for n in figs)
    legend = [t.get_text() for t in figs["throughput"].axes[1].get_legend().get_texts()]
    assert legend == ["this run", "run-old", "slow box: 1 tok/s", "fast box: 1e+06 tok/s"]
    assert "c=2" in step.table(new).to_text()


def test_key_numbers_single_user_and_peak_throughput():
    def lv(kind, label, **kw):
        return records.LevelResult(kind, label, "chat", 128, 64, kw.pop("concurrency", 1), None, 8, 0, **kw)

    res = records.Results("m", "http://x", "chat", "2026-11-29T00:00:00+00:00", 0, {}, depths=[
        lv("depth", "depth 4096", depth=4096, decode_tok_s=20.1, prefill_tok_s=700.0),
        lv("depth", "depth 0", depth=0, decode_tok_s=27.4, prefill_tok_s=900.0)],
        concurrency=[lv("concurrency", f"c={c}", concurrency=c, output_tok_s=t, ttft_ms={"p50": 80.0})
                     for c, t in ((1, 27.0), (4, 90.5), (8, 85.0))])
    assert res.key_numbers() == [
        ("single user", "27.4 tok/s decode, 900 tok/s prefill at depth 0"),
        ("peak throughput", "90 output tok/s at concurrency 4 (TTFT p50 80 ms)")]
    assert records.Results("m", "http://x", "chat", "", 0, {}).key_numbers() == []


def test_the_step_runs_records_plots_and_concludes(tmp_path):
    """The notebook's cells: ctx.run(), step.table, step.plots, ctx.conclude."""
    data = yaml.safe_load((Path(__file__).parents[1] / "parameters" / "localhost.yaml").read_text())
    bench = BENCH.model_copy(update={"references": BENCH.references[:1]})
    with FakeOpenAI() as server:
        data["serving"].update(api_url=server.url + "/", served_model_name="fake-model")
        data["benchmark"] = bench.model_dump()
        ctx = notebook.Context(validate(data), "test", tmp_path / "outputs" / "run-1", step)
        outcome = ctx.run(warmup=0, depth_requests=1, **QUIET)
    assert isinstance(outcome, records.Results) and "20 req/s" in step.table(outcome).to_text()
    assert set(step.plots(ctx, outcome)) == {"throughput", "latency", "distributions", "depth", "rates"}
    verdict = ctx.verdict(outcome)
    ctx.conclude(outcome)
    assert verdict.title == "07 benchmark" and verdict.status == PASS, verdict.to_text()
    saved = json.loads((ctx.run_dir / "verdicts" / "07_benchmark.json").read_text())
    assert [k for k, _ in saved["key_numbers"]] == ["single user", "peak throughput"]
    for name in ("results.json", "levels.csv", "throughput.png", "latency.png", "depth.png"):
        assert (ctx.run_dir / "benchmark" / name).stat().st_size > 0, name
    assert records.load(ctx.run_dir).source == "run-1"


def test_the_step_sends_the_api_key_of_the_parameters(tmp_path, monkeypatch):
    """A vLLM that requires a key: every benchmark request carries the one serving.api_key_env names."""
    key = "sk-sparkbook-bench-key-0123456789"
    monkeypatch.setenv("SPARKBOOK_API_HOSTS", "127.0.0.1")  # the fake vLLM: where the key may go
    monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", key)
    data = yaml.safe_load((Path(__file__).parents[1] / "parameters" / "localhost.yaml").read_text())
    with FakeOpenAI(api_key=key) as server:
        data["serving"].update(api_url=server.url, served_model_name="fake-model", api_key_env="SPARKBOOK_TEST_API_KEY")
        data["benchmark"] = BENCH.model_copy(update={"references": [], "request_rates": []}).model_dump()
        ctx = notebook.Context(validate(data), "test", tmp_path / "run", step)
        outcome = ctx.run(warmup=0, depth_requests=1, **QUIET)
        assert server.refused == 0 and server.requests
    assert all(lv.completed == lv.num_requests for lv in outcome.levels)
