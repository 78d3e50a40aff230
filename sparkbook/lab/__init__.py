"""The local lab: simulated DGX Spark nodes on one machine (see lab.py; nodes.py names them, image.py builds their image)."""

from .lab import Lab, require_up
from .nodes import FAULTS, LAB_HOME, LabError, LabNode, docker, lab_nodes, lab_params, params_file

__all__ = ["FAULTS", "LAB_HOME", "Lab", "LabError", "LabNode", "docker", "lab_nodes", "lab_params",
           "params_file", "require_up"]
