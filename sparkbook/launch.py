"""04_ray_cluster, 05_serve and 08_teardown: the serving containers, from image inspection to a
healthy OpenAI-compatible endpoint, with diagnosis when it does not come up.

Executor ``ray``: one Ray container per node (head first, workers join on its fabric address), then
``vllm serve --distributed-executor-backend ray`` inside the head's container. Executor ``mp``: one
``vllm serve`` container per node (``--nnodes/--node-rank``, ``--headless`` on the workers, which
start first). Every container carries the ``sparkbook`` label and a fingerprint of what it was
started with, so running 05 again on a healthy, unchanged deployment changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .containers import LABEL, docker_run, fabric_env
from .errors import CheckFailed
from .params import Node, Params
from .parsers import listener, parse_sections
from .progress import Progress
from .redact import mask
from .remote import REMOTE_DIR, Cluster, command_line, sh
from .tables import Table, short_id
from .verdict import FAIL, PASS, WARN, Check, Verdict

RAY_CONTAINER = "sparkbook-ray"
INSPECT_CONTAINER = "sparkbook-inspect"
INSPECT_SCRIPT = Path(__file__).parent / "scripts" / "inspect_vllm.py"
LOG_DIR = f"{REMOTE_DIR}/logs"          # on every node, mounted into the containers
ENV_FILE = f"{REMOTE_DIR}/secrets.env"  # the HF token, mode 600, removed once the container runs
SERVE_LOG = f"{LOG_DIR}/vllm-serve.log"  # ray executor: vllm serve's output in the head container
FINGERPRINT = "sparkbook.fingerprint"


# ----------------------------------------------------------------------------------- commands

def serve_env(params: Params, node: Node) -> dict[str, str]:
    """What every serving container needs besides the fabric binding (see :func:`fabric_env`):
    vLLM's own address on the fabric, Ray's memory monitor off (on GB10 the unified memory is the
    GPU's, and the monitor kills workers that hold the model), then the parameters' extras."""
    env = {"VLLM_HOST_IP": node.fabric_address, "RAY_memory_monitor_refresh_ms": "0",
           **params.serving.env}
    return env


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
    elif len(p.nodes) > 1:
        rank = p.nodes.index(node)
        args += ["--distributed-executor-backend", "mp", "--nnodes", str(len(p.nodes)),
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


def container_command(params: Params, node: Node, ray: bool | None = None) -> list[str]:
    """The ``docker run`` of ``node``'s container: Ray's (``ray``) or vllm serve's."""
    ray = params.serving.executor == "ray" if ray is None else ray
    name = RAY_CONTAINER if ray else params.runtime.container_name
    inner = ray_args(params, node) if ray else serve_args(params, node)
    labels = {FINGERPRINT: fingerprint(params, node, ray)}
    return docker_run(params, node, name, inner, env=serve_env(params, node), mounts=mounts(params),
                      labels=labels, env_file=ENV_FILE if token(params) else None)


def fingerprint(params: Params, node: Node, ray: bool) -> str:
    """A digest of what decides the node's container (Ray's with ``ray``), or vllm serve in the
    head's Ray container: a change means a restart. Ray's leaves out vllm serve's arguments, so
    that a serving change restarts vllm serve, not the Ray cluster."""
    what = {"image": params.runtime.image, "ray": ray_args(params, node) if ray else None,
            "serve": None if ray else serve_args(params, node),
            "env": container_env(params, node), "mounts": mounts(params),
            "runtime": params.runtime.model_dump(), "token": bool(token(params))}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


# vllm serve's processes in the Ray container; the brackets keep a shell whose own command line
# holds the pattern (the one running pkill) from matching itself
SERVE_PATTERN = "[v]llm serve"
SERVE_FP = "SPARKBOOK_SERVE_FINGERPRINT"


def ray_serve_command(params: Params) -> list[str]:
    """vllm serve in the head's Ray container, its output into a file in the logs folder; its
    fingerprint in its environment (see :func:`serving_fingerprint`)."""
    inner = command_line(serve_args(params, params.head)) + f" > {SERVE_LOG} 2>&1"
    return ["docker", "exec", "-d", "-e", f"{SERVE_FP}={fingerprint(params, params.head, False)}",
            RAY_CONTAINER, "bash", "-c", inner]


def shown(cmd: list[str] | str) -> str:
    """A command as a person may copy it: quoted, with any secret value masked."""
    return mask(command_line(cmd))


def commands_table(params: Params, ray_only: bool = False) -> Table:
    """The exact commands, node by node, for a person to rerun by hand (secrets masked)."""
    rows = []
    if params.serving.executor == "ray" or ray_only:
        for n in params.nodes:
            rows.append([n.name, "Ray container", shown(container_command(params, n, ray=True))])
        if not ray_only:
            rows.append([params.head.name, "vllm serve", shown(ray_serve_command(params))])
    else:
        for group in _groups(params, params.nodes, ray=False):
            rows += [[n.name, "vllm serve container", shown(container_command(params, n, ray=False))]
                     for n in group]
    return Table(["node", "what", "command"], rows, title="commands", max_width=4000)


# ------------------------------------------------------------------------------------ inspection

@dataclass
class ImageInfo:
    image: str
    image_id: str | None = None
    vllm: str | None = None
    ray: str | None = None
    torch: str | None = None
    transformers: str | None = None
    options: list[str] = field(default_factory=list)
    options_from: str | None = None
    architectures: list[str] = field(default_factory=list)
    model_architectures: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def inspect_image(params: Params, cluster: Cluster, run_dir: Path | None = None) -> ImageInfo:
    """Read the image on the head: versions, `vllm serve` options, supported architectures. Runs
    inside the image with the runtime's GPU flags (``vllm serve --help`` crashes in some images
    without GPU access); the result is kept in the run folder per image ID and model."""
    head = params.head
    ident = cluster.run_on(head, ["docker", "image", "inspect", "--format", "{{.Id}}", params.runtime.image])
    info = ImageInfo(params.runtime.image, ident.stdout.strip() if ident.ok else None)
    if not info.image_id:
        info.errors["image"] = f"{params.runtime.image} is not on {head.name}: {ident.summary()}"
        return info
    cache = run_dir / "image_inspection.json" if run_dir else None
    if cache and cache.exists():
        old = json.loads(cache.read_text())
        if old.pop("model", None) == params.model.path and old.get("image_id") == info.image_id:
            return ImageInfo(**old)
    start = time.monotonic()
    cluster.put(INSPECT_SCRIPT, f"{REMOTE_DIR}/inspect_vllm.py", [head]).check("copy the inspection script")
    run = docker_run(params, head, INSPECT_CONTAINER,
                     ["python3", f"{REMOTE_DIR}/inspect_vllm.py", params.model.path],
                     detach=False, remove=True,
                     mounts=[f"{REMOTE_DIR}/inspect_vllm.py:{REMOTE_DIR}/inspect_vllm.py:ro",
                             f"{params.model.path}:{params.model.path}:ro"])
    r = cluster.run_on(head, sh("docker rm -f {c} >/dev/null 2>&1; ", c=INSPECT_CONTAINER)
                       + command_line(run), timeout=300)
    found = re.search(r"^INSPECT (.*)$", r.stdout, re.M)
    if not found:
        info.errors["inspect"] = f"{shown(run)} printed no result: {r.summary()}"
        return info
    data = json.loads(found.group(1))
    for k in ("vllm", "ray", "torch", "transformers", "options", "options_from", "architectures",
              "model_architectures"):
        if data.get(k) is not None:
            setattr(info, k, data[k])
    info.errors.update({k[:-len("_error")]: v for k, v in data.items() if k.endswith("_error")})
    info.seconds = time.monotonic() - start
    if cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({**asdict(info), "model": params.model.path}, indent=2) + "\n")
    return info


