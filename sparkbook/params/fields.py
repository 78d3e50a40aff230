"""Single values of a parameters file that reach a command line (``ssh``, ``docker run``, ``vllm
serve``, rsync, a node script) or say where a secret goes: each kind is checked once here, so that no
value can become an option, break a mount, put a secret on a command line, or name something else
than it says; how a bad field is reported; and the reader, which refuses a key given twice and reads
only what a parameters file can be.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Mapping
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator

from ..book import redact

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_option(v: str) -> str:
    if v.startswith("-"):
        raise ValueError("must not begin with '-' (it would be read as an option)")
    if _CONTROL.search(v):
        raise ValueError("must not hold control characters (a newline, a tab...)")
    return v


def _absolute(v: str) -> str:
    _no_option(v)
    if not v.startswith("/"):
        raise ValueError("must be an absolute path (beginning with '/')")
    if ".." in v.split("/"):
        raise ValueError("must not hold '..'")
    return v


def _mountable(v: str) -> str:
    """A folder mounted into containers as ``-v PATH:PATH``: a ``:`` or ``,`` would split it."""
    _absolute(v)
    if ":" in v or "," in v:
        raise ValueError("must not hold ':' or ',' (it is mounted into the containers as "
                         "`-v PATH:PATH`, which they would split)")
    if v.rstrip("/") == "":
        raise ValueError("must be a folder below '/', not '/' itself")
    return v


def _model_path(v: str) -> str:
    """The model's folder: also an argument of rsync, which before 3.2.4 hands it to the worker's
    shell unquoted, where a blank splits it and a shell character runs something."""
    _mountable(v)
    if not re.fullmatch(r"[A-Za-z0-9/._+@=-]+", v):
        raise ValueError("must be letters, digits and '/._-+@=' only, without blanks: the path "
                         "reaches a worker's shell through rsync (unquoted before rsync 3.2.4)")
    return v


def _word(v: str) -> str:
    """A name passed as one argument (a parser, a served name): no blanks, not an option."""
    _no_option(v)
    if any(c.isspace() for c in v):
        raise ValueError("must be one word, without blanks")
    return v


def _login(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\$?", v):
        raise ValueError("must be a login name: letters, digits, '.', '_' or '-', not beginning with "
                         "'-', without blanks, '@' or ':'")
    return v


def _image(v: str) -> str:
    """A Docker image reference: ``[registry[:port]/]path[:tag][@digest]``."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*", v):
        raise ValueError("must be a Docker image reference (name[:tag][@digest]): letters, digits and "
                         "'._/:@-', beginning with a letter or digit, without blanks")
    return v


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"


def _address(v: str) -> str:
    """An IP address or a DNS host name (what a server binds to)."""
    try:
        ipaddress.ip_address(v)
        return v
    except ValueError:
        pass
    if len(v) > 253 or not re.fullmatch(rf"{_LABEL}(?:\.{_LABEL})*\.?", v):
        raise ValueError("must be an IP address or a host name")
    return v


# `docker run` options sparkbook sets on its containers (networking, devices, mounts, environment,
# names, labels, entrypoint, lifetime): the parameters' docker_args may not set them again.
MANAGED_DOCKER_FLAGS = frozenset({
    "network", "net", "ipc", "gpus", "device", "volume", "mount", "env", "env-file", "name", "label",
    "label-file", "entrypoint", "rm", "detach", "interactive", "tty", "shm-size", "privileged",
    "ulimit", "cap-add", "runtime", "pid", "uts", "userns", "volumes-from"})


def _docker_args(v: list[str]) -> list[str]:
    bad = []
    for item in v:
        m = re.fullmatch(r"--([a-z][a-z0-9-]*)(=.*)?", item, re.S)
        if not m:
            bad.append(f"{item!r} (write each as one item --flag=value)")
        elif m.group(1) in MANAGED_DOCKER_FLAGS:
            bad.append(f"{item!r} (--{m.group(1)} is set by sparkbook)")
    if bad:
        raise ValueError("; ".join(bad))
    return v


