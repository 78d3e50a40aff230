"""Secrets never reach a notebook, a report or a log: every value of this machine's environment
that looks like a token (by its name), named as one by the parameters (``model.hf_token_env``,
registered when parameters validate), or written in the parameters file itself
(:func:`protect_value`), is masked wherever sparkbook shows or writes text.

A secret is masked in every form text gives it: as is, escaped for JSON (a notebook file, a
verdict), HTML (a report, a table), a URL or a single-quoted shell word, those escapes nested two
deep (HTML inside a notebook's JSON), and cut short by a table column or a length limit (its first
8 characters or more, then an ellipsis, the end of a JSON string, of a line or of the text)."""

from __future__ import annotations

import html
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import quote, quote_plus

# Terminal control sequences, stripped from what is shown of a log or a live line (a log's
# signature lines, progress): CSI (colours, cursor moves), OSC (a title, a clipboard write) and the
# like, other escapes, syslog's escaped colours, and control characters but tab and CR.
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?|"
                      r"#033\[[0-9;]*m|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
MASK = "********"
NAMES = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY")
MIN_LEN = 8  # shorter values would mask ordinary words
_named: set[str] = set()  # more variable names holding secrets, from the parameters
_values: set[str] = set()  # secret values written in the parameters file
# What follows a value cut short: an ellipsis (as is, escaped for JSON or HTML), the quote that
# closes a JSON string, a line's end (as is or escaped) or the text's end.
_CUT = r"(?=…|\.\.\.|\\u2026|&hellip;|&#8230;|\\?\"|\n|\\n|\Z)"
# Files mask_tree leaves alone whatever their content; any file with a NUL byte is skipped too.
BINARY = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".ico", ".pdf", ".gz", ".tgz", ".xz",
                    ".zst", ".bz2", ".zip", ".tar", ".whl", ".so", ".bin", ".pt", ".safetensors",
                    ".npy", ".npz", ".parquet", ".db", ".sqlite", ".woff", ".woff2"})


def protect(name: str) -> None:
    """Mask the value of the environment variable ``name`` too, whatever it is called."""
    _named.add(name)


def protect_value(value: str) -> None:
    """Mask ``value`` itself (a secret written in the parameters file) like the environment's."""
    if not isinstance(value, str) or len(value) < MIN_LEN:
        raise ValueError(f"a secret must be at least {MIN_LEN} characters long: a shorter one, "
                         "masked, would corrupt ordinary text")
    _values.add(value)


def secrets() -> list[str]:
    """The secret values: the environment's (short values are left alone: they would mask
    ordinary words) and those registered with :func:`protect_value`; longest first."""
    found = {v for k, v in os.environ.items()
             if v and len(v) >= MIN_LEN and (NAMES.search(k) or k in _named)}
    return sorted(found | _values, key=lambda v: (-len(v), v))


def _shell(s: str) -> str:  # inside a single-quoted word, as shlex.quote writes it
    return s.replace("'", "'\"'\"'")


def _markup(s: str) -> str:  # HTML as Jinja (markupsafe) escapes it
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("'", "&#39;").replace('"', "&#34;"))


ESCAPES: tuple[Callable[[str], str], ...] = (
    lambda s: json.dumps(s)[1:-1], lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    lambda s: repr(s)[1:-1], html.escape, lambda s: html.escape(s, quote=False), _markup,
    lambda s: quote(s, safe=""), quote, quote_plus, _shell)


def _forms(value: str) -> set[str]:
    """``value`` as is, under each escape, and under each escape of an escape."""
    once = {f(value) for f in ESCAPES}
    return {value} | once | {g(v) for v in once for g in ESCAPES}


@lru_cache(maxsize=8)
def _pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex for every form of every secret: whole forms first (longest first), then the
    forms of each secret's prefixes of at least MIN_LEN characters, where the text cuts them."""
    if not values:
        return None
    whole = sorted({f for v in values for f in _forms(v)}, key=len, reverse=True)
    heads: dict[str, list[str]] = {}  # the prefixes' forms by their start, longest first
    for v in values:
        for k in range(len(v) - 1, MIN_LEN - 1, -1):
            for form in sorted(_forms(v[:k])):
                heads.setdefault(form[:MIN_LEN], []).append(form)
    # one group per start, so that re factors the start out and tries the rest only after it
    cut = ["(?:" + "|".join(map(re.escape, sorted(set(forms), key=len, reverse=True))) + ")" + _CUT
           for forms in heads.values()]
    return re.compile("|".join([*map(re.escape, whole), *cut]))


# NAME=value where the name says it holds a secret (as `env` or `docker inspect` print it): masked
# whether or not this process knows the value (Ray's token, made by another notebook's kernel).
# Linear on any text: the name is looked for once at each word's start (a lookahead), then taken
# whole, where ``[A-Z0-9_]*TOKEN[A-Z0-9_]*=`` tried every split of a long upper-case word around
# each TOKEN in it (quadratic: 40 kB of "TOKEN" took a second).
_ASSIGNED = re.compile(r"\b(?=[A-Z][A-Z0-9_]*?(?:TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY))"
                       r"([A-Z][A-Z0-9_]*=)[^\s\"'&<>\\]{%d,}" % MIN_LEN)


def mask(text: str) -> str:
    """``text`` with every form of every secret replaced by MASK."""
    pattern = _pattern(tuple(secrets()))
    text = pattern.sub(MASK, text) if pattern else text
    return _ASSIGNED.sub(lambda m: m.group(1) + MASK, text)


def mask_tree(folder: str | os.PathLike[str]) -> list[Path]:
    """Mask every text file under ``folder`` in place (symbolic links and binary files, by their
    suffix or a NUL byte, are left alone; a file keeps its inode and mode). Returns the files
    changed."""
    changed: list[Path] = []
    for path, data in text_files(folder):
        text = data.decode("utf-8", "surrogateescape")
        masked = mask(text)
        if masked != text:
            _rewrite(path, masked.encode("utf-8", "surrogateescape"))
            changed.append(path)
    return changed


def text_files(folder: str | os.PathLike[str], max_size: int | None = None) -> Iterator[tuple[Path, bytes | None]]:
    """The text files under ``folder`` with their bytes, in order: symbolic links (and what lies
    under a linked folder) and binary files, by their suffix or a NUL byte, are left out; a file
    larger than ``max_size`` comes with None, unread."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            if path.suffix.lower() in BINARY or path.is_symlink() or not path.is_file():
                continue
            if max_size is not None and path.stat().st_size > max_size:
                yield path, None
                continue
            data = path.read_bytes()
            if b"\0" not in data:
                yield path, data


def _rewrite(path: Path, data: bytes) -> None:
    """Overwrite ``path`` in place: a process still appending to it keeps writing to the same file,
    and its mode stays (made writable for the moment where it was not)."""
    mode = path.stat().st_mode & 0o7777
    locked = not os.access(path, os.W_OK)
    if locked:
        path.chmod(mode | 0o200)
    try:
        with path.open("r+b") as f:
            f.write(data)
            f.truncate()
    finally:
        if locked:
            path.chmod(mode)
