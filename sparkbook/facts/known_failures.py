"""The table of known failures that sparkbook.facts.signatures matches logs against: each a
name, the patterns of its log lines, its cause and remedy, the start-up phase and the steps whose
logs can hold it (sparkbook.facts.failures, one module per kind). Most specific first: a line
belongs to the first signature that matches it, so ORDER puts a cause before the family it belongs
to, and the catch-alls last. A new signature goes into its kind's module and into ORDER, with
real lines in tests/fixtures/logs/ from at least two sources where they exist (DEVELOPING.md's
recipe).

Standard library only.
"""

from __future__ import annotations

from .failures import container, engine, fabric, resources
from .failures.kinds import ALL_STEPS, FIXES, PHASES, PROGRESS, REASONS, SERVING, Signature  # noqa: F401

ORDER = [
    # the container and the platform: they fail before anything else runs
    "entrypoint-swallowed-command", "command-not-in-image", "no-gpu-in-container", "gpu-arch-unsupported",
    "nnodes-world-size", "port-in-use", "hf-gated-model", "model-not-found", "unsupported-architecture",
    # resources
    "free-memory-at-startup", "kv-cache-too-small", "rdma-memlock", "ray-oom-killer", "disk-full",
    "out-of-memory",
    # Ray, the fabric and the collectives over it
    "ray-gcs-unreachable", "ray-version-mismatch", "ray-node-dead", "nccl-no-interface", "nccl-timeout",
    "nccl-error", "rendezvous-unreachable", "ray-placement-group", "tp-exceeds-gpus",
    "ray-unsupported-platform", "attention-unsupported",
    # hangs: each counts only as the last thing a log says
    "cross-node-init-hang", "cuda-graph-hang",
    # the engine's configuration
    "unrecognized-arguments", "config-rejected",
]
_ALL = {s.name: s for kind in (container, resources, fabric, engine) for s in kind.SIGNATURES}
SIGNATURES: list[Signature] = [_ALL[name] for name in ORDER]
assert len(ORDER) == len(set(ORDER)) and set(ORDER) == set(_ALL), set(ORDER) ^ set(_ALL)
