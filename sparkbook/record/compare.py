"""``sparkbook compare``: two or more run folders side by side in one page, ``compare.html``.

What each run measured (the outcome files: ``benchmark/results.json``, ``collectives.json``,
``serving.json``) and the key numbers each step recorded with its verdict, in a column per run; the
same numbers overlaid in plots (output throughput and TTFT against concurrency, all-reduce busbw
against message size, vLLM's start-up time); whether the runs are comparable, from their
fingerprints (:mod:`sparkbook.record.fingerprint`); and the history of the deployments: every run folder
beside the given ones (their parent folder, ``outputs/``) of the same deployment, oldest first, with
busbw and start-up time over time. A piece a run lacks (a run without 07) shows as absent. Every
text is masked (:mod:`sparkbook.book.redact`) and HTML-escaped; the plots are embedded, so the page is
one file.

A run folder may come from elsewhere: each piece is read checked (:mod:`sparkbook.record.folder`), one
that cannot be believed shows as "unreadable" with why, in its run's column; a folder of which
nothing can be read is an error that names it and why."""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..bench.records import LevelResult, Results
from ..book.errors import SparkbookError
from ..book.redact import mask
from ..book.tables import human_bytes
from ..collectives.nccltests import plateau
from . import fingerprint as fp, folder as runfolder
from .folder import RunFolder, shown
from .report import escaped

FILE = "compare.html"
ABSENT = "absent"
UNREADABLE = "unreadable"
# the outcome files and the first label each gives the side-by-side table (where an unreadable one says so)
OUTCOMES = {"collectives.json": "all-reduce busbw (plateau)", "serving.json": "vLLM start-up",
            Results.FILE: "benchmark grid"}
# actions of serving.json in which vLLM started: a kept deployment's seconds are no start-up time
STARTED = ("started", "restarted")


@dataclass
class Run:
    """What one run folder holds, each piece None when absent or unreadable (then in ``unreadable``)."""

    path: Path
    summary: dict | None = None
    bench: Results | None = None
    collectives: dict | None = None
    serving: dict | None = None
    fingerprint: fp.Fingerprint | None = None
    key_numbers: list[tuple[str, str]] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)  # file -> why, of what is there but unreadable

    @property
    def name(self) -> str:
        return shown(self.path.name)

    @property
    def deployment(self) -> str:
        return (self.summary or {}).get("deployment", "?")

    @property
    def started(self) -> str:
        return (self.summary or {}).get("started") or (self.bench.started if self.bench else "")

    @property
    def busbw(self) -> dict | None:
        """The plateau row of the all-reduce sweep (busbw_gbs, bytes), None without one."""
        return plateau(self.busbw_rows)

    @property
    def busbw_rows(self) -> list[dict]:
        return ((self.collectives or {}).get("result") or {}).get("rows") or []

    @property
    def startup_s(self) -> float | None:
        """vLLM's start-up time, when this run started it and it became ready."""
        s = self.serving or {}
        return s.get("seconds") if s.get("action") in STARTED and s.get("ready") else None


def load_run(path: str | Path) -> Run:
    """A run folder's pieces, each checked (what is unreadable kept in ``unreadable``); a folder
    that is not one (no summary.json, verdicts or outcome that can be read) is an error."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise SparkbookError(f"{shown(str(path))}: no such run folder")
    folder = RunFolder(path)
    verdicts = folder.verdicts()
    run = Run(path, summary=folder.read("summary.json"), collectives=folder.read("collectives.json"),
              serving=folder.read("serving.json"), bench=folder.results(), fingerprint=folder.fingerprint(),
              key_numbers=[kn for _, v in verdicts for kn in v.key_numbers], unreadable=folder.unreadable)
    if not (run.summary or run.bench or run.collectives or run.serving or run.key_numbers or verdicts):
        why = "; ".join(f"{k}: {v}" for k, v in run.unreadable.items())
        raise SparkbookError(f"{shown(str(path))}: not a run folder " + (
            f"that can be read: {why}" if why else "(no summary.json, verdicts or outcome files)"))
    return run


def _siblings(parent: Path) -> list[Path]:
    """The folders in ``parent`` holding a summary.json (no symbolic link followed)."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)
            and os.path.lexists(os.path.join(e.path, "summary.json"))]


def history(runs: Sequence[Run]) -> list[Run]:
    """Every run folder in the given runs' parent folders of the same deployments (the given runs
    too), oldest first; one whose summary cannot be read is left out."""
    deployments = {r.deployment for r in runs}
    found = {r.path: r for r in runs}
    for parent in {r.path.parent for r in runs}:
        for folder in _siblings(parent):
            if folder in found:
                continue
            try:
                summary = runfolder.read(folder, "summary.json") or {}
                if summary.get("deployment", "?") in deployments:
                    found[folder] = load_run(folder)
            except SparkbookError:  # Unreadable too
                continue
    return sorted(found.values(), key=lambda r: (r.started, r.name))


