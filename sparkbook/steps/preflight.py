"""01 · Preflight: every known multi-node failure, checked on every node at once before anything
is launched (:mod:`sparkbook.preflight`); what the nodes reported is kept as ``preflight.json``.
``sparkbook preflight`` runs the same checks from a terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import preflight
from ..book.tables import Table
from ..book.verdict import Check
from ..facts import inventory
from ..params import Params
from ..preflight import Preflight

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "01_preflight"
TITLE = "01 preflight"


def run(ctx: Context, **kw: Any) -> Preflight:
    """What every node reports: one round trip per node, all at once, then one for the clocks."""
    return preflight.gather(ctx.params, ctx.cluster)


def table(outcome: Preflight) -> Table:
    """The facts of the nodes that answered, as the inventory shows them."""
    return inventory.table(outcome.rows())


def parity(ctx: Context, outcome: Preflight) -> Table:
    """What must match on every node, side by side, each difference marked (also ``parity.csv``);
    the verdict judges each fact in its own row."""
    shown = preflight.parity_table(ctx.params, outcome)
    shown.write_csv(ctx.path("parity.csv"))
    return shown


def what_is_checked() -> Table:
    """Every group of checks, in the verdict's order (the same list as ``sparkbook preflight --help``)."""
    return preflight.checks_table()


def checks(params: Params, outcome: Preflight) -> list[Check]:
    return preflight.checks(params, outcome)
