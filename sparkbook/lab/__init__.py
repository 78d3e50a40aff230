"""The local lab: simulated DGX Spark nodes on one machine (see lab.py)."""

from .lab import (FAULTS, LAB_HOME, Lab, LabError, LabNode, docker, lab_nodes, lab_params, params_file,
                  require_up)

__all__ = ["FAULTS", "LAB_HOME", "Lab", "LabError", "LabNode", "docker", "lab_nodes", "lab_params",
           "params_file", "require_up"]
