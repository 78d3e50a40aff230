"""What reaches a shell on the nodes: the node scripts of ``sparkbook/scripts/`` with their values
as arguments, quoting, node-to-node SSH, and the line actually sent (under a time limit, stopped when
this machine goes away). No I/O here: :mod:`sparkbook.nodes.remote` sends these.

A command is a sequence of arguments (quoted with :func:`shlex.join`), a :class:`Script` (a shell or
Python program of ``sparkbook/scripts/``, its values passed as arguments), or a one-line shell command
written by sparkbook, in which every value is inserted with :func:`sh` (quoted). Nothing from a
parameters file reaches a shell unquoted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

from ..params import Node

SCRIPTS = Path(__file__).parents[1] / "scripts"


@dataclass(frozen=True)
class Script:
    """A node-side program, ``sparkbook/scripts/NAME``, with its arguments. A shell script runs as
    ``bash -c TEXT NAME ARGS...``, a Python one (``.py``) as ``python3 -I -c TEXT ARGS...`` with the
    node's python3, isolated from its environment: nothing is copied to the node, the values are
    arguments, never part of the program, and it is shown as the command a person runs by hand on
    a node."""

    name: str
    args: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return (SCRIPTS / self.name).read_text()

    @property
    def interpreter(self) -> list[str]:
        return ["python3", "-I"] if self.name.endswith(".py") else ["bash"]

    def __str__(self) -> str:
        return shlex.join([*self.interpreter, f"sparkbook/scripts/{self.name}", *self.args])

    def argv(self) -> list[str]:
        """The arguments that run it without the file."""
        if self.name.endswith(".py"):
            return [*self.interpreter, "-c", self.text, *self.args]
        return ["bash", "-c", self.text, self.name, *self.args]

    def program(self) -> str:
        """The one-line shell form that runs it without the file."""
        return shlex.join(self.argv())


@dataclass(frozen=True)
class Bundle:
    """Several scripts in one SSH round trip, one after another, each one's output introduced by
    a line ``@@ SECTION`` (read back with :func:`sparkbook.facts.parsers.parse_sections`)."""

    parts: tuple[tuple[str, Script], ...]

    def __str__(self) -> str:
        return "; ".join(f"echo {shlex.quote('@@ ' + sec)}; {s}" for sec, s in self.parts)

    def program(self) -> str:
        return "\n".join(f"echo {shlex.quote('@@ ' + sec)}\n{s.program()}" for sec, s in self.parts)


def bundle(*parts: tuple[str, Script]) -> Bundle:
    return Bundle(tuple(parts))


def script(name: str, *args: object) -> Script:
    """``sparkbook/scripts/NAME`` with ``args`` (each turned into a string)."""
    if not (SCRIPTS / name).is_file():
        raise FileNotFoundError(f"no node script {SCRIPTS / name}")
    return Script(name, tuple(str(a) for a in args))


Command = Union[str, Sequence[str], Script, Bundle]
PerNode = Union[Command, Callable[[Node], Command]]

# Exit status of coreutils `timeout` when the limit was reached.
TIMEOUT_STATUS = 124
KILL_GRACE_S = 5


def sh(template: str, **values: object) -> str:
    """Fill a shell template with quoted values: ``sh("ls {d}", d=path)``."""
    return template.format(**{k: shlex.quote(str(v)) for k, v in values.items()})


def command_line(cmd: Command) -> str:
    """The shell form of a command: sequences are quoted, strings are taken as written, a
    :class:`Script` is shown as run by hand."""
    if isinstance(cmd, (str, Script, Bundle)):
        return str(cmd)
    return shlex.join(str(a) for a in cmd)


# SSH from one node to another over the fabric, as a command run on a node, without the peer's port
# and address: no prompt, host key checked, no agent forwarded. The classic curve25519 key exchange
# (every OpenSSH has it) costs a tenth of the CPU of the post-quantum default, which adds up when
# many nodes connect at once; AES-GCM first (hardware-accelerated on x86 and on the Grace CPU's Arm
# cores) for the bulk copies. Keepalives notice a dead link (a worker powered off, a cable pulled)
# within 15 s x 4 instead of the kernel's TCP timeout (about 15 minutes).
PEER_SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=yes",
            "-o", "ForwardAgent=no", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
            "-o", "KexAlgorithms=curve25519-sha256",
            "-o", "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com")


def peer_ssh(peer: Node) -> list[str]:
    """:data:`PEER_SSH` to ``peer``: its sshd port (``nodes[].port``), then ``user@address``."""
    return [*PEER_SSH, *(["-p", str(peer.port)] if peer.port else []), peer.peer_target]


# Runs its arguments in the background and waits for them, while a watcher reads the SSH channel's
# standard input, which this machine holds open and never writes: when the channel closes before the
# command ends (the kernel killed, the run interrupted, the connection lost), the read ends and the
# watcher stops the command, so nothing runs on to its time limit. (Without a terminal, sshd sends
# no hangup signal.) The command itself gets /dev/null as its input. The command is coreutils
# `timeout`, which leads a process group of its own (its pid): the watcher signals that group, not
# only `timeout`, and once more with KILL_GRACE_S's KILL, because a `timeout` signalled as it starts
# can exit before it knows its child's pid and leave the child running.
GUARD = ('exec 3<&0; "$@" & c=$!; { while read -r -u 3 _; do :; done; kill -TERM -- -"$c" "$c"; '
         '{ sleep 5; kill -KILL -- -"$c"; } & } 2>/dev/null & '
         'w=$!; wait "$c"; s=$?; kill "$w" 2>/dev/null; exit "$s"')


def wrap(cmd: Command, timeout: float, env: Mapping[str, str] | None = None) -> str:
    """The line actually sent: the script run by bash under coreutils ``timeout`` (which kills the
    whole process group at the limit, so nothing stays behind on the node), with ``env``, under
    :data:`GUARD` (stopped when this machine goes away)."""
    parts = ["bash", "-c", GUARD, "sparkbook", "timeout", "-k", str(KILL_GRACE_S), f"{max(timeout, 1):.0f}"]
    if env:
        parts += ["env", *[f"{k}={v}" for k, v in env.items()]]
    if isinstance(cmd, Script):
        parts += cmd.argv()
    elif isinstance(cmd, Bundle):
        parts += ["bash", "-c", cmd.program()]
    else:
        parts += ["bash", "-c", command_line(cmd)]
    return shlex.join(parts)
