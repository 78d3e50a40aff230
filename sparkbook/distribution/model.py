"""The head's model on every node, sending only the files that differ, deleting nothing that
sparkbook did not put there.

The manifest preflight reads (:mod:`sparkbook.facts.manifest`, which leaves out ``.cache/huggingface``,
a download's bookkeeping, and the sync's partial files: never compared, copied or deleted) on every
node; where a worker's differs from the head's, ``scripts/model_sync.sh`` on the head runs rsync
over the fabric to every such worker at once, sending the differing files only, split by size over
every rail the two nodes share (:func:`lanes`: a Spark's twins, each its own link; a rail whose copy
fails hands its files to the first, and 03 names it), resumable: partial
files wait in a side folder, never under their real name, and the next 03 continues them; a copy
that moves nothing for :data:`~.lines.STALL_S` fails by name), then the workers' manifests are
compared again. Files a worker holds under ``model.path`` that the head lacks (another model in the
same folder, the user's own files) are never copied over nor deleted: 03 reports them as a WARN,
and deletes them only with ``distribution.delete_extras: true``, naming each one
(``scripts/model_prune.sh``, which touches nothing outside the model folder).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..book.progress import Progress
from ..book.tables import Table, human_bytes
from ..book.verdict import FAIL, PASS, WARN, Check
from ..facts.manifest import (PARTIAL_DIR, Manifest, describe_differences, manifest_differences, manifests,
                              split_extras)
from ..nodes.remote import Cluster
from ..nodes.shell import SCRIPTS, Command, command_line, peer_ssh, script
from ..nodes.workdir import prepare, workdir
from ..params import Node, Params
from ..params.settings import relay_plan
from .lines import STALL_S, Lines, number

SHOWN_FILES = 3  # files named in a check's command; the count of the others follows
SHOWN_EXTRAS = 5  # extra files named in a check; the count of the others follows
RSYNC_TIMEOUT = 30  # rsync's exit status when --timeout passed without data (rsync(1), EXIT VALUES)
COPIER = "fabriccopy.py"  # distribution.transport tcp, on every node (fabriccopy.py exits 30 on a stall too)

Differences = dict[str, str]  # relative path -> what differs (manifest_differences)
End = tuple[int | None, str]  # a stream's rsync exit status (None: never reported), its last error line


@dataclass
class ModelCopy:
    """One worker's copy: how many files, how long, how it ended, the command (its first rail's),
    the bytes each rail carried (by the files' sizes) and what fell back to the first rail."""
    files: int
    seconds: float
    error: str | None
    command: str
    rails: dict[str, int] = field(default_factory=dict)  # interface (or the host) -> bytes sent over it
    fell_back: str | None = None  # a rail whose copy failed, its files then sent over the first


@dataclass(frozen=True)
class Lane:
    """One stream of a model copy: to ``worker`` over one of its rails (``interface``, at
    ``address``; "host" for a worker that lists none, reached at its host), at ``target`` by
    ``ssh`` (the command without the target)."""
    worker: str
    interface: str
    target: str
    ssh: tuple[str, ...]
    address: str

    @property
    def name(self) -> str:
        """For the script's progress and DONE lines (node names and interfaces hold no ``@``)."""
        return f"{self.worker}@{self.interface}"


@dataclass
class ModelOutcome:
    path: str
    enabled: bool
    before: dict[str, Differences] = field(default_factory=dict)  # worker -> its differences
    after: dict[str, Differences] = field(default_factory=dict)
    synced: dict[str, ModelCopy] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)     # worker -> why its manifest is missing
    head_error: str | None = None
    delete_extras: bool = False                                  # distribution.delete_extras
    extras: dict[str, dict[str, int]] = field(default_factory=dict)   # worker -> kept extra -> size
    deleted: dict[str, dict[str, int]] = field(default_factory=dict)  # worker -> deleted extra -> size
    not_deleted: dict[str, str] = field(default_factory=dict)    # worker -> why some extras stayed
    read: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> bytes, files read to hash

    def to_json(self) -> dict:
        return asdict(self)


