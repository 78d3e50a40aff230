"""The whole runbook on the lab, 00 to 08, the way the README's first command runs it: the project's
main integration test, with an API key required (serving.api_key_env). Then the run folder: every
step passed, the results data and plots are there, two canaries (the HF token, and the API key with
characters that JSON, HTML and the shell escape) appear nowhere in any form, though 06 proves the key
reached vLLM (a request without it is refused), and report.html renders in headless
Chromium (Debian's chromium package, driven by Playwright) with every plot loaded and no console
error."""

import json

from browser import images_loaded, opened
from conftest import API_KEY, CANARY
from sparkbook.book.redact import _forms

STEPS = ["00_inventory", "01_preflight", "02_collectives", "03_distribute_image", "04_ray_cluster",
         "05_serve", "06_smoke_test", "07_benchmark", "08_teardown"]


def test_every_step_passes(full_run):
    out, summary = full_run
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [(s, "passed") for s in STEPS], \
        json.dumps(summary, indent=2)
    assert summary["status"] == "passed"


def test_the_reference_path_ran_ray_workers_and_parsers_proven(full_run):
    """The Ray executor with vLLM's workers as Ray actors on both nodes, in an image with an
    ENTRYPOINT; the tool call (auto and required) and the reasoning through the configured parsers."""
    out, _ = full_run
    serving = json.loads((out / "serving.json").read_text())
    assert serving["executor"] == "ray" and serving["ray_workers"] == {"spark-1": 1, "spark-2": 1}
    # the canaries reached the containers (their processes hold the variables; names only recorded)
    assert {"HF_TOKEN", "VLLM_API_KEY"} <= set(serving["secrets"]["spark-1"]), serving["secrets"]
    assert "HF_TOKEN" in serving["secrets"]["spark-2"], serving["secrets"]
    smoke = {c["check"]: c["status"] for c in json.loads((out / "verdicts" / "06_smoke_test.json").read_text())["checks"]}
    for check in ("tool call (auto)", "tool call (required)", "reasoning", "API key required"):
        assert smoke[check] == "PASS", smoke
    # issue 19: the burn-in (sequential, then the soak) and the known answers, in 06's verdict
    burn = json.loads((out / "smoke" / "burn_in.json").read_text())
    assert len(burn["sequential"]) == 20 and len(burn["soak"]) >= 9, burn["soak_skipped"]
    assert not any(r["problem"] for r in burn["sequential"] + burn["soak"])
    assert all(smoke[c] == "PASS" for c in ("burn-in sequential", "soak", "soak drift", "known answers")), smoke
    known = json.loads((out / "smoke" / "known_answers.json").read_text())
    assert len(known["answers"]) == 4 and all(a["output_tokens"] == 32 for a in known["answers"])


def test_results_data_and_plots_are_in_the_run_folder(full_run):
    out, _ = full_run
    for name in ("summary.json", "report.html", "collectives.csv", "collectives.png", "distribution.json",
                 "serving.json", "teardown.json", "benchmark/results.json", "benchmark/levels.csv",
                 "benchmark/throughput.png", "benchmark/latency.png", "benchmark/depth.png"):
        assert (out / name).stat().st_size > 0, name
    bench = json.loads((out / "benchmark" / "results.json").read_text())
    assert bench["concurrency"] and all(lv["failures"] == 0 for lv in bench["concurrency"])
    statuses = {s: json.loads((out / "verdicts" / f"{s}.json").read_text())["status"] for s in STEPS}
    assert set(statuses.values()) <= {"PASS", "WARN"}, statuses
    # issue 31: each cable measured in 02, and the serving nodes' health watched in 06 and 07
    assert (out / "rdma.csv").stat().st_size > 0 and (out / "rdma.png").stat().st_size > 0
    for step, label in (("06_smoke_test", "burn-in"), ("07_benchmark", "benchmark")):
        checks = json.loads((out / "verdicts" / f"{step}.json").read_text())["checks"]
        watched = [c for c in checks if c["check"] == "serving health"]
        assert [(c["node"], c["status"]) for c in watched] == [("all", "PASS")], checks
        assert "2 node(s)" in watched[0]["observed"]
        assert (out / "health" / f"{label}.csv").stat().st_size > 0


