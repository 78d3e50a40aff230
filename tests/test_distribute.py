"""Image and model distribution: the layer-skipping stream offline (synthetic archives in both
layouts), then on the lab: head-only image to every node, the update path, drift, an interrupted
copy, and the model sync."""

import hashlib
import io
import json
import random
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from sparkbook import distribute
from sparkbook.lab import faults
from sparkbook.lab.lab import docker
from sparkbook.params import load
from sparkbook.runner import run
from sparkbook.scripts.imagestream import Layers, chain_ids, split, v1_ids

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"

# `docker save` of a three-layer image on this project's lab (Docker 20.10.24): the image's diff
# IDs, and the folder names the archive gave its two lower layers.
DIFF_IDS = ["sha256:f27a358bd91b4169bd03d6ce92eea2e00101bf7035b204aaedc2637de292653d",
            "sha256:b11bb190d89c368c6a654a8446abdff8c16a73d873f55fa0effb1dd8a878ee7a",
            "sha256:a6280afec4712347b26136c8b2d94cd808a00ae1494d9b0c75dd79d17baf1334"]
SAVED_FOLDERS = ["32048ce803bca8d4f2a05ebc9230abb29899453571bd35864013f9545fbf8b77",
                 "8f946d008227055a63f91578ef58310bbc619af54a1f940cbd2c7c5c3d61231d"]


def test_v1_folder_names_match_what_docker_20_10_saved():
    assert [v.split(":")[1] for v in v1_ids(DIFF_IDS)] == SAVED_FOLDERS
    chains = chain_ids(DIFF_IDS)
    assert chains[0] == DIFF_IDS[0]
    assert chains[1] == "sha256:" + hashlib.sha256(f"{DIFF_IDS[0]} {DIFF_IDS[1]}".encode()).hexdigest()


class FakeSink:
    def __init__(self, name, have=(), breaks_after=None):
        self.name, self.have = name, set(have)
        self.out = io.BytesIO()
        self.error = None
        self.skipped = self.layers_skipped = 0
        self.breaks_after = breaks_after

    def write(self, data):
        if self.error:
            return
        if self.breaks_after is not None and self.out.tell() + len(data) > self.breaks_after:
            self.error = "broken pipe"
            return
        self.out.write(data)

    def members(self):
        with tarfile.open(fileobj=io.BytesIO(self.out.getvalue())) as t:
            return {m.name: t.extractfile(m).read() if m.isfile() else None for m in t.getmembers()}


def legacy_archive(diff_ids, top_folder="f" * 64, fmt=tarfile.USTAR_FORMAT):
    """An archive laid out like `docker save` before Docker 25: a folder per layer, each with
    VERSION, json (naming its parent) and layer.tar."""
    folders = [v.split(":")[1] for v in v1_ids(diff_ids)] + [top_folder]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for i, folder in sorted(enumerate(folders), key=lambda x: x[1]):
            add(f"{folder}/VERSION", b"1.0")
            meta = {"id": folder, **({"parent": folders[i - 1]} if i else {})}
            add(f"{folder}/json", json.dumps(meta).encode())
            add(f"{folder}/layer.tar", bytes([65 + i]) * (3000 + 1000 * i))
        add("manifest.json", json.dumps([{"Layers": [f"{f}/layer.tar" for f in folders]}]).encode())
    return buf.getvalue()


def test_split_leaves_out_exactly_the_held_layers():
    chains = chain_ids(DIFF_IDS)
    archive = legacy_archive(DIFF_IDS)
    fresh, partial, full = FakeSink("fresh"), FakeSink("partial", chains[:2]), FakeSink("full", chains)
    split(io.BytesIO(archive), Layers(DIFF_IDS), [fresh, partial, full])
    assert fresh.out.getvalue() == archive and fresh.layers_skipped == 0
    got = partial.members()
    assert all(f"{f}/layer.tar" not in got for f in SAVED_FOLDERS)
    assert got[f"{'f' * 64}/layer.tar"] == b"C" * 5000  # the top layer, found through its json
    assert "manifest.json" in got and f"{SAVED_FOLDERS[0]}/json" in got
    assert partial.layers_skipped == 2
    assert len(archive) - len(partial.out.getvalue()) == partial.skipped
    assert full.layers_skipped == 3 and not any(n.endswith("layer.tar") for n in full.members())


