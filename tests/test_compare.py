"""``sparkbook compare`` on synthetic run folders shaped like a real lab run's
(outputs/2026-11-30-scale-lab4-mp/): the page names every run and its numbers, a missing step shows
as absent, the fingerprints' differences appear, the history holds every run of the deployment
beside them (not another deployment's), every plot loads, secrets are masked, and the page renders
in headless Chromium without a console error."""

import base64
import html
import json
import re

import pytest

from browser import images_loaded, opened
from sparkbook.record import compare, fingerprint
from sparkbook.cli import main
from sparkbook.book.errors import SparkbookError


def level(c: int, tok_s: float, ttft: float) -> dict:
    """A concurrency level as benchmark/results.json holds it (its requests left out)."""
    ms = lambda v: {"mean": v, "p50": v, "p90": v * 1.2, "p99": v * 1.5}  # noqa: E731
    return {"kind": "concurrency", "label": f"c={c}", "endpoint": "chat", "prompt_tokens": 128,
            "output_tokens": 32, "concurrency": c, "request_rate": None, "num_requests": 2, "seed": 0,
            "depth": None, "completed": 2, "failures": 0, "errors": [], "duration_s": 14.7,
            "request_throughput": tok_s / 32, "output_tok_s": tok_s, "per_user_tok_s": tok_s / c,
            "prefill_tok_s": 1973.7, "decode_tok_s": tok_s / c, "prompt_tokens_mean": 128.0,
            "output_tokens_mean": 32.0, "ttft_ms": ms(ttft), "tpot_ms": ms(231.5), "itl_ms": ms(231.5),
            "e2e_ms": ms(7341.5), "client_cpu_s": 0.03, "client_cpu_frac": 0.002, "requests": []}


def make_run(parent, name, *, started, deployment="lab", busbw=0.55, startup=70.0, tok_s=(4.4, 9.1),
             action="restarted"):
    """A run folder: summary, verdicts with key numbers, collectives.json, serving.json and
    benchmark/results.json (each left out when its value is None)."""
    d = parent / name
    (d / "verdicts").mkdir(parents=True)
    steps = []
    if busbw is not None:
        rows = [{"bytes": 2 ** 20 * 2 ** i, "time_us": 9000.0 * 2 ** i, "algbw_gbs": busbw * f / 1.5,
                 "busbw_gbs": busbw * f, "correct": True} for i, f in enumerate((0.3, 0.6, 0.8, 1.0))]
        (d / "collectives.json").write_text(json.dumps({"backend": "gloo", "result": {
            "backend": "gloo", "world_size": 2, "torch": "2.13.0+cpu", "nccl": None, "rows": rows},
            "timed_out": False, "duration_s": 11.4}))
        (d / "verdicts" / "02_collectives.json").write_text(json.dumps({
            "title": "collectives", "status": "PASS", "checks": [],
            "key_numbers": [["all-reduce bus bandwidth", f"{busbw:.2f} GB/s at 8 MiB (gloo)"]]}))
        steps.append("02_collectives")
    if startup is not None:
        (d / "serving.json").write_text(json.dumps({
            "action": action, "ready": True, "seen": "ready", "seconds": startup, "executor": "ray",
            "models": ["/models/tiny-qwen3"], "diagnosis": [], "conflicts": []}))
        (d / "verdicts" / "05_serve.json").write_text(json.dumps({
            "title": "serve", "status": "PASS", "checks": [],
            "key_numbers": [["vLLM start-up", f"ready in {startup:.0f} s ({action})"]]}))
        steps.append("05_serve")
    if tok_s is not None:
        (d / "benchmark").mkdir()
        (d / "benchmark" / "results.json").write_text(json.dumps({
            "model": "/models/tiny-qwen3", "base_url": "http://10.77.0.11:8000/v1", "endpoint": "chat",
            "started": started, "seed": 0, "prompt_sizing": "exact: /tokenize with the chat template",
            "benchmark": {"context_depths": [0], "concurrency": [1, 2], "output_tokens": 32,
                          "prompt_tokens": 128, "requests_per_level": 2, "request_rates": [], "seed": 0,
                          "references": []},
            "depths": [], "rates": [], "skipped": [], "duration_s": 53.2, "source": name,
            "concurrency": [level(c, t, 165.0 * c) for c, t in zip((1, 2), tok_s)]}))
        (d / "verdicts" / "07_benchmark.json").write_text(json.dumps({
            "title": "benchmark", "status": "PASS", "checks": [],
            "key_numbers": [["peak throughput", f"{max(tok_s):.0f} output tok/s at concurrency 2"]]}))
        steps.append("07_benchmark")
    (d / "summary.json").write_text(json.dumps({
        "status": "passed", "params": str(parent / "lab.yaml"), "deployment": deployment,
        "started": started, "run_dir": str(d), "finished": started,
        "steps": [{"step": s[:2], "name": s, "notebook": f"{s}.ipynb", "status": "passed",
                   "duration_s": 1.0, "error": None} for s in steps]}))
    return d


