"""Day two: a deployment that passed 05 and 06, kept serving as a service (``sparkbook service
install|status|remove``, notebooks/day_two.ipynb).

Installed, every serving node runs its Ray container as 04 would start it, but on the image pinned
by ID and under Docker's restart policy (``--restart unless-stopped``): Docker starts it again when
it ends and whenever the node's dockerd starts, at boot. Its program is a supervisor
(``scripts/service.sh``) that orders the start across nodes that each restart on their own: a
worker joins once the head's Ray answers; the head starts ``vllm serve`` once every node is alive
in Ray, starts it again when it ends or a node leaves, and backs off. The logs are Docker's
(``docker logs``, the ``local`` driver, 5 files of 100 MB), since the working folder lives in /tmp.

Why the restart policy and no systemd unit of sparkbook's own: Docker's daemon is itself a
systemd unit enabled at boot on DGX OS (and on Ubuntu's docker.io and Docker CE packages), and it
restarts the containers whose policy says so; a second unit would order nothing the supervisor
does not, and would need root where the restart policy needs only the docker group.

The service takes the basis run's parameters as they are: the serving plan's fingerprints must be
those 05 started and 06 passed on, or the install is refused. Secrets (Ray's new token, the API
key, the Hugging Face token) reach the containers through a mode-600 file removed right after, and
then live in the containers' configuration, as Docker keeps every ``--env-file``.
"""

from __future__ import annotations

import secrets as random_secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..book import redact
from ..book.errors import CheckFailed
from ..book.progress import Progress
from ..book.step import Outcome
from ..book.verdict import FAIL, PASS, Check
from ..nodes import workdir
from ..nodes.remote import Cluster
from ..nodes.shell import command_line
from ..params import Params
from .commands import SERVICE
from .containers import deployment_label, secrets_file
from .deploy import healthy, remove_serving
from .plan import plan, service_command, service_secrets
from .state import NodeService, node_states, remove, replace, require_image, service_states

@dataclass
class Service(Outcome):
    """What ``sparkbook service`` found or did."""
    FILE = "service.json"

    action: str = ""                       # installed, status, removed
    basis: str = ""                        # the run whose 05 and 06 passed
    image: str = ""                        # the image ID pinned
    nodes: dict[str, NodeService] = field(default_factory=dict)
    ready: bool = False
    models: list[str] = field(default_factory=list)
    seen: str = ""
    seconds: float = 0.0

    def key_numbers(self) -> list[tuple[str, str]]:
        if self.action == "installed":
            return [("service", f"{'ready' if self.ready else 'not ready'} in {self.seconds:.0f} s")]
        return []


def install(params: Params, cluster: Cluster, basis_dir: Path, served: str | None = None,
            say: Callable[[str], object] = print) -> Service:
    """Replace the deployment's containers with its service containers (head first, then the
    workers), on the image the head's tag names now, pinned by ID, and wait until vLLM answers.
    ``served``: the image ID 05 and 06 passed on in ``basis_dir`` (refused when the tag names
    another now)."""
    t0 = time.monotonic()
    if params.serving.executor != "ray":
        raise CheckFailed("service: only the Ray executor is kept as a service (serving.executor: ray); "
                          "the mp executor's containers start in another order")
    states = node_states(params, cluster)
    bad = [f"{n}: {s.error}" for n, s in states.items() if s.error]
    if bad:
        raise CheckFailed("service: cannot read the nodes' containers: " + "; ".join(bad))
    require_image(params, states)
    head_image = states[params.head.name].image
    image = head_image.id if head_image else ""
    if served and served != image:
        raise CheckFailed(f"service: {params.runtime.image} on {params.head.name} is {image[:19]} now, not the "
                          f"{served[:19]} that 05 and 06 passed on in {basis_dir.name}: run 05 and 06 on it first")
    foreign = [f"{n}: {s.name} is {s.owner}'s" for n, s in service_states(params, cluster).items()
               if s.owner and s.owner != workdir.login(params.node(n))]
    if foreign:
        raise CheckFailed("service: another user's service of this deployment runs on " + "; ".join(foreign))
    out = Service(action="installed", basis=str(basis_dir), image=image)
    say(f"service: from {basis_dir.name}, image {image[:19]}; stopping vllm serve and the Ray containers first")
    remove_serving(params, cluster)
    token = random_secrets.token_hex(32)
    redact.protect_value(token)
    p = plan(params)
    workdir.prepare(params, cluster, params.serving_nodes)
    try:
        for group in p.order(params.serving_nodes, ray=True):
            for node in group:  # the head's file holds vllm serve's secrets too
                with secrets_file(cluster, [node], workdir.secrets_path(params, node),
                                  service_secrets(params, node, token)):
                    say(f"service: starting {p.ray_container} on {node.name}")
                    cluster.run(replace(params, node, p.ray_container, service_command(params, node, image)),
                                [node], timeout=120).check(
                        f"start the service container on {node.name}", "see the message above")
        wait(params, out, params.serving.startup_timeout)
    finally:  # nothing half-done: a service that never answered (or an interrupted install) is removed
        if not out.ready:
            say("service: not ready; removing the service containers started")
            uninstall(params, cluster)
    out.nodes = service_states(params, cluster)
    out.seconds = time.monotonic() - t0
    return out


