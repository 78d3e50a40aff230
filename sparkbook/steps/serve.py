"""05_serve: vLLM across the nodes, ready at the OpenAI-compatible endpoint with the expected
model; otherwise the cause per node, from its logs. The image checks come first, as a gate
(:func:`sparkbook.serving.image_checks`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..params import Params
from ..serving.commands import serving_container
from ..serving.deploy import Deployment, serve
from ..tables import Table
from ..verdict import FAIL, PASS, Check

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "05_serve"
TITLE = "05 vLLM serving"


def run(ctx: Context) -> Deployment:
    """Start vLLM (or keep it, when it is healthy and unchanged) and wait until it answers."""
    return serve(ctx.params, ctx.cluster, ctx.run_dir)


def table(outcome: Deployment) -> Table:
    d = outcome
    rows = [["action", d.action], ["ready", "yes" if d.ready else "no"],
            ["served models", ", ".join(d.models) or "none"], ["seconds", f"{d.seconds:.0f}"],
            ["last seen", d.seen]]
    rows += [[f"container on {node}", how] for node, how in d.stopped.items()]
    return Table(["", "value"], rows, title="vLLM serving")


def checks(params: Params, outcome: Deployment) -> list[Check]:
    """The deployment answers with the expected model; otherwise what stopped it, per node."""
    dep, head, container = outcome, params.head.name, serving_container(params)
    if dep.conflicts:
        return list(dep.conflicts)
    if dep.ready:
        want = params.served_model
        return [Check("endpoint ready", head, PASS, f"{params.endpoint}: {', '.join(dep.models)} "
                      f"({dep.action}, {dep.seconds:.0f} s)", "/health and /v1/models answer"),
                Check("served model", head, PASS if want in dep.models else FAIL, ", ".join(dep.models), want,
                      "" if want in dep.models else "check serving.served_model_name")]
    out = []
    for node, how in dep.stopped.items():
        killed = "137" in how or "143" in how or "OOM" in how
        out.append(Check("serving container", node, FAIL, f"{container} {how}", "running",
                         f"read its log (logs/{node}/ in the run folder)" + (
                             ": it was killed (`docker kill`, or the kernel's OOM killer: lower "
                             "serving.gpu_memory_utilization)" if killed else ""),
                         f"docker logs {container}"))
    for d in dep.diagnosis:
        out.append(Check("startup", d.node, FAIL, f"{d.cause}: {d.evidence}", "vLLM ready", d.remedy,
                         f"logs: {d.logs}"))
    if not (dep.diagnosis or dep.stopped):
        out.append(Check("startup", head, FAIL, f"{dep.seen}; no known failure in the logs", "vLLM ready",
                         "read the logs in the run folder (logs/<node>/); raise serving.startup_timeout if "
                         "the model was still loading", f"logs: {', '.join(dep.logs.values())}"))
    return out
