"""The head's image on every node, sending only what is missing.

One read of the image on the head (its layer store, or ``docker save``), whatever the number of
workers, streams through ``scripts/imagestream.py`` (run on the head) into one ``ssh WORKER docker
load`` per worker the head feeds, over the fabric, without a file on either side. The head feeds
``distribution.parallel`` workers; beyond that, workers pass the stream on to the rest (a tree,
:func:`relay_plan`). Each worker's stream leaves out the layers that worker already holds (see the
script for why ``docker load`` accepts that), so a new nightly that shares its base costs only its
new layers. Or, for nodes that can reach a registry, ``docker pull`` on every node. A worker that
takes no data for :data:`~.lines.STALL_S` (SSH between nodes with keepalives) fails by name and
holds no other back. The scripts live in each node's private working folder
(:mod:`sparkbook.nodes.workdir`).

:func:`distribute_image` never raises for one node's failure (:func:`image_checks` fails on it);
:func:`ensure_image` is the form for steps that need the image before their work. What a copy
records (each worker's transfer, the outcome before and after) is :mod:`.outcome`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from ..book.errors import CheckFailed
from ..book.progress import Progress, bar, fraction_of
from ..book.tables import Table, human_bytes, short_id
from ..book.verdict import FAIL, PASS, WARN, Check, Verdict
from ..facts.identity import INSPECT_FORMAT, ImageIdentity, parse, same_image
from ..facts.parsers import parse_sections
from ..nodes.remote import Cluster
from ..nodes.shell import SCRIPTS, Script, peer_ssh, script
from ..nodes.workdir import prepare, workdir
from ..params import Node, Params
from ..params.settings import relay_plan
from ..scripts.layerstore import chain_ids
from .lines import STALL_S, Lines, number
from .model import COPIER, copier_path, place_copier
from .outcome import ImageOutcome, Probe, StreamEnd, Transfer

STREAM_SCRIPTS = ("imagestream.py", "layerstore.py", "savearchive.py", COPIER)  # to the head and the relays

Say = Callable[[str], object]


def stream_path(params: Params, node: Node) -> str:
    """imagestream.py on ``node`` (the other :data:`STREAM_SCRIPTS` next to it): the head and every relay."""
    return f"{workdir(params, node)}/imagestream.py"


# ----------------------------------------------------------------------------------------- survey

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
    config: dict | None = None                          # its runtime config (None: not read)
    chains: set[str] = field(default_factory=set)      # every layer chain the node holds
    zstd: bool = False
    error: str | None = None

    @property
    def identity(self) -> ImageIdentity | None:
        return ImageIdentity(self.id, tuple(self.layers), self.config) if self.id else None

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


@dataclass
class Survey:
    """Every node's view of the configured image, taken before a copy."""
    image: str
    head: str
    nodes: dict[str, NodeImage]

    @property
    def head_image(self) -> NodeImage:
        return self.nodes[self.head]


def survey_script(image: str) -> Script:
    """``image_survey.sh``: one section per fact (see the script), the image read with
    :data:`sparkbook.facts.identity.INSPECT_FORMAT`."""
    return script("image_survey.sh", image, INSPECT_FORMAT)


def parse_survey(node: str, text: str) -> NodeImage:
    s = parse_sections(text)
    out = NodeImage(node, docker=s.get("docker", "").strip(), zstd=s.get("zstd", "absent").strip() != "absent")
    driver = s.get("driver", "").strip()
    out.driver = driver.split(" ", 1)[0]
    out.root = s.get("root", "").strip()
    out.containerd_store = "io.containerd.snapshotter" in driver
    inspected = parse(s.get("image", ""))
    if found := ImageIdentity.of(inspected):
        out.id, out.size = found.id, inspected.get("Size")
        out.layers, out.config = list(found.layers), found.config
    for line in s.get("layers", "").splitlines():
        if line.startswith("["):
            out.chains.update(chain_ids(json.loads(line)))
    return out


def survey(params: Params, cluster: Cluster) -> Survey:
    """Every node's view of the configured image (one round trip)."""
    res = cluster.run(survey_script(params.runtime.image))
    return Survey(params.runtime.image, params.head.name,
                  {n: parse_survey(n, r.stdout) if r.ok else NodeImage(n, error=r.summary())
                   for n, r in res.items()})


