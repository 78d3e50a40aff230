"""One run at a time per deployment: a lock on the head for the steps that change the nodes.

The lock is a file in the head's private working folder (:func:`sparkbook.nodes.workdir.workdir`), so
every operator machine that drives the deployment sees it. It names its holder: who (user@host),
the process (pid, and what tells it from any other: its boot ID, PID namespace and start time),
the run folder, since when. It is taken atomically (``scripts/lock.sh``).

* ``sparkbook run`` takes it once, before the first step, when any selected step changes the
  nodes (:data:`STEPS`), refreshes it while it runs, and releases it at the end; its kernels get
  the lock's token in ``$SPARKBOOK_LOCK`` and pass while the lock is still the run's.
* A notebook of such a step run by hand (or by papermill directly) takes it in
  ``sparkbook.notebook.start`` and releases it when the step concludes, or when its kernel exits
  (a step that stopped on an error keeps it until then: restart the kernel, or re-run the step).
* Anyone else is refused with :class:`LockHeld`, which names the holder.
* A run whose lock was taken over or broken stops before it changes the nodes again
  (:meth:`Lock.check`, at each step's gate and work): :class:`LockLost`.

A lock is stale, and is taken over (with a message that says whose it was and why), when its
process is shown gone: it ran in this boot and PID namespace (a host name proves nothing: a
container on the host's network or a cloned VM shares it) and no process of its pid and start
time runs; or when its holder has not refreshed it for :data:`STALE_S` seconds (holders refresh it
every :data:`HEARTBEAT_S` seconds; its age is measured by the head's own clock). A holder that
cannot be shown gone is waited for. ``sparkbook unlock`` breaks a lock by hand.

The working folder belongs to the SSH user: operators who log in to the head as different users
do not see each other's lock.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..book.errors import CheckFailed, SparkbookError
from ..params import Params
from .remote import Cluster
from .shell import script
from .workdir import prepare, workdir

# the steps (notebook names without their number) that start, change or remove containers or files
# on the nodes
STEPS = ("collectives", "distribute_image", "ray_cluster", "serve", "teardown")
ENV = "SPARKBOOK_LOCK"  # the token of the lock ``sparkbook run`` holds, for its kernels
HEARTBEAT_S = 60
STALE_S = 600

_own_token = secrets.token_hex(8)  # this process's, when it takes the lock itself


class LockHeld(SparkbookError):
    """Another run holds the deployment's lock."""


class LockLost(LockHeld):
    """The lock this run held was taken over or broken while it ran."""


def changes_state(name: str) -> bool:
    """Whether the step ``name`` (``05_serve``) changes the nodes, and so needs the lock."""
    return name[:2].isdigit() and name[2:3] == "_" and name[3:] in STEPS


@dataclass
class Holder:
    """What a lock file says about who holds it."""

    token: str = ""
    owner: str = "?"
    host: str = ""
    pid: int = 0
    process: str = ""  # BOOT_ID/PID_NAMESPACE/START_TIME (:func:`_process`); "" from older versions
    run: str = "?"
    started: str = "?"
    age_s: int = 0

    @classmethod
    def parse(cls, lines: list[str]) -> "Holder":
        kv = dict(line.split("=", 1) for line in lines if "=" in line)
        number = {k: int(v) if v.lstrip("-").isdigit() else 0 for k, v in kv.items()}
        return cls(kv.get("token", ""), kv.get("owner", "?"), kv.get("host", ""),
                   number.get("pid", 0), kv.get("process", ""), kv.get("run", "?"),
                   kv.get("started", "?"), number.get("age", 0))

    def __str__(self) -> str:
        return (f"{self.owner} (pid {self.pid}, run folder {self.run}, since {self.started}, "
                f"refreshed {self.age_s} s ago)")

    def here(self) -> bool:
        """Whether its process ran in this boot and PID namespace, where its pid means the same."""
        where = self.process.rpartition("/")[0]
        return bool(where) and where == _process().rpartition("/")[0]

    def stale(self) -> str | None:
        """Why this lock is stale, or None while its holder may still be at work."""
        start = self.process.rpartition("/")[2]
        if self.here() and self.pid and start and _start(self.pid) != start:
            return f"its process {self.pid} on this machine is gone"
        if self.age_s > STALE_S:
            return (f"not refreshed for {self.age_s} s (a holder refreshes it every {HEARTBEAT_S} s; "
                    f"stale after {STALE_S} s)")
        return None


