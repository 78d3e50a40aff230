"""Preflight checks of what the deployment brings: the image (the head's, the same on every node by
ID or by content, or still to distribute), the model (the head's files on every node) and the
Hugging Face token."""

from __future__ import annotations

import os
from typing import Iterator

from ..book.tables import human_bytes, short_id
from ..book.verdict import FAIL, PASS, SKIP, WARN, Check, run_step
from ..facts.identity import ImageIdentity, same_image
from ..facts.manifest import describe_differences, manifest_differences, node_script, split_extras
from ..params import Params
from .collect import Preflight


def image(params: Params, pf: Preflight) -> Iterator[Check]:
    if params.runtime.kind != "docker":
        return
    name, head = params.runtime.image, params.head.name
    ref = ImageIdentity.of(pf.nodes[head]["image"]) if head in pf.nodes else None
    for node in pf.up(params):
        img = ImageIdentity.of(pf.nodes[node.name]["image"])
        if node.name == head:
            ok = img is not None
            yield Check("image", node.name, PASS if ok else FAIL, short_id(img.id) if ok else "absent",
                        f"{name} on the head", "" if ok else f"`docker pull {name}` (or build it) on the head",
                        f"docker image inspect {name}")
        elif img is None:
            yield Check("image", node.name, WARN, "absent: to distribute", short_id(ref and ref.id),
                        run_step("03_distribute_image") + ": it sends the image from the head")
        else:
            ok, why = same_image(img, ref)
            yield Check("image", node.name, PASS if ok else FAIL,
                        short_id(img.id) + ("" if ref and img.id == ref.id else f": {why}"),
                        short_id(ref and ref.id), "" if ok else f"a different image under "
                        f"{name}: {run_step('03_distribute_image')}: it replaces it with the head's",
                        f"docker image inspect {name}")


def model(params: Params, pf: Preflight) -> Iterator[Check]:
    m, head = params.model, params.head.name
    ref = pf.nodes[head]["model"] if head in pf.nodes else None
    for node in pf.up(params):
        files = pf.nodes[node.name]["model"]
        if error := pf.nodes[node.name].get("model_error"):
            yield Check("model", node.name, FAIL, f"the manifest of {m.path} could not be read: {error}",
                        "the model on every node", "read the error; check the folder's permissions on the node",
                        str(node_script(params, node)))
        elif files is None:
            fetched = m.source == "hf"  # 03 downloads it onto the head, then copies it
            yield Check("model", node.name, FAIL if node.name == head and not fetched else WARN,
                        f"{m.path} absent", "the model on every node",
                        f"{run_step('03_distribute_image')}: it downloads {m.name} onto the head and copies it "
                        "to the workers"
                        if fetched else "download it on the head (huggingface-cli download "
                        f"{m.name} --local-dir {m.path}); 03_distribute_image.ipynb copies it to the workers")
        elif node.name == head or ref is None:
            size = sum(f["size"] for f in files.values()) / 1e9
            yield Check("model", node.name, PASS, f"{len(files)} files, {size:.2f} GB", "the model on every node")
        else:
            differ, extras = split_extras(manifest_differences(ref, files))
            diff = describe_differences(differ)
            yield Check("model", node.name, FAIL if diff else PASS,
                        "differs: " + ", ".join(diff[:6]) + (" ..." if len(diff) > 6 else "") if diff
                        else f"identical to {head} ({len(files)} files, {how(params, pf, node.name)})",
                        f"identical to {head}",
                        run_step("03_distribute_image") + ": its model sync copies the differing files from the head"
                        if diff else "", str(node_script(params, node)))
            if extras:  # another model in the same folder, say: never sparkbook's to delete
                yield Check("model extras", node.name, WARN,
                            f"{len(extras)} file(s) the head lacks: " + ", ".join(extras[:5])
                            + (f" and {len(extras) - 5} more" if len(extras) > 5 else ""),
                            f"only the model's files under {m.path}",
                            "kept (03_distribute_image.ipynb never deletes them); "
                            "distribution.delete_extras: true deletes them")


def how(params: Params, pf: Preflight, node: str) -> str:
    """How a worker's files were compared with the head's: by content or by size, and what it read."""
    if params.model.verify != "all":
        return "by size; the config files by SHA-256"
    got, files = pf.nodes[node].get("model_read"), len(pf.nodes[node].get("model") or {})
    if not got:
        return "by SHA-256"
    read = f"by SHA-256; hashing read {human_bytes(got[0])}"
    if got[1] == 0:
        return f"{read}, every digest cached"
    return f"{read} ({got[1]} file(s)" + (", none cached)" if got[1] >= files else f", {files - got[1]} cached)")


def hf_token(params: Params, pf: Preflight) -> Iterator[Check]:
    """The token is set on this machine where the model needs one (never shown)."""
    env = params.model.hf_token_env
    if not params.model.needs_token:
        yield Check("hf token", "local", SKIP, "the model needs no token")
        return
    ok = bool(os.environ.get(env))
    yield Check("hf token", "local", PASS if ok else FAIL, f"${env} {'is set (hidden)' if ok else 'is not set'}",
                f"${env} set on this machine", "" if ok else f"export {env}=... (from huggingface.co "
                "settings) before starting Jupyter or sparkbook")