def configured_options(params: Params) -> list[str]:
    """Every ``--option`` that sparkbook would pass to ``vllm serve`` on any node."""
    seen = []
    for n in params.nodes:
        for a in serve_args(params, n):
            if a.startswith("--"):
                o = a.split("=", 1)[0]
                if o not in seen:
                    seen.append(o)
    return seen


def image_verdict(params: Params, info: ImageInfo, need_ray: bool | None = None) -> Verdict:
    """The image can do what the parameters ask: fails in seconds, naming the problem. Ray is
    needed by the Ray executor (``need_ray`` by default) and by 04, which forms a Ray cluster."""
    need_ray = params.serving.executor == "ray" if need_ray is None else need_ray
    v = Verdict("serving image")
    head = params.head.name
    if "image" in info.errors:
        return v.add(Check("image", head, FAIL, info.errors["image"], params.runtime.image,
                           "03_distribute_image (or `docker pull`) first"))
    if not info.vllm:
        return v.add(Check("vLLM in the image", head, FAIL, info.errors.get("inspect", "vllm not installed"),
                           "vllm importable", "choose an image with vLLM (runtime.image)"))
    v.add(Check("vLLM in the image", head, PASS, f"vLLM {info.vllm}, torch {info.torch}"))
    if need_ray:
        v.add(Check("Ray in the image", head, PASS if info.ray else FAIL,
                    f"Ray {info.ray}" if info.ray else "no Ray", "Ray (executor ray)",
                    "" if info.ray else "use an image with Ray (NGC's vLLM image lacks it: `pip install "
                    "ray[default]` in a derived image) or serving.executor: mp"))
    if info.options:
        known = set(info.options)
        unknown = [o for o in configured_options(params)
                   if o not in known and o.replace("_", "-") not in known]
        v.add(Check("vllm serve options", head, FAIL if unknown else PASS,
                    f"unknown to vLLM {info.vllm}: {', '.join(unknown)}" if unknown else
                    f"{len(configured_options(params))} options, all known", "options this vLLM accepts",
                    "remove or rename them in serving.extra_args / the serving parameters (`vllm serve "
                    "--help=all` in the image lists them), or use a vLLM that has them" if unknown else ""))
    else:
        v.add(Check("vllm serve options", head, WARN, info.errors.get("options", "not read"),
                    "the option list", "the options will be checked by vLLM when it starts"))
    if info.model_architectures and info.architectures:
        missing = [a for a in info.model_architectures if a not in info.architectures]
        v.add(Check("model architecture", head, FAIL if missing else PASS,
                    f"{', '.join(missing)} not supported by vLLM {info.vllm}" if missing else
                    ", ".join(info.model_architectures), "supported by this vLLM",
                    "use a vLLM image that supports the model (a newer one, or the model's own image)"
                    if missing else ""))
    elif "model" in info.errors:
        v.add(Check("model architecture", head, FAIL, info.errors["model"], "the model's config.json",
                    f"put the model at {params.model.path} on every node (03_distribute_image)"))
    else:
        v.add(Check("model architecture", head, WARN, info.errors.get("architectures", "not read"),
                    "supported by this vLLM"))
    return v


