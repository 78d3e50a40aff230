"""A small local stand-in for the Hugging Face hub: one folder served as one model repository at
one fixed commit, enough of the hub's file API for huggingface_hub (``snapshot_download``,
``hf_hub_download``, ``HfApi.model_info``) and sparkbook's ``scripts/hub_download.py`` to work
against ``HF_ENDPOINT=http://ADDR:PORT``. For tests and the lab: no hub is reachable from here.

What it answers, as huggingface_hub reads it (huggingface_hub 2.4.0: ``hf_api.py``
``model_info``/``list_repo_tree``/``RepoSibling``/``RepoFile``, ``file_download.py``
``get_hf_file_metadata``/``http_get``, ``utils/_http.py`` ``hf_raise_for_status``; 0.30's
``get_hf_file_metadata`` reads the same headers):

- ``GET /api/models/REPO`` and ``/api/models/REPO/revision/REV``: ``id``, ``sha`` (the commit) and
  ``siblings`` (``rfilename``, ``size``, ``blobId``, and ``lfs`` {``size``, ``sha256``,
  ``pointerSize``} for LFS files);
- ``GET /api/models/REPO/tree/REV[/PATH]`` (``?recursive=true``): ``type``, ``path``, ``size``,
  ``oid`` and ``lfs`` {``oid``, ``size``, ``pointerSize``}, one page (no ``Link`` header);
- ``HEAD``/``GET /REPO/resolve/REV/PATH``: ``X-Repo-Commit``, ``ETag`` (the git blob ID, or the
  sha256 of an LFS file, which also gets ``X-Linked-Etag``/``X-Linked-Size``), ``Content-Length``,
  ``Accept-Ranges: bytes``; a ``Range: bytes=N-[M]`` request gets ``206`` with ``Content-Range``,
  one past the end ``416``;
- errors as the hub words them: ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound`` /
  ``EntryNotFound``, and with a token required, ``401`` (no token: ``RepoNotFound``, as the hub
  hides private repositories; a wrong one: ``X-Error-Message: Invalid credentials in Authorization
  header``).

Files are LFS files as on the hub by default (weights by their suffix, anything from 10 MiB).
It counts the body bytes sent per file (``sent``), records every request (``requests``), and
``cut_after(n)`` makes the next file transfer longer than n bytes stop after n, once (the connection closed
mid-body), to test resuming.

    with HubServer(folder, repo="org/model", token="...") as hub:   # hub.endpoint, hub.port
        ...

    python -m sparkbook.lab.hubserver DIR --repo NAME [--bind ADDR] [--port P] [--token-env VAR]
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".model")
LFS_FROM = 10 << 20
CHUNK = 64 << 10


def git_blob_id(data: bytes) -> str:
    """git's object ID of a blob: sha1 of ``blob SIZE\\0`` and the content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One file of the repository."""
    path: Path
    size: int
    blob_id: str             # git's ID of the file (of its LFS pointer for an LFS file)
    sha256: str | None       # the content's sha256, for an LFS file
    pointer_size: int = 0

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


