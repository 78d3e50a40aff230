"""The manifest of a model folder on a node: one line "SIZE<TAB>-<TAB>PATH" per file (sorted by
path), then "#PATH<TAB>SHA256" for the hashed files, then "!read<TAB>BYTES<TAB>FILES" (what was read
to hash them); or "absent" when the folder does not exist.

Left out: .cache/huggingface, huggingface_hub's bookkeeping of a download into the folder (and
sparkbook's partial files of one), which differs from node to node and is never copied; every
folder named PARTIAL_DIR, where the model sync keeps an interrupted copy's partial files; and what
is not a regular file (symbolic links are not followed, as `find -type f`).

Every file is hashed (SHA-256) with ``all``, the config-like ones with ``config``, on several
threads at once (hashlib lets go of the interpreter while it hashes, so a fast disk is read in
parallel). With a CACHE file, a digest is kept per file by (device, inode) with its size,
modification time and change time, and a file whose four are unchanged is not read again: a second
manifest of a model that did not change reads nothing. The change time is kept because a program
that writes a file and then sets its modification time back (``touch -d``, rsync's -t) cannot set
it back. A digest is kept only where the file's four read the same after it was hashed and its
change time is RACY_S older than the manifest's start: a write in the same tick of the file
system's clock as the listing would leave all four unchanged (git's "racily clean" entries; 2 s
is FAT's tick), so a file changed just before a manifest is read again by the next one. An
unreadable folder is an error, never a shorter list. The cache is kept only in a folder of this
user's own, private (mode 0700), not a link, in a parent alike: sparkbook's working folder (made
where absent, as workdir.sh makes it); anywhere else it is ignored.

Usage: python3 model_manifest.py MODEL_DIR all|config PARTIAL_DIR [CACHE]
  e.g. python3 model_manifest.py /models/Qwen3-8B all .sparkbook-partial /tmp/sparkbook-me/pair/digests.json
Runs with the node's python3 (3.8 or later), nothing else.
"""

import hashlib
import json
import os
import re
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor

CONFIG_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".py", ".tiktoken")
CHUNK = 8 << 20
THREADS = max(1, min(8, os.cpu_count() or 1))
RACY_S = 2  # a change time this recent may hide a write in the same tick of the file system's clock
SHA256 = re.compile(r"[0-9a-f]{64}")


def raise_error(e):
    raise e


def walk(root, partial):
    """(relative path, stat) of every regular file under ``root``, the left-out folders pruned."""
    out = []
    for top, dirs, files in os.walk(root, onerror=raise_error):
        rel_top = os.path.relpath(top, root)
        dirs[:] = sorted(d for d in dirs if d != partial
                         and os.path.normpath(os.path.join(rel_top, d)) != os.path.join(".cache", "huggingface"))
        for name in files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                out.append((os.path.normpath(os.path.join(rel_top, name)), st))
    return sorted(out)


def mark(st):
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def digest(path):
    """The file's SHA-256 and its mark (size, mtime, ctime) once read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
        return h.hexdigest(), mark(os.fstat(f.fileno()))


def valid(entry):
    """A cache entry as save_cache writes it: [size, mtime_ns, ctime_ns, sha256]."""
    return (isinstance(entry, list) and len(entry) == 4 and all(type(v) is int for v in entry[:3])
            and isinstance(entry[3], str) and SHA256.fullmatch(entry[3]) is not None)


def private_folder(path):
    """Whether ``path`` and its parent are folders of this user's that nobody else may enter (not
    links), as sparkbook's working folder is (workdir.sh's rules); made so where absent."""
    old = os.umask(0o077)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    finally:
        os.umask(old)
    for folder in (os.path.dirname(path), path):
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return False
    return True


def load_cache(path):
    if not path or not private_folder(os.path.dirname(path)):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_cache(path, entries):
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f)
    os.replace(tmp, path)


def main(argv):
    root, scope, partial = argv[0], argv[1], argv[2]
    cache_path = argv[3] if len(argv) > 3 else ""
    if not os.path.isdir(root):
        print("absent")
        return 0
    start = time.time_ns()
    files = walk(root, partial)
    for rel, st in files:
        print(f"{st.st_size}\t-\t{rel}")
    wanted = [(rel, st) for rel, st in files if scope == "all" or rel.endswith(CONFIG_SUFFIXES)]
    cache = load_cache(cache_path)
    settled = start - RACY_S * 10**9
    known, todo, keep = {}, [], {}
    for rel, st in wanted:
        key = f"{st.st_dev}:{st.st_ino}"
        hit = (cache or {}).get(key)
        if valid(hit) and hit[:3] == mark(st):
            known[rel], keep[key] = hit[3], hit
        else:
            todo.append((rel, st))
    with ThreadPoolExecutor(THREADS) as pool:
        fresh = list(pool.map(lambda f: digest(os.path.join(root, f[0])), todo))
    for (rel, st), (sha, after) in zip(todo, fresh):
        known[rel] = sha
        if after == mark(st) and st.st_ctime_ns < settled:
            keep[f"{st.st_dev}:{st.st_ino}"] = [*after, sha]
    for rel, _ in wanted:
        print(f"#{rel}\t{known[rel]}")
    print(f"!read\t{sum(st.st_size for _, st in todo)}\t{len(todo)}")
    if cache is not None:
        try:
            save_cache(cache_path, keep)
        except OSError as e:
            print(f"model_manifest: digest cache not written: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