# vLLM options that would put a secret on its command line (ps, the commands table, the
# fingerprint): the shortest abbreviation vLLM's parser reads as each (--api-s is
# --api-server-count, --hf-c --hf-config-path), and where the secret belongs instead.
SECRET_FLAGS = {
    "--api-key": ("--api-k", "set serving.api_key_env instead"),
    "--hf-token": ("--hf-t", "the token of model.hf_token_env reaches vLLM through its environment"),
}


def _serve_args(v: list[str]) -> list[str]:
    # as vLLM's argument parser reads them: --api_key too, and any unambiguous abbreviation
    flags = [a.split("=", 1)[0].replace("_", "-") for a in v if a.startswith("--")]
    found = [f"{full} would put a secret on a command line (ps, the commands table, the "
             f"fingerprint): {remedy}" for full, (short, remedy) in SECRET_FLAGS.items()
             if any(f.startswith(short) and full.startswith(f) for f in flags)]
    if found:
        raise ValueError("; ".join(found))
    return v


# The variables a parameters file may name as a secret. A file someone else wrote says both which
# variable is the secret and where it goes (the API, the head), so it may not pick any secret of
# this machine (AWS_SECRET_ACCESS_KEY): only sparkbook's own names, or the tool's own variable for
# that very secret. Not OPENAI_API_KEY: it usually holds a key of api.openai.com.
KEY_VARIABLE = r"SPARKBOOK_[A-Za-z0-9_]+|VLLM_API_KEY"
TOKEN_VARIABLE = r"SPARKBOOK_[A-Za-z0-9_]+|HF_TOKEN|HUGGING_FACE_HUB_TOKEN"


def _secret_variable(pattern: str, own: str, sent: str):
    def check(v: str) -> str:
        if not re.fullmatch(pattern, v):
            raise ValueError(f"must be {own} or begin with SPARKBOOK_ (e.g. SPARKBOOK_TOKEN): its "
                             f"value is sent to {sent}, so a parameters file may name no other "
                             "variable of this machine; export the secret under such a name")
        return v
    return check


def _http_url(v: str) -> str:
    u = urlsplit(v)  # a ValueError (a bad IPv6 address) is reported as the field's
    if u.scheme not in ("http", "https") or not u.hostname or re.search(r"\s", v):
        raise ValueError("must be an http:// or https:// URL with a host, without blanks")
    if u.username is not None or u.password is not None:
        raise ValueError("must not hold a user or password: name the API key in serving.api_key_env")
    u.port  # a port that is not a number from 0 to 65535 raises ValueError
    return v


NotOption = Annotated[str, AfterValidator(_no_option)]
AbsolutePath = Annotated[str, AfterValidator(_absolute)]
MountPath = Annotated[str, AfterValidator(_mountable)]
ModelPath = Annotated[str, AfterValidator(_model_path)]
Word = Annotated[str, AfterValidator(_word)]
Login = Annotated[str, AfterValidator(_login)]
Image = Annotated[str, AfterValidator(_image)]
Address = Annotated[str, AfterValidator(_address)]
DockerArgs = Annotated[list[str], AfterValidator(_docker_args)]
ServeArgs = Annotated[list[str], AfterValidator(_serve_args)]
KeyVariable = Annotated[str, AfterValidator(_secret_variable(KEY_VARIABLE, "VLLM_API_KEY", "the API"))]
TokenVariable = Annotated[str, AfterValidator(_secret_variable(TOKEN_VARIABLE, "HF_TOKEN or HUGGING_FACE_HUB_TOKEN",
                                                               "the head and the hub"))]
ApiUrl = Annotated[str, AfterValidator(_http_url)]

# The upper bound of the long timeouts: a larger value is a mistake (milliseconds, an extra zero),
# and would turn a hang into a wait of days.
DAY = 86400

# Fields whose values are never echoed back in an error message (besides redact.NAMES).
SECRET_HINTS = ("token", "secret", "password", "passphrase")


def _secret(part: object) -> bool:
    return isinstance(part, str) and bool(redact.NAMES.search(part.upper())
                                          or any(h in part.lower() for h in SECRET_HINTS))


