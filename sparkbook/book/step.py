"""The one face every step module has (``sparkbook.steps.*``, one per notebook).

A step module names itself once and offers three functions::

    NAME = "05_serve"          # the notebook's file name, without .ipynb
    TITLE = "05 vLLM serving"  # the verdict's title

    def run(ctx, **kw) -> Outcome        # the step's work, on the nodes
    def table(outcome) -> Table          # what it found, for people
    def checks(params, outcome) -> list[Check]   # what the verdict says about it

An :class:`Outcome` serialises itself (``to_json``, written to ``FILE`` in the run folder) and
names its key numbers (``key_numbers``), which the verdict keeps and the report shows, so that no
one reads another step's JSON layout. The notebook context (:mod:`sparkbook.notebook`) records the
outcome, gates and concludes; a notebook reads the same four lines in every step::

    ctx = sb.notebook.start(globals(), step)
    outcome = ctx.run()
    step.table(outcome)
    ctx.conclude(outcome)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .redact import mask
from .tables import Table
from .verdict import Check

if TYPE_CHECKING:  # the step face names the parameters; the book below them imports none
    from ..params import Params


class Outcome:
    """What a step found or did. Subclasses are dataclasses; ``FILE`` is where it is kept in the
    run folder ("" keeps it only in memory)."""

    FILE: ClassVar[str] = ""

    def to_json(self) -> Any:
        """Plain data for JSON (a dict of the dataclass's fields by default)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def key_numbers(self) -> list[tuple[str, str]]:
        """(label, value) of the numbers people look for first; none by default."""
        return []

    def boots(self) -> dict[str, str]:
        """Node -> its boot ID when the step read it: what the step found holds until that node
        boots again (the verdict keeps them); none by default."""
        return {}

    def save(self, run_dir: Path) -> Path | None:
        if not self.FILE:
            return None
        path = run_dir / self.FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(mask(json.dumps(self.to_json(), indent=2, default=str)) + "\n")
        return path


class Step(Protocol):
    """What :mod:`sparkbook.notebook` expects of a step module."""

    NAME: str
    TITLE: str

    def run(self, ctx: Any, **kw: Any) -> Outcome: ...

    def table(self, outcome: Any) -> Table: ...

    def checks(self, params: Params, outcome: Any) -> list[Check]: ...
