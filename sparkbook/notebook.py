"""What every notebook does first: find its parameters, validate them, pick its run folder.

A notebook's ``parameters`` cell holds only ``params_file`` and ``run_dir`` (both None). Then:

* ``sparkbook run`` injects both;
* ``papermill NB OUT -f parameters/X.yaml`` injects the deployment's fields themselves;
* opened in JupyterLab with nothing injected, the notebook reads ``$SPARKBOOK_PARAMS`` or
  ``parameters/lab.yaml``.

:func:`start` handles the three and prints which parameters and which run folder are used. The
returned :class:`Context` runs the notebook's step (a module of :mod:`sparkbook.steps`, see
:mod:`sparkbook.book.step`), records its outcome, gates and concludes.

A step that changes the nodes (:data:`sparkbook.nodes.lock.STEPS`) holds the deployment's lock on the
head from :func:`start` until it concludes (or its kernel exits); under ``sparkbook run``, which
holds the lock for the whole run, it passes. Another run holding it stops the step at
:func:`start`, with a message that names the holder.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import json
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

from .book.errors import CheckFailed
from .book.project import project_root
from .book.redact import mask
from .book.step import Outcome, Step
from .book.verdict import Check, Verdict
from .nodes import lock
from .nodes.remote import Cluster
from .params import FIELDS, Params, default_params_file, read, validate
from .version import __version__


def conclude(verdict: Verdict, say=print) -> Verdict:
    """Show a verdict made outside a step's context (day one, day two); a failure fails the cell
    (papermill's exit code), naming each row."""
    say(verdict.to_text())
    if verdict.failures:
        raise CheckFailed("\n".join(f"FAIL {c.check} on {c.node}: {c.observed}\n  remedy: {c.remedy}"
                                    for c in verdict.failures))
    return verdict


def open_cluster(params: Params) -> Cluster:
    """The nodes of ``params`` as a :class:`Cluster`; for the lab's parameters only while the lab
    is up (its addresses lead nowhere on this machine while it is down)."""
    if params.lab:
        from .lab import require_up
        require_up()
    return Cluster.from_params(params)


@dataclass
class Context:
    params: Params
    source: str
    run_dir: Path
    step: Step | None = None
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    gated: dict[str, list[Check]] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    held: lock.Lock | None = None  # the deployment's lock, while this step holds it
    run_gates: set[str] = field(default_factory=set)  # the gates the last run() made

    @cached_property
    def cluster(self) -> Cluster:
        return open_cluster(self.params)

    @property
    def name(self) -> str:
        return self._step().NAME

    def _step(self) -> Step:
        if self.step is None:
            raise RuntimeError("this context has no step: sparkbook.notebook.start(globals(), step)")
        return self.step

    def record(self, outcome: Outcome) -> Outcome:
        """Keep ``outcome`` (in the run folder, as its ``FILE``); its key numbers go into the
        verdict. Recording an outcome of the same type again replaces it (a re-run cell)."""
        outcome.save(self.run_dir)
        self.outcomes = [o for o in self.outcomes if type(o) is not type(outcome)] + [outcome]
        return outcome

    def hold(self) -> None:
        """Take the deployment's lock when this step changes the nodes (see :mod:`sparkbook.nodes.lock`);
        raises :class:`~sparkbook.nodes.lock.LockHeld` naming the holder when another run has it."""
        if self.held is not None:  # held since an earlier cell: stop if it is no longer this run's
            self.held.check()
            return
        if self.step is None or not lock.changes_state(self.step.NAME):
            return
        self.held = lock.acquire(self.params, self.cluster, str(self.run_dir))
        if self.held.owned:  # taken by this kernel: kept fresh, and given back if it exits first
            self.held.keep_fresh()
            _at_exit(self.held.release)

    def release(self) -> None:
        """Give the lock back (it stays with ``sparkbook run`` when the run holds it)."""
        if self.held is not None:
            self.held.release()
            self.held = None

    def run(self, **kw: Any) -> Outcome:
        """The step's work (``step.run(ctx, **kw)``), recorded. Work that raises gives the lock
        back (a cell run again takes it again): a failed cell in JupyterLab never keeps it. The
        gates the step's own work made (05's memory fit) are those of this run: a run again
        replaces them, and leaves none that it did not make again."""
        self.hold()
        for key in self.run_gates:
            self.gated.pop(key, None)
        before = set(self.gated)
        try:
            return self.record(self._step().run(self, **kw))
        except BaseException:
            self.release()
            raise
        finally:
            self.run_gates = set(self.gated) - before

    def gate(self, checks: list[Check], key: str = "gate") -> None:
        """Checks before the work of a step: when any failed, the step ends here (as
        :meth:`conclude`); otherwise they are shown and become part of the final verdict."""
        self.hold()
        self.gated[key] = list(checks)
        verdict = Verdict(f"{self._step().TITLE}: {key}", list(checks))
        if verdict.failures:
            self.conclude()
        _show(verdict)

    def verdict(self, outcome: Outcome | None = None) -> Verdict:
        """The step's verdict: the gates' checks, then the step's checks of ``outcome``."""
        step = self._step()
        if outcome is not None and not any(o is outcome for o in self.outcomes):
            self.record(outcome)  # a cell that made it without ctx.run (ctx.run recorded its own)
        checks = [c for cs in self.gated.values() for c in cs]
        if outcome is not None:
            checks += step.checks(self.params, outcome)
        numbers = [kn for o in self.outcomes for kn in o.key_numbers()]
        now = datetime.now(timezone.utc)
        until = now + timedelta(hours=self.params.expectations.verdicts_hold_h)
        return Verdict(step.TITLE, checks, key_numbers=numbers, taken=now.isoformat(timespec="seconds"),
                       holds_until=until.isoformat(timespec="seconds"),
                       boots={n: b for o in self.outcomes for n, b in o.boots().items()})

    def path(self, *parts: str) -> Path:
        """A path in the run folder (its parent folders are made)."""
        p = self.run_dir.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def save_json(self, name: str, data: Any) -> Path:
        """``data`` (plain data or a dataclass) as JSON in the run folder."""
        if dataclasses.is_dataclass(data):
            data = dataclasses.asdict(data)
        p = self.path(name)
        p.write_text(mask(json.dumps(data, indent=2, default=str)) + "\n")
        return p

    def conclude(self, outcome: Outcome | None = None) -> None:
        """The last cell of a notebook: show the verdict, keep it in the run folder
        (``verdicts/NAME.json``, with the key numbers) and fail the cell when any check failed.
        The step ends here: its lock is given back."""
        self.release()
        verdict = self.verdict(outcome)
        verdict.save(self.path("verdicts", f"{self.name}.json"))
        _show(verdict)
        verdict.raise_for_failures()

    def describe(self) -> str:
        p = self.params
        nodes = ", ".join(f"{n.name} ({n.role})" for n in p.nodes)
        return (f"sparkbook {__version__}\nparameters: {self.source}\n"
                f"deployment: {p.name}: {len(p.nodes)} node(s): {nodes}\nrun folder: {self.run_dir}")


def _at_exit(fn: Callable[[], None]) -> None:
    """Call ``fn`` when the process exits, while threads can still start (``Cluster.run`` uses a
    thread pool, which refuses work once plain ``atexit`` handlers run)."""
    register = getattr(threading, "_register_atexit", atexit.register)  # CPython 3.9+
    register(fn)


def _show(verdict: Verdict) -> None:
    try:
        from IPython.display import display
        display(verdict)
    except ImportError:  # outside IPython
        print(verdict.to_text())


STARTED = "_sparkbook_started"  # in a notebook's namespace: what its first start() found


@dataclass
class Started:
    """What the first :func:`start` in a notebook's namespace found injected, and the context the
    latest one made. A setup cell run again in the same kernel reads the injected fields from
    here, never from the namespace again: a variable the notebook sets later under a field's name
    (``model = ...``, ``for name in ...``) is the notebook's own, not a parameter."""

    injected: dict[str, Any]
    ctx: Context | None = None


def injected_fields(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The deployment's fields papermill injected (``-f FILE``: its cell tagged
    ``injected-parameters`` runs after the ``parameters`` cell and before the setup cell)."""
    started = namespace.get(STARTED)
    if isinstance(started, Started):
        return started.injected
    # Injected values are plain data; a module or object of the same name (``from sparkbook
    # import collectives``) is the notebook's own.
    plain = (dict, list, str, int, float, bool, type(None))
    return {k: copy.deepcopy(namespace[k]) for k in FIELDS if k in namespace and isinstance(namespace[k], plain)}


def resolve(namespace: Mapping[str, Any]) -> tuple[Params, str]:
    """The validated parameters of a notebook, and where they came from."""
    injected = injected_fields(namespace)
    explicit = namespace.get("params_file")
    if injected and not explicit:
        source = f"injected by papermill (deployment {injected.get('name', '?')!r})"
        return validate(injected, "injected parameters"), source
    path = Path(explicit or default_params_file()).expanduser()
    if not path.is_absolute():
        path = (Path.cwd() / path) if (Path.cwd() / path).exists() else project_root() / path
    data = read(path)
    source = str(path.resolve())
    if injected and isinstance(data, dict):
        data = {**data, **injected}
        source += f" (with injected {', '.join(sorted(injected))})"
    return validate(data, str(path)), source


def default_run_dir(params: Params, use_env: bool = True) -> Path:
    """Where a notebook run by hand keeps its results: ``$SPARKBOOK_RUN_DIR`` (unless not
    ``use_env``), else one stable folder per deployment, so that notebooks stepped through one by
    one share their state."""
    env = os.environ.get("SPARKBOOK_RUN_DIR") if use_env else None
    return Path(env) if env else project_root() / "outputs" / f"interactive-{params.name}"


def start(namespace: Mapping[str, Any], step: Step | None = None, quiet: bool = False) -> Context:
    """Validate the notebook's parameters (nothing runs on a node before this passes), choose the
    run folder, and say which of each is used. ``step`` is the notebook's step module. Run again
    in the same kernel (a setup cell run again), it reads the parameters as the first time, and
    the earlier context gives its lock back before this one takes it."""
    params, source = resolve(namespace)
    run_dir = Path(namespace.get("run_dir") or default_run_dir(params)).expanduser().resolve()
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # private, when made here
    ctx = Context(params, source, run_dir, step)
    if not quiet:
        print(ctx.describe())
    started = namespace.get(STARTED)
    if isinstance(started, Started) and started.ctx is not None:
        started.ctx.release()  # its heartbeat would otherwise find the lock gone after this one's conclude
    if isinstance(namespace, MutableMapping):
        namespace[STARTED] = Started(injected_fields(namespace), ctx)
    ctx.hold()
    return ctx
