"""What every sparkbook container on a node gets: host networking and IPC, the GPUs and RDMA
devices, the fabric environment that points NCCL, gloo, torch and UCX at the node's rails, and an
explicit entrypoint.

Serving images derived from ``vllm/vllm-openai`` declare ``ENTRYPOINT ["vllm", "serve"]``: whatever
follows the image name in ``docker run`` is appended to it, so ``ray start``, ``torchrun`` or the
inspection script would become arguments of ``vllm serve`` (which fails with "unrecognized
arguments"). Every container sparkbook starts therefore names its program as the entrypoint
(``--entrypoint ray`` + ``start ...``), or runs it through ``runtime.entrypoint`` when the
parameters name one (an image whose entrypoint wrapper must run first, such as NGC's)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

from ..nodes import workdir
from ..nodes.remote import Cluster
from ..params import Node, Params


def fabric_env(params: Params, node: Node) -> dict[str, str]:
    """Environment that binds collective traffic to the node's fabric rails (the first rail for
    socket-based bootstrap, every rail's HCA for RDMA)."""
    env: dict[str, str] = {}
    if node.rails:
        first = node.rails[0]
        env.update({"NCCL_SOCKET_IFNAME": first.interface, "GLOO_SOCKET_IFNAME": first.interface,
                    "TP_SOCKET_IFNAME": first.interface, "UCX_NET_DEVICES": first.interface})
        hcas = [r.hca for r in node.rails if r.hca]
        if hcas:
            env["NCCL_IB_HCA"] = ",".join(hcas)
            env["NCCL_IB_GID_INDEX"] = nccl_gid_index(params)[0]
    return env


def nccl_gid_index(params: Params) -> tuple[str, str]:
    """The RoCE GID index NCCL gets in every sparkbook container, and the setting it comes from:
    ``serving.env``'s NCCL_IB_GID_INDEX where the parameters set it (the serving containers' env
    goes after the fabric binding, so it wins), else ``runtime.nccl_ib_gid_index``."""
    if "NCCL_IB_GID_INDEX" in params.serving.env:
        return params.serving.env["NCCL_IB_GID_INDEX"], "serving.env.NCCL_IB_GID_INDEX"
    return str(params.runtime.nccl_ib_gid_index), "runtime.nccl_ib_gid_index"


# Every sparkbook container carries this label, valued with its deployment's name (``params.name``):
# teardown and every filter look for ``sparkbook=<name>``, so that two deployments on the same
# nodes never touch each other's containers.
LABEL = "sparkbook"


def deployment_label(params: Params) -> str:
    """``sparkbook=<deployment>``: the label of this deployment's containers, and the filter."""
    return f"{LABEL}={params.name}"


OWNER = "sparkbook.owner"  # valued with the SSH login that started the container


def owner_label(node: Node) -> str:
    """``sparkbook.owner=<login>``: who started a container on ``node``. Two operators who log in
    as different users and run the same deployment name never replace or remove each other's
    containers (their locks live in their own working folders)."""
    return f"{OWNER}={workdir.login(node)}"


def named(params: Params, role: str) -> str:
    """The name of this deployment's container for ``role`` (``ray``, ``vllm``, ``collectives``,
    ``inspect``...): ``sparkbook-<deployment>-<role>``."""
    return f"sparkbook-{params.name}-{role}"


def docker_run(params: Params, node: Node, name: str, command: Sequence[str], *,
               env: Mapping[str, str] | None = None, mounts: Sequence[str] = (),
               detach: bool = True, labels: Mapping[str, str] | None = None,
               env_file: str | None = None, remove: bool = False, image: str | None = None,
               options: Sequence[str] = ()) -> list[str]:
    """``docker run`` for a sparkbook container on ``node`` (an argument list, quoted by the remote
    layer). Secrets go in ``env_file`` (a file on the node), never in the arguments. ``image``: in
    place of ``runtime.image`` (an image ID that pins it); ``options``: more of ``docker run``'s."""
    rt = params.runtime
    args = ["docker", "run", *(["-d"] if detach else []), *(["--rm"] if remove else []),
            "--name", name, "--label", deployment_label(params), "--label", owner_label(node),
            *[a for k, v in (labels or {}).items() for a in ("--label", f"{k}={v}")],
            "--network", "host", "--ipc", "host", "--shm-size", rt.shm_size, *options, *rt.docker_args]
    if rt.gpus:
        args += ["--gpus", "all"]
    if rt.privileged:
        args += ["--privileged", "--ulimit", "memlock=-1"]
    elif rt.rdma:  # RDMA registers (pins) memory: unlimited memlock and the verbs devices
        args += ["--ulimit", "memlock=-1", "--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
    if rt.ptrace and not rt.privileged:
        args += ["--cap-add", "SYS_PTRACE"]
    for m in mounts:
        args += ["-v", m]
    for k, v in {**fabric_env(params, node), **(env or {})}.items():
        args += ["-e", f"{k}={v}"]
    if env_file:
        args += ["--env-file", env_file]
    return args + with_entrypoint(rt.entrypoint, image or rt.image, command)


def with_entrypoint(entrypoint: str | None, image: str | None, command: Sequence[str]) -> list[str]:
    """``--entrypoint PROGRAM IMAGE ARGS``: ``command`` runs as given whatever the image's own
    ENTRYPOINT (through ``entrypoint`` when set, which then receives the whole command)."""
    if entrypoint:
        return ["--entrypoint", entrypoint, str(image), *command]
    return ["--entrypoint", command[0], str(image), *command[1:]]


@contextmanager
def secrets_file(cluster: Cluster, nodes: list[Node], path: str | Callable[[Node], str],
                 values: Mapping[str, str]) -> Iterator[str | Callable[[Node], str] | None]:
    """``values`` (secrets: tokens, keys) as a ``docker run/exec --env-file`` on ``nodes`` at
    ``path`` (or ``path(node)``): mode 600 from its first byte, never on a command line, removed
    when the block ends, whatever happens; None when there is nothing to write. Raises
    :class:`~sparkbook.book.errors.CheckFailed` naming the nodes where it cannot be written."""
    if not values:
        yield None
        return
    path_of = path if callable(path) else (lambda node: path)
    try:
        cluster.put_bytes("".join(f"{k}={v}\n" for k, v in values.items()).encode(), path_of, nodes,
                          mode=0o600).check("write the secrets file on the nodes")
        yield path
    finally:
        cluster.run(lambda n: ["rm", "-f", "--", path_of(n)], nodes)


def hf_env(secret: str | None) -> dict[str, str]:
    """The Hugging Face token under both names the hub's clients read."""
    return {"HF_TOKEN": secret, "HUGGING_FACE_HUB_TOKEN": secret} if secret else {}
