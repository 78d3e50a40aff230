"""``sparkbook run``: the numbered notebooks, in order, with papermill, into one run folder."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Sequence

import papermill

from ..book import redact
from ..book.errors import SparkbookError
from ..book.project import discover, project_root
from ..book.redact import mask
from ..nodes import lock
from ..notebook import Context, open_cluster
from ..params import Params, load
from ..record import fingerprint
from . import engine
from .interrupt import Interrupts

# steps that run even after an earlier step failed: what a failed run started must not stay running
CLEANUP_STEPS = ("teardown",)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# the run fingerprint after the steps, where none took it: nodes that do not answer (a run that
# failed at 00) keep the run no longer than this (and their SSH connect timeout)
FINGERPRINT_TIMEOUT_S = 60
# a step's kernel starting (Python, ipykernel): seconds when the machine is idle, but past
# papermill's 60 s default on a 2-core machine busy with other kernels, where the step then failed
# with "Kernel didn't respond in 60 seconds" before any of its cells ran (2026-12-03)
KERNEL_START_S = 180


@dataclass
class Step:
    step: str
    name: str
    notebook: str
    status: str = "skipped"  # passed, failed, interrupted or skipped
    duration_s: float = 0.0
    error: str | None = None


def select(notebooks: Sequence[Path], steps: str | None) -> list[Path]:
    """The notebooks named by ``steps`` (``"00,01"``, by number or name), in their order."""
    if not steps:
        return list(notebooks)
    wanted = [s.strip() for s in steps.split(",") if s.strip()]
    chosen, unknown = [], []
    for w in wanted:
        if w.isdigit():
            match = [nb for nb in notebooks if nb.stem[:2] == f"{int(w):02d}"]
        else:
            match = [nb for nb in notebooks if w in (nb.stem, nb.stem[3:])]
        (chosen.extend(match) if match else unknown.append(w))
    if unknown:
        have = ", ".join(nb.stem for nb in notebooks) or "none"
        raise SparkbookError(f"unknown step(s): {', '.join(unknown)} (steps here: {have})")
    return [nb for nb in notebooks if nb in chosen]


def make_run_dir(params_name: str, out: str | Path | None = None, root: Path | None = None) -> Path:
    """Make the run folder, readable by its owner alone (0700): ``out``, or
    ``outputs/<UTC time>-<name>``, with ``-2``, ``-3``... when a run that started in the same
    second has the name already (each run gets its own folder). An ``out`` that exists already is
    not sparkbook's to change: used as it is, with a warning when others may read it."""
    if out:
        run_dir = Path(out).expanduser().resolve()
        if run_dir.is_dir():
            if run_dir.stat().st_mode & 0o077:
                print(f"sparkbook: warning: others may read the run folder {run_dir} (and the "
                      f"report): `chmod 700 {run_dir}` if that is not meant", file=sys.stderr)
            return run_dir
        run_dir.mkdir(parents=True)
    else:
        base = (root or project_root()) / "outputs"
        base.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        for n in itertools.count(1):
            run_dir = base / (f"{stamp}-{params_name}" + (f"-{n}" if n > 1 else ""))
            try:
                run_dir.mkdir(mode=0o700)
                break
            except FileExistsError:
                continue
    run_dir.chmod(0o700)  # made here: private whatever the umask
    return run_dir


def _error_text(exc: BaseException) -> str:
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    return ANSI_RE.sub("", text).strip()


class _Masked(logging.Formatter):
    """The notebooks' streamed output, with any secret value from the environment masked."""

    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record))


_HANDLER = logging.StreamHandler()
_HANDLER.setFormatter(_Masked("%(message)s"))


def _logging(verbose: bool) -> None:
    """On stderr, masked: the cells' outputs (:mod:`sparkbook.runbook.engine`) and papermill's warnings;
    papermill's lines (notebooks, kernel, each cell's start and end) only when ``verbose``."""
    _HANDLER.stream = sys.stderr  # the stderr of this run (a test's capture)
    for name, level in (("papermill", logging.INFO if verbose else logging.WARNING),
                        (engine.log.name, logging.INFO)):
        log = logging.getLogger(name)
        if _HANDLER not in log.handlers:
            log.addHandler(_HANDLER)
        log.setLevel(level)
        log.propagate = False


