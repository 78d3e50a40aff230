"""The private working folder on the nodes (issue 15, point 3): per SSH user and deployment, mode
0700, never a symbolic link or a folder another user owns. workdir.sh runs here on a local node."""

import os
import stat

import pytest

from sparkbook.nodes import workdir
from sparkbook.book.errors import CheckFailed
from sparkbook.params import validate
from sparkbook.nodes.remote import Cluster, ssh_target

NOBODY = 65534


def params(name="pair", **node):
    return validate({"name": name, "model": {"name": "m", "path": "/models/m"},
                     "runtime": {"image": "img"},
                     "nodes": [{"name": "here", "host": "localhost", "local": True, "role": "head", **node}]})


def test_the_folder_is_per_user_and_per_deployment(monkeypatch):
    p, q = params("pair"), params("quad")
    monkeypatch.setattr(workdir.getpass, "getuser", lambda: "alice")
    assert workdir.workdir(p, p.head) == "/tmp/sparkbook-alice/pair"
    assert workdir.workdir(q, q.head) == "/tmp/sparkbook-alice/quad"
    assert workdir.logs(p, p.head) == "/tmp/sparkbook-alice/pair/logs"
    monkeypatch.setattr(workdir.getpass, "getuser", lambda: "bob")
    assert workdir.workdir(p, p.head) == "/tmp/sparkbook-bob/pair"


def test_the_ssh_user_comes_from_the_parameters_or_ssh_config(tmp_path, monkeypatch):
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text("Host sparky*\n  User carol\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh_target.cache_clear()
    try:
        p = validate({"name": "pair", "model": {"name": "m", "path": "/models/m"}, "runtime": {"image": "img"},
                      "serving": {"tensor_parallel_size": 2},
                      "nodes": [{"name": "a", "host": "sparky1", "role": "head"},
                                {"name": "b", "host": "sparky2", "user": "dave", "port": 2222}]})
        assert workdir.workdir(p, p.nodes[0]) == "/tmp/sparkbook-carol/pair"
        assert workdir.workdir(p, p.nodes[1]) == "/tmp/sparkbook-dave/pair"
    finally:
        ssh_target.cache_clear()


@pytest.fixture
def here(tmp_path, monkeypatch):
    """Parameters whose working folder lands under tmp_path (the script is the same)."""
    p = params()
    monkeypatch.setattr(workdir, "workdir", lambda params, node: str(tmp_path / "sparkbook-me" / params.name))
    return p, tmp_path / "sparkbook-me"


def test_prepare_makes_private_folders(here):
    p, parent = here
    os.umask(0o022)
    workdir.prepare(p, Cluster(p.nodes))
    for d in (parent, parent / "pair", parent / "pair" / "logs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    (parent / "pair").chmod(0o755)  # loosened by someone: made private again
    workdir.prepare(p, Cluster(p.nodes))
    assert stat.S_IMODE((parent / "pair").stat().st_mode) == 0o700


def test_a_symbolic_link_is_refused(here, tmp_path):
    p, parent = here
    target = tmp_path / "theirs"
    target.mkdir()
    parent.symlink_to(target)
    with pytest.raises(CheckFailed, match=r"refused on here: .*sparkbook-me is not a folder"):
        workdir.prepare(p, Cluster(p.nodes))
    assert not any(target.iterdir())  # nothing was made through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_another_user_owns_is_refused(here):
    p, parent = here
    parent.mkdir(mode=0o777)
    os.chown(parent, NOBODY, NOBODY)
    with pytest.raises(CheckFailed, match=rf"belongs to uid {NOBODY}, not to this user"):
        workdir.prepare(p, Cluster(p.nodes))
    assert not (parent / "pair").exists()
