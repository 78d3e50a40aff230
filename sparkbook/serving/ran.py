"""The configuration that ran (05): what vLLM says it was started with, read from its start-up log
(its non-default arguments and its engine's configuration), held to what sparkbook asked (the
serving plan's ``vllm serve``). An image's entrypoint, a wrapper in place of ``vllm`` or a config
file in the image can change it, and 06 and 07 would then verify and measure a configuration nobody
chose. Recorded in serving.json and in the fingerprint."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from ..book.redact import mask
from ..facts import pyrepr
from ..facts.parsers import parse_sections
from ..nodes.remote import Cluster
from ..nodes.shell import Script, script
from ..nodes.workdir import serve_log
from ..params import Node, Params
from .plan import plan
from .vllm import ARGS_LINE, ENGINE_ARGS, ENGINE_KEYS, ENGINE_LINE, asked


class Difference(NamedTuple):
    name: str    # the argument, as vLLM names it (``max_num_seqs``)
    asked: Any   # what sparkbook asked (None: not asked at all)
    ran: Any     # what vLLM says it ran with


def what_ran(params: Params, cluster: Cluster) -> dict[str, dict[str, Any]]:
    """What vllm serve logged it was started with, by node: the head's with the Ray executor,
    every serving node's with mp. Each: ``version`` (vLLM's, from the engine line), ``args`` (its
    non-default arguments; None when its log has none), ``engine`` (the settings of ENGINE_KEYS),
    and ``error`` when the log could not be read."""
    nodes = [params.head] if params.serving.executor == "ray" else params.serving_nodes
    return {name: parse(r.stdout) if r.ok else {"args": None, "error": mask(r.summary())}
            for name, r in cluster.run(lambda n: reader(params, n), nodes, timeout=60).items()}


def reader(params: Params, node: Node) -> Script:
    """serve_config.sh for ``node``: vllm serve's log in the head's logs folder (Ray), or its
    container's log (mp). Shown as the command of 05's "configuration that ran" row."""
    p = plan(params)
    if params.serving.executor == "ray":
        return script("serve_config.sh", "ray-head", p.ray_container, serve_log(params, node))
    return script("serve_config.sh", "mp", p.serve_container)


def parse(text: str) -> dict[str, Any]:
    """serve_config.sh's output (see :func:`what_ran`)."""
    sections = parse_sections(mask(text))
    out: dict[str, Any] = {"version": None, "args": None, "engine": {}}
    found = ARGS_LINE.search(sections.get("args", ""))
    if found:
        try:
            out["args"] = _json(pyrepr.mapping(found.group(1)))
        except ValueError as e:
            out["error"] = f"its non-default arguments could not be read: {e}"
    found = ENGINE_LINE.search(sections.get("engine", ""))
    if found:
        config = pyrepr.key_values(found.group(2))
        out["version"] = found.group(1)
        out["engine"] = _json({k: config[k] for k in ENGINE_KEYS if k in config})
    return out


def _json(value: Any) -> Any:
    """``value`` in JSON's types (a tuple as a list, anything else as its text)."""
    return json.loads(json.dumps(value, default=str))


def differences(args: list[str], ran: dict[str, Any]) -> tuple[list[Difference], list[str]]:
    """(the differences, the asked arguments that ran at vLLM's default) between ``vllm serve``'s
    arguments as the plan builds them and what vLLM logged: an argument it lists that was not asked,
    one it lists with another value, and an engine setting (tensor and pipeline parallel, the model
    length) other than asked. An asked argument it does not list ran at its default."""
    want, got, engine = asked(args), ran.get("args") or {}, ran.get("engine") or {}
    diffs = [Difference(k, None, v) for k, v in got.items() if k not in want]
    diffs += [Difference(k, want[k], got[k]) for k in want if k in got and not same(want[k], got[k])]
    diffs += [Difference(f"{key} (engine)", want[arg], engine[key]) for key, arg in ENGINE_ARGS.items()
              if arg in want and key in engine and not same(want[arg], engine[key])
              and not any(d.name == arg for d in diffs)]
    return diffs, [k for k in want if k not in got]


def same(want: Any, got: Any) -> bool:
    """Whether an argument as asked (its command-line text, or True/False for a flag) is the value
    vLLM parsed: numbers by value, a JSON object as the fields it sets (the config vLLM logs holds
    every field), a list as its items."""
    if isinstance(want, bool) or isinstance(got, bool):
        return str(want).lower() == str(got).lower()
    if isinstance(got, (int, float)):
        try:
            return float(want) == float(got)
        except (TypeError, ValueError):
            return False
    if isinstance(got, dict):
        try:
            return _within(json.loads(want) if isinstance(want, str) else want, got)
        except ValueError:
            return False
    if isinstance(got, list):
        return want == got or [want] == got or str(want).split() == [str(x) for x in got]
    return str(want) == str(got)


def _within(want: Any, got: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and _within(v, got[k]) for k, v in want.items())
    return want == got
