"""Where a deployment stands: the state of every numbered step in its run folder, and what runs on
its nodes now. ``sparkbook status -p FILE`` prints it; the front page (``notebooks/index.ipynb``,
:mod:`sparkbook.runbook.frontpage`) shows the same.

The run folder is the one named, else the deployment's newest under ``outputs/``
(:func:`sparkbook.record.bugreport.latest_run`: a ``sparkbook run`` folder whose summary names the
deployment, or ``interactive-<name>``, where notebooks run by hand write), else none: every step
"not run".

A step's state comes from the two records a run folder keeps of it:

* ``summary.json``, written by ``sparkbook run``: passed, failed or interrupted (a step it skipped
  is no record); it ended at the run's start plus the durations of the steps up to it (the summary
  keeps no time per step; the gaps between steps are a second or two);
* ``verdicts/NN_name.json``, written by every notebook's last cell, run by ``sparkbook run`` or by
  hand: failed when a check failed, else passed; it ended when the file was written.

The newer record decides. A verdict older than the run its summary records is another run's: its
counts are not shown beside that run's state. A notebook run by hand whose cell raised before its
verdict leaves no record, so the step shows what an earlier record says.

The run folder may be one received from elsewhere (a bug report, a colleague's): it is read as
``sparkbook report`` reads one (:mod:`sparkbook.record.folder`, every file checked against its shape,
no link followed). A summary.json that cannot be read is an error of one line (the steps' states
would be a guess); any other piece that cannot be read is left out, and the headline names it and
why, one line each. Text from the folder is shown as one line, control characters escaped.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ..book.errors import SparkbookError
from ..book.project import discover, project_root
from ..book.tables import Table
from ..book.verdict import COLOURS, FAIL, PASS, SKIP, WARN, Verdict, is_node
from ..params import Params
from ..serving.inspection import CACHE as INSPECTION
from .bugreport import latest_run
from .fingerprint import FILE as FINGERPRINT
from .folder import RunFolder, Unreadable, one_line, read

PASSED, FAILED, INTERRUPTED, NOT_RUN = "passed", "failed", "interrupted", "not run"
STATE_COLOURS = {PASSED: COLOURS[PASS], FAILED: COLOURS[FAIL], INTERRUPTED: COLOURS[WARN], NOT_RUN: COLOURS[SKIP]}
# a verdict written this long after the end its run's summary gives the step is a later run's (by
# hand, into the same folder); the summary's ends are approximate by the gaps between steps
LATER_S = 60
FIRST_FAILURES = 3  # failures shown per step
NODE_TIMEOUT_S = 30  # one round trip per node; an unreachable node fails at its SSH connect timeout
# the runtime's versions where no fingerprint was taken: (image_inspection.json's key, shown as)
INSPECTED = (("vllm", "vLLM"), ("torch", "torch"), ("ray", "Ray"), ("transformers", "transformers"))


@dataclass
class StepState:
    """One numbered notebook's state in a run folder."""

    name: str                       # NN_name, the notebook's stem
    state: str = NOT_RUN            # passed, failed, interrupted or not run
    when: datetime | None = None    # when its record ended (UTC)
    verdict: Verdict | None = None  # its verdict, when it belongs to the state shown
    error: str = ""                 # sparkbook run's error, for a failed step

    @property
    def notebook(self) -> str:
        return f"{self.name}.ipynb"

    @property
    def counts(self) -> dict[str, int]:
        return self.verdict.counts() if self.verdict else {}

    def failures(self, limit: int = FIRST_FAILURES) -> list[str]:
        """The first failed checks (``check on node: observed``), else the first line of the run's
        error."""
        found = [one_line(f"{c.check}{f' on {c.node}' if is_node(c.node) else ''}: {c.observed or 'failed'}")
                 for c in (self.verdict.failures if self.verdict else [])]
        if not found and self.error.strip():
            found = [one_line(self.error.strip().split("\n")[0])]
        return found[:limit] + ([f"and {len(found) - limit} more"] if len(found) > limit else [])


