#!/usr/bin/env python3
"""Write a `docker load` archive of an image to stdout straight from the Docker daemon's layer store
(overlay2, classic image store), with only the layers asked for: no `docker save`, which first copies
every layer into a temporary folder. Run by imagestream.py on the head, directly or in a throwaway
container of the image (fed on stdin, so it imports nothing but the standard library).
imagestream.py takes the chain IDs and the stored size of layers from here too.

Usage: layerstore.py JOB_JSON   (JOB: {"root", "driver", "image_id", "tag", "need": [chain ids]})
Exits non-zero when the store is not as expected.
"""

import base64
import gzip
import hashlib
import json
import os
import sys
import tarfile

BLOCK = 512
CHUNK = 1 << 20


def chain_ids(diff_ids):
    """ChainID(L0) = DiffID(L0); ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln))."""
    out = []
    for d in diff_ids:
        out.append(d if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def padded(size):
    return (size + BLOCK - 1) // BLOCK * BLOCK


def layer_parts(layerdb, diffdir):
    """The exact bytes of a layer's tar, as (raw bytes | (path, size)) parts, from the layer's
    tar-split record (the tar's headers and padding, kept by Docker when it stored the layer) and
    the files in its folder; and their total size. This is how Docker itself rebuilds a layer for
    `docker save` (vbatts/tar-split, asm.WriteOutputTarStream); `docker load` checks the result
    against the layer's diff ID."""
    parts, size = [], 0
    with gzip.open(os.path.join(layerdb, "tar-split.json.gz"), "rt") as f:
        for line in f:
            e = json.loads(line)
            if e["type"] == 2:  # a segment: raw tar bytes
                data = base64.b64decode(e["payload"])
                parts.append(data)
                size += len(data)
            elif e.get("size"):  # a file's content, from the layer's folder
                name = e.get("name") or base64.b64decode(e["name_raw"]).decode("utf-8", "surrogateescape")
                parts.append((os.path.join(diffdir, os.path.normpath("/" + name).lstrip("/")), e["size"]))
                size += e["size"]
    return parts, size


def header(name, size):
    """One 512-byte tar header. A member of 8 GiB or more does not fit USTAR's octal size field (a
    layer of a CUDA image can be that big: the lab's vLLM 0.17.1 image has one, its venv with PyPI's
    CUDA torch); GNU's base-256 number does, in the same one block, as Go's archive/tar writes it and
    `docker load` reads it."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT if size < 8 ** 11 else tarfile.GNU_FORMAT)


def expected_bytes(spec, diff_ids, size, have):
    """About how many archive bytes a worker holding ``have`` needs (for the ETA): the layer store's
    size of each missing layer when it can be read, else the whole image."""
    store = spec.get("store")
    if not store:
        return size
    total = 0
    for chain in chain_ids(diff_ids):
        if chain in have:
            continue
        try:
            with open(os.path.join(store["root"], "image", store["driver"], "layerdb", "sha256",
                                   chain.split(":")[1], "size")) as f:
                total += int(f.read())
        except (OSError, ValueError):
            return size
    return total


def assemble(spec):
    """The archive of image ``image_id`` with the layers in ``need`` (chain IDs), to stdout."""
    root, driver, ident = spec["root"], spec["driver"], spec["image_id"].split(":")[1]
    base = os.path.join(root, "image", driver)
    with open(os.path.join(base, "imagedb", "content", "sha256", ident), "rb") as f:
        config = f.read()
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    chains = chain_ids(diff_ids)
    need = set(spec["need"])
    out = open(sys.stdout.fileno(), "wb", buffering=CHUNK, closefd=False)  # small files: fewer writes
    names = ["blobs/sha256/" + d.split(":")[1] for d in diff_ids]
    for chain, name in zip(chains, names):
        if chain not in need:
            continue
        layerdb = os.path.join(base, "layerdb", "sha256", chain.split(":")[1])
        with open(os.path.join(layerdb, "cache-id")) as f:
            diffdir = os.path.join(root, driver, f.read().strip(), "diff")
        parts, size = layer_parts(layerdb, diffdir)
        out.write(header(name, size))
        for part in parts:
            if isinstance(part, bytes):
                out.write(part)
                continue
            path, left = part
            with open(path, "rb") as f:
                while left:
                    data = f.read(min(CHUNK, left))
                    if not data:
                        raise SystemExit(f"{path} is shorter than its layer says")
                    out.write(data)
                    left -= len(data)
        out.write(bytes(padded(size) - size))
    manifest = json.dumps([{"Config": ident + ".json", "RepoTags": [spec["tag"]], "Layers": names}]).encode()
    for name, data in ((ident + ".json", config), ("manifest.json", manifest)):
        out.write(header(name, len(data)) + data + bytes(padded(len(data)) - len(data)))
    out.write(bytes(2 * BLOCK))
    out.flush()


if __name__ == "__main__":
    assemble(json.loads(sys.argv[1]))
