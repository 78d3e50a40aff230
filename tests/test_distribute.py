"""Image and model distribution: the layer-skipping stream offline (synthetic archives in both
layouts), the node scripts run here (a stand-in docker, rsync to a local folder), 03's outcome;
then on the lab: head-only image to every node, the update path, drift, an interrupted copy, and
the model sync."""

import hashlib
import io
import json
import os
import random
import re
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from sparkbook.distribution.image import (ImageOutcome, NodeImage, Survey, Transfer, distribute_image,
                                          ensure_image, image_checks, parse_survey, survey_script)
from sparkbook.distribution.model import (ModelCopy, ModelOutcome, manifests, model_checks, sync_model,
                                          sync_script)
from sparkbook.lab import faults
from sparkbook.lab.lab import docker
from sparkbook.params import load
from sparkbook.remote import script
from sparkbook.runner import run
from sparkbook.scripts.imagestream import Layers, chain_ids, split, v1_ids
from sparkbook.steps import distribute as step
from sparkbook.verdict import FAIL

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"

# `docker save` of a three-layer image on this project's lab (Docker 20.10.24): the image's diff
# IDs, and the folder names the archive gave its two lower layers.
DIFF_IDS = ["sha256:f27a358bd91b4169bd03d6ce92eea2e00101bf7035b204aaedc2637de292653d",
            "sha256:b11bb190d89c368c6a654a8446abdff8c16a73d873f55fa0effb1dd8a878ee7a",
            "sha256:a6280afec4712347b26136c8b2d94cd808a00ae1494d9b0c75dd79d17baf1334"]
SAVED_FOLDERS = ["32048ce803bca8d4f2a05ebc9230abb29899453571bd35864013f9545fbf8b77",
                 "8f946d008227055a63f91578ef58310bbc619af54a1f940cbd2c7c5c3d61231d"]


def failures(checks):
    return [c for c in checks if c.status == FAIL]


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
    s = parse_survey("w", text)
    assert (s.id, s.size, s.docker, s.zstd) == ("sha256:abc", 4321, "29.1.0", True)
    assert s.containerd_store and not s.skips_layers
    assert s.chains == set(chain_ids(DIFF_IDS[:2]))
    classic = parse_survey("w", text.replace("overlayfs [[\"driver-type\",\"io.containerd."
                                              "snapshotter.v1\"]]", "overlay2 []"))
    assert classic.skips_layers and classic.driver == "overlay2"
    assert parse_survey("w", "@@ id\nabsent\n@@ zstd\nabsent").id is None


FAKE_DOCKER = """#!/bin/sh
# a stand-in docker: the image "app" with two layers; one other image holding its first layer
case "$*" in
  "image inspect --format {{.Id}} {{.Size}} -- app") echo "sha256:abc 4321" ;;
  "image inspect --format {{json .RootFS.Layers}} -- app") echo '%(app)s' ;;
  "version --format {{.Server.Version}}") echo 20.10.24 ;;
  "info --format {{.Driver}} {{json .DriverStatus}}") echo 'overlay2 [["Backing Filesystem","extfs"]]' ;;
  "info --format {{.DockerRootDir}}") echo /var/lib/docker ;;
  "image ls -q --no-trunc") printf 'sha256:base\\nsha256:abc\\nsha256:base\\n' ;;
  "image inspect --format {{json .RootFS.Layers}} sha256:abc sha256:base") printf '%%s\\n' '%(app)s' '%(base)s' ;;
  *) echo "Error: No such image" >&2; exit 1 ;;
esac
"""


