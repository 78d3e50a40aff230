"""``sparkbook run``: the numbered notebooks, in order, with papermill, into one run folder."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import papermill

from .errors import SparkbookError
from .params import load, project_root
from .redact import mask

STEP_RE = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.ipynb$")
# steps that run even after an earlier step failed: what a failed run started must not stay running
CLEANUP_STEPS = ("teardown",)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class Step:
    step: str
    name: str
    notebook: str
    status: str = "skipped"  # passed, failed or skipped
    duration_s: float = 0.0
    error: str | None = None


def discover(notebooks_dir: Path) -> list[Path]:
    """The numbered notebooks (``NN_name.ipynb``), in order."""
    return sorted(p for p in notebooks_dir.glob("*.ipynb") if STEP_RE.match(p.name))


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


def default_run_dir(params_name: str, root: Path | None = None) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return (root or project_root()) / "outputs" / f"{stamp}-{params_name}"


def _error_text(exc: BaseException) -> str:
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    return ANSI_RE.sub("", text).strip()


class _Masked(logging.Formatter):
    """The notebooks' streamed output, with any secret value from the environment masked."""

    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record))


def _logging() -> None:
    log = logging.getLogger("papermill")
    if not any(getattr(h, "_sparkbook", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(_Masked("%(message)s"))
        h._sparkbook = True  # type: ignore[attr-defined]
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False


def run(params_file: str | Path, steps: str | None = None, out: str | Path | None = None,
        notebooks_dir: str | Path | None = None, cell_timeout: float = 3600,
        kernel_name: str | None = None, report: bool = True, keep_on_failure: bool = False) -> dict:
    """Run the selected notebooks into a run folder; after the first failure the remaining steps
    are skipped, except a selected teardown step, which still runs (unless ``keep_on_failure``:
    leave the deployment up to look at it). Returns the summary (also written to
    ``summary.json``); its ``status`` is ``passed`` only when every step passed."""
    params_path = Path(params_file).expanduser().resolve()
    params = load(params_path)  # nothing runs before the parameters validate
    nb_dir = Path(notebooks_dir).resolve() if notebooks_dir else project_root() / "notebooks"
    chosen = select(discover(nb_dir), steps)
    if not chosen:
        raise SparkbookError(f"no numbered notebooks (NN_name.ipynb) in {nb_dir}")
    run_dir = Path(out).expanduser().resolve() if out else default_run_dir(params.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(params_path, run_dir / "parameters.yaml")
    _logging()

    records = [Step(nb.stem[:2], nb.stem, nb.name) for nb in chosen]
    summary = {"status": "running", "params": str(params_path), "deployment": params.name,
               "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "run_dir": str(run_dir), "steps": [asdict(r) for r in records]}
    failed = False
    for nb, rec in zip(chosen, records):
        if failed and (keep_on_failure or rec.name[3:] not in CLEANUP_STEPS):
            continue
        print(f"== step {rec.name}: running" + (" (after the failure: cleaning up)" if failed else ""), file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            papermill.execute_notebook(
                str(nb), str(run_dir / nb.name),
                parameters={"params_file": str(params_path), "run_dir": str(run_dir)},
                cwd=str(nb_dir), log_output=True, progress_bar=False, kernel_name=kernel_name,
                execution_timeout=cell_timeout, report_mode=False)
            rec.status = "passed"
        except Exception as e:  # the notebook failed: papermill already saved what it ran
            rec.status, rec.error = "failed", mask(_error_text(e))
        failed = failed or rec.status == "failed"
        executed = run_dir / nb.name
        if executed.exists():  # a secret a cell printed by mistake stops here too
            executed.write_text(mask(executed.read_text()))
        rec.duration_s = round(time.monotonic() - t0, 2)
        print(f"== step {rec.name}: {rec.status} in {rec.duration_s:.1f} s"
              + (f"\n{rec.error}" if rec.error else ""), file=sys.stderr, flush=True)
        summary["steps"] = [asdict(r) for r in records]
        _write(run_dir, summary)
    summary["status"] = "failed" if failed else "passed"
    summary["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _write(run_dir, summary)
    if report:
        from .report import build
        build(run_dir)
    return summary


def _write(run_dir: Path, summary: dict) -> None:
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(run_dir / "summary.json")
