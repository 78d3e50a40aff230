"""Image and model distribution: the layer-skipping stream offline (synthetic archives in both
layouts), the node scripts run here (a stand-in docker, rsync to a local folder), one read feeding
workers through relays (workers as local folders behind a stand-in SSH), 03's outcome; then on the
lab: head-only image to every node, the update path, relayed copies (4 nodes), drift, an
interrupted copy, and the model sync."""

import base64
import gzip
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import resized
from sparkbook.distribution import image
from sparkbook.distribution.image import (ImageOutcome, NodeImage, Survey, Transfer, distribute_image,
                                          ensure_image, image_checks, parse_survey, survey_script)
from sparkbook.distribution.model import (ModelCopy, ModelOutcome, manifests, model_checks, sync_model,
                                          sync_rounds, sync_script)
from sparkbook.lab import faults
from sparkbook.lab.lab import docker
from sparkbook.lab.nodes import lab_params, params_file
from sparkbook.params import load, validate
from sparkbook.params.settings import relay_plan
from sparkbook.runbook.runner import run
from sparkbook.scripts.imagestream import Layers, carried, chain_ids, split
from sparkbook.scripts.savearchive import v1_ids
from sparkbook.scripts.layerstore import expected_bytes
from sparkbook.nodes.shell import SCRIPTS, script, sh
from sparkbook.steps import distribute as step
from sparkbook.book.verdict import FAIL

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


def legacy_archive(diff_ids, top_folder="f" * 64, fmt=tarfile.USTAR_FORMAT, scale=1):
    """An archive laid out like `docker save` before Docker 25: a folder per layer, each with
    VERSION, json (naming its parent) and layer.tar (layer i: (3000 + 1000 i) x ``scale`` bytes)."""
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
            add(f"{folder}/layer.tar", bytes([65 + i]) * (3000 + 1000 * i) * scale)
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
    text = "\n".join(["@@ image", identity_line("sha256:abc", DIFF_IDS),
                      "@@ docker", "29.1.0", "@@ driver",
                      'overlayfs [["driver-type","io.containerd.snapshotter.v1"]]',
                      "@@ layers", json.dumps(DIFF_IDS[:2]), "@@ zstd", "/usr/bin/zstd"])
    s = parse_survey("w", text)
    assert (s.id, s.size, s.docker, s.zstd) == ("sha256:abc", 4321, "29.1.0", True)
    assert s.layers == DIFF_IDS and s.config["Cmd"] == ["/bin/sh"] and s.identity.content_known
    assert s.containerd_store and not s.skips_layers
    assert s.chains == set(chain_ids(DIFF_IDS[:2]))
    classic = parse_survey("w", text.replace("overlayfs [[\"driver-type\",\"io.containerd."
                                              "snapshotter.v1\"]]", "overlay2 []"))
    assert classic.skips_layers and classic.driver == "overlay2"
    assert parse_survey("w", "@@ image\n@@ zstd\nabsent").id is None


def identity_line(image_id, layers):
    """What the node scripts print for an image (identity.INSPECT_FORMAT)."""
    return json.dumps({"Id": image_id, "Size": 4321, "RepoDigests": [], "RootFS": {"Layers": layers}, "Config": {
        "Entrypoint": None, "Cmd": ["/bin/sh"], "Env": ["PATH=/usr/bin"], "User": "", "WorkingDir": ""}})


