"""``sparkbook collect [RUN]``: one archive for a bug report, written into the run folder.

What an owner asking for help is asked for, over several rounds, in one file: the versions of
everything on the nodes (OS, kernel, GPU driver, CUDA, Docker, ConnectX-7 firmware) and in the
serving runtime (Python packages, torch with its CUDA and NCCL, read in the image without GPUs, or by
the virtualenv's python), ``nvidia-smi -q`` (clocks and what holds them down), the run's parameters,
verdicts and every other JSON, every node's logs (the run folder's; the kernel's, where OOM kills,
NVRM/Xid errors and mlx5 link flaps show a host wedged by memory or a flapping rail; those of this
deployment's containers still present that this login started, with Ray's session logs and its OOM
kills; vllm serve's log), the NCCL environment (what sparkbook sets, what the image and the
containers carry) and a ``summary.md`` on top: what failed, the versions side by side.

Every node is asked at once, one bundle each (``host_state.sh`` for ``nvidia-smi -q``, memlock, swap
and the rails' firmware, as preflight reads them; ``bug_report.sh`` for the kernel log, the
containers, Ray's session logs and status, vllm serve's log, the processes and the runtime's
versions); a node that does not answer is noted, not fatal.
Everything that enters the archive passes through :func:`sparkbook.book.redact.mask`; the secrets
files never do (their variables are dropped on the node, before anything leaves it). What belongs
to another login on the node stays out: its containers are not read, its processes show their
program alone. What a log or an image says cannot forge the sections' framing (``bug_report.sh``
fences it; :func:`unfenced` reads it back).

What is collected follows what maintainers ask for first: vLLM's bug template asks for the output of
collect_env.py (https://github.com/vllm-project/vllm/blob/2c8972194cbb92c88ba7018437d21be87e2339b9/
.github/ISSUE_TEMPLATE/400-bug-report.yml), which reports the driver, torch and its CUDA, the NCCL
and nvidia packages, and the TORCH_/NCCL_/CUDA_/NVIDIA_ variables, skipping names that look like a
secret (get_env_vars in https://github.com/vllm-project/vllm/blob/030ea52effcb05071543c8c42b8f0145e94cee43/
vllm/collect_env.py); on Sparks, an image rebuilt with another NCCL is a common cause
(https://github.com/eugr/spark-vllm-docker/issues/246), hence the image's NCCL per node."""

from __future__ import annotations

import io
import json
import os
import platform
import re
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

from ..book.errors import SparkbookError
from ..book.project import project_root
from ..book.redact import NAMES, mask, text_files
from ..book.tables import Table
from ..facts import inventory
from ..facts.parsers import parse_sections
from ..nodes import workdir
from ..nodes.remote import Cluster
from ..nodes.shell import Bundle, bundle, script
from ..params import Node, Params, load
from ..serving.containers import deployment_label, owner_label
from ..serving.plan import plan
from ..version import __version__
from . import folder as runfolder
from .fingerprint import VERSIONS_PY, versions

# The variables that steer collectives and the runtime: PREFIX_... (bug_report.sh is given the same)
FABRIC_PREFIXES = ("NCCL", "GLOO", "UCX", "VLLM", "RAY", "TP", "TORCH", "CUDA", "NVIDIA")
FABRIC_ENV = re.compile(rf"^({'|'.join(FABRIC_PREFIXES)})_")
SKIP = {"report.html"}  # the run's report: summary.md and the files it is built from stand for it
MAX_FILE = 50 * 1024 * 1024  # a run folder's file larger than this is listed, not archived
TIMEOUT_S = 240  # the bundle: reading the image's packages imports torch (seconds on a Spark)


def run_time(folder: Path) -> float:
    """When a run folder last changed: the folder, its summary or its verdicts."""
    return max(p.stat().st_mtime for p in (folder, folder / "summary.json", folder / "verdicts") if p.exists())


