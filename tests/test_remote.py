"""The remote layer against real OpenSSH servers on loopback (no mocks)."""

import io
import os
import signal
import subprocess
import time
from contextlib import contextmanager

import pytest

from sparkbook.book.errors import CheckFailed
from sparkbook.params import SSH, Node
from sparkbook.nodes.remote import Cluster, connection
from sparkbook.nodes.shell import sh, wrap


def test_parallel_run_reaches_each_node_and_overlaps(ssh_nodes):
    cluster = Cluster(ssh_nodes.nodes(), ssh_nodes.ssh())
    # each node's span is 3 s: longer than opening the three connections takes on a busy machine
    res = cluster.run('date +%s.%N; echo "$SSH_CONNECTION"; sleep 3; date +%s.%N')
    assert res.ok and list(res) == ["node0", "node1", "node2"]
    spans = []
    for server, r in zip(ssh_nodes.servers, res.values()):
        start, conn, end = r.stdout.split("\n")[:3]
        assert conn.split()[-1] == str(server.port)  # each node answered on its own sshd
        spans.append((float(start), float(end)))
    assert max(s for s, _ in spans) < min(e for _, e in spans), "the nodes did not run at once"


def test_failing_command_is_kept_per_node_and_check_names_it(ssh_nodes):
    cluster = Cluster(ssh_nodes.nodes(), ssh_nodes.ssh())
    res = cluster.run(lambda n: "echo oops >&2; exit 3" if n.name == "node1" else "true")
    assert res["node0"].ok and res["node2"].ok
    bad = res["node1"]
    # the command's own stderr last: the login shell may write first (a machine whose ~/.bashrc runs
    # `pyenv init`, whose rehash races between parallel logins: "pyenv: cannot rehash", seen here)
    assert (bad.exit_code, bad.stderr.strip().splitlines()[-1:], bad.error) == (3, ["oops"], None)
    with pytest.raises(CheckFailed) as e:
        res.check("probe", remedy="fix node1")
    msg = str(e.value)
    assert "node1: exit code 3: oops" in msg and "command: echo oops" in msg and "fix node1" in msg
    assert "node0" not in msg


def test_timeout_stops_the_remote_command(ssh_nodes):
    cluster = Cluster(ssh_nodes.nodes()[:1], ssh_nodes.ssh())
    res = cluster.run("sleep 37.25", timeout=1)["node0"]
    assert res.timed_out and not res.ok and "timed out" in res.error
    assert res.duration < 10
    time.sleep(0.5)
    left = cluster.run("pgrep -f 'slee[p] 37.25' || true")["node0"].stdout.strip()
    assert left == "", f"the timed-out command still runs: pids {left}"


