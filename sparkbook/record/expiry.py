"""Verdicts that expire: a step that builds on an earlier step's findings first checks they still hold.

Every verdict records when it was taken, until when it holds (``expectations.verdicts_hold_h``
from then) and the boot ID of each node it read (the kernel's ``random/boot_id``, new at every
boot). 05 and 07 build on 01's preflight: the GPUs, links, addresses, memory and stray processes
it checked are what a reboot changes, and a preflight taken before the last reboot says nothing
about them. So both gate on :func:`preflight_holds`: 01's verdict of this run, else the newest of
the deployment's run folders beside it (``outputs/``), not expired, every node still in the boot
01 saw (one short SSH round trip, all nodes at once).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..book.verdict import FAIL, PASS, WARN, Check, Verdict, run_step
from ..nodes.remote import Cluster
from ..params import Params
from . import folder
from .bugreport import runs

if TYPE_CHECKING:
    from ..notebook import Context

PREFLIGHT = "01_preflight"
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
TIMEOUT_S = 20


def when(text: str) -> datetime | None:
    """An ISO 8601 time (UTC when it names no zone); None when it is not one."""
    try:
        t = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def age(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``, ``2.1 d``."""
    s = max(seconds, 0)
    return (f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else
            f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} d")


def taken_text(v: Verdict, now: datetime) -> str:
    """When ``v`` was taken and how long ago, for tables: ``2026-12-05 09:30 UTC (12 min ago)``."""
    t = when(v.taken)
    return f"{t:%Y-%m-%d %H:%M UTC} ({age((now - t).total_seconds())} ago)" if t else "not recorded"


def newest(params: Params, run_dir: Path, step: str = PREFLIGHT) -> tuple[Path, Verdict] | None:
    """The verdict of ``step`` a step in ``run_dir`` builds on: this run's own, else the most
    recently taken among the deployment's run folders beside it; None when there is none. A
    verdict that cannot be read counts as none."""
    def read(d: Path) -> Verdict | None:
        try:
            return folder.verdict(d, step)
        except folder.Unreadable:
            return None

    own = read(run_dir)
    if own is not None:
        return run_dir, own
    found = [(d, v) for d in runs(run_dir.parent, params.name) if d != run_dir and (v := read(d))]
    dated = [(t, d, v) for d, v in found if (t := when(v.taken))]
    if dated:
        _, d, v = max(dated, key=lambda x: x[0])
        return d, v
    return found[0] if found else None


def holds(params: Params, cluster: Callable[[], Cluster], run_dir: Path, step: str = PREFLIGHT,
          now: datetime | None = None) -> list[Check]:
    """Whether ``step``'s verdict (see :func:`newest`) still holds: its rows for a gate. The nodes
    (``cluster()``) are asked only when that verdict read their boot IDs."""
    now = now or datetime.now(timezone.utc)
    rerun = run_step(step)
    found = newest(params, Path(run_dir), step)
    if found is None:
        return [Check(f"{step} holds", "all", WARN, f"no verdict of {step} for this deployment, in this "
                      "run folder or beside it: what this step builds on was never checked",
                      f"{step} passed since the nodes last booted", rerun)]
    where, v = found
    until = when(v.holds_until)
    if until is None:
        status, note = WARN, "until when it holds was not recorded (an older sparkbook)"
    elif now > until:
        status, note = FAIL, f"it held until {until:%Y-%m-%d %H:%M UTC}"
    else:
        status, note = (WARN, "it failed") if v.failures else (PASS, f"holds until {until:%Y-%m-%d %H:%M UTC}")
    elsewhere = "" if where == Path(run_dir) else f" (in {where.name})"
    rows = [Check(f"{step} holds", "all", status, f"{v.status}, taken {taken_text(v, now)}{elsewhere}: {note}",
                  f"passed within expectations.verdicts_hold_h ({params.expectations.verdicts_hold_h:g} h)",
                  rerun)]
    expected = f"the boot {step} saw"
    asked = [n for n in params.nodes if n.name in v.boots]
    now_ids = cluster().run(BOOT_ID, asked, timeout=TIMEOUT_S) if asked else {}
    for node in params.nodes:
        then, r = v.boots.get(node.name), now_ids.get(node.name)
        if then is None:
            rows.append(Check("booted since", node.name, WARN, f"{step} did not read this node's boot ID",
                              expected, rerun))
        elif r is None or not r.ok:
            rows.append(Check("booted since", node.name, WARN, f"its boot ID could not be read: "
                              f"{(r.error or r.stderr.strip()) if r else 'not asked'}", expected, rerun, BOOT_ID))
        elif (current := r.stdout.strip()) != then:
            rows.append(Check("booted since", node.name, FAIL, f"booted again since {step} (boot ID {then[:8]} "
                              f"then, {current[:8]} now): what it checked (GPUs, links, addresses, memory, "
                              "stray processes) may have changed", expected, rerun, BOOT_ID))
        else:
            rows.append(Check("booted since", node.name, PASS, f"the same boot ({then[:8]})", expected,
                              command=BOOT_ID))
    return rows


def preflight_holds(ctx: Context) -> list[Check]:
    """:func:`holds` for a notebook's gate: 05 and 07 build on 01's preflight."""
    return holds(ctx.params, lambda: ctx.cluster, ctx.run_dir)
