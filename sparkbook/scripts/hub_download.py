#!/usr/bin/env python3
"""Download one Hugging Face hub model repository, at one revision, into a folder: resumable,
verified, with progress. Runs on the head node (sparkbook runs it with `python3 -c`, in a container
of the serving image or with the runtime's venv); it needs `huggingface_hub` (any version from
0.30: only `HfApi.model_info`, `hf_hub_url` and `build_hf_headers` are used).

The revision is resolved to a commit once, and every file is fetched at that commit, so a branch
that moves during the download cannot mix two versions. huggingface_hub lists the files (sizes, git
blob IDs, LFS sha256); the files themselves come over plain HTTP(S) from the hub's `resolve` route
(redirects to its CDN followed, the token never sent to another scheme, host or port), because
huggingface_hub from 1.x on no longer resumes a download across runs (it writes each file to a
process-unique temporary file and removes it on failure). Here a partial file waits in
`DIR/.cache/huggingface/sparkbook/` (the folder huggingface_hub uses for its own bookkeeping of a
`local_dir`, which sparkbook's manifest and model sync leave out) and the next run continues it with
an HTTP Range request. Each file is checked against the hub's digest while it arrives (the LFS
sha256, or the git blob ID of a small file) before it takes its real name; a file already in DIR
with the right size is verified once and then recorded (size, mtime), so later runs skip it without
reading it. Files of DIR that the revision does not list are left alone.

Usage: hub_download.py [--revision REV] [--interval S] [--workers N] [--env-file FILE] -- REPO DIR
Environment: HF_TOKEN (the token; never an argument), HF_ENDPOINT (a mirror, or a local test hub).
  --env-file FILE: KEY=VALUE lines (docker's --env-file format) added to the environment first.
Lines on stdout: COMMIT sha / PROGRESS bytes_done bytes_total files_done files_total (every
--interval seconds; partial files count) / DONE {json} last: repo, revision, commit, files, total,
fetched (bytes received in this run), fetched_files, seconds, error, kind. Exit 0 when complete.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import http.client
import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

STATE = os.path.join(".cache", "huggingface", "sparkbook")  # partial files and the record, in DIR
RECORD = "files.json"
CHUNK = 1 << 20
# What went wrong, for the operator's remedy (sparkbook.distribution.hub).
KINDS = ("auth", "not-found", "gated", "forbidden", "revision", "network", "disk", "permission",
         "verify", "setup", "other")


class Failure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# -------------------------------------------------------------------------- shared with sparkbook

def parse_line(line: str) -> tuple[str, dict] | None:
    """A line of this program's output (optionally behind a ``[node] `` prefix) as
    ``("PROGRESS", {done, total, files_done, files})``, ``("COMMIT", {commit})`` or ``("DONE", {...})``;
    None for any other line."""
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    word, _, rest = line.strip().partition(" ")
    try:
        if word == "PROGRESS":
            done, total, files_done, files = (int(x) for x in rest.split())
            return word, {"done": done, "total": total, "files_done": files_done, "files": files}
        if word == "COMMIT" and rest:
            return word, {"commit": rest}
        if word == "DONE":
            return word, json.loads(rest)
    except ValueError:
        return None
    return None


# ------------------------------------------------------------------------------------ the files

class RepoFile:
    """One file of the revision: its name, size and the digest the hub gives for it."""

    def __init__(self, name: str, size: int, sha256: str | None, blob_id: str | None):
        if not isinstance(size, int) or size < 0:
            raise Failure("other", f"the hub's listing gives no size for {name!r}")
        parts = name.split("/")
        if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts) \
                or name.startswith(".cache/huggingface/"):
            raise Failure("other", f"refusing a file name outside the model folder: {name!r}")
        self.name, self.size, self.sha256, self.blob_id = name, size, sha256, blob_id
        self.digest = sha256 or blob_id
        self.key = hashlib.sha1(f"{name}\0{self.digest}".encode()).hexdigest()

    def hasher(self):
        """sha256 of the content (LFS files), or git's blob ID (sha1 of "blob SIZE\\0" + content)."""
        if self.sha256:
            return hashlib.sha256()
        h = hashlib.sha1()
        h.update(b"blob %d\0" % self.size)
        return h


def listing(repo: str, revision: str | None) -> tuple[str, list[RepoFile], object, object]:
    """The commit the revision names, its files, and huggingface_hub's URL and header builders."""
    try:
        from huggingface_hub import HfApi, hf_hub_url
        from huggingface_hub.utils import build_hf_headers
    except ImportError as e:
        raise Failure("setup", f"huggingface_hub is not importable by {sys.executable}: {e}") from None
    info = HfApi().model_info(repo, revision=revision, files_metadata=True, timeout=60)
    if not info.sha or info.siblings is None:
        raise Failure("other", f"the hub's answer for {repo} names no commit or no files")
    files = [RepoFile(s.rfilename, s.size, s.lfs["sha256"] if s.lfs else None, s.blob_id)
             for s in info.siblings]
    return info.sha, files, hf_hub_url, build_hf_headers