def differences(params: Params, found: dict[str, Manifest | None | str],
                out: ModelOutcome) -> dict[str, Differences]:
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


def lanes(params: Params, source: Node, worker: Node) -> list[Lane]:
    """The rails a copy from ``source`` to ``worker`` takes: the worker's first (its fabric
    address, as every node-to-node SSH), then, with ``distribution.rails: all``, each other rail of
    the worker on a network where ``source`` has a rail too (no route through anything else). SSH
    to those checks the host key under the first rail's address (``HostKeyAlias``): the same
    machine, verified even where known_hosts names only that address."""
    ssh = peer_ssh(worker)[:-1]
    first = Lane(worker.name, worker.rails[0].interface if worker.rails else "host",
                 worker.peer_target, tuple(ssh), worker.fabric_address)
    if params.distribution.rails == "first":
        return [first]
    shared = {r.network for r in source.rails}
    user = f"{worker.user}@" if worker.user else ""
    return [first, *(Lane(worker.name, r.interface, f"{user}{r.ip}",
                          (*ssh, "-o", f"HostKeyAlias={worker.fabric_address}"), str(r.ip))
                     for r in worker.rails[1:] if r.network in shared)]


def split(names: list[str], sizes: dict[str, int], parts: int) -> list[list[str]]:
    """``names`` over ``parts`` streams by size: each file, the largest first, to the stream with
    the fewest bytes so far, then the fewest files (a sharded model's halves within a shard of each
    other)."""
    out: list[list[str]] = [[] for _ in range(parts)]
    load = [(0, 0)] * parts
    for name in sorted(names, key=lambda n: -sizes.get(n, 0)):
        i = load.index(min(load))
        out[i].append(name)
        load[i] = (load[i][0] + sizes.get(name, 0), load[i][1] + 1)
    return out


def sync_script(params: Params, files: dict[str, list[str]], source: Node | None = None,
                sizes: dict[str, int] | None = None) -> Command:
    """``model_sync.sh`` (or, with ``distribution.transport: tcp``, ``fabriccopy.py send``) on
    ``source`` (the head by default): ``files`` (worker -> relative names) to each worker over the
    fabric, split by ``sizes`` (the head's manifest: name -> bytes) over its :func:`lanes`, each
    stream through its own SSH command (with keepalives)."""
    source = source or params.head
    return lane_script(params, source, assign(params, files, source, sizes or {}))


def assign(params: Params, files: dict[str, list[str]], source: Node,
           sizes: dict[str, int]) -> list[tuple[Lane, list[str]]]:
    """Each worker's files split over its lanes from ``source`` (lanes left without a file dropped)."""
    streams = []
    for name, names in files.items():
        ways = lanes(params, source, params.node(name))
        streams += [(lane, part) for lane, part in zip(ways, split(names, sizes, len(ways))) if part]
    return streams


def lane_script(params: Params, source: Node, streams: list[tuple[Lane, list[str]]]) -> Command:
    if params.distribution.transport == "tcp":
        spec = {"root": params.model.path, "partial": PARTIAL_DIR, "stall_s": STALL_S,
                "lanes": [{"name": lane.name, "ssh": [*lane.ssh, lane.target], "address": lane.address,
                           "program": copier_path(params, params.node(lane.worker)), "files": names}
                          for lane, names in streams]}
        return ["python3", copier_path(params, source), "send", json.dumps(spec)]
    args: list[object] = [params.model.path, PARTIAL_DIR, STALL_S]
    for lane, names in streams:
        args += [lane.name, lane.target, command_line(list(lane.ssh)), len(names), *names]
    return script("model_sync.sh", *args)


def copier(params: Params) -> str:
    """What copies the files: rsync over SSH, or fabriccopy.py over plain TCP."""
    return COPIER if params.distribution.transport == "tcp" else "rsync"


def copier_path(params: Params, node: Node) -> str:
    return f"{workdir(params, node)}/{COPIER}"


