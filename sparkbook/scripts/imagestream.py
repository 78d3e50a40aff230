#!/usr/bin/env python3
"""Stream one `docker save` of an image into `docker load` on several workers at once, leaving out of
each worker's stream the layers it already holds. Runs on the head node (sparkbook copies it there);
standard library only, no file written: the archive flows from `docker save` through this process
into one `ssh WORKER docker load` per worker.

Why leaving layers out works: `docker load` (classic image store) looks each layer up by its chain ID
before it opens the layer's file, so an archive whose already-present layers are absent loads to the
same image ID. The layers are named in the archive either `blobs/sha256/<diff id>` (Docker 25 and
later, OCI layout) or `<v1 id>/layer.tar` (earlier), where the v1 ID of every layer but the top one
is the digest of a fixed JSON document holding the chain ID (moby image/tarexport/save.go,
image/v1/imagev1.go CreateID), and the top one is the folder whose `json` names that layer as its
parent. A layer is left out only when its name matches a computed digest exactly, so a format this
script does not know costs the saving, never correctness.

Usage: imagestream.py stream SPEC_JSON   (SPEC: {"image", "store": where to read layers or null
                                          for `docker save`, "workers": [{"name", "ssh": [argv],
                                          "have": [chain ids], "zstd": bool}]})
       imagestream.py probe SPEC_JSON    (pipe and zstd throughput, for the compression choice)
       imagestream.py assemble SPEC_JSON (a `docker load` archive from the layer store, to stdout)
Lines on stdout: SOURCE how / PROGRESS name sent skipped expected wire / DONE {json per worker} / PROBE {json}.
"""

import base64
import collections
import gzip
import hashlib
import json
import os
import shlex
import tarfile
import subprocess
import sys
import threading
import time

BLOCK = 512
CHUNK = 1 << 20
# The v1 config of every layer but the top one: a zero image, created at the epoch (moby save.go).
ZERO_CONFIG = ('{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,'
               '"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,'
               '"Cmd":null,"Image":"","Volumes":null,"WorkingDir":"","Entrypoint":null,'
               '"OnBuild":null,"Labels":null}')
LOAD = "set -o pipefail; {}docker load"


