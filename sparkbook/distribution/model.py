"""The head's model on every node, sending only the files that differ.

The manifest preflight reads (:mod:`sparkbook.manifest`, which leaves out ``.cache/huggingface``,
a download's bookkeeping: never compared, copied or deleted) on every node; where a worker's differs
from the head's, ``scripts/model_sync.sh`` on the head runs rsync over the fabric to every such
worker at once, sending the differing files only (resumable: partial files wait in a side folder,
never under their real name), then the workers' manifests are compared again.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..manifest import Manifest, describe_differences, manifest_differences, manifest_script, parse_manifest
from ..params import Node, Params
from ..progress import Progress
from ..remote import Cluster, Script, command_line, peer_ssh, script
from ..settings import relay_plan
from ..tables import Table, human_bytes
from ..verdict import FAIL, PASS, Check
from .lines import Lines, number

PARTIAL_DIR = ".sparkbook-partial"
SHOWN_FILES = 3  # files named in a check's command; the count of the others follows

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

    def to_json(self) -> dict:
        return asdict(self)


def manifests(params: Params, cluster: Cluster, nodes: list[Node] | None = None) -> dict[str, Manifest | None | str]:
    """Each node's model manifest (None: no model folder; a string: the node's error)."""
    res = cluster.run(manifest_script(params.model.path, params.model.verify == "all"), nodes,
                      timeout=params.distribution.timeout_s)
    return {n: parse_manifest(r.stdout) if r.ok else r.summary() for n, r in res.items()}


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
    to each worker over the fabric (SSH's options are the same for every node: only the target
    differs)."""
    args: list[object] = [params.model.path, command_line(peer_ssh(source or params.head)[:-1]), PARTIAL_DIR]
    for name, names in files.items():
        args += [name, params.node(name).peer_target, len(names), *names]
    return script("model_sync.sh", *args)


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
    """Copy the differing model files from the head to each worker that differs, along
    :func:`sync_rounds` (a worker whose copy failed hands its workers back to the head), then
    compare the manifests again."""
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
    failed: set[str] = set()
    with Progress(f"model {params.model.path} from {params.head.name}") as progress:
        def each(line: str) -> None:  # rsync --info=progress2: '  1,234,567  45%  12.34MB/s  0:00:10'
            m = re.search(r"\[([^] ]+)\] +([\d,]+) +(\d+)% +(\S+) +(\S+)", line)
            if m and show:
                progress.update(m.group(1), f"{human_bytes(number(m.group(2)))}  {m.group(3)}%  "
                                            f"{m.group(4)}  ETA {m.group(5)}")

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
                    more = len(todo[w]) - SHOWN_FILES
                    shown = (f"on {source}: " + str(sync_script(params, {w: todo[w][:SHOWN_FILES]}, params.node(source)))
                             + (f"  # and {more} more files" if more > 0 else ""))
                    out.synced[w] = ModelCopy(len(todo[w]), round(took, 1),
                                              None if code == 0 else f"rsync from {source} exited {code}: {seen}",
                                              shown)
                    if code != 0:
                        failed.add(w)
    out.unreadable = {}
    # the head and the others did not change
    found.update(manifests(params, cluster, [params.node(w) for w in todo]))
    out.after = differences(params, found, out)
    return out


def model_checks(params: Params, out: ModelOutcome) -> list[Check]:
    """The model on the head, then every worker's files against the head's manifest."""
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
                            "the head's manifest", "check the node (01_preflight)"))
    for w, found in out.after.items():
        synced = out.synced.get(w)
        diffs = describe_differences(found)
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
                                "fabric (01_preflight), then run 03 again: rsync resumes the partial "
                                "files", synced.command if synced else ""))
    return checks


def model_table(out: ModelOutcome) -> Table:
    def shown(diffs: Differences) -> str:
        lines = describe_differences(diffs)
        return "; ".join(lines[:3]) + (f" (+{len(lines) - 3})" if len(lines) > 3 else "") or "identical"

    rows = [[w, shown(d), out.synced[w].files if w in out.synced else 0, shown(out.after.get(w, {}))]
            for w, d in out.before.items()]
    return Table(["worker", "before: differences from the head", "files copied", "after"], rows,
                 title=f"model {out.path}" + ("" if out.enabled else " (sync off)"))