def info_table(info: ImageInfo) -> Table:
    rows = [["image", f"{info.image} ({short_id(info.image_id)})"],
            ["vLLM", info.vllm], ["Ray", info.ray or "absent"], ["torch", info.torch],
            ["transformers", info.transformers], ["serve options", f"{len(info.options)} (from {info.options_from})"],
            ["supported architectures", len(info.architectures)],
            ["model architectures", ", ".join(info.model_architectures)]]
    return Table(["", "value"], rows, title="the serving image")


# ------------------------------------------------------------------------------------ containers

@dataclass
class NodeState:
    """A node's sparkbook containers: name -> (status, fingerprint), the image ID each runs, the
    configured image's ID there now (None: absent) and its TCP listeners."""
    containers: dict[str, tuple[str, str]] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    listeners: list[str] = field(default_factory=list)
    error: str | None = None

    def current(self, name: str, fingerprint: str) -> bool:
        """``name`` runs, started from these parameters, on the image its tag names now (not one
        that 03 has since replaced)."""
        return self.containers.get(name) == ("running", fingerprint) and self.runs.get(name) == self.image


def state(params: Params, cluster: Cluster) -> dict[str, NodeState]:
    """Every node's sparkbook containers, the configured image and TCP listeners (one round trip)."""
    script = "\n".join([
        "echo '@@ containers'",
        sh("docker ps -a --filter label={l} --format '{{{{.Names}}}}\\t{{{{.State}}}}\\t"
           "{{{{.Label \"{f}\"}}}}'", l=LABEL, f=FINGERPRINT),
        "echo '@@ runs'",
        sh("ids=$(docker ps -aq --filter label={l}); [ -z \"$ids\" ] || "
           "docker inspect --format '{{{{.Name}}}} {{{{.Image}}}}' $ids", l=LABEL),
        "echo '@@ image'",
        sh("docker image inspect --format '{{{{.Id}}}}' {i} 2>/dev/null || true", i=params.runtime.image),
        "echo '@@ listeners'", "ss -ltnpH 2>/dev/null || ss -ltnH"])
    out = {}
    for name, r in cluster.run(script).items():
        st = NodeState(error=None if r.ok else r.summary())
        if r.ok:
            sec = parse_sections(r.stdout)
            for line in sec.get("containers", "").splitlines():
                cols = line.split("\t") + ["", ""]
                if cols[0]:
                    st.containers[cols[0]] = (cols[1], cols[2])
            st.runs = dict(line.lstrip("/").split(" ", 1) for line in sec.get("runs", "").splitlines()
                           if " " in line)
            st.image = sec.get("image") or None
            st.listeners = sec.get("listeners", "").splitlines()
        out[name] = st
    return out


def start(params: Params, cluster: Cluster, nodes: list[Node], ray: bool, say=print) -> None:
    """Start the containers on ``nodes`` in that order (each one on all of its nodes at once when
    they may start together), passing the token through a mode-600 file removed right after."""
    secret = token(params)
    cluster.run(["mkdir", "-p", LOG_DIR], nodes).check("make the log folder on the nodes")
    if secret:
        cluster.put_bytes(f"HF_TOKEN={secret}\nHUGGING_FACE_HUB_TOKEN={secret}\n".encode(), ENV_FILE,
                          nodes, mode=0o600).check("write the token file on the nodes")
    name = RAY_CONTAINER if ray else params.runtime.container_name
    try:
        for group in _groups(params, nodes, ray):
            say(f"starting {name} on {', '.join(n.name for n in group)}")
            cluster.run(lambda n: sh("docker rm -f {c} >/dev/null 2>&1; ", c=name)
                        + command_line(container_command(params, n, ray)), group, timeout=120).check(
                f"start {name}", "see the command and its message above; 08_teardown removes "
                "what was started")
    finally:
        if secret:
            cluster.run(["rm", "-f", ENV_FILE], nodes)


def check_image(params: Params, states: dict[str, NodeState]) -> None:
    """Every node holds the head's image, the same ID, before anything starts: otherwise Docker
    would try a registry (on a private cluster: a long wait, then an unrelated-looking error), or
    nodes would run different vLLM builds. ``states``: :func:`state` of every node."""
    ids = {n: s.image for n, s in states.items()}
    head = ids.get(params.head.name)
    bad = []
    for node, image_id in ids.items():
        if image_id is None:
            bad.append(f"- {node}: the image is not there")
        elif head and image_id != head:
            bad.append(f"- {node}: holds {short_id(image_id)} under the tag, the head {short_id(head)}")
    if bad:
        raise CheckFailed(f"image {params.runtime.image} on every node: {len(bad)} of {len(ids)} node(s) "
                          "differ\n" + "\n".join(bad) + "\n  command: "
                          + command_line(["docker", "image", "inspect", "--format", "{{.Id}}", params.runtime.image])
                          + "\nremedy: run 03_distribute_image: it copies the head's image to every node"
                          + ("" if head else " (after pulling or building it on the head)"))


