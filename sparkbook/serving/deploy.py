"""vLLM across the nodes (05): keep it when it is healthy and unchanged, otherwise replace what
runs, start it, wait for the API, and diagnose from every node's logs when it does not come up.

Every container carries the ``sparkbook`` label and a fingerprint of what it was started with (vllm
serve in the Ray container carries its own in its environment), so running 05 again on a healthy,
unchanged deployment changes nothing.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

from ..book.errors import CheckFailed
from ..book.progress import Progress
from ..book.step import Outcome
from ..book.verdict import Check
from ..nodes import workdir
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..params import Params
from .commands import SERVE_FP, api_key, secrets
from .containers import secrets_file
from .listeners import Listener, read_listeners
from .logs import Diagnosis, collect_logs, diagnose
from .plan import plan
from .ran import what_ran
from .ray import ray_nodes
from . import stacks
from .startup import ORDER, Stall, StallWatch, read_progress
from .state import NodeState, node_states, port_conflicts, refuse_over_service, remove, require_image, start
from .vllm import ENGINE_PATTERN, HEALTH, SERVE_PATTERN


@dataclass
class Deployment(Outcome):
    """What 05 found and did."""
    FILE = "serving.json"

    action: str = ""                     # "kept", "started", "restarted"
    fingerprints: dict[str, str] = field(default_factory=dict)
    ready: bool = False
    seen: str = ""                       # the last thing the wait saw
    stopped: dict[str, str] = field(default_factory=dict)  # node -> how its container ended
    seconds: float = 0.0
    cleanup_seconds: float = 0.0         # not ready: saving every node's logs and stopping what started
    models: list[str] = field(default_factory=list)
    diagnosis: list[Diagnosis] = field(default_factory=list)
    conflicts: list[Check] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)   # node -> folder of its logs
    executor: str = ""                   # serving.executor
    phases: dict[str, str] = field(default_factory=dict)  # node -> the start-up phase its log reached
    stall: Stall | None = None           # set when the start-up stopped making progress
    ray_workers: dict[str, int] = field(default_factory=dict)  # ray: vLLM's worker actors per node
    ray_workers_error: str | None = None  # ray: why the actors could not be listed
    listeners: dict[str, list[Listener]] = field(default_factory=dict)  # what the containers listen on
    key_refused: bool = False            # vLLM answered, but refused the request for its key (401)
    secrets: dict[str, list[str]] = field(default_factory=dict)  # secret variables the containers hold (names)
    ran: dict[str, dict] = field(default_factory=dict)  # node -> what vLLM logged it ran with (what_ran)
    # seconds from vllm serve's launch (this machine's clock) to each start-up phase a node's log
    # reached first (node -> phase -> s), and to the API's milestones ("api": port open, ready, first
    # token of a real request); empty when nothing was started (a deployment kept)
    timeline: dict[str, dict[str, float]] = field(default_factory=dict)

    def key_numbers(self) -> list[tuple[str, str]]:
        took = f"ready in {self.seconds:.0f} s" if self.ready else f"not ready after {self.seconds:.0f} s"
        api = self.timeline.get("api", {})
        return [("vLLM start-up", f"{took} ({self.action})")] + (
            [("start-up timeline", ", ".join(f"{k} {v:.0f} s" for k, v in api.items()))] if api else [])


def serve(params: Params, cluster: Cluster, run_dir: Path, say: Callable[[str], object] = print,
          states: dict[str, NodeState] | None = None) -> Deployment:
    """Bring vLLM up across the nodes (or keep it, when it is healthy and unchanged), wait for it,
    and diagnose when it does not come up. Never leaves a half-started deployment running.
    ``states``: :func:`node_states` just read (05's gate reads them first), else read here."""
    t0 = time.monotonic()
    require_key(params)
    dep = Deployment(fingerprints=plan(params).serve_fingerprints(), executor=params.serving.executor)
    states = states or node_states(params, cluster)
    bad = [f"{n}: {s.error}" for n, s in states.items() if s.error]
    if bad:
        raise CheckFailed("cannot read the nodes' containers: " + "; ".join(bad))
    running, same = what_runs(params, cluster, states, dep.fingerprints)
    if same and running:
        health = healthy(params)
        if health.ready:
            dep.action, dep.ready, dep.models, dep.seen = "kept", True, health.models, "healthy, unchanged"
            record_ray_workers(params, cluster, dep)
            dep.listeners, dep.secrets = read_listeners(params, cluster)
            dep.ran = what_ran(params, cluster)
            dep.seconds = time.monotonic() - t0
            say(f"vLLM is already serving {', '.join(health.models)} and matches the parameters: nothing changed")
            return dep
    require_image(params, states)  # before a running deployment is replaced
    dep.action = "restarted" if running else "started"
    if running:
        refuse_over_service(params, cluster, "05")
        say("replacing the running deployment (parameters changed or it is not healthy); its logs go "
            "to the run folder first")
        collect_logs(params, cluster, run_dir, [plan(params).serving_container], tag="previous")
        remove_serving(params, cluster)
        states = node_states(params, cluster)
    dep.conflicts = port_conflicts(params, states)
    if dep.conflicts:
        return dep
    try:
        launched = time.monotonic()
        start_serving(params, cluster, states, say)
        wait_ready(params, cluster, dep, params.serving.startup_timeout, launched)
        if dep.ready and first_token(params, dep.models[0]):
            dep.timeline.setdefault("api", {})["first token"] = round(time.monotonic() - launched, 1)
    finally:
        if not dep.ready:
            t1 = time.monotonic()
            if dep.stall:  # before anything is stopped: where its workers are
                dep.stall.where = stacks.where(params, cluster, dep.stall.node, run_dir)
                dep.seen = dep.stall.summary
            dep.diagnosis = diagnose(params, cluster, run_dir)
            dep.logs = {n.name: str(run_dir / "logs" / n.name) for n in params.nodes}
            say("not ready: logs of every node saved; stopping what was started")
            remove_serving(params, cluster, grace=10)  # a hung rank would hold a graceful stop
            dep.cleanup_seconds = time.monotonic() - t1
    record_ray_workers(params, cluster, dep)
    if dep.ready:
        dep.listeners, dep.secrets = read_listeners(params, cluster)
        dep.ran = what_ran(params, cluster)
    dep.seconds = time.monotonic() - t0
    return dep


def require_key(params: Params) -> None:
    """The variable ``serving.api_key_env`` names holds a key (validation refuses ``--api-key`` in
    ``serving.extra_args``: the key comes from there and nowhere else). Raises
    :class:`~sparkbook.book.errors.CheckFailed` before anything starts."""
    name = params.serving.api_key_env
    if name and not api_key(params):
        raise CheckFailed(f"serving.api_key_env names {name}, which is not set (or empty) on this "
                          "machine: export it before starting vLLM, or remove serving.api_key_env")


def record_ray_workers(params: Params, cluster: Cluster, dep: Deployment) -> None:
    """With the Ray executor and vLLM up: where vLLM's Ray workers run, as Ray lists its actors (the
    proof that the Ray executor serves across the nodes, not a silent fallback)."""
    if params.serving.executor != "ray" or not dep.ready:
        return
    rc = ray_nodes(params, cluster, actors=True)
    dep.ray_workers, dep.ray_workers_error = rc.workers, rc.workers_error


def what_runs(params: Params, cluster: Cluster, states: dict[str, NodeState],
              fingerprints: dict[str, str]) -> tuple[bool, bool]:
    """(whether vLLM is serving now, whether it was started from these parameters): vllm serve in
    the head's Ray container, or the mp containers."""
    if params.serving.executor == "ray":
        now = serving_fingerprint(params, cluster)
        return now is not None, now == fingerprints[params.head.name]
    name = plan(params).serving_container
    on = {n for n, s in states.items() if name in s.containers}
    return bool(on), on == set(fingerprints) and all(states[n].current(name, fp) for n, fp in fingerprints.items())


def vllm_running(params: Params, cluster: Cluster, states: dict[str, NodeState]) -> bool:
    """Whether vLLM runs now, holding its memory: vllm serve in the head's Ray container, or a
    serving container that runs (unlike :func:`what_runs`, an exited one, such as a vLLM the OOM
    killer ended, does not count: it holds no memory)."""
    if params.serving.executor == "ray":
        return serving_fingerprint(params, cluster) is not None
    name = plan(params).serving_container
    return any(states[n.name].running(name) for n in params.serving_nodes if n.name in states)


def ray_running(params: Params, states: dict[str, NodeState]) -> bool:
    """Whether 04's Ray container runs on every serving node."""
    name = plan(params).ray_container
    return all(n.name in states and states[n.name].running(name) for n in params.serving_nodes)


def start_serving(params: Params, cluster: Cluster, states: dict[str, NodeState],
                  say: Callable[[str], object]) -> None:
    """vllm serve in the head's Ray container (04's cluster must run), or the mp containers."""
    if params.serving.executor != "ray":
        start(params, cluster, params.serving_nodes, False, say=say)
        return
    p = plan(params)
    if not ray_running(params, states):
        raise CheckFailed("the Ray cluster is not running on every node: run 04_ray_cluster.ipynb first "
                          "(`sparkbook run -p FILE --steps 04`)")
    head = [params.head]
    workdir.prepare(params, cluster, head)
    with secrets_file(cluster, head, lambda n: workdir.secrets_path(params, n), secrets(params, False)):
        cluster.run(p.ray_serve, head, timeout=60).check(
            "start vllm serve in the Ray container", "see the message above; 04_ray_cluster.ipynb "
            "forms the Ray cluster it runs in")


def serving_fingerprint(params: Params, cluster: Cluster) -> str | None:
    """The fingerprint vllm serve in the head's Ray container was started with ("" when it has
    none); None when it does not run."""
    r = cluster.run_on(params.head, script("serve_fingerprint.sh", plan(params).ray_container, SERVE_PATTERN, SERVE_FP))
    found = re.search(r"^FP=(.*)$", r.stdout, re.M) if r.ok else None
    return found.group(1).strip() if found else None


def remove_serving(params: Params, cluster: Cluster, grace: float = 60) -> None:
    """Stop vLLM: its containers (mp), or vllm serve in the head's Ray container (``grace``
    seconds to shut down, then killed), waited for so that its port is free when this returns."""
    p = plan(params)
    if p.ray:
        cluster.run(script("stop_serve.sh", p.ray_container, SERVE_PATTERN, ENGINE_PATTERN, f"{grace:.0f}"),
                    [params.head], timeout=grace + 30)
    else:
        cluster.run(remove(params, p.serve_container))


def wait_ready(params: Params, cluster: Cluster, dep: Deployment, timeout: float,
               launched: float | None = None) -> None:
    """Wait for /health and /v1/models, showing every node's phase and latest log line; stop early
    when a serving container (or vllm serve in the Ray head's) dies, or when no node has made
    progress for ``serving.stall_timeout``. What it saw goes into ``dep``; when each phase was
    first seen and when the API's port answered and it was ready, in seconds since ``launched``
    (the monotonic time vllm serve was launched; the wait's start by default), into
    ``dep.timeline``."""
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    since = (lambda: round(time.monotonic() - (t0 if launched is None else launched), 1))
    api = dep.timeline.setdefault("api", {})
    watch = StallWatch(params.serving.stall_timeout)
    with Progress(f"waiting for vLLM at {params.endpoint} (up to {timeout:.0f} s; a stall is called "
                  f"after {params.serving.stall_timeout:.0f} s without progress)") as progress:
        while time.monotonic() < deadline:
            health = healthy(params)
            dep.ready, dep.models, dep.seen, dep.key_refused = health.ready, health.models, health.seen, health.refused
            if health.answered:
                api.setdefault("port open", since())
            if dep.ready:
                api["ready"] = since()
            progress.update("api", f"{time.monotonic() - t0:5.0f} s  {dep.seen}", force=dep.ready)
            if dep.ready or health.refused:  # up, but the key is refused: no use waiting
                return
            readings = read_progress(params, cluster)
            dep.stall = watch.update(readings)
            dep.phases = dict(watch.phases)
            for node, phase in dep.phases.items():
                if phase:
                    dep.timeline.setdefault(node, {}).setdefault(phase, since())
            for node, p in readings.items():
                phase = watch.phases.get(node)
                progress.update(node, f"[{p.status}] {phase or 'starting'}: {p.last_line[-140:]}",
                                fraction=(ORDER.index(phase) + 1) / len(ORDER) if phase in ORDER else 0.0)
            dep.stopped = {n: p.status for n, p in readings.items() if p.dead}
            if dep.stopped:
                dep.seen = f"the serving container stopped on {', '.join(dep.stopped)}"
                return
            if dep.stall:
                dep.seen = dep.stall.summary
                return
            time.sleep(3)
        dep.seen = f"not ready after {timeout:.0f} s ({dep.seen})"


class Health(NamedTuple):
    ready: bool
    models: list[str]
    seen: str
    refused: bool = False  # the API answers but refuses the request (401: no key, or another key)
    answered: bool = False  # an HTTP answer came back (the port is open), whatever it said


def healthy(params: Params, timeout: float = 5) -> Health:
    """Whether the engine's health path answers 200 and /v1/models lists a model (with the API
    key, when the parameters name one): the served model IDs, what was seen."""
    key = api_key(params)
    try:
        with _open(params.endpoint + HEALTH, timeout) as r:
            if r.status != 200:
                return Health(False, [], f"{HEALTH} answered {r.status}", answered=True)
        with _open(f"{params.endpoint}/v1/models", timeout, key) as r:
            ids = [m["id"] for m in json.load(r).get("data", [])]
        return Health(bool(ids), ids, "ready" if ids else "/v1/models lists no model", answered=True)
    except urllib.error.HTTPError as e:
        if e.code == 401:
            return Health(False, [], "the API refused the request (HTTP 401): " + (
                "the key of serving.api_key_env is not the one vLLM requires" if key else
                "vLLM requires an API key: name the variable that holds it in serving.api_key_env"), True, True)
        return Health(False, [], f"HTTP {e.code} from {e.url}", answered=True)
    except (OSError, ValueError) as e:
        return Health(False, [], f"{type(e).__name__}: {getattr(e, 'reason', e)}")


def first_token(params: Params, model: str, timeout: float = 120) -> bool:
    """One real request, a chat completion of one token: whether it came back (06 judges the API;
    this only times the first answer for the start-up's timeline)."""
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        with _open(f"{params.endpoint}/v1/chat/completions", timeout, api_key(params), body) as r:
            return bool(json.load(r).get("choices"))
    except (OSError, ValueError):
        return False


def _open(url: str, timeout: float, key: str | None = None, body: dict | None = None):
    """GET ``url`` (POST ``body`` as JSON), with the API key where one is given; straight to the
    node, never through a proxy from this machine's environment."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    data = json.dumps(body).encode() if body is not None else None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(urllib.request.Request(url, data, headers), timeout=timeout)
