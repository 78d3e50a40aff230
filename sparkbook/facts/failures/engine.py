"""The failures of the serving engine and its executor: vLLM's configuration and start-up, Ray's
placement and workers, SGLang's scheduler.

Standard library only.
"""

from __future__ import annotations

import re

from .kinds import SERVING, PROGRESS, sig

SIGNATURES = [
    sig("nnodes-world-size",
        [r"--nnodes \d+ must evenly divide the total world size",
         r"nnodes.{0,40}must (?:evenly )?divide .{0,40}world size",
         r"world.size.{0,40}(?:not divisible|must be divisible) by.{0,20}nnodes"],
        "the number of nodes (`--nnodes`) does not divide vLLM's world size (tensor x pipeline x "
        "data parallel size): some node would get a fraction of the ranks",
        "make serving.tensor_parallel_size x pipeline_parallel_size a multiple of the number of "
        "nodes serving (one rank per GB10), or serve on fewer nodes", phase="config"),
    sig("ray-version-mismatch",
        [r"Version mismatch: The cluster was started with"],
        "the nodes run different Ray or Python versions: their images differ",
        "run the same image on every node (03_distribute_image.ipynb copies it; 04_ray_cluster.ipynb "
        "compares the nodes' images)", phase="ray", steps=("04",) + SERVING,
        reason="version", fix="version"),
    sig("ray-node-dead",
        [r"has been marked dead because the (?:detector|monitor) has missed too many heartbeats",
         r"mistakenly been marked (?:as )?dead",
         r"because its (?:owner's )?node has died|Owner's node has crashed",
         r"NodeDiedError"],
        "a node left the Ray cluster: its heartbeats stopped (the fabric link was cut or went "
        "down, the node rebooted, or its raylet was killed, e.g. out of memory)",
        "check the rails between the nodes (`ip link`, `ibdev2netdev`; 01_preflight.ipynb) and the "
        "lost node's `dmesg` for OOM kills, then restart serving (05_serve.ipynb)", phase="runtime",
        steps=("04",) + SERVING,
        reason="transient", fix="restart"),
    sig("ray-placement-group",
        [r"Waiting for creating a placement group", r"cannot be scheduled right now",
         r"No available node types can fulfill resource request",
         r"Cannot provide a placement group", r"pending placement groups",
         r"placement group.{0,80}infeasible", r"Current node has no \w+ available",
         r"is not included in a placement group"],
        "Ray cannot place vLLM's workers: the cluster has fewer free GPUs than the world size "
        "(a node joined without its GPU, or not at all), or a bundle is pinned to an address Ray "
        "does not know (VLLM_HOST_IP differs from the address the node registered)",
        "`ray status` on the head must list every node with its GPU (04_ray_cluster.ipynb); set "
        "VLLM_HOST_IP and `ray start --node-ip-address` to the same fabric address on each node",
        phase="ray", cleared_by=PROGRESS),
    sig("tp-exceeds-gpus",
        [r"Tensor parallel size \(\d+\) (?:exceeds available GPUs|cannot be larger than the number "
         r"of available GPUs)",
         r"tensor_parallel_size=\d+ is bigger than a reserved number of",
         r"world_size \(\d+\) is less than than max local gpu count",
         r"local_world_size \(\d+\) must be less than or equal to the number of visible devices",
         r"number of required \w+ exceeds the total number of available \w"],
        "the tensor-parallel size exceeds the GPUs the cluster has",
        "every node must join with its GPU (04_ray_cluster.ipynb's GPU check); or lower "
        "serving.tensor_parallel_size", phase="ray", cleared_by=PROGRESS),
    sig("ray-unsupported-platform",
        [r"current platform \S+ does not support ray"],
        "this vLLM build's platform cannot run the Ray executor (vLLM for CPU has no Ray device)",
        "serve with the mp executor (serving.executor: mp), or an image whose vLLM runs Ray on this "
        "platform", phase="ray",
        reason="version", fix="version"),
    sig("attention-unsupported",
        [r"No (?:valid|available) attention backend",
         r"Selected backend \S+ is not valid for this configuration",
         r"Unsupported CPU attention configuration",
         r"Head size \d+ is not supported by",
         r"attention backend.{0,80}(?:is not supported|not valid)"],
        "an attention configuration this build does not support",
        "pick another attention backend (VLLM_ATTENTION_BACKEND in serving.env, or "
        "--attention-backend) or an image built for this GPU", phase="weights",
        reason="version", fix="setting"),
    sig("cuda-graph-hang",
        [r"Capturing CUDA graph|Capturing cudagraphs|cuda graph capture"], flags=re.I,
        cause="it stopped while capturing CUDA graphs",
        remedy="add --enforce-eager to serving.extra_args (or lower the capture sizes), then "
        "compare with 02_collectives.ipynb", phase="graph capture", hang=True),
    sig("unrecognized-arguments",
        [r"error: unrecognized arguments", r"error: argument -", r"invalid choice: ",
         r"error: the following arguments are required"],
        "vllm serve refused an option",
        "fix serving.extra_args (05_serve.ipynb's image check lists the options this vLLM knows)",
        phase="config",
        reason="version", fix="setting"),
    sig("config-rejected",
        [r"validation errors? for \w*Config", r"Value error, "],
        "vLLM refused its configuration (the evidence line names the setting)",
        "fix the setting it names in serving (05_serve.ipynb's image check lists what this vLLM "
        "accepts)",
        phase="config"),
]