def _groups(params: Params, nodes: list[Node], ray: bool) -> list[list[Node]]:
    """Ray: the head first, then the workers together. mp: the workers together, then the head."""
    head = [n for n in nodes if n.role == "head"]
    workers = [n for n in nodes if n.role != "head"]
    return [g for g in ([head, workers] if ray else [workers, head]) if g]


# ------------------------------------------------------------------------------------ Ray (04)

RAY_NODES = ("import json, ray; ray.init(address='auto', logging_level='ERROR'); "
             "print('RAYNODES ' + json.dumps([{'ip': n['NodeManagerAddress'], 'alive': n['Alive'], "
             "'resources': n['Resources']} for n in ray.nodes()]))")


@dataclass
class RayCluster:
    nodes: dict[str, dict] = field(default_factory=dict)   # node name -> {ip, alive, resources}
    missing: list[str] = field(default_factory=list)
    status_text: str = ""
    seconds: float = 0.0
    error: str | None = None


def ray_nodes(params: Params, cluster: Cluster) -> RayCluster:
    """The Ray cluster as the head's Ray sees it, by node name (matched on fabric addresses)."""
    r = cluster.run_on(params.head, sh("docker exec {c} python3 -c {p}; echo '@@ status'; "
                                       "docker exec {c} ray status", c=RAY_CONTAINER, p=RAY_NODES), timeout=90)
    out = RayCluster(status_text=parse_sections(r.stdout).get("status", ""))
    found = re.search(r"^RAYNODES (.*)$", r.stdout, re.M)
    if not found:
        out.error = r.summary()
        out.missing = [n.name for n in params.nodes]
        return out
    by_ip = {n.fabric_address: n.name for n in params.nodes}
    for rec in json.loads(found.group(1)):
        if rec["alive"] and rec["ip"] in by_ip:
            out.nodes[by_ip[rec["ip"]]] = rec
    out.missing = [n.name for n in params.nodes if n.name not in out.nodes]
    return out


def form_ray_cluster(params: Params, cluster: Cluster, run_dir: Path | None = None,
                     timeout: float = 180, say=print) -> RayCluster:
    """Ray head on the head node, workers joining on its fabric address; waits until every node is
    in the cluster with its GPUs (CPUs in the lab). Idempotent: a matching cluster is kept. With
    the mp executor nothing uses the cluster: it is stopped once checked."""
    start_t = time.monotonic()
    current = state(params, cluster)
    fp = {n.name: fingerprint(params, n, True) for n in params.nodes}
    running = all(current[n.name].current(RAY_CONTAINER, fp[n.name]) for n in params.nodes)
    rc = ray_nodes(params, cluster) if running else RayCluster(missing=[n.name for n in params.nodes])
    if not rc.missing:
        say("the Ray cluster is already up with every node and matches the parameters: kept")
    else:
        check_image(params, current)
        try:
            start(params, cluster, params.nodes, True, say=say)
        except CheckFailed:  # the head may have started before a worker failed
            stop_ray(params, cluster, run_dir)
            raise
        deadline = time.monotonic() + timeout
        with Progress("Ray cluster") as progress:
            while time.monotonic() < deadline:
                rc = ray_nodes(params, cluster)
                progress.update("nodes", f"{len(rc.nodes)} of {len(params.nodes)} joined"
                                + (f"; waiting for {', '.join(rc.missing)}" if rc.missing else ""))
                if not rc.missing:
                    break
                time.sleep(3)
    rc.seconds = time.monotonic() - start_t
    if rc.missing:  # nothing half-formed stays up: logs first (with a run folder), then the containers
        stop_ray(params, cluster, run_dir)
    elif params.serving.executor != "ray":
        stop_ray(params, cluster, run_dir)
        say("serving.executor is mp: the Ray cluster was formed and checked, and is now stopped")
    return rc


def ray_verdict(params: Params, rc: RayCluster, image: Verdict | None = None) -> Verdict:
    """Every node in the Ray cluster with its GPUs, after ``image``'s checks (the image verdict)."""
    v = Verdict("04 Ray cluster").extend(image.checks if image else [])
    want_gpu = params.runtime.gpus
    for n in params.nodes:
        rec = rc.nodes.get(n.name)
        if rec is None:
            v.add(Check("in the Ray cluster", n.name, FAIL, rc.error or "not in `ray status`",
                        f"joined at {n.fabric_address}",
                        f"docker logs {RAY_CONTAINER} on {n.name}: the worker must reach "
                        f"{params.head.fabric_address}:{params.ports.ray} on the fabric (firewall, "
                        "rail addresses: 01_preflight); the Ray versions of the nodes must match (03)",
                        f"docker exec {RAY_CONTAINER} ray status"))
            continue
        res = rec["resources"]
        v.add(Check("in the Ray cluster", n.name, PASS, f"{rec['ip']}, {res.get('CPU', 0):g} CPU"))
        if want_gpu:
            got, need = res.get("GPU", 0), params.gpus_of(n)
            v.add(Check("GPUs in Ray", n.name, PASS if got >= need else FAIL, f"{got:g} GPU", f"{need}",
                        "" if got >= need else "the Ray container sees no GPU: `--gpus all` and the "
                        "NVIDIA container toolkit on the node (`docker run --gpus all IMAGE nvidia-smi`)"))
    return v


