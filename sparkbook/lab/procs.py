"""A lab node's init and its processes: PID 1 of the node's PID namespace, whose death takes every
process of the node with it (used by `lab down` and `lab reboot`)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from .nodes import LabError, LabNode


def is_init(pid: int, node: LabNode) -> bool:
    """Whether ``pid`` is still this node's init (and not a process that reuses the number)."""
    try:
        return str(node.dir / "init.sh") in (Path(f"/proc/{pid}/cmdline").read_bytes()
                                             .replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not; one of ours is reaped here)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def kill_init(node: LabNode, info: dict) -> None:
    """SIGKILL the node's init (``info``: its record in lab.json) and wait until it and its launcher
    are gone: every process of the node goes with it."""
    pid = info["init_pid"]
    os.kill(pid, signal.SIGKILL)
    for p in (pid, info.get("launcher_pid")):
        if p:
            wait_gone(p)
    if alive(pid):
        raise LabError(f"{node.name}: its init {pid} still runs 10 s after SIGKILL")
