"""Issue 26, finding 1: a host only OpenSSH can check (a ``@cert-authority`` line, a host pattern)
is accepted by OpenSSH's exit status and the key its KnownHostsCommand was given, never by what
``ssh`` printed: a server can print lines that look like OpenSSH's own. Against real sshd and
paramiko impostors on loopback."""

import socket
import threading

import paramiko
import pytest
from paramiko.common import cMSG_DEBUG
from paramiko.message import Message

from conftest import free_port
from sparkbook.params import SSH, Node
from sparkbook.nodes.sshd import keygen
from test_ssh_safety import certified, node_of, pubkey, run_true  # noqa: F401 (certified: a fixture)


class Impostor:
    """An SSH server on loopback with a key of its own that lets anyone log in and notes what it is
    asked to run. To OpenSSH clients it first sends ``forged`` in an SSH debug message, which
    ``ssh -v`` prints as ``debug1: Remote: ...`` and the lines that follow."""

    def __init__(self, key_path, forged: str = ""):
        self.key = paramiko.Ed25519Key.from_private_key_file(str(keygen(key_path)))
        self.forged, self.commands = forged, []
        self.sock = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        forged, commands = self.forged, self.commands

        class Forger(paramiko.Transport):
            def _send_kex_init(self):
                if forged and "OpenSSH" in (self.remote_version or ""):
                    m = Message()
                    m.add_byte(cMSG_DEBUG)
                    m.add_boolean(True)
                    m.add_string(forged)
                    m.add_string("")
                    self._send_message(m)
                super()._send_kex_init()

        class Anyone(paramiko.ServerInterface):
            def get_allowed_auths(self, username):
                return "publickey"

            def check_auth_publickey(self, username, key):
                return paramiko.AUTH_SUCCESSFUL

            def check_channel_request(self, kind, chanid):
                return paramiko.OPEN_SUCCEEDED

            def check_channel_exec_request(self, channel, command):
                commands.append(command.decode())
                # "done, exit status 0", once the request is answered
                threading.Timer(0.2, lambda: (channel.send_exit_status(0), channel.close())).start()
                return True

        # no strict key exchange: it would forbid a debug message before the KEXINIT
        t = Forger(client, strict_kex=False)
        t.add_server_key(self.key)
        try:
            t.start_server(server=Anyone())
            t.accept(10)
        except (paramiko.SSHException, EOFError, OSError):
            pass

    def close(self):
        self.sock.close()


@pytest.fixture
def impostor(tmp_path):
    made = []

    def make(forged_for=None):
        imp = Impostor(tmp_path / f"impostor{len(made)}" / "key")
        if forged_for:  # what ssh -v prints when it accepts the host, as the impostor writes it
            imp.forged = (f"\ndebug1: Server host key: ssh-ed25519 {imp.key.fingerprint}\n"
                          f"debug1: Host '[127.0.0.1]:{imp.port}' is known and matches the ED25519 "
                          f"host {forged_for}.")
        made.append(imp)
        return imp
    yield make
    for imp in made:
        imp.close()


def trusting(kind, port, tmp_path, ca=None, key_of=None):
    """A known_hosts file that lists ``[127.0.0.1]:port`` by a CA or by a pattern only."""
    known = tmp_path / f"known_hosts_{kind}_{port}"
    known.write_text(f"@cert-authority [127.0.0.1]:{port} {pubkey(ca)}\n" if kind == "certificate"
                     else f"[127.0.0.*]:{port} {pubkey(key_of)}\n")
    return SSH(known_hosts=[str(known)], connect_timeout=5)


@pytest.mark.parametrize("kind", ["certificate", "key"])
def test_an_impostor_printing_openssh_s_lines_is_refused_and_the_genuine_host_connects(
        ssh_nodes, certified, impostor, tmp_path, kind):
    """``kind``: the host is trusted by a @cert-authority line, or by a host pattern listing its key."""
    server, ca = certified
    genuine = trusting(kind, server.port, tmp_path, ca=ca, key_of=server.host_key)
    assert run_true(node_of(server, ssh_nodes), genuine).ok

    imp = impostor(forged_for=kind)
    # the same trust, for the impostor's port: the genuine host's CA, or its key
    ssh = trusting(kind, imp.port, tmp_path, ca=ca, key_of=server.host_key)
    res = run_true(node_of(imp, ssh_nodes, "impostor"), ssh)
    assert imp.commands == []  # it got no command
    assert not res.ok and res.exit_code is None
    assert "OpenSSH did not accept the host" in res.error, res.error


def test_a_host_that_answers_openssh_and_paramiko_differently_is_refused(ssh_nodes, impostor, tmp_path):
    """OpenSSH's check reaches the genuine host, Paramiko an impostor (a machine in between that
    tells them by their version strings): OpenSSH's verdict holds only for the key it saw."""
    genuine, imp = ssh_nodes.servers[1], impostor()
    listener = socket.create_server(("127.0.0.1", free_port()))
    port = listener.getsockname()[1]

    def pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def relay():
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            hello = client.recv(256)  # the client's version line
            upstream = socket.create_connection(
                ("127.0.0.1", genuine.port if b"OpenSSH" in hello else imp.port))
            upstream.sendall(hello)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()
    threading.Thread(target=relay, daemon=True).start()
    try:
        ssh = trusting("key", port, tmp_path, key_of=genuine.host_key)
        relayed = Node(name="relayed", host="127.0.0.1", port=port, user="root", key=str(ssh_nodes.key))
        res = run_true(relayed, ssh)
    finally:
        listener.close()
    assert not res.ok and "another machine may be answering in the host's place" in res.error, res.error
    assert imp.commands == []