def ray_table(rc: RayCluster) -> Table:
    rows = [[name, rec["ip"], f"{rec['resources'].get('CPU', 0):g}", f"{rec['resources'].get('GPU', 0):g}",
             f"{rec['resources'].get('object_store_memory', 0) / 1e9:.1f}"] for name, rec in rc.nodes.items()]
    return Table(["node", "address", "CPU", "GPU", "object store GB"], rows, title="Ray cluster")


def stop_ray(params: Params, cluster: Cluster, run_dir: Path | None) -> None:
    """Remove the Ray containers (their logs saved first)."""
    if run_dir:
        collect_logs(params, cluster, run_dir, [RAY_CONTAINER])
    cluster.run(["docker", "rm", "-f", RAY_CONTAINER])


# --------------------------------------------------------------------------------- serving (05)

def serving_container(params: Params) -> str:
    return RAY_CONTAINER if params.serving.executor == "ray" else params.runtime.container_name


def serving_nodes(params: Params) -> list[Node]:
    return [params.head] if params.serving.executor == "ray" else params.nodes


def port_conflicts(params: Params, states: dict[str, NodeState]) -> list[Check]:
    """Ports 05 needs that something holds (checked once sparkbook's own serving is stopped)."""
    needs = [("api", params.ports.api)]
    if params.serving.executor == "mp" and len(params.nodes) > 1:
        needs.append(("master", params.ports.master))
    st = states.get(params.head.name)
    out = []
    for what, port in needs if st and not st.error else []:
        seen = listener(st.listeners, port)
        if seen:
            out.append(Check("port free", params.head.name, FAIL, f"{what} port {port} held: {seen}",
                             f"{what} port {port} free",
                             "stop what listens there (08_teardown removes sparkbook's own; "
                             "`ss -ltnp` names the process), or change `ports` in the parameters",
                             "ss -ltnp"))
    return out


@dataclass
class Deployment:
    """What 05 found and did."""
    action: str = ""                     # "kept", "started", "restarted"
    fingerprints: dict[str, str] = field(default_factory=dict)
    ready: bool = False
    seen: str = ""                       # the last thing the wait saw
    stopped: dict[str, str] = field(default_factory=dict)  # node -> how its container ended
    seconds: float = 0.0
    models: list[str] = field(default_factory=list)
    diagnosis: list[dict] = field(default_factory=list)
    conflicts: list[Check] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)   # node -> folder of its logs


def healthy(params: Params, timeout: float = 5) -> tuple[bool, list[str], str]:
    """(ready, served model IDs, what was seen): /health answers 200 and /v1/models lists a model."""
    try:
        with _get(f"{params.endpoint}/health", timeout) as r:
            if r.status != 200:
                return False, [], f"/health answered {r.status}"
        with _get(f"{params.endpoint}/v1/models", timeout) as r:
            ids = [m["id"] for m in json.load(r).get("data", [])]
        return bool(ids), ids, "ready" if ids else "/v1/models lists no model"
    except (OSError, ValueError) as e:
        return False, [], f"{type(e).__name__}: {getattr(e, 'reason', e)}"


def _get(url: str, timeout: float):
    # straight to the node, never through a proxy from this machine's environment
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(url, timeout=timeout)


def serve(params: Params, cluster: Cluster, run_dir: Path, say=print) -> Deployment:
    """Bring vLLM up across the nodes (or keep it, when it is healthy and unchanged), wait for it,
    and diagnose when it does not come up. Never leaves a half-started deployment running."""
    t0 = time.monotonic()
    dep = Deployment()
    ray = params.serving.executor == "ray"
    name = serving_container(params)
    dep.fingerprints = {n.name: fingerprint(params, n, False) for n in serving_nodes(params)}
    states = state(params, cluster)
    bad = [f"{n}: {s.error}" for n, s in states.items() if s.error]
    if bad:
        raise CheckFailed("cannot read the nodes' containers: " + "; ".join(bad))
    # what is serving now, and whether it was started from these parameters: vllm serve in the
    # head's Ray container, or the mp containers
    if ray:
        now = serving_fingerprint(params, cluster)
        running, same = now is not None, now == dep.fingerprints[params.head.name]
    else:
        running = any(name in s.containers for s in states.values())
        same = all(states[n].current(name, fp) for n, fp in dep.fingerprints.items())
    if same and running:
        ok, models, _ = healthy(params)
        if ok:
            dep.action, dep.ready, dep.models, dep.seen = "kept", True, models, "healthy, unchanged"
            dep.seconds = time.monotonic() - t0
            say(f"vLLM is already serving {', '.join(models)} and matches the parameters: nothing changed")
            return dep
    check_image(params, states)  # before a running deployment is replaced
    dep.action = "restarted" if running else "started"
    if running:
        say("replacing the running deployment (parameters changed or it is not healthy); its logs go "
            "to the run folder first")
        collect_logs(params, cluster, run_dir, [name], tag="previous")
        _remove_serving(params, cluster)
        states = state(params, cluster)
    dep.conflicts = port_conflicts(params, states)
    if dep.conflicts:
        return dep
    try:
        if ray:
            if not all(states[n.name].containers.get(RAY_CONTAINER, ("",))[0] == "running" for n in params.nodes):
                raise CheckFailed("the Ray cluster is not running on every node: run 04_ray_cluster first")
            cluster.run(ray_serve_command(params), [params.head], timeout=60).check(
                "start vllm serve in the Ray container", "see the message above; 04_ray_cluster "
                "forms the Ray cluster it runs in")
        else:
            start(params, cluster, params.nodes, False, say=say)
        dep.ready, dep.models, dep.seen, dep.stopped = wait_ready(params, cluster,
                                                                  params.serving.startup_timeout)
    finally:
        if not dep.ready:
            dep.diagnosis = diagnose(params, cluster, run_dir)
            dep.logs = {n.name: str(run_dir / "logs" / n.name) for n in params.nodes}
            say("not ready: logs of every node saved; stopping what was started")
            _remove_serving(params, cluster)
    dep.seconds = time.monotonic() - t0
    return dep