def runs(base: Path, deployment: str | None = None) -> list[Path]:
    """The run folders in ``base`` (those with a summary or verdicts), of ``deployment`` when given
    (its summary's deployment, or ``interactive-<deployment>``)."""
    found = [d for d in (base.iterdir() if base.is_dir() else [])
             if d.is_dir() and ((d / "summary.json").is_file() or (d / "verdicts").is_dir())]
    return [d for d in found if not deployment or d.name == f"interactive-{deployment}"
            or _summary(d).get("deployment") == deployment]


def latest_run(deployment: str | None = None, root: Path | None = None) -> Path:
    """The newest run folder under ``outputs/`` (see :func:`runs`)."""
    base = (root or project_root()) / "outputs"
    found = runs(base, deployment)
    if not found:
        of = f" of deployment {deployment!r}" if deployment else ""
        raise SparkbookError(f"no run folder{of} under {base}: name one (`sparkbook collect RUN`)")
    return max(found, key=run_time)


def target(run_dir: str | Path | None, params_file: str | Path | None) -> tuple[Path, Params]:
    """The run folder (``run_dir``, else the newest, of the parameters' deployment when given) and
    the parameters (``params_file``, else the run folder's copy)."""
    params = load(params_file) if params_file else None
    run = Path(run_dir).expanduser().resolve() if run_dir else latest_run(params.name if params else None)
    if not run.is_dir():
        raise SparkbookError(f"{run}: no such run folder")
    if params is None:
        if not (run / "parameters.yaml").is_file():
            raise SparkbookError(f"{run} holds no parameters.yaml: name the parameters with -p FILE")
        params = load(run / "parameters.yaml")
    return run, params


def _summary(run_dir: Path) -> dict:
    """The run folder's summary.json, or {} when it is absent or cannot be read (the report is
    made of what can be, so no shape is required; a received folder's file may be anything)."""
    try:
        return runfolder.read_json(run_dir, "summary.json") or {}
    except runfolder.Unreadable:
        return {}


# ------------------------------------------------------------------------------ the nodes

def node_bundle(params: Params, node: Node) -> Bundle:
    """Everything one node tells a bug report, in one round trip (every value an argument; the
    names of secrets and of the fabric's variables are this module's, passed as patterns)."""
    rt = params.runtime
    runtime = ("venv", rt.venv or "") if rt.kind == "venv" else ("docker", rt.image or "")
    return bundle(
        ("inventory", inventory.node_script(params)),
        ("host", script("host_state.sh", *(r.interface for r in node.rails))),
        ("bug report", script("bug_report.sh", deployment_label(params), owner_label(node), NAMES.pattern,
                              "|".join(FABRIC_PREFIXES), plan(params).ray_container, workdir.serve_log(params, node),
                              *runtime, VERSIONS_PY.read_text())))


# a line of bug_report.sh's fenced content: one more "@" before two or more and a space
FENCED = re.compile(r"^@(@@+ )", re.M)


def unfenced(text: str) -> str:
    """A section's text as its source wrote it (bug_report.sh's ``fenced`` undone)."""
    return FENCED.sub(r"\1", text)


def fabric_vars(env: dict[str, str] | list[str]) -> dict[str, str]:
    """The variables of ``env`` (a mapping, or NAME=value lines) that steer collectives and the
    runtime, without any named like a secret."""
    pairs = env.items() if isinstance(env, dict) else (ln.split("=", 1) for ln in env if "=" in ln)
    return {k: v for k, v in pairs if FABRIC_ENV.match(k) and not NAMES.search(k.upper())}


def environment(params: Params, node: Node, sections: dict[str, str]) -> dict:
    """The NCCL environment on ``node``: what sparkbook sets in its containers (none on a node
    outside serving.nodes), what the image carries, what each container of this deployment carries."""
    planned = plan(params).nodes.get(node.name)
    return {"set by sparkbook": fabric_vars(planned.ray.env if planned else {}),
            "image": fabric_vars(sections.get("image env", "").splitlines()),
            "containers": {k[len("container env "):]: fabric_vars(v.splitlines())
                           for k, v in sections.items() if k.startswith("container env ")}}