FAKE_DOCKER = """#!/bin/sh
# a stand-in docker: the image "app" with two layers; one other image holding its first layer
case "$*" in
  'image inspect --format {"Id":'*' -- app') echo '%(identity)s' ;;
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
    docker.write_text(FAKE_DOCKER % {"app": json.dumps(DIFF_IDS[:2]), "base": json.dumps(DIFF_IDS[:1]),
                                     "identity": identity_line("sha256:abc", DIFF_IDS[:2])})
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
    assert s.args[:3] == ("/models/tiny-qwen3", ".sparkbook-partial", "120")
    first, second = worker.rails  # one file over each twin
    assert s.args[3:5] == (f"{worker.name}@{first.interface}", worker.peer_target)
    assert s.args[6:8] == ("1", "a b.safetensors")
    assert s.args[8:10] == (f"{worker.name}@{second.interface}", f"{worker.user}@{second.ip}")
    assert s.args[11:] == ("1", "x'; touch pwned")
    rsh = s.args[5]
    assert "StrictHostKeyChecking=yes" in rsh and "ServerAliveInterval=" in rsh and not rsh.endswith(worker.peer_target)
    assert s.args[10] == f"{rsh} -o HostKeyAlias={worker.fabric_address}"  # the same host key as the first
    text = s.text
    assert "--partial-dir=\"$partial\"" in text and " -I " in text and "--timeout=\"$stall\"" in text
    assert "--delete" not in text and "--ignore-missing-args" in text


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
    args = ["-model", ".sparkbook-partial", "30", "w1", "w1", str(rsh), "2", "a b.safetensors", "stale.json",
            "w2", "w2", str(rsh), "3", *[n for n in names if n != "a b.safetensors"], "stale.json"]
    r = run_script(script("model_sync.sh", *args), cwd=tmp_path / "head")
    assert r.returncode == 0, r.stderr
    done = sorted(line for line in r.stdout.splitlines() if line.startswith("DONE"))
    assert done == ["DONE w1 0 ", "DONE w2 0 "], r.stdout
    assert "[w1] " in r.stdout and "[w2] " in r.stdout
    w1, w2 = tmp_path / "w1" / "-model", tmp_path / "w2" / "-model"
    # a name the head lacks is skipped, never deleted on the worker
    assert sorted(p.name for p in w1.iterdir()) == ["a b.safetensors", "kept.txt", "stale.json"]
    assert (w2 / "x'; touch pwned").read_bytes() == b"y" and (w2 / "sub" / "config.json").exists()
    assert (w2 / "stale.json").read_text() == "old" and (w2 / "kept.txt").exists()
    assert not list(tmp_path.rglob("pwned")) and not list(tmp_path.rglob(".sparkbook-partial"))
    # a worker it cannot reach: its line says how rsync ended, the others are unaffected
    r = run_script(script("model_sync.sh", "-model", ".p", "30", "w1", "w1", "false", "1", "a b.safetensors"),
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
        head: NodeImage(head, image.head_image.id, 4321, "20.10.24", "overlay2", layers=DIFF_IDS,
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
                                                   "command": "bash sparkbook/scripts/model_sync.sh ...",
                                                   "rails": {}, "fell_back": None}
    assert (tmp_path / "image_transfers.csv").read_text().startswith("node,method,read from")
    assert outcome.key_numbers() == [("image distribution", "spark-2: 4.12 GB in 63 s (3 layers already there)")]
    checks = step.checks(params, outcome)
    assert not failures(checks)
    assert [(c.check, c.node) for c in checks] == [("image ID", "spark-1"), ("image ID", "spark-2"),
                                                   ("model from the hub", "spark-1"),  # skipped: source head
                                                   ("model on the head", "spark-1"), ("model files", "spark-2")]
    assert "3 layer(s) already there" in checks[1].observed and checks[4].observed == "copied 1 differing file(s)"
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


def test_a_worker_on_the_containerd_store_gets_the_whole_image_and_a_warning_that_says_why():
    params, outcome = recorded_copy()
    end = {"name": "spark-2", "code": 0, "sent": 9_000_000_000, "wire": 9_000_000_000, "skipped": 0,
           "layers_skipped": 0, "error": None, "output": [], "source": "docker save", "held": 0}
    containerd = NodeImage("spark-2", containerd_store=True)
    outcome.image.transfers = [image._transfer(containerd, False, 120.0, end, "", None)]
    warned = [c for c in step.checks(params, outcome) if c.status in ("FAIL", "WARN")]
    assert [(c.check, c.node, c.status) for c in warned] == [("layer skipping", "spark-2", "WARN")]
    assert "uses the containerd image store" in warned[0].observed


def test_no_model_on_the_head_fails_and_says_how_to_put_it_there():
    params, outcome = recorded_copy()
    outcome.model.head_error = f"no config.json in {params.model.path}"
    bad = failures(step.checks(params, outcome))
    assert [(c.check, c.node) for c in bad] == [("model on the head", "spark-1")]
    assert "huggingface-cli download" in bad[0].remedy


# ------------------------------------------------------------------- one read, relayed beyond parallel

@pytest.mark.parametrize("n, parallel, expected", [
    (1, 1, {"h": ["w1"]}),
    (1, 2, {"h": ["w1"]}),
    (1, 4, {"h": ["w1"]}),
    (3, 1, {"h": ["w1"], "w1": ["w2"], "w2": ["w3"]}),
    (3, 2, {"h": ["w1", "w2"], "w1": ["w3"]}),
    (3, 4, {"h": ["w1", "w2", "w3"]}),
    (7, 1, {"h": ["w1"], **{f"w{i}": [f"w{i + 1}"] for i in range(1, 7)}}),
    (7, 2, {"h": ["w1", "w2"], "w1": ["w3", "w5"], "w2": ["w4", "w6"], "w3": ["w7"]}),
    (7, 4, {"h": ["w1", "w2", "w3", "w4"], "w1": ["w5"], "w2": ["w6"], "w3": ["w7"]}),
])
def test_relay_plan_feeds_every_worker_once_and_no_one_more_than_parallel(n, parallel, expected):
    workers = [f"w{i}" for i in range(1, n + 1)]
    plan = relay_plan("h", workers, parallel)
    assert plan == expected
    assert sorted(w for fed in plan.values() for w in fed) == workers


def test_a_relays_stream_carries_what_any_worker_behind_it_lacks():
    """What reaches each worker through a relay is what the head would have sent it directly."""
    chains = chain_ids(DIFF_IDS)
    relay = {"name": "r", "have": chains[:2], "feeds": [{"name": "a", "have": chains[:1]},
                                                        {"name": "b", "have": chains}]}
    assert carried(relay) == {chains[0]}
    assert carried({"name": "x", "have": chains, "feeds": [relay]}) == {chains[0]}
    assert carried({"name": "y", "have": chains[:2], "feeds": [{"name": "z"}]}) == set()
    archive = legacy_archive(DIFF_IDS)
    into_relay = FakeSink("r", carried(relay))
    split(io.BytesIO(archive), Layers(DIFF_IDS), [into_relay])
    assert into_relay.layers_skipped == 1
    at_relay = [FakeSink(w["name"], w["have"]) for w in (relay, *relay["feeds"])]
    split(io.BytesIO(into_relay.out.getvalue()), Layers(DIFF_IDS), at_relay)
    for sink in at_relay:
        direct = FakeSink("direct", sink.have)
        split(io.BytesIO(archive), Layers(DIFF_IDS), [direct])
        assert sink.out.getvalue() == direct.out.getvalue(), sink.name
    assert [s.layers_skipped for s in at_relay] == [1, 0, 2]  # b's three less the one never carried


def test_the_layer_store_rebuilds_a_layer_byte_for_byte(tmp_path):
    """layerstore.py on a synthetic overlay2 store: the layer's tar from its tar-split record and
    its folder's files, then the config and a manifest naming the tag."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        info = tarfile.TarInfo("etc/a b.txt")
        info.size = 1000
        t.addfile(info, io.BytesIO(b"x" * 1000))
    layer = buf.getvalue()
    diff = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    ident = hashlib.sha256(config).hexdigest()
    base = tmp_path / "image" / "overlay2"
    (base / "imagedb" / "content" / "sha256").mkdir(parents=True)
    (base / "imagedb" / "content" / "sha256" / ident).write_bytes(config)
    layerdb = base / "layerdb" / "sha256" / diff.split(":")[1]
    layerdb.mkdir(parents=True)
    (layerdb / "cache-id").write_text("cache1")
    (layerdb / "size").write_text("1000")
    seg = lambda data: json.dumps({"type": 2, "payload": base64.b64encode(data).decode()})
    with gzip.open(layerdb / "tar-split.json.gz", "wt") as f:
        f.write("\n".join([seg(layer[:512]), json.dumps({"type": 1, "name": "etc/a b.txt", "size": 1000}),
                           seg(layer[1512:])]) + "\n")
    (tmp_path / "overlay2" / "cache1" / "diff" / "etc").mkdir(parents=True)
    (tmp_path / "overlay2" / "cache1" / "diff" / "etc" / "a b.txt").write_bytes(b"x" * 1000)
    job = {"root": str(tmp_path), "driver": "overlay2", "image_id": "sha256:" + ident, "tag": "app:1",
           "need": [diff]}
    out = subprocess.run([sys.executable, str(SCRIPTS / "layerstore.py"), json.dumps(job)], capture_output=True)
    assert out.returncode == 0, out.stderr
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as t:
        got = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    assert got["blobs/sha256/" + diff.split(":")[1]] == layer and got[ident + ".json"] == config
    assert json.loads(got["manifest.json"])[0]["RepoTags"] == ["app:1"]
    assert expected_bytes({"store": job}, [diff], 9999, set()) == 1000
    assert expected_bytes({"store": job}, [diff], 9999, {diff}) == 0


