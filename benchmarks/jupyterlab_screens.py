"""Screenshots of JupyterLab for the README and the closing notes: 03 while the serving image is
copied to the worker (its widgets mid-copy), and the front page (notebooks/index.ipynb) after it.

On a fresh 2-node lab (`lab down`, then `lab up`: the worker without the serving image), starts
JupyterLab as tests/test_jupyterlab.py does (127.0.0.1, a random token, a copy of notebooks/ in a
temporary folder, the lab's parameters made lighter), runs all cells of 03, screenshots it once a
progress bar stands between 25 % and 75 %, waits for 03 to end, then runs the front page and
screenshots it. Writes benchmarks/results/jupyterlab-03-copy-DATE.png and
jupyterlab-front-page-DATE.png and prints what it did. Needs root; leaves the lab up (fresh, the
image on both nodes).

    .venv/bin/python benchmarks/jupyterlab_screens.py
"""

from __future__ import annotations

import datetime
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from jupyterlab_harness import jupyterlab, lab_page, light_params  # noqa: E402
from sparkbook.lab import Lab  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# The widths of the open notebook's progress bars, in percent
BARS = """() => Array.from(window.__nb.content.node.querySelectorAll(
  '.widget-hprogress .progress-bar')).map(b => parseFloat(b.style.width))"""


def mid_copy(lab, limit_s: float = 300) -> list[float]:
    """Wait until a progress bar of the open notebook stands between 25 % and 75 % (or the cells
    have ended, or ``limit_s``); the bars' widths then."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        bars = lab.page.evaluate(BARS)
        if any(25 <= b <= 75 for b in bars) or lab.page.evaluate("() => window.__ran !== null"):
            return bars
        time.sleep(0.5)
    return lab.page.evaluate(BARS)


def main() -> None:
    day = datetime.date.today()
    copy_png = RESULTS / f"jupyterlab-03-copy-{day}.png"
    front_png = RESULTS / f"jupyterlab-front-page-{day}.png"
    lab = Lab()
    lab.down(say=print)
    lab.up(2, say=print)  # fresh: the serving image on the head only
    with tempfile.TemporaryDirectory(prefix="sparkbook-jupyterlab-") as work:
        with jupyterlab(Path(work), light_params()) as server, lab_page(server) as page:
            print(f"JupyterLab {server.url} (token in its environment), notebooks copied to {server.root}")
            page.open("03_distribute_image.ipynb")
            t0 = time.monotonic()
            page.start_all()
            bars = mid_copy(page)
            page.screenshot(copy_png)
            print(f"03: screenshot {time.monotonic() - t0:.0f} s into run-all, progress bars at "
                  f"{', '.join(f'{b:.0f} %' for b in bars) or 'none'}: {copy_png}")
            shown = page.wait("03_distribute_image.ipynb", 600, t0)
            print(f"03: ran in {shown.seconds:.0f} s; verdict {shown.headlines[-1:] or 'not shown'}; "
                  f"errors {shown.errors or 'none'}")
            page.close()
            page.open("index.ipynb")
            shown = page.run_all("index.ipynb", 120)
            page.screenshot(front_png)
            print(f"front page: ran in {shown.seconds:.0f} s, errors {shown.errors or 'none'}: {front_png}")
            page.close()


if __name__ == "__main__":
    main()
