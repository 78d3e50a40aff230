#!/usr/bin/env python3
"""Stream one read of an image into `docker load` on several workers at once, leaving out of each
worker's stream the layers it already holds (savearchive.py says why `docker load` accepts that).
Runs on the head node (sparkbook copies it there with layerstore.py and savearchive.py); standard
library only, no file written: the archive flows from the layer store (or `docker save`) through
this process into one `ssh WORKER docker load` per worker the head feeds.

For more workers than the head's link can feed, workers pass the stream on (a tree): the head runs
`ssh WORKER imagestream.py relay`, which splits its stdin the same way into the worker's own
`docker load` and one SSH stream per worker it feeds. The stream into a worker carries every layer
some worker of its subtree lacks; each sink leaves out what its own worker holds. A relay prints the
lines of every worker behind it; the head passes them on, and names the relay for any it lost.

One stuck worker (its `docker load` or its link stops taking data) holds back no other: each
worker's stream has its own writer thread and queue, and a worker that takes no data for "stall_s"
seconds while data waits for it is stopped and fails by name ("took no data for N s"), the others
going on (so do the workers behind a stuck relay, named "not reached").

Usage: imagestream.py stream SPEC   SPEC: {"image", "from": this node, "store": where to read layers
                                    (null: `docker save`), "deployment": for the reading container's
                                    name and label, "stall_s", "workers": [W]}; W: {"name", "ssh":
                                    argv, "have": [chain ids], "zstd": bool, "feeds": [W], and for a
                                    worker that feeds others "program": this script's path there;
                                    with "transport": "tcp", "address" (the worker's fabric address)
                                    and "receiver" (fabriccopy.py's path there): SSH starts
                                    `fabriccopy.py pipe` there, the bytes go over TCP}
       imagestream.py relay SPEC    on a worker, the archive on stdin; SPEC: its W with "diff_ids",
                                    "source", "expected", "held"
       imagestream.py probe SPEC    pipe and zstd throughput, for the compression choice
Lines on stdout: SOURCE how / PROGRESS name sent skipped expected wire / DONE {json per worker} /
READ rchar (bytes this process read: one archive whatever the number of workers; with zstd, plus
the compressed streams it reads back from each zstd to count them) / PROBE {json}.
"""

import collections
import fcntl
import json
import os
import queue
import secrets
import shlex
import subprocess
import sys
import threading
import time

try:
    from . import fabriccopy
    from .layerstore import BLOCK, CHUNK, chain_ids, expected_bytes, padded
    from .savearchive import Layers, octal, read_exact
except ImportError:  # run as a script on a node, next to layerstore.py, savearchive.py and fabriccopy.py
    import fabriccopy
    from layerstore import BLOCK, CHUNK, chain_ids, expected_bytes, padded
    from savearchive import Layers, octal, read_exact

ME = os.path.abspath(__file__)
LAYERSTORE = os.path.join(os.path.dirname(ME), "layerstore.py")
QUEUE = 32  # chunks (up to 1 MiB each) a sink may fall behind the others
STALL_S = 120  # a worker that takes no data for this long, while data waits for it, is stopped
LOCK = threading.Lock()


def say(*parts):
    """One whole line on stdout (threads write them)."""
    with LOCK:
        print(*parts, flush=True)


def tree(workers):
    """Every worker of a spec's tree: these and, at any depth, those they feed."""
    for w in workers:
        yield w
        yield from tree(w.get("feeds", ()))


def carried(worker):
    """The chains the stream into ``worker`` may leave out: those that it and every worker behind it
    hold (the stream must carry every layer some worker of its subtree lacks)."""
    return set(worker.get("have", ())).intersection(*(carried(w) for w in worker.get("feeds", ())))


def widen(pipe):
    """A 1 MiB pipe buffer (Linux; 64 KiB by default): fewer wake-ups between the processes."""
    try:
        fcntl.fcntl(pipe.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), CHUNK)
    except OSError:
        pass


