"""Issue 15, point 12 (SSH: the system's known_hosts, host certificates, revoked keys, agent
forwarding, the nodes' ports between nodes) and point 3's exclusive file creation (put_bytes), against
real OpenSSH servers on loopback."""

import os
import subprocess
import time

import pytest

from conftest import loopback_sshd
from sparkbook.nodes import hostkeys
from sparkbook.params import SSH, Node
from sparkbook.nodes.remote import Cluster, drop
from sparkbook.nodes.shell import peer_ssh
from sparkbook.nodes.sshd import certify_host, keygen


def pubkey(path) -> str:
    return " ".join(open(str(path) + ".pub").read().split()[:2])


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty home: no ~/.ssh/known_hosts, an ~/.ssh/config the test writes."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def certified(ssh_nodes, tmp_path):
    """An sshd whose host key carries a certificate signed by a CA, and that CA's key."""
    ca = keygen(tmp_path / "ca" / "ca", "sparkbook-test-ca")
    server = loopback_sshd(tmp_path / "srv", ssh_nodes.key)
    keygen(server.host_key)
    server.host_certificate = certify_host(ca, server.host_key, ["127.0.0.1"])
    server.start()
    yield server, ca
    server.stop()


def node_of(server, ssh_nodes, name="certified") -> Node:
    return Node(name=name, host="127.0.0.1", port=server.port, user="root", key=str(ssh_nodes.key))


def run_true(node, ssh):
    drop(node, ssh)  # a connection cached by an earlier test would skip the host check
    return Cluster([node], ssh).run("true")[node.name]


# --- the system's known_hosts ---------------------------------------------------------------------

def test_global_known_hosts_file_from_ssh_config_is_honoured(ssh_nodes, home, tmp_path):
    system = tmp_path / "ssh_known_hosts"
    system.write_text(ssh_nodes.servers[1].known_hosts_line())
    (home / ".ssh" / "config").write_text(f"GlobalKnownHostsFile {system}\n")
    res = run_true(ssh_nodes.nodes()[1], SSH(connect_timeout=4.25))
    assert res.ok, res.error


def test_the_default_system_known_hosts_is_read(ssh_nodes, home, tmp_path, monkeypatch):
    system = tmp_path / "etc_ssh_known_hosts"
    monkeypatch.setattr(hostkeys, "SYSTEM_FILES", (str(system), "/nonexistent/known_hosts2"))
    node, ssh = ssh_nodes.nodes()[2], SSH(connect_timeout=4.5)
    assert "unknown host key" in run_true(node, ssh).error
    system.write_text(ssh_nodes.servers[2].known_hosts_line())
    assert run_true(node, ssh).ok


# --- host certificates ----------------------------------------------------------------------------

def test_a_host_certified_by_a_trusted_ca_is_accepted_after_openssh_checks_it(ssh_nodes, certified, tmp_path):
    server, ca = certified
    known = tmp_path / "known_hosts"
    # a CA line, which Paramiko cannot even parse, and another host's plain key that must still load
    known.write_text(f"@cert-authority [127.0.0.1]:{server.port} {pubkey(ca)}\n"
                     + ssh_nodes.servers[0].known_hosts_line())
    ssh = SSH(known_hosts=[str(known)], connect_timeout=5)
    assert run_true(node_of(server, ssh_nodes), ssh).ok
    assert run_true(ssh_nodes.nodes()[0], ssh).ok


def test_a_certificate_from_another_ca_is_refused_saying_why(ssh_nodes, certified, tmp_path):
    server, _ = certified
    other = keygen(tmp_path / "other" / "ca", "not-the-ca")
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority [127.0.0.1]:{server.port} {pubkey(other)}\n")
    res = run_true(node_of(server, ssh_nodes), SSH(known_hosts=[str(known)], connect_timeout=5))
    assert not res.ok and res.exit_code is None
    assert "certificate authority" in res.error and f"{known}:1" in res.error
    assert "OpenSSH did not accept the host" in res.error
    assert "unknown host key" not in res.error


def test_openssh_is_asked_to_check_the_host_and_nothing_else():
    import paramiko
    from fabric import Connection
    cmd = hostkeys.openssh_command(Connection("127.0.0.1", user="root", port=2222), ["/k h"], 5,
                                   paramiko.RSAKey.generate(1024))
    opts = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-o"]
    for o in ("BatchMode=yes", "StrictHostKeyChecking=yes", "ForwardAgent=no", "ControlPath=none",
              "PasswordAuthentication=no", "UpdateHostKeys=no", 'UserKnownHostsFile="/k h"',
              "GlobalKnownHostsFile=none"):
        assert o in opts
    assert cmd[-3:] == ["--", "127.0.0.1", "true"]


