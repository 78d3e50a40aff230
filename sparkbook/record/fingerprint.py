"""The run fingerprint: what exactly ran, kept as ``RUN_DIR/fingerprint.json`` and shown at the top
of the report, so that two runs can say whether their numbers compare, and if not, why.

What decides comparability (:meth:`Fingerprint.key`, :func:`differences`):

* the serving image by its content (its layers' diff IDs and runtime config, as
  :mod:`sparkbook.facts.identity` compares images: the same image under another ID in
  another image store compares equal), else by its ID;
* the vLLM, torch, NCCL, Ray and transformers versions inside it;
* the model: its name, ``model.revision`` and a digest of its file manifest on the head (every
  file's size, the content of the config-like files): what it holds, whoever copied it there (the
  hub's commit, known only where 03 ran in the same run folder, is shown, not compared);
* ``vllm serve``'s options as sparkbook builds them on the head, without this machine's own values
  (the model's folder, ``--host``, ``--port``, ``--master-addr``, ``--master-port``), and the
  serving environment of ``serving.env`` (secrets left out);
* the layout: tensor and pipeline parallel sizes, the executor, how many nodes serve and how many
  there are, the containers' GPU and RDMA access, NCCL's GID index and their shared memory;
* each node's NVIDIA driver, kernel and ConnectX-7 firmware versions (which rail has which version
  is shown, not compared: the same firmware cabled on the other port compares equal), node by node
  in the parameters' order;
* the benchmark's parameters (``benchmark`` without its reference labels): they decide 07's
  numbers, not what the model answers, so ``key(benchmark=False)`` leaves them out.

Informational only: sparkbook's version and commit (and whether its checkout was dirty), when the
fingerprint was taken, the deployment's and nodes' names and addresses, the image's tag and registry
digests, Python and CUDA versions, the full ``vllm serve`` command line, what vLLM logged it ran
with on the head (05's "configuration that ran", from this run folder's serving.json; 05 fails
where it differs from what was asked) and the start-up's timeline (there too: a slow start told
from a stuck one, run against run), and a hash of the whole parameters (without
``nodes[*].key``, so that two machines' copies of one file hash alike: it tells "the same file",
not "comparable", since the deciding parts are above).

What could not be read (a node that does not answer, the image absent, the runtime's versions) is
named in ``unread``; such a fingerprint is still written, and compares with no other (its key is
its own). Every node is asked at once, with one bundle of node scripts each: ``host_state.sh``
(driver, firmware), ``fingerprint.sh`` (kernel; on the head the image's identity and the runtime's
versions, read with ``image_versions.py --light``, in the serving container while it runs: NCCL's
version without importing torch where a package or the image names it) and ``model_manifest.sh`` on the head. 06 and 07 take it first (:func:`ensure`),
``sparkbook run`` after the steps where none did; ``sparkbook compare`` reads two (:func:`load`,
:func:`differences`).
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import subprocess
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..book.redact import mask
from ..book.tables import human_bytes
from ..facts import inventory
from ..facts.identity import INSPECT_FORMAT, ImageIdentity, parse, same_image
from ..facts.manifest import manifest_script, parse_manifest
from ..facts.parsers import parse_sections
from ..nodes.remote import Cluster
from ..nodes.shell import SCRIPTS, Bundle, bundle, script
from ..params import Node, Params, secrets_written
from ..preflight.host_state import parse_host_state
from ..serving.commands import shown
from ..serving.plan import plan
from ..serving.containers import deployment_label, owner_label
from ..serving.inspection import CACHE as INSPECTION
from ..version import __version__

if TYPE_CHECKING:
    from ..notebook import Context

FILE = "fingerprint.json"
TIMEOUT_S = 240  # the runtime's versions: torch is imported where nothing else names NCCL (seconds on a Spark)
# vllm serve's options whose values are this machine's own, not what it serves
MACHINE_OPTIONS = ("--host", "--port", "--master-addr", "--master-port")
# the runtime's versions that decide: name in the fingerprint -> as shown (and a row of versions())
VERSIONS = {"vllm": "vLLM", "torch": "torch", "nccl": "NCCL", "ray": "Ray", "transformers": "transformers"}
# files whose change since the fingerprint was taken means another deployment: 03, 04/05, 05
NEWER = ("distribution.json", INSPECTION, "serving.json")
VERSIONS_PY = SCRIPTS / "image_versions.py"  # run in the serving image (or by the venv's python)
# rows of the versions table read from the image's packages: (row, package)
PACKAGES = (("torch", "torch"), ("vLLM", "vllm"), ("Ray", "ray"), ("transformers", "transformers"))


def versions(sections: dict[str, str], runtime: str = "image") -> dict:
    """The versions one node reported: its host's and its runtime's (``packages``: every one), the
    runtime an ``image`` or a ``venv``."""
    facts = inventory.parse(f"@@ facts\n{sections.get('facts', '')}\n@@ gpu\n{sections.get('gpu', '')}")
    smi = dict(re.findall(r"^(Driver|CUDA) Version\s*:\s*(\S+)", sections.get("smi-q", ""), re.M))
    firmware = (parse_host_state(sections) or {}).get("firmware", {})
    found = re.search(r"^VERSIONS (\{.*\})$", sections.get("runtime versions", ""), re.M)
    try:
        image = json.loads(found.group(1)) if found else {}
    except ValueError:
        image = {}
    packages = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in image.get("packages", {}).items()}
    image_env = dict(ln.split("=", 1) for ln in sections.get("image env", "").splitlines() if "=" in ln)
    out = {"OS": facts.get("os"), "kernel": facts.get("kernel"), "arch": facts.get("arch"),
           "GPU driver": facts.get("driver") or smi.get("Driver"), "CUDA (driver)": smi.get("CUDA"),
           "Docker": facts.get("docker"),
           "CX-7 firmware": ", ".join(f"{k}: {v}" for k, v in firmware.items()) or None,
           **({"image ID": sections.get("image") or None} if runtime == "image" else {}),
           f"Python ({runtime})": image.get("python"),
           **{row: packages.get(name) for row, name in PACKAGES},
           "CUDA (torch)": image.get("torch_cuda"),
           "NCCL (torch)": image.get("nccl") or (image.get("nccl_error") and f"({image['nccl_error']})")}
    if runtime == "image":
        out.update({"CUDA_VERSION (image)": image_env.get("CUDA_VERSION"),
                    "NCCL_VERSION (image)": image_env.get("NCCL_VERSION")})
    if sections.get("runtime versions") and not found:
        out[f"{runtime} versions"] = sections["runtime versions"].strip().splitlines()[-1]  # the error
    return {**out, "packages": image.get("packages", {})}


@dataclass
class Fingerprint:
    """What ran: see the module's docstring for which fields decide comparability."""
    sparkbook: dict[str, Any] = field(default_factory=dict)  # version, commit, dirty
    created: str = ""
    deployment: str = ""
    image: dict[str, Any] = field(default_factory=dict)      # name, id, digests, content
    versions: dict[str, str | None] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)      # name, revision, commit, manifest, files, bytes
    serving: dict[str, Any] = field(default_factory=dict)    # flags, env, command
    layout: dict[str, Any] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # name, host, role, driver, kernel, firmware
    benchmark: dict[str, Any] = field(default_factory=dict)
    params_hash: str = ""
    unread: dict[str, str] = field(default_factory=dict)     # what could not be read -> why

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def deciding(self, benchmark: bool = True) -> dict[str, Any]:
        """The fields that decide comparability, flat: ``{label: value}``."""
        out: dict[str, Any] = {"image": self.image.get("content") or self.image.get("id")}
        out.update({shown: self.versions.get(name) for name, shown in VERSIONS.items()})
        out.update({f"model {k}": self.model.get(k) for k in ("name", "revision", "manifest")})
        out["vllm serve"] = " ".join(self.serving.get("flags", []))
        out["serving env"] = " ".join(f"{k}={v}" for k, v in sorted(self.serving.get("env", {}).items()))
        out.update(self.layout)
        for i, n in enumerate(self.nodes, 1):
            out.update({f"node {i} {k}": n.get(k) for k in ("driver", "kernel")})
            out[f"node {i} firmware"] = _versions(n.get("firmware"))
        if benchmark:
            out.update({f"benchmark.{k}": v for k, v in self.benchmark.items()})
        return out

    def key(self, benchmark: bool = True) -> str:
        """A short digest of what decides comparability (:meth:`deciding`); two runs compare when
        their keys are equal. A fingerprint with something unread has a key of its own."""
        what: dict[str, Any] = {"deciding": self.deciding(benchmark)}
        if self.unread:
            what.update(unread=self.unread, created=self.created)
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) for people: the report's table."""
        sb, img, m, lay = self.sparkbook, self.image, self.model, self.layout
        commit = f", commit {sb['commit'][:12]}{' (dirty)' if sb.get('dirty') else ''}" if sb.get("commit") else ""
        key = self.key()
        comparable = (f"{key}: not comparable, not read: " + "; ".join(f"{k}: {v}" for k, v in self.unread.items())
                      if self.unread else f"{key} (runs with the same key compare)")
        size = f", {m['files']} files, {human_bytes(m['bytes'])}" if m.get("files") is not None else ""
        ran = self.serving.get("ran") or {}
        ran_row = [("ran (vLLM's log)", f"vLLM {ran.get('version')}: " + ", ".join(
            f"{k}={v}" for k, v in (ran.get("args") or {}).items()))] if ran else []
        if api := (self.serving.get("timeline") or {}).get("api"):
            ran_row.append(("start-up", ", ".join(f"{k} {v:.0f} s" for k, v in api.items())))
        rows = [("fingerprint", comparable),
                ("sparkbook", f"{sb.get('version')}{commit}"),
                ("image", " ".join(_short(x) for x in (img.get("name"), img.get("id"), *img.get("digests", [])) if x)),
                ("versions", " · ".join(f"{VERSIONS[k]} {_short(v)}" for k, v in self.versions.items() if k in VERSIONS)),
                ("model", f"{m.get('name')} @ {m.get('revision') or 'default'}"
                          + (f" (commit {m['commit'][:12]})" if m.get("commit") else "")
                          + f", manifest {m.get('manifest')}{size}"),
                ("vllm serve", " ".join(self.serving.get("flags", [])) or "—"),
                *ran_row,
                ("layout", f"TP {lay.get('tensor parallel')} × PP {lay.get('pipeline parallel')}, executor "
                           f"{lay.get('executor')}, {lay.get('serving nodes')} of {lay.get('nodes')} node(s) serving, "
                           f"{lay.get('containers')}")]
        rows += [(f"{n.get('name')} ({n.get('role')})", f"not read: {self.unread[n.get('name')]}"
                  if n.get("name") in self.unread else
                  " · ".join(f"{k} {_short(_text(n.get(k)))}" for k in ("driver", "kernel", "firmware")))
                 for n in self.nodes]
        rows += [("benchmark", ", ".join(f"{k} {v}" for k, v in self.benchmark.items())),
                 ("parameters", f"{self.deployment}, hash {self.params_hash}"), ("taken", self.created)]
        return rows

    def html(self) -> str:
        """A compact table for the report (its values masked)."""
        body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(mask(v))}</td></tr>" for k, v in self.rows())
        return f"<table class='sparkbook-summary sparkbook-fingerprint'><tbody>{body}</tbody></table>"


