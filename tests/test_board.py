"""The leaderboard's measurement (sparkbook/bench/board.py): llama-benchy 0.4.0's procedure and
figures (its runner.py, client.py and results.py), checked on requests of known times and
against the fake server."""

import argparse
import importlib.util
import json
import math
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

from sparkbook.bench import board, load
from sparkbook.bench.client import Session, Trace
from sparkbook.bench.records import BOARD_FILE, RequestRecord, Results
from sparkbook.params.settings import Benchmark


def reply(sent, first_response, chunks, end, prompt_tokens, output_tokens=None) -> board.Reply:
    n = output_tokens if output_tokens is not None else sum(k or 1 for _, k in chunks)
    rec = RequestRecord(0, ok=True, prompt_tokens=prompt_tokens, output_tokens=n)
    return board.Reply(rec, Trace(sent, first_response, list(chunks), end))


def test_a_chunk_of_several_tokens_is_spread_since_the_token_before_and_without_ids_usage_is_spread():
    r = reply(0.0, 0.5, [(1.0, 1), (2.0, 2), (2.5, 0), (4.0, 3)], 4.1, 10)
    assert r.token_times() == pytest.approx([1.0, 1.5, 2.0, 2.0 + 2 / 3, 2.0 + 4 / 3, 4.0])
    first = reply(0.0, 0.5, [(1.0, 2), (3.0, 1)], 3.1, 10)
    assert first.token_times() == [1.0, 1.0, 3.0]  # no token before the first chunk: all at its time
    # a chunk without token_ids: the server's count (5) spread from the first text chunk to the last
    no_ids = reply(0.0, 0.5, [(1.0, None), (2.0, 1), (3.0, None)], 3.1, 10, output_tokens=5)
    assert no_ids.token_times() == [1.0, 1.5, 2.0, 2.5, 3.0]


def test_peak_counts_the_most_tokens_in_a_second_and_a_shorter_burst_by_its_own_span():
    # the most in any (t - 1 s, t]: 0.4, 1.3, 1.35, 1.39 (0.4 > 0.39), or 1.3 .. 1.41
    assert board.peak([0.0, 0.2, 0.4, 1.3, 1.35, 1.39, 1.41, 3.0]) == 4.0
    assert board.peak([0.0, 1.0, 1.5, 2.0]) == 2.0  # a token exactly 1 s before is out: (1.0, 2.0]
    assert board.peak([0.0, 0.25, 0.5]) == 6.0  # 3 tokens in 0.5 s
    assert board.peak([]) == 0.0 and board.peak([2.0]) == 1.0


def test_one_user_figures_are_the_means_of_the_requests_own_and_latency_comes_off_ttfr():
    latency = 0.1
    rounds = [[reply(0.0, 0.6, [(0.6, 1), (0.8, 1), (1.0, 1)], 1.05, 260)],   # usage 260 within 20 % of 256
              [reply(5.0, 5.4, [(5.5, 1), (5.6, 1), (5.7, 1), (5.8, 1)], 5.9, 999)]]  # 999 is not: 256
    fig = board.figures(rounds, 256, latency, 1)
    pp, tg = fig["pp"], fig["tg"]
    assert pp["ttfr"]["values"] == pytest.approx([600.0, 400.0])
    assert pp["est_ppt"]["values"] == pytest.approx([500.0, 300.0])
    assert pp["e2e_ttft"]["values"] == pytest.approx([600.0, 500.0])  # the first text chunk
    assert pp["t_s"]["values"] == pytest.approx([260 / 0.5, 256 / 0.3]) and pp["t_s_req"] == pp["t_s"]
    # decode: the tokens after the first over the first to the last token
    assert tg["t_s"]["values"] == pytest.approx([2 / 0.4, 3 / 0.3])
    assert tg["t_s"]["mean"] == pytest.approx((5 + 10) / 2) and tg["t_s"]["std"] == pytest.approx(2.5)


def test_at_concurrency_the_totals_span_the_batch_and_per_request_speeds_stay_beside():
    batch = [reply(0.0, 0.5, [(0.5, 1), (1.0, 1), (1.5, 1)], 1.6, 100),
             reply(0.1, 0.9, [(0.9, 1), (1.1, 1)], 1.2, 100)]
    fig = board.figures([batch], 100, 0.0, 2)
    assert fig["pp"]["t_s"]["values"] == pytest.approx([200 / 0.9])  # last first token - first send
    assert fig["pp"]["t_s_req"]["values"] == pytest.approx([100 / 0.5, 100 / 0.8])
    assert fig["tg"]["t_s"]["values"] == pytest.approx([3 / 1.0])  # (2 + 1) tokens, 0.5 .. 1.5
    assert fig["tg"]["t_s_req"]["values"] == pytest.approx([2 / 1.0, 1 / 0.2])
    failed = board.Reply(RequestRecord(1, error="HTTP 500"), Trace(0.0))
    assert board.figures([[failed]], 100, 0.0, 2)["pp"]["t_s"] is None  # nothing measured, no row


def test_rows_carry_llama_benchys_names_context_load_first():
    fig = board.figures([[reply(0.0, 0.5, [(0.5, 1), (1.0, 1)], 1.1, 300)]], 256, 0.0, 2)
    names = [r["test_name"] for r in board.rows(1024, 2, 256, 32, fig, fig, many=True)]
    assert names == ["ctx_pp @ d1024 (c2)", "ctx_tg @ d1024 (c2)", "pp256 @ d1024 (c2)", "tg32 @ d1024 (c2)"]
    assert [r["test_name"] for r in board.rows(0, 1, 256, 32, fig, None, many=False)] == ["pp256", "tg32"]