def place_copier(params: Params, cluster: Cluster, nodes: list[Node]) -> None:
    """``fabriccopy.py`` into the working folder of ``nodes`` (the model's senders and receivers,
    the image's receivers); raises :class:`~sparkbook.book.errors.CheckFailed` naming a node it
    cannot be copied to."""
    prepare(params, cluster, nodes)
    cluster.put(SCRIPTS / COPIER, lambda n: copier_path(params, n), nodes).check(f"copy {COPIER} to the nodes")


def prune_script(params: Params, names: list[str]) -> Script:
    """``model_prune.sh`` on a worker: delete ``names`` (extras, relative to ``model.path``)."""
    return script("model_prune.sh", params.model.path, *names)


def sync_rounds(params: Params, workers: list[str]) -> list[dict[str, list[str]]]:
    """The copies in order, one round after the other, each a map source -> the workers it copies
    to: the head to ``distribution.parallel`` workers at once, then each of those on to as many
    more, and so on (the image's tree, :func:`relay_plan`): the head's disk and link feed a bounded
    number of copies whatever the count of workers."""
    plan = relay_plan(params.head.name, workers, params.distribution.parallel)
    rounds, sources = [], [params.head.name]
    while level := {s: plan[s] for s in sources if s in plan}:
        rounds.append(level)
        sources = [w for fed in level.values() for w in fed]
    return rounds


def sync_model(params: Params, cluster: Cluster, say: Callable[[str], object] = print,
               show: bool = True) -> ModelOutcome:
    """Copy the missing and differing model files from the head to each worker that needs them,
    along :func:`sync_rounds` (a worker whose copy failed hands its workers back to the head);
    delete the workers' extras only with ``distribution.delete_extras``; then compare the
    manifests again."""
    out = ModelOutcome(params.model.path, params.distribution.model_sync,
                       delete_extras=params.distribution.delete_extras)
    found = manifests(params, cluster, read=out.read)
    say(compared(params, out.read))
    out.before = differences(params, found, out)
    if out.head_error:
        out.after = out.before
        return out
    todo = {w: list(wrong) for w, d in out.before.items() if (wrong := split_extras(d)[0])}
    extra = {w: names for w, d in out.before.items() if (names := split_extras(d)[1])}
    if out.enabled and not todo:
        say(f"every worker holds the head's files in {params.model.path}: nothing to copy")
    if out.enabled and todo:
        copy_files(params, cluster, todo, out, say, show,
                   sizes(found, params.head.name, {n for ns in todo.values() for n in ns}))
    if out.enabled and out.delete_extras and extra:
        delete_extras(params, cluster, extra, found, out, say)
    changed = (set(todo) | set(out.deleted)) if out.enabled else set()
    out.unreadable = {}
    if changed:  # the head and the others did not change
        found.update(manifests(params, cluster, [params.node(w) for w in changed]))
    out.after = differences(params, found, out)
    out.extras = {w: sizes(found, w, names) for w, d in out.after.items() if (names := split_extras(d)[1])}
    return out


def compared(params: Params, read: dict[str, tuple[int, int]]) -> str:
    """How the manifests compared the files, and what hashing them read."""
    if params.model.verify != "all":
        return "model files compared by size, the config files by SHA-256 (model.verify: configs)"
    total, files = sum(b for b, _ in read.values()), sum(f for _, f in read.values())
    return (f"model files compared by SHA-256: {files} file(s) hashed, {human_bytes(total)} read on "
            f"{sum(1 for b, _ in read.values() if b)} node(s); every other digest from the nodes' caches")


def sizes(found: dict[str, Manifest | None | str], node: str, names: list[str]) -> dict[str, int]:
    """``{name: size}`` of ``names`` in ``node``'s manifest."""
    m = found.get(node)
    return {n: m[n]["size"] for n in names if n in m} if isinstance(m, dict) else {}