def scan(folder: Path) -> dict[str, Entry]:
    """Every regular file under ``folder`` (but huggingface_hub's ``.cache/huggingface``)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        if not p.is_file() or name.startswith(".cache/huggingface/"):
            continue
        size = p.stat().st_size
        sha, blob = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
                blob.update(block)
        if p.suffix in LFS_SUFFIXES or size >= LFS_FROM:
            pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha.hexdigest()}\n"
                       f"size {size}\n").encode()
            out[name] = Entry(p, size, git_blob_id(pointer), sha.hexdigest(), len(pointer))
        else:
            out[name] = Entry(p, size, blob.hexdigest(), None)
    return out


class HubServer:
    """``folder`` as the repository ``repo`` at one commit, on ``bind``:``port`` (0: any free)."""

    def __init__(self, folder: str | Path, repo: str, token: str | None = None,
                 bind: str = "127.0.0.1", port: int = 0):
        if ipaddress.ip_address(bind).is_unspecified:
            raise ValueError("bind the hub server to one address, not to every interface")
        self.folder, self.repo, self.token = Path(folder), repo, token
        self.files = scan(self.folder)
        listing = json.dumps([[n, e.blob_id] for n, e in self.files.items()]).encode()
        self.commit = hashlib.sha1(listing).hexdigest()
        self.sent: Counter[str] = Counter()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.lock = threading.Lock()
        self._cut: int | None = None
        self.httpd = ThreadingHTTPServer((bind, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self.httpd.server_address[0]

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def endpoint(self) -> str:
        """What ``HF_ENDPOINT`` is set to."""
        return f"http://{self.address}:{self.port}"

    @property
    def size(self) -> int:
        return sum(e.size for e in self.files.values())

    @property
    def sent_total(self) -> int:
        return sum(self.sent.values())

    def cut_after(self, nbytes: int) -> None:
        """The next file transfer longer than ``nbytes`` stops after ``nbytes`` of its body, once."""
        self._cut = nbytes

    def reset(self) -> None:
        """Counters and request log to zero."""
        with self.lock:
            self.sent.clear()
            self.requests.clear()

    def start(self) -> "HubServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: tests read hub.requests
            pass

        def do_HEAD(self) -> None:
            self.route(head=True)

        def do_GET(self) -> None:
            self.route(head=False)

        def reply(self, status: int, body: bytes = b"", headers: dict | None = None,
                  head: bool = False) -> None:
            self.send_response(status)
            for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def error(self, status: int, code: str | None, message: str, head: bool) -> None:
            headers = {"X-Error-Message": message, "Content-Type": "application/json"}
            if code:
                headers["X-Error-Code"] = code
            self.reply(status, json.dumps({"error": message}).encode(), headers, head)

        def route(self, head: bool) -> None:
            path, _, query = self.path.partition("?")
            with hub.lock:
                hub.requests.append((self.command, path, self.headers.get("Range")))
            if hub.token is not None:
                given = self.headers.get("Authorization")
                if given is None:
                    return self.error(401, "RepoNotFound", "Repository not found", head)
                if given != f"Bearer {hub.token}":
                    return self.error(401, None, "Invalid credentials in Authorization header", head)
            api = f"/api/models/{hub.repo}"
            resolve = f"/{hub.repo}/resolve/"
            if path == api or path.startswith(api + "/revision/"):
                rev = unquote(path[len(api + "/revision/"):]) if path != api else "main"
                if self.revision_ok(rev, head):
                    self.reply(200, json.dumps(self.info()).encode(),
                               {"Content-Type": "application/json"}, head)
            elif path.startswith(api + "/tree/"):
                rev, _, sub = path[len(api + "/tree/"):].partition("/")
                if self.revision_ok(unquote(rev), head):
                    recursive = parse_qs(query).get("recursive", ["false"])[0].lower() in ("true", "1")
                    self.reply(200, json.dumps(self.tree(unquote(sub), recursive)).encode(),
                               {"Content-Type": "application/json"}, head)
            elif path.startswith(resolve):
                rev, _, name = path[len(resolve):].partition("/")
                if self.revision_ok(unquote(rev), head):
                    self.resolve(unquote(name), head)
            else:
                self.error(404, "RepoNotFound", "Repository not found", head)

        def revision_ok(self, rev: str, head: bool) -> bool:
            if rev in ("main", hub.commit):
                return True
            self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return False

        def info(self) -> dict:
            siblings = []
            for name, e in hub.files.items():
                s = {"rfilename": name, "size": e.size, "blobId": e.blob_id}
                if e.sha256:
                    s["lfs"] = {"size": e.size, "sha256": e.sha256, "pointerSize": e.pointer_size}
                siblings.append(s)
            return {"_id": hub.commit[:24], "id": hub.repo, "modelId": hub.repo, "sha": hub.commit,
                    "private": hub.token is not None, "gated": False, "disabled": False,
                    "tags": [], "siblings": siblings}

        def tree(self, sub: str, recursive: bool) -> list[dict]:
            prefix = sub.strip("/") + "/" if sub.strip("/") else ""
            out, folders = [], set()
            for name, e in hub.files.items():
                if not name.startswith(prefix):
                    continue
                rest = name[len(prefix):].split("/")
                for i in range(1, len(rest) if recursive else min(len(rest), 2)):
                    folders.add(prefix + "/".join(rest[:i]))
                if len(rest) > 1 and not recursive:
                    continue
                item = {"type": "file", "oid": e.blob_id, "size": e.size, "path": name}
                if e.sha256:
                    item["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": e.pointer_size}
                out.append(item)
            dirs = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0,
                     "path": d} for d in sorted(folders)]
            return dirs + out

        def resolve(self, name: str, head: bool) -> None:
            e = hub.files.get(name)
            if e is None:
                return self.error(404, "EntryNotFound", f"{name} does not exist at {hub.commit}", head)
            headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{e.etag}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if e.sha256:
                headers.update({"X-Linked-Etag": f'"{e.sha256}"', "X-Linked-Size": str(e.size)})
            start, end, status = 0, e.size - 1, 200
            asked = self.headers.get("Range")
            if asked:
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", asked.strip())
                if not m or int(m.group(1)) >= e.size:
                    headers["Content-Range"] = f"bytes */{e.size}"
                    return self.reply(416, b"", headers, head)
                start, status = int(m.group(1)), 206
                end = min(int(m.group(2)), e.size - 1) if m.group(2) else e.size - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{e.size}"
            length = end - start + 1
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(length)}.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                return
            limit = length
            with hub.lock:  # the first transfer longer than the cut is cut
                if hub._cut is not None and hub._cut < length:
                    limit, hub._cut = hub._cut, None
            try:
                with e.path.open("rb") as f:
                    f.seek(start)
                    left = limit
                    while left > 0:
                        block = f.read(min(CHUNK, left))
                        if not block:
                            break
                        self.wfile.write(block)
                        left -= len(block)
                        with hub.lock:
                            hub.sent[name] += len(block)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            if limit < length:  # cut: the client sees the connection end mid-body
                self.close_connection = True

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Serve a folder as one Hugging Face hub model repository "
                                             "(HF_ENDPOINT=http://ADDR:PORT).")
    ap.add_argument("dir", type=Path)
    ap.add_argument("--repo", required=True, help="the repository id, e.g. org/model")
    ap.add_argument("--bind", default="127.0.0.1", help="one address (never every interface)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token-env", default=None,
                    help="require the token held by this environment variable")
    args = ap.parse_args(argv)
    token = os.environ.get(args.token_env) if args.token_env else None
    if args.token_env and not token:
        ap.error(f"${args.token_env} is not set")
    try:
        hub = HubServer(args.dir, args.repo, token, args.bind, args.port)
    except (ValueError, OSError) as e:
        ap.error(str(e))
    print(f"serving {args.dir} as {hub.repo} at commit {hub.commit} ({len(hub.files)} files) on "
          f"{hub.endpoint}: HF_ENDPOINT={hub.endpoint}", flush=True)
    try:
        hub.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.httpd.server_close()


if __name__ == "__main__":
    main()
