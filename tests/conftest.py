import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

import check_rows
from sparkbook.record import fingerprint
from sparkbook.lab import docker
from sparkbook.params import SSH, Node, load
from sparkbook.facts.parsers import listener
from sparkbook.nodes.remote import Cluster
from sparkbook.nodes.sshd import SshServer, keygen

SHARED = Path(__file__).resolve().parents[2] / "shared"
LAB_YAML = Path(__file__).resolve().parents[1] / "parameters" / "lab.yaml"
FIELD_SAMPLES = SHARED / "field-samples"


LAB_FIXTURES = {"lab", "params", "cluster", "full_run"}


# Modules whose lab tests run on 4 nodes (`resized`). They run last: going back to 2 nodes makes a
# new worker, and the session's 2-node lab is left as the 2-node tests expect it (its worker gets
# the serving image by a real copy, once, from the first test that needs it there).
FOUR_NODES = {"test_distribute.py", "test_e2e_quad.py"}


def pytest_collection_modifyitems(config, items):
    """Every test that uses the lab carries the ``lab`` marker (``pytest -m "not lab"`` leaves
    them out), whether it says so or gets the lab through a fixture. The 4-node lab tests run
    after every other, each module's together, so that the lab is resized once."""
    for item in items:
        if LAB_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.lab)
            if item.path.name in FOUR_NODES:
                item.add_marker(pytest.mark.four_nodes)
    items.sort(key=lambda item: item.get_closest_marker("four_nodes") is not None)  # stable


def pytest_configure(config):
    """The session's own sparkbook cache (sparkbook.book.project.user_cache), empty at its start
    as on a fresh machine: the lab tests share it (the image inspections of one lab image), and
    nothing of it reaches the user's ~/.cache. Set before any test, so that kernels and `sparkbook`
    subprocesses inherit it (and xdist's workers the controller's)."""
    if not os.environ.get("SPARKBOOK_CACHE"):
        os.environ["SPARKBOOK_CACHE"] = config._sparkbook_cache = tempfile.mkdtemp(prefix="sparkbook-test-cache.")


def pytest_unconfigure(config):
    if made := getattr(config, "_sparkbook_cache", None):
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(autouse=True)
def own_cache(request, monkeypatch):
    """A test without the lab gets a sparkbook cache of its own (its fakes' image IDs are not
    unique), made when it is first used."""
    if request.node.get_closest_marker("lab") is None:
        test = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]  # a name of any length
        monkeypatch.setenv("SPARKBOOK_CACHE", os.path.join(os.environ["SPARKBOOK_CACHE"], test))


@pytest.fixture(autouse=True)
def no_fingerprint(request, monkeypatch):
    """Outside the lab, 06's and 07's steps and `sparkbook run` take no run fingerprint:
    fingerprint.ensure would run the node scripts on this machine (parameters/localhost.yaml), even
    `docker run` of the serving image. An empty Fingerprint stands for it (tests/test_fingerprint.py
    tests the function it imported, not this stub)."""
    if request.node.get_closest_marker("lab") is None:
        monkeypatch.setattr(fingerprint, "ensure", lambda ctx, **kw: fingerprint.Fingerprint())


@pytest.fixture(autouse=True)
def row_proved(request, monkeypatch):
    """A test tests/check_rows.py names for rows must make each of them FAIL or WARN. Lab tests are
    left out (many make their checks in a kernel subprocess, out of this process's sight): for them,
    test_check_rows.py checks only that they exist."""
    node = request.node
    test_id = "::".join([node.path.relative_to(check_rows.ROOT).as_posix(),
                         *([node.cls.__name__] if node.cls else []), node.originalname])
    rows = check_rows.rows_naming(test_id, getattr(getattr(node, "callspec", None), "id", ""))
    if not rows or node.get_closest_marker("lab"):
        yield
        return
    seen = check_rows.record(monkeypatch)
    yield
    if missing := check_rows.unproved(rows, seen):
        pytest.fail(f"tests/check_rows.py names {test_id} for the rows {missing}, which it never made FAIL or WARN")


def field_sample(name: str) -> str:
    """A real output captured on a DGX Spark (../shared/field-samples), without its two header
    lines; the test is skipped, visibly, where ../shared is absent."""
    path = FIELD_SAMPLES / name
    if not path.is_file():
        pytest.skip(f"field sample {path} not present (../shared is absent on this machine)")
    lines = path.read_text().splitlines(keepends=True)
    assert lines[0].startswith("# source:"), f"{name}: first line must name the source"
    return "".join(lines[2:])