def copy_files(params: Params, cluster: Cluster, todo: dict[str, list[str]], out: ModelOutcome,
               say: Callable[[str], object], show: bool, sizes: dict[str, int]) -> None:
    """rsync of ``todo`` (worker -> the files it lacks or holds differently) round by round, each
    worker's files split by ``sizes`` (the head's manifest) over its :func:`lanes`; a rail beyond
    the first whose copy failed while the first's succeeded hands its files to the first. Each
    worker's copy in ``out.synced``."""
    for w, names in todo.items():
        say(f"{w}: {len(names)} file(s) differ from the head: {', '.join(names[:5])}"
            + (" ..." if len(names) > 5 else ""))
    failed: set[str] = set()
    if params.distribution.transport == "tcp":
        place_copier(params, cluster, [params.head, *(params.node(w) for w in todo)])
    with Progress(f"model {params.model.path} from {params.head.name}") as progress:
        def each(line: str) -> None:  # rsync --info=progress2: '  1,234,567  45%  12.34MB/s  0:00:10'
            m = re.search(r"\[([^] ]+)\] +([\d,]+) +(\d+)% +(\S+) +(\S+)", line)
            if m and show:
                progress.update(m.group(1), f"{human_bytes(number(m.group(2)))}  {m.group(3)}%  "
                                            f"{m.group(4)}  ETA {m.group(5)}", fraction=int(m.group(3)) / 100)

        for level in sync_rounds(params, list(todo)):
            jobs: dict[str, list[str]] = {}
            for source, fed in level.items():
                jobs.setdefault(params.head.name if source in failed else source, []).extend(fed)
            start = time.monotonic()
            ended = copy_round(params, cluster, {s: assign(params, {w: todo[w] for w in fed}, params.node(s), sizes)
                                                 for s, fed in jobs.items()}, sizes, each)
            took = time.monotonic() - start
            for source, fed in jobs.items():
                for w in fed:
                    (code, seen), rails, fell = ended[w]
                    if code == RSYNC_TIMEOUT:
                        seen = f"no data moved for {STALL_S} s: {w} or the link to it is stuck ({seen})"
                    more = len(todo[w]) - SHOWN_FILES
                    shown = (f"on {source}: " + command_line(sync_script(params, {w: todo[w][:SHOWN_FILES]},
                                                                         params.node(source), sizes))
                             + (f"  # and {more} more files" if more > 0 else ""))
                    out.synced[w] = ModelCopy(len(todo[w]), round(took, 1),
                                              None if code == 0 else f"{copier(params)} from {source} exited {code}: {seen}",
                                              shown, rails, fell)
                    if code != 0:
                        failed.add(w)


def copy_round(params: Params, cluster: Cluster, streams: dict[str, list[tuple[Lane, list[str]]]],
               sizes: dict[str, int], each: Callable[[str], None]) -> dict[str, tuple[End, dict[str, int], str | None]]:
    """One round's copies (``streams``: source -> its lanes and their files), then again over the
    first rail the files of any other rail whose copy failed where the first's succeeded. Each
    worker's first failure (or ``(0, "")``), the bytes each rail carried, and the rail that fell back."""
    ends = run_lanes(params, cluster, streams, each)
    copies: dict[str, list[End]] = {}
    rails: dict[str, dict[str, int]] = {}
    fell: dict[str, str] = {}
    retry: dict[str, dict[Lane, list[str]]] = {}  # source -> a worker's first lane -> files handed to it

    def ended(lane: Lane, names: list[str], end: End) -> None:
        copies.setdefault(lane.worker, []).append(end)
        if end[0] == 0:
            carried = rails.setdefault(lane.worker, {})
            carried[lane.interface] = carried.get(lane.interface, 0) + sum(sizes.get(n, 0) for n in names)

    for s, st in streams.items():
        first: dict[str, Lane] = {}
        for lane, names in st:
            main = first.setdefault(lane.worker, lane)
            end = ends[s, lane.name]
            if end[0] != 0 and lane != main and ends[s, main.name][0] == 0:
                fell[lane.worker] = f"{lane.interface} (rsync exited {end[0]}: {end[1]})"
                retry.setdefault(s, {}).setdefault(main, []).extend(names)
            else:
                ended(lane, names, end)
    if retry:
        again = {s: list(by.items()) for s, by in retry.items()}
        for (s, name), end in run_lanes(params, cluster, again, each).items():
            ended(*next((lane, names) for lane, names in again[s] if lane.name == name), end)
    return {w: (next((e for e in copies[w] if e[0] != 0), (0, "")), rails.get(w, {}), fell.get(w)) for w in copies}


