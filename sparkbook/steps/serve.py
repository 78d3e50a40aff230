"""05_serve: vLLM across the nodes, ready at the OpenAI-compatible endpoint with the expected
model; otherwise the cause per node, from its logs. The image checks come first, as a gate
(:func:`sparkbook.serving.image_checks`); then, before anything launches, the memory fit of every
serving node (:mod:`sparkbook.facts.memfit`, after dropping the page cache where
``serving.drop_page_cache`` asks): DOES NOT FIT ends the step there, with the numbers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..book.tables import Table
from ..book.verdict import FAIL, PASS, WARN, Check
from ..facts import memfit
from ..nodes.shell import command_line
from ..params import Params
from ..serving import listeners
from ..serving import vllm as engine
from ..serving.commands import api_bind, api_key, beyond_loopback
from ..serving.deploy import Deployment, serve, vllm_running
from ..serving.inspection import CACHE
from ..serving.plan import plan
from ..serving.ran import differences, reader
from ..serving.state import node_states

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "05_serve"
TITLE = "05 vLLM serving"


def run(ctx: Context) -> Deployment:
    """Gate on the memory fit (:func:`sparkbook.facts.memfit.gate`, as the image's vLLM, inspected above,
    checks memory at start), then start vLLM (or keep it, when it is healthy and unchanged) and
    wait until it answers. Nodes whose state cannot be read are left to :func:`serve`, which names
    them."""
    p, cluster = ctx.params, ctx.cluster
    states = node_states(p, cluster)
    if not any(s.error for s in states.values()) and (memory := memfit.gate(
            p, cluster, vllm_running(p, cluster, states), memfit.inspected_vllm(ctx.run_dir / CACHE))):
        ctx.gate(memory, key="memory")
    return serve(p, cluster, ctx.run_dir, states=states)


def table(outcome: Deployment) -> Table:
    d = outcome
    rows = [["action", d.action], ["executor", d.executor], ["ready", "yes" if d.ready else "no"],
            ["served models", ", ".join(d.models) or "none"], ["seconds", f"{d.seconds:.0f}"],
            ["last seen", d.seen]]
    rows += [[f"container on {node}", how] for node, how in d.stopped.items()]
    rows += [[f"vLLM Ray workers on {node}", k] for node, k in d.ray_workers.items()]
    rows += [[f"start-up phase on {node}", phase or "not begun"] for node, phase in d.phases.items()
             if not d.ready]
    rows += [[f"since the launch: {who}", ", ".join(f"{mark} {s:.0f} s" for mark, s in marks.items())]
             for who, marks in d.timeline.items() if marks]
    return Table(["", "value"], rows, title="vLLM serving")


def listeners_table(params: Params, outcome: Deployment) -> Table:
    """Every address the serving containers listen on, node by node."""
    return listeners.table(params, outcome.listeners)


def key_check(params: Params) -> list[Check]:
    """A WARN when the API answers beyond loopback and requires no key."""
    bind = api_bind(params)
    if api_key(params) or not beyond_loopback(bind):
        return []
    return [Check("API key", params.head.name, WARN, f"vLLM's API listens on {bind} and requires no key",
                  "a key where the API is reachable beyond loopback",
                  "anyone who reaches the address can use the model: put a key in an environment "
                  "variable of this machine and name it in serving.api_key_env, or set serving.bind "
                  "to 127.0.0.1 and reach the API through an SSH tunnel")]


def ray_worker_checks(params: Params, dep: Deployment) -> list[Check]:
    """With the Ray executor: vLLM's workers are Ray actors, tensor × pipeline parallel of them, on
    the serving nodes (a vLLM that silently fell back to another executor has none)."""
    if params.serving.executor != "ray":
        return []
    head, want = params.head.name, params.serving.tensor_parallel_size * params.serving.pipeline_parallel_size
    list_actors = command_line(["docker", "exec", plan(params).ray_container, "ray", "list", "actors"])
    if dep.ray_workers_error:
        return [Check("vLLM's Ray workers", head, WARN, f"Ray's actors could not be listed: "
                      f"{dep.ray_workers_error}", f"{want} worker actor(s)",
                      "the image's Ray lacks its state API (ray[default]); `ray list actors` in the "
                      "head's Ray container shows them", list_actors)]
    got = sum(dep.ray_workers.values())
    where = ", ".join(f"{n}: {k}" for n, k in dep.ray_workers.items())
    return [Check("vLLM's Ray workers", head, PASS if got == want else FAIL, f"{got} ({where})",
                  f"{want} worker actor(s) (tensor × pipeline parallel)",
                  "" if got == want else "vLLM did not start its workers through Ray: read "
                  "logs/<node>/vllm-serve.log for the executor it chose",
                  list_actors)]


def ran_checks(params: Params, dep: Deployment) -> list[Check]:
    """What vLLM says it was started with (its start-up log) against what sparkbook asked, on
    each node that runs vllm serve: an argument it lists that was not asked, or with another value,
    fails before 06 verifies and 07 measures a configuration nobody chose."""
    out = []
    for node, ran in dep.ran.items():
        where = str(reader(params, params.node(node)))
        if ran.get("args") is None:
            if node == params.head.name:  # a headless worker's vLLM may log none
                out.append(Check("configuration that ran", node, WARN, ran.get("error") or
                                 "vLLM's log has no 'non-default args' line", "vLLM's own record of its arguments",
                                 "what ran is not verified: an older vLLM, or its log level set above INFO",
                                 where))
            continue
        diffs, defaulted = differences(plan(params).nodes[node].serve_args, ran)
        version = f"vLLM {ran['version']}: " if ran.get("version") else ""
        if diffs:
            seen = "; ".join(f"{d.name}={d.ran!r}, not asked" if d.asked is None else
                             f"{d.name}: asked {d.asked}, ran {d.ran!r}" for d in diffs)
            out.append(Check("configuration that ran", node, FAIL, version + seen,
                             "vllm serve's arguments as sparkbook asked them",
                             "the image's entrypoint, a wrapper in place of vllm or a config file in the image "
                             "changed them: put a wanted setting in serving.extra_args (then it is asked and "
                             "recorded), else use an image that leaves vllm serve's arguments alone", where))
            continue
        at_default = f"; at vLLM's default: {', '.join(defaulted)}" if defaulted else ""
        out.append(Check("configuration that ran", node, PASS,
                         f"{version}{len(ran['args'])} non-default arguments, as asked{at_default}",
                         "vllm serve's arguments as sparkbook asked them", "", where))
    return out


def checks(params: Params, outcome: Deployment) -> list[Check]:
    """The deployment answers with the expected model; otherwise what stopped it, per node."""
    dep, head, container = outcome, params.head.name, plan(params).serving_container
    if dep.conflicts:
        return list(dep.conflicts)
    if dep.ready:
        want = params.served_model
        return [Check("endpoint ready", head, PASS, f"{params.endpoint}: {', '.join(dep.models)} "
                      f"({dep.action}, {dep.seconds:.0f} s)", f"{engine.HEALTH} and /v1/models answer"),
                Check("served model", head, PASS if want in dep.models else FAIL, ", ".join(dep.models), want,
                      "" if want in dep.models else "check serving.served_model_name"),
                *ran_checks(params, dep), *ray_worker_checks(params, dep), *key_check(params),
                *listeners.checks(params, dep.listeners), *listeners.secret_checks(params, dep.secrets)]
    if dep.key_refused:
        return [Check("API key", head, FAIL, dep.seen, "/v1/models answers with the key of serving.api_key_env",
                      f"vLLM reads its key from {engine.API_KEY}: the variable serving.api_key_env names must "
                      "hold the same key, and nothing else may set one (an image's environment)")]
    out = []
    for node, how in dep.stopped.items():
        killed = "137" in how or "143" in how or "OOM" in how
        out.append(Check("serving container", node, FAIL, f"{container} {how}", "running",
                         f"read its log (logs/{node}/ in the run folder)" + (
                             ": it was killed (`docker kill`, or the kernel's OOM killer: lower "
                             "serving.gpu_memory_utilization)" if killed else ""),
                         f"docker logs {container}"))
    if dep.stall:
        st = dep.stall
        out.append(Check("startup progress", st.node, FAIL,
                         st.summary + (f" (last line: {st.last_line[-160:]})" if st.last_line else ""),
                         f"progress within serving.stall_timeout ({params.serving.stall_timeout:.0f} s)",
                         st.cause, f"logs: {dep.logs.get(st.node, 'logs/' + st.node)}"))
    for d in dep.diagnosis:
        out.append(Check("startup", d.node, FAIL, f"{d.cause}: {d.evidence}", "vLLM ready", d.remedy,
                         f"logs: {d.logs}"))
    if not (dep.diagnosis or dep.stopped or dep.stall):
        out.append(Check("startup", head, FAIL, f"{dep.seen}; no known failure in the logs", "vLLM ready",
                         "read the logs in the run folder (logs/<node>/); raise serving.startup_timeout if "
                         "the model was still loading", f"logs: {', '.join(dep.logs.values())}"))
    return out