NODE_DOCKER = """#!/bin/sh
# a stand-in docker on a "node" (a folder of this machine): the image's layers, `docker save` from a
# file (its first $FAKE_CUT bytes, then failing, when set), `docker load` into loaded.tar of the
# folder (failing where the folder holds a file "full")
case "$1" in
  image) echo "$FAKE_LAYERS $FAKE_SIZE" ;;
  save) if [ -n "${FAKE_CUT:-}" ]; then head -c "$FAKE_CUT" "$FAKE_ARCHIVE"; echo "Error: cut" >&2; exit 1; fi
        cat "$FAKE_ARCHIVE" ;;
  load) if [ -e full ]; then cat >/dev/null; echo "Error: no space left on device" >&2; exit 1; fi
        cat > loaded.tar && echo "Loaded image: app:1" ;;
  *) exit 1 ;;
esac
"""


STAND_IN_SSH = """
import os, subprocess, sys, threading
# like ssh: runs the command (in the worker's folder) and passes stdin and output through itself,
# so that killing it cuts both, as killing an ssh client does; it ends when the command does, its
# input still open or not (as ssh does when the channel closes)
p = subprocess.Popen(["bash", "-c", sys.argv[2]], cwd=sys.argv[1], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
def into():
    try:
        while data := os.read(0, 1 << 20):
            p.stdin.write(data)
    except BrokenPipeError:
        pass
    p.stdin.close()
threading.Thread(target=into, daemon=True).start()
while data := os.read(p.stdout.fileno(), 65536):
    os.write(1, data)
os._exit(p.wait())
"""