def gather(params: Params, cluster: Cluster) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Every node's sections (masked), all nodes at once; and why each node that gave none did not."""
    results = cluster.run(lambda n: node_bundle(params, n), timeout=TIMEOUT_S, env={"LC_ALL": "C"})
    nodes, errors = {}, {}
    for name, r in results.items():
        if r.error:
            errors[name] = mask(r.error)
        if r.stdout.strip():  # a node that timed out still gives what it said
            nodes[name] = {mask(k): mask(unfenced(v)) for k, v in parse_sections(r.stdout).items() if v.strip()}
    return nodes, errors


# ------------------------------------------------------------------------------ the archive

def collect(run_dir: str | Path, params: Params, cluster: Cluster) -> Path:
    """Write ``bug-report-<UTC time>.tar.gz`` into ``run_dir`` and return its path."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise SparkbookError(f"{run_dir}: no such run folder")
    root = f"bug-report-{run_dir.name}"
    nodes, errors = gather(params, cluster)
    files: dict[str, str] = {}
    for name, sections in nodes.items():
        for key, text in sections.items():
            files[f"nodes/{name}/{_file_name(key)}"] = text + "\n"
    for name, error in errors.items():
        files[f"nodes/{name}/unreachable.txt"] = error + "\n"
    by_node = {n.name: n for n in params.nodes}
    runtime = "venv" if params.runtime.kind == "venv" else "image"
    found = {name: versions(s, runtime) for name, s in nodes.items()}
    env = {name: environment(params, by_node[name], s) for name, s in nodes.items()}
    files["versions.json"] = json.dumps(found, indent=2) + "\n"
    files["environment.json"] = json.dumps(env, indent=2) + "\n"
    listed = run_files(run_dir)
    files.update({f"run/{rel}": text for rel, text in listed.items() if text is not None})
    left = [rel for rel, text in listed.items() if text is None]
    listing = ["summary.md", *files, *(f"({f}: too large, not archived)" for f in left)]
    summary = summary_md(run_dir, params, nodes, errors, found, env, listing)
    out = run_dir / f"bug-report-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.tar.gz"
    write_archive(out, root, {"summary.md": summary, **files})
    return out


def _file_name(section: str) -> str:
    """A node section's file in the archive: ``docker logs NAME`` -> ``NAME.log``, ``ray log NAME
    raylet.out`` -> ``NAME.raylet.out``, else ``section.txt`` (``vllm-serve.log`` keeps its name)."""
    docker, ray = section.startswith("docker logs "), section.startswith("ray log ")
    stem = section.removeprefix("docker logs ").removeprefix("ray log ").strip().replace(" ", "." if ray else " ")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).lstrip(".")
    return stem if stem.endswith((".log", ".out")) else stem + (".log" if docker else ".txt")


def run_files(run_dir: Path) -> dict[str, str | None]:
    """The run folder's text files by their path in it (None: too large), masked; binary files
    (plots, archives), links, the report and anything named like a secret are left out."""
    out: dict[str, str | None] = {}
    for path, data in text_files(run_dir, MAX_FILE):
        if path.name in SKIP or NAMES.search(path.name.upper()) or path.name.endswith(".env"):
            continue
        out[path.relative_to(run_dir).as_posix()] = None if data is None else mask(data.decode("utf-8", "replace"))
    return out


def write_archive(path: Path, root: str, files: dict[str, str]) -> None:
    """A gzipped tar of ``files`` (name -> text) under ``root/``, every name and text masked,
    readable by its owner alone; written aside, then renamed (never half an archive)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    now = time.time()
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, text in files.items():
            data = mask(text).encode()
            info = tarfile.TarInfo(f"{root}/{mask(name)}")
            info.size, info.mtime, info.mode = len(data), now, 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)


# ------------------------------------------------------------------------------ summary.md

