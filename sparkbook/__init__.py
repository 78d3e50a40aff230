"""sparkbook: a Jupyter runbook that takes GPU nodes from reachable-by-SSH to a verified vLLM
deployment across them, and keeps a shareable record of every step."""

__version__ = "0.1.0"

from . import notebook, step
from .errors import CheckFailed, SparkbookError
from .params import Params, ParamsError, load as load_params
from .remote import Cluster, Result, Results
from .shell import sh
from .tables import Table
from .verdict import Check, Verdict

__all__ = ["Check", "CheckFailed", "Cluster", "Params", "ParamsError", "Result", "Results",
           "SparkbookError", "Table", "Verdict", "load_params", "notebook", "sh", "__version__"]
