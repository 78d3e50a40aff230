"""Every preflight check, in the order of the verdict table: each group compares what the nodes
reported (:class:`~sparkbook.preflight.collect.Preflight`) with the parameters and with each
other; one row per check, node and thing checked."""

from __future__ import annotations

from ..book.verdict import Check
from ..facts import memfit
from ..params import Params
from . import artifacts, fabric, host, nodes, reach
from .collect import Preflight


def checks(params: Params, pf: Preflight) -> list[Check]:
    return [
        *reach.ssh(params, pf),
        *reach.node_to_node(params, pf),
        *nodes.sameness(params, pf),
        *nodes.gpus(params, pf),
        *nodes.runtime(params, pf),
        *host.health(params, pf),
        *fabric.layout(params, pf),
        *fabric.rails(params, pf),
        *reach.tcp(params, pf),
        *nodes.clocks(params, pf),
        *nodes.ports(params, pf),
        *nodes.disks(params, pf),
        *artifacts.image(params, pf),
        *artifacts.model(params, pf),
        *memfit.checks(params, {n: r["memory"] for n, r in pf.nodes.items() if "memory" in r}),
        *artifacts.hf_token(params, pf),
        *reach.unreachable(params, pf),
    ]