def test_only_a_layer_held_with_the_same_parents_is_left_out():
    chains = chain_ids(DIFF_IDS)
    # the worker holds the middle layer's content on another base: a different chain
    other = chain_ids([DIFF_IDS[2], DIFF_IDS[1]])
    sink = FakeSink("w", [chains[0], *other])
    split(io.BytesIO(legacy_archive(DIFF_IDS)), Layers(DIFF_IDS), [sink])
    assert sink.layers_skipped == 1 and f"{SAVED_FOLDERS[1]}/layer.tar" in sink.members()


def test_oci_layout_and_long_names_through_pax_headers():
    """Docker 25 and later name layers blobs/sha256/<diff id>; pax headers carry long names."""
    chains = chain_ids(DIFF_IDS)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for i, d in enumerate(DIFF_IDS):
            info = tarfile.TarInfo("blobs/sha256/" + d.split(":")[1])
            info.size = 700
            t.addfile(info, io.BytesIO(bytes([97 + i]) * 700))
        long = tarfile.TarInfo("x" * 150)
        long.size = 5
        t.addfile(long, io.BytesIO(b"hello"))
    sink = FakeSink("w", chains[:2])
    split(io.BytesIO(buf.getvalue()), Layers(DIFF_IDS), [sink])
    got = sink.members()
    assert sorted(got) == ["blobs/sha256/" + DIFF_IDS[2].split(":")[1], "x" * 150]
    assert got["x" * 150] == b"hello"


def test_one_broken_stream_does_not_stop_the_others():
    archive = legacy_archive(DIFF_IDS)
    broken, fine = FakeSink("broken", breaks_after=4096), FakeSink("fine")
    split(io.BytesIO(archive), Layers(DIFF_IDS), [broken, fine])
    assert broken.error and fine.out.getvalue() == archive


def test_a_truncated_archive_is_an_error():
    with pytest.raises(EOFError):
        split(io.BytesIO(legacy_archive(DIFF_IDS)[:5000]), Layers(DIFF_IDS), [FakeSink("w")])


def test_survey_parsing_and_the_containerd_store():
    text = "\n".join(["@@ id", "sha256:abc 4321", "@@ image layers", json.dumps(DIFF_IDS),
                      "@@ docker", "29.1.0", "@@ driver",
                      'overlayfs [["driver-type","io.containerd.snapshotter.v1"]]',
                      "@@ layers", json.dumps(DIFF_IDS[:2]), "@@ zstd", "/usr/bin/zstd"])
    s = distribute.parse_survey("w", text)
    assert (s.id, s.size, s.docker, s.zstd) == ("sha256:abc", 4321, "29.1.0", True)
    assert s.containerd_store and not s.skips_layers
    assert s.chains == set(chain_ids(DIFF_IDS[:2]))
    classic = distribute.parse_survey("w", text.replace("overlayfs [[\"driver-type\",\"io.containerd."
                                                        "snapshotter.v1\"]]", "overlay2 []"))
    assert classic.skips_layers and classic.driver == "overlay2"
    assert distribute.parse_survey("w", "@@ id\nabsent\n@@ zstd\nabsent").id is None


def test_rsync_command_quotes_names_and_never_leaves_partial_files_under_their_name():
    params = load(LAB)
    cmd = distribute.rsync_command(params, params.workers[0], ["a b.safetensors", "x'; touch pwned"])
    assert "'a b.safetensors'" in cmd and "'x'\"'\"'; touch pwned'" in cmd
    assert "--partial-dir=.sparkbook-partial" in cmd and "-I" in cmd.split()
    assert "--delete-missing-args" in cmd and "StrictHostKeyChecking=yes" in cmd
    assert cmd.endswith(f"{params.workers[0].peer_target}:/models/tiny-qwen3/")