def chain_ids(diff_ids):
    """ChainID(L0) = DiffID(L0); ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln))."""
    out = []
    for d in diff_ids:
        out.append(d if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def v1_ids(diff_ids):
    """The names `docker save` (before Docker 25) gives the layer folders, but for the top layer."""
    out, parent = [], None
    for chain in chain_ids(diff_ids)[:-1]:
        doc = ('{"container_config":' + ZERO_CONFIG + ',"created":"1970-01-01T00:00:00Z",'
               f'"layer_id":"{chain}"' + (f',"parent":"{parent}"' if parent else "") + "}")
        parent = "sha256:" + hashlib.sha256(doc.encode()).hexdigest()
        out.append(parent)
    return out


class Layers:
    """Which archive member is which layer of the image, for both archive layouts."""

    def __init__(self, diff_ids):
        self.chains = chain_ids(diff_ids)
        v1 = v1_ids(diff_ids)
        self.names = collections.defaultdict(list)
        for i, d in enumerate(diff_ids):
            self.names["blobs/sha256/" + d.split(":")[1]].append(i)
        for i, v in enumerate(v1):
            self.names[v.split(":")[1] + "/layer.tar"].append(i)
        # The top layer's folder name cannot be computed (it digests the image's whole config),
        # but its `json`, which precedes its layer.tar, names as parent the layer below it.
        self.top_parent = v1[-1].split(":")[1] if v1 else None
        self.single = len(diff_ids) == 1

    def see_json(self, name, data):
        """Learn the top layer's folder from a `<folder>/json` member."""
        folder = name[:-len("/json")]
        if "/" in folder or folder + "/layer.tar" in self.names:
            return
        try:
            parent = json.loads(data).get("parent")
        except ValueError:
            return
        if parent == self.top_parent or (self.single and parent is None):
            self.names[folder + "/layer.tar"].append(len(self.chains) - 1)

    def held(self, name, have):
        """Whether ``name`` is a layer whose every use in the image is already in ``have``."""
        idx = self.names.get(name)
        return bool(idx) and all(self.chains[i] in have for i in idx)


def octal(field):
    if field[0] & 0x80:  # base-256 (GNU) for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0")[0].strip()
    return int(text, 8) if text else 0


def padded(size):
    return (size + BLOCK - 1) // BLOCK * BLOCK


def read_exact(f, n):
    buf = bytearray()
    while len(buf) < n:
        part = f.read(n - len(buf))
        if not part:
            raise EOFError(f"archive ends early ({len(buf)} of {n} bytes)")
        buf += part
    return bytes(buf)


class Sink:
    """One worker: `ssh WORKER docker load`, behind a local zstd when compressing."""

    def __init__(self, spec):
        self.name, self.have = spec["name"], set(spec.get("have", ()))
        self.sent = self.skipped = 0
        self.layers_skipped = 0
        self.error = None
        self.tail = collections.deque(maxlen=20)
        remote = LOAD.format("zstd -q -d -c | " if spec.get("zstd") else "")
        self.zstd = None
        self.wire = 0  # bytes that went into ssh (after zstd, when compressing)
        self.ssh = subprocess.Popen(spec["ssh"] + ["bash -c " + shlex.quote(remote)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.threads = [threading.Thread(target=self._read, daemon=True)]
        if spec.get("zstd"):
            self.zstd = subprocess.Popen(["zstd", "-q", "-1", "-T0", "-c"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
            self.threads.append(threading.Thread(target=self._pump, daemon=True))
        self.pipe = self.zstd.stdin if self.zstd else self.ssh.stdin
        for t in self.threads:
            t.start()

    def _pump(self):
        """zstd's output into ssh, counted."""
        try:
            while True:
                data = self.zstd.stdout.read1(CHUNK)
                if not data:
                    break
                self.ssh.stdin.write(data)
                self.wire += len(data)
        except OSError as e:
            self.error = self.error or f"the stream to {self.name} broke: {e}"
        finally:
            try:
                self.ssh.stdin.close()
            except OSError:
                pass

    def _read(self):
        for line in self.ssh.stdout:
            self.tail.append(line.decode(errors="replace").rstrip())

    def write(self, data):
        if self.error is None:
            try:
                self.pipe.write(data)
                self.sent += len(data)
                if not self.zstd:
                    self.wire = self.sent
            except (BrokenPipeError, OSError) as e:
                self.error = f"the stream to {self.name} broke: {e}"

    def finish(self, failed=None):
        self.error = self.error or failed
        try:
            self.pipe.close()
        except OSError:
            pass
        if self.error and failed:  # the archive is incomplete: make sure nothing is loaded from it
            for p in (self.zstd, self.ssh):
                if p and p.poll() is None:
                    p.kill()
        if self.zstd:
            self.zstd.wait()
        for t in self.threads[1:]:
            t.join()
        code = self.ssh.wait()
        self.threads[0].join(5)
        if code != 0 and not self.error:
            self.error = f"docker load on {self.name} exited {code}"
        return {"name": self.name, "code": code, "sent": self.sent, "wire": self.wire,
                "skipped": self.skipped,
                "layers_skipped": self.layers_skipped, "error": self.error, "output": list(self.tail)}


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


# ------------------------------------------------------------------ the archive from the layer store

def layer_parts(layerdb, diffdir):
    """The exact bytes of a layer's tar, as (raw bytes | (path, size)) parts, from the layer's
    tar-split record (the tar's headers and padding, kept by Docker when it stored the layer) and
    the files in its folder; and their total size. This is how Docker itself rebuilds a layer for
    `docker save` (vbatts/tar-split, asm.WriteOutputTarStream); `docker load` checks the result
    against the layer's diff ID."""
    parts, size = [], 0
    with gzip.open(os.path.join(layerdb, "tar-split.json.gz"), "rt") as f:
        for line in f:
            e = json.loads(line)
            if e["type"] == 2:  # a segment: raw tar bytes
                data = base64.b64decode(e["payload"])
                parts.append(data)
                size += len(data)
            elif e.get("size"):  # a file's content, from the layer's folder
                name = e.get("name") or base64.b64decode(e["name_raw"]).decode("utf-8", "surrogateescape")
                parts.append((os.path.join(diffdir, os.path.normpath("/" + name).lstrip("/")), e["size"]))
                size += e["size"]
    return parts, size


def header(name, size):
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def assemble(spec):
    """Write a `docker load` archive of the image to stdout straight from the daemon's layer store
    (overlay2), with only the layers in ``need`` (chain IDs): no `docker save`, which first copies
    every layer into a temporary folder. Exits non-zero when the store is not as expected."""
    root, driver, ident = spec["root"], spec["driver"], spec["image_id"].split(":")[1]
    base = os.path.join(root, "image", driver)
    with open(os.path.join(base, "imagedb", "content", "sha256", ident), "rb") as f:
        config = f.read()
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    chains = chain_ids(diff_ids)
    need = set(spec["need"])
    out = sys.stdout.buffer
    names = ["blobs/sha256/" + d.split(":")[1] for d in diff_ids]
    for chain, name in zip(chains, names):
        if chain not in need:
            continue
        layerdb = os.path.join(base, "layerdb", "sha256", chain.split(":")[1])
        with open(os.path.join(layerdb, "cache-id")) as f:
            diffdir = os.path.join(root, driver, f.read().strip(), "diff")
        parts, size = layer_parts(layerdb, diffdir)
        out.write(header(name, size))
        for part in parts:
            if isinstance(part, bytes):
                out.write(part)
                continue
            path, left = part
            with open(path, "rb") as f:
                while left:
                    data = f.read(min(CHUNK, left))
                    if not data:
                        raise SystemExit(f"{path} is shorter than its layer says")
                    out.write(data)
                    left -= len(data)
        out.write(bytes(padded(size) - size))
    manifest = json.dumps([{"Config": ident + ".json", "RepoTags": [spec["tag"]], "Layers": names}]).encode()
    for name, data in ((ident + ".json", config), ("manifest.json", manifest)):
        out.write(header(name, len(data)) + data + bytes(padded(len(data)) - len(data)))
    out.write(bytes(2 * BLOCK))
    out.flush()


def source(spec, diff_ids):
    """The process whose stdout is the archive: the layer store when it can be read (directly, or
    in a throwaway container of the image itself for users who are in the docker group but cannot
    read Docker's folder), else `docker save`."""
    store = spec.get("store")
    if store:
        chains = chain_ids(diff_ids)
        held_by_all = set.intersection(*[set(w.get("have", ())) for w in spec["workers"]])
        job = json.dumps({**store, "tag": spec["image"], "need": [c for c in chains if c not in held_by_all]})
        me = os.path.abspath(__file__)
        readable = os.access(os.path.join(store["root"], "image", store["driver"], "imagedb"), os.R_OK | os.X_OK)
        if readable and store.get("via") != "container":
            return "layer store", subprocess.Popen([sys.executable, me, "assemble", job],
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # the image itself reads it, when it has a python3
        run = ["docker", "run", "--rm", "-i", "--label", "sparkbook=imagestream", "--network", "none",
               "-v", f"{store['root']}:{store['root']}:ro", "--entrypoint", "python3", spec["image"]]
        if subprocess.run(run + ["-c", ""], capture_output=True).returncode == 0:
            return "layer store (read in a container)", subprocess.Popen(
                run + ["-", "assemble", job], stdin=open(me, "rb"), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE)
    return "docker save", subprocess.Popen(["docker", "save", spec["image"]], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE)


def expected_bytes(spec, diff_ids, size, have):
    """About how many archive bytes a worker holding ``have`` needs (for the ETA): the layer store's
    size of each missing layer when it can be read, else the whole image."""
    store = spec.get("store")
    if not store:
        return size
    total = 0
    for chain in chain_ids(diff_ids):
        if chain in have:
            continue
        try:
            with open(os.path.join(store["root"], "image", store["driver"], "layerdb", "sha256",
                                   chain.split(":")[1], "size")) as f:
                total += int(f.read())
        except (OSError, ValueError):
            return size
    return total


def stream(spec):
    diff_ids, size = inspect(spec["image"])
    sinks = [Sink(w) for w in spec["workers"]]
    for s in sinks:
        s.expected = expected_bytes(spec, diff_ids, size, s.have)
        s.held = sum(c in s.have for c in chain_ids(diff_ids))
    how, save = source(spec, diff_ids)
    print("SOURCE", how, flush=True)
    done = threading.Event()

    def report():
        while not done.wait(1.0):
            for s in sinks:
                print("PROGRESS", s.name, s.sent, s.skipped, s.expected, s.wire, flush=True)

    threading.Thread(target=report, daemon=True).start()
    failed = None
    try:
        split(save.stdout, Layers(diff_ids), sinks)
    except (EOFError, ValueError, OSError) as e:
        failed = str(e)
    if failed:
        save.kill()
    code = save.wait()
    said = save.stderr.read().decode(errors="replace").strip()
    if failed and said:
        failed += f" ({how}: {said.splitlines()[-1]})"
    if code != 0 and failed is None:
        failed = f"{how} exited {code}: {said}"
    done.set()
    for s in sinks:
        print("PROGRESS", s.name, s.sent, s.skipped, s.expected, s.wire, flush=True)
        print("DONE", json.dumps({**s.finish(failed), "source": how, "held": s.held}), flush=True)


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
    {"stream": stream, "probe": probe, "assemble": assemble}[sys.argv[1]](json.loads(sys.argv[2]))
