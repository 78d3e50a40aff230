"""03 on a shared cluster (issue 15): the model sync deletes nothing sparkbook did not put there
(a worker's extra files are kept and reported, deleted only with distribution.delete_extras, and
named), an interrupted model copy resumes, and one stuck worker holds back neither the image copy
nor the model sync of the others.

Here: the model sync between folders of this machine (each node a folder, node-to-node SSH a
stand-in that can cut or stall the link), the image stream with a worker that stops reading.
On the lab: extra files on a worker, kept then deleted.
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from sparkbook.distribution import image, model
from sparkbook.distribution.model import listing, model_checks, model_table, sync_model
from sparkbook.lab.nodes import lab_params
from sparkbook.facts.manifest import PARTIAL_DIR, manifest_script, parse_manifest
from sparkbook.params import validate
from sparkbook.nodes.remote import Result, Results
from sparkbook.nodes.shell import command_line, script
from sparkbook.book.verdict import FAIL, PASS, WARN
import test_distribute
from test_distribute import DIFF_IDS, copy_locally, loaded

local_nodes = test_distribute.local_nodes  # the fixture: workers as folders, some stuck

quiet = lambda *_: None  # noqa: E731

# A stand-in for SSH between the nodes, as rsync runs it (RSH [-o OPTION]... [-l USER] HOST COMMAND...): the
# command runs in the target's folder (named by its fabric address; its other rails' addresses link
# there) and its input passes through here, counted in TARGET.sent (per address: per rail); RSH_DOWN=ADDRESS
# refuses that address (a rail that is down), RSH_CUT=N drops the link after N bytes (as a pulled cable would: both directions
# end), RSH_STALL=ADDRESS stalls the link to that target after 64 KiB, both ways (as a worker that
# hangs or vanishes: nothing comes back, nothing is taken), for 20 s.
STAND_IN_RSH = """#!/usr/bin/env python3
import os, subprocess, sys, threading, time
root = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
while args[0] in ("-l", "-o"):  # rsync passes USER@HOST's user so; -o: the copy's SSH options
    args = args[2:]
host, command = args[0].rsplit("@", 1)[-1], " ".join(args[1:])
if os.environ.get("RSH_DOWN") == host:  # a rail that is down: ssh's connect timeout
    sys.stderr.write(f"ssh: connect to host {host} port 22: Connection timed out\\n")
    os._exit(255)