def serving_fingerprint(params: Params, cluster: Cluster) -> str | None:
    """The fingerprint vllm serve in the head's Ray container was started with ("" when it has
    none); None when it does not run."""
    r = cluster.run_on(params.head, ["docker", "exec", RAY_CONTAINER, "sh", "-c", sh(
        "pid=$(pgrep -o -f {p}) || exit 3; echo \"FP=$(tr '\\0' '\\n' < /proc/$pid/environ | "
        "sed -n 's/^{e}=//p')\"", p=SERVE_PATTERN, e=SERVE_FP)])
    found = re.search(r"^FP=(.*)$", r.stdout, re.M) if r.ok else None
    return found.group(1).strip() if found else None


def _remove_serving(params: Params, cluster: Cluster) -> None:
    """Stop vLLM: its containers (mp), or vllm serve in the head's Ray container, waited for so
    that its port is free when this returns."""
    if params.serving.executor == "ray":
        cluster.run(["docker", "exec", RAY_CONTAINER, "bash", "-c", sh(
            "pkill -f {p}; for i in $(seq 60); do pgrep -f {p} >/dev/null || exit 0; sleep 1; done; "
            "pkill -9 -f {p}", p=SERVE_PATTERN)], [params.head], timeout=90)
    else:
        cluster.run(["docker", "rm", "-f", params.runtime.container_name])


def wait_ready(params: Params, cluster: Cluster, timeout: float) -> tuple[bool, list[str], str, dict]:
    """Wait for /health and /v1/models, showing every node's latest log line; stop early when a
    serving container dies. Returns (ready, models, what was seen, {node: how its container ended})."""
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    seen = ""
    with Progress(f"waiting for vLLM at {params.endpoint} (up to {timeout:.0f} s)") as progress:
        while time.monotonic() < deadline:
            ok, models, seen = healthy(params)
            progress.update("api", f"{time.monotonic() - t0:5.0f} s  {seen}", force=ok)
            if ok:
                return True, models, seen, {}
            tails = log_tails(params, cluster)
            for node, (status, line) in tails.items():
                progress.update(node, f"[{status}] {line[-160:]}")
            dead = {n: status for n, (status, _) in tails.items() if not status.startswith(("running", "?"))}
            if dead:
                return False, [], f"the serving container stopped on {', '.join(dead)}", dead
            time.sleep(3)
    return False, [], f"not ready after {timeout:.0f} s ({seen})", {}


def log_tails(params: Params, cluster: Cluster) -> dict[str, tuple[str, str]]:
    """Each serving node's container state ("running", or "exited 137 (OOM-killed)"...) and last
    log line. With Ray, "serve-exited" when the Ray container runs but vllm serve in it does not."""
    name = serving_container(params)
    script = sh("s=$(docker inspect --format '{{{{.State.Status}}}} {{{{.State.ExitCode}}}} "
                "{{{{.State.OOMKilled}}}}' {c} 2>/dev/null || echo absent); ", c=name)
    if params.serving.executor == "ray":
        script += sh('case $s in running*) docker exec {c} pgrep -f {p} >/dev/null || s=serve-exited;; esac; '
                     'echo "$s"; tail -n 1 {f} 2>/dev/null', c=name, p=SERVE_PATTERN, f=SERVE_LOG)
    else:
        script += sh('echo "$s"; docker logs --tail 1 {c} 2>&1', c=name)
    out = {}
    for n, r in cluster.run(script, serving_nodes(params), timeout=30).items():
        lines = r.stdout.splitlines()
        first = (lines[0] if lines else "?").split()
        status = first[0] if first else "?"
        if status not in ("running", "?", "absent") and len(first) >= 3:
            status += f" with code {first[1]}" + (", killed for memory (OOM)" if first[2] == "true" else
                                                  ", killed by a signal" if first[1] in ("137", "143") else "")
        out[n] = (status, lines[-1] if len(lines) > 1 else "")
    return out