def _start(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, /proc's field 22; "" when there is no
    such process): a later process that got the same pid has another."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _process() -> str:
    """This process as no other can be: BOOT_ID/PID_NAMESPACE/START_TIME. The boot ID differs on a
    cloned VM, the PID namespace in a container that shares this host name; "" where /proc cannot
    say (then no holder is ever judged gone by its pid)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    start = _start(os.getpid())
    return f"{boot}/{namespace}/{start}" if boot and start else ""


def _lost(holder: Holder | None) -> str:
    return ("the deployment's lock is no longer this run's: "
            + (f"{holder} took it over" if holder else "it was broken (`sparkbook unlock`) or removed"))


@dataclass
class Lock:
    """The deployment's lock, held by this process or by the ``sparkbook run`` it runs under."""

    params: Params
    cluster: Cluster
    token: str
    owned: bool  # taken by this process (which releases it), not inherited from ``sparkbook run``
    lost: str = ""  # why the lock is no longer this run's, once a refresh or a check found it so
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def _touch(self) -> str:
        """Touch the lock (its holder is at work); "" while it is ours, else why not."""
        state, holder = _call(self.params, self.cluster, "touch", self.token)
        return "" if state == "LOCK-OURS" else _lost(holder)

    def refresh(self) -> None:
        """Touch the lock; say at once when it is no longer ours (the run stops at its next
        :meth:`check`)."""
        if not self.lost and (why := self._touch()):
            self.lost = why
            print(f"sparkbook: lock: {why}", file=sys.stderr, flush=True)

    def check(self) -> None:
        """Before the run changes the nodes again: raise :class:`LockLost` when the lock is no
        longer its own (asked of the head now: the heartbeat finds it only once a minute)."""
        self.lost = self.lost or self._touch()
        if self.lost:
            raise LockLost(f"{self.lost}. This run stops here, before it changes the nodes again: "
                           "two runs must not change them at once. Start it again once the other "
                           "run has ended.")

    def keep_fresh(self) -> None:
        """Refresh the lock every :data:`HEARTBEAT_S` seconds until released (a daemon thread)."""
        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    self.refresh()
                except SparkbookError:  # the head did not answer this time
                    pass
        threading.Thread(target=beat, name="sparkbook-lock", daemon=True).start()

    def release(self) -> None:
        """Give the lock back (when this process took it; idempotent; a failure is only said)."""
        self._stop.set()
        if not self.owned or self.lost:  # a lost lock is another's, or none
            return
        self.owned = False
        try:
            _call(self.params, self.cluster, "release", self.token, timeout=15)
        except SparkbookError as e:
            print(f"sparkbook: lock: could not release the lock: {e}", file=sys.stderr, flush=True)


def _call(params: Params, cluster: Cluster, action: str, *args: str,
          timeout: float = 30) -> tuple[str, Holder | None]:
    head = params.head
    r = cluster.run_on(head, script("lock.sh", action, workdir(params, head), *args), timeout=timeout)
    lines = r.stdout.splitlines()
    state = next((ln for ln in lines if ln.startswith("LOCK-")), "")
    if not r.ok or not state:
        raise CheckFailed(f"lock: cannot {action} the deployment's lock on the head {head.name}: "
                          f"{r.summary()}")
    rest = lines[lines.index(state) + 1:]
    return state, (Holder.parse(rest) if rest else None)


def _identity(run: str) -> list[str]:
    host = socket.gethostname()
    return [f"{getpass.getuser()}@{host}", host, str(os.getpid()), _process(), " ".join(run.split()),
            datetime.now(timezone.utc).isoformat(timespec="seconds")]


def acquire(params: Params, cluster: Cluster, run: str) -> Lock:
    """Take the deployment's lock for the run folder ``run`` (or pass, under the ``sparkbook run``
    that holds it: ``$SPARKBOOK_LOCK``; :class:`LockLost` when the run no longer does). Takes over
    a stale lock, saying so on stderr; raises :class:`LockHeld` naming the holder when another run
    holds it."""
    prepare(params, cluster, [params.head])
    inherited = os.environ.get(ENV, "")
    if inherited:  # a kernel of `sparkbook run`: the run's lock, which must still be the run's
        held = Lock(params, cluster, inherited, owned=False)
        held.check()
        return held
    token = _own_token
    state, holder = _call(params, cluster, "acquire", token, *_identity(run))
    if state == "LOCK-HELD" and holder is not None and (why := holder.stale()):
        state, new = _call(params, cluster, "take", holder.token, token, *_identity(run))
        if state == "LOCK-ACQUIRED":
            print(f"sparkbook: lock: took over the stale lock of {holder}: {why}",
                  file=sys.stderr, flush=True)
        else:  # another run took it over first
            holder = new
    if state not in ("LOCK-ACQUIRED", "LOCK-OURS"):
        # a pid that is free here says nothing of a holder of this name in another namespace
        unseen = (" It ran under this machine's name, but in another boot or PID namespace (a "
                  "container, a cloned machine), where sparkbook cannot see whether it still runs."
                  if holder is not None and holder.host == socket.gethostname() and not holder.here()
                  else "")
        raise LockHeld(
            f"the deployment {params.name!r} is locked by another run: the lock on the head "
            f"{params.head.name} is held by {holder}.{unseen} Wait for that run to end; if it is "
            f"gone, `sparkbook unlock -p PARAMS` breaks the lock (a lock that its holder stopped "
            f"refreshing is taken over after {STALE_S} s).")
    return Lock(params, cluster, token, owned=True)


def unlock(params: Params, cluster: Cluster) -> Holder | None:
    """Break the deployment's lock, whoever holds it; returns whose it was (None: there was none)."""
    state, holder = _call(params, cluster, "break")
    return holder if state == "LOCK-BROKEN" else None
