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

from .failures import container, engine, fabric, platform, resources
from .failures.kinds import ALL_STEPS, FIXES, PHASES, PROGRESS, REASONS, SERVING, Signature  # noqa: F401

ORDER = [
    # the container and the platform: they fail before anything else runs
    "entrypoint-swallowed-command", "command-not-in-image",
    # ... Docker, the image, the NVIDIA runtime and driver under it (platform.py)
    "docker-socket-permission", "image-not-available", "image-wrong-architecture", "nvidia-runtime-missing",
    "container-toolkit-broken", "nvml-driver-mismatch", "cuda-driver-too-old", "cuda-runtime-lib-missing",
    "no-gpu-in-container",
    # ... kernels for the GPU: Triton's ptxas before the family it belongs to
    "triton-ptxas-arch", "gpu-arch-unsupported", "flashinfer-no-arch", "quant-kernel-unsupported",
    "nnodes-world-size", "port-in-use",
    # ... the model's files and the Hub: before the gated, missing-model and disk signatures
    "hf-transfer-missing", "hf-transfer-failed", "hf-offline-not-cached", "hf-download-size-mismatch",
    "safetensors-corrupt", "hf-gated-model", "model-not-found", "unsupported-architecture",
    # the engine's configuration, where a line names the setting (before config-rejected, which
    # names any refused setting, and unrecognized-arguments)
    "max-model-len-exceeds", "pp-not-supported", "quant-unsupported-gpu", "parser-unknown",
    # resources (/dev/shm before a full disk: both say "No space left on device")
    "free-memory-at-startup", "kv-cache-too-small", "sglang-memory-unbalanced", "rdma-memlock",
    "shm-too-small", "ray-oom-killer", "disk-full", "out-of-memory",
    # Ray, the fabric and the collectives over it: a cause NCCL names in its WARN line before the
    # error (and the timeout) that follows it
    "ray-gcs-unreachable", "ray-version-mismatch", "ray-node-dead", "ray-worker-died", "ray-driver-not-a-node",
    "nccl-no-interface", "nccl-peer-unreachable", "rdma-not-in-container", "ib-qp-connect-failed",
    "ib-completion-error", "nccl-duplicate-gpu", "nccl-version-mismatch", "nccl-cuda-unsupported-op",
    "gloo-loopback-address", "gloo-bad-ifname", "nccl-timeout", "sglang-watchdog-timeout", "nccl-error",
    "rendezvous-unreachable", "ray-placement-group", "tp-exceeds-gpus", "ray-unsupported-platform",
    "attention-unsupported",
    # hangs: each counts only as the last thing a log says
    "cross-node-init-hang", "cuda-graph-hang", "shm-broadcast-stall",
    # the engine's configuration, any setting
    "unrecognized-arguments", "config-rejected",
    # wrappers: the engine failed, the cause is above
    "engine-failed-see-above",
]
_ALL = {s.name: s for kind in (container, platform, resources, fabric, engine) for s in kind.SIGNATURES}
SIGNATURES: list[Signature] = [_ALL[name] for name in ORDER]
assert len(ORDER) == len(set(ORDER)) and set(ORDER) == set(_ALL), set(ORDER) ^ set(_ALL)
