"""The private sshd the lab and the tests run: a server that cannot start says why."""

import socket

import pytest

from conftest import free_port
from sparkbook.nodes.sshd import SshServer, keygen


def test_an_sshd_that_cannot_bind_fails_with_the_end_of_its_log(tmp_path):
    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        server = SshServer(tmp_path / "sshd", port, authorized_keys=[keygen(tmp_path / "id_ed25519")])
        with pytest.raises(RuntimeError) as e:
            server.start(wait=2)
    said = str(e.value)
    assert f"sshd on 127.0.0.1:{port} did not start in 2 s (pid file missing, port open)" in said
    assert "Address already in use" in said and str(tmp_path / "sshd" / "sshd.log") in said
