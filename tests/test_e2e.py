"""The whole runbook on the lab, 00 to 08, the way the README's first command runs it: the project's
main integration test, with an API key required (serving.api_key_env). Then the run folder: every
step passed, the results data and plots are there, two canaries (the HF token, and the API key with
characters that JSON, HTML and the shell escape) appear nowhere in any form, though 06 proves the key
reached vLLM (a request without it is refused), and report.html renders in headless
Chromium (Debian's chromium package, driven by Playwright) with every plot loaded and no console
error."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sparkbook.redact import _forms
from sparkbook.runner import run

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
CANARY = "hf_e2eCANARY7f3a9c1d5b8e2f4a6c0d"
API_KEY = "sk-e2e\"CANARY&<key>'9f2c4e7b1d"
STEPS = ["00_inventory", "01_preflight", "02_collectives", "03_distribute_image", "04_ray_cluster",
         "05_serve", "06_smoke_test", "07_benchmark", "08_teardown"]


@pytest.fixture(scope="module")
def full_run(lab, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    data = yaml.safe_load(LAB.read_text())
    data["serving"]["api_key_env"] = "SPARKBOOK_E2E_API_KEY"
    params_file = tmp_path_factory.mktemp("params") / "lab-e2e.yaml"
    params_file.write_text(yaml.safe_dump(data))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", CANARY)
        mp.setenv("SPARKBOOK_E2E_API_KEY", API_KEY)
        summary = run(params_file, out=out)
    return out, summary


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


def test_the_canaries_appear_nowhere_in_the_run_folder_in_any_form(full_run):
    """The API key reached vLLM (06's "API key required" passed above), and the token file holding
    it held the HF token too: their absence here means sparkbook kept them out."""
    out, _ = full_run
    forms = {f.encode() for c in (CANARY, API_KEY) for f in _forms(c) | {c[:8]}}
    leaks = [(str(p), f) for p in out.rglob("*") if p.is_file() for f in forms if f in p.read_bytes()]
    assert leaks == []


def test_report_renders_in_headless_chromium(full_run):
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser_path:
        pytest.skip("chromium is not installed (scripts/bootstrap installs it)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    out, summary = full_run
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((out / "report.html").as_uri(), wait_until="load")
            assert page.locator("table.sparkbook-summary").first.is_visible()
            assert page.locator("table.sparkbook-key-numbers").is_visible()
            assert "PASSED" in page.inner_text("body")[:2000]
            images = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])")
            assert len(images) >= 5 and all(c and w > 0 and h > 0 for c, w, h in images), images
            page.screenshot(path=str(out / "report.png"))
        finally:
            browser.close()
    assert errors == []
    assert (out / "report.png").stat().st_size > 10_000
