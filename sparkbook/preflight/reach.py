"""Preflight checks of reachability: SSH from here to every node, and from the head to every
worker (what Ray, the image copy and the model sync need)."""

from __future__ import annotations

from typing import Iterator

from ..params import Params
from ..verdict import FAIL, PASS, SKIP, Check
from .collect import Preflight


def ssh(params: Params, pf: Preflight) -> Iterator[Check]:
    for node in params.nodes:
        error = pf.errors.get(node.name)
        if error:
            yield Check("ssh", node.name, FAIL, error, "an SSH session (BatchMode, host key known)",
                        "bring the node up, or fix its host/user/key/known_hosts; every other check "
                        "of this node is skipped", "ssh ...")
        else:
            yield Check("ssh", node.name, PASS, "answers", "an SSH session")


def head_to_workers(params: Params, pf: Preflight) -> Iterator[Check]:
    head = pf.nodes.get(params.head.name)
    if head is None:
        return
    for peer, (target, ok) in head["peers_ssh"].items():
        yield Check("ssh head→worker", peer, PASS if ok else FAIL,
                    f"{params.head.name} → {target}: {'answers' if ok else 'refused or unreachable'}",
                    "key-based SSH from the head, host key known",
                    "" if ok else f"on {params.head.name}: ssh-copy-id {target}, then ssh {target} once "
                    "to check and accept its host key",
                    f"ssh -o BatchMode=yes -o ConnectTimeout=5 {target} true")


def unreachable(params: Params, pf: Preflight) -> Iterator[Check]:
    """The checks that could not run, one row per node that did not answer."""
    for node in params.nodes:
        if node.name not in pf.nodes:
            yield Check("node checks", node.name, SKIP, "not reachable: see the ssh check")