def steps_seen(summary: dict) -> list[tuple]:
    """Each step of a run summary as (name, status), and its error (the failed checks with their
    remedies) where it did not pass: what a failed assertion on a run must show, since the step's
    own output may be cut from the log that CI keeps."""
    return [(s["name"], s["status"]) + ((s["error"],) if s["status"] != "passed" and s.get("error") else ())
            for s in summary["steps"]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_sshd(root: Path, key: Path) -> SshServer:
    """A real sshd on loopback playing a node, on a free port, with a home of its own. Its sessions
    run as this machine's user, and bash reads ``$HOME/.bashrc`` for every SSH command: this
    machine's may be slow (pyenv's ``init`` rehashes under a lock that every concurrent shell
    waits on, up to a minute, and a killed one leaves the lock behind), and a node's is not it."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    return SshServer(root, free_port(), authorized_keys=[key], set_env={"HOME": str(home)})


class SshNodes:
    """Several real sshd on loopback, each playing a node."""

    def __init__(self, root: Path, count: int):
        self.root = root
        self.key = keygen(root / "client" / "id_ed25519", "sparkbook-tests")
        self.servers = [loopback_sshd(root / f"node{i}", self.key) for i in range(count)]
        for s in self.servers:
            s.start()
        self.known_hosts = root / "client" / "known_hosts"
        self.known_hosts.write_text("".join(s.known_hosts_line() for s in self.servers))

    def nodes(self, names=None) -> list[Node]:
        names = names or [f"node{i}" for i in range(len(self.servers))]
        return [Node(name=n, host="127.0.0.1", port=s.port, user="root", key=str(self.key),
                     role="head" if i == 0 else "worker")
                for i, (n, s) in enumerate(zip(names, self.servers))]

    def ssh(self, **kw) -> SSH:
        return SSH(known_hosts=[str(self.known_hosts)], **kw)

    def stop(self):
        for s in self.servers:
            s.stop()


@pytest.fixture(scope="session")
def ssh_nodes(tmp_path_factory):
    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")):
        pytest.skip("openssh-server is not installed (scripts/bootstrap installs it)")
    if os.geteuid() != 0:
        pytest.skip("the loopback sshd nodes need root (sshd privilege separation)")
    nodes = SshNodes(tmp_path_factory.mktemp("sshd"), 3)
    yield nodes
    nodes.stop()


def _lab_possible() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    for tool in ("dockerd", "docker", "debootstrap", "ip", "nsenter", "unshare"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/bootstrap installs the lab's packages)"
    return None


@pytest.fixture(scope="session")
def lab(request):
    """The 2-node lab, up for the whole session (the image is built first if needed, which takes
    minutes the first time) and clean (``clean_lab``: what an earlier run or benchmark left on it is
    removed, and said), and removed at the end, checking that nothing is left."""
    why = _lab_possible()
    if why:
        pytest.skip(why)
    from sparkbook.lab import Lab
    from sparkbook.lab.host import leftovers
    the_lab, say = Lab(), _say(request)
    st = the_lab.state()
    if st and (len(st["nodes"]) != 2 or st.get("unwired")):
        say(f"lab: {len(st['nodes'])} {'unwired ' if st.get('unwired') else ''}nodes were up (left by an "
            "interrupted run or a benchmark): taking them down for the session's 2")
        the_lab.down(say=lambda *_: None)
    the_lab.up(2)
    clean_lab(the_lab, say=say)
    yield the_lab
    the_lab.down(say=lambda *_: None)
    assert leftovers() == [], "lab down left things behind"


@pytest.fixture
def boots_checked(monkeypatch):
    """Every lab node (re)started in the test starts its commands only once its new init is ready:
    the previous boot's ready mark is made old before each start, and the start must return with a
    fresh one (a stale mark once let `lab reboot` run `netplan apply` before the node's mounts, so
    its management address never came back and its sshd "did not start"). Judged at the end, so
    that every init started is recorded and goes with the lab."""
    from sparkbook.lab.lab import Lab
    real, stale = Lab._start_init, []

    def start_init(self, node, models_mount):
        ready = node.dir / "init.ready"
        if ready.exists():
            os.utime(ready, (0, 0))
        pids = real(self, node, models_mount)
        if not (ready.exists() and ready.stat().st_mtime > 0):
            stale.append(node.name)
        return pids
    monkeypatch.setattr(Lab, "_start_init", start_init)
    yield
    assert stale == [], f"started on the last boot's ready mark: {stale}"


def _say(request):
    """Lines the whole session sees at once (pytest's own output, not captured)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    return (lambda line: reporter.write_line(line)) if reporter else print


# vLLM and Ray processes, as `ps -eo pid=,args=` shows them on a node
STALE = re.compile(r"vllm|\bray\b|raylet|gcs_server")


def sparkbook_containers(node) -> list[tuple[str, str]]:
    """(ID, name) of every sparkbook container on a lab node.

    By the label's key alone, whatever the deployment: the lab's nodes, their namespaces and Docker
    daemons are entirely the lab's own, so every sparkbook container on them is a leftover of an
    earlier run. Never so on real nodes, where every filter names the deployment
    (label=sparkbook=<name>)."""
    out = docker(node, "ps", "-a", "--filter", "label=sparkbook", "--format", "{{.ID}} {{.Names}}",
                 check=False, timeout=30).stdout
    return [tuple(ln.split(None, 1)) for ln in out.splitlines() if ln.strip()]


def lab_litter(lab) -> dict[str, list[str]]:
    """What runs on the lab's nodes that a clean lab has not: sparkbook containers, vLLM and Ray
    processes, listeners on the configured ports; by node."""
    ports = lab.params().ports.model_dump()
    found = {}
    for node in lab.nodes():
        items = [f"container {name}" for _, name in sparkbook_containers(node)]
        ps = lab.node_sh(node, "ps -eo pid=,args=", check=False).stdout
        items += [f"process {ln.strip()[:120]}" for ln in ps.splitlines() if STALE.search(ln)]
        ss = lab.node_sh(node, "ss -ltnpH", check=False).stdout.splitlines()
        items += [f"listener on {kind} port {port}: {listener(ss, port)}" for kind, port in ports.items()
                  if listener(ss, port)]
        if items:
            found[node.name] = items
    return found


def clean_lab(lab, say=print, settle: float = 15) -> None:
    """Make the session's lab clean for the tests that need one, saying what was found: heal the
    faults left applied, remove the sparkbook containers on its nodes; and when something is
    still running or listening after that (a process outside any container), rebuild the lab."""
    from sparkbook.lab import faults
    for f in faults.heal(lab):
        say(f"lab: a {f['kind']} fault on {f['node']} was left applied: healed")
    found = lab_litter(lab)
    for node in lab.nodes():
        ids = [cid for cid, _ in sparkbook_containers(node)]
        if ids:
            docker(node, "rm", "-f", "-v", *ids, timeout=120)
    if found:
        say("lab: found at session start, left by an earlier run: "
            + "; ".join(f"{n}: {', '.join(items)}" for n, items in found.items())
            + "; sparkbook's containers removed")
    deadline = time.monotonic() + settle  # sockets close a moment after their process
    while (left := lab_litter(lab)) and time.monotonic() < deadline:
        time.sleep(1)
    if left:
        say("lab: still there without a container: " + "; ".join(f"{n}: {', '.join(items)}"
                                                               for n, items in left.items())
            + "; rebuilding the lab (its nodes are entirely its own)")
        n = len(lab.nodes())
        lab.down(say=say)
        lab.up(n, say=say)


@contextmanager
def resized(lab, n: int):
    """The session's lab with ``n`` nodes (`lab up` takes seconds once the image is built), clean:
    a new lab, or the one of that size already up with what an earlier test left removed. It stays
    that size: the next 2-node test brings the 2 back (``lab_size``), and the 4-node modules run
    last (pytest_collection_modifyitems), so that happens only when one is run alone. The workers
    of a new lab come up holding the head's images (``seed_images``: hard links, in a moment),
    spared a copy of the 4 GB serving image each; images a test builds later are on the head only."""
    if len(lab.nodes()) == n and not (lab.state() or {}).get("unwired"):
        clean_lab(lab, say=lambda *_: None)
    else:
        lab.down(say=lambda *_: None)
        lab.up(n, say=lambda *_: None, seed_images=True)
    yield lab


@pytest.fixture(autouse=True)
def lab_size(request):
    """A 2-node lab test after a 4-node one gets its 2 nodes back."""
    if not LAB_FIXTURES & set(request.fixturenames) or request.node.get_closest_marker("four_nodes"):
        return
    two_nodes(request.getfixturevalue("lab"))


def two_nodes(lab) -> None:
    """The session's lab back at its 2 wired nodes, if a 4-node or a day-one test left it otherwise."""
    if len(lab.nodes()) != 2 or (lab.state() or {}).get("unwired"):
        lab.down(say=lambda *_: None)
        lab.up(2, say=lambda *_: None)


# the canaries of the runbook's run (``full_run``): the HF token, and an API key with characters
# that JSON, HTML and the shell escape
CANARY = "hf_e2eCANARY7f3a9c1d5b8e2f4a6c0d"
API_KEY = "sk-e2e\"CANARY&<key>'9f2c4e7b1d"


@pytest.fixture(scope="session")
def full_run(lab, tmp_path_factory):
    """The whole runbook on the 2-node lab as the README's first command runs it (`sparkbook run`
    of parameters/lab.yaml), with an API key required and the canaries in the environment: once a
    session, read by tests/test_e2e.py and compared with the 4-node run by tests/test_e2e_quad.py."""
    from sparkbook.runbook.runner import run
    two_nodes(lab)  # asked for first by a 4-node test run alone
    out = tmp_path_factory.mktemp("e2e")
    data = yaml.safe_load(LAB_YAML.read_text())
    data["serving"]["api_key_env"] = "SPARKBOOK_E2E_API_KEY"
    params_file = tmp_path_factory.mktemp("params") / "lab-e2e.yaml"
    params_file.write_text(yaml.safe_dump(data))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", CANARY)
        mp.setenv("SPARKBOOK_E2E_API_KEY", API_KEY)
        summary = run(params_file, out=out)
    return out, summary


@pytest.fixture(scope="module")
def params(lab):
    """parameters/lab.yaml, with the lab up."""
    return load(LAB_YAML)


@pytest.fixture(scope="module")
def cluster(params):
    return Cluster.from_params(params)