# ---- numbers ----------------------------------------------------------------------------------

def peak(bench: Results) -> LevelResult | None:
    """The concurrency level with the highest output throughput."""
    levels = [lv for lv in bench.by_concurrency() if lv.output_tok_s]
    return max(levels, key=lambda lv: lv.output_tok_s) if levels else None


def measured(run: Run) -> dict[str, str]:
    """The numbers from the outcome files, by label; a missing outcome leaves its labels out, an
    unreadable one says so at its first label."""
    out = {label: f"{UNREADABLE}: {run.unreadable[name]}" for name, label in OUTCOMES.items()
           if name in run.unreadable}
    if best := run.busbw:
        result = (run.collectives or {}).get("result") or {}
        out["all-reduce busbw (plateau)"] = (f"{best['busbw_gbs']:.2f} GB/s at {human_bytes(best['bytes'])} "
                                             f"({result.get('backend', '?')}, {result.get('world_size', '?')} ranks)")
    if run.serving:
        s = run.serving
        if run.startup_s is not None:
            out["vLLM start-up"] = f"{run.startup_s:.1f} s ({s.get('action')}, {s.get('executor', '?')})"
        else:
            out["vLLM start-up"] = f"none: {s.get('action') or '?'}" + ("" if s.get("ready") else ", not ready")
    if b := run.bench:
        g = b.benchmark
        out["benchmark grid"] = ((f"profile {g['profile']}: " if g.get("profile") else "")
                                 + f"{g.get('prompt_tokens')} in / {g.get('output_tokens')} out tokens, "
                                 f"concurrency {g.get('concurrency')}, {g.get('requests_per_level')} "
                                 f"requests per level, depths {g.get('context_depths')}")
        if one := b.single_user():
            out["single-user decode"] = f"{one.decode_tok_s:.2f} tok/s at {one.label}"
        if best := peak(b):
            out["peak output throughput"] = f"{best.output_tok_s:.2f} tok/s at concurrency {best.concurrency}"
        for lv in b.by_concurrency():
            out[f"c={lv.concurrency}: output tok/s · TTFT p50 / p99"] = (
                f"{_num(lv.output_tok_s)} · {_num(lv.ttft_ms.get('p50'), '.0f')} / "
                f"{_num(lv.ttft_ms.get('p99'), '.0f')} ms" + (f" · {lv.failures} failed" if lv.failures else ""))
    return out


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "—" if v is None else format(v, fmt)


def comparability(runs: Sequence[Run]) -> list[tuple[str, str, list[str]]]:
    """Each run after the first against the first: (title, verdict, reasons), no reasons when
    comparable."""
    base, out = runs[0], []
    for other in runs[1:]:
        title = f"{other.name} against {base.name}"
        missing = [r.name for r in (base, other) if r.fingerprint is None]
        if missing:
            out.append((title, "comparability unknown", [
                f"{n}: no fingerprint.json (a run from before fingerprints, or one that stopped before "
                "06)" for n in missing]))
            continue
        reasons = fp.differences(base.fingerprint, other.fingerprint)
        verdict = ("comparable" if not reasons else "not comparable" if fp.differences(
            base.fingerprint, other.fingerprint, benchmark=False) else
                   "not comparable: another benchmark grid on the same deployment")
        out.append((title, verdict, reasons))
    return out


# ---- plots ------------------------------------------------------------------------------------

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode()


def _figure(panels: int = 1):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display
    fig = Figure(figsize=(6.5 * panels, 4), layout="tight")
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def _finish(fig, axes, title: str, zero: bool = True) -> str:
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if zero:  # rates, bandwidth and times start at zero: a small difference does not look large
            ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(mask(title))
    return _png(fig)