@contextmanager
def frozen(ssh_nodes, index: int):
    """Node ``index``'s sshd and its sessions stopped (SIGSTOP): no answer, no reset, no reading,
    as a node that hangs under an open connection; a cluster of that node alone, connected first."""
    node, server = ssh_nodes.nodes()[index], ssh_nodes.servers[index]
    cluster = Cluster([node], ssh_nodes.ssh())
    assert cluster.run("true")[node.name].ok  # the connection is open and cached
    sessions = subprocess.run(["pgrep", "-P", str(server.pid())], capture_output=True,
                              text=True).stdout.split()
    pids = [server.pid(), *map(int, sessions)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield cluster
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_a_node_that_stops_answering_on_an_open_connection_does_not_hang(ssh_nodes):
    with frozen(ssh_nodes, 2) as cluster:
        res = cluster.run("true", timeout=1)["node2"]
    assert res.timed_out and "no answer" in res.error and "dropped" in res.error
    assert cluster.run("true")["node2"].ok  # a new connection works again


def test_a_file_put_to_a_node_that_stops_reading_ends_at_its_deadline(ssh_nodes, tmp_path):
    """SFTP waits without end for a node that reads nothing more: the put has a time limit."""
    dest = tmp_path / "put-frozen" / "f"
    with frozen(ssh_nodes, 2) as cluster:
        t0 = time.monotonic()
        res = cluster.put_bytes(b"x" * (4 << 20), str(dest), timeout=1)["node2"]
        took = time.monotonic() - t0
    assert not res.ok and res.timed_out and "no answer within 1 s" in res.error, res
    assert took < 10
    assert cluster.put_bytes(b"again", str(dest))["node2"].ok  # a new connection works again
    assert dest.read_bytes() == b"again"


def test_streamed_output_is_prefixed_by_node(ssh_nodes):
    out = io.StringIO()
    Cluster(ssh_nodes.nodes(), ssh_nodes.ssh()).run("echo one; echo two", stream=out)
    lines = out.getvalue().splitlines()
    for n in ("node0", "node1", "node2"):
        assert [ln for ln in lines if ln.startswith(f"[{n}] ")] == [f"[{n}] one", f"[{n}] two"]


def test_one_connection_per_node_is_reused(ssh_nodes):
    node, ssh = ssh_nodes.nodes()[0], ssh_nodes.ssh()
    cluster = Cluster([node], ssh)
    first = cluster.run('echo "$SSH_CONNECTION"')["node0"]
    transport = connection(node, ssh).transport
    second = cluster.run('echo "$SSH_CONNECTION"')["node0"]
    assert transport is not None and connection(node, ssh).transport is transport
    # the same client port: both commands came over one TCP connection
    assert first.stdout.split()[1] == second.stdout.split()[1]


def test_quoting_keeps_values_out_of_the_shell(ssh_nodes, tmp_path):
    cluster = Cluster(ssh_nodes.nodes()[:1], ssh_nodes.ssh())
    evil = "x; touch pwned"
    res = cluster.run(["ls", "-d", str(tmp_path / evil)])["node0"]
    assert res.exit_code != 0  # ls looked for one odd file name and did not find it
    res = cluster.run(sh("cd {d} && mkdir -p {p} && ls", d=tmp_path, p=evil))["node0"]
    assert res.ok and res.stdout.strip() == evil
    res = cluster.run("cd " + str(tmp_path) + " && echo \"$X\"", env={"X": "$(touch pwned2)"})
    assert res["node0"].stdout.strip() == "$(touch pwned2)"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert "'x; touch pwned'" in wrap(["ls", evil], 5)


def test_unknown_host_key_is_an_error_not_a_prompt(ssh_nodes, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    node = ssh_nodes.nodes()[1]
    res = Cluster([node], SSH(known_hosts=[str(empty)], connect_timeout=5)).run("true")["node1"]
    assert not res.ok and res.exit_code is None
    assert "unknown host key" in res.error and str(node.port) in res.error
    assert "ssh-keyscan" in res.error


def test_changed_host_key_is_refused(ssh_nodes, tmp_path):
    a, b = ssh_nodes.servers[0], ssh_nodes.servers[2]
    lying = tmp_path / "known_hosts"
    # node2's address with node0's key: what a reinstalled or impostor host looks like
    lying.write_text(a.known_hosts_line().replace(f"]:{a.port} ", f"]:{b.port} "))
    node = ssh_nodes.nodes()[2]
    res = Cluster([node], SSH(known_hosts=[str(lying)], connect_timeout=5)).run("true")["node2"]
    assert not res.ok and "HOST KEY CHANGED" in res.error and "ssh-keygen -R" in res.error


def test_unreachable_node_is_reported_not_raised(ssh_nodes):
    from conftest import free_port
    nodes = ssh_nodes.nodes()[:1] + [Node(name="ghost", host="127.0.0.1", port=free_port(),
                                          key=str(ssh_nodes.key), user="root")]
    res = Cluster(nodes, ssh_nodes.ssh(connect_timeout=3)).run("true")
    assert res["node0"].ok
    assert "cannot connect" in res["ghost"].error


def test_ssh_config_alias_and_proxyjump(ssh_nodes, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    s0, s1 = ssh_nodes.servers[:2]
    (home / ".ssh" / "config").write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {s0.port}\n  User root\n"
        f"  IdentityFile {ssh_nodes.key}\n"
        f"Host behind\n  HostName 127.0.0.1\n  Port {s1.port}\n  User root\n"
        f"  IdentityFile {ssh_nodes.key}\n  ProxyJump jumpbox\n")
    monkeypatch.setenv("HOME", str(home))
    nodes = [Node(name="alias", host="jumpbox"), Node(name="jumped", host="behind")]
    res = Cluster(nodes, ssh_nodes.ssh()).run('echo "$SSH_CONNECTION"')
    assert res.ok, res
    assert res["alias"].stdout.split()[-1] == str(s0.port)
    assert res["jumped"].stdout.split()[-1] == str(s1.port)
    # the hop's host key is checked too: without it the jumped node is refused
    only_target = tmp_path / "kh"
    only_target.write_text(s1.known_hosts_line())
    bad = Cluster(nodes[1:], SSH(known_hosts=[str(only_target)])).run("true")["jumped"]
    assert not bad.ok and "unknown host key" in bad.error
    assert f"[127.0.0.1]:{s0.port} (a ProxyJump hop)" in bad.error


def test_local_node_runs_without_ssh(tmp_path):
    res = Cluster([Node(name="here", host="localhost", local=True)]).run(
        sh("echo {v} > {f}; cat {f}", v="a b", f=tmp_path / "f"))
    assert res["here"].ok and res["here"].stdout == "a b\n"


def test_put_copies_to_every_node(ssh_nodes, tmp_path):
    src = tmp_path / "script.py"
    src.write_text("print('hi')\n")
    # the loopback nodes share this machine's disk: one path each, or their exclusive creates race
    dest = {n.name: tmp_path / "remote dir" / n.name / "s.py" for n in ssh_nodes.nodes()[:2]}
    res = Cluster(ssh_nodes.nodes()[:2], ssh_nodes.ssh()).put(src, lambda n: str(dest[n.name]),
                                                               mode=0o755)
    assert res.ok, res
    for path in dest.values():
        assert path.read_text() == "print('hi')\n" and path.stat().st_mode & 0o777 == 0o755


def test_streamed_lines_arriving_in_pieces_stay_whole():
    """invoke flushes after every chunk it reads; a line split across chunks is still one line."""
    import io
    import threading

    from sparkbook.nodes.remote import _Prefixer
    sink = io.StringIO()
    out = _Prefixer("spark-2", sink, threading.Lock())
    for piece in ("DO", "NE {\"a\"", ": 1}\nPROG", "RESS 5"):
        out.write(piece)
        out.flush()
    assert sink.getvalue() == '[spark-2] DONE {"a": 1}\n'
    out.close()
    assert sink.getvalue().splitlines() == ['[spark-2] DONE {"a": 1}', "[spark-2] PROGRESS 5"]


def _wait_for(pattern: str, running: bool, limit: float = 10) -> bool:
    """Whether a process matching ``pattern`` is (or is no longer) running within ``limit`` s."""
    import subprocess
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if (subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0) == running:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("local", [False, True])
def test_a_command_stops_when_this_machine_goes_away(ssh_nodes, tmp_path, local):
    """The operator's process killed mid-command (an interrupted run, a closed terminal): the
    command on the node ends with the connection, not at its own time limit (issue 15, point 6).
    Over SSH (a real sshd here) and on a local node alike."""
    import subprocess
    import sys
    node = ("Node(name='here', host='localhost', local=True)" if local else
            f"Node(name='n', host='127.0.0.1', port={ssh_nodes.servers[0].port}, user='root', "
            f"key={str(ssh_nodes.key)!r})")
    program = ("import sys; from sparkbook.params import SSH, Node; from sparkbook.nodes.remote import Cluster\n"
               f"ssh = SSH(known_hosts=[{str(ssh_nodes.known_hosts)!r}])\n"
               f"print('go', flush=True); Cluster([{node}], ssh).run('sleep 41.75', timeout=600)\n")
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "go"
        assert _wait_for("slee[p] 41.75", running=True), "the command never started"
    finally:
        proc.kill()
        proc.wait()
    assert _wait_for("slee[p] 41.75", running=False), "the command outlived the process that started it"


def test_the_guard_keeps_the_commands_status_and_output(ssh_nodes):
    cluster = Cluster(ssh_nodes.nodes()[:1], ssh_nodes.ssh())
    r = cluster.run("echo out; echo err >&2; read -r x; echo \"read:$x\"; exit 7")["node0"]
    assert (r.exit_code, r.stdout, r.stderr.strip().splitlines()[-1:]) == (7, "out\nread:\n", ["err"])  # stdin: empty


def test_ctrl_c_during_a_fan_out_returns_at_once_and_stops_the_commands(ssh_nodes):
    """A KeyboardInterrupt (Ctrl-C in a notebook, or the runner interrupting the kernel) while the
    nodes work: raised at once, not after the slowest node, and the commands end on the nodes.
    SIGINT raises KeyboardInterrupt here as in a kernel, whatever this process inherited (a test run
    that a shell started in the background inherits SIGINT ignored: this test failed so)."""
    import os
    import signal
    import threading
    cluster = Cluster(ssh_nodes.nodes(), ssh_nodes.ssh())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # as the kernel gets it
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            cluster.run("sleep 43.5", timeout=600)
        assert time.monotonic() - start < 5
    finally:
        signal.signal(signal.SIGINT, previous)
    # the command itself (the guard's own shells carry its line in their arguments for a few seconds
    # more: they end after KILL_GRACE_S)
    assert _wait_for("^slee[p] 43[.]5$", running=False), "the commands ran on after Ctrl-C"


def test_a_dropped_connection_is_never_opened_again(ssh_nodes):
    """fabric's run opens a closed connection by itself: a command sent on a connection that Ctrl-C
    dropped a moment before would run on a new one nobody drops. It raises instead, and the next
    command gets a connection of its own."""
    from sparkbook.nodes.remote import Dropped, drop
    node, ssh = ssh_nodes.nodes()[0], ssh_nodes.ssh()
    conn = connection(node, ssh)
    assert conn.run("true", hide=True).ok
    drop(node, ssh)
    with pytest.raises(Dropped):
        conn.run("sleep 41.5", hide=True)
    assert not _wait_for("^slee[p] 41[.]5$", running=True, limit=2)
    again = connection(node, ssh)
    assert again is not conn and again.run("true", hide=True).ok
