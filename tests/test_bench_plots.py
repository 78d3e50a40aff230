"""Honest benchmark plots: rate axes start at zero, and the spread of the requests behind a point is
drawn with it (p10-p90 error bars), so that 58-64 tok/s of noise does not read as a trend."""

import numpy as np
import pytest
from matplotlib.collections import LineCollection

from sparkbook.bench import plots, records


def level(kind, *, concurrency=1, depth=None, decode=(58.0, 61.0, 64.0)) -> records.LevelResult:
    label = f"c={concurrency}" if depth is None else f"d{depth} c{concurrency}"
    lv = records.LevelResult(kind, label, "chat", 512, 64, concurrency, None, len(decode), 0, depth=depth)
    lv.requests = [records.RequestRecord(i, ok=True, decode_tok_s=d, prefill_tok_s=900 + d, ttft_ms=80.0,
                                         itl_ms=[16.0]) for i, d in enumerate(decode)]
    lv.per_user_tok_s = float(np.mean(decode))
    lv.decode_tok_s = float(np.median(decode))
    lv.prefill_tok_s = 900 + lv.decode_tok_s
    lv.output_tok_s = lv.per_user_tok_s * concurrency
    return lv


def result() -> records.Results:
    conc = [level("concurrency", concurrency=c, decode=tuple(d - c for d in (58.0, 61.0, 64.0))) for c in (1, 2, 4)]
    grid = [level("depth", concurrency=c, depth=d) for d in (0, 4096) for c in (1, 2)]
    return records.Results("m", "http://x", "chat", "2026-12-01T00:00:00+00:00", 0, {}, depths=grid,
                           concurrency=conc)


def bars(ax) -> list[tuple[float, float]]:
    """(low, high) of each vertical error bar drawn on ``ax``."""
    return [(float(s[:, 1].min()), float(s[:, 1].max())) for c in ax.collections if isinstance(c, LineCollection)
            for s in c.get_segments()]


def test_rate_axes_start_at_zero_in_the_saved_figures(tmp_path):
    figs = plots.plot(result(), tmp_path)
    assert (tmp_path / "benchmark" / "throughput.png").stat().st_size > 0
    for name in ("throughput", "depth"):
        for ax in figs[name].axes:
            assert ax.get_ylim()[0] == 0, (name, ax.get_ylabel())
            assert ax.get_ylim()[1] > 60


def test_per_user_decode_shows_the_spread_of_the_requests():
    figs = plots.plot(result())
    per_user = figs["throughput"].axes[1]
    assert "p10-p90" in per_user.get_ylabel()
    expected = [np.percentile([58 - c, 61 - c, 64 - c], (10, 90)) for c in (1, 2, 4)]
    assert np.ravel(bars(per_user)) == pytest.approx(np.ravel(expected))  # p10-p90: 57.6-62.4 at c=1
    assert not bars(figs["throughput"].axes[0])  # all users' output tok/s: one number a level, no spread


def test_a_grid_draws_a_line_per_concurrency():
    depth = plots.plot(result())["depth"]
    labels = [t.get_text() for t in depth.axes[1].get_legend().get_texts()]
    assert labels == ["c=1", "c=2"] and len(bars(depth.axes[1])) == 4


def profile_result(source="") -> records.Results:
    """A standard profile's run: its grid in ``depths``, no concurrency sweep."""
    grid = [level("depth", concurrency=c, depth=d) for d in (0, 4096) for c in (1, 2, 5)]
    return records.Results("m", "http://x", "chat", "2026-12-01T00:00:00+00:00", 0, {"profile": "spark-arena"},
                           depths=grid, source=source)


def test_a_profile_run_keeps_its_plots_by_concurrency_from_the_depth_0_row():
    res = profile_result()
    assert res.by_concurrency() == [lv for lv in res.depths if lv.depth == 0]
    figs = plots.plot(res)
    assert {"throughput", "latency", "distributions", "depth"} <= set(figs)
    (line, *_) = figs["throughput"].axes[0].get_lines()
    assert list(line.get_xdata()) == [1, 2, 5]
    assert res.key_numbers()[-1][0] == "peak throughput"


def test_earlier_runs_of_a_grid_are_named_with_their_concurrency():
    depth = plots.plot(profile_result(), earlier=[profile_result("run-0")])["depth"]
    labels = [t.get_text() for t in depth.axes[1].get_legend().get_texts()]
    assert labels == ["c=1", "run-0 c=1", "c=2", "run-0 c=2", "c=5", "run-0 c=5"], labels