def run_script(script, path_dir=None, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{path_dir}:{os.environ['PATH']}"} if path_dir else None
    return subprocess.run(["bash", "-c", script.program()], capture_output=True, text=True, env=env, cwd=cwd)


def test_survey_script_reads_a_node_and_survives_a_missing_image_or_docker(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER % {"app": json.dumps(DIFF_IDS[:2]), "base": json.dumps(DIFF_IDS[:1])})
    docker.chmod(0o755)
    r = run_script(survey_script("app"), bin_dir)
    assert r.returncode == 0, r.stderr
    s = parse_survey("w", r.stdout)
    assert (s.id, s.size, s.docker) == ("sha256:abc", 4321, "20.10.24")
    assert (s.driver, s.root) == ("overlay2", "/var/lib/docker")
    assert s.layers == DIFF_IDS[:2] and s.chains == set(chain_ids(DIFF_IDS[:2])) and s.skips_layers
    assert s.store == {"root": "/var/lib/docker", "driver": "overlay2", "image_id": "sha256:abc"}
    # an image the node lacks, and a node whose docker fails: the script still ends well
    missing = parse_survey("w", run_script(survey_script("-other"), bin_dir).stdout)
    assert missing.id is None and missing.layers == []
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    r = run_script(survey_script("app"), bin_dir)
    assert r.returncode == 0 and parse_survey("w", r.stdout).id is None
    assert "Cannot connect" in parse_survey("w", r.stdout).docker


def test_model_sync_script_quotes_names_and_never_leaves_partial_files_under_their_name():
    params = load(LAB)
    worker = params.workers[0]
    s = sync_script(params, {worker.name: ["a b.safetensors", "x'; touch pwned"]})
    assert s.name == "model_sync.sh"
    assert s.args[0] == "/models/tiny-qwen3" and s.args[2] == ".sparkbook-partial"
    assert "StrictHostKeyChecking=yes" in s.args[1] and not s.args[1].endswith(worker.peer_target)
    assert s.args[3:] == (worker.name, worker.peer_target, "2", "a b.safetensors", "x'; touch pwned")
    text = s.text
    assert "--partial-dir=\"$partial\"" in text and " -I " in text and "--delete-missing-args" in text


def test_model_sync_script_copies_listed_files_to_every_worker(tmp_path):
    """model_sync.sh run here: the "workers" are local folders reached through a stand-in remote
    shell, the model folder a relative path (as it could start with '-')."""
    head = tmp_path / "head" / "-model"
    (head / "sub").mkdir(parents=True)
    names = {"a b.safetensors": b"x" * 5000, "x'; touch pwned": b"y", "sub/config.json": b"{}"}
    for name, data in names.items():
        (head / name).write_bytes(data)
    for w in ("w1", "w2"):
        (tmp_path / w / "-model").mkdir(parents=True)
        (tmp_path / w / "-model" / "stale.json").write_text("old")
        (tmp_path / w / "-model" / "kept.txt").write_text("not listed")
    rsh = tmp_path / "rsh"  # rsync runs "RSH HOST COMMAND...": the command runs in the HOST folder
    rsh.write_text('#!/bin/sh\nhost=$1\nshift\ncd "$(dirname "$0")/$host" && exec sh -c "$*"\n')
    rsh.chmod(0o755)
    args = ["-model", str(rsh), ".sparkbook-partial", "w1", "w1", "2", "a b.safetensors", "stale.json",
            "w2", "w2", "3", *[n for n in names if n != "a b.safetensors"], "stale.json"]
    r = run_script(script("model_sync.sh", *args), cwd=tmp_path / "head")
    assert r.returncode == 0, r.stderr
    done = sorted(line for line in r.stdout.splitlines() if line.startswith("DONE"))
    assert done == ["DONE w1 0 ", "DONE w2 0 "], r.stdout
    assert "[w1] " in r.stdout and "[w2] " in r.stdout
    w1, w2 = tmp_path / "w1" / "-model", tmp_path / "w2" / "-model"
    assert sorted(p.name for p in w1.iterdir()) == ["a b.safetensors", "kept.txt"]
    assert (w2 / "x'; touch pwned").read_bytes() == b"y" and (w2 / "sub" / "config.json").exists()
    assert not (w2 / "stale.json").exists() and (w2 / "kept.txt").exists()
    assert not list(tmp_path.rglob("pwned")) and not list(tmp_path.rglob(".sparkbook-partial"))
    # a worker it cannot reach: its line says how rsync ended, the others are unaffected
    r = run_script(script("model_sync.sh", "-model", "false", ".p", "w1", "w1", "1", "a b.safetensors"),
                   cwd=tmp_path / "head")
    assert r.returncode == 0 and re.search(r"^DONE w1 [1-9]\d* rsync error", r.stdout, re.M), r.stdout


def recorded_copy() -> tuple:
    """03 on the lab's two nodes: the worker held 3 of the image's layers and got the 4th."""
    params = load(LAB)
    head, worker = params.head.name, params.workers[0].name
    image = ImageOutcome(params.runtime.image, "head", head, "sha256:" + "1" * 64,
                         before={head: "sha256:" + "1" * 64, worker: "sha256:" + "2" * 64},
                         after={head: "sha256:" + "1" * 64, worker: "sha256:" + "1" * 64},
                         transfers=[Transfer(worker, "layer-skipping stream", read_from="layer store",
                                             sent=5_000_000, wire=4_120_000_000, layers_held=3, seconds=63.4)])
    model = ModelOutcome(params.model.path, True, before={worker: {"config.json": "content differs"}},
                         after={worker: {}},
                         synced={worker: ModelCopy(1, 0.4, None, "bash sparkbook/scripts/model_sync.sh ...")})
    found = Survey(params.runtime.image, head, {
        head: NodeImage(head, image.head_id, 4321, "20.10.24", "overlay2", layers=DIFF_IDS,
                        chains=set(chain_ids(DIFF_IDS))),
        worker: NodeImage(worker, "sha256:" + "2" * 64, 1234, "20.10.24", "overlay2",
                          chains=set(chain_ids(DIFF_IDS[:2])))})
    return params, step.DistributionOutcome(found, image, model)


def test_distribution_outcome_keeps_todays_file_and_key_number(tmp_path):
    params, outcome = recorded_copy()
    outcome.save(tmp_path)
    data = json.loads((tmp_path / "distribution.json").read_text())
    assert sorted(data) == ["image", "model"]
    sent = data["image"]["transfers"][0]
    assert sent["wire"] == 4_120_000_000 and sent["rate_mb_s"] == 65.0
    assert data["model"]["synced"]["spark-2"] == {"files": 1, "seconds": 0.4, "error": None,
                                                   "command": "bash sparkbook/scripts/model_sync.sh ..."}
    assert (tmp_path / "image_transfers.csv").read_text().startswith("node,method,read from")
    assert outcome.key_numbers() == [("image distribution", "spark-2: 4.12 GB in 63 s (3 layers already there)")]
    checks = step.checks(params, outcome)
    assert not failures(checks)
    assert [(c.check, c.node) for c in checks] == [("image ID", "spark-1"), ("image ID", "spark-2"),
                                                   ("model on the head", "spark-1"), ("model files", "spark-2")]
    assert "3 layer(s) already there" in checks[1].observed and checks[3].observed == "copied 1 differing file(s)"
    assert step.table(outcome).rows == [
        ["spark-1", "1" * 12, "yes", "20.10.24", "classic (overlay2)", "3 of 3", "no"],
        ["spark-2", "2" * 12, "no", "20.10.24", "classic (overlay2)", "2 of 3", "no"]]
    assert step.image_copies(outcome).rows[0][-1] == "ok" and step.model_copies(outcome).rows[0][2] == 1
    outcome.image.transfers = []
    assert outcome.key_numbers() == [("image distribution", "already on every node")]


def test_a_failed_copy_fails_with_the_command_and_the_remedy():
    params, outcome = recorded_copy()
    outcome.image.after["spark-2"] = None
    outcome.image.errors["spark-2"] = "docker load on spark-2 exited 1: no space left on device"
    outcome.model.after["spark-2"] = {"config.json": "content differs"}
    outcome.model.synced["spark-2"].error = "rsync exited 11: No space left on device"
    bad = failures(step.checks(params, outcome))
    assert [(c.check, c.node) for c in bad] == [("image ID", "spark-2"), ("model files", "spark-2")]
    assert "no space left" in bad[0].observed and "df -h" in bad[0].remedy and "docker load" in bad[0].command
    assert bad[1].observed.startswith("rsync exited 11")
    assert bad[1].command.startswith("bash sparkbook/scripts/model_sync.sh")


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
    out = distribute_image(p1, cluster, show=False)
    assert not failures(image_checks(p1, out))
    assert len(set(ids(lab, v1))) == 1 and None not in ids(lab, v1)
    assert out.transfers[0].layers_held == 0
    assert out.transfers[0].read_from == {"auto": "layer store", "docker-save": "docker save"}[reader]

    p2 = on_image(params, v2, reader=reader)
    head = lab.nodes()[0]
    size = lambda i: int(docker(head, "image", "inspect", "--format", "{{.Size}}", i).stdout)
    new_layer = size(v2) - size(v1)
    out = distribute_image(p2, cluster, show=False)
    assert not failures(image_checks(p2, out))
    assert len(set(ids(lab, v2))) == 1
    t = out.transfers[0]
    assert t.layers_held == 2 and t.wire < 1.2 * new_layer, (t, new_layer)

    again = distribute_image(p2, cluster, show=False, say=lambda *_: None)
    assert again.transfers == [] and not failures(image_checks(p2, again))


def test_layer_store_read_in_a_container_of_the_image(lab, params, cluster, small_images):
    """For users in the docker group who cannot read Docker's folder: the serving image reads it."""
    ensure_image(params, cluster, say=lambda *_: None)
    nxt = params.runtime.image.rsplit(":", 1)[0] + ":test-next"
    build(lab, nxt, params.runtime.image, 1, "next.bin", small_images)
    try:
        p = on_image(params, nxt, reader="container")
        out = distribute_image(p, cluster, show=False, say=lambda *_: None)
        assert not failures(image_checks(p, out))
        t = out.transfers[0]
        assert t.read_from == "layer store (read in a container)" and t.layers_held == 3
        assert t.wire < 1.2 * (1 << 20) + 64 * 1024
        # an image without python3 cannot read it: docker save then
        toy = on_image(params, "sparkbook-test/app:1", reader="container")
        for n in lab.nodes()[1:]:
            docker(n, "rmi", "sparkbook-test/app:1", check=False)
        out = distribute_image(toy, cluster, show=False, say=lambda *_: None)
        assert not failures(image_checks(toy, out)) and out.transfers[0].read_from == "docker save"
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
        copy = threading.Thread(target=lambda: box.update(out=distribute_image(
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
    failed = {c.node: c for c in failures(image_checks(p, box["out"]))}
    assert set(failed) == {worker.name} and failed[worker.name].remedy
    assert ids(lab, image)[1] is None, "a half-copied image is tagged on the worker"

    out = distribute_image(p, cluster, show=False, say=lambda *_: None)
    assert not failures(image_checks(p, out)) and len(set(ids(lab, image))) == 1


def test_drifted_image_and_model_are_found_fixed_and_verified_by_the_notebook(
        lab, params, cluster, tmp_path):
    ensure_image(params, cluster, say=lambda *_: None)  # the worker holds every layer
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
    files = manifests(params, cluster)[params.head.name]
    cluster.run(["rm", "-rf", params.model.path], [worker]).check("remove the worker's model")
    out = sync_model(params, cluster, show=False, say=lambda *_: None)
    assert out.before[worker.name] == {n: "missing" for n in files}
    assert out.after[worker.name] == {} and not failures(model_checks(params, out))
    assert out.synced[worker.name].files == len(files)
