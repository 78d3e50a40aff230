"""Host keys of this machine's SSH connections (Fabric/Paramiko), checked as OpenSSH checks them.

Files read: the user's (``~/.ssh/known_hosts``, ``~/.ssh/known_hosts2`` and ssh_config's
UserKnownHostsFile), the system's (ssh_config's GlobalKnownHostsFile, by default
``/etc/ssh/ssh_known_hosts`` and ``/etc/ssh/ssh_known_hosts2``) and those the parameters list
(``ssh.known_hosts``). A host whose key is in none of them is refused (never a prompt, never trusted
on first use); a key marked ``@revoked`` is refused wherever else it is listed.

Host certificates (``@cert-authority`` lines). Paramiko cannot check them: it does not parse these
lines (a file holding one fails to load as a whole) nor negotiate certificate host keys (paramiko
issues #771 and #2277, still open). Three ways were open:

- refuse every such host with a clear error: honest, but a site that manages its host keys with a
  certificate authority (good practice) could not use sparkbook without listing keys by hand;
- read the host's key with ``ssh-keyscan`` and trust it: that is no check at all (keyscan reports
  whatever the host, or whoever answers in its place, presents);
- let OpenSSH, which checks certificates (the CA's signature, the principals, the validity period,
  revocation), check the host, then accept in Paramiko exactly the key the host proved to OpenSSH.

sparkbook does the last. When a host's key is in no file and some file holds a ``@cert-authority``
line (or a key for a host pattern, ``*.example.com``, which Paramiko does not match either), it runs
``ssh -v -o BatchMode=yes -o StrictHostKeyChecking=yes ... HOST true`` with every authentication
method, the agent, forwarding and connection sharing off (a fresh connection whose only use is the
host check; it ends at "Permission denied", which is expected), and reads OpenSSH's debug lines:
that the host "is known and matches" a host certificate (or key), and the fingerprint of the key it
presented. Paramiko, connecting next, accepts the host only if its key has that very
fingerprint: the key exchange proves the host holds the private key, so nobody else can present it.
The fingerprint is kept for this process only, never written to a known_hosts file. When OpenSSH
refuses the host, the error says so, with OpenSSH's reason and the remedy. One limit: Paramiko
chooses its host key type itself (ed25519 first); for a host whose certificate covers another of its
keys only, the error names both types (certify the ed25519 key too, or list the host's key).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
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


@dataclass(frozen=True)
class Verified:
    """The key OpenSSH accepted for a host: its type and fingerprint."""
    kind: str
    fingerprint: str


_verified: dict[tuple, Verified] = {}
_lock = threading.Lock()


def openssh_command(conn: Connection, paths: list[str], timeout: float) -> list[str]:
    """``ssh`` checking ``conn``'s host against ``paths`` and nothing else: no authentication, no
    agent, no forwarding, no shared connection, nothing written to a known_hosts file."""
    no = ["PubkeyAuthentication", "PasswordAuthentication", "KbdInteractiveAuthentication",
          "GSSAPIAuthentication", "HostbasedAuthentication", "ForwardAgent", "ForwardX11",
          "UpdateHostKeys", "ControlMaster", "PermitLocalCommand"]
    opts = [f"{o}=no" for o in no] + [
        "BatchMode=yes", "StrictHostKeyChecking=yes", "ControlPath=none", "ClearAllForwardings=yes",
        "FingerprintHash=sha256", f"ConnectTimeout={max(int(timeout), 1)}",
        "UserKnownHostsFile=" + " ".join(f'"{p}"' if " " in p else p for p in paths)]
    return ["ssh", "-v", "-T", *[a for o in opts for a in ("-o", o)], "-p", str(conn.port),
            *(["-l", conn.user] if conn.user else []), "--", conn.original_host, "true"]


def openssh_verify(conn: Connection, name: str, known: KnownHosts, timeout: float) -> Verified:
    """Have OpenSSH check ``conn``'s host, known as ``name`` (``HOST`` or ``[HOST]:PORT``), against
    ``known``'s files, once per process while they stay the same; raises :class:`HostKeyRefused`."""
    key = (conn.original_host, name, conn.port, conn.user, tuple(known.files), known.digest)
    with _lock:
        if key in _verified:
            return _verified[key]
    cmd = openssh_command(conn, known.files, timeout)
    shown = " ".join(cmd[:3]) + " ... " + " ".join(cmd[-3:])
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=2 * timeout + 10)
    except FileNotFoundError:
        raise HostKeyRefused("OpenSSH's ssh client, which checks host certificates for sparkbook, "
                             "is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise HostKeyRefused(f"OpenSSH's check of the host did not end (`{shown}`)") from None
    # OpenSSH's own debug lines, whole lines only (it escapes control characters in what it logs,
    # so a server's words cannot forge one); a ProxyJump hop's lines come first, the host's last
    err = done.stderr
    matched = re.search(rf"^debug1: Host '{re.escape(name)}' is known and matches the \S+ host "
                        r"(?:certificate|key)\.$", err, re.M)
    seen = matched and re.findall(r"^debug1: Server host (?:certificate|key): (\S+) "
                                  r"(SHA256:[A-Za-z0-9+/]+)(?:,|$)", err[:matched.start()], re.M)
    if not (matched and seen):
        said = [ln.strip() for ln in err.splitlines()
                if ln.strip() and not ln.startswith(("debug", "OpenSSH_"))]
        raise HostKeyRefused(f"OpenSSH did not accept the host either (`{shown}`): "
                             + (" | ".join(said[-3:]) or f"exit status {done.returncode}"))
    found = Verified(*seen[-1])
    with _lock:
        _verified[key] = found
    return found


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
            # the wording of Paramiko's RejectPolicy, which remote.ssh_error explains
            raise paramiko.SSHException(f"Server {hostname!r} not found in known_hosts")
        where = ", ".join(deferred[:3])
        try:
            ok = openssh_verify(self.conn, hostname, self.known, self.timeout)
        except HostKeyRefused as e:
            raise HostKeyRefused(
                f"{hostname}'s key is in no known_hosts file that Paramiko can read, and those files "
                f"trust a certificate authority or a host pattern ({where}), which only OpenSSH "
                f"applies. {str(e).rstrip('.')}. Check the host's certificate or key (`ssh -v -p "
                f"{self.conn.port} {self.conn.original_host} true` says why OpenSSH refuses it), or "
                "add the host's own key to known_hosts after checking its fingerprint.") from None
        if ok.fingerprint != key.fingerprint:
            raise HostKeyRefused(
                f"OpenSSH accepted {hostname}'s {ok.kind} {ok.fingerprint} ({where}), but Paramiko was "
                f"offered its {key.get_name()} key {key.fingerprint}: Paramiko cannot ask for the "
                "other. Give the host a certificate for this key too, or add the host's key to "
                "known_hosts after checking its fingerprint.")


def guard(conn: Connection, extra: Iterable[str], timeout: float) -> None:
    """Check host keys strictly on ``conn`` and on every ProxyJump hop in front of it."""
    extra = list(extra)
    while isinstance(conn, Connection):
        known = read(files(conn, extra), conn.client.get_host_keys())
        conn.client.set_missing_host_key_policy(StrictPolicy(conn, known, timeout))
        conn = conn.gateway
