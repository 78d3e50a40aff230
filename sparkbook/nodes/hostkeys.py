"""Host keys of this machine's SSH connections (Fabric/Paramiko), checked as OpenSSH checks them.

Files read: the user's (``~/.ssh/known_hosts``, ``~/.ssh/known_hosts2`` and ssh_config's
UserKnownHostsFile), the system's (ssh_config's GlobalKnownHostsFile, by default
``/etc/ssh/ssh_known_hosts`` and ``/etc/ssh/ssh_known_hosts2``) and those the parameters list
(``ssh.known_hosts``). A host whose key is in none of them is refused (never a prompt, never trusted
on first use); a key marked ``@revoked`` is refused wherever else it is listed.

Host certificates (``@cert-authority`` lines) and host patterns (``*.example.com``). Paramiko
checks neither: it does not parse ``@cert-authority`` lines (a file holding one fails to load as a
whole) nor negotiate certificate host keys (paramiko issues #771 and #2277, still open), and it
matches host names, not patterns. OpenSSH checks both (for a certificate: the CA's signature, the
principals, the validity period, revocation). So when a host's key is in no file and some file holds
such a line, OpenSSH decides, and only by what a server cannot write:

- its verdict is the exit status of ``ssh -o BatchMode=yes -o StrictHostKeyChecking=yes ... HOST
  true`` against the same files: 0 only when it accepted the host's key, logged in (with the
  node's key or the agent, as Paramiko does) and ran ``true``. It must log in: short of that, ssh
  fails either way and only its messages tell why. Those are never read: a server can print lines
  that look like OpenSSH's own (an SSH debug message may hold newlines), and an impostor that did
  was once accepted (issue 26);
- the key it accepted is the one its ``KnownHostsCommand`` was given: ssh runs that command on
  this machine with the fingerprint of the key it was offered, and the command appends it to a
  private file. ssh is asked for the type of key Paramiko was offered (its certificate first);
  Paramiko then accepts the host only if its own key has that very fingerprint (its key exchange
  proves the host holds the private key, so nobody else can present it).

The check is a fresh connection whose only use it is: no password or keyboard prompt, no agent or
X11 forwarding, no port forwarding, no shared connection, nothing written to a known_hosts file. It
is made once per host and key per process while the files stay the same, never written down. When
OpenSSH refuses, the error says so, with what ssh said and the remedy. One limit: Paramiko chooses
its host key type itself (ed25519 first); a certificate of another of the host's keys does not
count (certify the ed25519 key too, or list the host's key).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import paramiko
from fabric import Connection
from paramiko.hostkeys import HostKeyEntry

USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
SYSTEM_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


class HostKeyRefused(paramiko.SSHException):
    """A host key refused; the message says why and what to do."""


class UnknownHostKey(paramiko.SSHException):
    """A host whose key is in no known_hosts file read (``hostname`` as Paramiko looks it up:
    ``HOST``, or ``[HOST]:PORT`` off port 22); worded as Paramiko's RejectPolicy words it."""

    def __init__(self, hostname: str):
        super().__init__(f"Server {hostname!r} not found in known_hosts")
        self.hostname = hostname
        bracketed = re.fullmatch(r"\[(.+)\]:(\d+)", hostname)
        self.host, self.port = (bracketed[1], int(bracketed[2])) if bracketed else (hostname, 22)


@dataclass
class KnownHosts:
    """What the known_hosts files say, besides the plain keys (which go to Paramiko)."""
    files: list[str]
    authorities: list[str] = field(default_factory=list)  # FILE:LINE of every @cert-authority line
    patterns: list[str] = field(default_factory=list)  # FILE:LINE of keys for host patterns (*, ?, !)
    digest: str = ""  # of the files' contents: what OpenSSH's answer holds for
    revoked: set[str] = field(default_factory=set)  # fingerprints of the @revoked keys


