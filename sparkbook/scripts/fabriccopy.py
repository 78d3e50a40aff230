#!/usr/bin/env python3
"""Model files, and image streams, from this node to workers over the fabric in plain TCP, without
SSH's encryption (``distribution.transport: tcp``); standard library only, copied to every node's
private working folder. SSH still carries the control: it starts the receiver, hands it the
transfer's one-time key on its standard input (never on a command line) and brings its result back;
only the bytes take the unencrypted connection. `pipe` is the image's form (one stream into
`docker load`, or into a relay: imagestream.py's sinks); the rest is the model's.

Each lane (one worker, one rail) is one transfer:
- `receive` on the worker listens on that rail's address only (an ephemeral port), prints
  `LISTEN port`, and takes the first connection that proves it holds the key (HMAC-SHA256 of a fresh
  nonce the receiver sends). A connection that does not is closed before a byte of it is read as
  data (`REFUSED`, counted in the result), and the receiver waits on; once one authenticates, the
  listener closes (then the receiver says so to the sender), so any further connection is refused
  by the kernel.
- `send` on the source starts one receiver per lane over SSH, connects, authenticates, and sends
  each file as a header (size, mtime, mode), its bytes, and a MAC over the lane's nonce, the file's
  place in the list, its header and the SHA-256 of its bytes. The receiver writes into the partial
  folder beside the file (never under its real name), hashes what arrived, and renames it into place
  only when the MAC matches: a byte changed on the way, by a fault or by someone on the fabric, is
  found, and the file is not kept. The names come from the SSH side, never from the connection.
- Lanes that carry the same files share one reader: each file is read and hashed once on the
  source, whatever the number of workers.
- A lane that moves no data for STALL_S fails (exit 30, as rsync's --timeout), the others go on;
  when its SSH ends (the run stopped), the receiver removes its partial file and exits.

Usage: fabriccopy.py send SPEC   SPEC: {"root": the model folder (the same on every node), "partial":
                                 the partial folder's name, "stall_s", "lanes": [{"name", "ssh": argv
                                 to the worker, "address": the rail address it listens on,
                                 "program": this script's path there, "files": [relative names],
                                 "root": where it writes them, when not the same folder}]}
       fabriccopy.py receive     one JSON line on stdin: {"root", "partial", "address", "key" (hex),
                                 "files", "stall_s"}; stdin held open (its end stops the receiver)
       fabriccopy.py pipe        the same line with {"address", "key", "stall_s", "command": argv}:
                                 one stream into the command's stdin (imagestream.py's sinks, for
                                 `docker load` or a relay, the image's bytes over TCP)
Lines on stdout: `[lane] BYTES PCT% RATE ETA` (rsync --info=progress2's columns) and `DONE lane
EXIT_CODE LAST_ERROR` per lane (send); LISTEN port, REFUSED peer, DONE {json} (receive).
"""

import hashlib
import hmac
import json
import os
import queue
import secrets
import shlex
import socket
import struct
import subprocess
import sys
import threading
import time

CHUNK = 4 << 20
QUEUE = 8           # chunks a lane may fall behind the others that share its reader
HEADER = struct.Struct(">QQI")  # size, mtime (ns), mode
INDEX = struct.Struct(">Q")
FRAME = struct.Struct(">I")  # pipe: a chunk's length (0: the end, then the stream's MAC)
MISSING = (1 << 64) - 1  # the size of a file the source no longer holds: skipped, as rsync --ignore-missing-args
NONCE = 32
HELLO = b"sparkbook-fabriccopy-1"
STALLED = 30        # rsync's exit status for --timeout (rsync(1), EXIT VALUES)
LOCK = threading.Lock()
WRITTEN = threading.Event()  # the receiver has every file: the end of its SSH channel no longer stops it


def say(*parts):
    with LOCK:
        print(*parts, flush=True)


def mac(key, nonce, *parts):
    return hmac.new(key, nonce + b"".join(parts), hashlib.sha256).digest()


def file_mac(key, nonce, index, header, digest):
    return mac(key, nonce, INDEX.pack(index), header, digest)


def safe(name):
    """A relative name inside the model folder (what the manifest lists), never above it."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise ValueError(f"not a relative file name: {name!r}")
    return name


def partial_path(root, partial, name):
    """The file's partial copy: in the partial folder beside it (as rsync --partial-dir)."""
    folder, base = os.path.split(name)
    return os.path.join(root, folder, partial, base)


def discard(part):
    """A partial copy removed (where it is still there), and its folder where that leaves it empty."""
    for remove, path in ((os.unlink, part), (os.rmdir, os.path.dirname(part))):
        try:
            remove(path)
        except OSError:
            pass


