"""The whole runbook on the lab, 00 to 08, the way the README's first command runs it: the project's
main integration test. Then the run folder: every step passed, the results data and plots are
there, a canary token set for the run appears nowhere, and report.html renders in headless
Chromium (Debian's chromium package, driven by Playwright) with every plot loaded and no console
error."""

import json
import shutil
from pathlib import Path

import pytest

from sparkbook.runner import run

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
CANARY = "hf_e2eCANARY7f3a9c1d5b8e2f4a6c0d"
STEPS = ["00_inventory", "01_preflight", "02_collectives", "03_distribute_image", "04_ray_cluster",
         "05_serve", "06_smoke_test", "07_benchmark", "08_teardown"]


@pytest.fixture(scope="module")
def full_run(lab, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", CANARY)
        summary = run(LAB, out=out)
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
    smoke = {c["check"]: c["status"] for c in json.loads((out / "verdicts" / "06_smoke_test.json").read_text())["checks"]}
    for check in ("tool call (auto)", "tool call (required)", "reasoning"):
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


def test_the_canary_token_appears_nowhere_in_the_run_folder(full_run):
    out, _ = full_run
    leaks = [str(p) for p in out.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
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