cut = int(os.environ.get("RSH_CUT") or 0)
stall = os.environ.get("RSH_STALL") == host
p = subprocess.Popen(["sh", "-c", command], cwd=os.path.join(root, host),
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
sent, stalled = 0, threading.Event()
def into():
    global sent
    try:
        while data := os.read(0, 65536):
            if cut and sent + len(data) >= cut:
                p.stdin.write(data[:cut - sent])
                sent = cut
                break
            if stall and sent > 65536:
                stalled.set()
                time.sleep(20)
                break
            p.stdin.write(data)
            sent += len(data)
    except BrokenPipeError:
        pass
    p.stdin.close()
threading.Thread(target=into, daemon=True).start()
while data := os.read(p.stdout.fileno(), 65536):  # until the command ends
    if stalled.wait(0):
        time.sleep(20)
        break
    os.write(1, data)
code = p.wait()
with open(os.path.join(root, host + ".sent"), "a") as f:
    f.write(f"{sent}\\n")
os._exit(255 if cut or stall else code)
"""


class Folders:
    """A cluster whose nodes are folders of this machine (named by their fabric address): a script
    runs with bash in its node's folder, where the model is the relative folder ``model``."""

    def __init__(self, root: Path, params):
        self.root, self.params = root, params

    def folder(self, node) -> Path:
        return self.root / self.params.node(node if isinstance(node, str) else node.name).fabric_address

    def run(self, cmd, nodes=None, timeout=None, stream=None):
        out = Results()
        for n in [self.params.node(n) if isinstance(n, str) else n for n in (self.params.nodes if nodes is None else nodes)]:
            c = cmd(n) if callable(cmd) else cmd
            r = subprocess.run(["bash", "-c", c.program() if hasattr(c, "program") else command_line(c)],
                               cwd=self.folder(n), capture_output=True,
                               text=True, timeout=timeout)
            if stream:
                stream.write(r.stdout)
            out[n.name] = Result(n.name, str(c), r.returncode, r.stdout, r.stderr)
        return out

    def sent(self, node, rail: int = 0) -> list[int]:
        """The bytes each copy to ``node`` carried to it over one of its rails (its stand-in SSH counts them)."""
        path = self.root / f"{self.params.node(node).rails[rail].ip}.sent"
        return [int(n) for n in path.read_text().split()] if path.exists() else []


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """Three nodes as folders, the head feeding both workers at once; ``at(node)``: a node's model
    folder. The head holds config.json and a 6 MB weights file."""
    params = validate(lab_params(3))
    params = params.model_copy(update={
        "model": params.model.model_copy(update={"path": "model"}),  # relative: each node's folder
        "distribution": params.distribution.model_copy(update={"parallel": 2})})
    rsh = tmp_path / "rsh"
    rsh.write_text(STAND_IN_RSH)
    rsh.chmod(0o755)
    monkeypatch.setattr(model, "peer_ssh", lambda node: [str(rsh), node.peer_target])
    cluster = Folders(tmp_path, params)
    for n in params.nodes:
        (cluster.folder(n) / "model").mkdir(parents=True)
        for rail in n.rails[1:]:
            (tmp_path / str(rail.ip)).symlink_to(cluster.folder(n).name)
    head = cluster.folder(params.head) / "model"
    (head / "config.json").write_text('{"model_type": "qwen3"}\n')
    (head / "model.safetensors").write_bytes(os.urandom(6_000_000))
    cluster.at = lambda node: cluster.folder(node) / "model"
    return params, cluster


def with_distribution(params, **changes):
    return params.model_copy(update={"distribution": params.distribution.model_copy(update=changes)})


def same(a: Path, b: Path, name: str) -> bool:
    return (a / name).read_bytes() == (b / name).read_bytes()


# ------------------------------------------------------------------- 1. nothing deleted by default

def extras_on(cluster, worker):
    """Another model in the same folder, and a file of the user's; beside the model folder, a file
    that is no business of the sync at all."""
    w = cluster.at(worker)
    (w / "other-model").mkdir()
    (w / "other-model" / "weights.safetensors").write_bytes(b"o" * 300_000)
    (w / "notes.txt").write_text("mine\n")
    (cluster.folder(worker) / "beside.bin").write_bytes(b"b" * 10)


def test_a_workers_extra_files_are_kept_and_named_in_a_warning(folders):
    params, cluster = folders
    worker = params.workers[0].name
    extras_on(cluster, worker)
    (cluster.at(worker) / "config.json").write_text("{}")  # differs: copied over
    out = sync_model(params, cluster, say=quiet, show=False)
    w = cluster.at(worker)
    assert (w / "other-model" / "weights.safetensors").read_bytes() == b"o" * 300_000
    assert (w / "notes.txt").read_text() == "mine\n" and (cluster.folder(worker) / "beside.bin").exists()
    assert same(cluster.at(params.head), w, "config.json") and same(cluster.at(params.head), w, "model.safetensors")
    assert out.extras[worker] == {"notes.txt": 5, "other-model/weights.safetensors": 300_000}
    assert out.deleted == {}
    rows = {(c.check, c.node): c for c in model_checks(params, out)}
    assert rows[("model files", worker)].status == PASS  # the head's files are all there
    warn = rows[("extra model files", worker)]
    assert warn.status == WARN
    assert warn.observed == "kept 2 file(s), 293 KiB: notes.txt, other-model/weights.safetensors"
    assert "distribution.delete_extras: true" in warn.remedy and "model_prune.sh" in warn.command
    assert ("extra model files", params.workers[1].name) not in rows  # nothing extra there
    assert model_table(out).rows[0][-1] == "kept 2 (293 KiB)"


def test_a_long_list_of_extras_is_cut_with_the_total_but_deleted_files_are_all_named():
    files = {f"shard-{i:02d}.bin": 1 << 20 for i in range(12)}
    assert listing(files) == ("12 file(s), 12 MiB: shard-00.bin, shard-01.bin, shard-02.bin, "
                              "shard-03.bin, shard-04.bin and 7 more")
    every = listing(files, None)  # what delete_extras deleted: each one named
    assert all(name in every for name in files) and "more" not in every


def test_delete_extras_deletes_the_workers_extras_only_and_names_them(folders):
    params, cluster = folders
    params = with_distribution(params, delete_extras=True)
    worker = params.workers[0].name
    extras_on(cluster, worker)
    outside = cluster.root / "outside.safetensors"
    outside.write_bytes(b"keep me")
    (cluster.at(worker) / "link.safetensors").symlink_to(outside)  # a link: never listed, never followed
    out = sync_model(params, cluster, say=quiet, show=False)
    w = cluster.at(worker)
    assert not (w / "notes.txt").exists() and not (w / "other-model" / "weights.safetensors").exists()
    assert outside.read_bytes() == b"keep me" and (w / "link.safetensors").is_symlink()
    assert (cluster.folder(worker) / "beside.bin").exists() and (w / "model.safetensors").exists()
    assert out.deleted == {worker: {"notes.txt": 5, "other-model/weights.safetensors": 300_000}}
    assert out.extras == {} and sorted(os.listdir(cluster.at(params.head))) == ["config.json", "model.safetensors"]
    rows = {(c.check, c.node): c for c in model_checks(params, out)}
    done = rows[("extra model files", worker)]
    assert done.status == PASS
    assert done.observed == ("deleted (distribution.delete_extras) 2 file(s), 293 KiB: notes.txt, "
                             "other-model/weights.safetensors")
    assert model_table(out).rows[0][-1] == "deleted 2 (293 KiB)"


def test_the_prune_script_deletes_nothing_outside_the_model_folder(tmp_path):
    m = tmp_path / "m"
    (m / "sub").mkdir(parents=True)
    (m / "extra.bin").write_text("x")
    (tmp_path / "outside.txt").write_text("o")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.bin").write_text("e")
    (m / "up").symlink_to(tmp_path / "elsewhere")
    names = ["extra.bin", "../outside.txt", "up/x.bin", "sub", "absent.bin", "-rf"]
    r = subprocess.run(["bash", "-c", script("model_prune.sh", str(m), *names).program()],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [line.split("\t") for line in r.stdout.splitlines()]
    assert lines[0] == ["DELETED", "extra.bin"]
    assert [(kind, name) for kind, name, *_ in lines[1:]] == [("KEPT", n) for n in names[1:]]
    assert not (m / "extra.bin").exists() and (tmp_path / "outside.txt").exists()
    assert (tmp_path / "elsewhere" / "x.bin").exists() and (m / "sub").is_dir()


# --------------------------------------------------------------- 8. an interrupted copy resumes

def test_the_manifest_never_lists_the_partial_files(tmp_path):
    m = tmp_path / "m"
    (m / "sub" / PARTIAL_DIR).mkdir(parents=True)
    (m / PARTIAL_DIR).mkdir()
    (m / PARTIAL_DIR / "model.safetensors").write_bytes(b"half")
    (m / "sub" / PARTIAL_DIR / "x.json").write_text("{")
    (m / "config.json").write_text("{}")
    r = subprocess.run(["bash", "-c", manifest_script(str(m), True).program()], capture_output=True, text=True)
    assert set(parse_manifest(r.stdout)) == {"config.json"}


def test_an_interrupted_copy_resumes_where_it_stopped_and_verifies(folders, monkeypatch):
    params, cluster = folders
    params = with_distribution(params, parallel=1)
    worker = params.workers[0].name
    (cluster.at(params.workers[1]) / "config.json").write_text('{"model_type": "qwen3"}\n')
    (cluster.at(params.workers[1]) / "model.safetensors").write_bytes(
        (cluster.at(params.head) / "model.safetensors").read_bytes())  # only the first worker copies
    size = (cluster.at(params.head) / "model.safetensors").stat().st_size
    monkeypatch.setenv("RSH_CUT", str(size // 2))  # the link drops halfway through
    cut = sync_model(params, cluster, say=quiet, show=False)
    assert cut.synced[worker].error and [c.node for c in model_checks(params, cut) if c.status == FAIL] == [worker]
    partial = cluster.at(worker) / PARTIAL_DIR / "model.safetensors"
    assert 0 < partial.stat().st_size < size, "the partial file was not kept aside"
    assert not (cluster.at(worker) / "model.safetensors").exists()  # never under its real name

    monkeypatch.delenv("RSH_CUT")
    again = sync_model(params, cluster, say=quiet, show=False)
    # the partial file is neither an extra nor deleted: the next copy starts from it
    assert again.before[worker] == {"model.safetensors": "missing"}, again.before
    assert again.synced[worker].error is None and again.after[worker] == {} and again.extras == {}
    first, second = cluster.sent(worker)
    assert first <= size // 2 and second < size * 0.7, (first, second, size)
    assert same(cluster.at(params.head), cluster.at(worker), "model.safetensors")
    assert not (cluster.at(worker) / PARTIAL_DIR).exists()
    assert {c.status for c in model_checks(params, again)} == {PASS}


# ------------------------------------------------------------ 9. one stuck worker holds back none

def test_a_stuck_worker_fails_the_model_sync_by_name_and_the_other_finishes(folders, monkeypatch):
    params, cluster = folders
    stuck, fine = params.workers[0], params.workers[1]
    monkeypatch.setattr(model, "STALL_S", 3)
    monkeypatch.setenv("RSH_STALL", stuck.fabric_address)
    start = time.monotonic()
    out = sync_model(params, cluster, say=quiet, show=False)
    assert time.monotonic() - start < 15
    assert out.synced[fine.name].error is None and out.after[fine.name] == {}
    assert out.synced[stuck.name].error.startswith(
        f"rsync from {params.head.name} exited 30: no data moved for 3 s: {stuck.name} or the link to it "
        "is stuck"), out.synced
    bad = [c for c in model_checks(params, out) if c.status == FAIL]
    assert [c.node for c in bad] == [stuck.name]


def test_node_to_node_ssh_has_keepalives_and_relays_run_their_own_copy():
    params = validate(lab_params(4))
    p1 = with_distribution(params, parallel=1)
    nodes = {n.name: image.NodeImage(n.name, "sha256:1", layers=DIFF_IDS) for n in p1.nodes}
    spec = image.stream_spec(p1, p1.workers, nodes, False, {"spark-1": ["spark-2"], "spark-2": ["spark-3"]})
    relay = spec["workers"][0]
    for ssh, to in ((relay["ssh"], "spark-2"), (relay["feeds"][0]["ssh"], "spark-3")):
        assert ssh[0] == "ssh" and ssh[-1] == p1.node(to).peer_target
        assert "ServerAliveInterval=15" in ssh and "ServerAliveCountMax=4" in ssh
    assert relay["program"] == image.stream_path(p1, p1.node("spark-2"))
    assert relay["program"].startswith("/tmp/sparkbook-") and relay["program"].endswith(f"/{p1.name}/imagestream.py")
    assert "program" not in relay["feeds"][0] and spec["stall_s"] == image.STALL_S
    assert spec["deployment"] == p1.name
    rsh = model.sync_script(params, {"spark-2": ["config.json"]}).args[5]
    assert "ServerAliveInterval=15" in rsh and "ServerAliveCountMax=4" in rsh


@pytest.mark.parametrize("parallel, stuck", [(3, "spark-3"), (1, "spark-3")])
def test_a_stuck_worker_fails_the_image_copy_by_name_and_the_others_finish(
        local_nodes, monkeypatch, parallel, stuck):
    """A worker whose SSH stops taking data (its link or its Docker hangs): with the head feeding
    every worker, the others load the image; in a chain (head -> spark-2 -> spark-3 -> spark-4),
    spark-2 loads it and spark-4, behind the stuck relay, is named as not reached."""
    monkeypatch.setattr(image, "STALL_S", 2)
    local_nodes.stuck.add(stuck)
    start = time.monotonic()
    params, got, _read = copy_locally(4, parallel, {}, local_nodes)
    assert time.monotonic() - start < 20  # the stand-in would hold the copy for 30 s
    assert got[stuck].error == f"{stuck} took no data for 2 s: stopped"
    assert got["spark-2"].error is None and loaded(local_nodes, "spark-2") == local_nodes.archive
    if parallel == 3:
        assert got["spark-4"].error is None and loaded(local_nodes, "spark-4") == local_nodes.archive
    else:
        assert got["spark-4"].error == (f"not reached: the relay on {stuck} failed ({stuck} took no data "
                                        "for 2 s: stopped)")


# ------------------------------------------------------------- 10. both rails carry the copy

def sharded(cluster, params, sizes=(700_000, 650_000, 600_000, 600_000, 550_000, 500_000, 450_000, 400_000)):
    """A sharded model on the head (its shards of unequal sizes, as a large model's last one is)."""
    head = cluster.at(params.head)
    (head / "model.safetensors").unlink()
    for i, size in enumerate(sizes, 1):
        (head / f"model-{i:05d}-of-{len(sizes):05d}.safetensors").write_bytes(os.urandom(size))
    return sum(sizes)


def test_a_sharded_model_goes_over_both_rails_each_carrying_half_within_a_tenth(folders):
    params, cluster = folders
    total = sharded(cluster, params)
    out = sync_model(params, cluster, say=quiet, show=False)
    first, second = (r.interface for r in params.head.rails)
    for w in params.workers:
        # measured where the bytes pass (the stand-in SSH of each rail), rsync's own protocol included
        carried = [sum(cluster.sent(w.name, rail)) for rail in (0, 1)]
        assert sum(carried) > total and abs(carried[0] - carried[1]) <= 0.1 * max(carried), carried
        assert set(out.synced[w.name].rails) == {first, second} and out.synced[w.name].fell_back is None
        assert same(cluster.at(params.head), cluster.at(w), "model-00008-of-00008.safetensors")
        row = next(c for c in model_checks(params, out) if c.check == "model files" and c.node == w.name)
        assert row.status == PASS and f"over {first} " in row.observed and f", {second} " in row.observed


def test_a_rail_that_is_down_hands_its_files_to_the_first_and_03_names_it(folders, monkeypatch):
    params, cluster = folders
    sharded(cluster, params)
    down, fine = params.workers
    second = down.rails[1]
    monkeypatch.setenv("RSH_DOWN", str(second.ip))
    out = sync_model(params, cluster, say=quiet, show=False)
    assert out.after == {down.name: {}, fine.name: {}} and out.synced[down.name].error is None
    assert list(out.synced[down.name].rails) == [down.rails[0].interface]  # everything over the first
    assert out.synced[down.name].fell_back.startswith(f"{second.interface} (rsync exited ")
    assert len(out.synced[fine.name].rails) == 2
    rows = [c for c in model_checks(params, out) if c.status != PASS]
    assert [(c.check, c.node, c.status) for c in rows] == [("model copy rails", down.name, WARN)]
    assert second.interface in rows[0].observed and "02_collectives" in rows[0].remedy


def test_copies_take_the_rails_both_nodes_have_a_network_on_or_the_first_alone_when_asked():
    params = validate(lab_params(2))
    head, worker = params.head, params.workers[0]
    both = model.lanes(params, head, worker)
    assert [(la.interface, la.target) for la in both] == [(r.interface, f"{worker.user}@{r.ip}") for r in worker.rails]
    assert f"HostKeyAlias={worker.fabric_address}" in both[1].ssh and "HostKeyAlias" not in " ".join(both[0].ssh)
    assert model.lanes(with_distribution(params, rails="first"), head, worker) == both[:1]
    one_rail = head.model_copy(update={"rails": head.rails[:1]})  # no route of its own to the twin
    assert model.lanes(params, one_rail, worker) == both[:1]
    assert model.split(["a", "b", "c", "d"], {"a": 5, "b": 4, "c": 3, "d": 3}, 2) == [["a", "d"], ["b", "c"]]


# ---------------------------------------------------------------------------------- on the lab

def test_the_lab_sync_keeps_another_model_then_deletes_it_when_asked(lab, params, cluster):
    """Another model in the worker's model folder, and one beside it: 03's sync keeps both and
    WARNs naming the first; with delete_extras it deletes that one only, and names it."""
    worker = params.workers[0]
    inside = f"{params.model.path}/other-model/model.safetensors"
    beside = f"{params.model.path}-other/model.safetensors"
    made = cluster.run(["bash", "-c", 'for f; do mkdir -p -- "${f%/*}" && head -c 100000 /dev/urandom > "$f"; done',
                        "make", inside, beside], [worker])
    made.check("put another model on the worker")
    try:
        out = sync_model(params, cluster, say=quiet, show=False)
        assert out.extras == {worker.name: {"other-model/model.safetensors": 100000}}
        warn = [c for c in model_checks(params, out) if c.status == WARN]
        assert [(c.check, c.node) for c in warn] == [("extra model files", worker.name)]
        assert "other-model/model.safetensors" in warn[0].observed
        assert not [c for c in model_checks(params, out) if c.status == FAIL]

        asked = with_distribution(params, delete_extras=True)
        out = sync_model(asked, cluster, say=quiet, show=False)
        assert out.deleted == {worker.name: {"other-model/model.safetensors": 100000}} and out.extras == {}
        rows = [c for c in model_checks(asked, out) if c.check == "extra model files"]
        assert [(c.node, c.status) for c in rows] == [(worker.name, PASS)]
        assert "other-model/model.safetensors" in rows[0].observed
        left = cluster.run(["ls", "--", inside, beside], [worker])[worker.name].stdout.split()
        assert left == [beside]
    finally:
        cluster.run(["rm", "-rf", "--", f"{params.model.path}/other-model", f"{params.model.path}-other"], [worker])
