"""Whether two nodes hold the same image: by ID, else by content.

Docker names an image differently in its two image stores: the classic store (graph drivers such
as overlay2) by the digest of the image's config, the containerd image store (the default on fresh
installs of Docker 29) by the digest of its manifest or index. The same image on two nodes whose
Docker uses different stores, or loaded from an archive into the containerd store, thus has two IDs
(moby/moby#48401, docker/cli#5526, docker/cli#6670). What the image is stays the same in both: its
layers' diff IDs (``RootFS.Layers``: digests of the uncompressed layers) and the runtime config a
container starts with. :func:`same_image` compares those when the IDs differ; every comparison of
an image across nodes (01, 03, 04 and 05) goes through it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

# The fields of `docker image inspect` that identify an image (and its size, for 03), as one compact
# JSON object in Docker's own shape, one line per image. The node scripts that read an image
# (image_survey.sh, runtime_state.sh, serving_state.sh) take it as an argument.
INSPECT_FORMAT = ('{"Id":{{json .Id}},"Size":{{json .Size}},"RepoDigests":{{json .RepoDigests}},'
                  '"RootFS":{"Layers":{{json .RootFS.Layers}}},"Config":{{with .Config}}'
                  '{"Entrypoint":{{json .Entrypoint}},"Cmd":{{json .Cmd}},"Env":{{json .Env}},'
                  '"User":{{json .User}},"WorkingDir":{{json .WorkingDir}}}{{else}}null{{end}}}')

# The runtime config compared, and how a verdict names each part.
RUNTIME = {"Entrypoint": "entrypoint", "Cmd": "command", "Env": "environment", "User": "user",
           "WorkingDir": "working directory"}

# What was checked, not why the IDs differ (another storage back-end, a rebuild, a load from an
# archive...): 03 adds the back-ends where its survey knows they differ.
SAME_CONTENT = "same layers and runtime config under another ID (e.g. another storage back-end)"


@dataclass(frozen=True)
class ImageIdentity:
    """An image as one node's Docker holds it: its ID there, its layers' diff IDs, its runtime
    config (the :data:`RUNTIME` keys, the environment as name -> digest; None: not read) and the
    registry digests it was pulled by."""
    id: str
    layers: tuple[str, ...] = ()
    config: dict[str, Any] | None = None
    digests: tuple[str, ...] = ()

    @classmethod
    def of(cls, value: ImageIdentity | dict | str | None) -> ImageIdentity | None:
        """From `docker image inspect`'s JSON object (all of it, or :data:`INSPECT_FORMAT`'s),
        from this class's own JSON form, or from an ID alone (its content then unknown)."""
        if value is None or isinstance(value, ImageIdentity):
            return value
        if isinstance(value, str):
            return cls(value) if value else None
        if "id" in value:  # asdict() of an identity, as a run folder holds it
            return cls(value["id"], tuple(value.get("layers") or ()), value.get("config"),
                       tuple(value.get("digests") or ()))
        config = value.get("Config")
        return cls(value["Id"], tuple((value.get("RootFS") or {}).get("Layers") or ()),
                   None if config is None else _runtime(config), tuple(value.get("RepoDigests") or ()))

    @property
    def content_known(self) -> bool:
        return bool(self.layers) and self.config is not None


def _runtime(config: dict) -> dict[str, Any]:
    """The runtime config, with Docker's null and empty forms made one (``"Cmd": null`` and
    ``[]`` both mean none); the environment as name -> a digest of the value, since an image's
    environment may hold a secret and identities are written into run folders."""
    out = {k: config.get(k) or ("" if k in ("User", "WorkingDir") else []) for k in RUNTIME}
    out["Env"] = {name: hashlib.sha256(value.encode()).hexdigest()[:16]
                  for name, _, value in (e.partition("=") for e in out["Env"])}
    return out


def parse(text: str) -> dict | None:
    """The JSON object a node printed for an image (:data:`INSPECT_FORMAT`, or `docker image
    inspect`'s list of one); None where the image is absent or the output is not one."""
    text = text.strip()
    if not text.startswith(("{", "[")):
        return None
    try:
        found = json.loads(text.splitlines()[0] if text.startswith("{") else text)
    except json.JSONDecodeError:
        return None
    found = found[0] if isinstance(found, list) and found else found
    return found if isinstance(found, dict) and found.get("Id") else None


def same_image(a: ImageIdentity | None, b: ImageIdentity | None) -> tuple[bool, str]:
    """Whether ``a`` is the image ``b`` (the reference, usually the head's), and why: equal IDs;
    else equal diff IDs and runtime config (:data:`SAME_CONTENT`); else what differs."""
    if a is None or b is None:
        return False, "absent" if a is None else "no image to compare with"
    if a.id == b.id:
        return True, "same ID"
    if not (a.content_known and b.content_known):
        if set(a.digests) & set(b.digests):
            return True, "same registry digest under another ID (its layers and config not read)"
        return False, "a different ID (its layers and config not read)"
    if a.layers != b.layers:
        first = next((i for i, (x, y) in enumerate(zip(a.layers, b.layers)) if x != y),
                     min(len(a.layers), len(b.layers)))
        return False, f"different layers ({len(a.layers)} vs {len(b.layers)}, from layer {first + 1})"
    differ = [RUNTIME[k] for k in RUNTIME if a.config[k] != b.config[k]]
    if not differ:
        return True, SAME_CONTENT
    if "environment" in differ:  # by name only
        env = a.config["Env"], b.config["Env"]
        names = sorted(k for k in env[0].keys() | env[1].keys() if env[0].get(k) != env[1].get(k))
        differ[differ.index("environment")] = f"environment ({', '.join(names)})"
    return False, "same layers, different " + ", ".join(differ)
