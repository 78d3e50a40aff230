"""Headless Chromium for the tests that render a page sparkbook writes (report.html, compare.html)
or JupyterLab (tests/jupyterlab_harness.py):
Debian's chromium package (scripts/bootstrap installs it), driven by Playwright; skipped, visibly,
where either is missing."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

# Every <img>: loaded, and its natural size
IMAGES = "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])"


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's ``Browser``), closed on leaving."""
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser_path:
        pytest.skip("chromium is not installed (scripts/bootstrap installs it)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def opened(path: Path) -> Iterator[Any]:
    """The page at ``path``, loaded in headless Chromium; on leaving, no console error or page
    error was logged."""
    errors: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri(), wait_until="load")
        yield page
    assert errors == []


def images_loaded(page: Any, at_least: int) -> None:
    """At least ``at_least`` images on the page, every one of them loaded."""
    found = page.eval_on_selector_all("img", IMAGES)
    assert len(found) >= at_least and all(c and w > 0 and h > 0 for c, w, h in found), found