def run_lanes(params: Params, cluster: Cluster, streams: dict[str, list[tuple[Lane, list[str]]]],
              each: Callable[[str], None]) -> dict[tuple[str, str], End]:
    """``model_sync.sh`` on each source at once (``streams``: source -> its lanes and their
    files); (source, lane name) -> (rsync's exit status, its last error line), None with what
    the source said where the script never reported the lane."""
    res = cluster.run(lambda n: lane_script(params, n, streams[n.name]), list(streams),
                      timeout=params.distribution.timeout_s, stream=Lines(each))
    ends = {}
    for source, st in streams.items():
        done = {m.group(1): (int(m.group(2)), m.group(3)) for m in
                re.finditer(r"^DONE (\S+) (\d+) ?(.*)$", res[source].stdout, re.M)}
        for lane, _ in st:
            ends[source, lane.name] = done.get(lane.name, (None, res[source].summary()))
    return ends


def delete_extras(params: Params, cluster: Cluster, extra: dict[str, list[str]],
                  found: dict[str, Manifest | None | str], out: ModelOutcome, say: Callable[[str], object]) -> None:
    """``distribution.delete_extras``: each worker's extras deleted (``model_prune.sh``, nothing
    outside the model folder); what was deleted in ``out.deleted``, why any stayed in
    ``out.not_deleted``."""
    res = cluster.run(lambda n: prune_script(params, extra[n.name]), list(extra), timeout=300)
    for w, r in res.items():
        gone = [line.split("\t")[1] for line in r.stdout.splitlines() if line.startswith("DELETED\t")]
        kept = [line.split("\t")[1:] for line in r.stdout.splitlines() if line.startswith("KEPT\t")]
        if gone:
            out.deleted[w] = sizes(found, w, gone)
            say(f"{w}: deleted {len(gone)} file(s) the head lacks (distribution.delete_extras): "
                + listing(out.deleted[w], None))
        if kept or not r.ok:
            out.not_deleted[w] = "; ".join(f"{n}: {why}" for n, why, *_ in kept) or r.summary()


def listing(files: dict[str, int], shown: int | None = SHOWN_EXTRAS) -> str:
    """``3 file(s), 1.2 GiB: a, b, c`` with at most ``shown`` names (None: all), then how many more."""
    names = sorted(files)
    more = len(names) - shown if shown is not None else 0
    return (f"{len(names)} file(s), {human_bytes(sum(files.values()))}: " + ", ".join(names[:shown])
            + (f" and {more} more" if more > 0 else ""))


