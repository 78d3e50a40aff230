"""The node-side shell programs (sparkbook/scripts/*.sh): strict mode, and clean under shellcheck."""

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "sparkbook" / "scripts").glob("*.sh"))


def test_there_are_node_scripts():
    assert SCRIPTS, "no sparkbook/scripts/*.sh found"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_is_strict(path):
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    assert lines[0] == "#!/usr/bin/env bash", f"{path.name}: first line must be the bash shebang"
    assert "set -euo pipefail" in lines, f"{path.name}: must run with set -euo pipefail"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_passes_shellcheck(path):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (scripts/bootstrap installs it)")
    r = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