def fingerprint_of(flags: str, image: str = "sha256:3c57279c808d", benchmark=None) -> fingerprint.Fingerprint:
    """A lab run's fingerprint (two nodes), its serving flags and image as given."""
    return fingerprint.Fingerprint(
        sparkbook={"version": "0.19.0", "commit": "0" * 40, "dirty": False}, created="2026-11-30T17:06:00+00:00",
        deployment="lab", image={"name": "sparkbook-lab/vllm-cpu:latest", "id": image, "digests": []},
        versions={"vllm": "0.32.0+cpu", "torch": "2.13.0+cpu", "nccl": None, "ray": "2.52.0"},
        model={"name": "sparkbook-lab/tiny-qwen3", "revision": None, "manifest": "9c1e0d2a"},
        serving={"flags": flags.split(), "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        layout={"tensor parallel": 2, "pipeline parallel": 1, "executor": "ray", "serving nodes": 2, "nodes": 2},
        nodes=[{"name": f"spark-{i}", "driver": "580.95.05", "kernel": "6.11.0-1016-nvidia"} for i in (1, 2)],
        benchmark=benchmark or {"concurrency": [1, 2], "output_tokens": 32})


@pytest.fixture
def outputs(tmp_path):
    """outputs/ holding three runs of the lab (the oldest without a benchmark), one of another
    deployment; the two newest lab runs differ in a serving flag."""
    out = tmp_path / "outputs"
    make_run(out, "a-old", started="2026-11-28T09:00:00+00:00", busbw=0.41, startup=95.0, tok_s=None)
    make_run(out, "b-base", started="2026-11-30T17:00:54+00:00", busbw=0.55, startup=70.0)
    make_run(out, "c-new", started="2026-11-30T23:10:00+00:00", busbw=0.62, startup=58.5,
             tok_s=(5.1, 10.3))
    make_run(out, "z-other", started="2026-11-29T12:00:00+00:00", deployment="quad", busbw=3.3)
    fingerprint.save(fingerprint_of("--enforce-eager"), out / "b-base")
    fingerprint.save(fingerprint_of("--enforce-eager --max-num-seqs 8"), out / "c-new")
    return out


def text(path):
    """The page's text, tags dropped and entities read."""
    return html.unescape(re.sub(r"<[^>]+>", " ", path.read_text()))


def test_the_page_names_both_runs_their_numbers_and_the_fingerprint_difference(outputs):
    page = compare.build([outputs / "b-base", outputs / "c-new"])
    assert page == outputs / "b-base" / "compare.html"
    t = text(page)
    for expected in ("b-base", "c-new", "0.55 GB/s at 8 MiB (gloo, 2 ranks)", "0.62 GB/s at 8 MiB",
                     "70.0 s (restarted, ray)", "58.5 s (restarted, ray)", "9.10 tok/s at concurrency 2",
                     "10.30 tok/s at concurrency 2", "peak throughput", "10 output tok/s at concurrency 2"):
        assert expected in t, expected
    assert "not comparable" in t
    assert "vllm serve: --enforce-eager -> --enforce-eager --max-num-seqs 8" in t
    assert "image:" not in t  # the same image is no reason


def test_identical_fingerprints_are_comparable_and_another_grid_only_differs_in_the_benchmark(outputs):
    fingerprint.save(fingerprint_of("--enforce-eager"), outputs / "c-new")
    t = re.sub(r"\s+", " ", text(compare.build([outputs / "b-base", outputs / "c-new"])))
    assert "c-new against b-base : comparable" in t
    assert "not comparable" not in t
    fingerprint.save(fingerprint_of("--enforce-eager", benchmark={"concurrency": [1, 2, 4], "output_tokens": 32}),
                     outputs / "c-new")
    t = re.sub(r"\s+", " ", text(compare.build([outputs / "b-base", outputs / "c-new"])))
    assert "not comparable: another benchmark grid on the same deployment" in t
    assert "benchmark.concurrency: [1, 2] -> [1, 2, 4]" in t


def test_a_run_without_a_fingerprint_or_a_benchmark_shows_them_absent(outputs):
    page = compare.build([outputs / "c-new", outputs / "a-old"], out=outputs.parent / "cmp")
    assert page == outputs.parent / "cmp" / "compare.html"
    t = text(page)
    assert "a-old: no fingerprint.json" in t and "comparability unknown" in t
    side = page.read_text().split("<h2>Measured</h2>")[1].split("</table>")[0]
    peak = re.search(r"<tr><td><b>peak output throughput</b></td>(.*?)</tr>", side).group(1)
    assert "10.30 tok/s" in peak and "absent" in peak  # c-new has it, a-old has no 07
    assert "Absent in a-old." in t  # the benchmark plot's caption


def test_the_history_holds_the_deployments_runs_oldest_first_and_not_another_deployment(outputs):
    page = compare.build([outputs / "c-new", outputs / "b-base"]).read_text()
    hist = page.split("<h2>History")[1]
    assert "3 runs of lab" in html.unescape(hist)
    rows = re.findall(r"<tr><td>([a-z]-[a-z]+)", hist)
    assert rows == ["a-old", "b-base", "c-new"]  # oldest first, whatever order they were given in
    assert "z-other" not in page
    for busbw, startup in (("0.41", "95.0"), ("0.55", "70.0"), ("0.62", "58.5")):
        assert f"<td>{busbw}</td><td>{startup}</td>" in hist


def test_a_kept_deployment_has_no_start_up_time(tmp_path):
    a = make_run(tmp_path, "a", started="2026-11-30T10:00:00+00:00", startup=3.0, action="kept")
    b = make_run(tmp_path, "b", started="2026-11-30T11:00:00+00:00", startup=61.0)
    t = text(compare.build([a, b]))
    assert "none: kept" in t and "61.0 s (started" not in t and "61.0 s (restarted" in t
    assert "3.0 s" not in t


def test_every_plot_is_an_embedded_png_and_rate_axes_start_at_zero(outputs, monkeypatch):
    from matplotlib.axes import Axes
    seen = []
    real = Axes.set_ylim
    monkeypatch.setattr(Axes, "set_ylim", lambda ax, *a, **kw: (seen.append((ax.get_ylabel(), a, kw)),
                                                                 real(ax, *a, **kw))[1])
    page = compare.build([outputs / "b-base", outputs / "c-new"]).read_text()
    images = re.findall(r"<img alt='([^']*)' src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 4, [a for a, _ in images]  # benchmark, busbw, start-up, history
    import base64
    assert all(base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n" for _, png in images)
    zeroed = {label for label, _, kw in seen if kw.get("bottom") == 0}
    assert {"output tok/s (all users)", "TTFT (ms)", "busbw (GB/s)", "vLLM start-up (s)",
            "busbw at the plateau (GB/s)"} <= zeroed


def test_secrets_are_masked_and_names_escaped(tmp_path, monkeypatch):
    secret = "sk-compareSECRET9f2c4e7b1d"
    monkeypatch.setenv("SPARKBOOK_TEST_API_KEY", secret)
    a = make_run(tmp_path, "a<b>", started="2026-11-30T10:00:00+00:00")
    b = make_run(tmp_path, "b", started="2026-11-30T11:00:00+00:00")
    res = json.loads((b / "benchmark" / "results.json").read_text())
    res["benchmark"]["concurrency"] = [1, 2, secret]
    (b / "benchmark" / "results.json").write_text(json.dumps(res))
    fingerprint.save(fingerprint_of("--enforce-eager", image="sha256:<img>"), a)
    fingerprint.save(fingerprint_of("--enforce-eager", image=f"sha256:{secret}"), b)
    page = compare.build([a, b]).read_text()
    assert secret not in page and secret[:8] not in page
    assert "a&lt;b&gt;" in page and "<b>a<b>" not in page
    assert "image: sha256:&lt;img&gt; -&gt; sha256:********" in page


def test_fewer_than_two_runs_or_a_missing_folder_is_an_error(outputs, tmp_path):
    with pytest.raises(SparkbookError, match="two run folders"):
        compare.build([outputs / "b-base"])
    with pytest.raises(SparkbookError, match="no such run folder"):
        compare.build([outputs / "b-base", tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SparkbookError, match="not a run folder"):
        compare.build([outputs / "b-base", tmp_path / "empty"])


def test_cli_prints_the_page_path(outputs, tmp_path, capsys):
    assert main(["compare", str(outputs / "b-base"), str(outputs / "c-new"), "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "o" / "compare.html")
    assert "c-new" in (tmp_path / "o" / "compare.html").read_text()
    assert main(["compare", str(outputs / "b-base")]) == 2
    assert "two run folders" in capsys.readouterr().err


def test_the_page_renders_in_headless_chromium(outputs, tmp_path):
    page_path = compare.build([outputs / "b-base", outputs / "c-new", outputs / "a-old"])
    render(page_path, ["b-base", "c-new", "a-old"], images=4)


def render(page_path, names, images):
    """Open the page in headless Chromium: no console error, every image loaded, the runs named;
    a full-page screenshot beside it."""
    with opened(page_path) as page:
        assert page.locator("table.side-by-side").first.is_visible()
        body = page.inner_text("body")
        assert all(n in body for n in names), body[:2000]
        images_loaded(page, images)
        page.screenshot(path=str(page_path.with_suffix(".png")), full_page=True)
    return body


def test_the_page_names_no_absolute_local_path(outputs, tmp_path):
    page = compare.build([outputs / "b-base", outputs / "c-new"], out=tmp_path / "share").read_text()
    assert str(tmp_path) not in page
    runs = page.split("<h2>Runs</h2>")[1].split("</table>")[0]
    assert "<td>../outputs/b-base</td>" in runs and "<td>../outputs/c-new</td>" in runs, runs


def test_an_image_is_not_masked_where_its_base64_holds_a_secrets_characters(outputs, monkeypatch):
    """Only text is masked: a secret that happens to appear in an image's base64 would break it."""
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256))).decode()
    monkeypatch.setattr(compare, "_png", lambda fig: png)
    monkeypatch.setenv("SPARKBOOK_TEST_TOKEN", png[20:40])
    page = compare.build([outputs / "b-base", outputs / "c-new"]).read_text()
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert images and set(images) == {png}


def test_a_profile_run_compares_by_concurrency_from_its_depth_0_row(outputs):
    path = outputs / "c-new" / "benchmark" / "results.json"
    res = json.loads(path.read_text())
    res["benchmark"]["profile"] = "spark-arena"
    sweep, res["concurrency"] = res["concurrency"], []  # a profile's grid: every depth at every concurrency
    res["depths"] = [{**lv, "kind": "depth", "depth": d, "label": f"tg32 @ d{d} (c{lv['concurrency']})"}
                     for d in (0, 4096) for lv in sweep]
    path.write_text(json.dumps(res))
    page = compare.build([outputs / "b-base", outputs / "c-new"])
    side = html.unescape(page.read_text().split("<h2>Measured</h2>")[1].split("</table>")[0])
    assert "profile spark-arena: 128 in / 32 out tokens" in side
    peak = re.search(r"<tr><td><b>peak output throughput</b></td>(.*?)</tr>", side).group(1)
    assert peak.count("tok/s at concurrency 2") == 2, peak  # both runs, the profile's too
    assert "c=2: output tok/s" in side and "Absent in" not in text(page)  # the benchmark plot has both


# ------------------------------------------------------------------------ received run folders

HOSTILE = "before\n\n[x](javascript:alert(1)) <script>alert(1)</script>\n\n<img src=x onerror=alert(1)> after"
LIVE = re.compile(r"""href\s*=\s*["']?\s*javascript:|<script|<img[^>]*onerror""", re.I)


def flat(page: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def test_a_planted_compare_html_is_replaced_not_written_through_and_a_linked_run_not_read(outputs, tmp_path):
    import os
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "somefile").write_text("keep me")
    (outputs / "b-base" / "compare.html").symlink_to(outside / "somefile")
    (outside / "hard").write_text("keep me too")
    os.link(outside / "hard", outputs / "c-new" / "compare.html")
    (outputs / "y-linked").symlink_to(make_run(outside, "evil", started="2026-11-29T00:00:00+00:00", busbw=9.99))
    page = compare.build([outputs / "b-base", outputs / "c-new"])
    assert (outside / "somefile").read_text() == "keep me" and not page.is_symlink() and "b-base" in page.read_text()
    compare.build([outputs / "c-new", outputs / "b-base"])
    assert (outside / "hard").read_text() == "keep me too"
    history = page.read_text().split("<h2>History")[1]
    assert "y-linked" not in history and "9.99" not in history  # a sibling that is a link is no run of these


def test_a_bad_run_beside_a_good_one_is_named_with_why(outputs, tmp_path, capsys):
    bad = outputs / "c-new"
    (bad / "serving.json").write_text(json.dumps({"action": "restarted", "ready": True, "seconds": "58.5"}))
    res = json.loads((bad / "benchmark" / "results.json").read_text())
    res["concurrency"][0]["output_tok_s"] = 1e308  # matplotlib's axes overflow on it
    (bad / "benchmark" / "results.json").write_text(json.dumps(res))
    (bad / "verdicts" / "02_collectives.json").write_bytes(b'{"title": "collectives", "key_numbers": [["a"')
    assert main(["compare", str(outputs / "b-base"), str(bad), "--out", str(tmp_path / "o")]) == 0
    page = (tmp_path / "o" / "compare.html").read_text()
    measured = flat(page.split("<h2>Measured</h2>")[1].split("</table>")[0])
    assert "vLLM start-up 70.0 s (restarted, ray) unreadable: seconds: Input should be a valid number (got '58.5')" in measured
    assert re.search(r"benchmark grid 128 in / 32 out tokens, .*? unreadable: concurrency\[0\]\.output_tok_s: Input "
                     r"should be less than or equal to 1000000000000 \(got 1e\+308\) ", measured), measured
    runs = flat(page.split("<h2>Runs</h2>")[1].split("</table>")[0])
    assert "verdicts/02_collectives.json : not JSON: Expecting ',' delimiter (line 1, column 46)" in runs, runs
    assert "serving.json : seconds: Input should be a valid number (got '58.5')" in runs
    # a folder of which nothing can be read: an error that names it and why, in one line
    received = tmp_path / "received"
    received.mkdir()
    (received / "summary.json").write_bytes(b"\xff\xfe{}")
    assert main(["compare", str(outputs / "b-base"), str(received)]) == 2
    assert capsys.readouterr().err == (f"sparkbook: {received}: not a run folder that can be read: summary.json: "
                                       "not UTF-8 (byte 0xff at offset 0)\n")


def test_hostile_values_and_the_largest_numbers_a_shape_lets_through_draw_inert(tmp_path):
    runs = [make_run(tmp_path, n, started=f"2026-11-30T1{i}:00:00+00:00", busbw=1e12 / (i + 1), startup=1e12,
                     tok_s=(1e12, 1e11)) for i, n in enumerate(("a", "b"))]
    for d in runs:
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**s, "deployment": HOSTILE, "status": HOSTILE}))
        (d / "verdicts" / "09_x.json").write_text(json.dumps({"key_numbers": [[HOSTILE, HOSTILE]]}))
        c = json.loads((d / "collectives.json").read_text())
        c["result"].update(backend=HOSTILE, rows=[{"bytes": 2 ** 62, "busbw_gbs": 1e12}, *c["result"]["rows"]])
        (d / "collectives.json").write_text(json.dumps(c))
    fingerprint.save(fingerprint_of(HOSTILE), runs[0])
    fingerprint.save(fingerprint_of("--enforce-eager", image=HOSTILE), runs[1])
    page = compare.build(runs).read_text()
    assert not LIVE.search(page)
    assert flat(page).count("[x](javascript:alert(1)) <script>alert(1)</script>") >= 6
    assert len(re.findall(r"src='data:image/png;base64,", page)) == 4