def run(params_file: str | Path, steps: str | None = None, out: str | Path | None = None,
        notebooks_dir: str | Path | None = None, cell_timeout: float = 3600,
        kernel_name: str | None = None, report: bool = True, keep_on_failure: bool = False,
        verbose: bool = False) -> dict:
    """Run the selected notebooks into a run folder; after the first failure the remaining steps
    are skipped, except a selected teardown step, which still runs (unless ``keep_on_failure``:
    leave the deployment up to look at it). SIGINT and SIGTERM stop the running step and end the
    run the same way (see :mod:`sparkbook.runbook.interrupt`). When a selected step changes the nodes, the
    run holds the deployment's lock on the head throughout (:mod:`sparkbook.nodes.lock`). Where no step
    took the run fingerprint, the run takes it after its steps (best effort). The terminal shows
    each step's lines and what its cells show; the kernels' own stdout and stderr go to
    ``logs/kernel-NN_name.log`` (``verbose``: papermill's lines, and the kernels' output on the
    terminal instead, masked; :mod:`sparkbook.runbook.engine`). Returns the
    summary (also written to ``summary.json``); its ``status`` is ``passed`` only when every step
    passed, ``interrupted`` after a signal (its ``signal`` names it)."""
    params_path = Path(params_file).expanduser().resolve()
    params = load(params_path)  # nothing runs before the parameters validate
    nb_dir = Path(notebooks_dir).resolve() if notebooks_dir else project_root() / "notebooks"
    chosen = select(discover(nb_dir), steps)
    if not chosen:
        raise SparkbookError(f"no numbered notebooks (NN_name.ipynb) in {nb_dir}")
    fresh = not (out and Path(out).expanduser().exists())
    run_dir = make_run_dir(params.name, out)
    _logging(verbose)
    with Interrupts() as stop:
        try:
            held = _lock(params, run_dir, chosen)
        except BaseException:
            if fresh:  # the folder this run made, still empty: no trace of a run that did not start
                run_dir.rmdir()
            raise
        try:
            shutil.copyfile(params_path, run_dir / "parameters.yaml")
            summary = _steps(params, params_path, nb_dir, chosen, run_dir, stop, cell_timeout,
                             kernel_name, keep_on_failure, verbose)
        finally:
            if held is not None:
                os.environ.pop(lock.ENV, None)
                held.release()
    if summary["status"] != "interrupted" and not (run_dir / fingerprint.FILE).exists():
        _fingerprint(params, params_path, run_dir)
    if report:
        from ..record.report import build
        build(run_dir)
    redact.mask_tree(run_dir)
    return summary


def _fingerprint(params: Params, params_path: Path, run_dir: Path) -> None:
    """The run fingerprint (:mod:`sparkbook.record.fingerprint`) where no step took it (06 and 07 do):
    best effort, what keeps it from being taken is said and fails nothing."""
    try:
        fingerprint.ensure(Context(params, str(params_path), run_dir), timeout=FINGERPRINT_TIMEOUT_S)
    except (Exception, KeyboardInterrupt) as e:
        print(f"sparkbook: no run fingerprint: {mask(_error_text(e))}", file=sys.stderr, flush=True)


def _lock(params: Params, run_dir: Path, chosen: list[Path]) -> lock.Lock | None:
    """The deployment's lock, when a chosen step changes the nodes; its kernels inherit it."""
    if not any(lock.changes_state(nb.stem) for nb in chosen):
        return None
    held = lock.acquire(params, open_cluster(params), str(run_dir))
    os.environ[lock.ENV] = held.token
    held.keep_fresh()
    return held


