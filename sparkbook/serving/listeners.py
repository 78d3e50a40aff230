"""Every TCP address the deployment's containers listen on (04, 05), as the containers' own
processes hold them, and whether each is bound where it should be.

sparkbook chooses three binds: vLLM's API on ``serving.bind`` (default: the head's management
address), the Ray dashboard and its Jobs API on the head's loopback, Ray's GCS on the head's fabric
address. The rest is Ray's, vLLM's and torch's own choice: recent Ray binds its servers to the node
address given (the fabric), older Ray and torch's rendezvous store bind every interface, and
``ray start`` has no option for them. A socket on every interface (0.0.0.0 or ::) is a FAIL where
sparkbook chose the address and the parameters did not ask for it, a WARN where nothing offers a
choice; 04 and 05 show them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..book.tables import Table
from ..book.verdict import FAIL, PASS, SKIP, WARN, Check, run_step
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..params import Params
from .commands import api_bind, beyond_loopback, wildcard
from .containers import deployment_label
from .plan import plan


@dataclass
class Listener:
    container: str
    address: str
    port: int
    program: str


def read_listeners(params: Params, cluster: Cluster) -> tuple[dict[str, list[Listener]], dict[str, list[str]]]:
    """What this deployment's containers listen on, by serving node (one round trip per node; a node that
    could not be read has an empty list), and the names of sparkbook's secret variables that their
    processes hold (the proof that the secrets file reached them; never a value)."""
    out: dict[str, list[Listener]] = {}
    held: dict[str, list[str]] = {}
    p = plan(params)
    bundle = lambda n: script("listeners.sh", deployment_label(params), *p.nodes[n.name].held)  # noqa: E731
    for node, r in cluster.run(bundle, params.serving_nodes, timeout=60).items():
        out[node] = parse(r.stdout)
        held[node] = sorted({name for line in r.stdout.splitlines() if line.startswith("SECRETS ")
                             for name in line.split()[-1].split(",") if name != "-"})
    return out, held


def secret_checks(params: Params, held: dict[str, list[str]]) -> list[Check]:
    """Per serving node: every secret the parameters give its containers (the Hugging Face token,
    the API key, Ray's token, secrets written in ``serving.env``) is held by a process of them."""
    p, out = plan(params), []
    for node, names in held.items():
        want = p.nodes[node].held
        expected = "held by the containers' processes: " + (", ".join(want) or "none configured")
        if not want:
            out.append(Check("secrets in the containers", node, SKIP, "no secret to hold", expected))
            continue
        missing = [n for n in want if n not in names]
        out.append(Check("secrets in the containers", node, FAIL if missing else PASS,
                         f"missing: {', '.join(missing)} (held: {', '.join(names) or 'none'})" if missing
                         else f"all {len(want)} held", expected,
                         "the secrets file did not reach them: something in the image (its entrypoint, "
                         "a wrapper) starts vLLM or Ray with a clean environment, or the deployment was "
                         "started before the secret was set: " + run_step("08_teardown") + ", then 05"
                         if missing else "", "listeners.sh (names only, read from /proc/PID/environ)"))
    return out


def parse(text: str) -> list[Listener]:
    """``listeners.sh``'s lines."""
    found = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) == 5 and cols[0] == "LISTEN" and cols[3].isdigit():
            found.append(Listener(cols[1], cols[2], int(cols[3]), cols[4]))
    return found


def role(params: Params, port: int) -> str:
    """What sparkbook knows a port as ("" for one Ray, vLLM or torch picked)."""
    names = {params.ports.api: "vLLM API", params.ports.dashboard: "Ray dashboard and Jobs API",
             params.ports.ray: "Ray GCS"}
    if params.serving.executor == "mp":
        names[params.ports.master] = "torch rendezvous (mp)"
    return names.get(port, "")


def misplaced(params: Params, li: Listener) -> str:
    """Why a socket sparkbook placed is bound where it should not be ("" when it is fine)."""
    if li.port == params.ports.dashboard and beyond_loopback(li.address):
        return "the Ray dashboard and its Jobs API run code on the cluster: loopback only"
    if li.port == params.ports.api and wildcard(li.address) and not wildcard(api_bind(params)):
        return f"vLLM's API on every interface, where serving.bind asks for {api_bind(params)}"
    return ""


def table(params: Params, listeners: dict[str, list[Listener]]) -> Table:
    rows = [[node, li.container, li.address, li.port, li.program, role(params, li.port),
             "every interface" if wildcard(li.address) else "loopback" if not beyond_loopback(li.address) else ""]
            for node, found in listeners.items() for li in sorted(found, key=lambda li: (li.port, li.address))]
    return Table(["node", "container", "address", "port", "program", "what", "reach"], rows,
                 title="addresses the containers listen on")


def checks(params: Params, listeners: dict[str, list[Listener]]) -> list[Check]:
    """Per node: nothing of sparkbook's on every interface unless asked (FAIL where sparkbook chose
    the address, WARN where Ray, vLLM or torch give no choice)."""
    out = []
    for node, found in listeners.items():
        bad = [f"{li.address}:{li.port} {li.program}: {why}" for li in found if (why := misplaced(params, li))]
        open_ = [f"{li.address}:{li.port} {li.program}" for li in found
                 if wildcard(li.address) and not misplaced(params, li)
                 and not (li.port == params.ports.api and wildcard(api_bind(params)))]
        expected = "no control plane beyond loopback or the fabric, unless the parameters ask"
        if bad:
            out.append(Check("bound addresses", node, FAIL, "; ".join(bad), expected,
                             "the image's Ray or vLLM ignored the bind sparkbook set: read the "
                             "container's command (commands table) and the image's versions"))
        if open_:
            out.append(Check("bound addresses", node, WARN, "on every interface: " + "; ".join(open_),
                             expected, "Ray, vLLM or torch offer no option to bind these elsewhere "
                             "(recent Ray binds to the node address given): keep them off the "
                             "management network with a firewall, or use a newer image"))
        if not found:
            out.append(Check("bound addresses", node, WARN, "no listening socket could be read",
                             expected, "listeners.sh reads them with python3 inside the containers: "
                             "`ss -ltnp` on the node as root shows them"))
        elif not (bad or open_):
            out.append(Check("bound addresses", node, PASS,
                             f"{len(found)} socket(s), none on every interface", expected))
    return out
