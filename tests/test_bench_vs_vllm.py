"""benchmarks/bench_vs_vllm.py: what it reads from each client's requests, and how it starts
sparkbook's client in the serving image (the lab run itself is the benchmark, not a test)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "bench_vs_vllm.py"


@pytest.fixture(scope="module")
def bvv():
    spec = importlib.util.spec_from_file_location("bench_vs_vllm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_details_idle_between_requests_at_concurrency_1(bvv):
    # sends out of order in the list: idle is taken in send order, from each end to the next send
    d = bvv.details(1, [2.0, 0.0, 1.0], [0.5, 0.9, 0.75], [0.01, 0.02, 0.03], duration=2.6, tokens=30)
    assert d["idle_p50_ms"] == pytest.approx(175.0)  # idle 100 ms and 250 ms
    assert d["span_s"] == pytest.approx(2.5) and d["duration_s"] == 2.6 and d["output_tokens"] == 30
    assert d["e2e_p50_ms"] == pytest.approx(750.0) and d["itl_p50_ms"] == pytest.approx(20.0)


def test_details_no_idle_above_concurrency_1(bvv):
    d = bvv.details(8, [0.0, 0.1], [1.0, 1.0], [0.01], duration=1.1, tokens=2)
    assert d["idle_p50_ms"] is None and d["span_s"] == pytest.approx(1.1)


def test_boot_runs_the_script_as_the_client_with_the_repository_first(tmp_path, bvv):
    script = tmp_path / "repo" / "benchmarks" / "x.py"
    script.parent.mkdir(parents=True)
    script.write_text("import json, sys\nprint(json.dumps([sys.path[0], sys.path[-1], sys.argv[1:]]))\n")
    out = subprocess.run([sys.executable, "-c", bvv.BOOT, str(script), "/some/site-packages", '{"n": 1}'],
                         capture_output=True, text=True, check=True).stdout
    first, last, argv = json.loads(out)
    assert first == str(tmp_path / "repo") and last == "/some/site-packages"
    assert argv == ["--client", '{"n": 1}']