class Sink:
    """One worker fed from this node: `docker load` here (no ``ssh``: a relay's own worker), `ssh
    WORKER docker load`, or `ssh WORKER imagestream.py relay` for a worker that feeds others; behind
    a local zstd when compressing. Its own thread writes what :func:`split` queues, so a worker that
    is slow for a moment holds the others back only once its queue is full, and one that takes
    nothing for ``stall_s`` is stopped (:meth:`_watch`), which empties its queue."""

    def __init__(self, spec, job):
        self.name, self.feeds, self.here = spec["name"], spec.get("feeds", []), job["from"]
        self.stall_s = job.get("stall_s", STALL_S)
        self.moved, self.busy, self.stalled = time.monotonic(), False, False  # the writer's progress
        self.have = carried(spec)
        self.expected, self.held = spec.get("expected", 0), spec.get("held", 0)
        self.behind = {w["name"]: w.get("held", 0) for w in tree(self.feeds)}
        self.reported = set()  # the workers whose DONE the relay sent
        self.sent = self.wire = self.skipped = self.layers_skipped = 0
        self.error, self.killed = None, False
        self.tail = collections.deque(maxlen=20)
        self.remote = spec.get("ssh") is not None
        argv, self.tcp, self.zstd = ["docker", "load"], None, None
        if self.remote:
            then = (f"python3 {shlex.quote(spec.get('program', ME))} relay "
                    f"{shlex.quote(json.dumps({**spec, **job}))}" if self.feeds else "docker load")
            remote = "set -o pipefail; " + ("zstd -q -d -c | " if spec.get("zstd") else "") + then
            argv = spec["ssh"] + ["bash -c " + shlex.quote(remote)]
        if self.remote and job.get("transport") == "tcp":  # SSH for the control, the bytes over TCP
            key = secrets.token_bytes(32)
            self.proc = fabriccopy.start(spec["ssh"], spec["receiver"], "pipe", {"command": ["bash", "-c", remote]},
                                         spec["address"], key, self.stall_s, stderr=subprocess.STDOUT)
            try:
                self.tcp = fabriccopy.PipeWriter(*fabriccopy.handshake(self.proc, spec["address"], key, self.stall_s),
                                                 key)
            except (OSError, ValueError) as e:
                self.error = f"the stream to {self.name} did not start: {e}"
                self.kill()
        else:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
        if self.remote and spec.get("zstd"):
            self.zstd = subprocess.Popen(["zstd", "-q", "-1", "-T0", "-c"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        self.pipe = self.tcp or (self.zstd.stdin if self.zstd else self.proc.stdin)
        widen(self.proc.stdin)
        if not self.tcp:
            widen(self.pipe)
        self.queue = queue.Queue(QUEUE)
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._write, self._read) + ((self._pump,) if self.zstd else ())]
        for t in self.threads:
            t.start()
        threading.Thread(target=self._watch, daemon=True).start()

    def write(self, data):
        """Queue ``data`` for the worker; waits while its queue is full, until the worker takes
        some or is stopped."""
        while self.error is None:
            try:
                self.queue.put(data, timeout=1)
                return
            except queue.Full:
                continue

    def _write(self):
        """The queue into the pipe, until None; after an error the queue is drained unwritten."""
        while (data := self.queue.get()) is not None:
            if self.error is None:
                self.moved, self.busy = time.monotonic(), True
                try:
                    self.pipe.write(data)
                    self.sent += len(data)
                    if not self.zstd:
                        self.wire = self.sent
                except OSError as e:
                    self.error = self.error or f"the stream to {self.name} broke: {e}"
                self.moved, self.busy = time.monotonic(), False
        self.moved, self.busy = time.monotonic(), True  # closing flushes what is buffered
        try:
            self.pipe.close()
        except OSError:
            pass
        self.busy = False

    def _watch(self):
        """The progress deadline: a worker whose write has waited ``stall_s`` (it takes no data: a
        stuck `docker load`, a dead link) is stopped, which breaks that write; the others go on."""
        while self.threads[0].is_alive():
            time.sleep(min(1.0, self.stall_s / 4))
            if self.busy and time.monotonic() - self.moved > self.stall_s and self.error is None:
                self.stalled = True
                self.error = f"{self.name} took no data for {self.stall_s:.0f} s: stopped"
                self.kill()
                return

    def kill(self):
        """Stop the worker's processes here (its SSH, zstd) and its TCP stream: what writes to them
        fails at once."""
        if self.tcp:
            self.tcp.abort()
        for p in (self.zstd, self.proc):
            if p and p.poll() is None:
                p.kill()
                self.killed = True

    def _pump(self):
        """zstd's output into ssh, counted."""
        try:
            while data := self.zstd.stdout.read1(CHUNK):
                self.proc.stdin.write(data)
                self.wire += len(data)
        except OSError as e:
            self.error = self.error or f"the stream to {self.name} broke: {e}"
        finally:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _read(self):
        """The worker's output; a relay's PROGRESS and DONE lines passed on, with the bytes sent to
        the relay itself as its ``wire``."""
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            kind, _, rest = line.partition(" ")
            if self.feeds and kind == "DONE":
                end = json.loads(rest)
                self.reported.add(end["name"])
                say("DONE", json.dumps({**end, "wire": self.wire} if end["name"] == self.name else end))
            elif self.feeds and kind == "PROGRESS":
                fields = rest.split()
                say("PROGRESS", *fields[:-1], self.wire if fields[0] == self.name else fields[-1])
            else:
                self.tail.append(line)

    def close(self, failed=None):
        """No more data. ``failed``: the archive is incomplete, so the worker is stopped before its
        input ends and nothing is loaded from it."""
        self.error = self.error or failed
        if failed:
            self.kill()
        self.queue.put(None)

    def finish(self, source):
        """Wait for the worker's end: the DONE records this sink owes, its worker's own, or for a
        relay, those of the workers (itself among them) it did not report, each naming it."""
        for t in self.threads[::2]:  # the writer, and zstd's pump
            t.join()
        if self.zstd:
            self.zstd.wait()
        code = self.proc.wait()
        self.threads[1].join(5)
        if code and not self.killed:  # its exit says more than the broken pipe it left here
            self.error = (f"SSH from {self.here} to {self.name} failed" if code == 255 and self.remote else
                          f"{'the relay on' if self.feeds else 'docker load on'} {self.name} exited {code}")
        mine = {"name": self.name, "code": code, "sent": self.sent, "wire": self.wire,
                "skipped": self.skipped, "layers_skipped": self.layers_skipped, "error": self.error,
                "output": list(self.tail), "source": source, "held": self.held}
        if not self.feeds:
            return [mine]
        why = (self.error or f"the relay on {self.name} ended without a result") + (
            f": {self.tail[-1]}" if self.tail else "")
        lost = [{**mine, "error": self.error or why}] if self.name not in self.reported else []
        behind = (self.error if self.killed and not self.stalled else
                  f"not reached: the relay on {self.name} failed ({why})")
        return lost + [{"name": n, "code": None, "sent": 0, "wire": 0, "skipped": 0, "layers_skipped": 0,
                        "error": behind, "output": [], "source": source, "held": held}
                       for n, held in self.behind.items() if n not in self.reported]


