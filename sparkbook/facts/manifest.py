"""A model folder's manifest on a node (sizes, and the digest of every file by default,
``model.verify``), and the differences between two manifests: read by preflight (01) and by the
model sync (03)."""

from __future__ import annotations

import hashlib
from typing import TypedDict

from ..nodes.remote import Cluster
from ..nodes.shell import Script, script
from ..nodes.workdir import workdir
from ..params import Node, Params


class FileEntry(TypedDict):
    size: int
    sha256: str | None


Manifest = dict[str, FileEntry]  # relative path -> entry

# Where the model sync's rsync keeps an interrupted copy's partial files (one such folder in each
# folder of the model it copies into), until the next copy resumes them: never listed.
PARTIAL_DIR = ".sparkbook-partial"


def manifest_script(path: str, hash_all: bool, cache: str = "") -> Script:
    """``model_manifest.py``: ``size<TAB>-<TAB>relative path`` per file, then ``#path<TAB>sha256``
    for the hashed files (config-like ones, or all), then what hashing read; or ``absent``.
    ``cache``: the node's digest cache (:func:`cache_path`), so an unchanged file is not read again."""
    return script("model_manifest.py", path, "all" if hash_all else "config", PARTIAL_DIR, cache)


def cache_path(workdir: str, path: str) -> str:
    """The digest cache of the model folder ``path``, in the node's private working folder."""
    return f"{workdir}/digests-{hashlib.sha256(path.encode()).hexdigest()[:12]}.json"


def node_script(params: Params, node: Node) -> Script:
    """The manifest of ``model.path`` on ``node`` as the parameters ask (``model.verify``), with
    the node's digest cache."""
    return manifest_script(params.model.path, params.model.verify == "all",
                           cache_path(workdir(params, node), params.model.path))


def manifests(params: Params, cluster: Cluster, nodes: list[Node] | None = None,
              read: dict[str, tuple[int, int]] | None = None) -> dict[str, Manifest | None | str]:
    """Each node's model manifest (None: no model folder; a string: the node's error), all nodes at
    once; ``read`` gets what each node read to hash its files (bytes, files)."""
    res = cluster.run(lambda n: node_script(params, n), nodes, timeout=params.distribution.timeout_s)
    if read is not None:
        read.update({n: got for n, r in res.items() if r.ok and (got := bytes_read(r.stdout))})
    return {n: parse_manifest(r.stdout) if r.ok else r.summary() for n, r in res.items()}


def parse_manifest(text: str) -> Manifest | None:
    """``{relative path: {"size": int, "sha256": str | None}}``, or None when the folder is absent."""
    if text.strip() == "absent":
        return None
    files: Manifest = {}
    hashes = {}
    for line in text.splitlines():
        if line.startswith("!"):
            continue
        if line.startswith("#"):
            name, digest = line[1:].split("\t", 1)
            hashes[name] = digest
        elif line.count("\t") >= 2:
            size, _, name = line.split("\t", 2)
            files[name] = {"size": int(size), "sha256": None}
    for name, digest in hashes.items():
        if name in files:
            files[name]["sha256"] = digest
    return files


def bytes_read(text: str) -> tuple[int, int] | None:
    """What a manifest read to hash its files: (bytes, files); None where it says nothing."""
    for line in text.splitlines():
        if line.startswith("!read\t"):
            _, size, count = line.split("\t")
            return int(size), int(count)
    return None


def manifest_differences(reference: Manifest, other: Manifest | None) -> dict[str, str]:
    """``{relative path: what differs}`` of ``other`` against ``reference``: ``missing``, ``extra``,
    ``size N instead of M`` or ``content differs``. ``other`` None (no folder): every file missing."""
    other = other or {}
    out = {n: "missing" for n in sorted(set(reference) - set(other))}
    out.update({n: "extra" for n in sorted(set(other) - set(reference))})
    for n in sorted(set(reference) & set(other)):
        a, b = reference[n], other[n]
        if a["size"] != b["size"]:
            out[n] = f"size {b['size']} instead of {a['size']}"
        elif a["sha256"] and b["sha256"] and a["sha256"] != b["sha256"]:
            out[n] = "content differs"
    return out


def split_extras(diffs: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """:func:`manifest_differences` as what must be copied (missing or different files), and the
    extras: files the other node holds that the reference lacks (never copied over)."""
    return ({n: d for n, d in diffs.items() if d != "extra"}, [n for n, d in diffs.items() if d == "extra"])


def describe_differences(diffs: dict[str, str]) -> list[str]:
    """:func:`manifest_differences` as lines: ``missing a``, ``extra b``, ``c (content differs)``."""
    return [f"{what} {n}" if what in ("missing", "extra") else f"{n} ({what})" for n, what in diffs.items()]
