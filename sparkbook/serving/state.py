"""sparkbook's containers on the nodes: what runs (and from what), starting them in order, and
what must hold before they start (the head's image on every node, the ports free)."""

from __future__ import annotations

import secrets as random_secrets
from dataclasses import dataclass, field
from typing import Callable

from ..book import redact
from ..book.errors import CheckFailed
from ..book.tables import short_id
from ..book.verdict import FAIL, Check
from ..facts.identity import INSPECT_FORMAT, ImageIdentity, parse, same_image
from ..facts.parsers import listener, parse_sections
from ..nodes import workdir
from ..nodes.remote import Cluster
from ..nodes.shell import Script, command_line, script
from ..params import Node, Params
from .commands import FINGERPRINT, SERVICE, secrets
from .containers import OWNER, deployment_label, owner_label, secrets_file
from .plan import plan


@dataclass
class NodeState:
    """A node's sparkbook containers: name -> (status, fingerprint), the image ID each runs, the
    configured image there now (None: absent) and its TCP listeners."""
    containers: dict[str, tuple[str, str]] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)
    image: ImageIdentity | None = None
    listeners: list[str] = field(default_factory=list)
    error: str | None = None

    def current(self, name: str, fingerprint: str) -> bool:
        """``name`` runs, started from these parameters, on the image its tag names now (not one
        that 03 has since replaced)."""
        return (self.containers.get(name) == ("running", fingerprint) and self.image is not None
                and self.runs.get(name) == self.image.id)

    def running(self, name: str) -> bool:
        return self.containers.get(name, ("",))[0] == "running"


def node_states(params: Params, cluster: Cluster) -> dict[str, NodeState]:
    """Every node's containers of this deployment, the configured image and TCP listeners (one
    round trip)."""
    out = {}
    for name, r in cluster.run(script("serving_state.sh", deployment_label(params), FINGERPRINT,
                                      params.runtime.image, INSPECT_FORMAT)).items():
        out[name] = parse_state(r.stdout) if r.ok else NodeState(error=r.summary())
    return out


def parse_state(text: str) -> NodeState:
    """``serving_state.sh``'s output."""
    st = NodeState()
    sec = parse_sections(text)
    for line in sec.get("containers", "").splitlines():
        cols = line.split("\t") + ["", ""]
        if cols[0]:
            st.containers[cols[0]] = (cols[1], cols[2])
    st.runs = dict(line.lstrip("/").split(" ", 1) for line in sec.get("runs", "").splitlines() if " " in line)
    st.image = ImageIdentity.of(parse(sec.get("image", "")))
    st.listeners = sec.get("listeners", "").splitlines()
    return st


@dataclass
class NodeService:
    """One node's service container, as Docker reports it."""
    name: str = ""
    state: str = ""           # running, restarting, exited... ("" when there is none)
    restarts: int = 0         # Docker's restart count
    started: str = ""         # when it last started
    image: str = ""           # the image ID it runs
    pinned: str = ""          # the image ID its label pins
    owner: str = ""
    engine_starts: int = 0    # the head: how often its supervisor started vllm serve
    error: str = ""           # the node could not be read


def parse_service_state(text: str) -> list[NodeService]:
    """``service_state.sh``'s lines."""
    out = []
    for line in text.splitlines():
        cols = line.split("\t")
        if len(cols) == 8:
            out.append(NodeService(cols[0], cols[1], int(cols[2] or 0), cols[3], cols[4], cols[5], cols[6],
                                   int(cols[7] or 0)))
    return out


def service_states(params: Params, cluster: Cluster) -> dict[str, NodeService]:
    """Every serving node's service container (``sparkbook service install``; an empty NodeService
    where it has none)."""
    out = {}
    got = cluster.run(script("service_state.sh", deployment_label(params), SERVICE, OWNER), params.serving_nodes,
                      timeout=60)
    for node in params.serving_nodes:
        r = got[node.name]
        if not r.ok:
            out[node.name] = NodeService(error=r.summary())
            continue
        found = parse_service_state(r.stdout)
        out[node.name] = found[0] if found else NodeService()
    return out