def wait(params: Params, out: Service, timeout: float) -> None:
    """Wait until vLLM's API answers with a model."""
    t0 = time.monotonic()
    with Progress(f"waiting for the service at {params.endpoint} (up to {timeout:.0f} s)") as progress:
        while time.monotonic() - t0 < timeout:
            h = healthy(params)
            out.ready, out.models, out.seen = h.ready, h.models, h.seen
            progress.update("api", f"{time.monotonic() - t0:5.0f} s  {h.seen}", force=h.ready)
            if h.ready:
                return
            time.sleep(3)
    out.seen = f"not ready after {timeout:.0f} s ({out.seen})"


def status(params: Params, cluster: Cluster) -> Service:
    """The service containers on every serving node and whether vLLM answers."""
    h = healthy(params)
    return Service(action="status", nodes=service_states(params, cluster), ready=h.ready, models=h.models, seen=h.seen)


def uninstall(params: Params, cluster: Cluster) -> Service:
    """Remove this user's service containers of the deployment (and nothing else), then read what
    is left."""
    mine = service_states(params, cluster)
    names = {n.name for n in mine.values() if n.name}
    if names:
        cluster.run(remove(params, *sorted(names)), params.serving_nodes).check("remove the service containers")
    return Service(action="removed", nodes=service_states(params, cluster))


def checks(params: Params, out: Service) -> list[Check]:
    """Per node, the service container: there and running on the pinned image (installed, status),
    or gone (removed); then vLLM's API."""
    name = plan(params).ray_container
    rows = []
    for node, s in out.nodes.items():
        cmd = command_line(["docker", "ps", "-a", "--filter", f"label={SERVICE}", "--filter",
                            f"label={deployment_label(params)}"])
        if out.action == "removed":
            rows.append(Check("service removed", node, FAIL if s.name or s.error else PASS,
                              s.error or (f"{s.name} is still there ({s.state})" if s.name else "no service container"),
                              "no service container of this deployment", "" if not (s.name or s.error) else
                              f"docker rm -f {name}  # on {node}, when it is yours", cmd))
            continue
        if s.error or not s.name:
            rows.append(Check("service", node, FAIL, s.error or "no service container", f"{name} running",
                              "`sparkbook service install -p FILE`", cmd))
            continue
        observed = (f"{s.state}, started {s.started[:19]}, {s.restarts} restart(s) by Docker"
                    + (f", vllm serve started {s.engine_starts} time(s)" if node == params.head.name else ""))
        ok = s.state == "running" and s.image == s.pinned
        rows.append(Check("service", node, PASS if ok else FAIL, observed + ("" if s.image == s.pinned else
                          f"; runs {s.image[:19]}, not the pinned {s.pinned[:19]}"),
                          f"{name} running on the pinned image", "" if ok else
                          f"`docker logs {name}` on {node}; `sparkbook service install -p FILE` starts it again", cmd))
    if out.action != "removed":
        restarted = out.nodes.get(params.head.name, NodeService()).engine_starts > 1
        rows.append(Check("service endpoint", params.head.name, PASS if out.ready else FAIL,
                          (f"serves {', '.join(out.models)}" if out.ready else out.seen)
                          + (" (vllm serve was restarted by the supervisor)" if restarted and out.ready else ""),
                          f"{params.endpoint} answers with a model",
                          "" if out.ready else f"`docker logs {name}` on {params.head.name}: the lines of "
                          "sparkbook-service say what it waits for"))
    return rows