def _steps(params: Params, params_path: Path, nb_dir: Path, chosen: list[Path], run_dir: Path,
           stop: Interrupts, cell_timeout: float, kernel_name: str | None,
           keep_on_failure: bool, verbose: bool) -> dict:
    records = [Step(nb.stem[:2], nb.stem, nb.name) for nb in chosen]
    summary = {"status": "running", "params": str(params_path), "deployment": params.name,
               "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "run_dir": str(run_dir), "steps": [asdict(r) for r in records]}
    failed = False
    for nb, rec in zip(chosen, records):
        cleanup = rec.name[3:] in CLEANUP_STEPS
        ending = failed or bool(stop.signum)
        if stop.skip_teardown or (ending and (keep_on_failure or not cleanup)):
            continue
        after = f" (after the {'interrupt' if stop.signum else 'failure'}: cleaning up)" if ending else ""
        print(f"== step {rec.name}: running{after}", file=sys.stderr, flush=True)
        t0, signals = time.monotonic(), stop.count
        kernel_log = _kernel_output(run_dir, rec.name, verbose)  # before the step: nothing to end if it fails
        stop.begin(rec.name, protected=cleanup)
        try:
            papermill.execute_notebook(
                str(nb), str(run_dir / nb.name),
                parameters={"params_file": str(params_path), "run_dir": str(run_dir)},
                cwd=str(nb_dir), log_output=verbose, progress_bar=False, kernel_name=kernel_name,
                execution_timeout=cell_timeout, start_timeout=KERNEL_START_S, report_mode=False,
                engine_name=engine.NAME,
                kernel_log=kernel_log, **stop.papermill_kwargs())
            rec.status = "passed"
        except Exception as e:  # the notebook failed: papermill already saved what it ran
            rec.status, rec.error = "failed", mask(_error_text(e))
        finally:
            stop.end()
            kernel_log.close()
        if rec.status == "failed" and stop.count > signals and (not cleanup or stop.skip_teardown):
            rec.status, rec.error = "interrupted", f"stopped by {stop.name}"
        failed = failed or rec.status != "passed"
        rec.duration_s = round(time.monotonic() - t0, 2)
        print(f"== step {rec.name}: {rec.status} in {rec.duration_s:.1f} s"
              + (f"\n{rec.error}" if rec.error else ""), file=sys.stderr, flush=True)
        summary["steps"] = [asdict(r) for r in records]
        try:  # a full disk ends the run as a failure, never before its teardown
            redact.mask_tree(run_dir)  # a secret a cell printed by mistake stops here too
            _write(run_dir, summary)
        except OSError as e:
            failed = True
            summary["error"] = mask(f"after step {rec.name}: the run folder could not be written: {e}")
            print(f"sparkbook: {summary['error']}", file=sys.stderr, flush=True)
    if stop.signum:
        summary["signal"] = stop.name
        _left_running(params, params_path, records)
    summary["status"] = "interrupted" if stop.signum else "failed" if failed else "passed"
    summary["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _write(run_dir, summary)
    return summary


# what the steps that change the nodes leave running until the teardown removes it
LEAVES = {"collectives": "collectives", "ray_cluster": "Ray", "serve": "vLLM"}


def _left_running(params: Params, params_path: Path, records: list[Step]) -> None:
    """After an interrupt without a teardown: say which containers this run may have left."""
    if any(r.name[3:] in CLEANUP_STEPS and r.status == "passed" for r in records):
        return
    kinds = [LEAVES[r.name[3:]] for r in records if r.name[3:] in LEAVES and r.status != "skipped"]
    if not kinds:
        return
    nodes = ", ".join(n.name for n in params.nodes)
    print(f"sparkbook: no teardown ran to its end: the {' and '.join(kinds)} containers of deployment "
          f"{params.name!r} (label sparkbook={params.name}) may still run on {nodes}; remove them "
          f"with `sparkbook run -p {params_path} --steps teardown`", file=sys.stderr, flush=True)


def _kernel_output(run_dir: Path, step: str, verbose: bool) -> IO[bytes]:
    """Where the kernel process's own stdout and stderr go: ``logs/kernel-NN_name.log``, private;
    with ``verbose``, this process's stderr, masked."""
    if verbose:
        read, write = os.pipe()
        threading.Thread(target=_relay, args=(read,), daemon=True).start()
        return os.fdopen(write, "wb")
    logs = run_dir / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(logs / f"kernel-{step}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb")


def _relay(fd: int) -> None:
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:  # to the end: the kernel, and whatever it started, closed the pipe
            sys.stderr.write(mask(line.decode(errors="replace")))
            sys.stderr.flush()


def _write(run_dir: Path, summary: dict) -> None:
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(run_dir / "summary.json")
