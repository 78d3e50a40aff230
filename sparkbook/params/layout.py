"""The fabric's layout as the parameters draw it: which nodes share each rail's subnet.

- direct pair: two nodes, each rail's subnet holding both (a QSFP cable per rail, or a switch);
- switch: three or more nodes, each rail's subnet holding all of them;
- ring/mesh: three or more nodes cabled to each other, each rail's subnet holding only the two
  ends of one cable, so a node's rails reach different peers: not supported yet (NCCL and Ray
  would need routes between nodes that share no cable);
- mixed: anything else, e.g. a rail whose subnet holds no other node.

Whether the pings across each rail pass is the other half (:func:`sparkbook.preflight.fabric.layout`).
"""

from __future__ import annotations

from typing import NamedTuple

from . import Params

PAIR, SWITCH, RING, MIXED = "direct pair", "switch", "ring/mesh", "mixed"


class Layout(NamedTuple):
    kind: str  # PAIR, SWITCH, RING, MIXED; "" for one node or no rails
    nodes: int
    rails: int  # per node
    subnets: dict[str, list[str]]  # each rail subnet -> the nodes with an address in it

    def __str__(self) -> str:
        kind = f"{self.kind} (unsupported)" if self.kind == RING else self.kind
        return f"{kind}, {self.nodes} nodes, {self.rails} rail{'s' if self.rails != 1 else ''}"


def classify(params: Params) -> Layout:
    subnets: dict[str, list[str]] = {}
    for node in params.nodes:
        for rail in node.rails:
            subnets.setdefault(str(rail.network), []).append(node.name)
    n = len(params.nodes)
    sizes = {len(names) for names in subnets.values()}
    if n < 2 or not subnets:
        kind = ""
    elif sizes == {n}:
        kind = PAIR if n == 2 else SWITCH
    elif sizes == {2}:
        kind = RING
    else:
        kind = MIXED
    return Layout(kind, n, len(params.head.rails), subnets)