def files(conn: Connection, extra: Iterable[str] = ()) -> list[str]:
    """The known_hosts files for ``conn``, as OpenSSH would read them, then ``extra``."""
    user = conn.ssh_config.get("userknownhostsfile")
    system = conn.ssh_config.get("globalknownhostsfile")
    names = [*USER_FILES, *(user.split() if user else ()), *(system.split() if system else SYSTEM_FILES),
             *extra]
    return list(dict.fromkeys(str(Path(n).expanduser()) for n in names))


def _entry(line: str) -> HostKeyEntry | None:
    try:
        return HostKeyEntry.from_line(line)
    except Exception:  # a line Paramiko cannot read (a key type it lacks): skipped, as OpenSSH does
        return None


def read(paths: list[str], into: paramiko.HostKeys) -> KnownHosts:
    """Load the plain keys of ``paths`` into ``into`` (leaving out revoked ones) and return the
    rest: where the certificate authorities and the host patterns are, and the revoked keys.
    Missing files are skipped."""
    known, plain, digest = KnownHosts(paths), [], hashlib.sha256()
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        digest.update(f"{path}\0{text}\0".encode())
        lines = text.splitlines()
        for no, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            marker, rest = line.split(None, 1) if line.startswith("@") else ("", line)
            if marker == "@cert-authority":
                known.authorities.append(f"{path}:{no}")
            elif (entry := _entry(" ".join(rest.split()))) is None:
                continue
            elif marker == "@revoked":
                known.revoked.add(entry.key.fingerprint)
            elif not marker:
                plain.append(entry)
                if any(c in name for name in entry.hostnames for c in "*?!"):
                    known.patterns.append(f"{path}:{no}")  # Paramiko matches names, not patterns
    known.digest = digest.hexdigest()
    for entry in plain:
        if entry.key.fingerprint not in known.revoked:
            for name in entry.hostnames:
                into.add(name, entry.key.get_name(), entry.key)
    return known


_verified: set[tuple] = set()
_lock = threading.Lock()
SEEN_ENV = "SPARKBOOK_SEEN_HOST_KEY"  # the file the KnownHostsCommand appends to


def _algorithms(key: paramiko.PKey) -> str:
    """OpenSSH's names for ``key``'s type, its certificate first: so that ssh is offered the very
    key Paramiko was (a host holds one key of each type)."""
    kind = key.get_name()
    names = ["rsa-sha2-512", "rsa-sha2-256"] if kind == "ssh-rsa" else [kind]
    return ",".join([f"{n}-cert-v01@openssh.com" for n in names] + names)


def openssh_command(conn: Connection, paths: list[str], timeout: float, key: paramiko.PKey) -> list[str]:
    """``ssh`` logging in to ``conn``'s host to run ``true``, the host checked against ``paths`` and
    nothing else, asking for ``key``'s type; the fingerprint of the key it is offered goes to the
    file ``$SPARKBOOK_SEEN_HOST_KEY`` (ssh runs KnownHostsCommand once without a key too: NONE)."""
    no = ["PasswordAuthentication", "KbdInteractiveAuthentication", "GSSAPIAuthentication",
          "HostbasedAuthentication", "ForwardAgent", "ForwardX11", "UpdateHostKeys", "ControlMaster",
          "PermitLocalCommand", "CheckHostIP"]
    opts = [f"{o}=no" for o in no] + [
        "BatchMode=yes", "StrictHostKeyChecking=yes", "ControlPath=none", "ClearAllForwardings=yes",
        "RemoteCommand=none", "LogLevel=ERROR", "FingerprintHash=sha256",
        f"ConnectTimeout={max(int(timeout), 1)}", f"HostKeyAlgorithms={_algorithms(key)}",
        "UserKnownHostsFile=" + " ".join(f'"{p}"' if " " in p else p for p in paths),
        "GlobalKnownHostsFile=none",  # the system's files are among ``paths`` already
        f"KnownHostsCommand=/bin/sh -c 'echo \"$0\" >>\"${SEEN_ENV}\"' %f"]
    keys = conn.connect_kwargs.get("key_filename") or []
    return ["ssh", "-T", *[a for o in opts for a in ("-o", o)],
            *[a for k in ([keys] if isinstance(keys, str) else keys) for a in ("-i", k)],
            "-p", str(conn.port), *(["-l", conn.user] if conn.user else []),
            "--", conn.original_host, "true"]


