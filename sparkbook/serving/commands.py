"""The builders of the commands that start the serving containers, as argument lists: ``ray
start`` and ``vllm serve`` in the serving image, the ``docker run`` around them, and the fingerprint
each container carries (a change means a restart). They are called by the serving plan
(:mod:`sparkbook.serving.plan`) and nothing else: the rest of sparkbook reads the plan.

Executor ``ray``: one Ray container per node (head first, workers join on its fabric address), then
``vllm serve --distributed-executor-backend ray`` inside the head's container. Executor ``mp``: one
``vllm serve`` container per node (``--nnodes/--node-rank``, ``--headless`` on the workers, which
start first).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import os
import socket

from ..book.redact import mask
from ..nodes import workdir
from ..nodes.remote import ssh_target
from ..nodes.shell import command_line, script
from ..params import Node, Params, secrets_written
from . import vllm as engine
from .containers import docker_run, fabric_env, hf_env, named

FINGERPRINT = "sparkbook.record.fingerprint"   # the label holding a container's fingerprint
SERVE_FP = "SPARKBOOK_SERVE_FINGERPRINT"  # vllm serve's fingerprint, in its environment (Ray)
# Ray's token authentication (Ray 2.52 and later: every Ray service, the dashboard and the Jobs API
# require the token; docs.ray.io, "Ray token authentication"). An older Ray ignores the variable;
# 04 says which it is. The token itself reaches the containers only through the secrets file.
RAY_AUTH = {"RAY_AUTH_MODE": "token"}
RAY_TOKEN = "RAY_AUTH_TOKEN"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def ray_container(params: Params) -> str:
    """The Ray container of this deployment, on every serving node."""
    return named(params, "ray")


def management_address(node: Node) -> str:
    """The address this machine reaches ``node`` on: its host, or the HostName an ssh-config alias
    stands for, as this machine resolves it. An address, not a name: on the node itself its own
    name often resolves to 127.0.1.1 (Debian's /etc/hosts), where nobody else would reach vLLM. A
    name this machine cannot resolve (reached through a jump host) is kept as it is. Resolved once
    per name in a process (the serving plan asks for it at every read, and a name that does not
    resolve can take seconds to say so)."""
    return _address(node.host if node.local else ssh_target(node.host, node.user, node.port)[0])


@functools.lru_cache(maxsize=256)
def _address(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        pass
    for family in (socket.AF_INET, socket.AF_UNSPEC):  # IPv4 first, as the fabric and Ray use
        try:
            return socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)[0][4][0]
        except OSError:
            continue
    return host


def api_bind(params: Params) -> str:
    """The address vLLM's API listens on: ``serving.bind``, else the head's management address."""
    return params.serving.bind or management_address(params.head)


def api_key(params: Params) -> str | None:
    """The API key from this machine's environment (``serving.api_key_env``; masked wherever
    sparkbook writes text, never printed)."""
    name = params.serving.api_key_env
    return (os.environ.get(name) or None) if name else None


def wildcard(address: str) -> bool:
    return address in ("0.0.0.0", "::", "*", "")


def beyond_loopback(address: str) -> bool:
    return address not in LOOPBACK and not address.startswith("127.")


def serve_env(params: Params, node: Node) -> dict[str, str]:
    """What every serving container needs besides the fabric binding (see :func:`fabric_env`):
    the engine's own (its address on the fabric), Ray's memory monitor off (on GB10 the unified
    memory is the GPU's, and the monitor kills workers that hold the model), then the parameters'
    extras but the secrets among them (those go through the secrets file: see :func:`secrets`)."""
    hidden = secrets_written(params)
    return {**engine.serve_env(node), "RAY_memory_monitor_refresh_ms": "0",
            **{k: v for k, v in params.serving.env.items() if k not in hidden}}


def container_env(params: Params, node: Node) -> dict[str, str]:
    """Everything a serving container gets in its environment, the fabric binding included."""
    return {**fabric_env(params, node), **serve_env(params, node)}


def serve_args(params: Params, node: Node) -> list[str]:
    """The engine's serve command for ``node`` (:func:`sparkbook.serving.vllm.serve_args`), its API
    on :func:`api_bind`."""
    return engine.serve_args(params, node, api_bind(params))


def ray_args(params: Params, node: Node) -> list[str]:
    """``ray start --block`` for ``node``: the head listens on its fabric address, workers join it;
    the dashboard and its Jobs API only on the head's loopback (an SSH tunnel reaches them). The
    Ray client server binds where Ray puts it (the node address in recent Ray: ``ray start`` has no
    option for it), behind the token; 04's listeners table shows every address."""
    args = ["ray", "start", "--block", "--node-ip-address", node.fabric_address,
            "--num-gpus", str(params.gpus_of(node) if params.runtime.gpus else 0),
            "--object-store-memory", str(int(params.serving.ray_object_store_gb * 1e9)),
            "--disable-usage-stats"]
    if node.role == "head":
        return args + ["--head", "--port", str(params.ports.ray), "--dashboard-host", "127.0.0.1",
                       "--dashboard-port", str(params.ports.dashboard)]
    return args + ["--address", f"{params.head.fabric_address}:{params.ports.ray}"]


def token(params: Params) -> str | None:
    """The Hugging Face token from this machine's environment (never printed)."""
    return os.environ.get(params.model.hf_token_env) or None


def secrets(params: Params, ray: bool, ray_token: str | None = None) -> dict[str, str]:
    """What a container's secrets file holds: the Hugging Face token; Ray's token for the Ray
    containers (``ray``, given); the API key for vllm serve (mp containers, or vllm serve in the
    head's Ray container: ``ray`` False); and the secrets written in ``serving.env``."""
    out = {**hf_env(token(params)), **{k: params.serving.env[k] for k in secrets_written(params)}}
    if ray and ray_token:
        out[RAY_TOKEN] = ray_token
    key = api_key(params)
    if key and not ray:
        out[engine.API_KEY] = key
    return out


def held_secrets(params: Params, node: Node) -> list[str]:
    """The names of the secrets some process of ``node``'s serving containers must hold: those of
    its container's secrets file and, on the head, vllm serve's (the Ray executor execs it in the
    head's Ray container with its own file)."""
    ray = params.serving.executor == "ray"
    names = set(secrets(params, ray, "-" if ray else None))
    if ray and node.name == params.head.name:
        names |= set(secrets(params, False))
    return sorted(names)


def mounts(params: Params, node: Node) -> list[str]:
    logs = workdir.logs(params, node)
    out = [f"{params.model.path}:{params.model.path}:ro", f"{logs}:{logs}"]
    if params.runtime.hf_cache:
        out.append(f"{params.runtime.hf_cache}:/root/.cache/huggingface")
    return out


def container_name(params: Params, ray: bool) -> str:
    """The name of the Ray container (``ray``) or of vllm serve's."""
    return ray_container(params) if ray else params.runtime.container_name or named(params, engine.NAME)


def container_command(params: Params, node: Node, ray: bool | None = None) -> list[str]:
    """The ``docker run`` of ``node``'s container: Ray's (``ray``) or vllm serve's (by default,
    the one the executor starts). Its secrets come from the secrets file, written for the start."""
    ray = params.serving.executor == "ray" if ray is None else ray
    inner = ray_args(params, node) if ray else serve_args(params, node)
    labels = {FINGERPRINT: fingerprint(params, node, ray)}
    env = {**serve_env(params, node), **(RAY_AUTH if ray else {})}
    has_secrets = ray or bool(secrets(params, False))  # a Ray container always gets Ray's token
    return docker_run(params, node, container_name(params, ray), inner, env=env,
                      mounts=mounts(params, node), labels=labels,
                      env_file=workdir.secrets_path(params, node) if has_secrets else None)


def fingerprint(params: Params, node: Node, ray: bool) -> str:
    """A digest of what decides the node's container (Ray's with ``ray``), or vllm serve in the
    head's Ray container: a change means a restart. Ray's leaves out vllm serve's arguments, so
    that a serving change restarts vllm serve, not the Ray cluster."""
    what = {"image": params.runtime.image, "ray": ray_args(params, node) if ray else None,
            "serve": None if ray else serve_args(params, node),
            "env": {**container_env(params, node), **(RAY_AUTH if ray else {})},
            "mounts": mounts(params, node), "runtime": params.runtime.model_dump(),
            "token": bool(token(params)), "api_key": None if ray else bool(api_key(params)),
            "written": hashlib.sha256(json.dumps({k: params.serving.env[k] for k in secrets_written(params)},
                                                 sort_keys=True).encode()).hexdigest()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def ray_serve_command(params: Params) -> list[str]:
    """vllm serve in the head's Ray container, its output into a file in the logs folder; its
    fingerprint in its environment (read back by :func:`sparkbook.serving.deploy.serving_fingerprint`),
    its secrets (the API key) from the secrets file, written for the start."""
    head = params.head
    inner = command_line(serve_args(params, head)) + f" > {workdir.serve_log(params, head)} 2>&1"
    env_file = ["--env-file", workdir.secrets_path(params, head)] if secrets(params, False) else []
    return ["docker", "exec", "-d", "-e", f"{SERVE_FP}={fingerprint(params, head, False)}", *env_file,
            ray_container(params), "bash", "-c", inner]


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


# A service container (`sparkbook service install`) carries this label, valued with the image ID
# it pins; Docker's restart policy brings it back after a crash and at every start of dockerd.
SERVICE = "sparkbook.service"
SERVICE_OPTIONS = ["--restart", "unless-stopped", "--log-driver", "local",  # logs kept: 5 files of 100 MB
                   "--log-opt", "max-size=100m", "--log-opt", "max-file=5"]


def service_env(params: Params, node: Node) -> dict[str, str]:
    """What the service supervisor (``scripts/service.sh``) reads: its role, Ray's start and the
    head's Ray address, and on the head vllm serve's command, the number of nodes to wait for and
    vllm serve's fingerprint (read back as 05's, so 05 keeps a service it would have started)."""
    head = params.head
    env = {"SPARKBOOK_SERVICE_ROLE": "head" if node.name == head.name else "worker",
           "SPARKBOOK_SERVICE_RAY": command_line(ray_args(params, node)),
           "SPARKBOOK_SERVICE_HEAD": f"{head.fabric_address}:{params.ports.ray}"}
    if node.name == head.name:
        env.update({"SPARKBOOK_SERVICE_SERVE": command_line(serve_args(params, head)),
                    "SPARKBOOK_SERVICE_NODES": str(len(params.serving_nodes)),
                    SERVE_FP: fingerprint(params, head, False)})
    return env


def service_command(params: Params, node: Node, image_id: str) -> list[str]:
    """The ``docker run`` of ``node``'s service container: 04's Ray container (its name, its
    environment, its fingerprint label) on the image pinned by ID, restarted unless stopped, with
    the supervisor as its program. Only the model (and the Hugging Face cache) are mounted: the
    working folder lives in /tmp, which a boot may empty. Its secrets come from the secrets file
    (:func:`service_secrets`), written for the start."""
    supervisor = script("service.sh")
    labels = {FINGERPRINT: fingerprint(params, node, True), SERVICE: image_id}
    env = {**serve_env(params, node), **RAY_AUTH, **service_env(params, node)}
    kept = [m for m in mounts(params, node) if not m.startswith(workdir.logs(params, node) + ":")]
    return docker_run(params, node, ray_container(params), ["bash", "-c", supervisor.text, supervisor.name],
                      env=env, mounts=kept, labels=labels, env_file=workdir.secrets_path(params, node),
                      image=image_id, options=SERVICE_OPTIONS)


def service_secrets(params: Params, node: Node, ray_token: str) -> dict[str, str]:
    """What ``node``'s service container holds as secrets: Ray's token, and on the head also vllm
    serve's (the API key): one container runs both."""
    return {**secrets(params, True, ray_token), **(secrets(params, False) if node.name == params.head.name else {})}


def shown(cmd: list[str] | str) -> str:
    """A command as a person may copy it: quoted, with any secret value masked."""
    return mask(command_line(cmd))
