"""vLLM, the serving engine: every name sparkbook uses that is vLLM's own, in one file. That is
``vllm serve``'s arguments, the patterns that find its processes, the environment variables it
reads, its health path, the wording of its start-up phases, its metrics series and the name of the
script that inspects it in an image.

``serving.engine`` selects the engine. ``vllm`` is the only one built; a second one (SGLang is the
one owners ask for) would be a sibling module with the same names, and the place that picks between
them would then be written (DEVELOPING.md, "Add an engine"). What is not here is not vLLM's alone:
the OpenAI API paths (``/v1/models``, ``/v1/chat/completions``) are the API's, which other engines
serve too. The Ray cluster is sparkbook's (``commands.ray_args``), and the secrets file is
sparkbook's too. The failure signatures are the field's, per engine in their text
(``facts/known_failures.py``). The memory rule is in ``facts/memfit.py``, because vLLM's
``--gpu-memory-utilization`` is what sparkbook asks owners to size.
"""

from __future__ import annotations

import re
from typing import Callable

from ..params import Node, Params

NAME = "vllm"     # serving.engine's value; also the stem of the serve log (nodes/workdir.py)
TITLE = "vLLM"
# vLLM's OpenAI server requires this key on /v1 when the variable is set (vllm/envs.py, read by the
# API server as --api-key's fallback): the key never appears on a command line
API_KEY = "VLLM_API_KEY"
HOST_IP = "VLLM_HOST_IP"  # the address vLLM's ranks announce to each other (vllm/envs.py)
# vllm serve's processes; the brackets keep a process whose own command line holds the pattern (a
# shell running pkill, a script given it as an argument) from matching itself
SERVE_PATTERN = "[v]llm serve"
# vllm serve's engine processes (their title: VLLM::EngineCore...). The engine is the Ray driver that
# owns vLLM's Ray workers: left behind by a vllm serve that was killed, it keeps their GPUs (the
# placement group), and the next start waits for them forever.
ENGINE_PATTERN = "[V]LLM::"
ENGINE_TITLE = "VLLM::EngineCore"  # the engine process's title (setproctitle); nvidia-smi lists it
STALE = r"vllm|VLLM::"  # processes of an earlier vLLM that hold GPU memory (preflight's in-use row)
HEALTH = "/health"      # 200 once the engine is up (vllm/entrypoints/openai/api_server.py)
INSPECT_SCRIPT = "inspect_vllm.py"  # in sparkbook/scripts/: what an image's vLLM accepts

# The benchmark's server series: column -> (sample names, the first present wins; how label sets
# combine). vLLM's names (docs/usage/metrics.md; ``vllm:gpu_cache_usage_perc`` before the V1 engine
# renamed it ``vllm:kv_cache_usage_perc``); label sets (one per engine with data parallel) combine
# as vLLM's Grafana dashboards combine them: counts and counters summed, KV cache use as the most
# loaded engine's (source: github.com/vllm-project/vllm/blob/5836216b154fcb32685152b85bd8d7e1e8c91c04/
# examples/observability/dashboards/grafana/vllm_kv_cache.json). A counter's samples are
# NAME_total; its NAME_created sibling is a timestamp and never read.
METRICS: dict[str, tuple[tuple[str, ...], Callable[[list[float]], float]]] = {
    "kv_cache_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), max),
    "requests_running": (("vllm:num_requests_running",), sum),
    "requests_waiting": (("vllm:num_requests_waiting",), sum),
    "preemptions": (("vllm:num_preemptions_total",), sum),
    "generation_tokens": (("vllm:generation_tokens_total",), sum),
}

# The likely cause of a hang in each phase of a vLLM start-up (the phases and their lines:
# sparkbook.facts.phases.VLLM).
PHASE_CAUSES = {
    "ray": "Ray could not place the workers: every node must be in the Ray cluster with its GPU "
           "(04_ray_cluster.ipynb); `ray status` shows pending resources",
    "distributed init": "the ranks cannot finish the NCCL/gloo initialisation: the fabric between the nodes "
                        "(02_collectives.ipynb, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on the rails, MTU, a "
                        "firewall) or a node that stopped",
    "weights": "loading the weights stopped: a slow or hung disk or network file system, or memory pressure "
               "(on GB10 the page cache competes with the GPU: drop caches)",
    "compile": "torch.compile stopped: add --enforce-eager to serving.extra_args, or clear the compile cache",
    "kv cache": "memory profiling or the KV cache allocation hangs: lower serving.gpu_memory_utilization; a "
                "node that stopped responding in a collective (02_collectives.ipynb)",
    "graph capture": "CUDA graph capture hangs: add --enforce-eager to serving.extra_args",
    "api": "the API server started but does not answer: a port or address problem (ports.api, a firewall "
           "between this machine and the head)",
}
# Lines that say vLLM is waiting, not working: they repeat while a start-up hangs (a placement
# group that never fits, a rank that stopped), so they are no progress.
WAITING = re.compile(r"Waiting for creating a placement group|No available shared memory broadcast block|"
                     r"[Ss]till waiting|[Ww]aiting for .* (to|be) (start|ready|join|finish)")
