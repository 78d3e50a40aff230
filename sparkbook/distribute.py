"""03_distribute_image: the same image and the same model on every node, sending only what is missing.

The image: one ``docker save`` on the head streams through ``scripts/imagestream.py`` (run on the
head) into one ``ssh WORKER docker load`` per worker, over the fabric, without a file on either side.
Each worker's stream leaves out the layers that worker already holds (see the script for why
``docker load`` accepts that), so a new nightly that shares its base costs only its new layers.
Or, for nodes that can reach a registry, ``docker pull`` on every node.

The model: preflight's manifest on every node; where a worker's differs from the head's, rsync over
the fabric sends the differing files only (resumable: partial files wait in a side folder, never
under their real name), then the manifest is compared again.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .params import Node, Params
from .parsers import parse_sections
from .manifest import describe_differences, manifest_differences, manifest_script, parse_manifest
from .remote import REMOTE_DIR, Cluster, command_line, peer_ssh, sh
from .scripts.imagestream import chain_ids
from .progress import Progress, bar
from .tables import Table, human_bytes, short_id
from .verdict import FAIL, PASS, WARN, Check, Verdict

SCRIPT = Path(__file__).parent / "scripts" / "imagestream.py"
STREAM = f"{REMOTE_DIR}/imagestream.py"
PARTIAL_DIR = ".sparkbook-partial"


# ------------------------------------------------------------------------------------------ image

@dataclass
class NodeImage:
    """What a node's Docker holds and can do, as far as distribution cares."""
    node: str
    id: str | None = None
    size: int | None = None
    docker: str = ""
    driver: str = ""
    root: str = ""
    containerd_store: bool = False
    layers: list[str] = field(default_factory=list)    # the configured image's diff IDs
    chains: set[str] = field(default_factory=set)      # every layer chain the node holds
    zstd: bool = False
    error: str | None = None

    def held(self, layers: list[str]) -> list[str]:
        """The layer chains of an image with diff IDs ``layers`` that this node holds."""
        return [c for c in chain_ids(layers) if c in self.chains]

    @property
    def store(self) -> dict | None:
        """Where the stream script may read layers directly (overlay2, classic store)."""
        if self.driver == "overlay2" and not self.containerd_store and self.root.startswith("/") and self.id:
            return {"root": self.root, "driver": self.driver, "image_id": self.id}
        return None

    @property
    def skips_layers(self) -> bool:
        """Docker's classic image store loads an archive without the layers it holds; the containerd
        image store (optional since Docker 24, default on new installs of 29) wants every blob."""
        return not self.containerd_store and not self.error


def survey_script(image: str) -> str:
    return "\n".join([
        "echo '@@ id'", sh("docker image inspect --format '{{{{.Id}}}} {{{{.Size}}}}' {i} 2>/dev/null"
                           " || echo absent", i=image),
        "echo '@@ image layers'", sh("docker image inspect --format '{{{{json .RootFS.Layers}}}}' {i} "
                                     "2>/dev/null", i=image),
        "echo '@@ docker'", "docker version --format '{{.Server.Version}}' 2>&1",
        "echo '@@ driver'", "docker info --format '{{.Driver}} {{json .DriverStatus}}' 2>&1",
        "echo '@@ root'", "docker info --format '{{.DockerRootDir}}' 2>&1",
        "echo '@@ layers'", "docker image ls -q --no-trunc | sort -u | "
        "xargs -r docker image inspect --format '{{json .RootFS.Layers}}' 2>/dev/null",
        "echo '@@ zstd'", "command -v zstd || echo absent",
    ])


def parse_survey(node: str, text: str) -> NodeImage:
    s = parse_sections(text)
    out = NodeImage(node, docker=s.get("docker", "").strip(), zstd=s.get("zstd", "absent").strip() != "absent")
    ident = s.get("id", "absent").split()
    if ident and ident[0] != "absent":
        out.id, out.size = ident[0], int(ident[1]) if len(ident) > 1 else None
    driver = s.get("driver", "").strip()
    out.driver = driver.split(" ", 1)[0]
    out.root = s.get("root", "").strip()
    out.containerd_store = "io.containerd.snapshotter" in driver
    if s.get("image layers", "").startswith("["):
        out.layers = json.loads(s["image layers"])
    for line in s.get("layers", "").splitlines():
        if line.startswith("["):
            out.chains.update(chain_ids(json.loads(line)))
    return out


