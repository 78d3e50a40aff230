"""02_collectives: the serving image on every node (copied from the head where a worker lacks it,
and recorded), each cable measured both ways (:mod:`sparkbook.collectives.rdma`), then the
all-reduce sweeps inside the image, small messages and bandwidth (:mod:`sparkbook.collectives.sweep`),
and, where the all-reduce across more than two nodes falls short, every pair of nodes
(:mod:`sparkbook.collectives.pairs`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..book.step import Outcome
from ..book.tables import Table, human_bytes
from ..book.verdict import SKIP, Check, run_step
from ..collectives import nccltests, pairs as by_pairs, rdma, rdma_judge, sweep as collectives
from ..facts.parsers import nccl_transport
from ..distribution.image import ImageOutcome, copy_checks, distribute_image, transfers_summary
from ..params import Params

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "02_collectives"
TITLE = "02 collectives"
NOT_RUN = "not run: the serving image is not on every node"


@dataclass
class CollectivesOutcome(Outcome):
    """The image copy made for the sweep, each cable's measurement, the sweep (None when the copy
    failed) and the pairs' (None when not needed)."""

    FILE: ClassVar[str] = "collectives.json"
    image: ImageOutcome | None = None
    sweep: collectives.Sweep | None = None
    cables: rdma.RdmaOutcome | None = None
    pairs: by_pairs.PairsOutcome | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.sweep.to_json() if self.sweep else {"result": None, "skipped": NOT_RUN}
        return {**data, "image": self.image.to_json() if self.image else None,
                "cables": self.cables.to_json() if self.cables else None,
                "pairs": self.pairs.to_json() if self.pairs else None}

    def save(self, run_dir: Path) -> Path | None:
        """``collectives.json``, the sweeps' rows in ``collectives.csv`` (bandwidth) and
        ``collectives_latency.csv`` (small messages), and each cable's in ``rdma.csv``."""
        if self.sweep:
            collectives.write_csv(self.sweep, run_dir / "collectives.csv")
            collectives.write_csv(self.sweep, run_dir / "collectives_latency.csv", "latency")
        if self.cables:
            rdma.write_csv(self.cables, run_dir / "rdma.csv")
        return super().save(run_dir)

    def key_numbers(self) -> list[tuple[str, str]]:
        out = []
        result = self.sweep.result if self.sweep else None
        if result and (best := nccltests.plateau(result["rows"])):
            out.append(("all-reduce bus bandwidth", f"{best['busbw_gbs']:.2f} GB/s at "
                        f"{human_bytes(best['bytes'])}, the plateau ({self.sweep.backend})"))
        if self.cables and (each := rdma_judge.rail_gbps(self.cables)) is not None:
            out.append(("RDMA over the rails", f"{each:.1f} Gb/s one way (each rail's slowest link, summed)"))
        if result and (small := nccltests.latency(result.get("latency", []))):
            out.append(("all-reduce small-message latency", f"{small[0]:.1f} µs ({self.sweep.backend})"))
        if self.image and self.image.transfers:
            out.append(("image copied for the sweep", transfers_summary(self.image)))
        return out


def copy_image(ctx: Context) -> ImageOutcome:
    """The serving image on every node: streamed from the head where a worker lacks it, as 03 does
    (a failed copy is recorded, and the sweep does not run)."""
    return distribute_image(ctx.params, ctx.cluster)


def measure_cables(ctx: Context) -> rdma.RdmaOutcome:
    """Each cable measured both ways with perftest, on the hosts (no image needed)."""
    return rdma.measure(ctx.params, ctx.cluster)


def run(ctx: Context, image: ImageOutcome | None = None, cables: rdma.RdmaOutcome | None = None,
        omit: tuple[str, ...] = ()) -> CollectivesOutcome:
    """The sweep, after the image copy and the cables' measurement (each made here when None, as
    :func:`copy_image` and :func:`measure_cables` make them; nothing more after a failed copy),
    then every pair of nodes when the all-reduce across more than two falls short. ``omit`` leaves
    nodes out of the sweep (a drill for the hang diagnosis)."""
    image = image if image is not None else copy_image(ctx)
    if cables is None and image.complete:
        cables = measure_cables(ctx)
    if not image.complete:
        print("the serving image is not on every node: the sweep does not run (the verdict says why)")
        return CollectivesOutcome(image, cables=cables)
    sweep = collectives.run(ctx.params, ctx.cluster, ctx.run_dir, omit=omit)
    pairs = None
    if by_pairs.needed(ctx.params, sweep) and not omit:
        print("the all-reduce across all nodes fell short: every pair of nodes next")
        pairs = by_pairs.run(ctx.params, ctx.cluster, ctx.run_dir)
    return CollectivesOutcome(image, sweep, cables, pairs)


def cables_table(ctx: Context, cables: rdma.RdmaOutcome) -> Table:
    return rdma_judge.table(cables, ctx.params)


def cables_plot(ctx: Context, cables: rdma.RdmaOutcome):
    """Per rail, what each link carried one way, node by node, kept as ``rdma.png``."""
    return rdma_judge.plot(ctx.params, cables, ctx.path("rdma.png"))


def pairs_table(ctx: Context, outcome: CollectivesOutcome) -> Table | str:
    if outcome.pairs is None:
        return "no pair measured: the all-reduce met its bar, or two nodes only"
    return by_pairs.table(outcome.pairs, ctx.params)


def table(outcome: CollectivesOutcome) -> Table:
    return collectives.table(outcome.sweep)


def plot(ctx: Context, outcome: CollectivesOutcome):
    """busbw against message size, with the expectation and the plateau, kept as
    ``collectives.png`` in the run folder (nothing when the sweep did not finish)."""
    if outcome.sweep is None:
        return None
    return collectives.plot(ctx.params, outcome.sweep, ctx.path("collectives.png"))


def latency_table(outcome: CollectivesOutcome) -> Table:
    return collectives.latency_table(outcome.sweep)


def latency_plot(ctx: Context, outcome: CollectivesOutcome):
    """The time of one small all-reduce against its size, with the bar, kept as
    ``collectives_latency.png`` (nothing when the sweep did not finish)."""
    if outcome.sweep is None:
        return None
    return collectives.latency_plot(ctx.params, outcome.sweep, ctx.path("collectives_latency.png"))


def checks(params: Params, outcome: CollectivesOutcome) -> list[Check]:
    """What the image copy did (or where it failed), each cable, then the sweep's checks, the sweep
    against what the cables carry, and the pairs'."""
    found = copy_checks(params, outcome.image) if outcome.image else []
    found += rdma_judge.checks(params, outcome.cables) if outcome.cables else []
    if outcome.sweep is None:
        return found + [Check("all-reduce", "all", SKIP, NOT_RUN, "every rank finishes the sweep",
                              run_step("03_distribute_image") + ": it copies the head's image to every node")]
    found += collectives.checks(params, outcome.sweep)
    result, sweep = outcome.sweep.result, outcome.sweep
    best = nccltests.plateau(result["rows"]) if result else None
    found += rdma_judge.against_allreduce(params, outcome.cables, best and best["busbw_gbs"], sweep.backend,
                                          {n: nccl_transport(v) for n, v in sweep.nccl.items()})
    return found + (by_pairs.checks(params, outcome.pairs) if outcome.pairs else [])