def test_the_run_fingerprint_names_the_lab_image_vllm_and_both_nodes_driver(full_run):
    """Issue 19: 06 wrote fingerprint.json (07 kept it): the lab image's ID as 05 inspected it, the lab's
    vLLM for CPU, both nodes' simulated driver and CX-7 firmware, everything read; report.html shows it."""
    out, _ = full_run
    fp = json.loads((out / "fingerprint.json").read_text())
    inspected = json.loads((out / "image_inspection.json").read_text())
    assert fp["unread"] == {}, fp["unread"]
    assert fp["image"]["id"] == inspected["image_id"] and fp["image"]["id"].startswith("sha256:")
    assert fp["image"]["name"] == "sparkbook-lab/vllm-cpu:latest" and fp["image"]["content"]
    assert fp["versions"]["vllm"] == "0.32.0+cpu" and fp["versions"]["torch"] and fp["versions"]["ray"]
    assert [(n["name"], n["driver"]) for n in fp["nodes"]] == [("spark-1", "580.95.05"), ("spark-2", "580.95.05")]
    assert all(n["firmware"] == {"enp1s0f1np1": "28.45.4028", "enP2p1s0f1np1": "28.45.4028"} and n["kernel"]
               for n in fp["nodes"])
    assert fp["model"]["manifest"] not in (None, "absent") and fp["model"]["files"] > 0
    assert "--enforce-eager" in fp["serving"]["flags"] and fp["layout"]["tensor parallel"] == 2
    page = (out / "report.html").read_text()
    assert "sparkbook-fingerprint" in page and "vLLM 0.32.0+cpu" in page
    assert page.index("sparkbook-fingerprint") < page.index("00_inventory: passed")


def test_the_canaries_appear_nowhere_in_the_run_folder_in_any_form(full_run):
    """The API key reached vLLM (06's "API key required" passed above), and the token file holding
    it held the HF token too: their absence here means sparkbook kept them out."""
    out, _ = full_run
    forms = {f.encode() for c in (CANARY, API_KEY) for f in _forms(c) | {c[:8]}}
    leaks = [(str(p), f) for p in out.rglob("*") if p.is_file() for f in forms if f in p.read_bytes()]
    assert leaks == []


def test_report_renders_in_headless_chromium(full_run):
    out, summary = full_run
    with opened(out / "report.html") as page:
        assert page.locator("table.sparkbook-summary").first.is_visible()
        assert page.locator("table.sparkbook-key-numbers").is_visible()
        assert "PASSED" in page.inner_text("body")[:2000]
        images_loaded(page, 5)
        page.screenshot(path=str(out / "report.png"))
    assert (out / "report.png").stat().st_size > 10_000


def test_the_server_metrics_show_the_kv_cache_in_use_during_the_concurrency_levels(full_run):
    """07 sampled the lab vLLM's /metrics about every second (sparkbook.bench.server): during the
    concurrency levels (placed by their own start on the sampler's clock) its KV cache was in use
    and requests ran side by side; each serving node's simulated nvidia-smi answered and is marked
    so; server.png is among 07's plots."""
    import numpy as np
    from sparkbook.bench import records, server
    out, _ = full_run
    cols, meta = server.load(out)
    res = records.load(out)
    placed, exact = server.level_windows(res, meta.get("t0_epoch"))
    assert exact, placed
    windows = {label: (a, b) for label, a, b in placed}
    spans = [windows[lv.label] for lv in res.concurrency]
    during = np.zeros(len(cols["t_s"]), dtype=bool)
    for a, b in spans:
        during |= (cols["t_s"] >= a) & (cols["t_s"] <= b)
    kv = cols["kv_cache_usage"][during]
    assert during.any() and (kv > 0).any(), (spans, cols["t_s"].tolist(), cols["kv_cache_usage"].tolist())
    assert np.nanmax(cols["requests_running"][during]) >= 2, cols["requests_running"].tolist()
    assert meta["gpu_simulated"] and len(meta["gpu_nodes"]) >= 2, meta  # the head and its worker(s)
    assert list(server.gpu_columns(cols)) == meta["gpu_nodes"], list(cols)
    assert meta["failures"] <= meta["samples"] / 10, meta["notes"]  # a slow answer on 2 busy cores may time out
    assert (out / "benchmark" / "server.png").stat().st_size > 0
