"""The conda environment and the pip package name the same dependencies."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _split(spec: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    return m[1].lower().replace("_", "-"), m[2].replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_deps = dict(_split(d) for d in project["dependencies"] + project["optional-dependencies"]["test"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    conda_deps = dict(_split(d) for d in conda if _split(d)[0] not in ("python", "pip"))
    assert conda_deps == pip_deps
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip_section == ["-e ."], "the package itself is installed with pip from the environment"


def test_cli_entry_point_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["sparkbook"] == "sparkbook.cli:main"
