"""One bad link among many: when 02's all-reduce across more than two nodes fails or stays below
its bar, the same sweep (its three largest sizes) on every pair of nodes, disjoint pairs at once,
and the node or link at fault named from which pairs are slow.

Up to :data:`ALL_PAIRS` nodes every pair is measured (28 pairs in 7 rounds for 8 nodes); beyond,
the nodes are halved first: each half sweeps on its own, a half at its bar is cleared, and a slow
half is halved again until at most :data:`ALL_PAIRS` nodes remain to pair up (when both halves are at
their bar, the pairs within each half are measured; pairs across halves are not). On a switch, a node
whose cable or port is bad slows every group it is in, so its pairs are slow and the others not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..book.tables import Table
from ..book.verdict import COLOURS, FAIL, PASS, Check
from ..nodes.remote import Cluster
from ..params import Node, Params
from . import nccltests
from .rdma import round_robin
from .sweep import Group, Sweep, run_groups

ALL_PAIRS = 8


@dataclass
class GroupResult:
    nodes: list[str]
    busbw_gbs: float | None  # the plateau; None: the sweep did not finish
    seen: str  # "0.71 GB/s at 32 MiB" or why it did not finish


@dataclass
class PairsOutcome:
    results: list[GroupResult] = field(default_factory=list)  # halves, then pairs, in the order run
    rounds: int = 0
    duration_s: float = 0.0

    def to_json(self) -> dict:
        return {"results": [vars(r) for r in self.results], "rounds": self.rounds, "duration_s": self.duration_s}

    def pairs(self) -> list[GroupResult]:
        return [r for r in self.results if len(r.nodes) == 2]


def needed(params: Params, sweep: Sweep | None) -> bool:
    """Whether 02 tests pairs: more than two nodes, and the all-reduce failed or is below its bar."""
    if params.collectives.pairs == "off" or len(params.nodes) <= 2 or sweep is None:
        return False
    best = nccltests.plateau(sweep.result["rows"]) if sweep.result else None
    return best is None or best["busbw_gbs"] < params.expectations.busbw_gbps


def _judge(out: Sweep) -> tuple[float | None, str]:
    best = nccltests.plateau(out.result["rows"]) if out.result else None
    if best is None:
        return None, "did not finish" + (" (time limit)" if out.timed_out else "") + ": " + ", ".join(
            f"{n}: {p}" for n, p in out.phases.items())
    return best["busbw_gbs"], f"{best['busbw_gbs']:.2f} GB/s"


def run(params: Params, cluster: Cluster, run_dir: Path | None = None,
        say: Callable[[str], object] = print) -> PairsOutcome:
    """Halves down to :data:`ALL_PAIRS` nodes, then every pair of what is left, in rounds of
    disjoint groups (see the module's docstring)."""
    out, start = PairsOutcome(), time.monotonic()
    bar = params.expectations.busbw_gbps

    def sweep(groups: list[list[Node]]) -> list[GroupResult]:
        out.rounds += 1
        say(f"  round {out.rounds}: " + "; ".join(", ".join(n.name for n in g) for g in groups))
        done = run_groups(params, cluster, [Group(tuple(g), quick=True) for g in groups], run_dir,
                          say=lambda *_: None)
        found = [GroupResult([n.name for n in g], *_judge(s)) for g, s in zip(groups, done)]
        out.results += found
        return found

    suspect = [list(params.nodes)]
    while any(len(s) > ALL_PAIRS for s in suspect):
        keep = [s for s in suspect if len(s) <= ALL_PAIRS]
        halves = [h for s in suspect if len(s) > ALL_PAIRS for h in (s[:len(s) // 2], s[len(s) // 2:])]
        slow = [h for h, r in zip(halves, sweep(halves)) if r.busbw_gbs is None or r.busbw_gbs < bar]
        suspect = keep + (slow or halves)  # no slow half: the fault lies between them; pair within each
    by_name = {n.name: n for n in params.nodes}
    for s in suspect:
        for pairs in round_robin([n.name for n in s]):
            sweep([sorted((by_name[a], by_name[b]), key=params.nodes.index) for a, b in pairs])
    out.duration_s = time.monotonic() - start
    say(f"pairs: {len(out.pairs())} pair(s) in {out.rounds} round(s), {out.duration_s:.0f} s")
    return out


def checks(params: Params, out: PairsOutcome) -> list[Check]:
    """A row per slow pair, one for those at the bar, and the node or link at fault: the node in
    every slow pair whose every pair is slow (its cable or switch port), or the one slow pair."""
    bar = params.expectations.busbw_gbps
    pairs = out.pairs()
    slow = [r for r in pairs if r.busbw_gbs is None or r.busbw_gbs < bar]
    expected = f"every pair's busbw ≥ {bar:g} GB/s"
    found = [Check("pair all-reduce", ", ".join(r.nodes), FAIL, r.seen, expected, "see the link at fault below")
             for r in slow]
    good = [r for r in pairs if r not in slow]
    if good:
        found.append(Check("pair all-reduce", "all", PASS, f"{len(good)} pair(s) at the bar: " + ", ".join(
            f"{'–'.join(r.nodes)} {r.seen}" for r in good[:6]) + (" ..." if len(good) > 6 else ""), expected))
    if not slow:
        if pairs:  # every pair at its bar, the whole below it: no one link explains it
            found.append(Check("link at fault", "all", FAIL, f"every one of {len(pairs)} pairs at the bar while "
                               "the all-reduce across all nodes is not", "a node or link named",
                               "not one link: the switch's capacity or its configuration (flow control, ECN, "
                               "buffer), or a collective that needs every node at once: rerun 02, then "
                               "test halves of the nodes by hand"))
        return found
    nodes = list(dict.fromkeys(n for r in pairs for n in r.nodes))
    for node in nodes:
        mine = [r for r in pairs if node in r.nodes]
        if mine and all(r in slow for r in mine) and all(node in r.nodes for r in slow):
            found.append(Check("link at fault", node, FAIL, f"every pair with {node} is slow ({len(mine)} of "
                               f"{len(mine)}), every other pair at the bar", "every pair at its bar",
                               f"{node}'s link: its cable or its switch port on the rail the all-reduce uses "
                               f"({node}'s first rail): 02's per-cable rows and 01_preflight.ipynb's rail rows "
                               f"for {node}; reseat or replace the cable, then rerun 02"))
            return found
    if len(slow) == 1:
        a, b = slow[0].nodes
        found.append(Check("link at fault", f"{a}, {b}", FAIL, f"only the pair {a}–{b} is slow",
                           "every pair at its bar", f"the path between {a} and {b}: a cable of a direct link, "
                           "or the switch's route between their ports"))
    else:
        found.append(Check("link at fault", "all", FAIL, f"{len(slow)} slow pairs with no node common to all: "
                           + ", ".join('–'.join(r.nodes) for r in slow), "a node or link named",
                           "more than one fault: take the slow pairs' nodes' cables one at a time, rerunning 02"))
    return found


def table(out: PairsOutcome | None, params: Params) -> Table:
    bar = params.expectations.busbw_gbps
    rows = [[", ".join(r.nodes), r.seen, "PASS" if r.busbw_gbs is not None and r.busbw_gbs >= bar else "FAIL"]
            for r in (out.results if out else [])]
    return Table(["nodes", "busbw", "status"], rows, title=f"all-reduce by group (bar {bar:g} GB/s)",
                 colour=lambda col, v: COLOURS.get(v) if col == "status" else None)