def survey(params: Params, cluster: Cluster) -> dict[str, NodeImage]:
    """Every node's view of the configured image (one round trip)."""
    res = cluster.run(survey_script(params.runtime.image))
    return {n: parse_survey(n, r.stdout) if r.ok else NodeImage(n, error=r.summary())
            for n, r in res.items()}


def image_ids(params: Params, cluster: Cluster) -> dict[str, str | None]:
    """The configured image's ID on every reachable node (None where absent)."""
    res = cluster.run(["docker", "image", "inspect", "--format", "{{.Id}}", params.runtime.image])
    return {n: (r.stdout.strip() if r.ok else None) for n, r in res.items()}


@dataclass
class Transfer:
    """One worker's copy: what was sent, left out, how fast, and how it ended."""
    node: str
    method: str
    compressed: bool = False
    read_from: str = ""  # what produced the archive: the head's layer store, or docker save
    sent: int = 0        # archive bytes streamed
    wire: int = 0        # bytes through SSH (fewer than sent when compressed)
    skipped: int = 0     # archive bytes left out: layers the worker holds
    layers_held: int = 0  # layers the worker held already: never read, or left out of its stream
    seconds: float = 0.0
    error: str | None = None
    output: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def rate_mb_s(self) -> float:
        return self.wire / self.seconds / 1e6 if self.seconds else 0.0


@dataclass
class ImageOutcome:
    image: str
    source: str
    head_id: str | None
    before: dict[str, str | None]
    after: dict[str, str | None] = field(default_factory=dict)
    transfers: list[Transfer] = field(default_factory=list)
    probe: dict = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "transfers": [{**asdict(t), "rate_mb_s": round(t.rate_mb_s, 1)}
                                              for t in self.transfers]}


class _Lines:
    """A text sink (for :meth:`Cluster.run`'s ``stream``) that hands each whole line to ``each``."""

    def __init__(self, each):
        self.each, self.buf = each, ""

    def write(self, s: str) -> int:
        self.buf += s
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            self.each(line)
        return len(s)

    def flush(self) -> None:
        pass


def choose_compression(params: Params, cluster: Cluster, head: NodeImage,
                       workers: list[Node], nodes: dict[str, NodeImage]) -> tuple[bool, dict]:
    """zstd on the stream: ``on``/``off`` as asked (``on`` needs zstd at both ends), ``auto`` when
    both ends have it and zstd -1 on the head outruns the SSH pipe to the slowest worker."""
    mode = params.distribution.compress
    both = head.zstd and all(nodes[w.name].zstd for w in workers)
    if mode == "off":
        return False, {"decision": "off (parameter)"}
    if not both:
        lacking = [n for n in [head.node] + [w.name for w in workers] if not nodes[n].zstd]
        return False, {"decision": f"off: no zstd on {', '.join(lacking)}"}
    if mode == "on":
        return True, {"decision": "on (parameter)"}
    spec = {"workers": [{"name": w.name, "ssh": peer_ssh(w)} for w in workers]}
    r = cluster.run_on(params.head, sh("python3 {s} probe {j}", s=STREAM, j=json.dumps(spec)), timeout=120)
    found = re.search(r"^PROBE (.*)$", r.stdout, re.M)
    if not r.ok or not found:
        return False, {"decision": "off: the probe failed", "error": r.summary()}
    probe = json.loads(found.group(1))
    pipe = min(probe["pipe_mb_s"].values(), default=0)
    fast = probe.get("zstd_mb_s", 0) > pipe > 0
    probe["decision"] = (f"{'on' if fast else 'off'}: zstd -1 {probe.get('zstd_mb_s', 0):.0f} MB/s "
                         f"{'>' if fast else '<='} SSH pipe {pipe:.0f} MB/s")
    return fast, probe


