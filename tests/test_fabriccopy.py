"""distribution.transport: tcp (issue 32): the model's bytes over plain TCP on the fabric address,
the control and the one-time key over SSH. The receiver takes one authenticated connection for one
transfer (a second is refused, an unauthenticated one never delivers a byte), and a byte changed on
the way is found by digest and the file not kept. Here on 127.0.0.1: the receiver run as 03 runs
it, its "SSH" a local shell; 03's model sync through it between folders of this machine."""

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from sparkbook.book.verdict import PASS
from sparkbook.distribution import image, model
from sparkbook.distribution.model import model_checks, sync_model
from sparkbook.facts.manifest import PARTIAL_DIR
from sparkbook.lab.nodes import lab_params
from sparkbook.nodes.shell import SCRIPTS, command_line
from sparkbook.params import ParamsError, validate
from sparkbook.scripts import fabriccopy as fc
from test_distribute import copy_locally, direct, loaded, local_nodes  # noqa: F401  (the fixture)
from test_distribute_safety import folders, with_distribution  # noqa: F401  (the fixture)

PROGRAM = str(SCRIPTS / "fabriccopy.py")
KEY = bytes(range(32))


def receiver(root, files, stall_s=10):
    """``fabriccopy.py receive`` on 127.0.0.1, its spec (with the key) on stdin, as SSH would
    carry it; the process and the port it listens on."""
    p = subprocess.Popen([sys.executable, PROGRAM, "receive"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    spec = {"root": str(root), "partial": PARTIAL_DIR, "address": "127.0.0.1", "key": KEY.hex(),
            "files": files, "stall_s": stall_s}
    p.stdin.write((json.dumps(spec) + "\n").encode())
    p.stdin.flush()
    line = p.stdout.readline().decode()
    assert line.startswith("LISTEN "), line + p.stderr.read().decode()
    return p, int(line.split()[1])


def connect(port, key=KEY):
    """A sender's connection, authenticated with ``key``; the socket and the receiver's nonce."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    nonce = fc.recv_exact(s, fc.NONCE)
    s.sendall(fc.mac(key, nonce, fc.HELLO))
    if key == KEY:
        assert s.recv(1) == b"\1"  # authenticated: the listener is closed
    return s, nonce


def send_file(s, nonce, index, data, corrupt_at=None, key=KEY):
    """One file as the sender frames it; ``corrupt_at``: that byte flipped on the way, after the
    sender hashed it (what a fault or someone on the fabric does)."""
    header = fc.HEADER.pack(len(data), 1_700_000_000 * 10**9, 0o100640)
    sent = bytearray(data)
    if corrupt_at is not None:
        sent[corrupt_at] ^= 0x01
    s.sendall(header + bytes(sent) + fc.file_mac(key, nonce, index, header, hashlib.sha256(data).digest()))


def closed(s) -> bool:
    """The receiver closed the connection on us (a reset where our bytes were left unread)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def finished(p):
    """The receiver's exit status, its DONE record and its output; its stdin closed only once it
    ended (closing it stops a receiver: the run interrupted)."""
    p.wait(timeout=20)
    out, err = p.communicate()
    done = [json.loads(line[5:]) for line in out.decode().splitlines() if line.startswith("DONE ")]
    assert done, out.decode() + err.decode()
    return p.returncode, done[-1], out.decode()


def test_a_second_connection_is_refused_once_one_has_authenticated(tmp_path):
    p, port = receiver(tmp_path, ["a.bin"])
    s, nonce = connect(port)
    with pytest.raises(ConnectionRefusedError):  # the listener closed: the kernel refuses it
        socket.create_connection(("127.0.0.1", port), timeout=5)
    send_file(s, nonce, 0, b"x" * 100_000)
    assert s.recv(1) == b"\1"
    code, done, _ = finished(p)
    assert code == 0 and done == {"files": 1, "bytes": 100_000, "errors": [], "refused": []}
    f = tmp_path / "a.bin"
    assert f.read_bytes() == b"x" * 100_000
    assert f.stat().st_mtime_ns == 1_700_000_000 * 10**9 and f.stat().st_mode & 0o777 == 0o640
    assert not list(tmp_path.rglob(PARTIAL_DIR))


def test_an_unauthenticated_connection_delivers_nothing_and_the_real_sender_still_gets_through(tmp_path):
    p, port = receiver(tmp_path, ["a.bin"])
    bad, nonce = connect(port, key=b"\0" * 32)  # someone on the fabric, without the key
    send_file(bad, nonce, 0, b"evil", key=b"\0" * 32)
    assert closed(bad)  # before a byte of it was taken as data
    bad.close()
    assert not (tmp_path / "a.bin").exists()
    s, nonce = connect(port)
    send_file(s, nonce, 0, b"good")
    assert s.recv(1) == b"\1"
    code, done, out = finished(p)
    assert code == 0 and done["refused"] == ["127.0.0.1"] and "REFUSED 127.0.0.1" in out
    assert (tmp_path / "a.bin").read_bytes() == b"good"


def test_a_corrupted_byte_is_found_by_digest_and_the_file_is_not_kept(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"the worker's old copy")
    p, port = receiver(tmp_path, ["a.bin", "sub/b.json"])
    s, nonce = connect(port)
    data = os.urandom(3 << 20)
    send_file(s, nonce, 0, data, corrupt_at=len(data) // 2)
    send_file(s, nonce, 1, b'{"ok": 1}')
    assert s.recv(1) == b"\1"
    code, done, _ = finished(p)
    assert code == 1 and done["files"] == 1
    assert done["errors"] == ["a.bin arrived damaged (its digest does not match the sender's): not kept"]
    assert (tmp_path / "a.bin").read_bytes() == b"the worker's old copy"  # neither replaced nor left half-written
    assert (tmp_path / "sub" / "b.json").read_bytes() == b'{"ok": 1}'  # the next file is unaffected
    assert not list(tmp_path.rglob(PARTIAL_DIR))


def test_a_name_from_outside_the_model_folder_is_refused(tmp_path):
    p = subprocess.run([sys.executable, PROGRAM, "receive"], capture_output=True, timeout=20,
                       input=json.dumps({"root": str(tmp_path), "partial": PARTIAL_DIR, "address": "127.0.0.1",
                                         "key": KEY.hex(), "files": ["../escape"], "stall_s": 5}).encode() + b"\n")
    assert p.returncode != 0 and b"not a relative file name: '../escape'" in p.stderr


def test_a_sender_that_stops_fails_as_a_stall_and_leaves_no_partial_file(tmp_path):
    p, port = receiver(tmp_path, ["a.bin"], stall_s=1)
    s, nonce = connect(port)
    s.sendall(fc.HEADER.pack(1000, 0, 0o100644) + b"x" * 10)  # then nothing
    code, done, _ = finished(p)
    assert code == fc.STALLED == model.RSYNC_TIMEOUT and done["errors"] == ["no data for 1 s"]
    assert not (tmp_path / "a.bin").exists() and not list(tmp_path.rglob(PARTIAL_DIR + "/*"))
    s.close()


def test_the_end_of_its_ssh_channel_stops_the_receiver_and_removes_its_partial_file(tmp_path):
    p, port = receiver(tmp_path, ["a.bin"])
    s, nonce = connect(port)
    s.sendall(fc.HEADER.pack(1 << 20, 0, 0o100644) + b"x" * 1000)
    part = tmp_path / PARTIAL_DIR / "a.bin"
    deadline = time.monotonic() + 5
    while not part.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert part.exists()
    p.stdin.close()  # the run interrupted: sshd closes the channel
    assert p.wait(timeout=10) == 3
    assert not part.exists() and not (tmp_path / "a.bin").exists()
    s.close()


def lane(name, root, files, ssh=("sh", "-c")):
    return {"name": name, "ssh": list(ssh), "address": "127.0.0.1", "program": PROGRAM, "files": files,
            "root": str(root)}


def test_send_reads_each_file_once_for_every_worker_and_names_a_worker_it_cannot_reach(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "w.safetensors").write_bytes(os.urandom(24 << 20))
    (src / "sub" / "config.json").write_text("{}")
    files = ["w.safetensors", "sub/config.json", "gone.json"]  # gone: the source no longer holds it, skipped
    spec = {"root": str(src), "partial": PARTIAL_DIR, "stall_s": 10,
            "lanes": [lane("w1@r0", tmp_path / "w1", files), lane("w2@r0", tmp_path / "w2", files),
                      lane("w3@r0", tmp_path / "w3", files, ssh=("false",))]}
    counted = ("import atexit, runpy, sys; atexit.register(lambda: print('RCHAR', open('/proc/self/io')"
               ".read().split()[1], file=sys.stderr)); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
               "run_name='__main__')")  # the sender, and the bytes it read in all (/proc/PID/io's rchar)
    r = subprocess.run([sys.executable, "-c", counted, PROGRAM, "send", json.dumps(spec)], capture_output=True,
                       text=True, timeout=60)
    done = {line.split()[1]: line.split(" ", 3)[2:] for line in r.stdout.splitlines() if line.startswith("DONE ")}
    assert len(done) == 3, r.stdout + r.stderr
    assert done["w1@r0"] == ["0", ""] and done["w2@r0"] == ["0", ""], r.stdout + r.stderr
    assert done["w3@r0"][0] == "1" and "the receiver did not start" in done["w3@r0"][1]
    assert r.returncode == 1
    for w in ("w1", "w2"):
        assert (tmp_path / w / "w.safetensors").read_bytes() == (src / "w.safetensors").read_bytes()
        assert (tmp_path / w / "sub" / "config.json").read_text() == "{}"
        assert not (tmp_path / w / "gone.json").exists()
    assert "[w1@r0] 25,165,826 100%" in r.stdout  # rsync's progress columns, as 03 reads them
    read = int(r.stderr.split("RCHAR ")[1].split()[0])
    assert 24 << 20 <= read < 1.5 * (24 << 20)  # one read for both workers (and Python's start), not one each


def test_the_send_command_holds_no_key_and_binds_each_rails_address():
    params = with_distribution(validate(lab_params(3)), transport="tcp")
    cmd = model.sync_script(params, {w.name: ["config.json"] for w in params.workers})
    assert cmd[:2] == ["python3", model.copier_path(params, params.head)] and cmd[2] == "send"
    spec = json.loads(cmd[3])
    assert [(s["name"], s["address"]) for s in spec["lanes"]] == [
        (f"{w.name}@{w.rails[0].interface}", str(w.rails[0].ip)) for w in params.workers]
    assert all(s["ssh"][-1].endswith(str(s["address"])) and "StrictHostKeyChecking=yes" in s["ssh"]
               for s in spec["lanes"])
    assert "key" not in command_line(cmd)
    with pytest.raises(ParamsError, match="distribution.transport: tcp listens on the fabric address only"):
        validate({**lab_params(2), "distribution": {"transport": "tcp"},
                  "nodes": [{k: v for k, v in n.items() if k != "rails"} for n in lab_params(2)["nodes"]]})


def test_03s_model_sync_over_tcp_splits_the_files_over_both_rails(folders, monkeypatch):  # noqa: F811
    """sync_model with distribution.transport: tcp between folders: the stand-in SSH starts each
    receiver in its worker's folder, the bytes come over TCP (here on 127.0.0.1)."""
    params, cluster = folders
    params = with_distribution(params, transport="tcp")
    head = cluster.at(params.head)
    for i in range(4):
        (head / f"model-{i}.safetensors").write_bytes(os.urandom(1_000_000 + i))
    lanes = model.lanes
    monkeypatch.setattr(model, "lanes", lambda *a: [dataclasses.replace(x, address="127.0.0.1") for x in lanes(*a)])
    monkeypatch.setattr(model, "place_copier", lambda *a: None)
    monkeypatch.setattr(model, "copier_path", lambda *a: PROGRAM)
    out = sync_model(params, cluster, say=lambda *_: None, show=False)
    assert all(c.status == PASS for c in model_checks(params, out)), [(c.node, c.observed) for c in model_checks(params, out) if c.status != PASS]
    for w in params.workers:
        names = sorted(p.name for p in head.iterdir())
        assert sorted(p.name for p in cluster.at(w).iterdir()) == names
        assert all((cluster.at(w) / n).read_bytes() == (head / n).read_bytes() for n in names)
        assert len(out.synced[w.name].rails) == 2  # both rails carried files
        assert out.synced[w.name].command.startswith(f"on {params.head.name}: python3 ")


# ------------------------------------------------------------------------------ the image's pipe

def piped(tmp_path, chunks, corrupt=None):
    """``fabriccopy.py pipe`` into ``cat > out``: ``chunks`` sent as imagestream's sinks send them,
    chunk ``corrupt`` with a byte flipped after it was hashed; the exit status, the output, and
    what reached the command."""
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, PROGRAM, "pipe"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    p.stdin.write((json.dumps({"address": "127.0.0.1", "key": KEY.hex(), "stall_s": 10,
                               "command": ["sh", "-c", f"cat > {out}"]}) + "\n").encode())
    p.stdin.flush()
    sock, nonce = fc.handshake(p, "127.0.0.1", KEY, 10)
    w = fc.PipeWriter(sock, nonce, KEY)
    for i, chunk in enumerate(chunks):
        if i == corrupt:
            w.digest.update(chunk)
            w.total += len(chunk)
            bad = bytearray(chunk)
            bad[7] ^= 0x80
            sock.sendall(fc.FRAME.pack(len(chunk)) + bytes(bad))
        else:
            w.write(chunk)
    w.close()
    code = p.wait(timeout=20)
    return code, p.stdout.read().decode(), out.read_bytes() if out.exists() else b""


def test_the_image_pipe_delivers_the_stream_and_a_damaged_one_never_whole(tmp_path):
    chunks = [os.urandom(1 << 20) for _ in range(3)] + [b"end of archive"]
    code, said, got = piped(tmp_path, chunks)
    assert code == 0 and got == b"".join(chunks), said
    code, said, got = piped(tmp_path, chunks, corrupt=1)
    assert code == 1 and "the stream arrived damaged" in said
    assert len(got) < len(b"".join(chunks))  # docker load never saw the archive's end: nothing loaded


def test_the_image_over_tcp_reaches_every_worker_through_relays(local_nodes, monkeypatch):
    """imagestream.py with transport tcp: each sink starts `fabriccopy.py pipe` over the stand-in
    SSH in its worker's folder, and streams into it over TCP (here 127.0.0.1); relays too."""
    spec = image.stream_spec

    def here(w):
        return {**w, "address": "127.0.0.1", "feeds": [here(f) for f in w["feeds"]]}

    monkeypatch.setattr(image, "stream_spec", lambda *a: {**(s := spec(*a)), "workers": [here(w) for w in s["workers"]]})
    monkeypatch.setattr(image, "copier_path", lambda *a: PROGRAM)
    held = {"spark-3": 2}
    params, got, read = copy_locally(6, 2, held, local_nodes, transport="tcp")
    assert {n: t.via for n, t in got.items()}["spark-4"] == "spark-2"  # relayed
    for w in params.workers:
        t = got[w.name]
        assert t.error is None and not t.compressed, "\n".join(local_nodes.head.lines[-12:])
        assert loaded(local_nodes, w.name) == direct(local_nodes, held.get(w.name, 0)), w.name
    assert len(local_nodes.archive) <= read < len(local_nodes.archive) + (8 << 20)  # one read on the head


# ---------------------------------------------------------------------------------- on the lab

# On a worker: a receiver as the copy starts it (its spec on stdin, held open), its listener as `ss`
# sees it, then a connection to each of the worker's own addresses at that port, then its result.
LISTENING = r"""out=$(mktemp) && trap 'rm -f -- "$out"' EXIT
(printf '%s\n' "$1"; sleep 12) | python3 "$2" receive > "$out" & pid=$!
for _ in $(seq 100); do grep -q LISTEN "$out" && break; sleep 0.1; done
port=$(awk '/^LISTEN/ {print $2}' "$out")
ss -ltnH "sport = :$port" | sed 's/^/SS /'
shift 2
python3 -c "$TRY" "$port" "$@"
wait "$pid"; code=$?
cat -- "$out"
exit "$code"
"""
TRY = """import socket, sys
for host in sys.argv[2:]:
    try:
        socket.create_connection((host, int(sys.argv[1])), timeout=3).close()
        print("TRY", host, "open")
    except OSError as e:
        print("TRY", host, type(e).__name__)
"""


@pytest.mark.lab
def test_on_the_lab_the_copy_takes_both_rails_and_listens_on_the_rails_address_only(lab, params, cluster):
    """03's sync with transport tcp between lab nodes (real SSH, real rails); then a receiver as
    the copy starts it, seen from the worker (its listener on the rail's address) and from the
    head (the worker's management address refuses that port)."""
    tcp = with_distribution(params, transport="tcp")
    head, worker = params.head, params.workers[0]
    names = ["sparkbook-tcp-a.bin", "sparkbook-tcp-b.bin"]
    paths = [f"{params.model.path}/{n}" for n in names]
    cluster.run(["bash", "-c", 'for f; do head -c 3000000 /dev/urandom > "$f"; done', "make", *paths],
                [head]).check("the head's new files")
    try:
        out = sync_model(tcp, cluster, say=lambda *_: None, show=False)
        assert all(c.status == PASS for c in model_checks(tcp, out)), model_checks(tcp, out)
        assert sorted(out.synced[worker.name].rails) == sorted(r.interface for r in worker.rails)
        sums = cluster.run(["sha256sum", "--", *paths], [head, worker])
        assert sums[head.name].stdout == sums[worker.name].stdout and sums[head.name].ok

        rail = str(worker.rails[0].ip)
        spec = json.dumps({"root": params.model.path, "partial": PARTIAL_DIR, "address": rail, "key": KEY.hex(),
                           "files": [], "stall_s": 6})
        mgmt = worker.host
        r = cluster.run_on(worker, ["env", f"TRY={TRY}", "bash", "-c", LISTENING, "listen", spec,
                                    model.copier_path(tcp, worker), rail, mgmt], timeout=60)
        listeners = [line.split()[4] for line in r.stdout.splitlines() if line.startswith("SS ")]
        assert len(listeners) == 1 and listeners[0].startswith(f"{rail}:"), r.stdout  # not 0.0.0.0, not *
        assert f"TRY {rail} open" in r.stdout and f"TRY {mgmt} ConnectionRefusedError" in r.stdout, r.stdout
        assert f"REFUSED {rail}" in r.stdout  # that connection brought no key
        assert '"errors": ["no sender connected for 6 s"]' in r.stdout and r.exit_code == fc.STALLED, r.stdout
    finally:
        cluster.run(["rm", "-f", "--", *paths], params.nodes)
