"""Bus bandwidth at the plateau and small-message latency: one judgement for 02's own all-reduce
sweep and for an ``nccl-tests`` output (``all_reduce_perf``, ``all_gather_perf``, ...) that a person
pastes into ``sparkbook diagnose``, since NVIDIA's playbooks and most owners' threads report those.

A row is a dict with ``bytes``, ``time_us``, ``algbw_gbs`` and ``busbw_gbs`` (02's result rows, or
:func:`parse`'s, which keep the better of nccl-tests' out-of-place and in-place columns).

nccl-tests scales busbw per collective so that it reads the link the same way whatever the
collective (all_reduce: algbw x 2(n-1)/n, all_gather and reduce_scatter: algbw x (n-1)/n), so one
bus bandwidth bar (``expectations.busbw_gbps``) judges both. The latency bar
(``expectations.allreduce_latency_us``) is all-reduce's: other collectives' times are shown, not
judged.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from ..book.tables import Table, human_bytes
from ..book.verdict import FAIL, PASS, SKIP, WARN, Check, Verdict

# The plateau: the best busbw among the largest sizes, not the last row alone (one slow iteration
# at the top size would otherwise fail a healthy pair).
PLATEAU_TOP = 3
# A DGX Spark pair reaches its plateau from 4 GiB (NVIDIA's NCCL playbook sweeps `-b 512M -e 4G`,
# which "saturates the link just as well" as 16 GiB, and warns that 16 GiB buffers can exhaust
# unified memory: github.com/NVIDIA/dgx-spark-playbooks, nvidia/nccl/README.md at b06cc474);
# a sweep that stops below this size is named in the remedy.
PLATEAU_FROM = 4 * 2**30
# Small messages: all-reduce time is flat, latency-bound, up to about 8 KiB; the latency is the
# median time over those sizes (or the smallest size, up to 1 MiB, when none is that small). Rows of
# 0 bytes (nccl-tests -b 0, or -b 1 of a type wider than a byte) move nothing: not a latency.
LATENCY_UPTO = 8192
SMALL = 2**20
MIN_LATENCY_SIZES = 3  # sizes whose median the latency's FAIL needs: one stalled size cannot fail 02
# The DGX Spark pair's bars, what `sparkbook diagnose` judges a pasted table against without -p
# (parameters/dgx-spark-pair.yaml holds the same; a test keeps them equal):
# busbw: NVIDIA's pass bar for a two-Spark all-reduce over the 200 Gb/s cable (the connect-two-sparks
# playbook, github.com/NVIDIA/dgx-spark-playbooks); latency: nccl-tests timed 28-40 us per small
# all-reduce at 8-32 KiB on a healthy pair (github.com/NVIDIA/dgx-spark-playbooks/pull/103), 50
# leaves room for torch's launch cost.
PAIR_BUSBW_GBPS = 21.875
PAIR_LATENCY_US = 50.0
PAIR_BARS = "the DGX Spark pair's bars (built in; -p FILE for others)"
BANDWIDTH_REMEDY = (
    "check that NCCL moves data over RDMA on both halves of the port (NCCL_DEBUG=INFO shows "
    "'NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE'; a socket fallback stays near "
    "3 GB/s, one HCA near 13 GB/s), NCCL_IB_HCA naming both RoCE devices, MTU 9000 and FEC on the "
    "rails (01_preflight.ipynb, `sparkbook preflight`), and that no other traffic shares the rails; after "
    "a cable was moved, owners saw about 3 GB/s until the nodes were rebooted")
LATENCY_REMEDY = (
    "small all-reduces this slow point at a TCP path (NCCL socket fallback, or gloo) or at a busy "
    "host: check the transport NCCL chose, that NCCL_IB_HCA names the rail HCAs, and the GPU clocks "
    "(01_preflight.ipynb)")


def plateau(rows: list[dict], top: int = PLATEAU_TOP) -> dict | None:
    """The plateau row: the best busbw among the ``top`` largest sizes (None when no size reaches
    1 MiB: a table of small messages only says nothing of bandwidth)."""
    largest = sorted({r["bytes"] for r in rows})[-top:]
    if not largest or largest[-1] < SMALL:
        return None
    return max((r for r in rows if r["bytes"] in largest), key=lambda r: r["busbw_gbs"])


def bandwidth_check(rows: list[dict], bar: float) -> Check:
    """busbw at the plateau against ``bar``: PASS at or above, WARN above half, FAIL below."""
    expected = f"≥ {bar:g} GB/s (expectations.busbw_gbps)"
    best = plateau(rows)
    if best is None:
        top = f"sizes stop at {human_bytes(max(r['bytes'] for r in rows))}" if rows else "no sizes"
        return Check("bus bandwidth", "all", SKIP, f"{top} (< {human_bytes(SMALL)}): not judged", expected)
    largest = sorted({r["bytes"] for r in rows})[-PLATEAU_TOP:]
    got = best["busbw_gbs"]
    status = PASS if got >= bar else WARN if got >= bar / 2 else FAIL
    remedy = BANDWIDTH_REMEDY
    if status != PASS and largest[-1] < PLATEAU_FROM:
        remedy += (f"; the sweep stops at {human_bytes(largest[-1])}, below the {human_bytes(PLATEAU_FROM)} "
                   "where a Spark pair reaches its plateau: sweep further (collectives.max_size_mb, "
                   "or nccl-tests -e 4G)")
    return Check("bus bandwidth", "all", status, f"plateau {got:.2f} GB/s at {human_bytes(best['bytes'])} "
                 f"(best of {_span(largest)})", expected, "" if status == PASS else remedy)


def _span(sizes: list[int]) -> str:
    return human_bytes(sizes[0]) + (f"-{human_bytes(sizes[-1])}" if len(sizes) > 1 else "")


def latency(rows: list[dict], upto: int = LATENCY_UPTO) -> tuple[float, list[int]] | None:
    """The small-message all-reduce time, µs: the median over the sizes up to ``upto`` bytes (the
    smallest size, up to 1 MiB, when none is that small), and the sizes it read."""
    rows = [r for r in rows if r["bytes"] > 0]
    small = [r for r in rows if r["bytes"] <= upto] or [r for r in rows if r["bytes"] <= SMALL][:1]
    if not small:
        return None
    return statistics.median(r["time_us"] for r in small), sorted(r["bytes"] for r in small)


def latency_check(rows: list[dict], bar: float | None, collective: str = "all_reduce") -> Check:
    """The small-message time against ``bar`` µs: PASS at or below, WARN up to twice, FAIL beyond
    (over the median of at least :data:`MIN_LATENCY_SIZES` sizes; of fewer, a WARN); SKIP (the
    value reported) without a bar, without small sizes, or for another collective."""
    expected = (f"≤ {bar:g} µs (expectations.allreduce_latency_us)" if bar else
                "no bar set (expectations.allreduce_latency_us): reported, not judged")
    found = latency(rows)
    if found is None:
        return Check("small-message latency", "all", SKIP,
                     f"no size up to {human_bytes(SMALL)}" if rows else "not measured", expected)
    value, sizes = found
    observed = f"{value:.1f} µs per {collective.replace('_', '-')} " + (
        f"(median of {len(sizes)} sizes, {_span(sizes)})" if len(sizes) > 1 else f"(at {_span(sizes)})")
    if collective != "all_reduce":
        return Check("small-message latency", "all", SKIP, observed, "the bar is all-reduce's: not judged")
    if not bar:
        return Check("small-message latency", "all", SKIP, observed, expected)
    status = PASS if value <= bar else WARN if value <= 2 * bar else FAIL
    if status == FAIL and len(sizes) < MIN_LATENCY_SIZES:  # one stalled size is the whole figure
        status, observed = WARN, (f"{observed}: too few samples to judge (at least {MIN_LATENCY_SIZES} "
                                  f"sizes up to {human_bytes(LATENCY_UPTO)} fail it)")
    return Check("small-message latency", "all", status, observed, expected,
                 "" if status == PASS else LATENCY_REMEDY)


@dataclass
class Run:
    """One nccl-tests table: the collective, the ranks' hosts, its rows, what it printed as the
    average busbw, the values it found wrong, and how many rows it did not check (#wrong N/A)."""
    collective: str
    hosts: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    avg_busbw_gbs: float | None = None
    wrong: int = 0
    unchecked: int = 0


_COUNT = re.compile(r"[0-9]+")
_PREFIX = re.compile(r"^(\[\d+,\d+\]<std\w+>:|\S+: )?\s*")  # mpirun --tag-output, pdsh


def _row(tokens: list[str]) -> dict | None:
    """A table row: size count type, then redop and root where the version prints them (today's
    prints both; older ones redop alone, all_gather's neither), then time algbw busbw #wrong for
    out-of-place and for in-place: read from the right. Old versions print a maximum error (0e+00)
    in the #wrong column, checked but not a count; N/A where nothing was checked (-c 0)."""
    # ASCII digits: str.isdigit() also takes a superscript 2, which int() refuses
    if not 11 <= len(tokens) <= 13 or not _COUNT.fullmatch(tokens[0]) or not _COUNT.fullmatch(tokens[1]):
        return None
    rest = tokens[-8:]
    try:
        t1, a1, b1, t2, a2, b2 = (float(rest[i]) for i in (0, 1, 2, 4, 5, 6))
    except ValueError:
        return None
    checked = [w for w in (rest[3], rest[7]) if w != "N/A"]
    wrong = sum(int(w) for w in checked if _COUNT.fullmatch(w)) if checked else "N/A"
    return {"bytes": int(tokens[0]), "time_us": min(t1, t2), "algbw_gbs": max(a1, a2),
            "busbw_gbs": max(b1, b2), "wrong": wrong}


def parse(text: str) -> Run | None:
    """The nccl-tests table in ``text`` (None when there is none)."""
    if not re.search(r"^\S*\s*#\s+size\s+count\s+type\b", text, re.M):
        return None
    name = (re.search(r"Collective test starting:\s*(\w+?)_perf", text)
            or re.search(r"\b(\w+?)_perf(?:_mpi)?\b", text))
    run = Run(name[1] if name else "unknown")
    for line in text.splitlines():
        line = _PREFIX.sub("", line, count=1)
        if m := re.match(r"#\s+Rank\s+\d+\s.*?\bon\s+(\S+)\s+device", line):
            run.hosts.append(m[1])
        elif m := re.match(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)", line):
            run.avg_busbw_gbs = float(m[1])
        elif not line.startswith("#") and (row := _row(line.split())):
            run.rows.append(row)
            if row["wrong"] == "N/A":
                run.unchecked += 1
            else:
                run.wrong += row["wrong"]
    return run if run.rows else None


def checks(run: Run, busbw_bar: float, latency_bar: float | None) -> list[Check]:
    """A pasted table judged as 02 judges its sweep: the values, busbw at the plateau, the latency."""
    if run.unchecked == len(run.rows):
        values = Check("reduced values", "all", SKIP, "not checked (#wrong N/A: nccl-tests ran with -c 0)",
                       "#wrong 0 at every size")
    else:
        values = Check("reduced values", "all", FAIL if run.wrong else PASS,
                       f"{run.wrong} wrong value(s)" if run.wrong else "no wrong value (#wrong 0)",
                       "#wrong 0 at every size", "a data corruption on the fabric or a broken NCCL build: "
                       "rerun, then test each rail alone" if run.wrong else "")
    return [values, bandwidth_check(run.rows, busbw_bar), latency_check(run.rows, latency_bar, run.collective)]


def report(run: Run, source: str, busbw_bar: float, latency_bar: float | None, against: str) -> tuple[str, bool]:
    """What ``sparkbook diagnose`` prints for a pasted table (the table, the plateau, the bars and
    the verdict), and whether it is below a bar or holds wrong values."""
    found = checks(run, busbw_bar, latency_bar)
    hosts = f" on {', '.join(dict.fromkeys(run.hosts))}" if run.hosts else ""
    best = plateau(run.rows)
    factor = "2(n-1)/n" if run.collective == "all_reduce" else "(n-1)/n" if run.collective in (
        "all_gather", "reduce_scatter") else "its own factor"
    lines = [f"{source}: nccl-tests {run.collective}_perf, {len(run.hosts) or '?'} rank(s){hosts}, "
             f"{len(run.rows)} sizes (each the better of out-of-place and in-place)",
             table(run.rows, "", best).to_text(),
             (f"plateau: {best['busbw_gbs']:.2f} GB/s busbw at {human_bytes(best['bytes'])}" if best else
              "plateau: none, no size of 1 MiB or more")
             + (f" (nccl-tests' average over all sizes: {run.avg_busbw_gbs:g} GB/s)" if run.avg_busbw_gbs else ""),
             f"bars: {against}. nccl-tests' busbw is algbw x {factor} for {run.collective}, scaled so that "
             "it reads the link alike for every collective: the one bus bandwidth bar applies; the "
             "latency bar is all-reduce's.",
             Verdict(f"{run.collective}_perf", found).to_text()]
    lines += [f"{c.status} {c.check}: {c.observed}\n  remedy: {c.remedy}" for c in found if c.remedy]
    return "\n".join(lines), any(c.status in (FAIL, WARN) for c in found)


def table(rows: list[dict], title: str, mark: dict | None = None) -> Table:
    """Size, time, algbw, busbw, the values' check (02's ``correct``, nccl-tests' ``#wrong``), and
    ``mark`` (the plateau row) flagged."""
    check = next((k for k in ("correct", "wrong") if rows and k in rows[0]), None)
    columns = ["size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"]
    columns += [{"correct": "correct", "wrong": "#wrong"}[check]] if check else []
    columns += ["plateau"] if mark else []
    out = Table(columns, title=title)
    for r in rows:
        cells = [human_bytes(r["bytes"]), f"{r['time_us']:.1f}", f"{r['algbw_gbs']:.3f}", f"{r['busbw_gbs']:.3f}"]
        cells += [r[check]] if check else []
        cells += ["◀ best of the top sizes" if r is mark else ""] if mark else []
        out.rows.append(cells)
    return out