def _origin(url: str) -> tuple:
    u = urlsplit(url)
    return u.scheme.lower(), u.hostname, u.port


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """Redirects keep the token only on the origin it was meant for: same scheme, host and port
    (the hub sends large files to its CDN with a signed URL, which must not receive it; nor may
    plain HTTP, or another port of the same host, whoever listens there)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if new is not None and auth and _origin(newurl) == _origin(req.full_url):
            new.add_unredirected_header("Authorization", auth)
        return new


class Download:
    """The files of one commit into one folder, a few at a time."""

    def __init__(self, folder: str, commit: str, files: list[RepoFile], url, headers: dict):
        self.folder, self.commit, self.files = folder, commit, files
        self.state = os.path.join(folder, STATE)
        os.makedirs(self.state, exist_ok=True)
        self.url, self.auth = url, headers.pop("authorization", None)
        self.headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
        self.opener = urllib.request.build_opener(_SameOriginAuth())
        self.have = {f.name: 0 for f in files}   # bytes in place or in the partial file
        self.got = {f.name: 0 for f in files}    # bytes received in this run
        self.finished: set[str] = set()
        self.lock = threading.Lock()
        try:
            with open(os.path.join(self.state, RECORD)) as fh:
                self.record = json.load(fh)
        except (OSError, ValueError):
            self.record = {}

    def path(self, f: RepoFile) -> str:
        return os.path.join(self.folder, *f.name.split("/"))

    def partial(self, f: RepoFile) -> str:
        return os.path.join(self.state, f.key + ".incomplete")

    def _remember(self, f: RepoFile) -> None:
        st = os.stat(self.path(f))
        with self.lock:
            self.record[f.name] = {"digest": f.digest, "size": f.size, "mtime_ns": st.st_mtime_ns}
            tmp = os.path.join(self.state, RECORD + ".tmp")
            with open(tmp, "w") as fh:
                json.dump(self.record, fh, indent=1, sort_keys=True)
            os.replace(tmp, os.path.join(self.state, RECORD))
            self.finished.add(f.name)

    def check_space(self) -> None:
        """Enough free space for what is still to come (files of the right size are counted as
        there; they are verified when their turn comes)."""
        need = 0
        for f in self.files:
            if _size(self.path(f)) != f.size:
                need += f.size - min(_size(self.partial(f)) or 0, f.size)
        free = shutil.disk_usage(self.folder).free
        if need > free:
            raise Failure("disk", f"{need / 1e9:.2f} GB still to download, {free / 1e9:.2f} GB free at "
                                  f"{self.folder}")

    def in_place(self, f: RepoFile) -> bool:
        """The file is already in the folder with this revision's content."""
        path = self.path(f)
        if _size(path) != f.size:
            return False
        known = self.record.get(f.name)
        if known == {"digest": f.digest, "size": f.size, "mtime_ns": os.stat(path).st_mtime_ns}:
            return True
        if f.digest:
            h = f.hasher()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(CHUNK), b""):
                    h.update(block)
            if h.hexdigest() != f.digest:
                return False
        self._remember(f)
        return True

    def fetch(self, f: RepoFile) -> None:
        if self.in_place(f):
            self.have[f.name] = f.size
            with self.lock:
                self.finished.add(f.name)
            return
        part = self.partial(f)
        done = _size(part) or 0
        if done > f.size:  # not this file's: start over
            os.unlink(part)
            done = 0
        h = f.hasher()
        if done:
            with open(part, "rb") as fh:
                for block in iter(lambda: fh.read(CHUNK), b""):
                    h.update(block)
        self.have[f.name] = done
        if done < f.size:
            try:
                done, h = self._receive(f, part, done, h)
            except Exception as e:  # named with the file
                kind, message = classify(e)
                raise Failure(kind, f"{f.name}: {message}") from None
        if done != f.size:
            raise Failure("network", f"{f.name}: the hub sent {done} of {f.size} bytes")
        if f.digest and h.hexdigest() != f.digest:
            os.unlink(part)
            raise Failure("verify", f"{f.name}: the content does not match the hub's digest {f.digest}"
                                    " (the partial file was removed; the next run fetches it again)")
        os.makedirs(os.path.dirname(self.path(f)), exist_ok=True)
        os.replace(part, self.path(f))
        self._remember(f)

    def _receive(self, f: RepoFile, part: str, done: int, h):
        req = urllib.request.Request(self.url(f.name), headers=self.headers)
        if self.auth:
            req.add_unredirected_header("Authorization", self.auth)
        if done:
            req.add_header("Range", f"bytes={done}-")
        with self.opener.open(req, timeout=60) as resp:
            if done and resp.status != 206:  # the server ignored the range: from the start
                done, h = 0, f.hasher()
            elif done and not resp.headers.get("Content-Range", "").startswith(f"bytes {done}-"):
                raise Failure("network", f"asked for bytes {done}- and got Content-Range "
                                         f"{resp.headers.get('Content-Range')!r}")
            with open(part, "ab" if done else "wb") as out:
                for block in iter(lambda: resp.read(CHUNK), b""):
                    out.write(block)
                    h.update(block)
                    done += len(block)
                    self.have[f.name] = done
                    self.got[f.name] += len(block)
        return done, h

    def progress(self) -> str:
        with self.lock:
            finished = len(self.finished)
        return (f"PROGRESS {sum(self.have.values())} {sum(f.size for f in self.files)} {finished} "
                f"{len(self.files)}")

    def run(self, workers: int, interval: float) -> None:
        """Every file, ``workers`` at a time; a failing file does not stop the others (their bytes
        are kept), the first failure is raised at the end."""
        self.check_space()
        stop = threading.Event()

        def report() -> None:
            while not stop.wait(interval):
                emit(self.progress())

        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()
        errors = []
        try:
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                for fut in [pool.submit(self.fetch, f) for f in self.files]:
                    if fut.exception() is not None:
                        errors.append(fut.exception())
        finally:
            stop.set()
            reporter.join()
            emit(self.progress())
        if errors:
            raise errors[0]
        for name in os.listdir(self.state):  # what earlier revisions left, now that all is here
            if name.endswith(".incomplete"):
                os.unlink(os.path.join(self.state, name))