def _text(value: Any) -> str | None:
    """A firmware mapping as ``interface version, ...``; other values as they are."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items())) or "none"
    return value


def _versions(firmware: Any) -> str | None:
    """A firmware mapping as its versions alone, sorted: ``28.45.1020`` for two rails alike."""
    if not isinstance(firmware, dict):
        return firmware  # None: not read
    return ", ".join(sorted(set(map(str, firmware.values())))) or "none"


def _short(value: Any) -> str:
    """``sha256:0123456789abcdef...`` -> ``sha256:0123456789ab..``: IDs and digests in a line;
    None as ``—``."""
    return "—" if value is None else re.sub(r"(sha256:[0-9a-f]{12})[0-9a-f]{8,}", r"\1..", str(value))


def differences(a: Fingerprint, b: Fingerprint, benchmark: bool = True) -> list[str]:
    """Why the runs of ``a`` and ``b`` do not compare, one line per deciding field that differs
    (``image: sha256:ab12.. -> sha256:cd34..``) and per thing either could not read; empty when
    they compare (``a.key(benchmark) == b.key(benchmark)``)."""
    lines = [f"{which} run: not read: {k}: {v}" for which, fp in (("first", a), ("second", b))
             for k, v in fp.unread.items()]
    da, db = a.deciding(benchmark), b.deciding(benchmark)
    for label in dict.fromkeys([*da, *db]):
        x, y = da.get(label), db.get(label)
        if x == y:
            continue
        if label == "image":  # its content differs: name it by its IDs
            x, y = a.image.get("id"), b.image.get("id")
        shown_label = label
        if m := re.match(r"node (\d+) ", label):
            i = int(m[1]) - 1
            names = dict.fromkeys(fp.nodes[i]["name"] for fp in (a, b) if i < len(fp.nodes))
            shown_label = f"{label} ({' / '.join(names)})"
        lines.append(f"{shown_label}: {_short(x)} -> {_short(y)}")
    return lines


def load(run_dir: str | Path) -> Fingerprint | None:
    """The run folder's fingerprint, None where it has none (or not a readable one)."""
    try:
        data = json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, ValueError):
        return None
    return Fingerprint.from_json(data) if isinstance(data, dict) else None


