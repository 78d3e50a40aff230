"""sparkbook: a Jupyter runbook that takes GPU nodes from reachable-by-SSH to a verified vLLM
deployment across them, and keeps a shareable record of every step."""

from . import notebook
from .book import step
from .book.errors import CheckFailed, SparkbookError
from .params import Params, ParamsError, load as load_params
from .nodes.remote import Cluster, Result, Results
from .nodes.shell import sh
from .book.tables import Table
from .book.verdict import Check, Verdict
from .version import __version__

__all__ = ["Check", "CheckFailed", "Cluster", "Params", "ParamsError", "Result", "Results",
           "SparkbookError", "Table", "Verdict", "load_params", "notebook", "sh", "__version__"]
