"""Ctrl-C and SIGTERM during ``sparkbook run``: stop the running step, clean up, say what is left.

The kernels run in a session of their own (jupyter_client starts them so on POSIX), so Ctrl-C in a
terminal, which signals the whole foreground process group, reaches the runner and not the
kernel; SIGTERM from a scheduler reaches the runner alone too. On the first signal the running
step stops: a cell that runs gets a KeyboardInterrupt (the kernel is interrupted), no further cell
starts, and a kernel whose cell has not ended within :data:`GRACE_S` is killed; the runner then
runs the teardown step and exits with 128 + the signal (130 for SIGINT, 143 for SIGTERM). A
teardown that is running when the first signal comes goes on. A second signal kills the running
kernel at once, teardown included, and the teardown is skipped.

A kernel is interrupted only while one of its cells runs: ipykernel ignores SIGINT between cells,
and a kernel that is still starting would die of it with a traceback.

The kernel talks to the runner over Unix sockets in a private folder, not over TCP ports:
jupyter_client picks free ports by binding and releasing them, so a kernel started beside other
Jupyter processes can lose its port before it binds and die with "Address already in use"
("Kernel died before replying to kernel_info"; seen in CI with three test workers, and reported
for parallel notebook runs, e.g. statsmodels/statsmodels#4116).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from typing import Any

from jupyter_client import AsyncKernelManager

GRACE_S = 15.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _say(text: str) -> None:
    os.write(2, f"\nsparkbook: {text}\n".encode())  # no buffered stream in a signal handler


class Stopped(Exception):
    """The step was stopped by a signal before its next cell."""


class Interrupts:
    """Catches SIGINT and SIGTERM while a run goes on (a context manager; in the main thread only,
    elsewhere it catches nothing) and stops the kernel of the step that runs."""

    def __init__(self) -> None:
        self.signum = 0  # the first signal, 0 while none came
        self.count = 0
        self.step = ""
        self.protected = False  # the running step goes on at the first signal (the teardown)
        self.busy = False  # a cell of the running step is executing
        self._kernel: AsyncKernelManager | None = None
        self._serial = 0
        self._lock = threading.RLock()  # the signal handler may run while the main thread holds it
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}
        self._sockets: str | None = None  # the running kernel's socket folder

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self.end()

    @property
    def skip_teardown(self) -> bool:
        return self.count >= 2

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def stopping(self) -> bool:
        """Whether the running step is to stop."""
        return self.skip_teardown or (bool(self.signum) and not self.protected)

    def papermill_kwargs(self) -> dict[str, Any]:
        """What papermill (nbclient) gets: the kernel manager a signal reaches, and the hooks that
        say when a cell runs and stop the step before its next cell."""
        return {"kernel_manager_class": self._kernel_class(), "on_cell_start": self._cell_start,
                "on_cell_execute": self._cell_execute, "on_cell_executed": self._cell_executed}

    def _cell_start(self, **kw: Any) -> None:
        if self.stopping:
            raise Stopped(f"stopped by {self.name} before its next cell")

    def _cell_execute(self, **kw: Any) -> None:
        self.busy = True

    def _cell_executed(self, **kw: Any) -> None:
        self.busy = False

    def _kernel_class(self) -> type[AsyncKernelManager]:
        interrupts = self

        class Stoppable(AsyncKernelManager):
            def __init__(self, *args: Any, **kw: Any) -> None:
                sockets = tempfile.mkdtemp(prefix="sparkbook-kernel-")
                super().__init__(*args, transport="ipc", ip=os.path.join(sockets, "k"), **kw)
                with interrupts._lock:
                    interrupts._kernel, interrupts._sockets = self, sockets

        return Stoppable

    def begin(self, step: str, protected: bool = False) -> None:
        with self._lock:
            self.step, self.protected, self._kernel, self.busy = step, protected, None, False
            self._serial += 1

    def end(self) -> None:
        with self._lock:
            self.step, self._kernel = "", None
            if self._sockets:
                shutil.rmtree(self._sockets, ignore_errors=True)
                self._sockets = None
            self._serial += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        if self.count == 1:
            self.signum = signum
            if self.protected:
                _say(f"{name}: {self.step} goes on (a second signal stops it)")
            else:
                _say(f"{name}: stopping {self.step or 'the run'} (a second signal stops at once, "
                     "without the teardown)")
                if self.busy:
                    self._send(signal.SIGINT)
                with self._lock:
                    serial = self._serial
                    self._timer = threading.Timer(GRACE_S, self._kill_if, (serial,))
                    self._timer.daemon = True
                    self._timer.start()
        elif self.count == 2:
            _say(f"{name} again: stopping {self.step or 'the run'} now, without the teardown")
            self._send(signal.SIGKILL)

    def _kill_if(self, serial: int) -> None:
        """The grace time is over: kill the kernel, if its step is still the one interrupted."""
        if serial == self._serial:
            _say(f"{self.step} did not stop within {GRACE_S:.0f} s of the interrupt: its kernel is "
                 "stopped")
            self._send(signal.SIGKILL)

    def _send(self, signum: int) -> None:
        """Signal the running kernel's process group (its own session: the kernel and what its
        cells started)."""
        with self._lock:
            kernel = self._kernel
        provisioner = getattr(kernel, "provisioner", None)
        pid, pgid = getattr(provisioner, "pid", None), getattr(provisioner, "pgid", None)
        try:
            if pgid and pgid != os.getpgrp():
                os.killpg(pgid, signum)
            elif pid:
                os.kill(pid, signum)
        except ProcessLookupError:
            pass