# ------------------------------------------------------------------------------------ diagnosis

# Known failure signatures in vLLM / NCCL / Ray logs: (pattern, cause, remedy), most specific first.
SIGNATURES: list[tuple[str, str, str]] = [
    (r"Address already in use|EADDRINUSE|address already in use",
     "a port is already in use",
     "stop what holds the port (`ss -ltnp`; 08_teardown removes sparkbook's own) or change `ports`"),
    (r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|Cannot allocate memory|"
     r"No available memory for the cache blocks|insufficient memory",
     "out of memory",
     "lower serving.gpu_memory_utilization or serving.max_model_len; on GB10 stop other GPU "
     "processes and drop the page cache (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)"),
    (r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|ProcessGroupNCCL.*timed out|"
     r"RayChannelTimeoutError|Timed out waiting for object available",
     "an NCCL collective timed out or hung",
     "run 02_collectives: check NCCL_SOCKET_IFNAME / NCCL_IB_HCA point at the fabric rails, the "
     "rails' MTU, and that RDMA devices reach the container (runtime.rdma)"),
    (r"Unsupported CPU attention configuration|No available attention backend|"
     r"attention.*(not supported|unsupported)|Cannot use FlashAttention|head_size .* not supported",
     "an attention configuration this build does not support",
     "pick another attention backend (VLLM_ATTENTION_BACKEND in serving.env) or an image built for "
     "this GPU"),
    (r"(does not exist|No such file or directory|is not a local folder|Repository Not Found|"
     r"Can't load the configuration|not a valid model identifier)",
     "the model path was not found",
     "put the model at model.path on every node (03_distribute_image checks and copies it)"),
    (r"Tensor parallel size \(\d+\) exceeds available GPUs|cannot be larger than the number of "
     r"available GPUs|placement group.*(infeasible|cannot be scheduled)",
     "the tensor-parallel size exceeds the GPUs the cluster has",
     "every node must join with its GPU (04_ray_cluster's GPU check); or lower "
     "serving.tensor_parallel_size"),
    (r"Capturing CUDA graph|cuda graph capture|Capturing cudagraphs",
     "it stopped while capturing CUDA graphs",
     "add --enforce-eager to serving.extra_args (or lower the capture sizes), then compare with 02"),
    (r"unrecognized arguments|error: argument|invalid choice",
     "vllm serve refused an option",
     "fix serving.extra_args (05's image check lists the options this vLLM knows)"),
]


def match_signature(text: str) -> tuple[str, str, str] | None:
    """The first known signature in ``text``: (cause, evidence line, remedy). For the CUDA graph
    capture, only when it is the last thing the log says (a hang, not a passing phase)."""
    for pattern, cause, remedy in SIGNATURES:
        lines = [ln for ln in text.splitlines() if re.search(pattern, ln)]
        if not lines:
            continue
        if "CUDA graph" in cause:
            tail = [ln for ln in text.splitlines() if ln.strip()][-1:]
            if not any(re.search(pattern, ln) for ln in tail):
                continue
        return cause, lines[-1].strip()[-300:], remedy
    return None


def collect_logs(params: Params, cluster: Cluster, run_dir: Path, containers: list[str] | None = None,
                 tag: str = "") -> dict[str, Path]:
    """Every node's sparkbook container logs, vllm serve's log, `ray status` and process list into
    ``run_dir/logs/<node>/`` (before anything is removed)."""
    names = containers or [RAY_CONTAINER, params.runtime.container_name]
    parts = []
    for c in names:
        parts += [sh("echo '@@ docker logs {c}'; docker logs --timestamps {c} 2>&1 | tail -n 5000", c=c)]
    parts += [sh("echo '@@ vllm-serve.log'; tail -n 5000 {f} 2>/dev/null", f=SERVE_LOG),
              sh("echo '@@ ray status'; docker exec {c} ray status 2>&1 | head -n 60", c=RAY_CONTAINER),
              "echo '@@ containers'; docker ps -a --format '{{.Names}}\\t{{.Image}}\\t{{.Status}}' 2>&1",
              "echo '@@ processes'; ps -eo pid,ppid,etime,rss,args --sort=-rss 2>&1 | head -n 40"]
    out = {}
    for node, r in cluster.run("\n".join(parts), timeout=60).items():
        folder = run_dir / "logs" / node
        folder.mkdir(parents=True, exist_ok=True)
        sections = parse_sections(r.stdout) if r.ok else {"error": r.summary()}
        for key, text in sections.items():
            # a container's log is kept even when empty (it said nothing); absent ones are skipped
            if "No such container" in text[:200] or not (text.strip() or key.startswith("docker logs")):
                continue
            fname = (f"{tag}-" if tag else "") + re.sub(r"[^A-Za-z0-9_.-]+", "_", key.replace("docker logs ", "")) + ".log"
            (folder / fname).write_text(text)
        out[node] = folder
    return out