class LocalHead:
    """A cluster whose head is this machine: ``run_on`` runs the stream script from the package,
    with the workers' SSH standing in as commands run in each worker's folder."""

    def __init__(self, root: Path):
        self.root, self.lines = root, []

    def run_on(self, node, cmd, timeout=None, stream=None):
        cmd = [sys.executable if c == "python3" else c for c in cmd]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.root)
        for line in p.stdout:
            self.lines.append(line.rstrip())
            stream.write(f"[{node.name}] {line}")
        code = p.wait()
        return SimpleNamespace(ok=code == 0, stdout="\n".join(self.lines), summary=lambda: f"exited {code}")


@pytest.fixture
def local_nodes(tmp_path, monkeypatch):
    """Workers as folders of this machine, reached by a stand-in SSH (``down``: names it refuses;
    ``stuck``: names whose SSH never reads its input, for 30 s)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(NODE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    archive = legacy_archive(DIFF_IDS, scale=2000)  # 24 MB
    (tmp_path / "image.tar").write_bytes(archive)
    for k, v in {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LAYERS": json.dumps(DIFF_IDS),
                 "FAKE_SIZE": str(len(archive)), "FAKE_ARCHIVE": str(tmp_path / "image.tar")}.items():
        monkeypatch.setenv(k, v)
    down, stuck = set(), set()

    def ssh(node):
        (tmp_path / node.name).mkdir(exist_ok=True)
        if node.name in stuck:
            return [sys.executable, "-c", "import time; time.sleep(30)", node.name]
        if node.name in down:
            return ["bash", "-c", 'echo "ssh: connect to host $0 port 22: Connection refused" >&2; exit 255',
                    node.name]
        return [sys.executable, "-c", STAND_IN_SSH, str(tmp_path / node.name)]

    monkeypatch.setattr(image, "peer_ssh", ssh)
    # the head and the relays run the package's own copy of the stream script
    monkeypatch.setattr(image, "stream_path", lambda params, node: str(SCRIPTS / "imagestream.py"))
    return SimpleNamespace(root=tmp_path, archive=archive, down=down, stuck=stuck, head=LocalHead(tmp_path))


def copy_locally(nodes_up: int, parallel: int, held: dict[str, int], local, compress=False, transport="ssh"):
    """stream_from_head on a lab of ``nodes_up`` nodes whose workers are local folders; ``held``:
    how many of the image's lower layers a worker holds."""
    params = validate(lab_params(nodes_up))
    params = params.model_copy(update={"distribution": params.distribution.model_copy(
        update={"parallel": parallel, "transport": transport})})
    chains = chain_ids(DIFF_IDS)
    nodes = {params.head.name: NodeImage(params.head.name, "sha256:" + "1" * 64, 4321, "20.10.24", "overlay2",
                                         layers=DIFF_IDS, chains=set(chains))}
    for w in params.workers:
        nodes[w.name] = NodeImage(w.name, None, None, "20.10.24", "overlay2", chains=set(chains[:held.get(w.name, 0)]))
    transfers, read = image.stream_from_head(params, local.head, params.workers, nodes, compress, show=False)
    return params, {t.node: t for t in transfers}, read