def test_a_host_listed_under_a_pattern_is_accepted_as_openssh_would(ssh_nodes, tmp_path):
    server = ssh_nodes.servers[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.*]:{server.port} {pubkey(server.host_key)}\n")
    assert run_true(ssh_nodes.nodes()[1], SSH(known_hosts=[str(known)], connect_timeout=5.25)).ok
    known.write_text(f"[127.0.0.*]:{server.port} {pubkey(ssh_nodes.servers[0].host_key)}\n")
    res = run_true(ssh_nodes.nodes()[1], SSH(known_hosts=[str(known)], connect_timeout=5.5))
    assert not res.ok and "OpenSSH did not accept the host" in res.error


# --- revoked keys ---------------------------------------------------------------------------------

def test_a_revoked_key_is_refused_even_where_known_hosts_lists_it(ssh_nodes, tmp_path):
    server = ssh_nodes.servers[1]
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line() + f"@revoked * {pubkey(server.host_key)}\n")
    res = run_true(ssh_nodes.nodes()[1], SSH(known_hosts=[str(known)], connect_timeout=5))
    assert not res.ok and "is marked @revoked in known_hosts: refused" in res.error


# --- agent forwarding -----------------------------------------------------------------------------

@pytest.fixture
def agent(tmp_path, monkeypatch):
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    for _ in range(100):
        if sock.exists():
            break
        time.sleep(0.05)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
    yield sock
    proc.terminate()
    proc.wait(timeout=10)


def test_the_agent_is_not_forwarded_whatever_ssh_config_says(ssh_nodes, home, agent):
    (home / ".ssh" / "config").write_text("Host *\n  ForwardAgent yes\n")
    node = ssh_nodes.nodes()[0]
    cmd = 'echo "${SSH_AUTH_SOCK:-none}"'
    ssh = ssh_nodes.ssh(connect_timeout=4.75)
    drop(node, ssh)
    assert Cluster([node], ssh).run(cmd)[node.name].stdout.strip() == "none"
    asked = ssh_nodes.ssh(connect_timeout=4.75, forward_agent=True)
    drop(node, asked)
    assert Cluster([node], asked).run(cmd)[node.name].stdout.strip() != "none"


# --- between nodes --------------------------------------------------------------------------------

def test_node_to_node_ssh_uses_the_peers_port_and_never_the_agent():
    cmd = peer_ssh(Node(name="w", host="10.0.0.2", user="nvidia", port=2222))
    assert cmd[-3:] == ["-p", "2222", "nvidia@10.0.0.2"] and "ForwardAgent=no" in cmd
    assert "-p" not in peer_ssh(Node(name="w", host="10.0.0.2"))


def test_node_to_node_ssh_reaches_a_peer_on_its_own_port(ssh_nodes):
    """peer_ssh as a node runs it (here the node is this machine): the peer's sshd is not on 22."""
    peer = ssh_nodes.nodes()[1]
    cmd = peer_ssh(peer)
    cmd[1:1] = ["-i", str(ssh_nodes.key), "-o", f"UserKnownHostsFile={ssh_nodes.known_hosts}"]
    done = subprocess.run([*cmd, "echo", "$SSH_CONNECTION"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == str(peer.port)


# --- point 3: files are created exclusively -------------------------------------------------------

def planted(tmp_path):
    """A file of someone else's and a link to it where sparkbook is about to write."""
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    victim.chmod(0o644)
    dest = tmp_path / "work" / "secrets.env"
    dest.parent.mkdir()
    dest.symlink_to(victim)
    return victim, dest


def check_not_followed(victim, dest):
    assert victim.read_text() == "theirs\n" and victim.stat().st_mode & 0o777 == 0o644
    assert not dest.is_symlink() and dest.read_text() == "TOKEN=x\n"
    assert dest.stat().st_mode & 0o777 == 0o600


def test_put_bytes_on_a_local_node_replaces_a_planted_link_never_writing_through_it(tmp_path):
    victim, dest = planted(tmp_path)
    here = Node(name="here", host="localhost", local=True)
    res = Cluster([here]).put_bytes(b"TOKEN=x\n", str(dest), mode=0o600)
    assert res.ok, res
    check_not_followed(victim, dest)


def test_put_bytes_over_sftp_replaces_a_planted_link_never_writing_through_it(ssh_nodes, tmp_path):
    victim, dest = planted(tmp_path)
    res = Cluster(ssh_nodes.nodes()[:1], ssh_nodes.ssh()).put_bytes(b"TOKEN=x\n", str(dest), mode=0o600)
    assert res.ok, res
    check_not_followed(victim, dest)


def test_put_bytes_replaces_an_earlier_file_with_the_new_mode(ssh_nodes, tmp_path):
    dest = tmp_path / "f"
    dest.write_text("old, longer content\n")
    dest.chmod(0o666)
    res = Cluster(ssh_nodes.nodes()[:1], ssh_nodes.ssh()).put_bytes(b"TOKEN=x\n", str(dest), mode=0o600)
    assert res.ok and dest.read_text() == "TOKEN=x\n" and dest.stat().st_mode & 0o777 == 0o600
    assert os.stat(dest).st_uid == os.getuid()