def identities(params: Params, cluster: Cluster) -> dict[str, ImageIdentity | None]:
    """The configured image on every reachable node, by ID and content (None where absent)."""
    res = cluster.run(["docker", "image", "inspect", "--format", INSPECT_FORMAT, "--", params.runtime.image])
    return {n: ImageIdentity.of(parse(r.stdout)) if r.ok else None for n, r in res.items()}


def _store(s: NodeImage) -> str:
    return "containerd" if s.containerd_store else s.driver and f"classic ({s.driver})"


def survey_table(found: Survey) -> Table:
    head = found.head_image
    same = {n: same_image(s.identity, head.identity) for n, s in found.nodes.items()}
    rows = [[n, s.error or short_id(s.id), "" if s.error else "no" if not same[n][0] else
             "yes" if s.id == head.id else f"yes ({same[n][1]})",
             s.docker, _store(s),
             f"{len(s.held(head.layers))} of {len(head.layers)}", "yes" if s.zstd else "no"]
            for n, s in found.nodes.items()]
    return Table(["node", "image", "same as head", "docker", "image store", "layers held", "zstd"],
                 rows, title=f"{found.image} on every node")


# ------------------------------------------------------------------------------------------- copy

def choose_compression(params: Params, cluster: Cluster, head: NodeImage,
                       workers: list[Node], nodes: dict[str, NodeImage]) -> tuple[bool, Probe]:
    """zstd on the stream: ``on``/``off`` as asked (``on`` needs zstd at both ends), ``auto`` when
    every node has it and zstd -1 on the head outruns the SSH pipe to the slowest worker it feeds,
    its throughput shared by the streams it compresses at once (one per worker it feeds)."""
    mode = params.distribution.compress
    both = head.zstd and all(nodes[w.name].zstd for w in workers)
    if mode == "off":
        return False, {"decision": "off (parameter)"}
    if params.distribution.transport == "tcp":
        return False, {"decision": "off: distribution.transport tcp (no cipher for zstd to spare)"}
    if not both:
        lacking = [n for n in [head.node] + [w.name for w in workers] if not nodes[n].zstd]
        return False, {"decision": f"off: no zstd on {', '.join(lacking)}"}
    if mode == "on":
        return True, {"decision": "on (parameter)"}
    direct = workers[:params.distribution.parallel]
    spec = {"workers": [{"name": w.name, "ssh": peer_ssh(w)} for w in direct]}
    r = cluster.run_on(params.head, ["python3", stream_path(params, params.head), "probe", json.dumps(spec)],
                       timeout=120)
    found = re.search(r"^PROBE (.*)$", r.stdout, re.M)
    if not r.ok or not found:
        return False, {"decision": "off: the probe failed", "error": r.summary()}
    probe: Probe = json.loads(found.group(1))
    pipe = min(probe["pipe_mb_s"].values(), default=0)
    each = probe.get("zstd_mb_s", 0) / len(direct)
    fast = each > pipe > 0
    probe["decision"] = (f"{'on' if fast else 'off'}: zstd -1 {each:.0f} MB/s for each of "
                         f"{len(direct)} stream(s) {'>' if fast else '<='} SSH pipe {pipe:.0f} MB/s")
    return fast, probe


def stream_spec(params: Params, workers: list[Node], nodes: dict[str, NodeImage], compress: bool,
                plan: dict[str, list[str]]) -> dict:
    """``imagestream.py stream``'s spec: the tree of ``plan``, each worker with the chains it holds
    (none where its Docker cannot load a partial archive), the SSH command that reaches it (run by
    its feeder) and, for a relay, where the stream script is there; where the head reads the image,
    and how long a worker may take no data."""
    head, by_name = nodes[params.head.name], {w.name: w for w in workers}
    store = head.store if params.distribution.reader != "docker-save" else None
    if store and params.distribution.reader == "container":
        store = {**store, "via": "container"}

    def sink(name: str) -> dict:
        mine, feeds = nodes[name], plan.get(name, [])
        return {"name": name, "ssh": peer_ssh(by_name[name]), "zstd": compress,
                "have": mine.held(head.layers) if mine.skips_layers else [],
                "feeds": [sink(n) for n in feeds],
                **({"program": stream_path(params, by_name[name])} if feeds else {}),
                **({"address": by_name[name].fabric_address, "receiver": copier_path(params, by_name[name])}
                   if tcp else {})}

    tcp = params.distribution.transport == "tcp"
    return {"image": params.runtime.image, "from": params.head.name, "store": store,
            "deployment": params.name, "stall_s": STALL_S, "transport": params.distribution.transport,
            "workers": [sink(n) for n in plan.get(params.head.name, [])]}