def loaded(local, name):
    return (local.root / name / "loaded.tar").read_bytes()


def direct(local, held):
    sink = FakeSink("direct", chain_ids(DIFF_IDS)[:held])
    split(io.BytesIO(local.archive), Layers(DIFF_IDS), [sink])
    return sink.out.getvalue()


def test_one_read_feeds_seven_workers_through_relays(local_nodes):
    held = {"spark-3": 2, "spark-4": 1, "spark-6": 3}
    params, got, read = copy_locally(8, 2, held, local_nodes)
    assert {n: t.via for n, t in got.items()} == {
        "spark-2": "", "spark-3": "", "spark-4": "spark-2", "spark-5": "spark-3", "spark-6": "spark-2",
        "spark-7": "spark-3", "spark-8": "spark-4"}
    for w in params.workers:
        t, h = got[w.name], held.get(w.name, 0)
        assert t.error is None, t
        assert loaded(local_nodes, w.name) == direct(local_nodes, h), w.name
        assert t.sent == len(direct(local_nodes, h)) and t.layers_held == h and t.read_from == "docker save"
        assert 0 < t.seconds
    # spark-3 (2 layers held) relays to spark-5 and spark-7, which hold none: it gets every layer
    assert got["spark-3"].wire == len(local_nodes.archive) > got["spark-3"].sent
    # the head's process read the archive once (and its own start-up), not once per worker
    assert len(local_nodes.archive) <= read < len(local_nodes.archive) + (8 << 20)
    progress = {line.split()[1] for line in local_nodes.head.lines if line.startswith("PROGRESS")}
    assert progress == {w.name for w in params.workers}


def test_a_relay_that_fails_names_itself_and_the_workers_behind_it(local_nodes):
    """head -> spark-2 -> spark-3 -> spark-4 (parallel 1): spark-2's Docker is full, and spark-3
    cannot be reached from spark-2; spark-2's own failure does not stop the stream through it."""
    (local_nodes.root / "spark-2").mkdir()
    (local_nodes.root / "spark-2" / "full").touch()
    local_nodes.down.add("spark-3")
    params, got, _read = copy_locally(4, 1, {}, local_nodes)
    assert got["spark-2"].error == "docker load on spark-2 exited 1: Error: no space left on device"
    assert got["spark-3"].error == ("SSH from spark-2 to spark-3 failed: "
                                    "ssh: connect to host spark-3 port 22: Connection refused")
    assert got["spark-4"].error == ("not reached: the relay on spark-3 failed (SSH from spark-2 to spark-3 "
                                    "failed: ssh: connect to host spark-3 port 22: Connection refused)")
    assert (got["spark-3"].via, got["spark-4"].via) == ("spark-2", "spark-3")
    out = ImageOutcome(params.runtime.image, "head", params.head.name, "sha256:" + "1" * 64,
                       before={}, after={params.head.name: "sha256:" + "1" * 64},
                       transfers=list(got.values()), errors={n: t.error for n, t in got.items()})
    bad = {c.node: c for c in failures(image_checks(params, out))}
    assert sorted(bad) == ["spark-2", "spark-3", "spark-4"]
    assert "SSH from spark-2 to spark-3" in bad["spark-3"].remedy
    assert bad["spark-4"].command.endswith(
        f"| ssh {params.node('spark-3').peer_target} python3 {image.stream_path(params, params.node('spark-3'))} relay SPEC "
        f"| ssh {params.node('spark-4').peer_target} docker load")

    # with spark-3 reachable again, the chain delivers to the workers behind spark-2
    (local_nodes.root / "spark-2" / "full").unlink()
    local_nodes.down.clear()
    _params, got, _read = copy_locally(4, 1, {"spark-4": 3}, local_nodes)
    assert [t.error for t in got.values()] == [None, None, None]
    assert loaded(local_nodes, "spark-4") == direct(local_nodes, 3)


