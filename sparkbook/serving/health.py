"""The serving nodes' health while the model serves: during 06's burn-in and 07's benchmark levels,
every serving node's rail error and FEC counters, its GPU's clock-event reasons and the Xid lines
of its kernel log are sampled (``scripts/link_health.sh --gpu --xid``, one SSH round trip per node
every :data:`INTERVAL_S`), and what changed from the first sample is a row of the verdict with the
time it happened, and in 07 the benchmark level it fell in.

What a change means (facts/health.py names the sources): an error counter of a rail that rises
while it carries traffic is the cable or its transceiver (the kernel's mlx5 counters
documentation); a clock-event reason that turns active holds the GPU's clocks down (power, heat:
NVIDIA's nvidia-smi documentation; the remedies are 01's); an Xid is the driver reporting a GPU
fault (NVIDIA's Xid documentation: those after which the GPU needs a reset fail). Owners see these
hours into a run ("GPUs that throttle or log Xid errors"), where no static check looks.

The samples are kept in the run folder (``health/LABEL.csv``: time, node, what, value) and the
summary in the step's outcome (plain data, so a verdict made again from the saved outcome is the same).
"""

from __future__ import annotations

import csv
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..facts import health
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..params import Params

INTERVAL_S = 5.0
SAMPLE_TIMEOUT_S = 30
FOLDER = "health"
# Clock-event reasons that a GPU at work shows by design: at full load the driver holds power at its
# limit ("SW Power Cap", nvidia-smi's documentation: "the GPU is at its power limit"), which before a
# run is a warning (01) and while serving is the GPU working
UNDER_LOAD = {"SW Power Cap"}
CABLE = ("the cable or transceiver of that rail loses traffic as it serves: reseat it at both ends, then "
         "measure it with 02_collectives.ipynb (each cable, both ways); replace the cable if the counter "
         "climbs again")


def sample_script(params: Params, node):
    return script("link_health.sh", "--gpu", "--xid", *(r.interface for r in node.rails))


def reading(text: str) -> dict[str, Any]:
    """One node's sample: ``{"errors": {interface: {counter: value}}, "reasons": {reason: mhz},
    "xid": [line, ...]}`` (errors: of the rails whose statistics were read; reasons: the slowdowns of facts/health.SLOWDOWNS that are active, with
    the graphics clock then)."""
    parsed = health.parse_link_health(text)
    errors = {i: health.link_errors(r["stats"], r.get("fec")) for i, r in parsed["rails"].items() if r.get("stats")}
    reasons = {}
    for gpu in parsed["gpus"]:
        for reason, active in gpu["reasons"].items():
            if active and reason in health.SLOWDOWNS:
                reasons[reason] = gpu["clocks"].get("Graphics")
    return {"errors": errors, "reasons": reasons, "xid": [x["line"] for x in parsed["xid"]]}


