"""The project folder (notebooks/, parameters/, outputs/) and its numbered notebooks: found from
where sparkbook runs, and read by every layer (the parameters' default file, a key's relative
path, the runner's notebooks, the verdicts' links to steps)."""

from __future__ import annotations

import os
import re
from pathlib import Path

STEP_RE = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.ipynb$")


def project_root() -> Path:
    """The project folder: the nearest folder above the working directory holding parameters/,
    else the folder the package was installed from."""
    for d in [Path.cwd(), *Path.cwd().parents]:
        if (d / "parameters").is_dir() and (d / "notebooks").is_dir():
            return d
    return Path(__file__).resolve().parents[2]


def discover(notebooks_dir: Path) -> list[Path]:
    """The numbered notebooks (``NN_name.ipynb``), in order."""
    return sorted(p for p in notebooks_dir.glob("*.ipynb") if STEP_RE.match(p.name))


def step_notebooks() -> set[str]:
    """The stems of the project's numbered notebooks (``03_distribute_image``)."""
    return {p.stem for p in discover(project_root() / "notebooks")}


def user_cache(name: str) -> Path:
    """``$SPARKBOOK_CACHE/NAME``, by default ``$XDG_CACHE_HOME/sparkbook/NAME`` (``~/.cache``),
    made private (0700): what this user's runs may reuse from one another, each entry keyed so that
    it cannot be stale."""
    root = Path(os.environ.get("SPARKBOOK_CACHE")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkbook")
    path = root / name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for d in (root, path):
        d.chmod(0o700)
    return path