def recv_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("the sender closed the connection early")
        got += k
    return bytes(buf)


# ------------------------------------------------------------------------------------- receive

def accept(listener, key, deadline, refused):
    """The first connection that proves it holds ``key``; the others closed and counted."""
    while True:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            listener.settimeout(left)
            conn, peer = listener.accept()
        except TimeoutError:
            raise TimeoutError("no sender connected") from None
        conn.settimeout(max(1.0, min(left, 10.0)))
        nonce = secrets.token_bytes(NONCE)
        try:
            conn.sendall(nonce)
            proof = recv_exact(conn, 32)
        except OSError:
            proof = b""
        if hmac.compare_digest(proof, mac(key, nonce, HELLO)):
            return conn, nonce
        refused.append(peer[0])
        say("REFUSED", peer[0])
        conn.close()


def create(part):
    """The partial file, opened for writing, its folder made: again where another lane to this
    worker (another rail) removed the folder, empty, between the two."""
    for _ in range(10):
        os.makedirs(os.path.dirname(part), exist_ok=True)
        try:
            return open(part, "wb")
        except FileNotFoundError:
            pass
    return open(part, "wb")


def receive_file(conn, key, nonce, index, root, partial, name, current):
    """One file from the connection into its partial copy, kept under its name only when its MAC
    matches; the bytes it carried, and an error (None: kept, or skipped as the source lacks it)."""
    header = recv_exact(conn, HEADER.size)
    size, mtime, mode = HEADER.unpack(header)
    if size == MISSING:
        return 0, None
    final, part = os.path.join(root, name), partial_path(root, partial, name)
    current[0] = part
    digest, buf = hashlib.sha256(), bytearray(CHUNK)
    view, left = memoryview(buf), size
    with create(part) as f:
        while left:
            k = conn.recv_into(view[:min(left, CHUNK)])
            if not k:
                raise ConnectionError("the sender closed the connection early")
            digest.update(view[:k])
            f.write(view[:k])
            left -= k
    tag = recv_exact(conn, 32)
    if not hmac.compare_digest(tag, file_mac(key, nonce, index, header, digest.digest())):
        discard(part)
        current[0] = None
        return size, f"{name} arrived damaged (its digest does not match the sender's): not kept"
    os.chmod(part, mode & 0o7777)
    os.utime(part, ns=(mtime, mtime))
    os.replace(part, final)
    current[0] = None
    discard(part)
    return size, None


def read_line(fd=0):
    """One line of ``fd``, read unbuffered (the watcher goes on reading the same descriptor)."""
    data = b""
    while not data.endswith(b"\n"):
        more = os.read(fd, 1)
        if not more:
            break
        data += more
    return data


def watch_stdin(cleanup):
    """The SSH channel's end (the sender stopped, the run interrupted): ``cleanup()``, then out."""
    while os.read(0, 4096):
        pass
    if WRITTEN.is_set():
        return
    cleanup()
    os._exit(3)


def receive():
    spec = json.loads(read_line())
    key, root, files = bytes.fromhex(spec["key"]), spec["root"], [safe(n) for n in spec["files"]]
    stall, current, refused = spec["stall_s"], [None], []
    threading.Thread(target=watch_stdin, args=(lambda: current[0] and discard(current[0]),), daemon=True).start()
    listener = socket.create_server((spec["address"], 0), backlog=4)
    say("LISTEN", listener.getsockname()[1])
    out = {"files": 0, "bytes": 0, "errors": [], "refused": refused}
    code = 0
    try:
        conn, nonce = accept(listener, key, time.monotonic() + stall, refused)
        listener.close()
        conn.sendall(b"\1")  # authenticated, and no other connection can come in now
        conn.settimeout(stall)
        with conn:
            for i, name in enumerate(files):
                got, error = receive_file(conn, key, nonce, i, root, spec["partial"], name, current)
                out["bytes"] += got
                if error:
                    out["errors"].append(error)
                elif got:
                    out["files"] += 1
            WRITTEN.set()
            conn.sendall(b"\1")  # every file written: the sender may close
    except TimeoutError as e:  # socket.timeout too ("timed out")
        why = str(e) if str(e) == "no sender connected" else "no data"
        out["errors"].append(f"{why} for {stall:.0f} s")
        code = STALLED
    except OSError as e:
        out["errors"].append(f"{type(e).__name__}: {e}")
    finally:
        listener.close()
        if current[0]:
            discard(current[0])
    say("DONE", json.dumps(out))
    os._exit(code or (1 if out["errors"] else 0))  # not sys.exit: the watcher still reads stdin