def stream_from_head(params: Params, cluster: Cluster, workers: list[Node],
                     nodes: dict[str, NodeImage], compress: bool, show: bool = True) -> list[Transfer]:
    """One read of the image on the head per batch of ``distribution.parallel`` workers, each
    worker's stream without the layers it holds (where its Docker allows that)."""
    transfers = []
    reader, head = params.distribution.reader, nodes[params.head.name]
    store = head.store if reader != "docker-save" else None
    if store and reader == "container":
        store = {**store, "via": "container"}
    step = params.distribution.parallel
    for i in range(0, len(workers), step):
        batch = workers[i:i + step]
        spec = {"image": params.runtime.image, "store": store, "workers": [
            {"name": w.name, "ssh": peer_ssh(w), "zstd": compress,
             "have": nodes[w.name].held(head.layers) if nodes[w.name].skips_layers else []}
            for w in batch]}
        done: dict[str, dict] = {}
        start = time.monotonic()
        with Progress(f"{params.runtime.image} from {params.head.name}") as progress:
            def each(line: str) -> None:
                m = re.match(r"\[[^]]+\] (PROGRESS|DONE) (.*)", line)
                if m and m.group(1) == "DONE":
                    rec = json.loads(m.group(2))
                    done[rec["name"]] = rec
                elif m and show:
                    name, sent, _skipped, expected, wire = m.group(2).split()
                    progress.update(name, bar(_int(sent), max(_int(expected), _int(sent)), start)
                                    + f"  (on the wire {human_bytes(_int(wire))})")

            r = cluster.run_on(params.head, sh("python3 {s} stream {j}", s=STREAM, j=json.dumps(spec)),
                               timeout=params.distribution.timeout_s, stream=_Lines(each))
        took = time.monotonic() - start
        for w in batch:
            rec = done.get(w.name)
            t = Transfer(w.name, "layer-skipping stream" if nodes[w.name].skips_layers else "full stream",
                         compress, seconds=took)
            if not nodes[w.name].skips_layers:
                t.note = (f"{w.name}'s Docker uses the containerd image store, which needs every layer "
                          "in the archive: the whole image was sent")
            if rec is None:
                t.error = f"the stream ended without a result: {r.summary()}"
            else:
                t.sent, t.wire, t.skipped = rec["sent"], rec["wire"], rec["skipped"]
                t.layers_held, t.read_from = rec["held"], rec["source"]
                t.error, t.output = rec["error"], rec["output"]
                if t.error and rec["output"]:
                    t.error += f": {rec['output'][-1]}"
            transfers.append(t)
    return transfers


def survey_table(params: Params, nodes: dict[str, NodeImage]) -> Table:
    head = nodes[params.head.name]
    rows = [[n, s.error or short_id(s.id), "" if s.error else "yes" if s.id == head.id else "no",
             s.docker, "containerd" if s.containerd_store else s.driver and f"classic ({s.driver})",
             f"{len(s.held(head.layers))} of {len(head.layers)}", "yes" if s.zstd else "no"]
            for n, s in nodes.items()]
    return Table(["node", "image", "same as head", "docker", "image store", "layers held", "zstd"],
                 rows, title=f"{params.runtime.image} on every node")


