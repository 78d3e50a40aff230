"""Run commands on the nodes: in parallel, over one reused SSH connection per node, quoted.

The commands (:mod:`sparkbook.nodes.shell`) are a sequence of arguments, a node script with its values as arguments, or a one-line shell
command whose every value is quoted. Nothing from a parameters file reaches a shell unquoted.

SSH goes through Fabric (Paramiko): ``~/.ssh/config`` is honoured (HostName, User, Port,
IdentityFile, ProxyJump, ProxyCommand, UserKnownHostsFile, GlobalKnownHostsFile), except ForwardAgent:
the agent is forwarded only when the parameters ask (``ssh.forward_agent``). Host keys are checked
against the user's and the system's known_hosts files plus those the parameters name, host
certificates included (:mod:`sparkbook.nodes.hostkeys`); an unknown or changed host key is an immediate
error naming the node and the remedy, never a prompt and never silently accepted.

Between nodes (:func:`peer_ssh`) the nodes use their own SSH setup: the operator's private key never
leaves this machine.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import shlex
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, TextIO

import invoke
import paramiko
from fabric import Config, Connection

from ..book.errors import CheckFailed
from ..book.project import project_root
from ..params import SSH, Node, Params
from .hostkeys import HostKeyRefused, UnknownHostKey, guard
from .shell import KILL_GRACE_S, TIMEOUT_STATUS, Command, PerNode, command_line, wrap

# Paramiko logs every failed handshake with a traceback on stderr; sparkbook reports SSH failures
# itself, per node, with the remedy.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

@dataclass
class Result:
    """What one command did on one node."""

    node: str
    command: str
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    error: str | None = None  # set when the command could not run (SSH) or ran out of time
    timed_out: bool = False
    started: float = 0.0  # this machine's clock (time.time()) when this node's command began

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def summary(self, lines: int = 5) -> str:
        """What was seen, for a failure message: the error, or the exit code and the last lines."""
        if self.error:
            return self.error
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-lines:]
        seen = " | ".join(tail) if tail else "no output"
        return f"exit code {self.exit_code}: {seen}"


class Results(dict):
    """Results by node name, in the order the nodes were given."""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.values())

    def failed(self) -> list[Result]:
        return [r for r in self.values() if not r.ok]

    def check(self, what: str, remedy: str = "") -> "Results":
        """Raise :class:`CheckFailed` naming each failed node, the command and what was seen."""
        bad = self.failed()
        if bad:
            lines = [f"{what}: failed on {len(bad)} of {len(self)} node(s)"]
            for r in bad:
                lines += [f"- {r.node}: {r.summary()}", f"  command: {r.command}"]
            if remedy:
                lines.append(f"remedy: {remedy}")
            raise CheckFailed("\n".join(lines))
        return self


class _Prefixer(io.TextIOBase):
    """A stream that writes whole lines to ``sink``, each prefixed with the node's name."""

    def __init__(self, prefix: str, sink: TextIO, lock: threading.Lock):
        self.prefix, self.sink, self.lock, self.buf = prefix, sink, lock, ""

    def write(self, s: str) -> int:
        self.buf += s
        *lines, self.buf = self.buf.split("\n")
        if lines:
            with self.lock:
                self.sink.write("".join(f"[{self.prefix}] {ln}\n" for ln in lines))
                self.sink.flush()
        return len(s)

    def flush(self) -> None:
        """Nothing: invoke flushes after every chunk it reads, which may end mid-line."""

    def close(self) -> None:
        """The command ended: a last line without its newline is written too."""
        if self.buf:
            self.write("\n")


def _expand(path: str) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else project_root() / p)


class _Connection(Connection):
    """fabric's Connection that never opens again once closed. fabric's ``run`` opens a closed
    connection by itself: a thread about to run its command when Ctrl-C's :func:`drop` closed the
    connection would open a new one that nobody drops, and the command would run on the node to
    its time limit (seen on a loaded machine). Closed, it raises :class:`Dropped` instead."""

    dropped = False

    def open(self):
        if self.dropped:
            raise Dropped(f"ssh {self.host}: the connection was closed (interrupted): not opened again")
        return super().open()

    def close(self):
        self.dropped = True
        return super().close()


class Dropped(ConnectionError):
    """A command on a connection that was closed under it (Ctrl-C, :func:`close_all`)."""


_connections: dict[tuple, Connection] = {}
_connections_lock = threading.Lock()


def _key(node: Node, ssh: SSH) -> tuple:
    return (node.host, node.user, node.port, node.key, tuple(ssh.known_hosts), ssh.connect_timeout,
            ssh.forward_agent)


