"""The model from the hub (``model.source: hf``): ``scripts/hub_download.py`` run here against the
local hub server (fresh, resumed, already present, a wrong token, a pinned revision, a damaged
transfer), the server against huggingface_hub's own ``snapshot_download``, ``fetch_model`` on a
local node, the commands, checks and 03's outcome; then on the lab, in the real serving container."""

import getpass
import hashlib
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sparkbook.distribution.hub import CHECK, HubOutcome, download_command, fetch_model, hub_checks, shown
from sparkbook.distribution.image import ImageOutcome
from sparkbook.distribution.model import ModelOutcome, manifests
from sparkbook.lab.hubserver import HubServer
from sparkbook.params import load, validate
from sparkbook.nodes.workdir import secrets_path
from sparkbook.nodes.remote import Cluster
from sparkbook.scripts.hub_download import STATE, _SameOriginAuth, parse_line
from sparkbook.steps import distribute as step
from sparkbook.book.verdict import FAIL, PASS, SKIP

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
SCRIPT = ROOT / "sparkbook" / "scripts" / "hub_download.py"
REPO = "sparkbook-tests/tiny"
TOKEN = "hf_right_" + "7" * 16


@pytest.fixture
def source(tmp_path):
    """A small model folder: two weight files (LFS on the hub) and a few small ones."""
    src = tmp_path / "source"
    (src / "sub").mkdir(parents=True)
    rnd = __import__("random").Random(14)
    (src / "model-00001-of-00002.safetensors").write_bytes(rnd.randbytes(3_000_000))
    (src / "model-00002-of-00002.safetensors").write_bytes(rnd.randbytes(2_000_000))
    (src / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 128}\n')
    (src / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (src / "sub" / "notes.txt").write_text("a file in a subfolder\n")
    return src


@pytest.fixture
def hub(source):
    with HubServer(source, REPO, token=TOKEN) as server:
        yield server


def download(hub, dest, token=TOKEN, revision=None):
    """hub_download.py as a local process (this venv's python, no container)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(dest.parent / "hf-home"))
    if token:
        env["HF_TOKEN"] = token
    args = [sys.executable, str(SCRIPT), "--interval", "0.1",
            *(["--revision", revision] if revision else []), "--", REPO, str(dest)]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    lines = [parse_line(line) for line in r.stdout.splitlines()]
    done = [d for kind, d in filter(None, lines) if kind == "DONE"]
    assert len(done) == 1, r.stdout + r.stderr
    return r, done[0], [d for kind, d in filter(None, lines) if kind == "PROGRESS"]


def same_files(source: Path, dest: Path) -> bool:
    def files(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
                if p.is_file() and ".cache" not in p.relative_to(root).parts}
    return files(source) == files(dest)


# ------------------------------------------------------------------------ hub_download.py, here

def test_fresh_download_then_nothing_sent_when_present(hub, source, tmp_path):
    dest = tmp_path / "model"
    r, done, progress = download(hub, dest)
    assert r.returncode == 0 and done["error"] is None, r.stdout + r.stderr
    assert same_files(source, dest)
    assert hub.sent_total == hub.size == done["fetched"] == done["total"]
    assert done["commit"] == hub.commit and done["files"] == done["fetched_files"] == 5
    assert progress[-1] == {"done": hub.size, "total": hub.size, "files_done": 5, "files": 5}
    assert not list((dest / STATE).glob("*.incomplete"))

    hub.reset()
    r, done, _ = download(hub, dest)
    assert r.returncode == 0 and done["error"] is None
    assert hub.sent_total == 0 and done["fetched"] == 0 and done["fetched_files"] == 0
    assert not [q for q in hub.requests if "/resolve/" in q[1]], "a file was asked for again"


def test_an_interrupted_download_resumes_with_only_the_rest(hub, source, tmp_path):
    dest = tmp_path / "model"
    hub.cut_after(1_200_000)
    r, done, _ = download(hub, dest)
    assert r.returncode == 1 and done["kind"] == "network", done
    cut = done["error"].split(":")[0]
    assert cut.endswith(".safetensors") and not (dest / cut).exists(), "a partial file under its name"
    assert [p.stat().st_size for p in (dest / STATE).glob("*.incomplete")] == [1_200_000]
    first = hub.sent_total
    assert first < hub.size

    hub.reset()
    r, done, _ = download(hub, dest)
    assert r.returncode == 0 and done["error"] is None, done
    assert same_files(source, dest)
    assert hub.sent_total < hub.size and first + hub.sent_total == hub.size
    assert hub.sent[cut] == (source / cut).stat().st_size - 1_200_000
    assert ("GET", f"/{REPO}/resolve/{hub.commit}/{cut}", "bytes=1200000-") in hub.requests


def test_a_wrong_or_missing_token_is_named_and_never_shown(hub, tmp_path):
    canary = "hf_canary_" + secrets.token_hex(12)
    r, done, _ = download(hub, tmp_path / "model", token=canary)
    assert r.returncode == 1 and done["kind"] == "auth" and "401" in done["error"]
    assert canary not in r.stdout + r.stderr
    assert hub.sent_total == 0 and not [p for p in (tmp_path / "model").rglob("*") if p.is_file()]
    # no token: the hub hides a private repository
    r, done, _ = download(hub, tmp_path / "model", token=None)
    assert r.returncode == 1 and done["kind"] == "not-found"


def test_the_revision_is_pinned(hub, source, tmp_path):
    r, done, _ = download(hub, tmp_path / "bad", revision="v9-unknown")
    assert r.returncode == 1 and done["kind"] == "revision" and "v9-unknown" in done["error"]
    assert hub.sent_total == 0
    r, done, _ = download(hub, tmp_path / "model", revision=hub.commit)
    assert r.returncode == 0 and done["commit"] == hub.commit and same_files(source, tmp_path / "model")
    assert {q[1].split("/resolve/")[1].split("/")[0] for q in hub.requests if "/resolve/" in q[1]} \
        == {hub.commit}


def test_a_stale_file_is_replaced_and_other_files_are_left_alone(hub, source, tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    config = (source / "config.json").read_bytes()
    (dest / "config.json").write_bytes(config.replace(b"128", b"256"))  # same size, other content
    (dest / "mine.md").write_text("the operator's notes\n")
    r, done, _ = download(hub, dest)
    assert r.returncode == 0, done
    assert (dest / "config.json").read_bytes() == config and (dest / "mine.md").exists()
    assert hub.sent["config.json"] == len(config)


def test_a_damaged_transfer_is_caught_and_its_partial_file_removed(hub, source, tmp_path):
    weights = source / "model-00002-of-00002.safetensors"
    weights.write_bytes(b"\0" * weights.stat().st_size)  # not what the listing's sha256 says
    r, done, _ = download(hub, tmp_path / "model")
    assert r.returncode == 1 and done["kind"] == "verify" and weights.name in done["error"]
    assert not (tmp_path / "model" / weights.name).exists()
    assert not list((tmp_path / "model" / STATE).glob("*.incomplete"))


@pytest.mark.parametrize("to, kept", [
    ("https://hub.example/b", True),
    ("http://hub.example/b", False),       # the same host in plain HTTP: anyone on the path reads it
    ("https://hub.example:8443/b", False),  # another port: another server, whoever runs it
    ("https://cdn.example/b", False),      # the CDN's signed URL needs no token
])
def test_a_redirect_keeps_the_token_only_on_the_same_scheme_host_and_port(to, kept):
    req = urllib.request.Request("https://hub.example/a")
    req.add_unredirected_header("Authorization", f"Bearer {TOKEN}")
    new = _SameOriginAuth().redirect_request(req, None, 302, "Found", {}, to)
    assert new.full_url == to and (new.unredirected_hdrs.get("Authorization") == f"Bearer {TOKEN}") is kept
    assert "Authorization" not in new.headers


def test_progress_lines_parse():
    assert parse_line("[spark-1] PROGRESS 10 20 1 3") == (
        "PROGRESS", {"done": 10, "total": 20, "files_done": 1, "files": 3})
    assert parse_line("COMMIT abc") == ("COMMIT", {"commit": "abc"})
    assert parse_line('DONE {"fetched": 5, "error": null}') == ("DONE", {"fetched": 5, "error": None})
    for other in ("PROGRESS 1 2", "PROGRESS a b c d", "DONE {", "[spark-1 stderr] Traceback", ""):
        assert parse_line(other) is None


# ------------------------------------------------------------------------- the local hub itself

def test_huggingface_hubs_own_snapshot_download_works_against_the_local_hub(hub, source, tmp_path):
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "h")}
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "snapshot_download(sys.argv[1], local_dir=sys.argv[2])")
    r = subprocess.run([sys.executable, "-c", code, REPO, str(tmp_path / "snap")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert same_files(source, tmp_path / "snap") and hub.sent_total == hub.size


def test_the_local_hub_answers_ranges_headers_and_errors(hub, source):
    name = "model-00001-of-00002.safetensors"
    data = (source / name).read_bytes()
    url = f"{hub.endpoint}/{REPO}/resolve/main/{name}"

    def get(u, method="GET", **headers):
        req = urllib.request.Request(u, method=method, headers={"Authorization": f"Bearer {TOKEN}",
                                                                **headers})
        try:
            with urllib.request.urlopen(req) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    status, h, body = get(url, "HEAD")
    assert status == 200 and body == b"" and h["X-Repo-Commit"] == hub.commit
    assert h["ETag"] == h["X-Linked-Etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert h["Content-Length"] == h["X-Linked-Size"] == str(len(data))
    status, h, body = get(url, Range="bytes=100-199")
    assert status == 206 and body == data[100:200] and h["Content-Range"] == f"bytes 100-199/{len(data)}"
    assert get(url, Range=f"bytes={len(data)}-")[0] == 416
    status, h, _ = get(f"{hub.endpoint}/{REPO}/resolve/main/config.json", "HEAD")
    blob = (source / "config.json").read_bytes()
    assert h["ETag"] == '"' + hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest() + '"'
    status, h, _ = get(f"{hub.endpoint}/api/models/{REPO}/revision/nope")
    assert status == 404 and h["X-Error-Code"] == "RevisionNotFound"
    status, h, _ = get(f"{hub.endpoint}/{REPO}/resolve/main/absent.bin")
    assert status == 404 and h["X-Error-Code"] == "EntryNotFound"
    req = urllib.request.Request(url, headers={"Authorization": "Bearer wrong"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 401 and e.value.headers["X-Error-Message"].startswith("Invalid credentials")
    with pytest.raises(ValueError):
        HubServer(source, REPO, bind="0.0.0.0")


# --------------------------------------------------------------- fetch_model, commands, checks

def local_params(path: str, **model) -> object:
    """A one-node deployment on this machine (no SSH), downloading with this venv's python (set
    after validation: the parameters refuse runtime.kind venv until serving implements it)."""
    params = validate({"name": "hubtest", "nodes": [{"name": "here", "host": "localhost", "local": True,
                                                     "role": "head"}],
                       "runtime": {"image": "unused:1"},
                       "model": {"name": REPO, "path": path, "source": "hf", **model}})
    return params.model_copy(update={"runtime": params.runtime.model_copy(update={"kind": "venv",
                                                                                  "venv": sys.prefix, "image": None})})


def test_fetch_model_on_a_local_node_passes_the_token_in_a_file_only(hub, source, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    params = local_params(str(tmp_path / "model"))
    out = fetch_model(params, Cluster.from_params(params), say=lambda *_: None, show=False)
    assert out.error is None, out
    assert (out.commit, out.fetched, out.total, out.files) == (hub.commit, hub.size, hub.size, 5)
    # the token went through the deployment's private working folder, and is gone
    token_file = secrets_path(params, params.head)  # the one secrets file, which teardown also removes
    folder = Path(token_file).parent
    assert folder == Path(f"/tmp/sparkbook-{getpass.getuser()}/hubtest") and folder.stat().st_mode & 0o777 == 0o700
    assert same_files(source, tmp_path / "model") and not Path(token_file).exists()
    assert TOKEN not in json.dumps(out.to_json()) and "--env-file" in out.command
    assert [c.status for c in hub_checks(params, out)] == [PASS]
    again = fetch_model(params, Cluster.from_params(params), say=lambda *_: None, show=False)
    assert again.error is None and again.fetched == 0 and again.fetched_files == 0


def test_a_failed_fetch_is_a_failed_check_naming_the_head_the_command_and_the_remedy(
        hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_" + "9" * 16)
    params = local_params(str(tmp_path / "model"), revision="main")
    out = fetch_model(params, Cluster.from_params(params), say=lambda *_: None, show=False)
    [check] = hub_checks(params, out)
    assert (check.check, check.node, check.status) == (CHECK, "here", FAIL)
    assert "401" in check.observed and "$HF_TOKEN" in check.remedy
    assert "hub_download.py" in check.command and "hf_wrong_" not in check.command + check.observed
    out.kind, out.error = "revision", "404 Client Error. Revision Not Found"
    assert "model.revision 'main'" in hub_checks(params, out)[0].remedy
    out.kind = "disk"
    assert "free space on here" in hub_checks(params, out)[0].remedy


def test_the_download_runs_in_the_serving_image_as_the_ssh_user(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://10.77.0.1:8081")
    lab = load(LAB)
    params = lab.model_copy(update={"model": lab.model.model_copy(
        update={"source": "hf", "revision": "abc123", "name": "-org/model"})})
    program = "print('the program')"
    cmd = download_command(params, "1000:1001", "/w/hub.env", program)
    assert cmd[:3] == ["docker", "run", "--rm"] and cmd[cmd.index("--user") + 1] == "1000:1001"
    # the container is this deployment's (name and label): another deployment's download is not touched
    assert cmd[cmd.index("--name") + 1] == f"sparkbook-{params.name}-hub-download"
    assert cmd[cmd.index("--label") + 1] == f"sparkbook={params.name}"
    assert ["-v", "/models/tiny-qwen3:/models/tiny-qwen3"] == cmd[cmd.index("-v"):cmd.index("-v") + 2]
    assert "HF_ENDPOINT=http://10.77.0.1:8081" in cmd and cmd[cmd.index("--env-file") + 1] == "/w/hub.env"
    entry = cmd.index("--entrypoint")
    assert cmd[entry:entry + 5] == ["--entrypoint", "python3", params.runtime.image, "-c", program]
    assert cmd[-4:] == ["--revision=abc123", "--", "-org/model", "/models/tiny-qwen3"]
    text = shown(cmd, program)
    assert program not in text and '"$(cat sparkbook/scripts/hub_download.py)"' in text
    venv = params.model_copy(update={"runtime": params.runtime.model_copy(
        update={"kind": "venv", "venv": "/opt/v"})})
    cmd = download_command(venv, "0:0", None, program)
    assert cmd[:3] == ["env", "HF_ENDPOINT=http://10.77.0.1:8081", "/opt/v/bin/python"]
    assert "--env-file" not in cmd and cmd[-3:] == ["--", "-org/model", "/models/tiny-qwen3"]


def test_03_reports_the_download_in_its_outcome_key_numbers_and_verdict(tmp_path):
    params = load(LAB)
    out = HubOutcome("org/m", None, params.model.path, params.head.name, commit="c" * 40, files=5,
                     total=3 << 30, fetched=1 << 30, fetched_files=2, seconds=41.6)
    hf = params.model_copy(update={"model": params.model.model_copy(update={"source": "hf"})})
    held = {params.head.name: "sha256:" + "1" * 64}
    image = ImageOutcome(params.runtime.image, "head", params.head.name, held[params.head.name], held, held)
    outcome = step.DistributionOutcome(None, image, ModelOutcome(params.model.path, True), out)
    assert ("model download", "org/m@ccccccc: 1 GiB of 3 GiB fetched in 42 s (2 of 5 files)") \
        in outcome.key_numbers()[1:]
    [check] = hub_checks(hf, out)
    assert check.status == PASS and "fetched 1 GiB (2 files)" in check.observed
    assert hub_checks(params, None)[0].status == SKIP
    outcome.save(tmp_path)
    assert json.loads((tmp_path / "distribution.json").read_text())["hub"]["commit"] == "c" * 40


# ---------------------------------------------------------------------------------- on the lab

def test_the_lab_head_downloads_the_model_in_the_serving_container(lab, params, cluster, monkeypatch):
    """fetch_model on the lab's head, in the real serving image, from the local hub on this
    machine's lab bridge, with a token: every file, owned by the SSH user; then nothing again."""
    from sparkbook.lab.image import model_dir
    from sparkbook.lab.nodes import MGMT_NET
    token = "hf_lab_canary_" + secrets.token_hex(8)
    path = f"/models/hub-test-{secrets.token_hex(4)}"
    p = params.model_copy(update={"model": params.model.model_copy(update={"source": "hf", "path": path})})
    head = p.head.name
    with HubServer(model_dir(), p.model.name, token=token, bind=f"{MGMT_NET}.1") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv(p.model.hf_token_env, token)
        try:
            out = fetch_model(p, cluster, say=lambda *_: None, show=False)
            assert out.error is None, out
            assert out.commit == hub.commit and out.fetched == hub.size == hub.sent_total
            got = manifests(p, cluster, [p.head])[head]
            assert {n: f["size"] for n, f in got.items()} == {n: e.size for n, e in hub.files.items()}
            owners = cluster.run_on(head, f"stat -c %u:%g {path}/config.json; id -u; id -g").stdout.split()
            assert owners[0] == f"{owners[1]}:{owners[2]}"
            assert token not in json.dumps(out.to_json()) and [c.status for c in hub_checks(p, out)] == [PASS]
            hub.reset()
            again = fetch_model(p, cluster, say=lambda *_: None, show=False)
            assert again.error is None and again.fetched == 0 and hub.sent_total == 0
        finally:
            cluster.run_on(head, ["rm", "-rf", "--", path])
