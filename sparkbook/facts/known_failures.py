"""The table of known failures that sparkbook.facts.signatures matches logs against: each a
name, the patterns of its log lines, its cause and remedy, the start-up phase and the steps whose
logs can hold it. Most specific first: a line belongs to the first signature that matches it.
A new signature goes here, with a real line in tests/fixtures/logs/ (DEVELOPING.md's recipe).

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


# The steps whose logs a signature can appear in ("02" the all-reduce, "04" the Ray cluster,
# "05" vLLM's start-up, "06"/"07" vLLM under load); ``match(text, step=...)`` keeps those.
ALL_STEPS = ("02", "04", "05", "06", "07")
SERVING = ("05", "06", "07")

# The phase of vLLM's start-up a signature belongs to, in start-up order ("runtime" when a served
# engine fails later, "any" when it can happen at any time).
PHASES = ("container", "ray", "config", "distributed init", "weights", "kv cache", "graph capture",
          "runtime", "any")

# The classes of a signature's cause and of its remedy, for tools that act on a finding
# (`sparkbook diagnose --json`): what failed, and what kind of action mends it.
REASONS = ("hardware", "fabric", "configuration", "version", "resource", "transient")
FIXES = ("setting", "version", "restart", "reboot", "power-cycle", "reseat-cable")

# Lines that show vLLM's start-up went on: a warning that something *may* fail is void once one
# of these follows it.
PROGRESS = r"(world_size=\d+ rank=\d+|Loading weights took|Model loading took|Loading safetensors|" \
           r"Available KV cache memory|Graph capturing finished|init engine .{0,200}? took|" \
           r"Starting vLLM API server|Application startup complete)"


@dataclass(frozen=True)
class Signature:
    """One known failure: what its log lines look like, what causes it and what to do."""
    name: str
    patterns: tuple[re.Pattern, ...]
    cause: str
    remedy: str
    phase: str = "any"
    steps: tuple[str, ...] = SERVING
    cleared_by: re.Pattern | None = None  # a later line like this voids it (a warning, not a failure)
    hang: bool = False                    # counts only as the last thing the log says
    detail: re.Pattern | None = None      # a line that says more (NCCL's WARN line, "Last error:")
    reason: str = "configuration"         # the class of its cause (REASONS)
    fix: str = "setting"                  # the class of its remedy (FIXES)
    catch_all: bool = False               # names a family of causes, not one (its cause lists them)

    def matches(self, line: str) -> bool:
        return any(p.search(line) for p in self.patterns)


def _sig(name: str, patterns: list[str], cause: str, remedy: str, *, flags: int = 0,
         cleared_by: str | None = None, detail: str | None = None, **kw) -> Signature:
    return Signature(name, tuple(re.compile(p, flags) for p in patterns), cause, remedy,
                     cleared_by=re.compile(cleared_by) if cleared_by else None,
                     detail=re.compile(detail) if detail else None, **kw)


_NCCL_DETAIL = r"NCCL WARN|Last error:|socketProgress|Call to \w+ .{0,300}?failed|NET/IB ?: "
_RAY_UP = r"Ray runtime started|Connected to Ray cluster"

# Most specific first. Causes and remedies are written for a person reading them at a terminal.
SIGNATURES: list[Signature] = [
    _sig("entrypoint-swallowed-command",
         # the first such message of a line only (a later one's words are the first's too), then a
         # word the arguments hold: a program, a script or an option of what was meant to run
         [r"^(?=(?P<head>.*?(?P<at>(?:vllm(?: serve)?|\S\.py): error: unrecognized arguments:)))(?P=head)"
          r".*?[\s'\"](?:(?:serve|ray|start|torchrun|bash|sh|python3?|-c|--head|--block|[^\s'\"]+\.py|"
          r"[^\s'\"]+\.sh)(?=[\s'\"=]|$)|/bin/\S|--rdzv|--nproc[-_]per[-_]node|--address|--num-gpus|"
          r"--node-ip-address)"],
         "a command was swallowed by the image's ENTRYPOINT: what was meant to run (`ray start`, "
         "`torchrun`, a script, or `vllm serve` itself) was appended to the image's own command "
         "(`vllm/vllm-openai` images declare ENTRYPOINT [\"vllm\", \"serve\"]) and vLLM's argument "
         "parser refused it",
         "run the container with an explicit entrypoint for what it runs (`docker run --entrypoint "
         "...`; in sparkbook `runtime.entrypoint`), or drop the repeated `vllm serve` from the "
         "command when the image already starts it", phase="container", steps=ALL_STEPS),
    _sig("command-not-in-image",
         [r"exec: \\?\"?[^\s\"\\:]+\\?\"?: executable file not found in \$PATH",
          r"exec: \\?\"?[^\s\"\\:]+\\?\"?: stat [^:]+: no such file or directory"],
         "the container's command is not in the image (the image lacks the program, or its "
         "ENTRYPOINT is unset so the first argument was taken as the program)",
         "choose an image that holds vLLM, Ray and torchrun (the image check of 04_ray_cluster.ipynb "
         "and 05_serve.ipynb names what is missing), or set the entrypoint (`runtime.entrypoint`)",
         phase="container", steps=ALL_STEPS),
    _sig("no-gpu-in-container",
         [r"Failed to infer device type", r"No platform detected, vLLM is running on UnspecifiedPlatform",
          r"No CUDA GPUs are available", r"Found no NVIDIA driver on your system",
          r"could not select device driver .{0,200}? with capabilities: \[\[gpu\]\]",
          r"CUDA driver initialization failed"],
         "the container sees no GPU (started without the GPU flags, or the NVIDIA container runtime "
         "is missing on the node)",
         "start it with `--gpus all` (runtime.gpus) and check the NVIDIA Container Toolkit on the "
         "node (`docker run --rm --gpus all <image> nvidia-smi`; 01_preflight.ipynb's runtime check)",
         phase="container", steps=ALL_STEPS),
    _sig("gpu-arch-unsupported",
         [r"no kernel image is available for execution on the device",
          r"with CUDA capability sm_\d\w* is not compatible with the current PyTorch installation",
          r"Value 'sm_\d\w*' is not defined for option 'gpu-name'"],
         "the image's PyTorch or kernels were not built for this GPU (GB10 is sm_121: it needs a "
         "CUDA 12.9+/13 build with Blackwell kernels)",
         "use an image built for the GPU (for DGX Spark one built for sm_121, e.g. NVIDIA's vLLM "
         "container or a community Spark image)", phase="container", steps=ALL_STEPS,
         reason="version", fix="version"),
    _sig("nnodes-world-size",
         [r"--nnodes \d+ must evenly divide the total world size",
          r"nnodes.{0,40}must (?:evenly )?divide .{0,40}world size",
          r"world.size.{0,40}(?:not divisible|must be divisible) by.{0,20}nnodes"],
         "the number of nodes (`--nnodes`) does not divide vLLM's world size (tensor x pipeline x "
         "data parallel size): some node would get a fraction of the ranks",
         "make serving.tensor_parallel_size x pipeline_parallel_size a multiple of the number of "
         "nodes serving (one rank per GB10), or serve on fewer nodes", phase="config"),
    _sig("port-in-use",
         [r"Address already in use|EADDRINUSE|address already in use",
          r"Failed to bind to (?:port|address)"],
         "a port is already in use",
         "stop what holds the port (`ss -ltnp`; 08_teardown.ipynb removes sparkbook's own) or change `ports`",
         phase="container", steps=ALL_STEPS,
         reason="resource", fix="setting"),
    _sig("hf-gated-model",
         [r"GatedRepoError", r"Cannot access gated repo", r"You are trying to access a gated repo",
          r"Access to model \S+ is restricted"],
         "the model is gated on the Hugging Face Hub and the container had no token with access to it",
         "accept the model's terms on its Hub page and give the containers a token with access "
         "(HF_TOKEN; 01_preflight.ipynb checks it), or serve a local copy (model.path)", phase="config"),
    _sig("model-not-found",
         [r"Invalid repository ID or local directory specified",
          r"is not a local folder and is not a valid model identifier",
          r"Incorrect path_or_model_id",
          r"is not the path to a directory containing a file named config\.json",
          r"does not appear to have a file named config\.json",
          r"HFValidationError: Repo id must be in the form",
          r"Repository Not Found|RepositoryNotFoundError",
          r"Can't load the configuration of",
          r"No such file or directory: '(?=[^']*')"  # a quote closes it: each run below is read once
          r"(?:[^']*(?:config\.json|\.safetensors)|[^']*tokenizer[^']*)'"],
         "the model path was not found",
         "put the model at model.path on every node (03_distribute_image.ipynb checks and copies it); the "
         "path is the one inside the container (check the mount)", phase="config"),
    _sig("unsupported-architecture",
         [r"Model architectures? \[?[^\]]{0,500}\]? (?:are|is) not supported",
          r"Model architectures? \[[^\]]{0,500}\] failed to be inspected",
          r"Transformers does not recognize this architecture",
          r"GGUF model with architecture \S+ is not supported"],
         "this vLLM (or the transformers inside the image) does not know the model's architecture",
         "use an image whose vLLM supports the model (its model card names the minimum vLLM and "
         "transformers; 05_serve.ipynb's image check lists the image's architectures), or check "
         "`architectures` in the model's config.json", phase="config",
         reason="version", fix="version"),
    _sig("free-memory-at-startup",
         [r"Free memory on device.{0,80}on startup is less than desired GPU memory utilization",
          r"Free memory on device.{0,80}less than desired"],
         "less memory was free when vLLM started than serving.gpu_memory_utilization asks for (a "
         "share of the total memory, not of what is free): on GB10 the page cache and every other "
         "process share the same unified memory",
         "lower serving.gpu_memory_utilization below free/total from the message, stop other GPU "
         "processes (a previous vLLM still running?) and drop the page cache before starting "
         "(`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)", phase="kv cache",
         reason="resource", fix="setting"),
    _sig("kv-cache-too-small",
         [r"KV cache is needed, which is larger than the available KV cache memory",
          r"No available memory for the cache blocks",
          r"larger than the maximum number of tokens that can be stored in KV cache"],
         "the KV cache does not fit: after the weights, the memory left cannot hold one request of "
         "the model's maximum length",
         "lower serving.max_model_len (the message names the longest that fits), raise "
         "serving.gpu_memory_utilization, or use a smaller or more quantised model / an fp8 KV cache",
         phase="kv cache",
         reason="resource", fix="setting"),
    _sig("rdma-memlock",
         [r"Call to ibv_reg_mr\w* failed", r"ibv_\w{1,40}(?:\(\) | )failed.{0,40}Cannot allocate memory"],
         "RDMA could not register (lock) memory: the container's locked-memory limit is too low",
         "start the containers with `--ulimit memlock=-1` and `--cap-add IPC_LOCK` (runtime.rdma) and "
         "check `ulimit -l` inside them", phase="distributed init", steps=ALL_STEPS,
         detail=_NCCL_DETAIL),
    _sig("ray-oom-killer",
         [r"killed due to memory pressure \(OOM\)", r"ray\.exceptions\.OutOfMemoryError",
          r"Task was killed due to the node running low on memory",
          r"which exceeds the memory usage threshold"],
         "Ray's memory monitor killed a worker: on GB10 the memory the GPU uses is host memory too, "
         "so Ray counts the model's weights and KV cache against its threshold",
         "start Ray with RAY_memory_monitor_refresh_ms=0 (or a higher RAY_memory_usage_threshold), "
         "or lower serving.gpu_memory_utilization", steps=("04",) + SERVING,
         reason="resource", fix="setting"),
    _sig("disk-full",
         [r"\[Errno 28\] No space left on device", r"No space left on device \(os error 28\)",
          r"code: 28, kind: StorageFull"],
         "a disk on the node is full: the one holding the model, the Hugging Face cache, Docker's "
         "storage or /tmp (a download, an image or Ray's spill files filled it)",
         "free space on the node (`df -h`; `docker image prune` removes unused images) or point the "
         "model or cache at a bigger disk; 01_preflight.ipynb's model disk and docker disk rows show "
         "what is free",
         steps=ALL_STEPS,
         reason="resource", fix="setting"),
    _sig("out-of-memory",
         [r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
          r"Cannot allocate memory", r"NV_ERR_NO_MEMORY", r"invoked oom-killer|Out of memory: Killed process"],
         "out of memory",
         "lower serving.gpu_memory_utilization or serving.max_model_len; on GB10 stop other GPU "
         "processes and drop the page cache (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)",
         steps=ALL_STEPS,
         reason="resource", fix="setting"),
    _sig("ray-gcs-unreachable",
         [r"Unable to connect to GCS at", r"Failed to connect to GCS",
          r"Failed to get cluster ID from GCS", r"Timed out while waiting for GCS to become available"],
         "a node could not reach the Ray head (GCS): wrong head address, a firewall, or the head's "
         "Ray not running",
         "check the head's Ray container is up and that every node reaches its fabric address on "
         "the Ray port (04_ray_cluster.ipynb; 01_preflight.ipynb's ports check)", phase="ray",
         steps=("04",) + SERVING, cleared_by=_RAY_UP,
         reason="fabric", fix="setting"),
    _sig("ray-version-mismatch",
         [r"Version mismatch: The cluster was started with"],
         "the nodes run different Ray or Python versions: their images differ",
         "run the same image on every node (03_distribute_image.ipynb copies it; 04_ray_cluster.ipynb "
         "compares the nodes' images)", phase="ray", steps=("04",) + SERVING,
         reason="version", fix="version"),
    _sig("ray-node-dead",
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
    _sig("nccl-no-interface",
         [r"Bootstrap : no socket interface found", r"no NCCL_SOCKET_IFNAME interface found"],
         "NCCL found no usable network interface: NCCL_SOCKET_IFNAME names an interface the "
         "container does not have",
         "set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the fabric rail's interface as the "
         "node names it (`ip -br addr`), with the container on the host network",
         phase="distributed init", steps=ALL_STEPS, detail=_NCCL_DETAIL),
    _sig("nccl-timeout",
         [r"Watchdog caught collective operation timeout",
          r"ProcessGroupNCCL.{0,80}(?:timed out|operation timeout)",
          r"NCCL (?:WARN|error).{0,120}[Tt]imeout",
          r"RayChannelTimeoutError|Timed out waiting for object available"],
         "an NCCL collective timed out or hung",
         "run 02_collectives.ipynb: check NCCL_SOCKET_IFNAME / NCCL_IB_HCA point at the fabric rails, the "
         "rails' MTU, and that RDMA devices reach the container (runtime.rdma)",
         phase="runtime", steps=ALL_STEPS, detail=_NCCL_DETAIL,
         reason="fabric", fix="setting"),
    _sig("nccl-error",
         [r"unhandled system error", r"remote process exited or there was a network error",
          r"ncclSystemError|ncclRemoteError|ncclInternalError|ncclUnhandledCudaError|"
          r"NCCL_ERROR_SYSTEM_ERROR",
          r"NCCL error.{0,200}(?:internal error|unhandled cuda error|invalid usage)"],
         "NCCL failed between the nodes: a system call or the network failed (a rail down, RDMA "
         "devices or locked memory missing in the container, a wrong interface), or a peer process "
         "died first (then its own log has the first error)",
         "run 02_collectives.ipynb with NCCL_DEBUG=INFO: the NCCL WARN line before the error names the "
         "call that failed; check the rails, their MTU, `--device /dev/infiniband`, IPC_LOCK and "
         "`--ulimit memlock=-1` on the containers, and the other node's log",
         phase="distributed init", steps=ALL_STEPS, detail=_NCCL_DETAIL,
         reason="fabric", fix="setting", catch_all=True),
    _sig("rendezvous-unreachable",
         [r"The client socket has timed out after \S+ while trying to connect to",
          r"DistNetworkError", r"Gloo connectFullMesh failed",
          r"TCPStore.{0,80}(?:Connection refused|timed out)"],
         "a rank could not reach the rendezvous or its peers (firewall, wrong rail address, the "
         "head's process not started)",
         "check every node reaches the head's fabric address on the rendezvous port (01_preflight.ipynb's "
         "ports check) and that the head's container started (its log)",
         # not 02's: its own diagnosis names the ranks that never joined and the address
         phase="distributed init",
         reason="fabric", fix="setting"),
    _sig("ray-placement-group",
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
    _sig("tp-exceeds-gpus",
         [r"Tensor parallel size \(\d+\) (?:exceeds available GPUs|cannot be larger than the number "
          r"of available GPUs)",
          r"tensor_parallel_size=\d+ is bigger than a reserved number of",
          r"world_size \(\d+\) is less than than max local gpu count",
          r"local_world_size \(\d+\) must be less than or equal to the number of visible devices",
          r"number of required \w+ exceeds the total number of available \w"],
         "the tensor-parallel size exceeds the GPUs the cluster has",
         "every node must join with its GPU (04_ray_cluster.ipynb's GPU check); or lower "
         "serving.tensor_parallel_size", phase="ray", cleared_by=PROGRESS),
    _sig("ray-unsupported-platform",
         [r"current platform \S+ does not support ray"],
         "this vLLM build's platform cannot run the Ray executor (vLLM for CPU has no Ray device)",
         "serve with the mp executor (serving.executor: mp), or an image whose vLLM runs Ray on this "
         "platform", phase="ray",
         reason="version", fix="version"),
    _sig("attention-unsupported",
         [r"No (?:valid|available) attention backend",
          r"Selected backend \S+ is not valid for this configuration",
          r"Unsupported CPU attention configuration",
          r"Head size \d+ is not supported by",
          r"attention backend.{0,80}(?:is not supported|not valid)"],
         "an attention configuration this build does not support",
         "pick another attention backend (VLLM_ATTENTION_BACKEND in serving.env, or "
         "--attention-backend) or an image built for this GPU", phase="weights",
         reason="version", fix="setting"),
    # vLLM and SGLang both print this line once a rank's tensor-parallel group spans nodes, then go
    # on ("Init torch distributed ends"); as the last line of every rank, the hang a DGX Spark pair
    # reported with SGLang's images, while vLLM's ran on the same fabric (source:
    # github.com/MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks/issues/3)
    _sig("cross-node-init-hang",
         [r"Custom ?[Aa]llreduce is disabled because this process group spans across nodes"],
         "the ranks stopped while setting up their communicators across the nodes: each got as far "
         "as the all-reduce of a group that spans the nodes (NCCL had connected over the fabric), "
         "then nothing, and no weights were loaded",
         "run 02_collectives.ipynb with the serving image (NCCL over the rails, its NCCL version), and "
         "NCCL_DEBUG=INFO on every node to see the last channel each built; where the fabric passes, "
         "compare the image's NCCL and engine version with one that starts on it (on a DGX Spark pair "
         "this hang came with one engine's images while another's ran)",
         phase="distributed init", steps=SERVING, hang=True, reason="fabric", fix="version"),
    _sig("cuda-graph-hang",
         [r"Capturing CUDA graph|Capturing cudagraphs|cuda graph capture"], flags=re.I,
         cause="it stopped while capturing CUDA graphs",
         remedy="add --enforce-eager to serving.extra_args (or lower the capture sizes), then "
         "compare with 02_collectives.ipynb", phase="graph capture", hang=True),
    _sig("unrecognized-arguments",
         [r"error: unrecognized arguments", r"error: argument -", r"invalid choice: ",
          r"error: the following arguments are required"],
         "vllm serve refused an option",
         "fix serving.extra_args (05_serve.ipynb's image check lists the options this vLLM knows)",
         phase="config",
         reason="version", fix="setting"),
    _sig("config-rejected",
         [r"validation errors? for \w*Config", r"Value error, "],
         "vLLM refused its configuration (the evidence line names the setting)",
         "fix the setting it names in serving (05_serve.ipynb's image check lists what this vLLM "
         "accepts)",
         phase="config"),
]
