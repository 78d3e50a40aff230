"""Node logs and the failures they name: every node's container logs collected into the run
folder (``logs/<node>/``) before anything is removed, and one table of known failure signatures in
vLLM, NCCL and Ray logs, matched to name a cause and its remedy (05, and 08 keeps the logs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..params import Params
from ..parsers import parse_sections
from ..remote import Cluster, script
from .commands import RAY_CONTAINER, SERVE_LOG


class Signature(NamedTuple):
    pattern: str  # a regular expression, matched line by line
    cause: str
    remedy: str


class Match(NamedTuple):
    cause: str
    evidence: str  # the last line that matched
    remedy: str


@dataclass
class Diagnosis:
    """The likely cause of a failure on one node, from its logs."""
    node: str
    cause: str
    evidence: str
    remedy: str
    logs: str  # the folder of the node's logs


# Known failure signatures in vLLM / NCCL / Ray logs: (pattern, cause, remedy), most specific first.
SIGNATURES: list[Signature] = [
    Signature(r"Address already in use|EADDRINUSE|address already in use",
              "a port is already in use",
              "stop what holds the port (`ss -ltnp`; 08_teardown removes sparkbook's own) or change `ports`"),
    Signature(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|Cannot allocate memory|"
              r"No available memory for the cache blocks|insufficient memory",
              "out of memory",
              "lower serving.gpu_memory_utilization or serving.max_model_len; on GB10 stop other GPU "
              "processes and drop the page cache (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)"),
    Signature(r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|ProcessGroupNCCL.*timed out|"
              r"RayChannelTimeoutError|Timed out waiting for object available",
              "an NCCL collective timed out or hung",
              "run 02_collectives: check NCCL_SOCKET_IFNAME / NCCL_IB_HCA point at the fabric rails, the "
              "rails' MTU, and that RDMA devices reach the container (runtime.rdma)"),
    Signature(r"Unsupported CPU attention configuration|No available attention backend|"
              r"attention.*(not supported|unsupported)|Cannot use FlashAttention|head_size .* not supported",
              "an attention configuration this build does not support",
              "pick another attention backend (VLLM_ATTENTION_BACKEND in serving.env) or an image built for "
              "this GPU"),
    Signature(r"(does not exist|No such file or directory|is not a local folder|Repository Not Found|"
              r"Can't load the configuration|not a valid model identifier)",
              "the model path was not found",
              "put the model at model.path on every node (03_distribute_image checks and copies it)"),
    Signature(r"Tensor parallel size \(\d+\) exceeds available GPUs|cannot be larger than the number of "
              r"available GPUs|placement group.*(infeasible|cannot be scheduled)",
              "the tensor-parallel size exceeds the GPUs the cluster has",
              "every node must join with its GPU (04_ray_cluster's GPU check); or lower "
              "serving.tensor_parallel_size"),
    Signature(r"Capturing CUDA graph|cuda graph capture|Capturing cudagraphs",
              "it stopped while capturing CUDA graphs",
              "add --enforce-eager to serving.extra_args (or lower the capture sizes), then compare with 02"),
    Signature(r"unrecognized arguments|error: argument|invalid choice",
              "vllm serve refused an option",
              "fix serving.extra_args (05's image check lists the options this vLLM knows)"),
]


def match_signature(text: str) -> Match | None:
    """The first known signature in ``text``: (cause, evidence line, remedy). For the CUDA graph
    capture, only when it is the last thing the log says (a hang, not a passing phase)."""
    for sig in SIGNATURES:
        lines = [ln for ln in text.splitlines() if re.search(sig.pattern, ln)]
        if not lines:
            continue
        if "CUDA graph" in sig.cause:
            tail = [ln for ln in text.splitlines() if ln.strip()][-1:]
            if not any(re.search(sig.pattern, ln) for ln in tail):
                continue
        return Match(sig.cause, lines[-1].strip()[-300:], sig.remedy)
    return None


def collect_logs(params: Params, cluster: Cluster, run_dir: Path, containers: list[str] | None = None,
                 tag: str = "") -> dict[str, Path]:
    """Every node's sparkbook container logs, vllm serve's log, `ray status` and process list into
    ``run_dir/logs/<node>/`` (before anything is removed); ``tag`` prefixes the files' names."""
    names = containers or [RAY_CONTAINER, params.runtime.container_name]
    out = {}
    for node, r in cluster.run(script("collect_logs.sh", RAY_CONTAINER, SERVE_LOG, *names),
                               timeout=60).items():
        folder = run_dir / "logs" / node
        folder.mkdir(parents=True, exist_ok=True)
        sections = parse_sections(r.stdout) if r.ok else {"error": r.summary()}
        for key, text in sections.items():
            # a container's log is kept even when empty (it said nothing); absent ones are skipped
            if "No such container" in text[:200] or not (text.strip() or key.startswith("docker logs")):
                continue
            fname = re.sub(r"[^A-Za-z0-9_.-]+", "_", key.replace("docker logs ", "")) + ".log"
            (folder / (f"{tag}-{fname}" if tag else fname)).write_text(text)
        out[node] = folder
    return out


def diagnose(params: Params, cluster: Cluster, run_dir: Path) -> list[Diagnosis]:
    """Collect every node's logs, then name the likely cause per node from known signatures."""
    found = []
    for node, folder in collect_logs(params, cluster, run_dir).items():
        text = "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob("*.log"))
                         if not p.name.startswith("previous-") and p.name != "processes.log")
        hit = match_signature(text)
        if hit:
            found.append(Diagnosis(node, hit.cause, hit.evidence, hit.remedy, str(folder)))
    return found
