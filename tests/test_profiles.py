"""Standard benchmark profiles: ``benchmark.profile`` sets the leaderboard's grid, conflicting
fields are a parameters error, and the run measures every depth at every concurrency, labelled as
the leaderboard labels its rows."""

from pathlib import Path

import pytest
import yaml
from fake_openai import FakeOpenAI

from sparkbook.bench import load
from sparkbook.params import profiles
from sparkbook.params import ParamsError, validate
from sparkbook.params.settings import Benchmark

LOCAL = Path(__file__).parents[1] / "parameters" / "localhost.yaml"


def params_with(benchmark: dict):
    data = yaml.safe_load(LOCAL.read_text())
    data["benchmark"] = benchmark
    return validate(data)


def test_spark_arena_expands_to_the_published_grid():
    # https://github.com/spark-arena/recipe-registry/blob/ff7394d4305cb763c142d2aee0dcdcc0d99f891a/
    # benchmarking/spark-arena-v1.yaml: depth [0, 4096, 8192, 16384, 32768, 65535, 100000], pp [2048],
    # tg [128], concurrency [1, 2, 5, 10]
    b = params_with({"profile": "spark-arena", "seed": 7}).benchmark
    assert b.context_depths == [0, 4096, 8192, 16384, 32768, 65535, 100000]
    assert b.concurrency == [1, 2, 5, 10] and b.prompt_tokens == 2048 and b.output_tokens == 128
    assert b.seed == 7 and b.profile == "spark-arena"
    assert Benchmark(**b.model_dump()) == b  # what results.json keeps validates again
    assert Benchmark().context_depths == [0, 4096, 16384]  # no profile: the fields as given


def test_a_conflicting_field_or_an_unknown_profile_is_a_parameters_error():
    with pytest.raises(ParamsError, match=r"benchmark: .*output_tokens 256 \(the profile's: 128\)"):
        params_with({"profile": "spark-arena", "output_tokens": 256, "concurrency": [1, 2, 5, 10]})
    with pytest.raises(ParamsError, match="unknown benchmark profile 'arena': known are spark-arena"):
        params_with({"profile": "arena"})
    assert params_with({"profile": "spark-arena", "prompt_tokens": 2048}).benchmark.prompt_tokens == 2048


def test_levels_are_named_as_llama_benchy_names_its_decode_rows():
    # llama-benchy's row names, as sparkrun rebuilds them: "tg%d%s%s" % (response_size, " @ d%d" at a
    # depth, " (c%d)" when any concurrency is above 1): https://github.com/spark-arena/sparkrun/blob/
    # 1645c135ce241e9f08ba3e12316c7cdf4ec0eb1a/src/sparkrun/benchmarking/llama_benchy.py
    arena = profiles.PROFILES["spark-arena"]
    assert arena.label(4096, 2) == "tg128 @ d4096 (c2)" and arena.label(0, 1) == "tg128 (c1)"
    alone = profiles.Profile("alone", (0, 512), (1,), 64, 8, "")
    assert alone.label(512, 1) == "tg8 @ d512"


def test_the_grid_runs_every_depth_at_every_concurrency(monkeypatch):
    tiny = profiles.Profile("tiny", (0, 32), (1, 2), 16, 4, "a test grid")
    monkeypatch.setitem(profiles.PROFILES, "tiny", tiny)
    with FakeOpenAI(max_model_len=40) as server:  # depth 32 + 16 + 4 does not fit
        res = load.run(server.url, "fake-model", Benchmark(profile="tiny", seed=1), warmup=0,
                       depth_requests=2, progress=False, say=lambda *_: None)
    assert [lv.label for lv in res.depths] == ["tg4 (c1)", "tg4 (c2)"]
    assert [(lv.depth, lv.concurrency, lv.num_requests) for lv in res.depths] == [(0, 1, 2), (0, 2, 4)]
    assert res.concurrency == [] and len(res.skipped) == 2 and "tg4 @ d32 (c2)" in res.skipped[1]
    assert res.single_user().label == "tg4 (c1)" and res.benchmark["profile"] == "tiny"