# What vLLM says it was started with, once per start: the arguments that differ from its defaults
# (vllm/entrypoints/utils.py, log_non_default_args: "non-default args: {...}", a dict's repr) and the
# engine's configuration ("Initializing a V1 LLM engine (VERSION) with config: key=value, ..."). Seen
# in vLLM 0.16 on DGX Sparks (../shared/field-samples/vllm-ray-head-startup-1.txt, lines 39 and 50)
# and in vLLM 0.17.1 and 0.32 in the lab.
ARGS_LINE = re.compile(r"non-default args: (\{.*\})\s*$")
ENGINE_LINE = re.compile(r"Initializing a V1 LLM engine \(([^)]*)\) with config: (.*?)\s*$")
# the engine's settings that 05 records from that line and holds to the plan's
ENGINE_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_seq_len",
               "dtype", "quantization", "kv_cache_dtype", "enforce_eager", "load_format",
               "enable_prefix_caching", "enable_chunked_prefill", "served_model_name", "device_config")
# the plan's value of an engine setting (a key of ENGINE_KEYS) -> the argument that sets it
ENGINE_ARGS = {"tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
               "max_seq_len": "max_model_len"}


def asked(args: list[str]) -> dict[str, str | bool]:
    """``vllm serve``'s arguments by the names vLLM logs them under (argparse's): ``--max-model-len
    2048`` is ``max_model_len: "2048"``, a flag without a value ``True``, ``--no-X`` ``X: False``;
    the model, vllm serve's positional argument, is both ``model_tag`` and ``model``."""
    rest = args[2:] if args[:2] == ["vllm", "serve"] else list(args)
    out: dict[str, str | bool] = {}
    if rest and not rest[0].startswith("-"):
        out["model_tag"] = out["model"] = rest.pop(0)
    i = 0
    while i < len(rest):
        flag, eq, val = rest[i].partition("=")
        name = flag.lstrip("-").replace("-", "_")
        if eq:
            out[name] = val
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out[name] = rest[i + 1]
            i += 1
        elif name.startswith("no_"):
            out[name[3:]] = False
        else:
            out[name] = True
        i += 1
    return out


START_CAUSE = ("vLLM started but its log says nothing yet: the image's entrypoint or the command "
               "(serving.extra_args), or a node that cannot start Python at all")


def serve_args(params: Params, node: Node, bind: str) -> list[str]:
    """``vllm serve`` for ``node``: on the head only with the Ray executor, on every node with mp;
    the head's API on ``bind``. Called by the serving plan, which the rest of sparkbook reads."""
    s, p = params.serving, params
    args = ["vllm", "serve", p.model.path, "--tensor-parallel-size", str(s.tensor_parallel_size),
            "--pipeline-parallel-size", str(s.pipeline_parallel_size),
            "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    if s.served_model_name:
        args += ["--served-model-name", s.served_model_name]
    if s.max_model_len:
        args += ["--max-model-len", str(s.max_model_len)]
    if s.reasoning_parser:
        args += ["--reasoning-parser", s.reasoning_parser]
    if s.tool_call_parser:
        args += ["--tool-call-parser", s.tool_call_parser]
        if "--enable-auto-tool-choice" not in s.extra_args:
            args.append("--enable-auto-tool-choice")
    if s.executor == "ray":
        args += ["--distributed-executor-backend", "ray"]
    elif len(p.serving_nodes) > 1:
        rank = p.serving_nodes.index(node)
        args += ["--distributed-executor-backend", "mp", "--nnodes", str(len(p.serving_nodes)),
                 "--node-rank", str(rank), "--master-addr", p.head.fabric_address,
                 "--master-port", str(p.ports.master)]
        if rank:
            args.append("--headless")
    if node.role == "head":
        args += ["--host", bind, "--port", str(p.ports.api)]
    return args + list(s.extra_args)


def serve_env(node: Node) -> dict[str, str]:
    """What vLLM reads from the environment of every serving container: its own address on the
    fabric."""
    return {HOST_IP: node.fabric_address}