def diagnose(params: Params, cluster: Cluster, run_dir: Path) -> list[dict]:
    """Collect every node's logs, then name the likely cause per node from known signatures."""
    folders = collect_logs(params, cluster, run_dir)
    found = []
    for node, folder in folders.items():
        text = "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob("*.log"))
                         if not p.name.startswith("previous-") and p.name not in ("processes.log",))
        hit = match_signature(text)
        if hit:
            cause, line, remedy = hit
            found.append({"node": node, "cause": cause, "evidence": line, "remedy": remedy,
                          "logs": str(folder)})
    return found


def serve_verdict(params: Params, dep: Deployment, image: Verdict | None = None) -> Verdict:
    """The deployment answers with the expected model, after ``image``'s checks (the image verdict)."""
    v = Verdict("05 vLLM serving").extend(image.checks if image else [])
    head = params.head.name
    if dep.conflicts:
        return v.extend(dep.conflicts)
    if dep.ready:
        v.add(Check("endpoint ready", head, PASS, f"{params.endpoint}: {', '.join(dep.models)} "
                    f"({dep.action}, {dep.seconds:.0f} s)", "/health and /v1/models answer"))
        want = params.served_model
        v.add(Check("served model", head, PASS if want in dep.models else FAIL, ", ".join(dep.models), want,
                    "" if want in dep.models else "check serving.served_model_name"))
        return v
    for node, how in dep.stopped.items():
        killed = "137" in how or "143" in how or "OOM" in how
        v.add(Check("serving container", node, FAIL, f"{serving_container(params)} {how}", "running",
                    f"read its log (logs/{node}/ in the run folder)" + (
                        ": it was killed (`docker kill`, or the kernel's OOM killer: lower "
                        "serving.gpu_memory_utilization)" if killed else ""),
                    f"docker logs {serving_container(params)}"))
    if dep.diagnosis:
        for d in dep.diagnosis:
            v.add(Check("startup", d["node"], FAIL, f"{d['cause']}: {d['evidence']}", "vLLM ready",
                        d["remedy"], f"logs: {d['logs']}"))
    elif not dep.stopped:
        v.add(Check("startup", head, FAIL, f"{dep.seen}; no known failure in the logs", "vLLM ready",
                    "read the logs in the run folder (logs/<node>/); raise serving.startup_timeout if "
                    "the model was still loading", f"logs: {', '.join(dep.logs.values())}"))
    return v


# ------------------------------------------------------------------------------------ teardown

@dataclass
class Teardown:
    removed: dict[str, list[str]] = field(default_factory=dict)
    remaining: dict[str, list[str]] = field(default_factory=dict)
    listeners: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def teardown(params: Params, cluster: Cluster, run_dir: Path) -> Teardown:
    """Logs first, then every sparkbook container on every node; then check that none is left and
    nothing listens on the configured ports."""
    out = Teardown()
    collect_logs(params, cluster, run_dir)
    before = state(params, cluster)
    for n, st in before.items():
        if st.containers:
            out.removed[n] = sorted(st.containers)
    cluster.run(sh("ids=$(docker ps -aq --filter label={l}); [ -z \"$ids\" ] || docker rm -f $ids "
                   ">/dev/null; rm -f {e}", l=LABEL, e=ENV_FILE), timeout=120)
    deadline = time.monotonic() + 30
    ports = params.ports.model_dump()
    while True:
        after = state(params, cluster)
        out.remaining = {n: sorted(s.containers) for n, s in after.items() if s.containers}
        out.listeners = {n: [f"{k} {p}: {listener(s.listeners, p)}" for k, p in ports.items()
                             if listener(s.listeners, p)] for n, s in after.items()}
        out.listeners = {n: v for n, v in out.listeners.items() if v}
        out.errors = {n: s.error for n, s in after.items() if s.error}
        if not (out.remaining or out.listeners) or time.monotonic() > deadline:
            return out
        time.sleep(1)  # sockets close a moment after their process


def teardown_table(t: Teardown) -> Table:
    nodes = sorted(set(t.removed) | set(t.remaining) | set(t.listeners) | set(t.errors))
    rows = [[n, ", ".join(t.removed.get(n, [])) or "nothing", ", ".join(t.remaining.get(n, [])) or "none",
             "; ".join(t.listeners.get(n, [])) or "none"] for n in nodes]
    return Table(["node", "removed", "containers left", "listeners left"], rows, title="teardown")


def teardown_verdict(params: Params, t: Teardown) -> Verdict:
    v = Verdict("08 teardown")
    for n in params.nodes:
        if n.name in t.errors:
            v.add(Check("reachable", n.name, FAIL, t.errors[n.name], "", "check the node (01_preflight)"))
            continue
        v.add(Check("containers removed", n.name, FAIL if n.name in t.remaining else PASS,
                    ", ".join(t.remaining.get(n.name, [])) or
                    (f"removed {', '.join(t.removed[n.name])}" if n.name in t.removed else "none were running"),
                    "no sparkbook container",
                    f"docker rm -f {' '.join(t.remaining[n.name])}" if n.name in t.remaining else "",
                    f"docker ps -a --filter label={LABEL}"))
        v.add(Check("ports released", n.name, FAIL if n.name in t.listeners else PASS,
                    "; ".join(t.listeners.get(n.name, [])) or "no listener on the configured ports",
                    "nothing listening", "stop the process shown (`ss -ltnp`)" if n.name in t.listeners else "",
                    "ss -ltnp"))
    return v