def inspect(image):
    out = subprocess.run(["docker", "image", "inspect", "--format",
                          "{{json .RootFS.Layers}} {{.Size}}", image],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"docker image inspect {image}: {out.stderr.strip()}")
    layers, size = out.stdout.rsplit(" ", 1)
    return json.loads(layers), int(size)


def split(src, layers, sinks):
    """Copy the tar stream ``src`` to every sink, leaving out of each the layers it holds
    (``sink.have``: chain IDs). Tar is parsed by hand, block by block, as it streams."""
    pending = []  # pax / GNU long-name headers that belong to the next member
    long_name = None
    while True:
        header = read_exact(src, BLOCK)
        if header == bytes(BLOCK):  # end of archive: the rest is zero padding for everyone
            rest = header + src.read()
            for s in sinks:
                s.write(rest)
            return
        kind, size = header[156:157], octal(header[124:136])
        name = header[0:100].split(b"\0")[0].decode()
        prefix = header[345:500].split(b"\0")[0].decode() if header[257:262] == b"ustar" else ""
        if prefix:
            name = prefix + "/" + name
        data_len = padded(size) if kind not in (b"1", b"2", b"3", b"4", b"5", b"6") else 0
        if kind in (b"x", b"L"):
            data = read_exact(src, data_len)
            pending.append(header + data)
            text = data[:size].split(b"\0")[0].decode(errors="replace")
            if kind == b"L":
                long_name = text
            for rec in text.split("\n") if kind == b"x" else ():
                if " path=" in rec:
                    long_name = rec.split(" path=", 1)[1]
            continue
        name, long_name = long_name or name, None
        meta, pending = b"".join(pending), []
        if name.endswith("/json") and size < CHUNK:
            body = read_exact(src, data_len)
            layers.see_json(name, body[:size])
            for s in sinks:
                s.write(meta + header + body)
            continue
        takers = []
        for s in sinks:
            if layers.held(name, s.have):
                s.skipped += BLOCK + len(meta) + data_len
                s.layers_skipped += 1
            else:
                takers.append(s)
                s.write(meta + header)
        left = data_len
        while left:
            data = src.read(min(CHUNK, left))
            if not data:
                raise EOFError("the archive ends early")
            left -= len(data)
            for s in takers:
                s.write(data)
        if all(s.error for s in sinks):
            raise OSError("every worker's stream broke")


