"""The head's model on every node, sending only the files that differ, deleting nothing that
sparkbook did not put there.

The manifest preflight reads (:mod:`sparkbook.facts.manifest`, which leaves out ``.cache/huggingface``,
a download's bookkeeping, and the sync's partial files: never compared, copied or deleted) on every
node; where a worker's differs from the head's, ``scripts/model_sync.sh`` on the head runs rsync
over the fabric to every such worker at once, sending the differing files only (resumable: partial
files wait in a side folder, never under their real name, and the next 03 continues them; a copy
that moves nothing for :data:`~.lines.STALL_S` fails by name), then the workers' manifests are
compared again. Files a worker holds under ``model.path`` that the head lacks (another model in the
same folder, the user's own files) are never copied over nor deleted: 03 reports them as a WARN,
and deletes them only with ``distribution.delete_extras: true``, naming each one
(``scripts/model_prune.sh``, which touches nothing outside the model folder).
"""

from __future__ import annotations

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
from ..nodes.shell import Script, command_line, peer_ssh, script
from ..params import Node, Params
from ..params.settings import relay_plan
from .lines import STALL_S, Lines, number

SHOWN_FILES = 3  # files named in a check's command; the count of the others follows
SHOWN_EXTRAS = 5  # extra files named in a check; the count of the others follows
RSYNC_TIMEOUT = 30  # rsync's exit status when --timeout passed without data (rsync(1), EXIT VALUES)

Differences = dict[str, str]  # relative path -> what differs (manifest_differences)


@dataclass
class ModelCopy:
    """One worker's rsync: how many files, how long, how it ended, and the command."""
    files: int
    seconds: float
    error: str | None
    command: str


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


def sync_script(params: Params, files: dict[str, list[str]], source: Node | None = None) -> Script:
    """``model_sync.sh`` on ``source`` (the head by default): ``files`` (worker -> relative names)
    to each worker over the fabric, each through its own SSH command (with keepalives)."""
    args: list[object] = [params.model.path, PARTIAL_DIR, STALL_S]
    for name, names in files.items():
        worker = params.node(name)
        args += [name, worker.peer_target, command_line(peer_ssh(worker)[:-1]), len(names), *names]
    return script("model_sync.sh", *args)


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
        copy_files(params, cluster, todo, out, say, show)
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
               say: Callable[[str], object], show: bool) -> None:
    """rsync of ``todo`` (worker -> the files it lacks or holds differently) round by round;
    each worker's copy in ``out.synced``."""
    for w, names in todo.items():
        say(f"{w}: {len(names)} file(s) differ from the head: {', '.join(names[:5])}"
            + (" ..." if len(names) > 5 else ""))
    failed: set[str] = set()
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
            res = cluster.run(lambda n: sync_script(params, {w: todo[w] for w in jobs[n.name]}, n), list(jobs),
                              timeout=params.distribution.timeout_s, stream=Lines(each))
            took = time.monotonic() - start
            for source, fed in jobs.items():
                ends = {m.group(1): (int(m.group(2)), m.group(3)) for m in
                        re.finditer(r"^DONE (\S+) (\d+) ?(.*)$", res[source].stdout, re.M)}
                for w in fed:
                    code, seen = ends.get(w, (None, res[source].summary()))
                    if code == RSYNC_TIMEOUT:
                        seen = f"no data moved for {STALL_S} s: {w} or the link to it is stuck ({seen})"
                    more = len(todo[w]) - SHOWN_FILES
                    shown = (f"on {source}: " + str(sync_script(params, {w: todo[w][:SHOWN_FILES]}, params.node(source)))
                             + (f"  # and {more} more files" if more > 0 else ""))
                    out.synced[w] = ModelCopy(len(todo[w]), round(took, 1),
                                              None if code == 0 else f"rsync from {source} exited {code}: {seen}",
                                              shown)
                    if code != 0:
                        failed.add(w)


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
            how = f"copied {synced.files} differing file(s)" if synced else "identical to the head's"
            checks.append(Check("model files", w, PASS, how, "the head's manifest"))
        elif not out.enabled:
            checks.append(Check("model files", w, FAIL, "; ".join(diffs[:4]), "the head's manifest",
                                "model sync is off (distribution.model_sync: false): fix the shared "
                                "copy, or turn the sync on"))
        else:
            seen = (synced and synced.error) or "; ".join(diffs[:4])
            checks.append(Check("model files", w, FAIL, seen, "the head's manifest",
                                "check the worker's free disk space and head-to-worker SSH on the "
                                "fabric (01_preflight.ipynb), then run 03 again: rsync resumes the partial "
                                "files", synced.command if synced else ""))
        checks += extra_checks(params, out, w)
    return checks


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
