"""The lab faults that change what a node holds, not how it runs: its image under the tag, its
model's files (:mod:`sparkbook.lab.faults` lists them all). Each takes a fault's site and records in
it what undoing it needs (``s``: a :class:`sparkbook.lab.faults.Site`)."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

from .nodes import docker


def image_drift(s) -> None:
    image = s.params.runtime.image
    r = docker(s.node, "image", "inspect", "--format", "{{.Id}}", image, check=False)
    s.rec["previous"] = r.stdout.strip() if r.returncode == 0 else None
    tar_path = s.node.dir / "faults" / "drift.tar"
    with tarfile.open(tar_path, mode="w") as tar:
        data = f"image drift made by `sparkbook lab fault` at {time.time()}\n".encode()
        info = tarfile.TarInfo("sparkbook-lab-drift")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    s.rec["drift"] = docker(s.node, "import", str(tar_path), image).stdout.strip()


def image_back(s) -> None:
    image = s.params.runtime.image
    if s.rec["previous"]:
        docker(s.node, "tag", s.rec["previous"], image)
    else:
        docker(s.node, "rmi", image, check=False)
    docker(s.node, "rmi", s.rec["drift"], check=False)


def model_drift(s) -> None:
    cfg = s.node.dir / "models" / Path(s.params.model.path).name / "config.json"
    backup = s.node.dir / "faults" / "config.json"
    backup.write_bytes(cfg.read_bytes())
    data = json.loads(cfg.read_text())
    data["sparkbook_lab_drift"] = time.time()
    cfg.write_text(json.dumps(data, indent=2))
    s.rec["file"], s.rec["backup"] = str(cfg), str(backup)


def model_back(s) -> None:
    Path(s.rec["file"]).write_bytes(Path(s.rec["backup"]).read_bytes())


def shard_corrupt(s) -> None:
    folder = s.node.dir / "models" / Path(s.params.model.path).name
    shard = max((f for f in folder.rglob("*.safetensors") if f.is_file()), key=lambda f: f.stat().st_size)
    flip(shard, shard.stat().st_size // 2, s.rec)
    s.rec["file"] = str(shard)


def flip(path: Path, offset: int, rec: dict) -> None:
    """The byte at ``offset`` inverted in place, the file's times kept; ``rec`` gets what undoes it."""
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    rec["offset"], rec["byte"] = offset, byte[0]


def shard_back(s) -> None:
    """The byte written back, where 03 did not copy the file again already (then it holds it)."""
    path = Path(s.rec["file"])
    with path.open("rb") as f:
        f.seek(s.rec["offset"])
        flipped = f.read(1)[0] != s.rec["byte"]
    if flipped:
        flip(path, s.rec["offset"], {})
