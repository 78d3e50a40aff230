"""04_ray_cluster: a Ray container per node (the head first, the workers joining on its fabric
address), and every node in the cluster with its GPUs. The image checks come first, as a gate
(:func:`sparkbook.serving.image_checks` with ``need_ray=True``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..book.tables import Table
from ..book.verdict import FAIL, PASS, WARN, Check
from ..params import Params
from ..serving import listeners
from ..serving.plan import plan
from ..serving.ray import RayCluster, form_ray_cluster

if TYPE_CHECKING:
    from ..notebook import Context

NAME = "04_ray_cluster"
TITLE = "04 Ray cluster"


def run(ctx: Context, timeout: float = 180) -> RayCluster:
    """Form the Ray cluster (or keep it, when it is complete and unchanged) and wait for every node."""
    return form_ray_cluster(ctx.params, ctx.cluster, ctx.run_dir, timeout=timeout)


def table(outcome: RayCluster) -> Table:
    rows = [[name, rec["ip"], f"{rec['resources'].get('CPU', 0):g}", f"{rec['resources'].get('GPU', 0):g}",
             f"{rec['resources'].get('object_store_memory', 0) / 1e9:.1f}"]
            for name, rec in outcome.nodes.items()]
    return Table(["node", "address", "CPU", "GPU", "object store GB"], rows, title="Ray cluster")


def listeners_table(params: Params, outcome: RayCluster) -> Table:
    """Every address the Ray containers listen on, node by node."""
    return listeners.table(params, outcome.listeners)


# Ray's token authentication: Ray 2.52 and later (docs.ray.io, "Ray token authentication")
TOKEN_AUTH_SINCE = (2, 52)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def token_check(params: Params, outcome: RayCluster) -> list[Check]:
    """Whether the image's Ray requires the token sparkbook gives every Ray container."""
    if not outcome.version:
        return []
    has = _version(outcome.version) >= TOKEN_AUTH_SINCE
    return [Check("Ray token authentication", params.head.name, PASS if has else WARN,
                  f"Ray {outcome.version}: " + ("a Ray that enforces the token sparkbook sets (RAY_AUTH_MODE"
                                                "=token, read from the version)" if has else
                                                "no token authentication in this Ray"),
                  "Ray 2.52 or later (RAY_AUTH_MODE=token)",
                  "" if has else "anyone who reaches Ray's ports on the fabric can run code in the "
                  "containers: keep the fabric private, or use an image with Ray 2.52 or later")]


def checks(params: Params, outcome: RayCluster) -> list[Check]:
    """Every serving node in the Ray cluster, with its GPUs, and no other node in it (vLLM's
    placement group could land on it); Ray's token; every address bound where it should be."""
    out = _membership(params, outcome)
    if not outcome.missing:
        out += token_check(params, outcome) + listeners.checks(params, outcome.listeners)
    return out


def _membership(params: Params, outcome: RayCluster) -> list[Check]:
    serving = {n.name for n in params.serving_nodes}
    ray = plan(params).ray_container
    out = [Check("in the Ray cluster", name, FAIL, f"joined at {rec['ip']}", "only the nodes of serving.nodes",
                 "08_teardown.ipynb, then 04_ray_cluster.ipynb again", f"docker rm -f {ray}  # on {name}")
           for name, rec in outcome.nodes.items() if name not in serving]
    for n in params.serving_nodes:
        rec = outcome.nodes.get(n.name)
        if rec is None:
            out.append(Check("in the Ray cluster", n.name, FAIL, outcome.error or "not in `ray status`",
                             f"joined at {n.fabric_address}",
                             f"docker logs {ray} on {n.name}: the worker must reach "
                             f"{params.head.fabric_address}:{params.ports.ray} on the fabric (firewall, "
                             "rail addresses: 01_preflight.ipynb); the Ray versions of the nodes must match "
                             "(03_distribute_image.ipynb)",
                             f"docker exec {ray} ray status"))
            continue
        res = rec["resources"]
        out.append(Check("in the Ray cluster", n.name, PASS, f"{rec['ip']}, {res.get('CPU', 0):g} CPU"))
        if params.runtime.gpus:
            got, need = res.get("GPU", 0), params.gpus_of(n)
            out.append(Check("GPUs in Ray", n.name, PASS if got >= need else FAIL, f"{got:g} GPU", f"{need}",
                             "" if got >= need else "the Ray container sees no GPU: `--gpus all` and the "
                             "NVIDIA container toolkit on the node (`docker run --gpus all IMAGE "
                             "nvidia-smi`)"))
    return out
