"""A model folder's manifest on a node (sizes, and digests of what makes copies behave
differently), and the differences between two manifests: read by preflight (01) and by the model
sync (03)."""

from __future__ import annotations

from typing import TypedDict

from ..nodes.shell import Script, script


class FileEntry(TypedDict):
    size: int
    sha256: str | None


Manifest = dict[str, FileEntry]  # relative path -> entry

# Where the model sync's rsync keeps an interrupted copy's partial files (one such folder in each
# folder of the model it copies into), until the next copy resumes them: never listed.
PARTIAL_DIR = ".sparkbook-partial"


def manifest_script(path: str, hash_all: bool) -> Script:
    """``model_manifest.sh``: ``size<TAB>-<TAB>relative path`` per file, then ``#path<TAB>sha256``
    for the hashed files (config-like ones, or all), or ``absent``."""
    return script("model_manifest.sh", path, "all" if hash_all else "config", PARTIAL_DIR)


def parse_manifest(text: str) -> Manifest | None:
    """``{relative path: {"size": int, "sha256": str | None}}``, or None when the folder is absent."""
    if text.strip() == "absent":
        return None
    files: Manifest = {}
    hashes = {}
    for line in text.splitlines():
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