def save(fp: Fingerprint, run_dir: str | Path) -> Path:
    path = Path(run_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mask(json.dumps(fp.to_json(), indent=2, default=str)) + "\n")
    return path


def ensure(ctx: Context, timeout: float = TIMEOUT_S) -> Fingerprint:
    """The run's fingerprint: the run folder's, while it holds (nothing unread, the same
    parameters, taken after 03, 04/05 and 05 last wrote their files: a folder reused by a notebook
    run by hand may hold an older deployment's); else taken from the run folder and the nodes and
    written into it (``timeout``: the nodes' bundle's, in seconds)."""
    found, path = load(ctx.run_dir), Path(ctx.run_dir) / FILE
    if found and not found.unread and found.params_hash == params_hash(ctx.params) and not any(
            (p := Path(ctx.run_dir) / name).exists() and p.stat().st_mtime > path.stat().st_mtime for name in NEWER):
        return found
    fp = build(ctx.params, ctx.cluster, Path(ctx.run_dir), timeout)
    print(f"run fingerprint {fp.key()}{' (not comparable: something unread)' if fp.unread else ''}: "
          f"{save(fp, ctx.run_dir)}")
    return fp


# ------------------------------------------------------------------------------ taking it

def node_bundle(params: Params, node: Node) -> Bundle:
    """What one node tells the fingerprint, in one round trip (see the module's docstring)."""
    host = ("host", script("host_state.sh", *(r.interface for r in node.rails)))
    if node.role != "head":
        return bundle(host, ("fingerprint", script("fingerprint.sh")))
    image = params.runtime.image or ""
    return bundle(host, ("fingerprint", script("fingerprint.sh", image, INSPECT_FORMAT, plan(params).serving_container,
                                               deployment_label(params), owner_label(node), VERSIONS_PY.read_text())),
                  ("model", manifest_script(params.model.path, hash_all=False)))


