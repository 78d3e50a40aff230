"""Every container of this deployment off every node (08), their logs kept first; then nothing may
be left running or listening on the configured ports. Another deployment's containers on the same
nodes (another ``name``) are left alone."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..book.step import Outcome
from ..facts.parsers import listener
from ..nodes import workdir
from ..nodes.remote import Cluster
from ..params import Params
from .logs import collect_logs
from .state import NodeState, node_states, remove

SETTLE_S = 30  # sockets close a moment after their process: how long to wait for the ports


@dataclass
class Teardown(Outcome):
    """What 08 removed, and what is left, by node."""
    FILE = "teardown.json"

    removed: dict[str, list[str]] = field(default_factory=dict)
    remaining: dict[str, list[str]] = field(default_factory=dict)
    listeners: dict[str, list[str]] = field(default_factory=dict)  # "api 8000: ADDRESS PROCESS"
    errors: dict[str, str] = field(default_factory=dict)


def teardown(params: Params, cluster: Cluster, run_dir: Path) -> Teardown:
    """Logs first, then every container of this deployment on every node (and a secrets file an
    interrupted start left); then check that none is left and nothing listens on the configured
    ports."""
    out = Teardown()
    collect_logs(params, cluster, run_dir)
    for n, st in node_states(params, cluster).items():
        if st.containers:
            out.removed[n] = sorted(st.containers)
    cluster.run(remove(params), timeout=120)
    cluster.run(lambda n: ["rm", "-f", "--", workdir.secrets_path(params, n)])
    deadline = time.monotonic() + SETTLE_S
    while True:
        left(params, node_states(params, cluster), out)
        if not (out.remaining or out.listeners) or time.monotonic() > deadline:
            return out
        time.sleep(1)


def left(params: Params, states: dict[str, NodeState], out: Teardown) -> None:
    """What is left on the nodes, into ``out``: containers, listeners on the ports, errors."""
    ports = params.ports.model_dump()
    out.remaining = {n: sorted(s.containers) for n, s in states.items() if s.containers}
    listeners = {n: [f"{k} {p}: {listener(s.listeners, p)}" for k, p in ports.items()
                     if listener(s.listeners, p)] for n, s in states.items()}
    out.listeners = {n: v for n, v in listeners.items() if v}
    out.errors = {n: s.error for n, s in states.items() if s.error}
