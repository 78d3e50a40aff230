"""A run folder read as one received from elsewhere (a bug report, a colleague's run), and pages
written into one.

Every file that ``sparkbook report``, ``compare`` and ``status`` read from a run folder has its shape
in :data:`sparkbook.record.shapes.SHAPES`, checked before anything believes it. A file that is not there reads as None; one
that is there but cannot be believed raises :class:`Unreadable`, which names the file and what is
wrong in one line (``summary.json: steps[0].duration_s: Input should be a valid number (got
'9.5')``): a truncated or non-UTF-8 file, JSON of another shape, a field of another type, a file
over :data:`MAX_BYTES`, a symbolic link, a FIFO. Nothing in the folder is followed through a
symbolic link (each component is opened with ``O_NOFOLLOW``, from the folder down), and a
notebook a summary names must lie in the folder itself.

A page written into a folder (:func:`write`) is a new file renamed over its name: a link or a hard
link planted under that name is replaced, never written through.

:class:`RunFolder` reads the same and keeps what was unreadable (file -> why), for a page that shows
the rest and says what it could not read.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import nbformat

from ..bench.records import Results
from ..book.errors import SparkbookError
from ..book.verdict import Check, Verdict
from ..params.fields import field_path
from .fingerprint import FILE as FINGERPRINT, Fingerprint
from .shapes import SHAPES, NotebookShape, Unreadable, VerdictShape, check, file_name, one_line, shown

__all__ = ["SHAPES", "MAX_BYTES", "MAX_NOTEBOOK_BYTES", "RunFolder", "Unreadable", "check", "fingerprint",
           "notebook", "one_line", "read", "read_bytes", "read_json", "results", "shown", "verdict", "verdicts",
           "write"]

MAX_BYTES = 64 * 1024 * 1024  # a JSON file: a benchmark's results.json keeps every request
MAX_NOTEBOOK_BYTES = 256 * 1024 * 1024  # an executed notebook: its plots are embedded
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


# ---- reading ------------------------------------------------------------------------------------

def _parts(name: str) -> tuple[str, ...]:
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise Unreadable(name, "not a path inside the run folder")
    return parts


def _open(run_dir: Path, name: str, directory: bool = False) -> int | None:
    """A descriptor of ``run_dir/name``, each component below ``run_dir`` opened without following
    a link; None when it is not there."""
    parts = _parts(name)
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Unreadable(name, f"run folder {run_dir}: {e.strerror}") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK if last else 0)  # a FIFO does not block
            flags |= os.O_DIRECTORY if directory or not last else 0
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as e:
                where = "/".join(parts[: i + 1])
                # a link to a folder opened with O_DIRECTORY fails as "not a folder"
                if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and _is_link(fd, part)):
                    raise Unreadable(where, "a symbolic link: not followed") from None
                if e.errno == errno.ENOTDIR:
                    raise Unreadable(where, "not a folder") from None
                raise Unreadable(where, f"cannot open: {e.strerror}") from None
            os.close(fd)
            fd = nfd
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def read_bytes(run_dir: str | Path, name: str, limit: int | None = None) -> bytes | None:
    """``run_dir/name``'s bytes (a regular file of at most ``limit`` bytes); None when absent."""
    limit = MAX_BYTES if limit is None else limit
    fd = _open(Path(run_dir), name)
    if fd is None:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Unreadable(name, "a folder, not a file" if stat.S_ISDIR(st.st_mode) else "not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise Unreadable(name, f"too large: {st.st_size} bytes (at most {limit} are read)")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise Unreadable(name, f"cannot read: {e.strerror}") from None
    if len(data) > limit:  # grew while read
        raise Unreadable(name, f"too large: over {limit} bytes")
    return data


def _text(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unreadable(name, f"not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def read_json(run_dir: str | Path, name: str, limit: int | None = None) -> dict | None:
    """``run_dir/name`` parsed: a JSON object, or None when the file is absent."""
    data = read_bytes(run_dir, name, limit)
    if data is None:
        return None
    text = _text(name, data)
    if not text.strip():
        raise Unreadable(name, "empty")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise Unreadable(name, f"not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise Unreadable(name, "not JSON that can be read: nested too deep") from None
    except ValueError as e:  # an integer of thousands of digits
        raise Unreadable(name, f"not JSON that can be read: {e}") from None
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise Unreadable(name, "holds a lone surrogate escape (\\ud800 to \\udfff): no text") from None
    if not isinstance(value, dict):
        raise Unreadable(name, f"not a JSON object but {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {list: "a list", str: "a text", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


def read(run_dir: str | Path, name: str) -> dict | None:
    """The JSON file ``name`` of :data:`SHAPES`, checked: its content as read (None when absent)."""
    data = read_json(run_dir, name)
    if data is not None:
        check(name, data)
    return data


def verdict(run_dir: str | Path, step: str) -> Verdict | None:
    """``verdicts/<step>.json`` as a Verdict; None when absent."""
    name = f"verdicts/{step}.json"
    data = read_json(run_dir, name)
    if data is None:
        return None
    v = check(name, data, VerdictShape)
    assert isinstance(v, VerdictShape)
    return Verdict(v.title, [Check(**c.model_dump()) for c in v.checks], [(k, x) for k, x in v.key_numbers],
                   v.taken, v.holds_until, dict(v.boots))


def verdicts(run_dir: str | Path) -> list[tuple[str, Verdict | Unreadable]]:
    """Each ``verdicts/*.json`` in name order: (step, its verdict, or why it is unreadable)."""
    fd = _open(Path(run_dir), "verdicts", directory=True)
    if fd is None:
        return []
    try:
        names = sorted(n for n in os.listdir(fd) if n.endswith(".json"))
    finally:
        os.close(fd)
    out: list[tuple[str, Verdict | Unreadable]] = []
    for n in names:
        try:
            found = verdict(run_dir, n[: -len(".json")])
        except Unreadable as e:
            found = e
        if found is not None:
            out.append((shown(n[: -len(".json")]), found))
    return out


def fingerprint(run_dir: str | Path) -> Fingerprint | None:
    data = read(run_dir, FINGERPRINT)
    return Fingerprint.from_json(data) if data is not None else None


def results(run_dir: str | Path) -> Results | None:
    data = read(run_dir, Results.FILE)
    return Results.from_json(data) if data is not None else None


def notebook(run_dir: str | Path, name: str) -> nbformat.NotebookNode | None:
    """An executed notebook of the run folder (a file in it, by ``name``), valid nbformat 4."""
    data = read_json(run_dir, _file_name_or_unreadable(name), MAX_NOTEBOOK_BYTES)
    if data is None:
        return None
    check(name, data, NotebookShape)
    try:  # nbformat raises whatever a malformed structure trips on: any of it is "not a notebook"
        with warnings.catch_warnings():  # a cell without an id: valid still, the report gives it one
            warnings.simplefilter("ignore")
            nb = nbformat.from_dict(data)
            nbformat.validate(nb)
    except Exception as e:  # noqa: BLE001 (see above)
        first = getattr(e, "message", None) or str(e).strip() or type(e).__name__
        where = list(getattr(e, "absolute_path", None) or [])  # jsonschema's, where nbformat's schema failed
        raise Unreadable(name, f"not a notebook: {field_path(tuple(where)) + ': ' if where else ''}"
                               f"{first.splitlines()[0]}") from None
    return nb


def _file_name_or_unreadable(name: str) -> str:
    try:
        return file_name(name)
    except ValueError as e:
        raise Unreadable(name, str(e)) from None


@dataclass
class RunFolder:
    """A run folder read piece by piece: what is unreadable is kept in ``unreadable`` (file ->
    why) and reads as None, so that a page shows the rest and says what it could not read."""

    path: Path
    unreadable: dict[str, str] = field(default_factory=dict)

    def _kept(self, read_it, *args):
        try:
            return read_it(self.path, *args)
        except Unreadable as e:
            self.unreadable[e.name] = e.why
            return None

    def read(self, name: str) -> dict | None:
        return self._kept(read, name)

    def fingerprint(self) -> Fingerprint | None:
        return self._kept(fingerprint)

    def results(self) -> Results | None:
        return self._kept(results)

    def notebook(self, name: str) -> nbformat.NotebookNode | None:
        return self._kept(notebook, name)

    def verdicts(self) -> list[tuple[str, Verdict]]:
        found = self._kept(verdicts) or []
        for step, v in found:
            if isinstance(v, Unreadable):
                self.unreadable[v.name] = v.why
        return [(step, v) for step, v in found if isinstance(v, Verdict)]


# ---- writing ------------------------------------------------------------------------------------

def write(folder: str | Path, name: str, text: str) -> Path:
    """Write ``folder/name`` as a new regular file: written under a temporary name in ``folder``,
    then renamed over ``name``, so that a symbolic or hard link there is replaced, not written
    through. Text that cannot be UTF-8 (a lone surrogate) is replaced."""
    folder = Path(folder)
    _file_name_or_unreadable(name)
    data = text.encode("utf-8", "replace")
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as e:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(e, IsADirectoryError):
                raise SparkbookError(f"{folder / name}: a folder is there; not replaced") from None
            raise
    finally:
        os.close(dfd)
    return folder / name