@dataclass
class Picture:
    """A deployment in its run folder: every numbered step's state, and the runtime's versions."""

    params: Params
    source: Path
    run_dir: Path | None
    steps: list[StepState] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    versions: str = ""
    foreign: str = ""  # the deployment a summary in the run folder belongs to, when not this one
    unreadable: dict[str, str] = field(default_factory=dict)  # a piece of the run folder -> why, left out

    def headline(self) -> str:
        p = self.params
        nodes = ", ".join(f"{n.name} ({n.role})" for n in p.nodes)
        lines = [f"deployment {p.name}: {len(p.nodes)} node(s): {nodes}", f"parameters: {self.source}"]
        if self.run_dir is None:
            lines.append("run folder: none yet (every step not run)")
        else:
            s = self.summary
            run = (f" (sparkbook run {one_line(s.get('status') or '?')}, started {one_line(s.get('started') or '?')})"
                   if s else " (notebooks run by hand)" if any(st.state != NOT_RUN for st in self.steps)
                   else " (nothing recorded yet)")
            lines.append(f"run folder: {one_line(str(self.run_dir), 1000)}{run}")
            if self.foreign:
                lines.append(f"(its summary.json is of deployment {one_line(self.foreign)!r}, not this one's: not read)")
            lines += [f"unreadable, left out: {name}: {why}" for name, why in self.unreadable.items()]
        if self.versions:
            lines.append(f"versions: {self.versions}")
        return "\n".join(lines)

    def table(self) -> Table:
        rows = [[s.name, s.state, when(s.when), *(s.counts.get(k, "") for k in ("PASS", "WARN", "FAIL", "SKIP")),
                 "; ".join(s.failures())] for s in self.steps]
        return Table(["step", "state", "when", "pass", "warn", "fail", "skip", "first failures"], rows,
                     title="steps", colour=lambda col, v: STATE_COLOURS.get(v) if col == "state" else None,
                     max_width=90)

    def to_text(self) -> str:
        return f"{self.headline()}\n\n{self.table().to_text()}"

    def next_step(self) -> str | None:
        """The first step that has not passed: where "the rest" starts."""
        return next((s.name for s in self.steps if s.state != PASSED), None)


def when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC") if t else ""


def run_folder(params: Params, run_dir: str | Path | None = None, root: Path | None = None) -> Path | None:
    """``run_dir`` when given, else the deployment's newest run folder under ``outputs/``, else None."""
    if run_dir:
        return Path(run_dir).expanduser().resolve()
    try:
        return latest_run(params.name, root)
    except SparkbookError:  # none yet
        return None


def _parse_time(text: object) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _written(path: Path) -> datetime | None:
    """When the file ``path`` (read already, no link on its way) was written; None when it is gone."""
    try:
        return datetime.fromtimestamp(path.lstat().st_mtime, timezone.utc)
    except (OSError, ValueError, OverflowError):
        return None


def summary_ends(summary: dict) -> dict[str, tuple[str, datetime | None, str]]:
    """Each step that ``sparkbook run`` ran: (status, when it ended, error); see the module."""
    t, out = _parse_time(summary.get("started")), {}
    for s in summary.get("steps", []):
        try:
            t = t + timedelta(seconds=float(s.get("duration_s") or 0)) if t is not None else None
        except OverflowError:  # past the year 9999: a received summary's
            t = None
        if s.get("status") in (PASSED, FAILED, INTERRUPTED):
            out[s["name"]] = (s["status"], t, s.get("error") or "")
    return out


def step_state(name: str, summary: dict, verdict: Verdict | None = None, written: datetime | None = None) -> StepState:
    """The state of the step ``name`` from the run's ``summary`` and its ``verdict`` (written at
    ``written``), see the module for which record decides."""
    st = StepState(name)
    if written is None:
        verdict = None
    ran = summary_ends(summary).get(name)
    started = _parse_time(summary.get("started"))
    if ran and not (written and ran[1] and (written - ran[1]).total_seconds() > LATER_S):
        st.state, st.when, st.error = ran
        if verdict is not None and started is not None and written >= started:
            st.verdict = verdict  # this run's verdict
    elif verdict is not None:
        st.state, st.when, st.verdict = FAILED if verdict.failures else PASSED, written, verdict
    return st


