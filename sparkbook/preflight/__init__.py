"""Preflight (01, and ``sparkbook preflight``): every known multi-node failure, checked before
launch.

:func:`gather` runs one bundle of node scripts per node, in one SSH round trip each (all nodes
at once), and parses what each node reported; :func:`checks` then compares it with the
parameters and across nodes. Each check is a row: check, node, status, observed, expected,
remedy.
"""

from .checks import checks
from .checks import table as checks_table
from .collect import NodeReport, Preflight, gather
from .parity import table as parity_table

__all__ = ["NodeReport", "Preflight", "checks", "checks_table", "gather", "parity_table"]