def emit(line: str) -> None:
    """One line in one write: a reader that splits its input where the writes end still sees it
    whole (print writes its parts one by one when Python's output is unbuffered)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


# ----------------------------------------------------------------------------- what went wrong

def classify(e: BaseException) -> tuple[str, str]:
    """``(kind, message)`` of a failure, whatever huggingface_hub's version (its error classes
    are recognised by name: they moved between modules)."""
    if isinstance(e, Failure):
        return e.kind, str(e)
    names = {c.__name__ for c in type(e).__mro__}
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None) or getattr(e, "code", None)
    message = " ".join(str(e).split())
    if isinstance(e, urllib.error.HTTPError):
        why = e.headers.get("X-Error-Message") if e.headers else None
        message = f"HTTP {e.code} for {e.url}: {why or e.reason}"
    if "GatedRepoError" in names:
        kind = "gated"
    elif "RevisionNotFoundError" in names:
        kind = "revision"
    elif "RepositoryNotFoundError" in names:
        kind = "not-found"
    elif status in (401, 403, 404):
        kind = {401: "auth", 403: "forbidden", 404: "not-found"}[status]
    elif isinstance(e, OSError) and e.errno == errno.ENOSPC:
        kind = "disk"
    elif isinstance(e, PermissionError):
        kind = "permission"
    elif isinstance(e, (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException)) \
            or names & {"ConnectError", "ConnectionError", "TimeoutException", "Timeout", "ReadTimeout",
                        "RemoteProtocolError", "OfflineModeIsEnabled"}:
        kind = "network"
    else:
        kind = "other"
    if kind == "other":
        message = f"{type(e).__name__}: {message}"
    return kind, message


def masked(text: str) -> str:
    token = os.environ.get("HF_TOKEN")
    return text.replace(token, "********") if token and len(token) >= 4 else text


def load_env_file(path: str) -> None:
    with open(path) as fh:
        for line in fh:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep and key and not key.startswith("#"):
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo")
    ap.add_argument("dir")
    ap.add_argument("--revision", default=None)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--env-file", default=None)
    args = ap.parse_args(argv)
    start = time.monotonic()
    out = {"repo": args.repo, "revision": args.revision, "commit": None, "files": 0, "total": 0,
           "fetched": 0, "fetched_files": 0, "seconds": 0.0, "error": None, "kind": None}
    job = None
    try:
        if args.env_file:  # before huggingface_hub is imported: it reads HF_ENDPOINT then
            load_env_file(args.env_file)
        commit, files, url, headers = listing(args.repo, args.revision)
        out.update(commit=commit, files=len(files), total=sum(f.size for f in files))
        emit(f"COMMIT {commit}")
        os.makedirs(args.dir, exist_ok=True)
        job = Download(args.dir, commit, files, lambda name: url(args.repo, name, revision=commit),
                       dict(headers()))
        job.run(args.workers, args.interval)
    except Exception as e:  # every failure ends in the DONE line, named
        out["kind"], out["error"] = classify(e)
        out["error"] = masked(out["error"])[:600]
    if job is not None:
        out["fetched"] = sum(job.got.values())
        out["fetched_files"] = sum(1 for f in job.files if job.got[f.name] and f.name in job.finished)
    out["seconds"] = round(time.monotonic() - start, 2)
    emit("DONE " + json.dumps(out))
    return 0 if out["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