def versions(folder: RunFolder | None) -> str:
    """The serving image and the runtime's versions the run folder recorded: its fingerprint's,
    else 05's image inspection's; "" when it has neither (or they cannot be read)."""
    if folder is None:
        return ""
    fp = folder.fingerprint()
    if fp and fp.versions:
        rows = dict(fp.rows())
        return one_line(f"{rows['versions']} (image {rows['image']}; {FINGERPRINT} of {fp.created[:16]})")
    info = folder.read(INSPECTION) or {}
    found = " · ".join(f"{shown} {info[k]}" for k, shown in INSPECTED if info.get(k))
    return one_line(f"{found} (image {info.get('image')}; {INSPECTION})") if found else ""


def read_summary(run_dir: Path | None) -> dict:
    """The run folder's summary.json, checked; {} when there is none. SparkbookError, one line,
    when it cannot be read (as ``sparkbook report`` says it)."""
    try:
        return (read(run_dir, "summary.json") if run_dir else None) or {}
    except Unreadable as e:
        raise SparkbookError(f"{run_dir}: not a run folder that can be read: {e}") from None


def picture(params: Params, source: str | Path, run_dir: str | Path | None = None,
            notebooks_dir: Path | None = None, root: Path | None = None) -> Picture:
    """The deployment of ``params`` (read from ``source``) in its run folder (``run_dir``, else
    the newest; ``root``: the project folder whose ``outputs/`` holds them)."""
    path = run_folder(params, run_dir, root)
    ran = read_summary(path)
    foreign = ran.get("deployment") if ran.get("deployment") not in (None, params.name) else ""
    if foreign:  # a run folder given by hand ($SPARKBOOK_RUN_DIR) that another deployment ran in
        ran = {}
    folder = RunFolder(path) if path else None
    found = dict(folder.verdicts()) if folder else {}
    names = [nb.stem for nb in discover(notebooks_dir or (root or project_root()) / "notebooks")]
    steps = [step_state(n, ran, found.get(n), _written(path / "verdicts" / f"{n}.json") if n in found else None)
             for n in names]
    shown = versions(folder)  # before what is unreadable is taken: it reads two more pieces
    return Picture(params, Path(source), path, steps, ran, shown, str(foreign or ""),
                   dict(folder.unreadable) if folder else {})


# ------------------------------------------------------------------------------ the nodes now

def nodes_now(params: Params, timeout: float = NODE_TIMEOUT_S) -> tuple[Table, str]:
    """What runs on the nodes now: each node's sparkbook containers (label ``sparkbook=<name>``,
    as 08 finds them), all nodes asked at once, an unreachable one a row that says so; and the
    endpoint's health (``/health``, ``/v1/models`` with the API key, which is never shown)."""
    from ..notebook import open_cluster
    from ..serving.deploy import healthy
    from ..serving.state import NodeState, node_states

    with ThreadPoolExecutor(1) as pool:
        health = pool.submit(healthy, params)
        try:
            cluster = open_cluster(params)
        except SparkbookError as e:  # the lab's parameters while the lab is down
            states = {n.name: NodeState(error=str(e)) for n in params.nodes}
        else:
            cluster.ssh = cluster.ssh.model_copy(update={"command_timeout": timeout})
            states = node_states(params, cluster)
        h = health.result()
        ready, models, seen = h.ready, h.models, h.seen
    rows = []
    for n in params.nodes:
        st = states.get(n.name) or NodeState(error="no answer")
        if st.error:
            rows.append([n.name, n.role, "no", (st.error.strip().splitlines() or ["?"])[0]])
            continue
        running = ", ".join(f"{name} ({state})" for name, (state, _) in sorted(st.containers.items()))
        rows.append([n.name, n.role, "yes", running or "none"])
    table = Table(["node", "role", "reachable", f"containers (label sparkbook={params.name}), or why not"], rows,
                  title="on the nodes now", max_width=90)
    api = f"ready, serving {', '.join(models)}" if ready else seen
    return table, f"endpoint {params.endpoint}: {api}"


def report(params: Params, source: str | Path, run_dir: str | Path | None = None, nodes: bool = True) -> str:
    """``sparkbook status``: the picture, then (``nodes``) what runs on the nodes now."""
    text = picture(params, source, run_dir).to_text()
    if nodes:
        table, endpoint = nodes_now(params)
        text += f"\n\n{table.to_text()}\n{endpoint}"
    return text
