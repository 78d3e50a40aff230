"""08_teardown: every container of this deployment off every node, their logs kept in the run
folder first; then none left and nothing listening on the configured ports. Another deployment's
containers (another ``name``) are not touched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..book.tables import Table
from ..book.verdict import FAIL, PASS, Check
from ..params import Params
from ..serving.containers import deployment_label
from ..serving.teardown import Teardown, teardown

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "08_teardown"
TITLE = "08 teardown"


def run(ctx: Context) -> Teardown:
    """Save the logs, remove every container of this deployment, and see what is left."""
    return teardown(ctx.params, ctx.cluster, ctx.run_dir)


def table(outcome: Teardown) -> Table:
    t = outcome
    nodes = sorted(set(t.removed) | set(t.remaining) | set(t.listeners) | set(t.errors))
    rows = [[n, ", ".join(t.removed.get(n, [])) or "nothing", ", ".join(t.remaining.get(n, [])) or "none",
             "; ".join(t.listeners.get(n, [])) or "none"] for n in nodes]
    return Table(["node", "removed", "containers left", "listeners left"], rows, title="teardown")


def checks(params: Params, outcome: Teardown) -> list[Check]:
    """Per node: reachable, no sparkbook container left, the configured ports released."""
    t, out = outcome, []
    for n in params.nodes:
        if n.name in t.errors:
            out.append(Check("reachable", n.name, FAIL, t.errors[n.name], "",
                             "check the node (01_preflight.ipynb)"))
            continue
        left, removed = t.remaining.get(n.name), t.removed.get(n.name)
        out.append(Check("containers removed", n.name, FAIL if left else PASS,
                         ", ".join(left) if left else
                         f"removed {', '.join(removed)}" if removed else "none were running",
                         "no container of this deployment", f"docker rm -f {' '.join(left)}" if left else "",
                         f"docker ps -a --filter label={deployment_label(params)}"))
        held = t.listeners.get(n.name)
        out.append(Check("ports released", n.name, FAIL if held else PASS,
                         "; ".join(held) if held else "no listener on the configured ports",
                         "nothing listening", "stop the process shown (`ss -ltnp`)" if held else "",
                         "ss -ltnp"))
    return out