def drop(node: Node, ssh: SSH) -> None:
    """Close the node's connection and forget it: the next command opens a new one."""
    with _connections_lock:
        conn = _connections.pop(_key(node, ssh), None)
    if conn is not None:
        conn.close()


def connection(node: Node, ssh: SSH) -> Connection:
    """The node's SSH connection, opened once and reused (one per node per process).

    The socket gives up on data the node does not acknowledge within ``connect_timeout``
    (TCP_USER_TIMEOUT), so a node that goes down under an open connection shows as an error in
    seconds instead of a hang."""
    key = _key(node, ssh)
    with _connections_lock:
        conn = _connections.get(key)
    if conn is not None and conn.is_connected:
        return conn
    kwargs: dict = {"banner_timeout": ssh.connect_timeout, "auth_timeout": ssh.connect_timeout}
    if node.key:
        kwargs["key_filename"] = [_expand(node.key)]
    conn = _Connection(
        node.host, user=node.user, port=node.port, connect_timeout=ssh.connect_timeout,
        connect_kwargs=kwargs, config=Config(overrides={"run": {"in_stream": False}}),
        forward_agent=ssh.forward_agent,  # given, so that ~/.ssh/config's ForwardAgent is not used
    )
    guard(conn, [_expand(k) for k in ssh.known_hosts], ssh.connect_timeout)
    conn.open()
    sock = conn.transport.sock
    if hasattr(socket, "TCP_USER_TIMEOUT") and isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(ssh.connect_timeout * 1000))
    with _connections_lock:
        _connections[key] = conn
    return conn


@functools.lru_cache(maxsize=None)
def ssh_target(host: str, user: str | None, port: int | None) -> tuple[str, str, int]:
    """(HostName, User, Port) as ssh resolves them (the parameters, then ~/.ssh/config), without
    connecting."""
    c = Connection(host, user=user, port=port)
    return c.host, c.user, c.port


def close_all() -> None:
    """Close every cached SSH connection."""
    with _connections_lock:
        for conn in _connections.values():
            conn.close()
        _connections.clear()


def _target(node: Node, conn: Connection | None) -> str:
    user, host, port = (conn.user, conn.host, conn.port) if conn else (node.user, node.host, node.port or 22)
    return (f"{user}@" if user else "") + host + (f":{port}" if port != 22 else "")


def ssh_error(exc: BaseException, node: Node, conn: Connection | None) -> str:
    """A one-paragraph explanation of an SSH failure, with the remedy."""
    where = _target(node, conn)
    host = conn.host if conn else node.host
    port = conn.port if conn else (node.port or 22)
    if isinstance(exc, HostKeyRefused):
        return f"ssh {where}: {exc}"
    if isinstance(exc, paramiko.BadHostKeyException):
        hk = host if port == 22 else f"[{host}]:{port}"
        return (f"ssh {where}: HOST KEY CHANGED (the server offers a {exc.key.get_name()} key that "
                f"differs from known_hosts). If the node was reinstalled, remove the old key with "
                f"`ssh-keygen -R '{hk}'` and add the new one after checking its fingerprint.")
    if isinstance(exc, UnknownHostKey):
        # the name paramiko looked up: this node's, or that of a ProxyJump hop in front of it
        hk, h, p = exc.hostname, exc.host, exc.port
        hop = "" if (h, p) == (host, port) else " (a ProxyJump hop)"
        return (f"ssh {where}: unknown host key ({hk}{hop} is not in known_hosts). Check the host's "
                f"fingerprint, then add it: `ssh-keyscan -p {p} {h} >> ~/.ssh/known_hosts`, "
                f"or list a known_hosts file under ssh.known_hosts.")
    if isinstance(exc, paramiko.AuthenticationException):
        return (f"ssh {where}: authentication failed ({exc}). Install your public key on the node "
                f"(`ssh-copy-id`), or set the node's `key` in the parameters.")
    if isinstance(exc, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError)):
        return f"ssh {where}: cannot connect ({exc}). Is the node up and sshd listening on port {port}?"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"ssh {where}: connection timed out. Is the node up, and the address right?"
    if isinstance(exc, socket.gaierror):
        return f"ssh {where}: cannot resolve host name {host!r} ({exc.strerror})."
    return f"ssh {where}: {type(exc).__name__}: {exc}"


