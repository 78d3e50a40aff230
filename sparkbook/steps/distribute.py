"""03_distribute_image: the same image and the same model on every node, sending only what is
missing (:mod:`sparkbook.distribution`); with ``model.source: hf`` the model is downloaded onto the
head first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..book.step import Outcome
from ..book.tables import Table
from ..book.verdict import Check
from ..distribution.hub import HubOutcome, fetch_model, hub_checks
from ..distribution.image import (ImageOutcome, Survey, distribute_image, image_checks, image_table, survey,
                                  survey_table, transfers_summary)
from ..distribution.model import ModelOutcome, model_checks, model_table, sync_model
from ..params import Params

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "03_distribute_image"
TITLE = "03 image and model"


@dataclass
class DistributionOutcome(Outcome):
    """What every node held (the survey), the image copy, the download from the hub (with
    ``model.source: hf``) and the model sync."""

    FILE: ClassVar[str] = "distribution.json"
    survey: Survey
    image: ImageOutcome
    model: ModelOutcome
    hub: HubOutcome | None = None

    def to_json(self) -> dict[str, Any]:
        hub = {"hub": self.hub.to_json()} if self.hub else {}
        return {"image": self.image.to_json(), **hub, "model": self.model.to_json()}

    def save(self, run_dir: Path) -> Path | None:
        """``distribution.json``, and the image's copies in ``image_transfers.csv``."""
        image_table(self.image).write_csv(run_dir / "image_transfers.csv")
        return super().save(run_dir)

    def key_numbers(self) -> list[tuple[str, str]]:
        hub = [("model download", self.hub.summary())] if self.hub else []
        return [("image distribution", transfers_summary(self.image)), *hub]


def run(ctx: Context) -> DistributionOutcome:
    """Survey every node, copy the image where it differs from the head's, download the model
    onto the head (``model.source: hf``), then copy the model files that differ."""
    params, cluster = ctx.params, ctx.cluster
    found = survey(params, cluster)
    image = distribute_image(params, cluster, found)
    hub = fetch_model(params, cluster) if params.model.source == "hf" else None
    if hub and hub.error:  # a half-downloaded model is not copied to the workers
        model = ModelOutcome(params.model.path, params.distribution.model_sync,
                             head_error=f"the download from the hub failed: {hub.error}")
    else:
        model = sync_model(params, cluster)
    return DistributionOutcome(found, image, model, hub)


def table(outcome: DistributionOutcome) -> Table:
    """What every node held before the copies."""
    return survey_table(outcome.survey)


def image_copies(outcome: DistributionOutcome) -> Table:
    """The image's copies from the head, one row per worker."""
    return image_table(outcome.image)


def model_copies(outcome: DistributionOutcome) -> Table:
    """Each worker's model differences from the head's, before and after the sync."""
    return model_table(outcome.model)


def checks(params: Params, outcome: DistributionOutcome) -> list[Check]:
    """The image, the download from the hub, and the model, node by node."""
    return (image_checks(params, outcome.image) + hub_checks(params, outcome.hub)
            + model_checks(params, outcome.model))