async def _body_checks():
    async with Session("http://127.0.0.1:1", "m", endpoint="chat", connections=1, timeout=1) as s:
        strict = s.body("hi", 8)
        assert strict["ignore_eos"] is True and strict["temperature"] == 0.0
        free = s.body("hi", 8, context="ctx", exact=False)
        assert "ignore_eos" not in free and "temperature" not in free
        assert free["messages"] == [{"role": "system", "content": "ctx"}, {"role": "user", "content": "hi"}]
        s.endpoint = "completions"
        with pytest.raises(ValueError, match="needs the chat endpoint"):
            s.body("hi", 8, context="ctx")


def test_the_board_request_asks_for_the_servers_sampling_and_lets_eos_end_it():
    load.run_async(_body_checks)


def test_a_cell_loads_the_context_then_measures_warm_up_round_left_out(tmp_path):
    with FakeOpenAI(eos_after=3) as server:
        server.ttft = 0.02
        levels = load.run_board(server.url, "fake-model", depths=[0, 40], concurrency=[1, 2], prompt_tokens=16,
                                output_tokens=8, runs=2, warmup=0, progress=False, say=lambda *_: None)
        sent = [b for b in server.requests if "messages" in b]
    assert [lv.label for lv in levels] == ["tg8 (c1)", "tg8 (c2)", "tg8 @ d40 (c1)", "tg8 @ d40 (c2)"]
    # (runs + 1) rounds of c requests, twice at a depth (the context load first)
    assert len(sent) == 3 * 1 + 3 * 2 + 2 * 3 * 1 + 2 * 3 * 2
    loads = [b for b in sent if b["messages"][-1]["content"] == board.CONTEXT_PROBE]
    assert len(loads) == 9 and all(b["messages"][0]["role"] == "system" for b in loads)
    assert all("ignore_eos" not in b and "temperature" not in b and b["return_token_ids"] for b in sent)
    one, deep = levels[0], levels[3]
    assert one.num_requests == one.completed == 2 and deep.completed == 4  # the warm-up round is not in
    assert one.output_tokens_mean == 3  # EOS ended every reply
    names = [r["test_name"] for r in deep.board["rows"]]
    assert names == ["ctx_pp @ d40 (c2)", "ctx_tg @ d40 (c2)", "pp16 @ d40 (c2)", "tg8 @ d40 (c2)"]
    assert deep.board["latency_ms"] > 0 and all(v > 15 for v in deep.board["rows"][2]["ttfr"]["values"])
    res = Results("fake-model", server.url, "chat", "t", 0, Benchmark().model_dump(), depths=levels)
    res.save(tmp_path)
    csv = (tmp_path / "benchmark" / BOARD_FILE).read_text().splitlines()
    assert csv[0].startswith("model,test_name,t_s_mean,t_s_std,t_s_req_mean") and len(csv) == 1 + 2 + 2 + 4 + 4


def test_paired_ratios_give_a_geometric_mean_and_a_t_interval_that_narrows_with_pairs():
    from sparkbook.book.samples import ratio_interval
    mean, low, high = ratio_interval([0.9, 1.1])
    assert mean == pytest.approx((0.9 * 1.1) ** 0.5)
    # log ratios ±0.1003 about their mean: sd 0.1419, se 0.1003, t(1 df) 12.706
    assert low == pytest.approx(mean * math.exp(-12.706 * 0.10034), rel=1e-3) and high > 3
    many = ratio_interval([0.9, 1.1] * 10)
    assert many[0] == pytest.approx(mean) and 0.94 < many[1] < many[2] < 1.06
    assert ratio_interval([1.0]) is None and ratio_interval([1.0, 0.0]) is None


def test_bench_vs_llamabenchy_judges_each_cell_by_its_whole_interval(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "bench_vs_llamabenchy", Path(__file__).parents[1] / "benchmarks" / "bench_vs_llamabenchy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.goal_of("tg32 @ d1024 (c2)", "t_s") == "decode" and mod.goal_of("ctx_tg @ d1024", "peak_ts") == "decode"
    assert mod.goal_of("pp256 (c1)", "t_s") == "prefill" and mod.goal_of("pp256 (c1)", "ttfr") == "ttft"
    row = lambda **kw: {k: kw.get(k) for k in ("t_s", "t_s_req", "peak_ts", "peak_ts_req", "ttfr", "est_ppt", "e2e_ttft")}
    pairs = [{"ours": {"tg32 (c1)": row(t_s=v), "pp256 (c1)": row(t_s=100.0, ttfr=w)},
              "llama_benchy": {"tg32 (c1)": row(t_s=10.0), "pp256 (c1)": row(t_s=100.0, ttfr=50.0),
                               "only theirs": row(t_s=1.0)}, "levels": []}
             for v, w in ((10.0, 50.0), (10.1, 60.0), (9.95, 40.0), (10.05, 55.0))]
    args = argparse.Namespace(pairs=4)
    mod.report(args, pairs, tmp_path)
    cells = {(c["test"], c["metric"]): c for c in json.loads((tmp_path / "bench_vs_llamabenchy.json").read_text())["cells"]}
    assert cells[("tg32 (c1)", "t_s")]["met"] and cells[("tg32 (c1)", "t_s")]["goal"] == 0.03
    assert cells[("pp256 (c1)", "t_s")]["met"]  # equal every time: an interval of zero width
    assert not cells[("pp256 (c1)", "ttfr")]["met"]  # 0.8-1.2 spread: the interval passes 10 %
    out = capsys.readouterr().out
    assert "2 of 3 cells meet theirs" in out and "rows only one tool printed: only theirs" in out
