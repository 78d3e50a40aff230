"""The commands that start the serving containers, as argument lists: ``ray start`` and
``vllm serve`` in the serving image, the ``docker run`` around them, and the fingerprint each
container carries (a change means a restart).

Executor ``ray``: one Ray container per node (head first, workers join on its fabric address), then
``vllm serve --distributed-executor-backend ray`` inside the head's container. Executor ``mp``: one
``vllm serve`` container per node (``--nnodes/--node-rank``, ``--headless`` on the workers, which
start first).
"""

from __future__ import annotations

import hashlib
import json
import os

from ..params import Node, Params
from ..redact import mask
from ..remote import REMOTE_DIR, command_line
from ..tables import Table
from .containers import docker_run, fabric_env

RAY_CONTAINER = "sparkbook-ray"
LOG_DIR = f"{REMOTE_DIR}/logs"          # on every node, mounted into the containers
ENV_FILE = f"{REMOTE_DIR}/secrets.env"  # the HF token, mode 600, removed once the container runs
SERVE_LOG = f"{LOG_DIR}/vllm-serve.log"  # ray executor: vllm serve's output in the head container
FINGERPRINT = "sparkbook.fingerprint"   # the label holding a container's fingerprint
# vllm serve's processes in the Ray container; the brackets keep a process whose own command line
# holds the pattern (a shell running pkill, a script given it as an argument) from matching itself
SERVE_PATTERN = "[v]llm serve"
# vllm serve's engine processes (their title: VLLM::EngineCore...). The engine is the Ray driver that
# owns vLLM's Ray workers: left behind by a vllm serve that was killed, it keeps their GPUs (the
# placement group), and the next start waits for them forever.
ENGINE_PATTERN = "[V]LLM::"
SERVE_FP = "SPARKBOOK_SERVE_FINGERPRINT"  # vllm serve's fingerprint, in its environment (Ray)


def serve_env(params: Params, node: Node) -> dict[str, str]:
    """What every serving container needs besides the fabric binding (see :func:`fabric_env`):
    vLLM's own address on the fabric, Ray's memory monitor off (on GB10 the unified memory is the
    GPU's, and the monitor kills workers that hold the model), then the parameters' extras."""
    return {"VLLM_HOST_IP": node.fabric_address, "RAY_memory_monitor_refresh_ms": "0",
            **params.serving.env}


def container_env(params: Params, node: Node) -> dict[str, str]:
    """Everything a serving container gets in its environment, the fabric binding included."""
    return {**fabric_env(params, node), **serve_env(params, node)}


def serve_args(params: Params, node: Node) -> list[str]:
    """``vllm serve`` for ``node``: on the head only with the Ray executor, on every node with mp."""
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
        args += ["--host", "0.0.0.0", "--port", str(p.ports.api)]
    return args + list(s.extra_args)


def ray_args(params: Params, node: Node) -> list[str]:
    """``ray start --block`` for ``node``: the head listens on its fabric address, workers join it."""
    args = ["ray", "start", "--block", "--node-ip-address", node.fabric_address,
            "--num-gpus", str(params.gpus_of(node) if params.runtime.gpus else 0),
            "--object-store-memory", str(int(params.serving.ray_object_store_gb * 1e9)),
            "--disable-usage-stats"]
    if node.role == "head":
        return args + ["--head", "--port", str(params.ports.ray), "--dashboard-host", "0.0.0.0",
                       "--dashboard-port", str(params.ports.dashboard)]
    return args + ["--address", f"{params.head.fabric_address}:{params.ports.ray}"]


def token(params: Params) -> str | None:
    """The Hugging Face token from this machine's environment (never printed)."""
    return os.environ.get(params.model.hf_token_env) or None


def mounts(params: Params) -> list[str]:
    out = [f"{params.model.path}:{params.model.path}:ro", f"{LOG_DIR}:{LOG_DIR}"]
    if params.runtime.hf_cache:
        out.append(f"{params.runtime.hf_cache}:/root/.cache/huggingface")
    return out


def container_name(params: Params, ray: bool) -> str:
    """The name of the Ray container (``ray``) or of vllm serve's."""
    return RAY_CONTAINER if ray else params.runtime.container_name


def container_command(params: Params, node: Node, ray: bool | None = None) -> list[str]:
    """The ``docker run`` of ``node``'s container: Ray's (``ray``) or vllm serve's (by default,
    the one the executor starts)."""
    ray = params.serving.executor == "ray" if ray is None else ray
    inner = ray_args(params, node) if ray else serve_args(params, node)
    labels = {FINGERPRINT: fingerprint(params, node, ray)}
    return docker_run(params, node, container_name(params, ray), inner, env=serve_env(params, node),
                      mounts=mounts(params), labels=labels, env_file=ENV_FILE if token(params) else None)


def fingerprint(params: Params, node: Node, ray: bool) -> str:
    """A digest of what decides the node's container (Ray's with ``ray``), or vllm serve in the
    head's Ray container: a change means a restart. Ray's leaves out vllm serve's arguments, so
    that a serving change restarts vllm serve, not the Ray cluster."""
    what = {"image": params.runtime.image, "ray": ray_args(params, node) if ray else None,
            "serve": None if ray else serve_args(params, node),
            "env": container_env(params, node), "mounts": mounts(params),
            "runtime": params.runtime.model_dump(), "token": bool(token(params))}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def ray_serve_command(params: Params) -> list[str]:
    """vllm serve in the head's Ray container, its output into a file in the logs folder; its
    fingerprint in its environment (read back by :func:`sparkbook.serving.deploy.serving_fingerprint`)."""
    inner = command_line(serve_args(params, params.head)) + f" > {SERVE_LOG} 2>&1"
    return ["docker", "exec", "-d", "-e", f"{SERVE_FP}={fingerprint(params, params.head, False)}",
            RAY_CONTAINER, "bash", "-c", inner]


def serving_container(params: Params) -> str:
    """The container vLLM's API runs in: the head's Ray container, or vllm serve's own (mp)."""
    return container_name(params, params.serving.executor == "ray")


def watched_nodes(params: Params) -> list[Node]:
    """The nodes with a vllm serve container to watch: the head (Ray), every serving node (mp)."""
    return [params.head] if params.serving.executor == "ray" else params.serving_nodes


def groups(nodes: list[Node], ray: bool) -> list[list[Node]]:
    """The order containers start in. Ray: the head first, then the workers together. mp: the
    workers together, then the head."""
    head = [n for n in nodes if n.role == "head"]
    workers = [n for n in nodes if n.role != "head"]
    return [g for g in ([head, workers] if ray else [workers, head]) if g]


def shown(cmd: list[str] | str) -> str:
    """A command as a person may copy it: quoted, with any secret value masked."""
    return mask(command_line(cmd))


def commands_table(params: Params, ray_only: bool = False) -> Table:
    """The exact commands, node by node, for a person to rerun by hand (secrets masked)."""
    rows = []
    if params.serving.executor == "ray" or ray_only:
        for n in params.serving_nodes:
            rows.append([n.name, "Ray container", shown(container_command(params, n, ray=True))])
        if not ray_only:
            rows.append([params.head.name, "vllm serve", shown(ray_serve_command(params))])
    else:
        for group in groups(params.serving_nodes, ray=False):
            rows += [[n.name, "vllm serve container", shown(container_command(params, n, ray=False))]
                     for n in group]
    return Table(["node", "what", "command"], rows, title="commands", max_width=4000)
