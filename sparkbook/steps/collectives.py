"""02_collectives: the serving image on every node (copied from the head where a worker lacks it,
and recorded), then the all-reduce sweeps inside it, small messages and bandwidth
(:mod:`sparkbook.collectives.sweep`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..book.step import Outcome
from ..book.tables import Table, human_bytes
from ..book.verdict import SKIP, Check, run_step
from ..collectives import nccltests, sweep as collectives
from ..distribution.image import ImageOutcome, copy_checks, distribute_image, transfers_summary
from ..params import Params

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "02_collectives"
TITLE = "02 collectives"
NOT_RUN = "not run: the serving image is not on every node"


@dataclass
class CollectivesOutcome(Outcome):
    """The image copy made for the sweep, and the sweep (None when the copy failed)."""

    FILE: ClassVar[str] = "collectives.json"
    image: ImageOutcome | None = None
    sweep: collectives.Sweep | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.sweep.to_json() if self.sweep else {"result": None, "skipped": NOT_RUN}
        return {**data, "image": self.image.to_json() if self.image else None}

    def save(self, run_dir: Path) -> Path | None:
        """``collectives.json``, and the sweeps' rows in ``collectives.csv`` (bandwidth) and
        ``collectives_latency.csv`` (small messages)."""
        if self.sweep:
            collectives.write_csv(self.sweep, run_dir / "collectives.csv")
            collectives.write_csv(self.sweep, run_dir / "collectives_latency.csv", "latency")
        return super().save(run_dir)

    def key_numbers(self) -> list[tuple[str, str]]:
        out = []
        result = self.sweep.result if self.sweep else None
        if result and (best := nccltests.plateau(result["rows"])):
            out.append(("all-reduce bus bandwidth", f"{best['busbw_gbs']:.2f} GB/s at "
                        f"{human_bytes(best['bytes'])}, the plateau ({self.sweep.backend})"))
        if result and (small := nccltests.latency(result.get("latency", []))):
            out.append(("all-reduce small-message latency", f"{small[0]:.1f} µs ({self.sweep.backend})"))
        if self.image and self.image.transfers:
            out.append(("image copied for the sweep", transfers_summary(self.image)))
        return out


def copy_image(ctx: Context) -> ImageOutcome:
    """The serving image on every node: streamed from the head where a worker lacks it, as 03 does
    (a failed copy is recorded, and the sweep does not run)."""
    return distribute_image(ctx.params, ctx.cluster)


def run(ctx: Context, image: ImageOutcome | None = None, omit: tuple[str, ...] = ()) -> CollectivesOutcome:
    """The sweep, after the image copy (``image``: one :func:`copy_image` made; made here when
    None). ``omit`` leaves nodes out of the sweep (a drill for the hang diagnosis)."""
    image = image if image is not None else copy_image(ctx)
    if not image.complete:
        print("the serving image is not on every node: the sweep does not run (the verdict says why)")
        return CollectivesOutcome(image)
    return CollectivesOutcome(image, collectives.run(ctx.params, ctx.cluster, ctx.run_dir, omit=omit))


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
    """What the image copy did (or where it failed), then the sweep's checks."""
    found = copy_checks(params, outcome.image) if outcome.image else []
    if outcome.sweep is None:
        return found + [Check("all-reduce", "all", SKIP, NOT_RUN, "every rank finishes the sweep",
                              run_step("03_distribute_image") + ": it copies the head's image to every node")]
    return found + collectives.checks(params, outcome.sweep)