def test_a_failed_read_on_the_head_stops_every_worker_with_its_reason(local_nodes, monkeypatch):
    monkeypatch.setenv("FAKE_CUT", str(len(local_nodes.archive) // 2))
    _params, got, _read = copy_locally(4, 1, {}, local_nodes)
    for t in got.values():  # the relays were stopped with the head's reason: not their failure
        assert t.error == "the archive ends early (docker save: Error: cut)", t


def test_compressed_relays_report_the_bytes_on_their_wire(local_nodes):
    _params, got, _read = copy_locally(4, 1, {}, local_nodes, compress=True)
    for name, t in got.items():
        assert t.error is None and loaded(local_nodes, name) == local_nodes.archive
        assert t.compressed and 0 < t.wire < t.sent / 10, t  # a relay's wire is what reached it


def test_compression_is_chosen_for_the_streams_the_head_feeds_at_once():
    """zstd -1 at 1500 MB/s outruns a 700 MB/s pipe for one stream, not for three at once."""
    params = validate(lab_params(4))
    probe = {"pipe_mb_s": {"spark-2": 700.0, "spark-3": 720.0, "spark-4": 710.0}, "zstd_mb_s": 1500.0}
    cluster = SimpleNamespace(run_on=lambda *a, **k: SimpleNamespace(ok=True, stdout="PROBE " + json.dumps(probe)))
    nodes = {n.name: NodeImage(n.name, zstd=True) for n in params.nodes}
    for parallel, on in ((1, True), (4, False)):
        p = params.model_copy(update={"distribution": params.distribution.model_copy(update={"parallel": parallel})})
        chosen, found = image.choose_compression(p, cluster, nodes[p.head.name], p.workers, nodes)
        assert chosen is on, found["decision"]
    assert found["decision"] == "off: zstd -1 500 MB/s for each of 3 stream(s) <= SSH pipe 700 MB/s"


# ------------------------------------------------------------------------------------- on the lab

@pytest.fixture(scope="module")
def lab(lab):
    """The session's lab with 4 nodes for this module: three workers to copy to, relayed or not."""
    with resized(lab, 4):
        yield lab


@pytest.fixture(scope="module")
def params(lab):
    """The running lab's parameters: its 4 nodes."""
    return lab.params()


def on_image(params, image, compress="off", reader="auto", parallel=None, transport="ssh"):
    return params.model_copy(update={
        "runtime": params.runtime.model_copy(update={"image": image}),
        "distribution": params.distribution.model_copy(update={
            "compress": compress, "reader": reader, "parallel": parallel or params.distribution.parallel,
            "transport": transport})})


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


def forget_small_images(lab):
    for n in lab.nodes()[1:]:
        for i in ("sparkbook-test/app:2", "sparkbook-test/app:1", "sparkbook-test/base:1"):
            docker(n, "rmi", i, check=False)


def size(lab, image):
    return int(docker(lab.nodes()[0], "image", "inspect", "--format", "{{.Size}}", image).stdout)


@pytest.mark.parametrize("reader, transport", [("auto", "ssh"), ("docker-save", "ssh"), ("auto", "tcp")])
def test_head_only_image_reaches_every_node_then_an_update_sends_only_its_new_layer(
        lab, params, cluster, small_images, reader, transport):
    """tcp: distribution.transport tcp, the stream over plain TCP on the fabric (fabriccopy.py pipe)."""
    v1, v2 = "sparkbook-test/app:1", "sparkbook-test/app:2"
    forget_small_images(lab)
    p1 = on_image(params, v1, reader=reader, transport=transport)
    out = distribute_image(p1, cluster, show=False)
    assert not failures(image_checks(p1, out))
    assert len(set(ids(lab, v1))) == 1 and None not in ids(lab, v1)
    assert [t.layers_held for t in out.transfers] == [0] * len(params.workers)
    assert {t.read_from for t in out.transfers} == {{"auto": "layer store", "docker-save": "docker save"}[reader]}
    archive = out.transfers[0].sent  # one read on the head, for every worker
    assert archive <= out.read < archive + (8 << 20), (out.read, archive)

    p2 = on_image(params, v2, reader=reader, transport=transport)
    new_layer = size(lab, v2) - size(lab, v1)
    out = distribute_image(p2, cluster, show=False)
    assert not failures(image_checks(p2, out))
    assert len(set(ids(lab, v2))) == 1
    for t in out.transfers:
        assert t.layers_held == 2 and t.wire < 1.2 * new_layer, (t, new_layer)

    again = distribute_image(p2, cluster, show=False, say=lambda *_: None)
    assert again.transfers == [] and not failures(image_checks(p2, again))


def needs_relays(params):
    if len(params.workers) < 3:
        pytest.skip("relayed copies need a lab of 4 nodes or more (sparkbook lab up --nodes 4)")


def test_a_relayed_copy_reaches_every_worker_and_carries_only_what_they_lack(
        lab, params, cluster, small_images):
    """distribution.parallel 1: the head feeds spark-2, which relays to spark-3, which relays to
    spark-4 (and so on); one read on the head, each worker's progress and result reported."""
    needs_relays(params)
    v1, v2 = "sparkbook-test/app:1", "sparkbook-test/app:2"
    forget_small_images(lab)
    p1 = on_image(params, v1, parallel=1)
    out = distribute_image(p1, cluster, show=False, say=lambda *_: None)
    assert not failures(image_checks(p1, out))
    assert len(set(ids(lab, v1))) == 1 and None not in ids(lab, v1)
    names = [w.name for w in params.workers]
    assert [t.via for t in out.transfers] == [""] + names[:-1]
    archive = out.transfers[0].sent
    assert all(t.layers_held == 0 and t.sent == archive and t.seconds > 0 for t in out.transfers)
    assert archive <= out.read < archive + (8 << 20), (out.read, archive)

    p2 = on_image(params, v2, parallel=1)
    new_layer = size(lab, v2) - size(lab, v1)
    out = distribute_image(p2, cluster, show=False, say=lambda *_: None)
    assert not failures(image_checks(p2, out)) and len(set(ids(lab, v2))) == 1
    for t in out.transfers:  # every relay's stream carried only the new layer
        assert t.layers_held == 2 and t.wire < 1.2 * new_layer, (t, new_layer)


def test_a_relay_that_cannot_reach_its_worker_names_itself_and_the_workers_behind_it(
        lab, params, cluster, small_images):
    """spark-2 relays to spark-3 but does not know its host key: spark-2 gets the image; spark-3
    and the workers behind it fail, naming the relay; once healed, a rerun completes."""
    needs_relays(params)
    relay, lost, *behind = params.workers
    v1 = "sparkbook-test/app:1"
    forget_small_images(lab)
    known = next(n for n in lab.nodes() if n.name == relay.name).dir / "ssh" / "known_hosts"
    saved = known.read_text()
    known.write_text("".join(line for line in saved.splitlines(keepends=True)
                             if lost.name not in line.split()[0].split(",")))
    p = on_image(params, v1, parallel=1)
    try:
        out = distribute_image(p, cluster, show=False, say=lambda *_: None)
    finally:
        known.write_text(saved)
    bad = {c.node: c for c in failures(image_checks(p, out))}
    assert sorted(bad) == sorted(w.name for w in (lost, *behind))
    assert bad[lost.name].observed.startswith(f"SSH from {relay.name} to {lost.name} failed")
    assert f"SSH from {relay.name} to {lost.name}" in bad[lost.name].remedy
    for w in behind:
        assert bad[w.name].observed.startswith("not reached: the relay on "), bad[w.name].observed
    assert f"the relay on {lost.name} failed (SSH from {relay.name}" in bad[behind[0].name].observed
    assert ids(lab, v1)[1] is not None and ids(lab, v1)[2:] == [None] * (len(params.workers) - 1)

    out = distribute_image(p, cluster, show=False, say=lambda *_: None)
    assert not failures(image_checks(p, out)) and len(set(ids(lab, v1))) == 1


def test_layer_store_read_in_a_container_of_the_image(lab, params, cluster, small_images):
    """For users in the docker group who cannot read Docker's folder: the serving image reads it."""
    ensure_image(params, cluster, say=lambda *_: None)
    nxt = params.runtime.image.rsplit(":", 1)[0] + ":test-next"
    build(lab, nxt, params.runtime.image, 1, "next.bin", small_images)
    try:
        p = on_image(params, nxt, reader="container")
        out = distribute_image(p, cluster, show=False, say=lambda *_: None)
        assert not failures(image_checks(p, out))
        for t in out.transfers:
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
    head, worker = lab.nodes()[:2]
    image = "sparkbook-test/big:1"
    build(lab, image, "sparkbook-test/base:1", 48, "big.bin", small_images)
    p = on_image(params, image)
    ensure_image(p, cluster, say=lambda *_: None)  # every other worker holds it: only one copy to cut
    docker(worker, "rmi", image)
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
        summary = run(params_file(len(lab.nodes())), steps="03", out=tmp_path, report=False)
        assert summary["status"] == "passed", summary
        data = json.loads((tmp_path / "distribution.json").read_text())
        worker = params.workers[0].name
        assert data["image"]["before"][worker]["id"] not in (None, head_id)
        assert data["image"]["after"][worker]["id"] == head_id
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
    # both twins carried files, over real SSH to each rail's address (the host key checked as the first's)
    assert set(out.synced[worker.name].rails) == {r.interface for r in worker.rails}, out.synced


def test_a_same_size_corrupt_shard_fails_01_is_copied_again_by_03_and_the_next_01_reads_nothing(
        lab, params, cluster):
    """One byte flipped in the worker's weights, size and modification time kept (`shard-corrupt`):
    01 compares by SHA-256 and fails that file on that worker, reading only it (every other digest
    from the nodes' caches); 03 copies it again; 01 passes, and reads no byte once the copy has settled."""
    from sparkbook import preflight
    worker = params.workers[0].name
    sync_model(params, cluster, show=False, say=lambda *_: None)  # the workers alike
    # the caches filled: a file copied by the test before (or by this sync) less than 2 s before a
    # manifest is read again by the next one (the racy rule), so let them settle and hash once
    time.sleep(2.1)
    preflight.gather(params, cluster)
    rec = faults.apply(lab, "shard-corrupt", worker)
    shard = Path(rec["file"]).name
    try:
        pf = preflight.gather(params, cluster)
        rows = {(c.check, c.node): c for c in preflight.checks(params, pf)}
        bad = rows[("model", worker)]
        assert bad.status == FAIL and f"{shard} (content differs)" in bad.observed, bad
        assert "03_distribute_image" in bad.remedy and "model_manifest.py" in bad.command
        assert pf.nodes[worker]["model_read"] == (Path(rec["file"]).stat().st_size, 1)  # its change time moved
        assert pf.nodes[params.head.name]["model_read"] == (0, 0)
        out = sync_model(params, cluster, show=False, say=lambda *_: None)
        assert out.before[worker] == {shard: "content differs"} and out.after[worker] == {}
        assert out.synced[worker].files == 1 and out.synced[worker].error is None
        # a file written within 2 s of a manifest is read again by the next (the racy rule): at
        # most the copied shard, once
        time.sleep(2.1)
        pf = preflight.gather(params, cluster)
        assert {c.status for c in preflight.checks(params, pf) if c.check == "model"} == {"PASS"}
        assert pf.nodes[worker]["model_read"] in ((0, 0), (Path(rec["file"]).stat().st_size, 1))
        pf = preflight.gather(params, cluster)
        assert {n: pf.nodes[n]["model_read"] for n in pf.nodes} == {n.name: (0, 0) for n in params.nodes}
        assert "by SHA-256; hashing read 0 B" in next(c.observed for c in preflight.checks(params, pf)
                                                       if (c.check, c.node) == ("model", worker))
    finally:
        faults.heal(lab, "shard-corrupt")


def test_model_copies_go_round_by_round_from_the_head_then_from_the_workers_that_hold_it():
    params = validate(lab_params(8))
    workers = [w.name for w in params.workers]
    assert sync_rounds(params, workers) == [
        {"spark-1": ["spark-2", "spark-3", "spark-4", "spark-5"]},
        {"spark-2": ["spark-6"], "spark-3": ["spark-7"], "spark-4": ["spark-8"]}]
    chain = params.model_copy(update={"distribution": params.distribution.model_copy(update={"parallel": 1})})
    assert sync_rounds(chain, workers[:3]) == [{"spark-1": ["spark-2"]}, {"spark-2": ["spark-3"]},
                                               {"spark-3": ["spark-4"]}]
    assert sync_rounds(params, []) == []


def test_the_model_reaches_every_worker_along_a_chain(lab, params, cluster):
    """distribution.parallel 1: the head copies to spark-2, spark-2 to spark-3, spark-3 to spark-4;
    every worker ends with the head's files, each copy named with its source."""
    chain = params.model_copy(update={"distribution": params.distribution.model_copy(update={"parallel": 1})})
    config = f"{params.model.path}/config.json"
    cluster.run(sh("echo ' ' >> {f}", f=config), params.workers).check("change every worker's config")
    out = sync_model(chain, cluster, show=False, say=lambda *_: None)
    assert not failures(model_checks(chain, out)), out.after
    names = [w.name for w in params.workers]
    assert [out.synced[w].command.split(":")[0] for w in names] == ["on spark-1"] + [f"on {n}" for n in names[:-1]]
    assert all(out.after[w] == {} for w in names)


def test_a_layer_of_8_gib_or_more_gets_a_header_tar_reads_back_in_one_block():
    """USTAR's size field holds under 8 GiB: a layer as big as a CUDA image's venv overflowed it
    ("overflow in number field"), and the worker got a truncated archive."""
    sys.path.insert(0, str(Path(image.__file__).parents[1] / "scripts"))
    try:
        import layerstore
    finally:
        sys.path.pop(0)
    for size in (1234, 8 ** 11 - 1, 9 * 2 ** 30):
        block = layerstore.header("abc/layer.tar", size)
        assert len(block) == 512
        assert tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape").size == size