def field_path(loc: tuple[Any, ...]) -> str:
    """A field's path as written in messages: ``nodes[0].rails[1].ip``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def field_message(err: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence, with the value it got unless the field holds a secret."""
    kind, msg, loc = err["type"], err["msg"], err["loc"]
    msg = msg.removeprefix("Value error, ")
    if kind == "ip_v4_address":
        msg = "not an IPv4 address"
    elif kind == "missing":
        return "required field is missing"
    elif kind == "extra_forbidden":
        return "unknown field (allowed here: see the schema in sparkbook/params.py)"
    elif kind == "string_pattern_mismatch" and loc and loc[-1] == "name":
        msg = "must be letters, digits, '.', '_' or '-', starting with a letter or digit"
    elif kind == "less_than_equal" and loc and "timeout" in str(loc[-1]):
        limit = err["ctx"]["le"]
        msg = (f"must be at most {limit:g} s ({'5 minutes' if limit == 300 else '1 day'}): a longer "
               "limit only turns a hang into a long wait (seconds, not milliseconds)")
    if any(_secret(part) for part in loc):
        return msg
    value = err.get("input")
    if isinstance(value, (str, int, float, bool)) or value is None:
        try:
            shown = repr(value)
        except ValueError:  # an integer beyond Python's 4300 digits
            shown = f"an integer of {value.bit_length()} bits"
        return f"{msg} (got {shown[:60] + '...' if len(shown) > 60 else shown})"
    return msg


# What a parameters file can be: the largest shipped one is 6 KB and about 200 YAML values. These
# bounds are many times that, and keep PyYAML's pure-Python reader under a second on any input (it
# reads 64 KiB of blank lines in about half a second on a busy machine, 1 MiB in eight) and the
# validation small.
MAX_BYTES = 64 * 1024
MAX_VALUES = 5000  # YAML nodes; and values once aliases are expanded (see too_many_values)
MAX_DEPTH = 32


def read_bounded(path: Path) -> str:
    """A parameters file's text; a ValueError says why there is none: unreadable, not a regular
    file (a device or a pipe could stream without end or block), over MAX_BYTES, not UTF-8."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError("not a regular file (a folder, a device or a pipe)")
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ValueError(f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES // 1024} KiB: not a parameters file")
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None


def too_many_values(data: Any, limit: int = MAX_VALUES) -> bool:
    """Whether ``data`` holds more than ``limit`` values, counting a shared one (a YAML alias) each
    time it is used, as validation visits it: ten aliases of ten aliases... are few nodes but
    billions of values (a cycle is endless, so also too many)."""
    todo, seen = [data], 0
    while todo:
        seen += 1
        if seen > limit:
            return True
        v = todo.pop()
        if isinstance(v, Mapping):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, (list, tuple)):
            todo += v
    return False


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error naming the
    key and both lines (PyYAML keeps the last one, silently); and bounded: at most
    :data:`MAX_VALUES` nodes, :data:`MAX_DEPTH` levels deep, and a value its tag cannot read (an
    integer of 5000 digits, ``!!int x``) is a YAML error, not the ValueError PyYAML lets through."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = self.composed = 0

    def fetch_flow_collection_start(self, TokenClass):
        # the scanner keeps a possible key for every open `[` or `{` and checks them all at each
        # token: 10,000 on one line take seconds before the composer sees the second level
        if self.flow_level >= MAX_DEPTH:
            raise yaml.scanner.ScannerError(None, None, f"nested more than {MAX_DEPTH} levels deep: "
                                            "not a parameters file", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent, index):
        # the composer recurses per level: refused here, before Python's recursion limit
        self.depth, self.composed = self.depth + 1, self.composed + 1
        try:
            why = (f"nested more than {MAX_DEPTH} levels deep" if self.depth > MAX_DEPTH else
                   f"more than {MAX_VALUES} values" if self.composed > MAX_VALUES else "")
            if why:
                raise yaml.composer.ComposerError(None, None, f"{why}: not a parameters file",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as e:
            why = str(e).split(";")[0]  # Python's digit limit goes on to suggest raising it
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this {node.tag.rsplit(':', 1)[-1]}: {why}",
                node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *defaults` then a key of its own is how merges are meant
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: SafeLoader reports it
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (lines {first.line + 1} and "
                        f"{key_node.start_mark.line + 1}); remove one", key_node.start_mark)
        return super().construct_mapping(node, deep)