def _transfer(worker: NodeImage, compress: bool, seconds: float, end: StreamEnd | None,
              failure: str, via: str) -> Transfer:
    """A worker's copy from the stream's DONE record (``end``; None when the stream ended
    without one, for the reason ``failure``)."""
    t = Transfer(worker.node, "layer-skipping stream" if worker.skips_layers else "full stream",
                 compress, seconds=seconds, via=via)
    if not worker.skips_layers:
        t.note = (f"{worker.node}'s Docker uses the containerd image store, which needs every layer "
                  "in the archive: the whole image was sent")
    if end is None:
        t.error = f"the stream ended without a result: {failure}"
    else:
        t.sent, t.wire, t.skipped = end["sent"], end["wire"], end["skipped"]
        t.layers_held, t.read_from = end["held"], end["source"]
        t.error, t.output = end["error"], end["output"]
        if t.error and end["output"]:
            t.error += f": {end['output'][-1]}"
    return t


def place_streamers(params: Params, cluster: Cluster, workers: list[Node], say: Say) -> dict[str, list[str]]:
    """The stream scripts into the working folder of the head and of the relays of
    :func:`relay_plan` over ``workers``; the plan. A relay they cannot be copied to leaves the tree:
    the head then feeds every worker itself."""
    head = params.head.name
    plan = relay_plan(head, [w.name for w in workers], params.distribution.parallel)
    prepare(params, cluster, [params.head])
    relays = [params.node(n) for n in plan if n != head]
    try:
        if relays:
            prepare(params, cluster, relays)
    except CheckFailed as e:
        say(f"{e}: the head feeds every worker itself")
        plan = {head: [w.name for w in workers]}
    copies = [cluster.put(SCRIPTS / name, lambda n, name=name: f"{workdir(params, n)}/{name}", list(plan))
              for name in STREAM_SCRIPTS]
    bad = sorted({r.node for res in copies for r in res.failed()})
    if head in bad:
        next(res for res in copies if not res.ok).check("copy the image stream scripts to the head")
    if bad:
        say(f"cannot copy the stream scripts to {', '.join(bad)}: the head feeds every worker itself")
        plan = {head: [w.name for w in workers]}
    if params.distribution.transport == "tcp":  # every worker's receiver (those that relay have it)
        if leaves := [w for w in workers if w.name not in plan]:
            place_copier(params, cluster, leaves)
    return plan


def stream_from_head(params: Params, cluster: Cluster, workers: list[Node], nodes: dict[str, NodeImage],
                     compress: bool, show: bool = True, plan: dict[str, list[str]] | None = None
                     ) -> tuple[list[Transfer], int]:
    """One read of the image on the head into every worker (through relays beyond
    ``distribution.parallel``, or along ``plan``), each worker's stream without the layers it holds
    (where its Docker allows that); the transfers, and the bytes the head's stream process read."""
    plan = plan or relay_plan(params.head.name, [w.name for w in workers], params.distribution.parallel)
    feeder = {n: f for f, fed in plan.items() for n in fed if f != params.head.name}
    spec = stream_spec(params, workers, nodes, compress, plan)
    done: dict[str, tuple[StreamEnd, float]] = {}  # each worker's DONE, and when it came
    read = 0
    start = time.monotonic()
    with Progress(f"{params.runtime.image} from {params.head.name}") as progress:
        def each(line: str) -> None:
            nonlocal read
            m = re.match(r"\[[^]]+\] (PROGRESS|DONE|READ) (.*)", line)
            if m and m.group(1) == "DONE":
                end: StreamEnd = json.loads(m.group(2))
                done[end["name"]] = end, time.monotonic() - start
            elif m and m.group(1) == "READ":
                read = int(m.group(2))
            elif m and show:
                name, sent, _skipped, expected, wire = m.group(2).split()
                total = max(number(expected), number(sent))
                progress.update(name, bar(number(sent), total, start)
                                + f"  (on the wire {human_bytes(number(wire))})",
                                fraction=fraction_of(number(sent), total))

        r = cluster.run_on(params.head, ["python3", stream_path(params, params.head), "stream", json.dumps(spec)],
                           timeout=params.distribution.timeout_s, stream=Lines(each))
    took = time.monotonic() - start
    transfers = []
    for w in workers:
        end, seconds = done.get(w.name, (None, took))
        transfers.append(_transfer(nodes[w.name], compress, seconds, end, r.summary(), feeder.get(w.name, "")))
    return transfers, read