def source(spec, diff_ids):
    """The process whose stdout is the archive: the layer store when it can be read (directly, or
    in a throwaway container of the image itself for users who are in the docker group but cannot
    read Docker's folder), else `docker save`. Only the layers some worker lacks are read."""
    store = spec.get("store")
    if store:
        left_out = set.intersection(*(carried(w) for w in spec["workers"]))
        job = json.dumps({**store, "tag": spec["image"],
                          "need": [c for c in chain_ids(diff_ids) if c not in left_out]})
        readable = os.access(os.path.join(store["root"], "image", store["driver"], "imagedb"), os.R_OK | os.X_OK)
        if readable and store.get("via") != "container":
            return "layer store", subprocess.Popen([sys.executable, LAYERSTORE, job],
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # the image itself reads it, when it has a python3
        deployment = spec.get("deployment", "imagestream")
        run = ["docker", "run", "--rm", "-i", "--label", f"sparkbook={deployment}", "--network", "none",
               "-v", f"{store['root']}:{store['root']}:ro", "--entrypoint", "python3", spec["image"]]
        if subprocess.run(run + ["-c", ""], capture_output=True).returncode == 0:
            with open(LAYERSTORE, "rb") as program:
                return "layer store (read in a container)", subprocess.Popen(
                    run[:4] + ["--name", f"sparkbook-{deployment}-image-read"] + run[4:] + ["-", job],
                    stdin=program, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return "docker save", subprocess.Popen(["docker", "save", spec["image"]], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE)


def feed(src, diff_ids, sinks):
    """The archive ``src`` split into the sinks, with every worker's PROGRESS each second; the error
    that cut it short, or None."""
    done = threading.Event()

    def report():
        while not done.wait(1.0):
            progress(sinks)

    threading.Thread(target=report, daemon=True).start()
    try:
        split(src, Layers(diff_ids), sinks)
        return None
    except (EOFError, ValueError, OSError) as e:
        return str(e)
    finally:
        done.set()


def progress(sinks):
    for s in sinks:
        if not s.feeds:  # a relay reports its own worker
            say("PROGRESS", s.name, s.sent, s.skipped, s.expected, s.wire)


def end(sinks, failed, source):
    """Every sink closed (stopped when ``failed``), then each worker's DONE as soon as it ends
    (each in its own thread: a stuck worker delays no other's end)."""
    def one(s):
        s.close(failed)
        for record in s.finish(source):
            if record["name"] == s.name and not s.feeds:
                progress([s])
            say("DONE", json.dumps(record))

    threads = [threading.Thread(target=one, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def rchar():
    """The bytes this process has read: rchar of /proc/self/io, every read(2) of every thread, pipes
    included (-1 where the kernel does not say). Taken before the children are reaped: the kernel
    then adds each one's reads to its parent's (an SSH client reads its whole stream)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return -1


def stream(spec):
    """On the head: one read of the image into the workers it feeds (and through them, the rest)."""
    diff_ids, size = inspect(spec["image"])
    chains = chain_ids(diff_ids)
    for w in tree(spec["workers"]):
        w["expected"] = expected_bytes(spec, diff_ids, size, set(w["have"]))
        w["held"] = sum(c in w["have"] for c in chains)
    how, save = source(spec, diff_ids)
    widen(save.stdout)
    say("SOURCE", how)
    job = {"diff_ids": diff_ids, "source": how, "from": spec.get("from", "the head"),
           "stall_s": spec.get("stall_s", STALL_S), "transport": spec.get("transport", "ssh")}
    sinks = [Sink(w, job) for w in spec["workers"]]
    failed = feed(save.stdout, diff_ids, sinks)
    read = rchar()
    if failed:
        save.kill()
    code = save.wait()
    said = save.stderr.read().decode(errors="replace").strip()
    if failed and said:
        failed += f" ({how}: {said.splitlines()[-1]})"
    if code != 0 and failed is None:
        failed = f"{how} exited {code}: {said}"
    end(sinks, failed, how)
    say("READ", read)


def relay(spec):
    """On a worker: the archive from stdin into this worker's `docker load` and on to those it feeds."""
    job = {"diff_ids": spec["diff_ids"], "source": spec["source"], "from": spec["name"],
           "stall_s": spec.get("stall_s", STALL_S), "transport": spec.get("transport", "ssh")}
    own = {k: spec[k] for k in ("name", "have", "expected", "held")}
    sinks = [Sink(own, job)] + [Sink(w, job) for w in spec["feeds"]]
    end(sinks, feed(sys.stdin.buffer, spec["diff_ids"], sinks), spec["source"])


def probe(spec):
    """Throughput of the raw SSH pipe to each worker and of zstd -1 on this node, in MB/s."""
    sample = bytearray()
    for root, _dirs, files in os.walk(os.path.dirname(os.__file__)):
        for f in files:
            try:
                with open(os.path.join(root, f), "rb") as fh:
                    sample += fh.read()
            except OSError:
                continue
            if len(sample) >= 64 << 20:
                break
        if len(sample) >= 64 << 20:
            break
    out = {"pipe_mb_s": {}}
    t = time.monotonic()
    z = subprocess.run(["zstd", "-q", "-1", "-T0", "-c"], input=bytes(sample), capture_output=True)
    if z.returncode == 0:
        out["zstd_mb_s"] = len(sample) / (time.monotonic() - t) / 1e6
        out["zstd_ratio"] = len(z.stdout) / max(len(sample), 1)
    zeros = bytes(CHUNK)
    for w in spec["workers"]:
        t = time.monotonic()
        p = subprocess.Popen(w["ssh"] + ["cat >/dev/null"], stdin=subprocess.PIPE)
        try:
            for _ in range(128):
                p.stdin.write(zeros)
            p.stdin.close()
        except OSError:
            pass
        if p.wait() == 0:
            out["pipe_mb_s"][w["name"]] = 128 * CHUNK / (time.monotonic() - t) / 1e6
    print("PROBE", json.dumps(out), flush=True)


if __name__ == "__main__":
    {"stream": stream, "relay": relay, "probe": probe}[sys.argv[1]](json.loads(sys.argv[2]))