class Watch:
    """Samples the serving nodes between :meth:`start` and :meth:`stop` (or as a context manager):
    a first sample before the work starts (the baseline), one every ``interval`` s in a thread, and
    a last one at the end. A node that does not answer is noted, never fatal."""

    def __init__(self, params: Params, cluster: Cluster, label: str, interval: float = INTERVAL_S):
        self.params, self.cluster, self.label, self.interval = params, cluster, label, interval
        self.nodes = list(params.serving_nodes)
        self.rows: list[tuple[float, str, dict]] = []  # (epoch, node, reading)
        self.silent: dict[str, str] = {}
        self.t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        at = time.time()
        try:
            res = self.cluster.run(lambda n: sample_script(self.params, n), self.nodes, timeout=SAMPLE_TIMEOUT_S)
        except Exception as e:  # the watch never stops the work it watches
            self.silent.update({n.name: str(e)[:200] for n in self.nodes})
            return
        for name, r in res.items():
            if r.ok:
                self.rows.append((at, name, reading(r.stdout)))
            else:
                self.silent.setdefault(name, r.summary(2)[:200])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "Watch":
        self.t0 = time.time()
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"sparkbook-health-{self.label}")
        self._thread.start()
        return self

    def stop(self, final: bool = True) -> None:
        """Ends the sampling; ``final``: take the last sample (not after the work failed or was
        interrupted: nothing waits on the nodes then)."""
        self._stop.set()
        if self._thread:
            self._thread.join(SAMPLE_TIMEOUT_S + 15)  # a sample in flight ends by its time limit
        if final:
            self.sample()

    def __enter__(self) -> "Watch":
        return self.start()

    def __exit__(self, kind, *exc) -> None:
        self.stop(final=kind is None)

    def summary(self, windows: list[tuple[str, float, float]] | None = None) -> dict:
        """What changed, as plain data: ``events`` (each with its node, kind, what, its time in
        seconds from the start and as UTC, the status, the remedy and, given ``windows`` (label,
        start epoch, end epoch), the window it fell in), and how many samples of which nodes."""
        first: dict[str, dict] = {}
        errors_at_first: dict[tuple[str, str], dict] = {}  # each rail's first sample that read it
        events: dict[tuple, dict] = {}
        for at, node, got in sorted(self.rows, key=lambda r: r[0]):
            for interface, now in got["errors"].items():
                if (base_errors := errors_at_first.setdefault((node, interface), now)) is now:
                    continue
                for counter, rise in health.grown(base_errors, now).items():
                    ev = events.setdefault((node, "link", interface, counter), self._event(
                        at, node, "link", f"{interface} {counter}", FAIL, CABLE, windows, rise=rise))
                    ev["rise_by_end"] = rise
            if node not in first:
                first[node] = got
                continue
            base = first[node]
            for reason, mhz in got["reasons"].items():
                if reason not in base["reasons"] and reason not in UNDER_LOAD:
                    status, remedy = health.SLOWDOWNS[reason]
                    events.setdefault((node, "gpu", reason), self._event(
                        at, node, "gpu", reason, status, remedy, windows, mhz=mhz))
            for line in got["xid"]:
                if line not in base["xid"]:
                    code = int(health.XID.search(line)[2])
                    meaning, status = health.xid_meaning(code)
                    events.setdefault((node, "xid", line), self._event(
                        at, node, "xid", f"Xid {code}: {meaning}", status,
                        "read the node's kernel log around that time (`journalctl -k`); NVIDIA's Xid "
                        "documentation (docs.nvidia.com/deploy/xid-errors) names the action for the code; "
                        "where it says so, reset the GPU (a reboot of a Spark) before serving again",
                        windows, line=line))
        samples = {n.name: sum(1 for _, name, _ in self.rows if name == n.name) for n in self.nodes}
        return {"label": self.label, "interval_s": self.interval, "t0_epoch": self.t0,
                "duration_s": round(max((r[0] for r in self.rows), default=self.t0) - self.t0, 1),
                "samples": samples, "silent": dict(self.silent), "events": list(events.values())}

    def _event(self, at: float, node: str, kind: str, what: str, status: str, remedy: str,
               windows: list[tuple[str, float, float]] | None, **extra) -> dict:
        during = next((label for label, start, end in windows or [] if start <= at <= end), None)
        return {"node": node, "kind": kind, "what": what, "t_s": round(at - self.t0, 1),
                "utc": datetime.fromtimestamp(at, timezone.utc).strftime("%H:%M:%S"), "during": during,
                "status": status, "remedy": remedy, **extra}

    def save(self, run_dir: Path) -> Path:
        """Every sample as rows of (t_s, node, what, value) in ``health/LABEL.csv``."""
        path = Path(run_dir) / FOLDER / f"{self.label}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "node", "what", "value"])
            for at, node, got in sorted(self.rows, key=lambda r: r[0]):
                t = f"{at - self.t0:.1f}"
                for interface, counters in got["errors"].items():
                    w.writerows([t, node, f"{interface} {c}", v] for c, v in counters.items())
                w.writerows([t, node, f"gpu {reason}", mhz] for reason, mhz in got["reasons"].items())
                w.writerow([t, node, "xid lines", len(got["xid"])])
        return path


ROWS = {"link": "link errors while serving", "gpu": "gpu clocks while serving", "xid": "xid while serving"}


def when(ev: dict) -> str:
    return f"at {ev['t_s']:g} s ({ev['utc']} UTC)" + (f", during {ev['during']}" if ev.get("during") else "")


def checks(summary: dict | None, where: str) -> list[Check]:
    """A row per node and kind of change, with its time; one PASS row when nothing changed; a WARN
    for a node that was never sampled. ``where``: what ran meanwhile ("06's burn-in")."""
    if not summary:
        return []
    expected = "unchanged from the first sample while serving"
    found = []
    by: dict[tuple[str, str], list[dict]] = {}
    for ev in summary["events"]:
        by.setdefault((ev["kind"], ev["node"]), []).append(ev)
    for (kind, node), evs in by.items():
        status = FAIL if any(e["status"] == FAIL for e in evs) else WARN
        seen = "; ".join(_said(e) for e in evs[:4]) + (f"; and {len(evs) - 4} more" if len(evs) > 4 else "")
        name = ROWS[kind]
        found.append(Check(name, node, status, f"{seen} ({where})", expected, evs[0]["remedy"],
                           "bash sparkbook/scripts/link_health.sh --gpu --xid RAIL..."))
    never = [n for n, count in summary["samples"].items() if count == 0]
    if never:
        found.append(Check("serving health", ", ".join(never), WARN, "not sampled: " + "; ".join(
            f"{n}: {summary['silent'].get(n, 'no answer')}" for n in never), expected,
            "the node's SSH and link_health.sh: rerun the step to watch it"))
    if not by:
        sampled = {n: c for n, c in summary["samples"].items() if c}
        found.append(Check("serving health", "all", PASS if sampled else SKIP,
                           f"{sum(sampled.values())} samples of {len(sampled)} node(s) over "
                           f"{summary['duration_s']:g} s ({where}): rail error counters, GPU clock-event "
                           "reasons and Xid lines unchanged", expected))
    return found


def _said(ev: dict) -> str:
    if ev["kind"] == "link":
        return f"{ev['what']} rose {when(ev)} (+{ev['rise']} then, +{ev['rise_by_end']} by the end)"
    if ev["kind"] == "gpu":
        clock = f", graphics clock {ev['mhz']} MHz" if ev.get("mhz") else ""
        return f"{ev['what']} turned active {when(ev)}{clock}"
    return f"{ev['what']} {when(ev)}: {ev['line'][:160]}"


def watch(params: Params, cluster: Callable[[], Cluster] | Cluster, label: str, interval: float = INTERVAL_S) -> Watch:
    """A :class:`Watch` of ``params``' serving nodes (``cluster``, or a function giving it)."""
    return Watch(params, cluster() if callable(cluster) else cluster, label, interval)
