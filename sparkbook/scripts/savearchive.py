#!/usr/bin/env python3
"""A `docker save` archive read as it streams through imagestream.py: its tar headers, and which
member is which layer of the image (standard library only; copied to the nodes next to it).

Why leaving layers out works: `docker load` (classic image store) looks each layer up by its chain ID
before it opens the layer's file, so an archive whose already-present layers are absent loads to the
same image ID. The layers are named in the archive either `blobs/sha256/<diff id>` (Docker 25 and
later, OCI layout) or `<v1 id>/layer.tar` (earlier), where the v1 ID of every layer but the top one
is the digest of a fixed JSON document holding the chain ID (moby image/tarexport/save.go,
image/v1/imagev1.go CreateID), and the top one is the folder whose `json` names that layer as its
parent. A layer is left out only when its name matches a computed digest exactly, so a format this
script does not know costs the saving, never correctness.
"""

import collections
import hashlib
import json

try:
    from .layerstore import chain_ids
except ImportError:  # run on a node, next to layerstore.py
    from layerstore import chain_ids

# The v1 config of every layer but the top one: a zero image, created at the epoch (moby save.go).
ZERO_CONFIG = ('{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,'
               '"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,'
               '"Cmd":null,"Image":"","Volumes":null,"WorkingDir":"","Entrypoint":null,'
               '"OnBuild":null,"Labels":null}')


def v1_ids(diff_ids):
    """The names `docker save` (before Docker 25) gives the layer folders, but for the top layer."""
    out, parent = [], None
    for chain in chain_ids(diff_ids)[:-1]:
        doc = ('{"container_config":' + ZERO_CONFIG + ',"created":"1970-01-01T00:00:00Z",'
               f'"layer_id":"{chain}"' + (f',"parent":"{parent}"' if parent else "") + "}")
        parent = "sha256:" + hashlib.sha256(doc.encode()).hexdigest()
        out.append(parent)
    return out


class Layers:
    """Which archive member is which layer of the image, for both archive layouts."""

    def __init__(self, diff_ids):
        self.chains = chain_ids(diff_ids)
        v1 = v1_ids(diff_ids)
        self.names = collections.defaultdict(list)
        for i, d in enumerate(diff_ids):
            self.names["blobs/sha256/" + d.split(":")[1]].append(i)
        for i, v in enumerate(v1):
            self.names[v.split(":")[1] + "/layer.tar"].append(i)
        # The top layer's folder name cannot be computed (it digests the image's whole config),
        # but its `json`, which precedes its layer.tar, names as parent the layer below it.
        self.top_parent = v1[-1].split(":")[1] if v1 else None
        self.single = len(diff_ids) == 1

    def see_json(self, name, data):
        """Learn the top layer's folder from a `<folder>/json` member."""
        folder = name[:-len("/json")]
        if "/" in folder or folder + "/layer.tar" in self.names:
            return
        try:
            parent = json.loads(data).get("parent")
        except ValueError:
            return
        if parent == self.top_parent or (self.single and parent is None):
            self.names[folder + "/layer.tar"].append(len(self.chains) - 1)

    def held(self, name, have):
        """Whether ``name`` is a layer whose every use in the image is already in ``have``."""
        idx = self.names.get(name)
        return bool(idx) and all(self.chains[i] in have for i in idx)


def octal(field):
    if field[0] & 0x80:  # base-256 (GNU) for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0")[0].strip()
    return int(text, 8) if text else 0


def read_exact(f, n):
    buf = bytearray()
    while len(buf) < n:
        part = f.read(n - len(buf))
        if not part:
            raise EOFError(f"archive ends early ({len(buf)} of {n} bytes)")
        buf += part
    return bytes(buf)