def gather(params: Params, cluster: Cluster,
           timeout: float = TIMEOUT_S) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Every node's sections, all nodes at once; and why each node that gave nothing did not."""
    results = cluster.run(lambda n: node_bundle(params, n), timeout=timeout, env={"LC_ALL": "C"})
    found, unread = {}, {}
    for node in params.nodes:
        r = results.get(node.name)
        sections = parse_sections(r.stdout) if r is not None else {}
        if r is None or r.error or "kernel" not in sections:
            unread[node.name] = mask(r.summary() if r is not None else "not asked")
        found[node.name] = sections
    return found, unread


def build(params: Params, cluster: Cluster, run_dir: Path, timeout: float = TIMEOUT_S) -> Fingerprint:
    """Take the fingerprint: the nodes asked at once, the run folder read (03's hub commit, 05's
    image inspection)."""
    nodes, unread = gather(params, cluster, timeout)
    head = nodes.get(params.head.name, {})
    fp = Fingerprint(sparkbook=checkout(), created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     deployment=params.name, params_hash=params_hash(params), unread=unread,
                     serving=serving(params), layout=layout(params), benchmark=benchmark(params))
    fp.serving.update(started(params, run_dir))
    fp.image, identity, env = image(params, head.get("image identity", ""))
    fp.versions = runtime(head, identity, env, run_dir / INSPECTION)
    fp.model = model(params, head.get("model"), run_dir / "distribution.json")
    for node in params.nodes:
        s = nodes[node.name]
        v = versions(s) if node.name not in unread else {}
        state = parse_host_state(s) if node.name not in unread else None
        fp.nodes.append({"name": node.name, "host": node.host, "role": node.role, "driver": v.get("GPU driver"),
                         "kernel": s.get("kernel") or None, "firmware": state["firmware"] if state else None})
    if params.head.name not in unread:
        if fp.image.get("id") is None:
            fp.unread["image"] = f"{params.runtime.image or 'no image (runtime ' + params.runtime.kind + ')'} " \
                                 f"is not on {params.head.name}"
        elif fp.versions.get("vllm") is None:
            text = head.get("runtime versions", "").strip()
            fp.unread["versions"] = mask(text.splitlines()[-1] if text else "image_versions.py printed nothing")
    return fp


