"""benchmarks/bench_vs_vllm.py: what it reads from each client's requests, how it starts
sparkbook's client in the serving image, and the paced server it measures both against (the lab
run itself is the benchmark, not a test)."""

import http.client
import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

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


def test_server_ttft_is_the_mean_of_the_last_n_served(bvv):
    calls = []

    def served():
        calls.append(1)
        return [(0.0, 9.0), (1.0, 1.05), (2.0, 2.07)]  # a warm-up first, then the measured two

    assert bvv.server_ttft_ms(served, 2) == pytest.approx(60.0) and calls == [1]
    assert bvv.server_ttft_ms(None, 2) is None
    assert bvv.server_ttft_ms(lambda: [], 2) is None


def test_the_paced_server_takes_32_connections_at_once_and_keeps_its_own_ttft():
    # socketserver's backlog of 5 dropped the SYNs of a 32-connection burst: resent after 1 s
    body = json.dumps({"model": "m", "prompt": "a b c", "max_tokens": 1, "stream": True}).encode()
    with FakeOpenAI(model="m", ttft=0.05, count=lambda text: 7 * len(text.split())) as fake:
        host, port = fake.server.server_address
        t0 = time.perf_counter()
        socks = [socket.create_connection((host, port), timeout=5) for _ in range(32)]
        for s in socks:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = [s.recv(65536) for s in socks]
        took = time.perf_counter() - t0
        for s in socks:
            s.close()
        ask = http.client.HTTPConnection(host, port, timeout=5)  # counts by the given tokenizer
        ask.request("POST", "/tokenize", json.dumps({"prompt": "a b c"}))
        assert json.loads(ask.getresponse().read())["count"] == 21
        ask.close()
    assert all(g.startswith(b"HTTP/1.1 200") for g in got)
    assert took < 2.5, f"32 connections took {took:.2f} s: SYNs dropped and resent?"  # 4.7 s at backlog 5
    assert len(fake.served) == 32 and all(0.05 <= b - a < 0.5 for a, b in fake.served)