def distribute_image(params: Params, cluster: Cluster, nodes: dict[str, NodeImage] | None = None,
                     say=print, show: bool = True) -> ImageOutcome:
    """Make every node hold the head's image (or pull it everywhere); never raises for one node's
    failure: the outcome records it, and :func:`image_verdict` fails on it. ``nodes``: a
    :func:`survey` just taken."""
    start = time.monotonic()
    image, source = params.runtime.image, params.distribution.source
    nodes = nodes or survey(params, cluster)
    head = nodes[params.head.name]
    out = ImageOutcome(image, source, head.id, {n: s.id for n, s in nodes.items()})
    out.errors.update({n: s.error for n, s in nodes.items() if s.error})
    if source == "registry":
        say(f"pulling {image} on every node")
        pulled = cluster.run(sh("docker pull {i}", i=image), timeout=params.distribution.timeout_s,
                             stream=True)
        out.errors.update({n: r.summary() for n, r in pulled.items() if not r.ok})
    elif head.id is None:
        out.errors[params.head.name] = head.error or f"{image} is not on the head"
    else:
        todo = [w for w in params.workers if not nodes[w.name].error and nodes[w.name].id != head.id]
        if not todo:
            say(f"{image} ({short_id(head.id)}) is already on every node: nothing to send")
        else:
            cluster.put(SCRIPT, STREAM, [params.head]).check("copy the image stream script to the head")
            compress, out.probe = choose_compression(params, cluster, head, todo, nodes)
            for w in todo:
                mine = nodes[w.name]
                say(f"{w.name}: holds {short_id(mine.id)}; " + (
                    f"{len(mine.held(head.layers))} of the image's {len(head.layers)} layers "
                    "already there" if mine.skips_layers else "its Docker cannot load a partial archive"))
            say(f"streaming from {params.head.name}, compression {out.probe['decision']}")
            out.transfers = stream_from_head(params, cluster, todo, nodes, compress, show)
            out.errors.update({t.node: t.error for t in out.transfers if t.error})
    out.after = image_ids(params, cluster)
    out.seconds = time.monotonic() - start
    return out


def ensure_image(params: Params, cluster: Cluster, say=print) -> dict[str, str | None]:
    """Make sure every node holds the head's image (for steps that need it before 03 ran)."""
    out = distribute_image(params, cluster, say=say)
    image_verdict(params, out).raise_for_failures()
    return out.after


def image_verdict(params: Params, out: ImageOutcome) -> Verdict:
    v = Verdict("image")
    ref = out.after.get(params.head.name) if out.source == "registry" else out.head_id
    by_node = {t.node: t for t in out.transfers}
    for node in params.nodes:
        got = out.after.get(node.name)
        t = by_node.get(node.name)
        cmd = (f"({t.read_from or 'docker save'} of {out.image}) | ssh {node.peer_target} docker load" if t else
               f"docker pull {out.image}" if out.source == "registry" else
               f"docker image inspect {out.image}")
        if ref is None:
            v.add(Check("image ID", node.name, FAIL, out.errors.get(node.name, "absent"),
                        f"{out.image} on the head", f"`docker pull {out.image}` (or build it) on "
                        f"{params.head.name}" if out.source == "head" else
                        "check the image name and that the nodes can reach the registry", cmd))
        elif got == ref:
            moved = (f"; sent {human_bytes(t.wire)}, {t.layers_held} layer(s) already there"
                     if t else "")
            v.add(Check("image ID", node.name, PASS, short_id(got) + moved, short_id(ref)))
        else:
            seen = out.errors.get(node.name) or f"{short_id(got)} after the copy"
            v.add(Check("image ID", node.name, FAIL, seen, short_id(ref),
                        "check the node's disk space (`df -h` on the Docker root) and head-to-worker "
                        "SSH (01_preflight), then run this step again: the copy restarts cleanly",
                        cmd))
        if t and t.note:
            v.add(Check("layer skipping", node.name, WARN, t.note, "classic image store"))
    return v


def image_table(out: ImageOutcome) -> Table:
    rows = [[t.node, t.method, t.read_from, "zstd" if t.compressed else "none", human_bytes(t.sent), human_bytes(t.wire),
             t.layers_held, f"{t.seconds:.1f}", f"{t.rate_mb_s:.0f}",
             t.error or "ok"] for t in out.transfers]
    return Table(["node", "method", "read from", "compression", "archive sent", "on the wire",
                  "layers already there", "seconds", "wire MB/s", "result"], rows,
                 title=f"{out.image}: copies from the head")


# ------------------------------------------------------------------------------------------ model

