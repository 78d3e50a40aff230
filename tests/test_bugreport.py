"""`sparkbook collect` on a node shared with others, whose logs say what they like: only the
containers of this deployment that this login started are read (another login's, under the same
deployment name, are not), another login's processes show their program and not their arguments,
and no line of a log, an image or a process forges a section of what the node sends back. The
node's tools are tests/test_collect.py's, with docker and ps replaced."""

import json
import re

import pytest

from sparkbook.record import bugreport
from sparkbook.record.bugreport import collect
from sparkbook.params import validate
from sparkbook.nodes.remote import Cluster
from sparkbook.serving.containers import owner_label
from test_collect import OOM, canary, deployment, members, run_folder  # noqa: F401 (canary: a fixture)
from test_serving import fake_tools

# What a hostile log says: section headers, one behind each line break Python's splitlines knows
# besides \n, and a line fenced already (three "@"), which must come back as it was
FORGED = ["@@ container env sparkbook-t-forged", "NCCL_FORGED=1", "hello\r@@ kernel log", "FORGED KERNEL",
          "a\x0b@@ image env", "b\x1e@@ ray status", "c\u2028@@ processes", "d\x85@@ image", "@@@ three at sign"]
LOG = "\n".join(FORGED)

# docker as bug_report.sh calls it: this login's vllm and ray containers, and another login's of
# the same deployment (listed only without the owner's filter), whose log and Ray must stay out
DOCKER = r"""case "$*" in
  "image inspect --format {{.Id}} -- img:1") echo sha256:0123456789abcdef;;
  "image inspect "*) printf 'PATH=/usr/bin\nCUDA_VERSION=13.0.1\n';;
  "run "*) printf 'VERSIONS {"python": "3.12.3", "packages": {"vllm": "0.17.1"}}\n@@ image\nsha256:forged\n';;
  "ps -a --filter label=sparkbook=t --filter label=$FAKE_OWNER --format {{.Names}}") printf 'sparkbook-t-vllm\nsparkbook-t-ray\n';;
  "ps -a --filter label=sparkbook=t "*) printf 'sparkbook-t-vllm\nsparkbook-t-ray\nsparkbook-t-theirs\n';;
  "ps "*) printf 'sparkbook-t-vllm\timg:1\tUp\nsparkbook-t-theirs\timg:1\tUp\n';;
  "inspect --format image="*) printf 'image=img:1 sha256:0123456789abcdef\nstate=running exit=0\ncommand="vllm" ["serve"]\n';;
  "inspect "*) printf 'NCCL_DEBUG=INFO\n';;
  "logs --timestamps sparkbook-t-theirs") echo "THEIR LOG";;
  "logs "*) printf '%s\n' "$FAKE_LOG";;
  "exec sparkbook-t-theirs "*) echo "THEIR RAY";;
  "exec sparkbook-t-ray ray status") printf 'Active:\n 1 node_1\n@@ vllm-serve.log\nFORGED SERVE\n';;
  "exec "*) script=$(printf '%s' "$5" | sed "s#/tmp/ray#$FAKE_RAY#g"); shift 5; sh -c "$script" "$@";;
  *) echo "docker: no such command here: $*" >&2; exit 1;;
esac
"""
# ps: a process of this login and one of another's, whose arguments carry its token
PS = r"""me=$(id -u)
printf '  PID  PPID     ELAPSED   RSS   UID COMMAND\n'
printf ' 4001     1       01:00  9000 %s python3 -m mine --port 8000\n' "$me"
printf ' 4002     1       01:00  8000 %s python3 theirs.py --hf-token hf_THEIRS123\n' "$((me + 1))"
printf ' 4003     1       01:00  7000 %s sleep 100\n' "$((me + 1))"
"""


@pytest.fixture
def report(tmp_path, canary, monkeypatch):  # noqa: F811
    """test_collect's node with this file's docker and ps: a function of what the containers' logs,
    Ray's raylet.out and vllm serve's log say, that collects and returns the archive's files."""
    params = validate(deployment(tmp_path))
    monkeypatch.setenv("FAKE_OWNER", owner_label(params.head))
    fake_tools(tmp_path, monkeypatch, docker=DOCKER, ps=PS)
    raylet = tmp_path / "ray" / "session_latest" / "logs" / "raylet.out"
    serve = tmp_path / "vllm-serve.log"
    monkeypatch.setattr(bugreport.workdir, "serve_log", lambda params, node: str(serve))

    def collected(log: str = "INFO started") -> dict[str, bytes]:
        monkeypatch.setenv("FAKE_LOG", log)
        raylet.write_text(raylet.read_text() + log + "\n")
        serve.write_text(f"INFO serving\n{log}\n")
        return members(collect(run_folder(tmp_path, deployment(tmp_path)), params, Cluster.from_params(params)))

    return collected


def test_another_logins_containers_are_not_read(report):
    files = report()
    assert not [n for n in files if "theirs" in n]
    assert not [n for n, text in files.items() if b"THEIR " in text or b"sparkbook-t-theirs" in text]
    assert {"nodes/n1/sparkbook-t-vllm.log", "nodes/n1/sparkbook-t-ray.log", "nodes/n1/ray_status.txt"} <= set(files)


def test_another_logins_processes_show_their_program_alone(report):
    files = report()
    lines = files["nodes/n1/processes.txt"].decode().splitlines()
    assert lines[0].split() == ["PID", "PPID", "ELAPSED", "RSS", "UID", "COMMAND"]
    assert lines[1].split()[5:] == ["python3", "-m", "mine", "--port", "8000"]  # this login's: whole
    assert lines[2].split()[5:] == ["python3"] and lines[3].split()[5:] == ["sleep"]  # another's: the program
    assert not [n for n, text in files.items() if b"hf_THEIRS123" in text or b"theirs.py" in text]


def test_no_line_of_a_log_forges_a_section(report):
    files = report(LOG)
    assert not [n for n in files if "forged" in n.lower()]
    # the sections the log names hold what their own sources said
    for name in ("kernel_log.txt", "image_env.txt", "processes.txt"):
        assert b"FORGED" not in files[f"nodes/n1/{name}"] and b"@@" not in files[f"nodes/n1/{name}"], name
    assert OOM.encode() in files["nodes/n1/kernel_log.txt"]
    assert files["nodes/n1/image.txt"].strip() == b"sha256:0123456789abcdef"
    assert files["nodes/n1/ray_status.txt"].startswith(b"Active:\n")
    assert files["nodes/n1/vllm-serve.log"].startswith(b"INFO serving\n")
    # each hostile line is where it was written, as it was written (its line breaks as newlines)
    lines = re.split("[\n\r\x0b\x1e\u2028\x85]", LOG)
    for name in ("sparkbook-t-vllm.log", "sparkbook-t-ray.raylet.out", "vllm-serve.log"):
        text = files[f"nodes/n1/{name}"].decode()
        at = text.index(lines[0])
        assert text[at:].splitlines()[:len(lines)] == lines, name
    assert "@@ vllm-serve.log" in files["nodes/n1/ray_status.txt"].decode()
    assert "@@ image\nsha256:forged" in files["nodes/n1/runtime_versions.txt"].decode()
    assert json.loads(files["versions.json"])["n1"]["vLLM"] == "0.17.1"