class _Deadline:
    """A time limit on one node's SSH exchange: past ``seconds`` the node's connection is dropped,
    which unblocks Paramiko wherever it waits (opening a channel, an SFTP write to a node that stopped
    reading: neither has a timeout of its own). ``expired`` says whether it came to that."""

    def __init__(self, node: Node, ssh: SSH, seconds: float):
        self.node, self.seconds, self._expired = node, seconds, threading.Event()
        self._timer = threading.Timer(seconds, lambda: (self._expired.set(), drop(node, ssh)))
        self._timer.daemon = True

    def __enter__(self) -> "_Deadline":
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    @property
    def expired(self) -> bool:
        return self._expired.is_set()

    def error(self, conn: Connection | None) -> str:
        return (f"ssh {_target(self.node, conn)}: no answer within {self.seconds:.0f} s "
                "(the connection was dropped: is the node down?)")


def _run_one(node: Node, ssh: SSH, cmd: Command, timeout: float, env: Mapping[str, str] | None,
             stream: TextIO | None, lock: threading.Lock, stopped: threading.Event) -> Result:
    shown = command_line(cmd)
    line = wrap(cmd, timeout, env)
    out = err = None
    if stream is not None:
        out, err = _Prefixer(node.name, stream, lock), _Prefixer(node.name + " stderr", stream, lock)
    opts = dict(warn=True, hide=stream is None, out_stream=out, err_stream=err, in_stream=False,
                timeout=timeout + KILL_GRACE_S + ssh.connect_timeout + 5)
    conn = deadline = None
    start = time.monotonic()
    try:
        if node.local:
            r = invoke.Context().run(line, **opts)
        else:
            conn = connection(node, ssh)
            # Ctrl-C while this connection opened: the fan-out's drop may have come before it was
            # cached, so this thread must not start the command (once cached, the drop reaches it)
            if stopped.is_set():
                drop(node, ssh)
                return Result(node.name, shown, None, error="interrupted before it started")
            # a node that dies under an open connection: past the hard limit, the connection goes
            with _Deadline(node, ssh, opts["timeout"] + 5) as deadline:
                r = conn.run(line, **opts)
        code, stdout, stderr = r.exited, r.stdout, r.stderr
    except invoke.CommandTimedOut as e:
        return Result(node.name, shown, None, e.result.stdout, e.result.stderr,
                      time.monotonic() - start, f"no answer within {timeout:.0f} s", True)
    except Exception as e:  # SSH errors of every kind end here, per node
        drop(node, ssh)
        if not (deadline and deadline.expired):
            return Result(node.name, shown, None, duration=time.monotonic() - start,
                          error=ssh_error(e, node, conn))
    finally:
        for s in (out, err):
            if s is not None:
                s.close()
    if deadline and deadline.expired:  # whether the dropped connection raised or returned
        return Result(node.name, shown, None, duration=time.monotonic() - start, timed_out=True,
                      error=deadline.error(conn))
    duration = time.monotonic() - start
    if code == TIMEOUT_STATUS and duration >= timeout - 0.5:
        return Result(node.name, shown, code, stdout, stderr, duration,
                      f"timed out after {timeout:.0f} s (stopped on the node)", True)
    return Result(node.name, shown, code, stdout, stderr, duration)