def _log2(ax, ticks: list, label: Callable) -> None:
    ax.set_xscale("log", base=2)
    ticks = ticks[::-(-len(ticks) // 10)]  # ten labels at most (a sweep from 8 B to 16 GiB)
    ax.set_xticks(ticks, [label(t) for t in ticks])
    ax.minorticks_off()


def _absent(runs: Sequence[Run], has: Callable[[Run], bool]) -> str:
    names = [r.name for r in runs if not has(r)]
    return f" Absent in {', '.join(names)}." if names else ""


def plots(runs: Sequence[Run]) -> list[tuple[str, str]]:
    """(caption, base64 PNG) of each overlaid plot that at least one run has data for."""
    out = []
    with_bench = [r for r in runs if r.bench and r.bench.by_concurrency()]
    if with_bench:
        fig, (a, b) = _figure(2)
        for i, r in enumerate(runs):
            if not (r.bench and r.bench.by_concurrency()):
                continue
            levels = r.bench.by_concurrency()
            cs = [lv.concurrency for lv in levels]
            a.plot(cs, [lv.output_tok_s for lv in levels], marker="o", color=f"C{i}", label=mask(r.name))
            for p, style in (("p50", "-"), ("p99", ":")):
                b.plot(cs, [lv.ttft_ms.get(p) for lv in levels], marker="o", linestyle=style, color=f"C{i}",
                       label=f"{mask(r.name)} {p}")
        cs = sorted({lv.concurrency for r in with_bench for lv in r.bench.by_concurrency()})
        for ax, what in ((a, "output tok/s (all users)"), (b, "TTFT (ms)")):
            _log2(ax, cs, str)
            ax.set(xlabel="concurrency", ylabel=what)
        out.append(("Output throughput and TTFT (p50 solid, p99 dotted) against concurrency."
                    + _absent(runs, lambda r: bool(r.bench and r.bench.by_concurrency())),
                    _finish(fig, (a, b), "benchmark: throughput and TTFT")))
    if any(r.busbw_rows for r in runs):
        fig, (ax,) = _figure()
        for i, r in enumerate(runs):
            if r.busbw_rows:
                ax.plot([x["bytes"] for x in r.busbw_rows], [x["busbw_gbs"] for x in r.busbw_rows],
                        marker="o", color=f"C{i}", label=mask(r.name))
        _log2(ax, sorted({x["bytes"] for r in runs for x in r.busbw_rows}), human_bytes)
        ax.set(xlabel="message size", ylabel="busbw (GB/s)")
        out.append(("All-reduce bus bandwidth against message size." + _absent(runs, lambda r: bool(r.busbw_rows)),
                    _finish(fig, [ax], "all-reduce bus bandwidth")))
    if any(r.startup_s is not None for r in runs):
        fig, (ax,) = _figure()
        drawn = [(i, r) for i, r in enumerate(runs) if r.startup_s is not None]
        ax.bar([mask(r.name) for _, r in drawn], [r.startup_s for _, r in drawn],
               color=[f"C{i}" for i, _ in drawn])
        ax.set_ylabel("vLLM start-up (s)")
        ax.tick_params(axis="x", labelrotation=10, labelsize=8)
        out.append(("vLLM start-up time (only runs that started vLLM)."
                    + _absent(runs, lambda r: r.startup_s is not None), _finish(fig, [ax], "vLLM start-up")))
    return out


def history_plot(runs: Sequence[Run], given: Sequence[Run]) -> str | None:
    """busbw at the plateau and start-up time over the history (the given runs ringed); None when
    no run has either."""
    if not any(r.busbw or r.startup_s is not None for r in runs):
        return None
    fig, axes = _figure(2)
    xs = range(len(runs))
    labels = [r.started[5:16].replace("T", " ") or mask(r.name) for r in runs]
    picked = {r.path for r in given}
    for ax, what, value in ((axes[0], "busbw at the plateau (GB/s)", lambda r: (r.busbw or {}).get("busbw_gbs")),
                            (axes[1], "vLLM start-up (s)", lambda r: r.startup_s)):
        pts = [(x, value(r), r.path in picked) for x, r in zip(xs, runs) if value(r) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color="C0")
        ax.plot([p[0] for p in pts if p[2]], [p[1] for p in pts if p[2]], marker="o", markersize=12,
                markerfacecolor="none", linestyle="none", color="C3", label="compared runs")
        ax.set_xticks(list(xs), labels, rotation=30, fontsize=7)
        ax.set(xlim=(-0.5, len(runs) - 0.5), ylabel=what, xlabel="run started (UTC)")
    return _finish(fig, axes, "history: " + ", ".join(sorted({r.deployment for r in given})))


# ---- page -------------------------------------------------------------------------------------

_e = escaped  # masked, cut, HTML-escaped


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str) -> str:
    """Cells are HTML already (escaped by the caller)."""
    return (f"<table class='{cls}'><thead><tr>" + "".join(f"<th>{h}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                                               for row in rows) + "</tbody></table>")


def _side_by_side(runs: Sequence[Run], per_run: list[dict[str, str]]) -> str:
    labels = list(dict.fromkeys(k for numbers in per_run for k in numbers))
    rows = [[f"<b>{_e(k)}</b>"] + [_e(n[k]) if k in n else f"<span class='absent'>{ABSENT}</span>"
                                   for n in per_run] for k in labels]
    return _table([""] + [_e(r.name) for r in runs], rows, "side-by-side")


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def _fp_key(run: Run) -> str:
    return run.fingerprint.key() if run.fingerprint else ABSENT


def page(runs: Sequence[Run], past: Sequence[Run], out_dir: Path) -> str:
    parts = [f"<h1>sparkbook compare: {' · '.join(_e(r.name) for r in runs)}</h1>", "<h2>Runs</h2>"]
    rows = []
    for r in runs:  # paths relative to the page: a page to share names no local absolute path
        report = r.path / "report.html"
        link = (f"<a href='{_e(_relative(report, out_dir))}'>report</a>"
                if report.is_file() and not report.is_symlink() else ABSENT)
        rows.append([_e(r.name), _e(_relative(r.path, out_dir)), _e(r.deployment), _e(r.started or "?"),
                     _e((r.summary or {}).get("status", "?")), f"<code>{_e(_fp_key(r))}</code>", link,
                     "<br>".join(f"<code>{_e(k)}</code>: {_e(v)}" for k, v in r.unreadable.items()) or "none"])
    parts.append(_table(["run", "folder", "deployment", "started", "status", "fingerprint", "report",
                         UNREADABLE], rows, "runs"))
    parts.append("<h2>Comparable?</h2>")
    for title, verdict, reasons in comparability(runs):
        parts.append(f"<p><b>{_e(title)}</b>: <span class='{'not-' if reasons else ''}comparable'>"
                     f"{_e(verdict)}</span></p>")
        if reasons:
            parts.append("<ul class='differences'>" + "".join(f"<li>{_e(x)}</li>" for x in reasons) + "</ul>")
    parts.append("<h2>Measured</h2>" + _side_by_side(runs, [measured(r) for r in runs]))
    parts.append("<h2>Key numbers, as each step recorded them</h2>"
                 + _side_by_side(runs, [dict(r.key_numbers) | {k: f"{UNREADABLE}: {v}" for k, v in r.unreadable.items()
                                                               if k.startswith("verdicts/")} for r in runs]))
    parts.append("<h2>Plots</h2>")
    figures = plots(runs)
    parts += [f"<figure><img alt='{_e(c)}' src='data:image/png;base64,{png}'><figcaption>{_e(c)}"
              "</figcaption></figure>" for c, png in figures] or ["<p>No run has benchmark, all-reduce "
                                                                   "or start-up data to plot.</p>"]
    parts.append(f"<h2>History ({len(past)} runs of {_e(', '.join(sorted({r.deployment for r in runs})))}"
                 ", oldest first)</h2>")
    if png := history_plot(past, runs):
        parts.append(f"<figure><img alt='history' src='data:image/png;base64,{png}'><figcaption>busbw "
                     "and vLLM start-up over time; the compared runs ringed.</figcaption></figure>")
    given = {r.path for r in runs}
    rows = []
    for r in past:
        best, top = r.busbw, peak(r.bench) if r.bench else None
        rows.append([_e(r.name) + (" <b>(compared)</b>" if r.path in given else ""), _e(r.started or "?"),
                     _e((r.summary or {}).get("status", "?")),
                     _e(f"{best['busbw_gbs']:.2f}") if best else ABSENT,
                     _e(f"{r.startup_s:.1f}") if r.startup_s is not None else ABSENT,
                     _e(f"{top.output_tok_s:.2f} at c={top.concurrency}") if top else ABSENT,
                     f"<code>{_e(_fp_key(r))}</code>"])
    parts.append(_table(["run", "started", "status", "busbw GB/s", "start-up s", "peak output tok/s",
                         "fingerprint"], rows, "history"))
    title = _e("sparkbook compare: " + " vs ".join(r.name for r in runs))
    # every text part is masked where it is made (_e, _finish, the plots' labels); masking the whole
    # page would also rewrite the base64 of an image that happens to hold a secret's characters
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n")


CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
thead th{background:#f3f3f3}.absent{color:#999;font-style:italic}.comparable{color:#1a7f37;font-weight:bold}
.not-comparable{color:#b35900;font-weight:bold}figure{margin:1em 0}img{max-width:100%}figcaption{color:#555}"""


def build(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Write ``compare.html`` into ``out`` (default: the first run's folder); return its path."""
    if len(run_dirs) < 2:
        raise SparkbookError("compare needs two run folders or more")
    runs = [load_run(d) for d in run_dirs]
    out_dir = Path(out).expanduser().resolve() if out else runs[0].path
    out_dir.mkdir(parents=True, exist_ok=True)
    return runfolder.write(out_dir, FILE, page(runs, history(runs), out_dir))