def refuse_over_service(params: Params, cluster: Cluster, step: str) -> None:
    """``step`` is about to replace the deployment's containers: refused while a service of it is
    installed (its supervisor would start its own vllm serve again beside the new one, or the
    replaced Ray containers would end the service without a word)."""
    on = [n for n, s in service_states(params, cluster).items() if s.name]
    if on:
        raise CheckFailed(f"{step} would replace the containers of deployment {params.name}, kept as a service on "
                          f"{', '.join(on)} (`sparkbook service install`): remove the service first (`sparkbook "
                          "service remove -p FILE`), then run the steps, and install it again once 05 and 06 pass")


def start(params: Params, cluster: Cluster, nodes: list[Node], ray: bool,
          say: Callable[[str], object] = print) -> None:
    """Start the containers on ``nodes`` in order (:meth:`Plan.order`: each group on all of its
    nodes at once), in place of this deployment's container of the same name (never another's),
    passing the secrets through a mode-600 file in the private working folder, removed right
    after. A new Ray cluster gets a new token of its own."""
    workdir.prepare(params, cluster, nodes)
    p = plan(params)
    name = p.container(ray)
    ray_token = random_secrets.token_hex(32) if ray else None
    if ray_token:
        redact.protect_value(ray_token)
    with secrets_file(cluster, nodes, lambda n: workdir.secrets_path(params, n), secrets(params, ray, ray_token)):
        for group in p.order(nodes, ray):
            say(f"starting {name} on {', '.join(n.name for n in group)}")
            cluster.run(lambda n: replace(params, n, name, p.started(n, ray).command),
                        group, timeout=120).check(
                f"start {name}", "see the command and its message above; 08_teardown.ipynb removes "
                "what was started")


def replace(params: Params, node: Node, name: str, command: list[str]):
    """``command`` (a ``docker run --name NAME``) in place of this deployment's container NAME on
    ``node``, started by this SSH user; refused when a container of that name is someone else's."""
    return script("replace_container.sh", name, deployment_label(params), owner_label(node), *command)


def remove(params: Params, *names: str) -> Callable[[Node], Script]:
    """Remove this deployment's containers that this SSH user started (all of them, or those
    ``names``): never another's. Per node, for :meth:`Cluster.run`."""
    return lambda node: script("remove_containers.sh", deployment_label(params), owner_label(node), *names)


def require_image(params: Params, states: dict[str, NodeState]) -> None:
    """Every node holds the head's image (the same ID, or the same content under another ID: see
    :func:`same_image`) before anything starts: otherwise Docker would try a registry (on a private
    cluster: a long wait, then an unrelated-looking error), or nodes would run different vLLM
    builds. ``states``: :func:`node_states` of every node; only the serving nodes are held to it."""
    serving = {n.name for n in params.serving_nodes}
    images = {n: s.image for n, s in states.items() if n in serving}
    head = images.get(params.head.name)
    bad = []
    for node, image in images.items():
        if image is None:
            bad.append(f"- {node}: the image is not there")
        elif head and not (same := same_image(image, head))[0]:
            bad.append(f"- {node}: holds {short_id(image.id)} under the tag, the head {short_id(head.id)}: {same[1]}")
    if bad:
        inspect = ["docker", "image", "inspect", params.runtime.image]
        raise CheckFailed(f"image {params.runtime.image} on every node: {len(bad)} of {len(images)} node(s) "
                          "differ\n" + "\n".join(bad) + "\n  command: " + command_line(inspect)
                          + "\nremedy: run 03_distribute_image.ipynb (`sparkbook run -p FILE --steps 03`): it copies "
                          "the head's image to every node"
                          + ("" if head else " (after pulling or building it on the head)"))


def port_conflicts(params: Params, states: dict[str, NodeState]) -> list[Check]:
    """Ports 05 needs that something holds (checked once sparkbook's own serving is stopped)."""
    needs = [("api", params.ports.api)]
    if params.serving.executor == "mp" and len(params.serving_nodes) > 1:
        needs.append(("master", params.ports.master))
    st = states.get(params.head.name)
    out = []
    for what, port in needs if st and not st.error else []:
        seen = listener(st.listeners, port)
        if seen:
            out.append(Check("port free", params.head.name, FAIL, f"{what} port {port} held: {seen}",
                             f"{what} port {port} free",
                             "stop what listens there (08_teardown.ipynb removes sparkbook's own; "
                             "`ss -ltnp` names the process), or change `ports` in the parameters",
                             "ss -ltnp"))
    return out