def distribute_image(params: Params, cluster: Cluster, found: Survey | None = None,
                     say: Say = print, show: bool = True) -> ImageOutcome:
    """Make every node hold the head's image (or pull it everywhere); never raises for one node's
    failure: the outcome records it, and :func:`image_checks` fails on it. ``found``: a
    :func:`survey` just taken."""
    start = time.monotonic()
    image, source = params.runtime.image, params.distribution.source
    found = found or survey(params, cluster)
    nodes, head = found.nodes, found.head_image
    out = ImageOutcome(image, source, found.head, head.identity, {n: s.identity for n, s in nodes.items()})
    out.errors.update({n: s.error for n, s in nodes.items() if s.error})
    if source == "registry":
        say(f"pulling {image} on every node")
        pulled = cluster.run(["docker", "pull", image], timeout=params.distribution.timeout_s, stream=True)
        out.errors.update({n: r.summary() for n, r in pulled.items() if not r.ok})
    elif head.id is None:
        out.errors[params.head.name] = head.error or f"{image} is not on the head"
    else:
        same = {w.name: same_image(nodes[w.name].identity, head.identity) for w in params.workers}
        todo = [w for w in params.workers if not nodes[w.name].error and not same[w.name][0]]
        for n in (n for n, (yes, _) in same.items() if yes and nodes[n].id != head.id):
            stores = "" if nodes[n].containerd_store == head.containerd_store else (
                f"; image stores: {_store(nodes[n])} here, {_store(head)} on {params.head.name}")
            say(f"{n}: holds {short_id(nodes[n].id)}, {same[n][1]}{stores}: nothing to send")
        if not todo:
            say(f"{image} ({short_id(head.id)}) is already on every node: nothing to send")
        else:
            plan = place_streamers(params, cluster, todo, say)
            compress, out.probe = choose_compression(params, cluster, head, todo, nodes)
            relays = {n: f for f, fed in plan.items() for n in fed if f != params.head.name}
            for w in todo:
                mine = nodes[w.name]
                say(f"{w.name}: holds {short_id(mine.id)}; " + (
                    f"{len(mine.held(head.layers))} of the image's {len(head.layers)} layers "
                    "already there" if mine.skips_layers else "its Docker cannot load a partial archive")
                    + (f"; relayed by {relays[w.name]}" if w.name in relays else ""))
            say(f"streaming from {params.head.name}, compression {out.probe['decision']}")
            out.transfers, out.read = stream_from_head(params, cluster, todo, nodes, compress, show, plan)
            out.errors.update({t.node: t.error for t in out.transfers if t.error})
    out.after = identities(params, cluster)
    out.seconds = time.monotonic() - start
    return out


def ensure_image(params: Params, cluster: Cluster, say: Say = print) -> ImageOutcome:
    """Make sure every node holds the head's image (for steps that need it before 03 ran): what
    was copied, or :class:`CheckFailed` naming each node that does not hold it."""
    out = distribute_image(params, cluster, say=say)
    Verdict("image", image_checks(params, out)).raise_for_failures()
    return out


# ------------------------------------------------------------------------------- what it says

