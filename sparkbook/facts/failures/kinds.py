"""What a known failure is (:class:`Signature`) and the words its fields use: the steps, phases,
classes of cause and of remedy. Each signature's patterns may name the public logs they were
written from (``written_from``): tests/test_signatures.py names every log with each pattern
written only from that log's own source taken away (a leave-one-source-out test), so a pattern
that fits one thread only shows.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The steps whose logs a signature can appear in ("02" the all-reduce, "04" the Ray cluster,
# "05" vLLM's start-up, "06"/"07" vLLM under load); ``match(text, step=...)`` keeps those.
ALL_STEPS = ("02", "04", "05", "06", "07")
SERVING = ("05", "06", "07")

# The phase of an engine's start-up a signature belongs to, in start-up order ("runtime" when a
# served engine fails later, "any" when it can happen at any time).
PHASES = ("container", "ray", "config", "distributed init", "weights", "kv cache", "graph capture",
          "runtime", "any")

# The classes of a signature's cause and of its remedy, for tools that act on a finding
# (`sparkbook diagnose --json`): what failed, and what kind of action mends it.
REASONS = ("hardware", "fabric", "configuration", "version", "resource", "transient")
FIXES = ("setting", "version", "restart", "reboot", "power-cycle", "reseat-cable")

# Lines that show vLLM's start-up went on: a warning that something *may* fail is void once one
# of these follows it.
PROGRESS = r"(world_size=\d+ rank=\d+|Loading weights took|Model loading took|Loading safetensors|" \
           r"Available KV cache memory|Graph capturing finished|init engine .{0,200}? took|" \
           r"Starting vLLM API server|Application startup complete)"
NCCL_DETAIL = r"NCCL WARN|Last error:|socketProgress|Call to \w+ .{0,300}?failed|NET/IB ?: "
RAY_UP = r"Ray runtime started|Connected to Ray cluster"


@dataclass(frozen=True)
class Signature:
    """One known failure: what its log lines look like, what causes it and what to do."""
    name: str
    patterns: tuple[re.Pattern, ...]
    cause: str
    remedy: str
    phase: str = "any"
    steps: tuple[str, ...] = SERVING
    cleared_by: re.Pattern | None = None  # a later line like this voids it (a warning, not a failure)
    hang: bool = False                    # counts only as the last thing the log says
    detail: re.Pattern | None = None      # a line that says more (NCCL's WARN line, "Last error:")
    reason: str = "configuration"         # the class of its cause (REASONS)
    fix: str = "setting"                  # the class of its remedy (FIXES)
    catch_all: bool = False               # names a family of causes, not one (its cause lists them)
    written_from: tuple[tuple[str, ...], ...] = ()  # per pattern: the public logs it was written
    # from ("owner/repo#N", or a page's host and path); () where the signature predates the record

    def matches(self, line: str) -> bool:
        return any(p.search(line) for p in self.patterns)


def sig(name: str, patterns: list[str | tuple[str, ...]], cause: str, remedy: str, *, flags: int = 0,
        cleared_by: str | None = None, detail: str | None = None, **kw) -> Signature:
    """A signature; a pattern given as ``(regex, source, source...)`` names the logs it was
    written from."""
    items = [(p,) if isinstance(p, str) else p for p in patterns]
    written = tuple(tuple(item[1:]) for item in items)
    return Signature(name, tuple(re.compile(item[0], flags) for item in items), cause, remedy,
                     cleared_by=re.compile(cleared_by) if cleared_by else None,
                     detail=re.compile(detail) if detail else None,
                     written_from=written if any(written) else (), **kw)
