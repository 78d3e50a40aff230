"""The serving plan: everything the parameters decide about the serving containers, computed once
by :func:`plan` from the builders of :mod:`~sparkbook.serving.commands`. Per serving node: the Ray
container and vllm serve's own container (their names, ``docker run`` commands, environment,
mounts, the names of the secrets their file holds, fingerprints), and vllm serve's arguments; for
the deployment: the container vLLM's API runs in, the nodes whose vllm serve is watched, and with
the Ray executor the ``docker exec`` that starts vllm serve in the head's Ray container. 04, 05, 08,
the logs, status, the run fingerprint and the commands table read it; nothing else builds a name,
a command or a fingerprint (``tests/test_layers.py`` holds that rule).

The walk from the parameters file to ``vllm serve``'s arguments: ``params/`` (the schema),
``serving/commands.py`` (:func:`~sparkbook.serving.commands.serve_args`), this module, and the
step that runs it (``serving/deploy.py`` or ``serving/state.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..book.tables import Table
from ..params import Node, Params
from . import commands as c


@dataclass(frozen=True)
class Container:
    """One container sparkbook starts on a node."""

    name: str
    command: list[str]       # its ``docker run``
    fingerprint: str         # the label's value: a change means a restart
    env: dict[str, str]      # what it gets in its environment (secrets aside)
    mounts: list[str]
    secrets: list[str]       # the variables its secrets file holds (names; values read at start)


@dataclass(frozen=True)
class NodePlan:
    node: Node
    ray: Container           # its Ray container (the Ray executor; 04 forms the cluster)
    serve: Container         # vllm serve's own container (the mp executor)
    serve_args: list[str]    # vllm serve on this node (with Ray, only the head's runs)
    held: list[str]          # the secrets some process of its serving containers must hold
    serve_fingerprint: str   # vllm serve's: its container's (mp), or its exec's on the Ray head


@dataclass(frozen=True)
class Plan:
    executor: str
    head: Node
    nodes: dict[str, NodePlan]    # the serving nodes, head first
    ray_container: str            # every serving node's Ray container
    serve_container: str          # vllm serve's own container (mp)
    serving_container: str        # the container vLLM's API runs in
    ray_serve: list[str]          # vllm serve in the head's Ray container (``docker exec -d``)
    watched: list[Node]           # the nodes with a vllm serve to watch: the head (Ray), all (mp)

    @property
    def ray(self) -> bool:
        return self.executor == "ray"

    def container(self, ray: bool) -> str:
        """The Ray container's name (``ray``), or vllm serve's own."""
        return self.ray_container if ray else self.serve_container

    def started(self, node: Node, ray: bool) -> Container:
        """``node``'s Ray container (``ray``) or vllm serve's."""
        n = self.nodes[node.name]
        return n.ray if ray else n.serve

    def serve_fingerprints(self) -> dict[str, str]:
        """The fingerprint of each watched node's vllm serve."""
        return {n.name: self.nodes[n.name].serve_fingerprint for n in self.watched}

    @staticmethod
    def order(nodes: list[Node], ray: bool) -> list[list[Node]]:
        """The order containers start in: Ray's head first, then the workers together; mp's workers
        together, then the head."""
        return c.groups(nodes, ray)


def plan(params: Params) -> Plan:
    """The deployment's serving plan (reads the API key's and the token's presence from this
    machine's environment, as the fingerprints depend on them)."""
    ray_name, serve_name = c.container_name(params, True), c.container_name(params, False)
    return Plan(
        executor=params.serving.executor, head=params.head,
        nodes={n.name: _node(params, n) for n in params.serving_nodes},
        ray_container=ray_name, serve_container=serve_name,
        serving_container=ray_name if params.serving.executor == "ray" else serve_name,
        ray_serve=c.ray_serve_command(params), watched=c.watched_nodes(params))


def _node(params: Params, node: Node) -> NodePlan:
    def container(ray: bool) -> Container:
        return Container(c.container_name(params, ray), c.container_command(params, node, ray),
                         c.fingerprint(params, node, ray),
                         {**c.container_env(params, node), **(c.RAY_AUTH if ray else {})},
                         c.mounts(params, node), sorted(c.secrets(params, ray, "-" if ray else None)))
    return NodePlan(node, container(True), container(False), c.serve_args(params, node),
                    c.held_secrets(params, node), c.fingerprint(params, node, False))


def service_command(params: Params, node: Node, image_id: str) -> list[str]:
    """``node``'s service container (``sparkbook service install``), on the image ``image_id``."""
    return c.service_command(params, node, image_id)


def service_secrets(params: Params, node: Node, ray_token: str) -> dict[str, str]:
    """What ``node``'s service container's secrets file holds."""
    return c.service_secrets(params, node, ray_token)


def commands_table(params: Params, ray_only: bool = False) -> Table:
    """The exact commands, node by node, for a person to rerun by hand (secrets masked)."""
    p, rows = plan(params), []
    if p.ray or ray_only:
        rows += [[name, "Ray container", c.shown(n.ray.command)] for name, n in p.nodes.items()]
        if not ray_only:
            rows.append([p.head.name, "vllm serve", c.shown(p.ray_serve)])
    else:
        for group in p.order(list(n.node for n in p.nodes.values()), ray=False):
            rows += [[n.name, "vllm serve container", c.shown(p.nodes[n.name].serve.command)] for n in group]
    return Table(["node", "what", "command"], rows, title="commands", max_width=4000)