@dataclass
class ModelOutcome:
    path: str
    enabled: bool
    before: dict[str, dict[str, str]] = field(default_factory=dict)  # worker -> {file: what differs}
    after: dict[str, dict[str, str]] = field(default_factory=dict)
    synced: dict[str, dict] = field(default_factory=dict)       # worker -> {files, seconds, error, command}
    unreadable: dict[str, str] = field(default_factory=dict)    # worker -> why its manifest is missing
    head_error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def manifests(params: Params, cluster: Cluster, nodes: list[Node] | None = None) -> dict[str, dict | None | str]:
    """Each node's model manifest (None: no model folder; a string: the node's error)."""
    res = cluster.run(manifest_script(params.model.path, params.model.verify == "all"), nodes,
                      timeout=params.distribution.timeout_s)
    return {n: parse_manifest(r.stdout) if r.ok else r.summary() for n, r in res.items()}


def differences(params: Params, found: dict, out: ModelOutcome) -> dict[str, dict[str, str]]:
    """Each readable worker's differences from the head (a worker without the folder misses every
    file); unreadable workers and a head without the model are recorded in ``out``."""
    head = found.get(params.head.name)
    if not isinstance(head, dict):
        out.head_error = f"no model at {params.model.path} on the head" if head is None else head
        return {}
    diffs = {}
    for w in params.workers:
        m = found.get(w.name)
        if isinstance(m, str):
            out.unreadable[w.name] = m
        else:
            diffs[w.name] = manifest_differences(head, m)
    return diffs


def rsync_command(params: Params, worker: Node, files: list[str]) -> str:
    """The head's rsync of ``files`` (relative names) to ``worker`` over the fabric: -I sends each
    listed file even where size and time agree (the manifest found them different), with rsync's
    delta transfer; partial files wait in a side folder, so a resumed copy continues them and no
    truncated file ever sits under its real name; names absent on the head are deleted."""
    src = params.model.path.rstrip("/") + "/"
    ssh = peer_ssh(worker)
    return ("printf '%s\\0' " + " ".join(shlex.quote(f) for f in files)
            + sh(" | rsync -a -I --mkpath --from0 --files-from=- --delete-missing-args --partial-dir={pd} "
                 "--info=progress2 --no-inc-recursive -e {ssh} {src} {dst}", pd=PARTIAL_DIR,
                 ssh=command_line(ssh[:-1]), src=src, dst=f"{ssh[-1]}:{src}"))


def sync_model(params: Params, cluster: Cluster, say=print, show: bool = True) -> ModelOutcome:
    """Copy the differing model files from the head to each worker that differs, then compare the
    manifests again."""
    out = ModelOutcome(params.model.path, params.distribution.model_sync)
    found = manifests(params, cluster)
    out.before = differences(params, found, out)
    if out.head_error or not out.enabled:
        out.after = out.before
        return out
    todo = {w: list(d) for w, d in out.before.items() if d}
    if not todo:
        say(f"the model at {params.model.path} is identical on every node: nothing to copy")
        out.after = out.before
        return out
    for w, names in todo.items():
        say(f"{w}: {len(names)} file(s) differ from the head: {', '.join(names[:5])}"
            + (" ..." if len(names) > 5 else ""))
    workers = [params.node(w) for w in todo]
    # every copy at once on the head, its progress lines tagged with the worker's name
    script = ["d=$(mktemp -d)"] + [
        "( set -o pipefail; " + rsync_command(params, w, todo[w.name])
        + sh(' 2>"$d"/{n} | stdbuf -oL tr "\\r" "\\n" | sed -u "s/^/[{n}] /"; '
             'echo "DONE {n} $? $(tail -n 1 "$d"/{n})" ) &', n=w.name) for w in workers]
    start = time.monotonic()
    with Progress(f"model {params.model.path} from {params.head.name}") as progress:
        def each(line: str) -> None:  # rsync --info=progress2: '  1,234,567  45%  12.34MB/s  0:00:10'
            m = re.search(r"\[([^] ]+)\] +([\d,]+) +(\d+)% +(\S+) +(\S+)", line)
            if m and show:
                progress.update(m.group(1), f"{human_bytes(_int(m.group(2)))}  {m.group(3)}%  "
                                            f"{m.group(4)}  ETA {m.group(5)}")

        res = cluster.run_on(params.head, "\n".join(script + ["wait", 'rm -rf "$d"']),
                             timeout=params.distribution.timeout_s, stream=_Lines(each))
    took = time.monotonic() - start
    ends = {m.group(1): (int(m.group(2)), m.group(3)) for m in
            re.finditer(r"^DONE (\S+) (\d+) ?(.*)$", res.stdout, re.M)}
    for w in workers:
        code, seen = ends.get(w.name, (None, res.summary()))
        out.synced[w.name] = {"files": len(todo[w.name]), "seconds": round(took, 1),
                              "error": None if code == 0 else f"rsync exited {code}: {seen}",
                              "command": rsync_command(params, w, todo[w.name][:3])
                              + (f"  # and {len(todo[w.name]) - 3} more files" if len(todo[w.name]) > 3 else "")}
    out.unreadable = {}
    found.update(manifests(params, cluster, workers))  # the head and the others did not change
    out.after = differences(params, found, out)
    return out


