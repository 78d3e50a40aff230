"""``model_prune.sh`` (distribution.delete_extras): a folder of the model swapped for a symbolic link
while the script works is never followed, whenever the swap comes (tests/test_distribute_safety.py
has the names it refuses from the start: "..", a link, a folder)."""

import os
import shlex
import shutil
import subprocess

import pytest

from sparkbook.nodes.shell import script

REFUSED = "not a plain file of the model folder (a link, a folder, or a path out of it)"


@pytest.fixture
def planted(tmp_path):
    """A model folder with ``sub/x.bin``, a file of the same name outside it, and the shell line
    that makes ``sub`` a link to the outside folder (the real folder moved aside, as someone who may
    write the model folder can)."""
    m, outside = tmp_path / "m", tmp_path / "outside"
    (m / "sub").mkdir(parents=True)
    (m / "sub" / "x.bin").write_text("extra")
    outside.mkdir()
    (outside / "x.bin").write_text("not the model's")
    sub, moved = shlex.quote(str(m / "sub")), shlex.quote(str(m / "sub.moved"))
    swap = f"mv {sub} {moved} && ln -s {shlex.quote(str(outside))} {sub}"
    return m, outside, swap


def prune(m, *names):
    r = subprocess.run(["bash", "-c", script("model_prune.sh", str(m), *names).program()],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [line.split("\t") for line in r.stdout.splitlines()]


def test_a_folder_swapped_for_a_link_at_the_moment_of_deletion_is_not_followed(planted, tmp_path, monkeypatch):
    """The worst moment: after every check, as rm starts (an rm first on the PATH swaps, then runs
    the real rm with the script's arguments)."""
    m, outside, swap = planted
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "rm").write_text(f'#!/bin/sh\n{swap}\nexec {shlex.quote(shutil.which("rm"))} "$@"\n')
    (tmp_path / "bin" / "rm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert prune(m, "sub/x.bin") == [["DELETED", "sub/x.bin"]]
    assert (outside / "x.bin").read_text() == "not the model's"
    assert (m / "sub").is_symlink() and not (m / "sub.moved" / "x.bin").exists()  # the model's own went


def test_a_folder_swapped_for_a_link_before_the_script_runs_is_refused(planted):
    m, outside, swap = planted
    subprocess.run(["sh", "-c", swap], check=True)
    assert prune(m, "sub/x.bin") == [["KEPT", "sub/x.bin", REFUSED]]
    assert (outside / "x.bin").exists() and (m / "sub.moved" / "x.bin").exists()