def pipe():
    """The stream from one authenticated connection into ``command``'s stdin (its output is this
    one's), a chunk behind: the last chunk goes in only once the stream's MAC matches, so a
    damaged stream is never whole; then the command's exit status. Killed with the command when
    the SSH channel ends."""
    spec = json.loads(read_line())
    key, stall, child = bytes.fromhex(spec["key"]), spec["stall_s"], []
    threading.Thread(target=watch_stdin, args=(lambda: child and child[0].kill(),), daemon=True).start()
    listener = socket.create_server((spec["address"], 0), backlog=4)
    say("LISTEN", listener.getsockname()[1])
    error, code = None, 1
    try:
        conn, nonce = accept(listener, key, time.monotonic() + stall, [])
        listener.close()
        conn.sendall(b"\1")
        conn.settimeout(stall)
        proc = subprocess.Popen(spec["command"], stdin=subprocess.PIPE)
        child.append(proc)
        digest, total, held = hashlib.sha256(), 0, b""
        while n := FRAME.unpack(recv_exact(conn, FRAME.size))[0]:
            data = recv_exact(conn, n)
            digest.update(data)
            total += n
            proc.stdin.write(held)
            held = data
        if hmac.compare_digest(recv_exact(conn, 32), mac(key, nonce, INDEX.pack(total), digest.digest())):
            proc.stdin.write(held)
            proc.stdin.close()
            os._exit(proc.wait())
        error = "the stream arrived damaged (its digest does not match the sender's): stopped before its end"
    except TimeoutError as e:
        error, code = ("no sender connected" if str(e) == "no sender connected" else "no data") + f" for {stall:.0f} s", STALLED
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
    if child:
        child[0].kill()
        child[0].wait()
    say(f"fabriccopy: {error}")
    os._exit(code)


# ----------------------------------------------------------------------------------------- send