def openssh_verify(conn: Connection, key: paramiko.PKey, known: KnownHosts, timeout: float) -> None:
    """Have OpenSSH check that ``conn``'s host, offering ``key``, is the one ``known``'s files
    trust; raises :class:`HostKeyRefused`. Once per host and key per process while the files stay
    the same."""
    cached = (conn.original_host, conn.port, conn.user, tuple(known.files), known.digest,
              key.fingerprint)
    with _lock:
        if cached in _verified:
            return
    cmd = openssh_command(conn, known.files, timeout, key)
    shown = " ".join(cmd[:3]) + " ... " + " ".join(cmd[-3:])
    with tempfile.TemporaryDirectory(prefix="sparkbook-hostkey-") as tmp:
        seen_file = Path(tmp, "seen")
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=2 * timeout + 10, env={**os.environ, SEEN_ENV: str(seen_file)})
        except FileNotFoundError:
            raise HostKeyRefused("OpenSSH's ssh client, which checks host certificates and patterns "
                                 "for sparkbook, is not installed on this machine") from None
        except subprocess.TimeoutExpired:
            raise HostKeyRefused(f"OpenSSH's check of the host did not end (`{shown}`)") from None
        seen = set(seen_file.read_text().split()) - {"NONE"} if seen_file.exists() else set()
    if done.returncode != 0:
        # shown to say why, never read for the verdict: a server can write into these lines
        said = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        raise HostKeyRefused(f"OpenSSH did not accept the host either (`{shown}` ended with exit status "
                             f"{done.returncode}: {' | '.join(said[-3:]) or 'it said nothing'}; it "
                             f"checks the host by logging in to it, and was asked for its "
                             f"{key.get_name()} key, the type Paramiko was offered)")
    if seen != {key.fingerprint}:
        raise HostKeyRefused(f"OpenSSH accepted the host's key {', '.join(sorted(seen)) or '(none seen)'}, "
                             f"but Paramiko was offered {key.get_name()} {key.fingerprint}: another "
                             "machine may be answering in the host's place")
    with _lock:
        _verified.add(cached)


class StrictPolicy(paramiko.MissingHostKeyPolicy):
    """Paramiko's answer for a host whose key is in no known_hosts file: refused, unless OpenSSH
    vouches for exactly this key (see the module's text)."""

    def __init__(self, conn: Connection, known: KnownHosts, timeout: float):
        self.conn, self.known, self.timeout = conn, known, timeout

    def missing_host_key(self, client, hostname, key):
        if key.fingerprint in self.known.revoked:
            raise HostKeyRefused(f"the host key of {hostname} ({key.get_name()} {key.fingerprint}) is "
                                 "marked @revoked in known_hosts: refused")
        deferred = self.known.authorities + self.known.patterns
        if not deferred:
            raise UnknownHostKey(hostname)  # remote.ssh_error explains it
        where = ", ".join(deferred[:3])
        try:
            openssh_verify(self.conn, key, self.known, self.timeout)
        except HostKeyRefused as e:
            raise HostKeyRefused(
                f"{hostname}'s key is in no known_hosts file that Paramiko can read, and those files "
                f"trust a certificate authority or a host pattern ({where}), which only OpenSSH "
                f"applies. {str(e).rstrip('.')}. Check the host's certificate or key (`ssh -v -p "
                f"{self.conn.port} {self.conn.original_host} true` says why OpenSSH refuses it), or "
                "add the host's own key to known_hosts after checking its fingerprint.") from None


def guard(conn: Connection, extra: Iterable[str], timeout: float) -> None:
    """Check host keys strictly on ``conn`` and on every ProxyJump hop in front of it."""
    extra = list(extra)
    while isinstance(conn, Connection):
        known = read(files(conn, extra), conn.client.get_host_keys())
        conn.client.set_missing_host_key_policy(StrictPolicy(conn, known, timeout))
        conn = conn.gateway
