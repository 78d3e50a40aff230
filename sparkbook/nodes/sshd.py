"""A private OpenSSH server: its own host key, port, authorized keys and known_hosts entry.

Used by the lab (one per node, inside the node's network namespace) and by the tests (several on
loopback, each playing a node). Needs Debian's ``openssh-server``.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

SSHD = "/usr/sbin/sshd"


def certify_host(ca: Path, key: Path, names: Sequence[str], validity: str = "-5m:+1h") -> Path:
    """A host certificate for ``key`` (its ``.pub``), signed by the CA key ``ca``, valid for
    ``names``; returns the certificate's path (``KEY-cert.pub``)."""
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", f"sparkbook-{key.name}", "-h",
                    "-n", ",".join(names), "-V", validity, str(key) + ".pub"], check=True)
    return Path(str(key) + "-cert.pub")


def keygen(path: Path, comment: str = "sparkbook") -> Path:
    """An ed25519 key pair at ``path`` (kept when it exists); returns the private key's path."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       check=True)
    return path


@dataclass
class SshServer:
    """One sshd. ``address`` is where clients reach it; ``listen`` what it binds (default: the
    same). ``prefix`` runs it elsewhere, e.g. ``["nsenter", "-t", PID, "-a"]`` for a lab node."""

    root: Path
    port: int
    address: str = "127.0.0.1"
    authorized_keys: Sequence[Path] = ()
    prefix: Sequence[str] = ()
    set_env: dict[str, str] | None = None
    listen: str | None = None
    host_certificate: Path | None = None  # the host key's certificate (`ssh-keygen -s CA -h`)

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def pidfile(self) -> Path:
        return self.root / "sshd.pid"

    def known_hosts_line(self, names: Sequence[str] = ()) -> str:
        """This server's known_hosts entry for its address and the other ``names`` it answers to
        (``[name]:port`` form when the port is not 22)."""
        names = [self.address, *names]
        shown = ",".join(n if self.port == 22 else f"[{n}]:{self.port}" for n in names)
        kind, key = Path(str(self.host_key) + ".pub").read_text().split()[:2]
        return f"{shown} {kind} {key}\n"

    def config(self) -> str:
        keys = self.root / "authorized_keys"
        lines = [
            f"Port {self.port}", f"ListenAddress {self.listen or self.address}", f"HostKey {self.host_key}",
            f"PidFile {self.pidfile}", f"AuthorizedKeysFile {keys}", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "UsePAM no",
            "StrictModes no", "PrintMotd no", "AcceptEnv LANG LC_*", "Subsystem sftp internal-sftp",
            "MaxSessions 64", "MaxStartups 64:30:128", "LogLevel VERBOSE",
        ]
        if self.host_certificate:
            lines.append(f"HostCertificate {self.host_certificate}")
        if self.set_env:
            lines.append("SetEnv " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.set_env.items()))
        return "\n".join(lines) + "\n"

    def start(self, wait: float = 10.0) -> "SshServer":
        self.root.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
        keygen(self.host_key, f"sparkbook-{self.port}")
        (self.root / "authorized_keys").write_text(
            "".join(Path(str(k) + ".pub").read_text() for k in self.authorized_keys))
        cfg = self.root / "sshd_config"
        cfg.write_text(self.config())
        subprocess.run([*self.prefix, SSHD, "-f", str(cfg), "-E", str(self.root / "sshd.log")],
                       check=True)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.pidfile.exists() and self._listening():
                return self
            time.sleep(0.05)
        log = self.root / "sshd.log"
        seen = log.read_text(errors="replace")[-1500:].strip() if log.exists() else "(no log)"
        raise RuntimeError(f"sshd on {self.address}:{self.port} did not start in {wait:.0f} s "
                           f"(pid file {'written' if self.pidfile.exists() else 'missing'}, port "
                           f"{'open' if self._listening() else 'closed'}); {log} ends:\n{seen}")

    def _listening(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((self.address, self.port)) == 0

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop the server and every session it spawned."""
        pid = self.pid()
        if pid and self.prefix:  # the pidfile holds a pid of the node's own pid namespace
            subprocess.run([*self.prefix, "pkill", "-TERM", "-P", str(pid)], check=False)
            subprocess.run([*self.prefix, "kill", "-TERM", str(pid)], check=False)
        elif pid:
            subprocess.run(["pkill", "-TERM", "-P", str(pid)], check=False)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
        self.pidfile.unlink(missing_ok=True)