def _listed(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def failures(run_dir: Path) -> tuple[list[str], list[list[str]], int]:
    """What failed in the run: its steps (``summary.json``), the FAIL rows of its verdicts
    (step, check, node, observed, expected, remedy), and how many checks warned."""
    steps = [f"step {s.get('name')}: {s.get('status')}" + (f": {s['error']}" if s.get("error") else "")
             for s in _listed(_summary(run_dir).get("steps")) if s.get("status") not in ("passed", None)]
    rows, warned = [], 0
    for step, verdict in runfolder.verdicts(run_dir):
        if isinstance(verdict, runfolder.Unreadable):
            continue
        rows += [[step, c.check, c.node, c.observed, c.expected, c.remedy] for c in verdict.failures]
        warned += verdict.counts().get("WARN", 0)
    return steps, rows, warned


def summary_md(run_dir: Path, params: Params, nodes: dict[str, dict[str, str]], errors: dict[str, str],
               found: dict[str, dict], env: dict[str, dict], listing: list[str]) -> str:
    run = _summary(run_dir)
    steps, failed, warned = failures(run_dir)
    out = ["# sparkbook bug report", "",
           Table(["", ""], [["run", f"{run_dir.name} ({run.get('status', 'no summary.json')})"],
                            ["deployment", f"{params.name}: {len(params.nodes)} node(s), model "
                             f"{params.model.name}, TP {params.serving.tensor_parallel_size} x PP "
                             f"{params.serving.pipeline_parallel_size}, executor {params.serving.executor}"],
                            ["runtime", params.runtime.image or f"venv {params.runtime.venv}"],
                            ["collected", datetime.now(timezone.utc).isoformat(timespec="seconds")],
                            ["sparkbook", f"{__version__} (Python {platform.python_version()}, "
                             f"{platform.system()} {platform.machine()})"]]).to_markdown(),
           "", "## What failed", ""]
    out += [f"- {s}" for s in steps]
    if failed:
        out += ["", Table(["step", "check", "node", "observed", "expected", "remedy"], failed).to_markdown()]
    if not (steps or failed):
        out.append("Nothing failed in the run's steps and verdicts.")
    if warned:
        out += ["", f"{warned} check(s) warned: see run/verdicts/."]
    if errors:
        out += ["", "## Nodes not reached", "", *[f"- {n}: {e}" for n, e in errors.items()]]
    names = [n.name for n in params.nodes if n.name in found]
    if names:
        rows = [k for k in found[names[0]] if k != "packages"]
        rows += [k for n in names for k in found[n] if k not in rows and k != "packages"]
        table = Table(["", *names], [[r, *(found[n].get(r) for n in names)] for r in rows]).to_markdown()
        out += ["", "## Versions", "", table, "", "Every package of the runtime, per node: versions.json."]
    refused = [f"- {n}: {log}" for n in names if (log := nodes[n].get("kernel log", "")).startswith("refused:")]
    if refused:
        out += ["", "## Kernel log not read", "", *refused]
    containers = [[n, k[len("container "):], *_state(v)] for n in names for k, v in nodes[n].items()
                  if k.startswith("container ") and not k.startswith("container env ")]
    if containers:
        out += ["", "## Containers of this deployment", "",
                Table(["node", "container", "image", "state"], containers).to_markdown()]
    out += ["", "## NCCL environment", ""]
    for n in names:
        lines = ["# set by sparkbook", *_lines(env[n]["set by sparkbook"]), "# image", *_lines(env[n]["image"])]
        for c, v in env[n]["containers"].items():
            lines += [f"# container {c}", *_lines(v)]
        out += [f"{n}:", "```", *lines, "```"]
    out += ["", "## Files", "", "```", *listing, "```", ""]
    return "\n".join(out)


def _lines(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()] or ["(none)"]


def _state(text: str) -> list[str]:
    kv = dict(re.findall(r"^(image|state)=(.*)$", text, re.M))
    return [kv.get("image", "").split(" ")[0], kv.get("state", "")]