# ------------------------------------------------------------------------------------- on the lab

def on_image(params, image, compress="off", reader="auto"):
    return params.model_copy(update={
        "runtime": params.runtime.model_copy(update={"image": image}),
        "distribution": params.distribution.model_copy(update={"compress": compress, "reader": reader})})


def build(lab, image, base, mb, name, tmp):
    """An image on the head: ``base`` plus a layer with ``mb`` MiB of random bytes."""
    ctx = tmp / image.replace("/", "_").replace(":", "_")
    ctx.mkdir()
    (ctx / name).write_bytes(random.randbytes(mb << 20))
    (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY {name} /{name}\n")
    docker(lab.nodes()[0], "build", "-q", "-t", image, str(ctx), timeout=300)


def ids(lab, image):
    return [docker(n, "image", "inspect", "--format", "{{.Id}}", image, check=False).stdout.strip() or None
            for n in lab.nodes()]


@pytest.fixture(scope="module")
def small_images(lab, tmp_path_factory):
    """Two versions of a small image on the head; removed from every node afterwards."""
    tmp = tmp_path_factory.mktemp("images")
    subprocess.run(["tar", "-c", "-f", str(tmp / "base.tar"), "-C", str(ROOT), "pyproject.toml"], check=True)
    docker(lab.nodes()[0], "import", str(tmp / "base.tar"), "sparkbook-test/base:1")
    build(lab, "sparkbook-test/app:1", "sparkbook-test/base:1", 2, "v1.bin", tmp)
    build(lab, "sparkbook-test/app:2", "sparkbook-test/app:1", 1, "v2.bin", tmp)
    yield tmp
    for n in lab.nodes():
        for i in ("sparkbook-test/big:1", "sparkbook-test/app:2", "sparkbook-test/app:1",
                  "sparkbook-test/base:1"):
            docker(n, "rmi", i, check=False)


@pytest.mark.parametrize("reader", ["auto", "docker-save"])
def test_head_only_image_reaches_every_node_then_an_update_sends_only_its_new_layer(
        lab, params, cluster, small_images, reader):
    v1, v2 = "sparkbook-test/app:1", "sparkbook-test/app:2"
    worker = lab.nodes()[1]
    for i in (v2, v1, "sparkbook-test/base:1"):
        docker(worker, "rmi", i, check=False)
    p1 = on_image(params, v1, reader=reader)
    out = distribute.distribute_image(p1, cluster, show=False)
    assert not distribute.image_verdict(p1, out).failures
    assert len(set(ids(lab, v1))) == 1 and None not in ids(lab, v1)
    assert out.transfers[0].layers_held == 0
    assert out.transfers[0].read_from == {"auto": "layer store", "docker-save": "docker save"}[reader]

    p2 = on_image(params, v2, reader=reader)
    head = lab.nodes()[0]
    size = lambda i: int(docker(head, "image", "inspect", "--format", "{{.Size}}", i).stdout)
    new_layer = size(v2) - size(v1)
    out = distribute.distribute_image(p2, cluster, show=False)
    assert not distribute.image_verdict(p2, out).failures
    assert len(set(ids(lab, v2))) == 1
    t = out.transfers[0]
    assert t.layers_held == 2 and t.wire < 1.2 * new_layer, (t, new_layer)

    again = distribute.distribute_image(p2, cluster, show=False, say=lambda *_: None)
    assert again.transfers == [] and not distribute.image_verdict(p2, again).failures


def test_layer_store_read_in_a_container_of_the_image(lab, params, cluster, small_images):
    """For users in the docker group who cannot read Docker's folder: the serving image reads it."""
    distribute.ensure_image(params, cluster, say=lambda *_: None)
    nxt = params.runtime.image.rsplit(":", 1)[0] + ":test-next"
    build(lab, nxt, params.runtime.image, 1, "next.bin", small_images)
    try:
        p = on_image(params, nxt, reader="container")
        out = distribute.distribute_image(p, cluster, show=False, say=lambda *_: None)
        assert not distribute.image_verdict(p, out).failures
        t = out.transfers[0]
        assert t.read_from == "layer store (read in a container)" and t.layers_held == 3
        assert t.wire < 1.2 * (1 << 20) + 64 * 1024
        # an image without python3 cannot read it: docker save then
        toy = on_image(params, "sparkbook-test/app:1", reader="container")
        for n in lab.nodes()[1:]:
            docker(n, "rmi", "sparkbook-test/app:1", check=False)
        out = distribute.distribute_image(toy, cluster, show=False, say=lambda *_: None)
        assert not distribute.image_verdict(toy, out).failures and out.transfers[0].read_from == "docker save"
    finally:
        for n in lab.nodes():
            docker(n, "rmi", nxt, check=False)


def test_interrupted_copy_leaves_no_image_under_the_tag_and_a_rerun_completes(
        lab, params, cluster, small_images):
    head, worker = lab.nodes()
    image = "sparkbook-test/big:1"
    build(lab, image, "sparkbook-test/base:1", 48, "big.bin", small_images)
    p = on_image(params, image)
    faults.apply(lab, "slow-link", node=worker.name, rate="40mbit")  # about 5 MB/s: time to cut it
    try:
        box = {}
        copy = threading.Thread(target=lambda: box.update(out=distribute.distribute_image(
            p, cluster, show=False, say=lambda *_: None)))
        copy.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and lab.node_sh(worker, "pgrep -f 'docker load'",
                                                          check=False).returncode != 0:
            time.sleep(0.2)
        time.sleep(1.5)
        lab.node_sh(head, "pkill -f imagestream.py")
        copy.join(120)
    finally:
        faults.heal(lab, "slow-link")
    verdict = distribute.image_verdict(p, box["out"])
    failed = {c.node: c for c in verdict.failures}
    assert set(failed) == {worker.name} and failed[worker.name].remedy
    assert ids(lab, image)[1] is None, "a half-copied image is tagged on the worker"

    out = distribute.distribute_image(p, cluster, show=False, say=lambda *_: None)
    assert not distribute.image_verdict(p, out).failures and len(set(ids(lab, image))) == 1


def test_drifted_image_and_model_are_found_fixed_and_verified_by_the_notebook(
        lab, params, cluster, tmp_path):
    distribute.ensure_image(params, cluster, say=lambda *_: None)  # the worker holds every layer
    head_id = ids(lab, params.runtime.image)[0]
    faults.apply(lab, "image-drift")
    faults.apply(lab, "model-drift")
    try:
        summary = run(LAB, steps="03", out=tmp_path, report=False)
        assert summary["status"] == "passed", summary
        data = json.loads((tmp_path / "distribution.json").read_text())
        worker = params.workers[0].name
        assert data["image"]["before"][worker] not in (None, head_id)
        assert data["image"]["after"][worker] == head_id
        # every layer was already there (the drift only moved the tag): nothing big crossed
        assert data["image"]["transfers"][0]["layers_held"] == 3
        assert data["image"]["transfers"][0]["wire"] < 1 << 20
        assert list(data["model"]["before"][worker]) == ["config.json"]
        assert data["model"]["after"][worker] == {} and data["model"]["synced"][worker]["error"] is None
    finally:
        faults.heal(lab, "model-drift")
        faults.heal(lab, "image-drift")
    assert len(set(ids(lab, params.runtime.image))) == 1


def test_a_worker_without_the_model_gets_all_of_it(lab, params, cluster):
    worker = params.workers[0]
    files = distribute.manifests(params, cluster)[params.head.name]
    cluster.run(["rm", "-rf", params.model.path], [worker]).check("remove the worker's model")
    out = distribute.sync_model(params, cluster, show=False, say=lambda *_: None)
    assert out.before[worker.name] == {n: "missing" for n in files}
    assert out.after[worker.name] == {} and not distribute.model_verdict(params, out).failures
    assert out.synced[worker.name]["files"] == len(files)
