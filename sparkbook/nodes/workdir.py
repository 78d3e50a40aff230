"""sparkbook's working folder on every node: private to the SSH user and the deployment.

``/tmp/sparkbook-USER/DEPLOYMENT`` (mode 0700, checked before use: never a symbolic link, never a
folder another user owns). Per deployment and not per run: the folder is mounted into the serving
containers and is part of their fingerprint, so a new folder per run would restart a healthy
deployment. It holds the scripts sparkbook copies to the nodes, the serving logs (``logs/``) and,
for as long as a container start needs them, the secret files (mode 0600).
"""

from __future__ import annotations

import getpass

from ..book.errors import CheckFailed
from ..params import Node, Params
from .remote import Cluster, ssh_target
from .shell import script


def login(node: Node) -> str:
    """The user sparkbook works as on ``node``."""
    return getpass.getuser() if node.local else ssh_target(node.host, node.user, node.port)[1]


def workdir(params: Params, node: Node) -> str:
    """The node's working folder for this deployment."""
    return f"/tmp/sparkbook-{login(node)}/{params.name}"


def logs(params: Params, node: Node) -> str:
    """The serving logs' folder on ``node`` (mounted into the containers)."""
    return f"{workdir(params, node)}/logs"


def secrets_path(params: Params, node: Node) -> str:
    """The secrets env file on ``node`` (mode 600; removed once the containers run)."""
    return f"{workdir(params, node)}/secrets.env"


def serve_log(params: Params, node: Node) -> str:
    """Ray executor: the engine's serve output in the head's Ray container, in the mounted logs
    folder (``vllm-serve.log`` for vLLM)."""
    return f"{logs(params, node)}/{params.serving.engine}-serve.log"


def prepare(params: Params, cluster: Cluster, nodes: list[Node] | None = None) -> None:
    """Make (or check) the working folder on ``nodes`` (all by default). Raises
    :class:`~sparkbook.book.errors.CheckFailed` naming each node where it is refused and why."""
    nodes = params.nodes if nodes is None else nodes
    results = cluster.run(lambda n: script("workdir.sh", workdir(params, n)), nodes, timeout=30)
    refused = [f"{r.node}: {line.removeprefix('WORKDIR-REFUSED ')}" for r in results.values()
               for line in r.stdout.splitlines() if line.startswith("WORKDIR-REFUSED ")]
    if refused:
        raise CheckFailed(
            "sparkbook's private working folder is refused on " + "; ".join(refused)
            + ". Another user, or something else, holds that path: remove it if it is yours, or "
            "ask its owner; sparkbook never works in a folder it cannot keep private.")
    results.check("make sparkbook's working folder on the nodes")