def start(ssh, program, mode, ask, address, key, stall, stderr=subprocess.PIPE):
    """A receiver (``mode``: receive or pipe) over SSH, its spec and the key on its stdin, which
    stays open: its end stops the receiver."""
    proc = subprocess.Popen(ssh + [shlex.join(["python3", program, mode])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr)
    try:
        proc.stdin.write((json.dumps({**ask, "address": address, "key": key.hex(), "stall_s": stall}) + "\n").encode())
        proc.stdin.flush()
    except BrokenPipeError:  # its SSH ended at once: handshake() says why
        pass
    return proc


def handshake(proc, address, key, stall):
    """The receiver's port from its first line, then the connection, authenticated; the socket and
    the receiver's nonce."""
    line = proc.stdout.readline().decode()
    if not line.startswith("LISTEN "):
        err = proc.stderr.read().decode().strip().splitlines() if proc.stderr else []
        raise ConnectionError(f"the receiver did not start: {err[-1] if err else line.strip() or 'no output'}")
    sock = socket.create_connection((address, int(line.split()[1])), timeout=stall)
    nonce = recv_exact(sock, NONCE)
    sock.sendall(mac(key, nonce, HELLO))
    recv_exact(sock, 1)
    return sock, nonce


class PipeWriter:
    """The sending end of `pipe`: each write a frame, the whole stream hashed, its MAC at the end."""

    def __init__(self, sock, nonce, key):
        sock.settimeout(None)  # the caller's watchdog stops a stalled stream (abort)
        self.sock, self.nonce, self.key = sock, nonce, key
        self.digest, self.total = hashlib.sha256(), 0

    def write(self, data):
        if data:
            self.digest.update(data)
            self.total += len(data)
            self.sock.sendall(FRAME.pack(len(data)))
            self.sock.sendall(data)

    def close(self):
        try:
            self.sock.sendall(FRAME.pack(0) + mac(self.key, self.nonce, INDEX.pack(self.total), self.digest.digest()))
        finally:
            self.sock.close()

    def abort(self):
        """Break a write blocked in another thread."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Lane:
    """One worker over one rail: its receiver (over SSH), its connection, what it sent."""

    def __init__(self, spec, root, partial, stall):
        self.name, self.files, self.stall = spec["name"], spec["files"], stall
        self.key = secrets.token_bytes(32)
        self.queue = queue.Queue(QUEUE)
        self.sent, self.total, self.error, self.code = 0, 0, None, 0
        self.dead = threading.Event()
        ask = {"root": spec.get("root", root), "partial": partial, "files": self.files}
        self.proc = start(spec["ssh"], spec["program"], "receive", ask, spec["address"], self.key, stall)
        self.address, self.sock, self.nonce = spec["address"], None, b""

    def connect(self):
        self.sock, self.nonce = handshake(self.proc, self.address, self.key, self.stall)

    def fail(self, error, code=1):
        if not self.dead.is_set():
            self.error, self.code = error, code
            self.dead.set()

    def put(self, item):
        while not self.dead.is_set():
            try:
                return self.queue.put(item, timeout=1)
            except queue.Full:
                pass

    def write(self):
        """The queue into the connection: headers, chunks, MACs, then the receiver's word."""
        try:
            while (item := self.queue.get()) is not None:
                if item[0] == "header":
                    self.sock.sendall(item[2])
                elif item[0] == "chunk":
                    self.sock.sendall(item[1])
                    self.sent += len(item[1])
                else:
                    self.sock.sendall(file_mac(self.key, self.nonce, item[1], item[2], item[3]))
            if not self.dead.is_set():
                recv_exact(self.sock, 1)
        except socket.timeout:
            self.fail(f"no data moved for {self.stall:.0f} s", STALLED)
        except OSError as e:
            self.fail(f"{type(e).__name__}: {e}")
        finally:
            if self.sock:
                self.sock.close()

    def finish(self):
        """The receiver's result (its DONE line) folded into the lane's."""
        try:
            out, err = self.proc.communicate(timeout=self.stall)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        done = [json.loads(line[5:]) for line in out.decode().splitlines() if line.startswith("DONE ")]
        errors = done[-1]["errors"] if done else []
        if errors:  # the receiver's reason over the sender's (a closed connection says less)
            self.error, self.code = f"on the receiver: {errors[-1]}", self.proc.returncode or 1
        elif not done and not self.error:
            lines = err.decode().strip().splitlines()
            self.fail(f"the receiver ended without a result: {lines[-1] if lines else self.proc.returncode}")


def read_files(root, names, lanes):
    """Each file read and hashed once, its header, chunks and digest to every lane still alive."""
    for i, name in enumerate(names):
        try:
            f = open(os.path.join(root, safe(name)), "rb")
        except FileNotFoundError:
            for lane in lanes:
                lane.put(("header", i, HEADER.pack(MISSING, 0, 0)))
            continue
        with f:
            st = os.fstat(f.fileno())
            header = HEADER.pack(st.st_size, st.st_mtime_ns, st.st_mode)
            for lane in lanes:
                lane.put(("header", i, header))
            digest, left = hashlib.sha256(), st.st_size
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise OSError(f"{name} shrank while it was sent")
                digest.update(chunk)
                left -= len(chunk)
                for lane in lanes:
                    lane.put(("chunk", chunk))
            for lane in lanes:
                lane.put(("mac", i, header, digest.digest()))


def reader(root, names, lanes):
    try:
        read_files(root, names, lanes)
    except OSError as e:
        for lane in lanes:
            lane.fail(f"reading on the source: {e}")
    for lane in lanes:
        lane.put(None)


def progress(lanes, stop, start):
    while not stop.wait(1):
        for lane in lanes:
            if not lane.dead.is_set() and lane.total:
                took = time.monotonic() - start
                rate = lane.sent / took / 1e6 if took else 0
                eta = (lane.total - lane.sent) / (rate * 1e6) if rate else 0
                say(f"[{lane.name}] {lane.sent:,} {100 * lane.sent // lane.total}% {rate:.2f}MB/s "
                    f"{int(eta) // 3600}:{int(eta) % 3600 // 60:02d}:{int(eta) % 60:02d}")


def send(spec):
    root, stall = spec["root"], spec["stall_s"]
    lanes = [Lane(s, root, spec["partial"], stall) for s in spec["lanes"]]
    for lane in lanes:
        lane.total = sum(os.path.getsize(os.path.join(root, n)) for n in lane.files
                         if os.path.isfile(os.path.join(root, n)))
        try:
            lane.connect()
        except (OSError, ValueError) as e:
            lane.fail(f"no connection to {lane.address}: {e}")
    live = [lane for lane in lanes if not lane.dead.is_set()]
    groups = {}
    for lane in live:
        groups.setdefault(tuple(lane.files), []).append(lane)
    stop, start = threading.Event(), time.monotonic()
    threading.Thread(target=progress, args=(live, stop, start), daemon=True).start()
    threads = [threading.Thread(target=lane.write) for lane in live]
    threads += [threading.Thread(target=reader, args=(root, list(names), group)) for names, group in groups.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for lane in lanes:
        if lane.code == 0 and not lane.error:
            say(f"[{lane.name}] {lane.sent:,} 100% 0.00MB/s 0:00:00")
        lane.finish()
        say("DONE", lane.name, lane.code, (lane.error or "").replace("\n", " "))
    sys.exit(0 if all(not lane.error for lane in lanes) else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["receive"]:
        receive()
    elif sys.argv[1:2] == ["pipe"]:
        pipe()
    elif sys.argv[1:2] == ["send"] and len(sys.argv) == 3:
        send(json.loads(sys.argv[2]))
    else:
        sys.exit(__doc__)
