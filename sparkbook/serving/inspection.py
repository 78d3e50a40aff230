"""What the serving image can do, read from the image itself on the head before anything starts
(04 and 05): the versions of vLLM, Ray and torch, the options ``vllm serve`` accepts and the model
architectures it supports; then the checks that the parameters ask for nothing it lacks."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..book.project import user_cache
from ..book.redact import mask
from ..book.tables import Table, short_id
from ..book.verdict import FAIL, PASS, WARN, Check
from ..facts.identity import INSPECT_FORMAT, ImageIdentity, parse, same_image
from ..nodes import workdir
from ..nodes.remote import Cluster
from ..nodes.shell import SCRIPTS
from ..params import Params
from . import vllm as engine
from .commands import shown
from .containers import docker_run, named
from .plan import plan
from .state import replace

INSPECT_SCRIPT = SCRIPTS / engine.INSPECT_SCRIPT
CACHE = "image_inspection.json"  # in the run folder: the last inspection, per image and model


@dataclass
class ImageInfo:
    image: str
    image_id: str | None = None
    vllm: str | None = None
    ray: str | None = None
    torch: str | None = None
    transformers: str | None = None
    options: list[str] = field(default_factory=list)
    options_from: str | None = None
    architectures: list[str] = field(default_factory=list)
    model_architectures: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # what could not be read -> why
    # what was read only with the platform stubbed (the engine would not import without a GPU)
    # -> the error that made it necessary
    stubbed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    reused: str = ""  # where the image half was read from when it was not inspected again


def inspect_image(params: Params, cluster: Cluster, run_dir: Path | None = None) -> ImageInfo:
    """Read the image on the head: versions, `vllm serve` options, supported architectures. Runs
    inside the image with the runtime's GPU flags (``vllm serve --help`` crashes in some images
    without GPU access); the result is kept in the run folder per image (the same by ID or by
    content: :func:`same_image`) and model, and what depends on the image alone in this user's
    cache by image ID (:func:`_kept`), so that the next run's 04 and 05 read only the model's
    config.json instead of starting the image again (a minute on the lab's 2 cores)."""
    head = params.head
    ident = cluster.run_on(head, ["docker", "image", "inspect", "--format", INSPECT_FORMAT, "--",
                                  params.runtime.image])
    found = ImageIdentity.of(parse(ident.stdout)) if ident.ok else None
    info = ImageInfo(params.runtime.image, found and found.id)
    if not found:
        info.errors["image"] = f"{params.runtime.image} is not on {head.name}: {ident.summary()}"
        return info
    cache = run_dir / CACHE if run_dir else None
    if cache and cache.exists():
        old = json.loads(cache.read_text())
        seen = ImageIdentity.of(old.pop("identity", None) or old.get("image_id"))
        if old.pop("model", None) == params.model.path and same_image(found, seen)[0]:
            return ImageInfo(**{**old, "image_id": found.id})
    start = time.monotonic()
    kept = _kept(params, found.id)
    reused = _reuse(kept, info)
    if reused:
        _read_model(params, cluster, info)
    elif not _inspect(params, cluster, info):
        return info
    info.seconds = time.monotonic() - start
    if not reused:
        _keep(kept, info)
    if cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(mask(json.dumps({**asdict(info), "model": params.model.path, "identity": asdict(found)},
                                         indent=2)) + "\n")
    return info


def _inspect(params: Params, cluster: Cluster, info: ImageInfo) -> bool:
    """Run the inspection script in the image on the head, into ``info``; False when it printed
    no result (said in ``info.errors``)."""
    head = params.head
    workdir.prepare(params, cluster, [head])
    remote = f"{workdir.workdir(params, head)}/{INSPECT_SCRIPT.name}"
    cluster.put(INSPECT_SCRIPT, remote, [head]).check("copy the inspection script")
    name = named(params, "inspect")
    run = docker_run(params, head, name, ["python3", remote, params.model.path],
                     detach=False, remove=True,
                     mounts=[f"{remote}:{remote}:ro", f"{params.model.path}:{params.model.path}:ro"])
    r = cluster.run_on(head, replace(params, head, name, run), timeout=300)
    printed = re.search(r"^INSPECT (.*)$", r.stdout, re.M)
    if not printed:
        info.errors["inspect"] = f"{shown(run)} printed no result: {r.summary()}"
        return False
    data = json.loads(printed.group(1))
    for k in ("vllm", "ray", "torch", "transformers", "options", "options_from", "architectures",
              "model_architectures", "stubbed"):
        if data.get(k) is not None:
            setattr(info, k, data[k])
    info.errors.update({k[:-len("_error")]: v for k, v in data.items() if k.endswith("_error")})
    return True


# What the inspection reads from the image alone (not from the model), kept by image ID
IMAGE_FIELDS = ("vllm", "ray", "torch", "transformers", "options", "options_from", "architectures", "stubbed")
# the runtime settings the inspection's container runs under (they decide whether the engine
# imports, and so what was read stubbed)
RUN_FIELDS = {"gpus", "shm_size", "privileged", "rdma", "entrypoint", "docker_args"}
CONFIG_MAX = 1 << 20  # bytes of a model's config.json read back


def _kept(params: Params, image_id: str) -> Path | None:
    """This user's cache entry for what ``image_id`` holds, as inspected under the parameters'
    runtime by this version of the inspection script. An image ID is a digest of the image's
    content, so the entry cannot go stale; a changed script or runtime is another entry. None when
    the cache folder cannot be made (a read-only home): every run then inspects the image."""
    key = hashlib.sha256(json.dumps([image_id, params.runtime.model_dump(mode="json", include=RUN_FIELDS),
                                     hashlib.sha256(INSPECT_SCRIPT.read_bytes()).hexdigest()],
                                    sort_keys=True).encode()).hexdigest()
    try:
        return user_cache("image-inspections") / f"{key[:32]}.json"
    except OSError:
        return None


def _reuse(kept: Path | None, info: ImageInfo) -> bool:
    """``info`` filled from the cache entry ``kept``; False when there is none that can be read."""
    if kept is None:
        return False
    try:
        data = json.loads(kept.read_text())
        fields = {k: data[k] for k in IMAGE_FIELDS}
        when = float(data["inspected_at"]), float(data["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for k, v in fields.items():
        setattr(info, k, v)
    info.reused = (f"kept by image ID: inspected {time.strftime('%Y-%m-%d %H:%M', time.localtime(when[0]))} "
                   f"in {when[1]:.0f} s")
    return True


def _keep(kept: Path | None, info: ImageInfo) -> None:
    """Write ``info``'s image half to ``kept`` (whole or not at all); a read that failed in part
    (a time limit on a busy node may be why) is not kept, nor is a cache that cannot be written."""
    if kept is None or set(info.errors) - {"model"}:
        return
    data = {**{k: getattr(info, k) for k in IMAGE_FIELDS}, "image_id": info.image_id,
            "inspected_at": time.time(), "seconds": info.seconds}
    tmp = kept.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(mask(json.dumps(data)) + "\n")
        os.replace(tmp, kept)
    except OSError:
        tmp.unlink(missing_ok=True)


def _read_model(params: Params, cluster: Cluster, info: ImageInfo) -> None:
    """The architectures in the model's config.json on the head (what the inspection script reads
    in the image, read here without starting it)."""
    cfg = f"{params.model.path}/config.json"
    r = cluster.run_on(params.head, ["head", "-c", str(CONFIG_MAX), "--", cfg], timeout=30)
    if not r.ok:
        info.errors["model"] = f"{cfg}: {(r.stderr.strip().splitlines() or [r.summary()])[-1].rsplit(': ', 1)[-1]}"
        return
    try:
        info.model_architectures = json.loads(r.stdout).get("architectures") or []
    except (ValueError, AttributeError):
        info.errors["model"] = f"{cfg}: not a JSON object"


def configured_options(params: Params) -> list[str]:
    """Every ``--option`` that sparkbook would pass to ``vllm serve`` on any node."""
    seen = []
    for n in plan(params).nodes.values():
        for a in n.serve_args:
            if a.startswith("--"):
                o = a.split("=", 1)[0]
                if o not in seen:
                    seen.append(o)
    return seen


def image_checks(params: Params, info: ImageInfo, need_ray: bool | None = None) -> list[Check]:
    """The image can do what the parameters ask: fails in seconds, naming the problem. Ray is
    needed by the Ray executor (``need_ray`` by default) and by 04, which forms a Ray cluster."""
    need_ray = params.serving.executor == "ray" if need_ray is None else need_ray
    head = params.head.name
    if "image" in info.errors:
        return [Check("image", head, FAIL, info.errors["image"], params.runtime.image,
                      "run 03_distribute_image.ipynb (or `docker pull`) first")]
    if not info.vllm:
        return [Check("vLLM in the image", head, FAIL, info.errors.get("inspect", "vllm not installed"),
                      "vllm importable", "choose an image with vLLM (runtime.image)")]
    out = [Check("vLLM in the image", head, PASS, f"vLLM {info.vllm}, torch {info.torch}")]
    if need_ray:
        out.append(Check("Ray in the image", head, PASS if info.ray else FAIL,
                         f"Ray {info.ray}" if info.ray else "no Ray", "Ray (executor ray)",
                         "" if info.ray else "use an image with Ray (NGC's vLLM image lacks it: `pip "
                         "install ray[default]` in a derived image) or serving.executor: mp"))
    out.append(_options_check(params, info))
    out.append(_architecture_check(params, info))
    return out


def _options_check(params: Params, info: ImageInfo) -> Check:
    head = params.head.name
    if not info.options:
        return Check("vllm serve options", head, WARN, info.errors.get("options", "not read"),
                     "the option list", "the options will be checked by vLLM when it starts")
    known = set(info.options)
    configured = configured_options(params)
    unknown = [o for o in configured if o not in known and o.replace("_", "-") not in known]
    stub = info.stubbed.get("options")
    return Check("vllm serve options", head, (WARN if stub else FAIL) if unknown else PASS,
                 (f"unknown to vLLM {info.vllm}: {', '.join(unknown)}" if unknown else
                  f"{len(configured)} options, all known") + _stub_note(stub),
                 "options this vLLM accepts",
                 "remove or rename them in serving.extra_args / the serving parameters (`vllm serve "
                 "--help=all` in the image lists them), or use a vLLM that has them" if unknown else "")


def _stub_note(error: str | None) -> str:
    """What a check read with the platform stubbed says (a WARN, never a FAIL, when it finds a
    problem: the real platform may differ)."""
    return f" (read with the platform stubbed: the engine did not import here: {error})" if error else ""


def _architecture_check(params: Params, info: ImageInfo) -> Check:
    head = params.head.name
    if info.model_architectures and info.architectures:
        missing = [a for a in info.model_architectures if a not in info.architectures]
        stub = info.stubbed.get("architectures")
        return Check("model architecture", head, (WARN if stub else FAIL) if missing else PASS,
                     (f"{', '.join(missing)} not supported by vLLM {info.vllm}" if missing else
                      ", ".join(info.model_architectures)) + _stub_note(stub), "supported by this vLLM",
                     "use a vLLM image that supports the model (a newer one, or the model's own "
                     "image)" if missing else "")
    if "model" in info.errors:
        return Check("model architecture", head, FAIL, info.errors["model"], "the model's config.json",
                     f"put the model at {params.model.path} on every node (03_distribute_image.ipynb)")
    return Check("model architecture", head, WARN, info.errors.get("architectures", "not read"),
                 "supported by this vLLM")


def image_table(info: ImageInfo) -> Table:
    rows = [["image", f"{info.image} ({short_id(info.image_id)})"],
            ["vLLM", info.vllm], ["Ray", info.ray or "absent"], ["torch", info.torch],
            ["transformers", info.transformers],
            ["serve options", f"{len(info.options)} (from {info.options_from})"],
            ["supported architectures", len(info.architectures)],
            ["model architectures", ", ".join(info.model_architectures)]]
    rows += [["read", info.reused or f"from the image, in {info.seconds:.0f} s"]]
    rows += [[f"{k} read with the platform stubbed", why] for k, why in info.stubbed.items()]
    rows += [[f"not read: {k}", why] for k, why in info.errors.items()]
    return Table(["", "value"], rows, title="the serving image")