def model_verdict(params: Params, out: ModelOutcome) -> Verdict:
    v = Verdict("model")
    if out.head_error:
        return v.add(Check("model on the head", params.head.name, FAIL, out.head_error,
                           f"the model at {params.model.path}",
                           "download the model on the head (huggingface-cli download ... --local-dir "
                           f"{params.model.path}); 03 copies it to the workers"))
    v.add(Check("model on the head", params.head.name, PASS, params.model.path))
    for w, why in out.unreadable.items():
        v.add(Check("model files", w, FAIL, f"cannot read the model folder: {why}", "the head's manifest",
                    "check the node (01_preflight)"))
    for w, found in out.after.items():
        synced = out.synced.get(w)
        diffs = describe_differences(found)
        if not diffs:
            how = (f"copied {synced['files']} differing file(s)" if synced else
                   "identical to the head's")
            v.add(Check("model files", w, PASS, how, "the head's manifest"))
        elif not out.enabled:
            v.add(Check("model files", w, FAIL, "; ".join(diffs[:4]), "the head's manifest",
                        "model sync is off (distribution.model_sync: false): fix the shared copy, or "
                        "turn the sync on"))
        else:
            seen = (synced or {}).get("error") or "; ".join(diffs[:4])
            v.add(Check("model files", w, FAIL, seen, "the head's manifest",
                        "check the worker's free disk space and head-to-worker SSH on the fabric "
                        "(01_preflight), then run 03 again: rsync resumes the partial files",
                        (synced or {}).get("command", "")))
    return v


def model_table(out: ModelOutcome) -> Table:
    def shown(diffs: dict[str, str]) -> str:
        lines = describe_differences(diffs)
        return "; ".join(lines[:3]) + (f" (+{len(lines) - 3})" if len(lines) > 3 else "") or "identical"

    rows = [[w, shown(d), (out.synced.get(w) or {}).get("files", 0), shown(out.after.get(w, {}))]
            for w, d in out.before.items()]
    return Table(["worker", "before: differences from the head", "files copied", "after"], rows,
                 title=f"model {out.path}" + ("" if out.enabled else " (sync off)"))


def verdict(params: Params, image: ImageOutcome, model: ModelOutcome) -> Verdict:
    """03's verdict: the image and the model, node by node."""
    return Verdict("03 image and model").extend(image_verdict(params, image).checks
                                              + model_verdict(params, model).checks)


def save(run_dir: Path, image: ImageOutcome | None = None, model: ModelOutcome | None = None) -> Path:
    path = run_dir / "distribution.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    if image:
        data["image"] = image.to_json()
        image_table(image).write_csv(run_dir / "image_transfers.csv")
    if model:
        data["model"] = model.to_json()
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _int(text: str) -> int:
    return int(text.replace(",", ""))
