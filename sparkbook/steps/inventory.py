"""00 · Inventory: the facts of every node (:mod:`sparkbook.facts.inventory`), in one round trip per
node; kept as ``inventory.json`` and ``inventory.csv``. An unreachable node fails the step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..book.tables import Table
from ..book.verdict import Check
from ..facts import inventory
from ..facts.inventory import Inventory
from ..params import Params
from ..setup import discover, draft

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "00_inventory"
TITLE = "00 inventory"


def run(ctx: Context) -> Inventory:
    """The facts of every node, also written as ``inventory.csv`` in the run folder."""
    outcome = inventory.gather(ctx.params, ctx.cluster)
    table(outcome).write_csv(ctx.path("inventory.csv"))
    return outcome


def ports(ctx: Context) -> Table:
    """Every HCA port of every node as ``sparkbook discover`` reads it (also ``ports.csv``); where
    the parameters' rails differ from what is cabled, said below it (01 judges the rails)."""
    found = discover.discover(ctx.cluster)
    shown = discover.table(found)
    shown.write_csv(ctx.path("ports.csv"))
    for line in draft.differences(ctx.params, found) or ["the parameters' rails are the cabled ports, at the "
                                                          "addresses the nodes show"]:
        print(line)
    return shown


def table(outcome: Inventory) -> Table:
    return inventory.table(outcome.rows)


def checks(params: Params, outcome: Inventory) -> list[Check]:
    return inventory.checks(params, outcome)