def image(params: Params, text: str) -> tuple[dict[str, Any], ImageIdentity | None, dict[str, str]]:
    """The image on the head (name, ID, registry digests, a digest of its content), its identity,
    and the variables of its environment that name versions (CUDA_VERSION, NCCL_VERSION)."""
    raw = parse(text)
    ident = ImageIdentity.of(raw)
    if ident is None:
        return {"name": params.runtime.image, "id": None, "digests": [], "content": None}, None, {}
    content = (hashlib.sha256(json.dumps({"layers": ident.layers, "config": ident.config}, sort_keys=True)
                              .encode()).hexdigest() if ident.content_known else None)
    env = dict(e.partition("=")[::2] for e in ((raw or {}).get("Config") or {}).get("Env") or [])
    return ({"name": params.runtime.image, "id": ident.id, "digests": list(ident.digests), "content": content},
            ident, {k: v for k, v in env.items() if k in ("CUDA_VERSION", "NCCL_VERSION")})


def runtime(head: dict[str, str], ident: ImageIdentity | None, env: dict[str, str],
            inspection: Path) -> dict[str, str | None]:
    """The runtime's versions: 05's image inspection where it read this image, the rest (NCCL)
    from image_versions.py ``--light`` (NCCL as an nvidia-nccl package names it, else the image's
    NCCL_VERSION, else torch); where torch failed to say, as the package or NCCL_VERSION names it."""
    read = versions(head) if head.get("runtime versions") else {}
    out: dict[str, str | None] = {k: read.get(row) for k, row in {**VERSIONS, "nccl": "NCCL (torch)"}.items()}
    try:
        cached = json.loads(inspection.read_text())
    except (OSError, ValueError):
        cached = {}
    seen = ImageIdentity.of(cached.get("identity") or cached.get("image_id")) if isinstance(cached, dict) else None
    if seen and same_image(ident, seen)[0]:
        out.update({k: cached[k] for k in ("vllm", "torch", "ray", "transformers") if cached.get(k)})
    packages = read.get("packages", {})
    nccl_package = next((v for k, v in sorted(packages.items()) if k.lower().startswith("nvidia-nccl")), None)
    if not out["nccl"] or out["nccl"].startswith("("):  # torch did not say: "(its error)"
        out["nccl"] = nccl_package or env.get("NCCL_VERSION")  # None: no NCCL there (a CPU torch)
    out.update({"python": read.get("Python (image)"), "cuda (torch)": read.get("CUDA (torch)"),
                "cuda (image)": env.get("CUDA_VERSION")})
    return out