class Cluster:
    """The nodes of a deployment, as targets for commands."""

    def __init__(self, nodes: Sequence[Node], ssh: SSH | None = None):
        self.nodes = list(nodes)
        self.ssh = ssh or SSH()

    @classmethod
    def from_params(cls, params: Params) -> "Cluster":
        return cls(params.nodes, params.ssh)

    def _select(self, nodes: Iterable[Node | str] | None) -> list[Node]:
        if nodes is None:
            return self.nodes
        by_name = {n.name: n for n in self.nodes}
        return [n if isinstance(n, Node) else by_name[n] for n in nodes]

    def run(self, cmd: PerNode, nodes: Iterable[Node | str] | None = None, *,
            timeout: float | None = None, env: Mapping[str, str] | None = None,
            stream: bool | TextIO = False) -> Results:
        """Run ``cmd`` on the nodes (all by default) in parallel, at most ``ssh.parallel`` at once.

        ``cmd`` may be a function of the node, for commands that differ per node. With ``stream``
        the output is shown while it arrives, each line prefixed with the node's name (to stdout,
        or to the stream given). One node's failure never stops the others: every node gets a
        :class:`Result`."""
        targets = self._select(nodes)
        limit = timeout or self.ssh.command_timeout
        sink = (sys.stdout if stream is True else stream) or None
        lock, stopped = threading.Lock(), threading.Event()

        def one(node: Node) -> Result:
            c = cmd(node) if callable(cmd) else cmd
            started = time.time()
            return replace(_run_one(node, self.ssh, c, limit, env, sink, lock, stopped), started=started)

        return self._fan_out(targets, one, stopped)

    def _fan_out(self, targets: list[Node], fn: Callable[[Node], Result],
                 stopped: threading.Event | None = None) -> Results:
        """``fn`` on every node, in parallel. On Ctrl-C: ``stopped`` is set (a command not yet
        started is not started), then every node's connection dropped, and it raises at once."""
        results = Results()
        if not targets:
            return results
        pool = ThreadPoolExecutor(max_workers=min(self.ssh.parallel, len(targets)))
        try:
            for node, res in zip(targets, pool.map(fn, targets)):
                results[node.name] = res
        except BaseException:  # Ctrl-C (a KeyboardInterrupt in the kernel): no waiting for the nodes
            if stopped is not None:
                stopped.set()  # before the drops: see _run_one
            pool.shutdown(wait=False, cancel_futures=True)
            for node in targets:
                drop(node, self.ssh)  # their commands end with their channels (GUARD)
            raise
        pool.shutdown()
        return results

    def run_on(self, node: Node | str, cmd: Command, **kw) -> Result:
        """Run one command on one node."""
        target = self._select([node])[0]
        return self.run(cmd, [target], **kw)[target.name]

    def put(self, local: str | Path, remote: str | Callable[[Node], str],
            nodes: Iterable[Node | str] | None = None, mode: int = 0o644, *,
            timeout: float | None = None) -> Results:
        """Copy a file to the nodes (SFTP), in parallel; ``remote`` may differ per node."""
        shown = None if callable(remote) else f"put {local} -> {remote}"
        return self.put_bytes(Path(local).read_bytes(), remote, nodes, mode, shown, timeout=timeout)

    def put_bytes(self, data: bytes, remote: str | Callable[[Node], str],
                  nodes: Iterable[Node | str] | None = None, mode: int = 0o644,
                  shown: str | None = None, *, timeout: float | None = None) -> Results:
        """Write ``data`` to a path on the nodes (``remote``, or ``remote(node)`` where it differs per
        node), in parallel, within ``timeout`` seconds per node (``ssh.command_timeout`` by default;
        past it, the node's result is an error). The file is made anew, exclusively: whatever held
        the name before (a file, a symbolic link planted there) is removed, never followed nor
        written through, and the file has ``mode`` before any byte is written (so a secret is never
        readable by others, even for a moment)."""
        path_of = remote if callable(remote) else (lambda node: remote)
        limit = timeout or self.ssh.command_timeout

        def one(node: Node) -> Result:
            start = time.monotonic()
            remote = path_of(node)
            shown_here = shown or f"write {remote}"
            if node.local:
                try:
                    Path(remote).parent.mkdir(parents=True, exist_ok=True)
                    Path(remote).unlink(missing_ok=True)  # a link goes, not what it points to
                    fd = os.open(remote, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                    os.fchmod(fd, mode)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                except OSError as e:
                    return Result(node.name, shown_here, None, error=f"{remote}: {e.strerror}")
                return Result(node.name, shown_here, 0, duration=time.monotonic() - start)
            conn = deadline = None
            try:
                conn = connection(node, self.ssh)
                with _Deadline(node, self.ssh, limit) as deadline:
                    mk = conn.run(shlex.join(["mkdir", "-p", str(Path(remote).parent)]), hide=True,
                                  warn=True, in_stream=False)
                    if not mk.ok:
                        return Result(node.name, shown_here, mk.exited, mk.stdout, mk.stderr)
                    sftp = conn.sftp()
                    try:
                        sftp.remove(remote)  # SFTP's remove is unlink(2): a link goes, not its target
                    except FileNotFoundError:
                        pass
                    with sftp.open(remote, "wxb") as f:  # O_CREAT|O_EXCL: fails on anything there
                        f.chmod(mode)
                        f.write(data)
            except Exception as e:
                if deadline and deadline.expired:  # the dropped connection's error says less
                    return Result(node.name, shown_here, None, duration=time.monotonic() - start,
                                  error=deadline.error(conn), timed_out=True)
                if isinstance(e, OSError):
                    return Result(node.name, shown_here, None, error=f"{remote}: {e.strerror or e}")
                return Result(node.name, shown_here, None, error=ssh_error(e, node, conn))
            return Result(node.name, shown_here, 0, duration=time.monotonic() - start)

        return self._fan_out(self._select(nodes), one)
