"""The failures of the serving engine and its executor: vLLM's configuration and start-up, Ray's
placement and workers, SGLang's scheduler.

Standard library only.
"""

from __future__ import annotations

import re

from .kinds import PROGRESS, SERVING, sig

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

# Mined from public threads (2026-12-06), as in fabric.py.
SIGNATURES += [
    sig("ray-worker-died",
        [(r"RayWorkerProc rank=\[[^\]]{0,40}\] died unexpectedly", "eugr/spark-vllm-docker#257"),
         (r"A worker died or was killed while executing a task", "eugr/spark-vllm-docker#257",
          "vllm-project/vllm#859"),
         (r"The actor died unexpectedly before finishing this task", "verl-project/verl#4921"),
         (r"The actor is dead because its worker process has died", "verl-project/verl#4921",
          "hkust-nlp/simpleRL-reason#98")],
        "a Ray worker that ran a rank of the engine died: on GB10 most often the kernel's OOM killer (the "
        "GPU's memory is the host's), else a crash (SIGSEGV, SIGBUS from a small /dev/shm) or Ray stopped "
        "under it; the engine then stops",
        "read `dmesg` on the node that lost the worker (OOM kills, NVRM lines) and the worker's own log "
        "(/tmp/ray/session_latest/logs/worker-*.err in its Ray container); lower "
        "serving.gpu_memory_utilization, stop what else runs there, drop the page cache, then run 05_serve.ipynb again",
        phase="runtime", steps=("04",) + SERVING, reason="resource", fix="restart"),
    sig("ray-driver-not-a-node",
        [(r"Ray does not allocate any GPUs on the driver node", "vllm-project/vllm#12983",
          "vllm-project/vllm#2406")],
        "vLLM's driver is not on a node Ray knows by its address: VLLM_HOST_IP (or the address vLLM "
        "picked) differs from the one the node registered with `ray start --node-ip-address`, so the "
        "placement group has no worker on the driver's node",
        "set VLLM_HOST_IP and `ray start --node-ip-address` to the same fabric address on each node and "
        "start `vllm serve` in the head's Ray container (04_ray_cluster.ipynb does both); `ray status` "
        "lists the addresses",
        phase="ray", reason="configuration", fix="setting"),
    sig("shm-broadcast-stall",
        [(r"No available shared memory broadcast block found in \d+ seconds", "eugr/spark-vllm-docker#367",
          "eugr/spark-vllm-docker#348", "vllm-project/vllm#51986")],
        "the engine waited a minute and more for its workers to take the next step, and the log ends "
        "there: a worker (often the other node's) hangs in a collective, a kernel autotune or a CUDA "
        "graph, or died without the engine seeing it; while workers compile the same line comes and "
        "goes, so it names a hang only as the log's last word",
        "read the other node's log for the worker's last line or a traceback (`dmesg` for an OOM kill), "
        "run 02_collectives.ipynb with the serving image, and try --enforce-eager in serving.extra_args",
        phase="runtime", hang=True, cleared_by=PROGRESS, reason="transient", fix="restart"),
    sig("max-model-len-exceeds",
        [(r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
          "vllm-project/vllm#19660", "EvolvingLMMs-Lab/LongVT#9", "xorbitsai/inference#1715")],
        "serving.max_model_len is longer than the model's configuration allows (its "
        "max_position_embeddings)",
        "lower serving.max_model_len to the derived length the message names (or use the model's "
        "RoPE scaling configuration)",
        phase="config", reason="configuration", fix="setting"),
    sig("pp-not-supported",
        [(r"Pipeline parallelism is not supported for this model", "vllm-project/vllm#16231")],
        "this vLLM cannot split this model into pipeline stages",
        "serve it with tensor parallel across the nodes (serving.pipeline_parallel_size 1), or use an "
        "image whose vLLM supports pipeline parallel for the model",
        phase="config", reason="version", fix="setting"),
    sig("quant-unsupported-gpu",
        [(r"(?:quantization method \S+|Quantization scheme) is not supported for .{0,12}the current GPU",
          "vllm-project/vllm#14040", "vllm-project/vllm#4327")],
        "the checkpoint's quantization needs a GPU capability this vLLM does not find here (on GB10, "
        "capability 12.1: a vLLM that does not count it as new enough)",
        "use an image whose vLLM knows the GPU (built for sm_121 on a Spark), or a checkpoint in another "
        "quantization",
        phase="weights", reason="version", fix="version"),
    sig("parser-unknown",
        [(r"invalid tool call parser: \S+", "vllm-project/recipes#51"),
         (r"[Rr]easoning parser '\S+' not found", "vllm-project/vllm-ascend#14573"),
         (r"argument --(?:tool-call|reasoning)-parser: invalid choice", "zai-org/GLM-4.5#16")],
        "this vLLM has no tool-call or reasoning parser of that name (added in a later release, spelled "
        "another way, or a plugin not loaded on this node)",
        "pick a parser from the list the message gives (05_serve.ipynb's image check lists them) or an "
        "image whose vLLM has it",
        phase="config", reason="version", fix="setting"),
    sig("sglang-watchdog-timeout",
        [(r"Watchdog timeout \(self\.watchdog_timeout=\d+", "sgl-project/sglang#7783",
          "UCSB-AI/Soft-Thinking#10")],
        "an SGLang scheduler made no progress for its watchdog's timeout and was stopped: a forward "
        "step or a collective hangs (across nodes most often NCCL, or a CUDA graph replay)",
        "run 02_collectives.ipynb with the SGLang image, then try --disable-cuda-graph; a py-spy in the "
        "image lets the watchdog dump where it hung",
        phase="runtime", reason="transient", fix="setting"),
    sig("sglang-memory-unbalanced",
        [(r"The memory capacity is unbalanced\. Some GPUs may be occupied by other processes",
          "sgl-project/sglang#5416", "al-engr.com/minimax-sglang-debug.html")],
        "one rank had much less free GPU memory than another when SGLang started: on GB10 a process or "
        "the memory of an earlier run still holds one node's unified memory, or its page cache",
        "stop what else uses memory on that node (nvidia-smi, `docker ps`), drop its page cache; "
        "memory an earlier crashed run left allocated needs a reboot of that node",
        phase="kv cache", reason="resource", fix="reboot"),
    # wrappers: each says only that the engine failed, the cause is above it (or in a worker's log)
    sig("engine-failed-see-above",
        [(r"Engine core initialization failed\. See root cause above", "spark-arena/sparkrun#174",
          "vllm-project/vllm#17939"),
         (r"EngineCore failed to start", "aws-samples/aws-do-eks#51", "aws-samples/aws-do-eks#50"),
         (r"WorkerProc (?:initialization failed due to an exception|failed to start)", "QwenLM/Qwen3-VL#1796",
          "NVIDIA/nccl#2101"),
         (r"Scheduler hit an exception", "sgl-project/sglang#5602", "sgl-project/sglang#3820",
          "sgl-project/sglang#16015", "sgl-project/sglang#5416"),
         (r"Received sigquit from a child process", "sgl-project/sglang#5602", "UCSB-AI/Soft-Thinking#10")],
        "the engine failed to start or a rank of it raised: these lines only say so, the cause is the "
        "first error above them or in another node's or worker's log (with nothing there: the kernel's "
        "OOM killer, or serving.gpu_memory_utilization set too high)",
        "read the first ERROR or traceback above the line, and every node's log (logs/<node>/ in the "
        "run folder); `dmesg` for an OOM kill",
        catch_all=True),
]