def model(params: Params, manifest_text: str | None, distribution: Path) -> dict[str, Any]:
    """The model: its name and revision, the hub's commit 03 downloaded, a digest of its manifest
    on the head (None: not read; ``absent``: no folder there)."""
    try:
        commit = (json.loads(distribution.read_text()).get("hub") or {}).get("commit")
    except (OSError, ValueError, AttributeError):
        commit = None
    out = {"name": params.model.name, "revision": params.model.revision, "commit": commit, "path": params.model.path,
           "manifest": None, "files": None, "bytes": None}
    if manifest_text is not None:
        files = parse_manifest(manifest_text)
        out["manifest"] = "absent" if files is None else hashlib.sha256(
            json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
        if files is not None:
            out.update(files=len(files), bytes=sum(f["size"] for f in files.values()))
    return out


def serving(params: Params) -> dict[str, Any]:
    """vllm serve's options on the head without this machine's own values (``flags``), the serving
    environment without its secrets (``env``), and the whole command as shown (``command``)."""
    command = plan(params).nodes[params.head.name].serve_args
    args = command[3:]  # past "vllm serve MODEL_PATH"
    flags, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.split("=", 1)[0] in MACHINE_OPTIONS:
            skip = "=" not in a
        else:
            flags.append(mask(a))
    hidden = secrets_written(params)
    return {"flags": flags, "env": {k: mask(v) for k, v in params.serving.env.items() if k not in hidden},
            "command": shown(command)}


def started(params: Params, run_dir: Path) -> dict[str, Any]:
    """What this run folder's 05 recorded of vLLM's start (serving.json; nothing where 05 did not
    run here): what vLLM logged it ran with on the head (``ran``) and the start-up's ``timeline``."""
    try:
        recorded = json.loads((run_dir / "serving.json").read_text())
        return {"ran": (recorded.get("ran") or {}).get(params.head.name) or {},
                "timeline": recorded.get("timeline") or {}}
    except (OSError, ValueError, AttributeError):
        return {}


def layout(params: Params) -> dict[str, Any]:
    s, rt = params.serving, params.runtime
    return {"tensor parallel": s.tensor_parallel_size, "pipeline parallel": s.pipeline_parallel_size,
            "executor": s.executor, "serving nodes": len(params.serving_nodes), "nodes": len(params.nodes),
            "containers": f"gpus {'on' if rt.gpus else 'off'}, rdma {'on' if rt.rdma else 'off'}, "
                          f"NCCL GID index {rt.nccl_ib_gid_index}, shm {rt.shm_size}"}


def benchmark(params: Params) -> dict[str, Any]:
    """The benchmark's parameters that decide its numbers (its reference labels do not)."""
    return {k: v for k, v in params.benchmark.model_dump(mode="json").items() if k != "references"}


def params_hash(params: Params) -> str:
    """A digest of the validated parameters without the nodes' key files (paths on this machine)."""
    data = params.model_dump(mode="json")
    for n in data.get("nodes", []):
        n.pop("key", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def checkout() -> dict[str, Any]:
    """sparkbook's version, and the commit of the git checkout it runs from (None: not one), with
    whether that checkout has changes."""
    root = Path(__file__).resolve().parents[2]
    out: dict[str, Any] = {"version": __version__, "commit": None, "dirty": None}
    if not (root / ".git").exists():
        return out
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.SubprocessError):
        return out
    if head.returncode == 0:
        out.update(commit=head.stdout.strip(), dirty=bool(status.stdout.strip()) if status.returncode == 0 else None)
    return out