def image_checks(params: Params, out: ImageOutcome) -> list[Check]:
    """Node by node: the head's image (the same ID, or the same content under another ID: see
    :func:`same_image`), and where a worker's Docker could not skip layers."""
    checks = []
    ref = out.reference
    by_node = {t.node: t for t in out.transfers}
    for node in params.nodes:
        got = out.after.get(node.name)
        t = by_node.get(node.name)
        relayed = (f" | ssh {params.node(t.via).peer_target} python3 {stream_path(params, params.node(t.via))} "
                   "relay SPEC" if t and t.via else "")
        into = (f"TCP to {node.fabric_address}:PORT, where `ssh {node.peer_target} python3 "
                f"{copier_path(params, node)} pipe` runs docker load" if params.distribution.transport == "tcp"
                else f"ssh {node.peer_target} docker load")
        cmd = (f"({t.read_from or 'docker save'} of {out.image}){relayed} | {into}" if t else
               f"docker pull {out.image}" if out.source == "registry" else
               f"docker image inspect {out.image}")
        if ref is None:
            checks.append(Check("image ID", node.name, FAIL, out.errors.get(node.name, "absent"),
                                f"{out.image} on the head", f"`docker pull {out.image}` (or build it) on "
                                f"{params.head.name}" if out.source == "head" else
                                "check the image name and that the nodes can reach the registry", cmd))
        elif (same := same_image(got, ref))[0]:
            moved = (f"; sent {human_bytes(t.wire)}, {t.layers_held} layer(s) already there"
                     if t else "")
            why = "" if got.id == ref.id else f" ({same[1]})"
            checks.append(Check("image ID", node.name, PASS, short_id(got.id) + why + moved, short_id(ref.id)))
        else:
            seen = out.errors.get(node.name) or (f"{short_id(got.id)} after the copy: {same[1]}" if got
                                                 else "absent after the copy")
            ssh = (f"SSH from {t.via} to {node.name} ({t.via} relays the image to it: `ssh "
                   f"{node.peer_target} true` on {t.via})" if t and t.via
                   else "head-to-worker SSH (01_preflight.ipynb)")
            checks.append(Check("image ID", node.name, FAIL, seen, short_id(ref.id),
                                f"check the node's disk space (`df -h` on the Docker root) and {ssh}, "
                                "then run this step again: the copy restarts cleanly", cmd))
        if t and t.note:
            checks.append(Check("layer skipping", node.name, WARN, t.note, "classic image store"))
    return checks


def transfers_summary(out: ImageOutcome) -> str:
    """``spark-2: 4.12 GB in 63 s (3 layers already there)`` per worker, or ``already on every
    node`` (the report's key number)."""
    if not out.transfers:
        return "already on every node"
    return "; ".join(f"{t.node}: {_copied(t)}" for t in out.transfers)


def _copied(t: Transfer, to: str = "") -> str:
    return (f"{t.wire / 1e9:.2f} GB{to} in {t.seconds:.0f} s"
            + (f" ({t.layers_held} layers already there)" if t.layers_held else ""))


def copy_checks(params: Params, out: ImageOutcome) -> list[Check]:
    """A copy made before a step's work, as one check: what was copied, to which node, how many
    bytes and how long; or, where it failed, the failing rows of :func:`image_checks`."""
    rows = image_checks(params, out)
    others = [c for c in rows if c.status != PASS]
    if any(c.status == FAIL for c in rows):
        return others
    if out.source == "registry":
        seen = f"pulled on every node in {out.seconds:.0f} s"
    elif out.transfers:
        seen = "copied " + ", ".join(_copied(t, f" to {t.node}") for t in out.transfers)
    else:
        seen = "already on every node"
    return [Check("serving image on every node", "all", PASS, seen,
                  f"the head's {out.image} ({short_id(out.reference and out.reference.id)})")] + others


def image_table(out: ImageOutcome) -> Table:
    rows = [[t.node, t.method, t.read_from, t.via or out.head, "zstd" if t.compressed else "none",
             human_bytes(t.sent), human_bytes(t.wire), t.layers_held, f"{t.seconds:.1f}",
             f"{t.rate_mb_s:.0f}", t.error or "ok"] for t in out.transfers]
    return Table(["node", "method", "read from", "fed by", "compression", "archive sent", "on the wire",
                  "layers already there", "seconds", "wire MB/s", "result"], rows,
                 title=f"{out.image}: copies from the head")
