"""Single values of a parameters file that reach a command line (``ssh``, ``docker run``, ``vllm
serve``, a node script): each kind is checked once here, so that no value can become an option, break
a mount, or name something else than it says; how a bad field is reported; and the YAML reader,
which refuses a key given twice.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Mapping

import yaml
from pydantic import AfterValidator

from . import redact

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


NotOption = Annotated[str, AfterValidator(_no_option)]
AbsolutePath = Annotated[str, AfterValidator(_absolute)]
MountPath = Annotated[str, AfterValidator(_mountable)]
Word = Annotated[str, AfterValidator(_word)]
Login = Annotated[str, AfterValidator(_login)]
Image = Annotated[str, AfterValidator(_image)]
Address = Annotated[str, AfterValidator(_address)]
DockerArgs = Annotated[list[str], AfterValidator(_docker_args)]

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
        shown = repr(value)
        return f"{msg} (got {shown[:60] + '...' if len(shown) > 60 else shown})"
    return msg


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error naming the
    key and both lines (PyYAML keeps the last one, silently)."""

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