def model_checks(params: Params, out: ModelOutcome) -> list[Check]:
    """The model on the head, then every worker's files against the head's manifest, and the files
    a worker holds that the head lacks (kept: WARN; deleted: named)."""
    if out.head_error:
        fix = ("see the row 'model from the hub': once it passes, 03 copies the model to the workers"
               if params.model.source == "hf" else
               "download the model on the head (huggingface-cli download ... --local-dir "
               f"{params.model.path}, or model.source: hf); 03 copies it to the workers")
        return [Check("model on the head", params.head.name, FAIL, out.head_error,
                      f"the model at {params.model.path}", fix)]
    checks = [Check("model on the head", params.head.name, PASS, params.model.path)]
    for w, why in out.unreadable.items():
        checks.append(Check("model files", w, FAIL, f"cannot read the model folder: {why}",
                            "the head's manifest", "check the node (01_preflight.ipynb)"))
    for w, found in out.after.items():
        synced = out.synced.get(w)
        diffs = describe_differences(split_extras(found)[0])
        if not diffs:
            how = "identical to the head's" if not synced else \
                f"copied {synced.files} differing file(s)" + (f" over {over(synced.rails)}" if synced.rails else "")
            checks.append(Check("model files", w, PASS, how, "the head's manifest"))
        elif not out.enabled:
            checks.append(Check("model files", w, FAIL, "; ".join(diffs[:4]), "the head's manifest",
                                "model sync is off (distribution.model_sync: false): fix the shared "
                                "copy, or turn the sync on"))
        else:
            seen = (synced and synced.error) or "; ".join(diffs[:4])
            checks.append(Check("model files", w, FAIL, seen, "the head's manifest",
                                "check the worker's free disk space and head-to-worker SSH on the "
                                "fabric (01_preflight.ipynb), then run 03 again: "
                                + ("rsync resumes the partial files" if copier(params) == "rsync" else
                                   "files that arrived whole are kept (distribution.transport: ssh "
                                   "where a firewall blocks the fabric's ports)"), synced.command if synced else ""))
        if synced and synced.fell_back:
            checks.append(Check(
                "model copy rails", w, WARN, f"the copy over {synced.fell_back} failed; its files went over the "
                f"first rail instead ({over(synced.rails)})", "every rail the nodes share carries its part",
                "that rail is down or drops traffic: measure it with 02_collectives.ipynb (each cable, "
                "both ways); until then copies take the first rail alone (distribution.rails: first "
                "says so in advance)", synced.command))
        checks += extra_checks(params, out, w)
    return checks


def over(rails: dict[str, int]) -> str:
    """``enp1s0f1np1 1.2 GiB, enP2p1s0f1np1 1.1 GiB``: what each rail carried."""
    return ", ".join(f"{i} {human_bytes(b)}" for i, b in rails.items())


def extra_checks(params: Params, out: ModelOutcome, worker: str) -> list[Check]:
    """What ``worker`` holds under ``model.path`` that the head lacks: deleted (named, as asked by
    ``distribution.delete_extras``), or kept (a WARN naming them)."""
    checks = []
    expected = f"only the head's files in {params.model.path}"
    if worker in out.deleted:
        checks.append(Check("extra model files", worker, PASS,
                            f"deleted (distribution.delete_extras) {listing(out.deleted[worker], None)}", expected))
    if worker in out.extras:
        why = f"; not deleted: {out.not_deleted[worker]}" if worker in out.not_deleted else ""
        checks.append(Check(
            "extra model files", worker, WARN, f"kept {listing(out.extras[worker])}{why}", expected,
            "files the head lacks are never deleted by default (the folder may hold other models or "
            "your own files), but vLLM reads the whole folder: move them out of model.path, or set "
            "distribution.delete_extras: true and run 03 again to delete them (each one is named here)",
            command_line(prune_script(params, sorted(out.extras[worker])[:SHOWN_FILES]))
            + f"  # on {worker}, with distribution.delete_extras"))
    return checks


def model_table(out: ModelOutcome) -> Table:
    def shown(diffs: Differences) -> str:
        lines = describe_differences(diffs)
        return "; ".join(lines[:3]) + (f" (+{len(lines) - 3})" if len(lines) > 3 else "") or "identical"

    def extras(w: str) -> str:
        return "; ".join(f"{verb} {len(files)} ({human_bytes(sum(files.values()))})"
                         for verb, files in (("deleted", out.deleted.get(w)), ("kept", out.extras.get(w))) if files)

    rows = [[w, shown(d), out.synced[w].files if w in out.synced else 0, shown(out.after.get(w, {})), extras(w)]
            for w, d in out.before.items()]
    return Table(["worker", "before: differences from the head", "files copied", "after",
                  "files the head lacks"], rows,
                 title=f"model {out.path}" + ("" if out.enabled else " (sync off)"))
