"""The run fingerprint (issue 19): taken from canned node output through the node bundle it sends,
two runs compared (a changed serving flag, image or one node's driver makes them not comparable,
and differences() names exactly that; what is informational keeps them comparable), a node that
does not answer, load/ensure in a run folder, the report's table, and fingerprint.sh itself with a
fake docker.

Node output in the shape real tools print: `nvidia-smi -q` of a GB10 (tests/fixtures/
nvidia-smi-q-gb10-1.txt, github.com/ollama/ollama/issues/13552, driver 580.95.05); `ethtool -i` of a
Spark's ConnectX-7 (firmware 28.45.4028 with the board's PSID, as tests/test_host_health.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

from sparkbook.record import fingerprint, report
from sparkbook.record.fingerprint import Fingerprint, differences, ensure, load
from sparkbook.params import validate
from sparkbook.nodes.remote import Result, Results
from sparkbook.book.verdict import PASS, Check, Verdict
from test_report import run_folder
from test_serving import fake_tools

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
SCRIPT = ROOT / "sparkbook" / "scripts" / "fingerprint.sh"
GB10_Q = "".join((Path(__file__).parent / "fixtures" / "nvidia-smi-q-gb10-1.txt").read_text()
                 .splitlines(keepends=True)[2:])
IMAGE_ID = "sha256:" + "ab" * 32
VERSIONS = {"python": "3.12.3", "packages": {"vllm": "0.17.1", "torch": "2.9.0+cu130", "ray": "2.54.0",
                                             "transformers": "4.57.1", "nvidia-nccl-cu13": "2.27.7"},
            "torch_cuda": "13.0", "nccl": "2.27.7"}
MANIFEST = "4\t-\tconfig.json\n1000\t-\tmodel.safetensors\n#config.json\t" + "0" * 64


def lab_params(**changes):
    """parameters/lab.yaml with some sections changed: {"serving": {...}, "nodes": [...]}."""
    data = yaml.safe_load(LAB.read_text())
    for section, values in changes.items():
        if isinstance(values, dict):
            data[section].update(values)
        else:
            data[section] = values
    return validate(data)


def identity(image_id=IMAGE_ID, layers=("sha256:" + "11" * 32,)):
    """`docker image inspect` in sparkbook's INSPECT_FORMAT (identity.py)."""
    return json.dumps({"Id": image_id, "Size": 1, "RepoDigests": ["sparkbook/vllm@sha256:" + "cd" * 32],
                       "RootFS": {"Layers": list(layers)},
                       "Config": {"Entrypoint": None, "Cmd": ["bash"], "User": "", "WorkingDir": "/",
                                  "Env": ["PATH=/usr/bin", "NCCL_VERSION=2.27.7-1", "CUDA_VERSION=13.0.1"]}})


def node_output(node, driver="580.95.05", ident=None, versions=VERSIONS, firmware=None, manifest=MANIFEST):
    """What one node's bundle prints: host_state.sh, fingerprint.sh, and on the head the manifest;
    ``firmware``: {interface: version} where not 28.45.4028."""
    parts = ["@@ host", "@@ smi-q", GB10_Q.replace("580.95.05", driver), "@@ memlock", "unlimited unlimited",
             "@@ swap", "SwapTotal: 0 kB", "SwapFree: 0 kB"]
    for rail in node.rails:
        parts += [f"@@ ethtool-i {rail.interface}", "driver: mlx5_core",
                  f"firmware-version: {(firmware or {}).get(rail.interface, '28.45.4028')} (NVD0000000087)"]
    parts += ["@@ fingerprint", "@@ kernel", "6.11.0-1016-nvidia"]
    if node.role == "head":
        parts += ["@@ image identity", ident or identity(), "@@ runtime versions", "VERSIONS " + json.dumps(versions),
                  "@@ model", manifest]
    return "\n".join(parts) + "\n"


class FakeCluster:
    """Answers the fingerprint's bundle with canned output per node; ``down``: nodes that do not."""

    def __init__(self, params, down=(), **per_node):
        self.params, self.down, self.per_node, self.asked = params, set(down), per_node, []

    def run(self, cmd, nodes=None, *, timeout=None, env=None):
        out = Results()
        for n in self.params.nodes:
            sent = cmd(n)
            self.asked.append((n.name, sent))
            if n.name in self.down:
                out[n.name] = Result(n.name, str(sent), None, error=f"ssh {n.host}: timed out")
            else:
                out[n.name] = Result(n.name, str(sent), 0, node_output(n, **self.per_node.get(n.name, {})))
        return out


def take(params=None, tmp_path=None, down=(), **per_node):
    params = params or lab_params()
    return fingerprint.build(params, FakeCluster(params, down, **per_node), tmp_path or Path("/nonexistent"))


# ------------------------------------------------------------------------------ what it holds

def test_a_fingerprint_holds_what_ran(tmp_path):
    (tmp_path / "distribution.json").write_text(json.dumps({"hub": {"commit": "c0ffee" * 6 + "abcd"}}))
    fp = take(tmp_path=tmp_path)
    assert fp.unread == {}
    assert fp.image["id"] == IMAGE_ID and fp.image["name"] == "sparkbook-lab/vllm-cpu:latest"
    assert fp.image["digests"] == ["sparkbook/vllm@sha256:" + "cd" * 32] and len(fp.image["content"]) == 64
    assert {k: fp.versions[k] for k in ("vllm", "torch", "nccl", "ray", "transformers")} == {
        "vllm": "0.17.1", "torch": "2.9.0+cu130", "nccl": "2.27.7", "ray": "2.54.0", "transformers": "4.57.1"}
    assert fp.model["name"] == "sparkbook-lab/tiny-qwen3" and fp.model["commit"].startswith("c0ffee")
    assert fp.model["files"] == 2 and fp.model["bytes"] == 1004 and len(fp.model["manifest"]) == 16
    assert [(n["name"], n["driver"], n["kernel"]) for n in fp.nodes] == [
        ("spark-1", "580.95.05", "6.11.0-1016-nvidia"), ("spark-2", "580.95.05", "6.11.0-1016-nvidia")]
    assert fp.nodes[1]["firmware"] == {"enp1s0f1np1": "28.45.4028", "enP2p1s0f1np1": "28.45.4028"}
    # vllm serve's options, without this machine's address and port or the model's folder
    flags = fp.serving["flags"]
    assert flags[:2] == ["--tensor-parallel-size", "2"] and "--enforce-eager" in flags
    assert "--host" not in flags and "--port" not in flags and "/models/tiny-qwen3" not in flags
    assert "--host 10.77.0.11" in fp.serving["command"]
    assert fp.layout["tensor parallel"] == 2 and fp.layout["executor"] == "ray" and fp.layout["nodes"] == 2
    assert fp.benchmark["output_tokens"] == 64 and "references" not in fp.benchmark
    assert fp.sparkbook["version"] and len(fp.params_hash) == 16


def test_nccl_falls_back_to_the_image_when_torch_does_not_say_and_05s_inspection_is_reused(tmp_path):
    cpu = {**VERSIONS, "nccl": None, "nccl_error": "RuntimeError: no NCCL", "packages": {"vllm": "0.32.0+cpu"}}
    (tmp_path / "image_inspection.json").write_text(json.dumps(
        {"vllm": "0.32.0+cpu", "ray": "2.60.0", "torch": "2.13.0+cpu", "transformers": "4.99.0",
         "identity": {"id": IMAGE_ID}}))
    fp = take(tmp_path=tmp_path, **{"spark-1": {"versions": cpu}})
    assert fp.versions["nccl"] == "2.27.7-1"  # the image's NCCL_VERSION
    bare = fingerprint.runtime({"runtime versions": "VERSIONS " + json.dumps(cpu)}, None, {}, tmp_path / "none")
    assert bare["nccl"] is None and bare["vllm"] == "0.32.0+cpu"  # no NCCL at all: none, not torch's error
    assert (fp.versions["vllm"], fp.versions["ray"], fp.versions["torch"]) == ("0.32.0+cpu", "2.60.0", "2.13.0+cpu")
    # an inspection of another image is not used
    other = take(tmp_path=tmp_path, **{"spark-1": {"versions": cpu, "ident": identity("sha256:" + "ef" * 32,
                                                                                      ("sha256:" + "22" * 32,))}})
    assert other.versions["ray"] is None and other.versions["vllm"] == "0.32.0+cpu"


def test_each_node_gets_one_bundle_the_head_with_image_runtime_and_model():
    params = lab_params()
    head, worker = (dict(fingerprint.node_bundle(params, n).parts) for n in params.nodes)
    assert head["host"].name == "host_state.sh" and head["host"].args == ("enp1s0f1np1", "enP2p1s0f1np1")
    assert head["fingerprint"].args[0] == "sparkbook-lab/vllm-cpu:latest"
    assert head["fingerprint"].args[2] == "sparkbook-lab-ray"  # the serving container (Ray executor)
    assert head["model"].name == "model_manifest.py" and head["model"].args[:2] == ("/models/tiny-qwen3", "config")
    assert set(worker) == {"host", "fingerprint"} and worker["fingerprint"].args == ()


# ------------------------------------------------------------------------------ comparing two runs

def test_the_same_deployment_compares():
    a, b = take(), take()
    assert differences(a, b) == [] and a.key() == b.key()


def test_a_changed_serving_flag_is_named_and_makes_runs_not_comparable():
    a = take()
    b = take(lab_params(serving={"extra_args": []}))  # without --enforce-eager and the structured outputs
    diffs = differences(a, b)
    assert len(diffs) == 1 and diffs[0].startswith("vllm serve: --tensor-parallel-size 2") and "--enforce-eager" in diffs[0]
    assert a.key() != b.key()


def test_a_changed_image_is_named_by_its_ids():
    a = take()
    b = take(**{"spark-1": {"ident": identity("sha256:" + "ef" * 32, ("sha256:" + "22" * 32,))}})
    assert differences(a, b) == ["image: sha256:abababababab.. -> sha256:efefefefefef.."]
    assert a.key() != b.key()


def test_the_same_image_under_another_id_compares():
    """Another image store names the same image differently (identity.py): its content decides."""
    a, b = take(), take(**{"spark-1": {"ident": identity("sha256:" + "ef" * 32)}})
    assert a.image["id"] != b.image["id"] and differences(a, b) == [] and a.key() == b.key()


def test_a_changed_driver_on_one_node_is_named_with_the_node():
    a, b = take(), take(**{"spark-2": {"driver": "580.142"}})
    assert differences(a, b) == ["node 2 driver (spark-2): 580.95.05 -> 580.142"]
    assert a.key() != b.key()


def test_the_hub_commit_is_shown_not_compared_the_models_files_decide(tmp_path):
    """A rerun of 04-08 has no 03 in its run folder, so no hub commit: it compares with the full
    run all the same; the digest of the model's files decides what the model holds."""
    (tmp_path / "distribution.json").write_text(json.dumps({"hub": {"commit": "c0ffee" * 6 + "abcd"}}))
    full, rerun = take(tmp_path=tmp_path), take()
    assert full.model["commit"] and rerun.model["commit"] is None
    assert differences(full, rerun) == [] and full.key() == rerun.key()
    assert "(commit c0ffeec0ffee)" in dict(full.rows())["model"]
    other = take(**{"spark-1": {"manifest": MANIFEST.replace("1000\t", "2000\t")}})
    assert [d.split(":")[0] for d in differences(rerun, other)] == ["model manifest"] and rerun.key() != other.key()


def test_firmware_decides_by_its_versions_not_by_the_port_that_reports_them():
    """The same CX-7 firmware read on the other ports (cabled otherwise) compares; which rail has
    which version is shown; another version on one rail does not compare."""
    data = yaml.safe_load(LAB.read_text())
    for n in data["nodes"]:
        for r in n["rails"]:
            r["interface"] = r["interface"].replace("f1np1", "f0np0")
    a, b = take(), take(validate(data))
    assert a.nodes[1]["firmware"] != b.nodes[1]["firmware"]
    assert differences(a, b) == [] and a.key() == b.key()
    assert "firmware enP2p1s0f0np0 28.45.4028, enp1s0f0np0 28.45.4028" in dict(b.rows())["spark-2 (worker)"]
    c = take(**{"spark-2": {"firmware": {"enp1s0f1np1": "28.46.1000"}}})
    assert differences(a, c) == ["node 2 firmware (spark-2): 28.45.4028 -> 28.45.4028, 28.46.1000"]
    assert a.key() != c.key()


def test_informational_differences_keep_runs_comparable():
    """Another pair of the same kind: other names, addresses, key file; another sparkbook commit."""
    data = yaml.safe_load(LAB.read_text())
    for i, n in enumerate(data["nodes"], 1):
        n.update(name=f"gx10-{i}", host=f"192.168.7.{i}", key="/home/someone/.ssh/id_pair")
    a, b = take(), take(validate(data))
    b.sparkbook, b.created = {"version": "9.9", "commit": "f" * 40, "dirty": True}, "2030-01-01T00:00:00+00:00"
    assert a.params_hash != b.params_hash and a.serving["command"] != b.serving["command"]
    assert differences(a, b) == [] and a.key() == b.key()


def test_the_nodes_key_file_does_not_change_the_parameters_hash():
    data = yaml.safe_load(LAB.read_text())
    data["nodes"][0]["key"] = "/elsewhere/id_ed25519"
    assert fingerprint.params_hash(validate(data)) == fingerprint.params_hash(lab_params())


def test_benchmark_parameters_decide_benchmark_numbers_only():
    a, b = take(), take(lab_params(benchmark={"output_tokens": 128}))
    assert differences(a, b) == ["benchmark.output_tokens: 64 -> 128"] and a.key() != b.key()
    assert differences(a, b, benchmark=False) == [] and a.key(benchmark=False) == b.key(benchmark=False)


def test_the_key_does_not_depend_on_the_order_of_fields():
    a = take()
    data = a.to_json()
    shuffled = {k: (dict(reversed(list(v.items()))) if isinstance(v, dict) else v) for k, v in reversed(data.items())}
    shuffled["nodes"] = [dict(reversed(list(n.items()))) for n in data["nodes"]]
    b = Fingerprint.from_json(json.loads(json.dumps(shuffled)))
    assert list(b.versions) != list(a.versions) and b.key() == a.key() and differences(a, b) == []


def test_an_unreachable_node_is_named_and_its_run_compares_with_none():
    a = take(down={"spark-2"})
    assert a.unread == {"spark-2": "ssh 10.77.0.12: timed out"}
    assert a.nodes[1] == {"name": "spark-2", "host": "10.77.0.12", "role": "worker", "driver": None,
                          "kernel": None, "firmware": None}
    assert a.nodes[0]["driver"] == "580.95.05"  # the others are still read
    assert differences(a, take()) == ["first run: not read: spark-2: ssh 10.77.0.12: timed out",
                                      "node 2 driver (spark-2): — -> 580.95.05",
                                      "node 2 kernel (spark-2): — -> 6.11.0-1016-nvidia",
                                      "node 2 firmware (spark-2): — -> 28.45.4028"]
    rows = dict(a.rows())
    assert rows["spark-2 (worker)"] == "not read: ssh 10.77.0.12: timed out"
    assert rows["fingerprint"] == f"{a.key()}: not comparable, not read: spark-2: ssh 10.77.0.12: timed out"
    same = Fingerprint.from_json({**a.to_json(), "created": "2030-01-01T00:00:00+00:00"})
    assert differences(a, same) and a.key() != same.key()  # unread: not even comparable with its like


def test_an_absent_image_or_unread_versions_are_named():
    fp = take(**{"spark-1": {"ident": "absent", "versions": {}}})
    assert fp.image["id"] is None and "image" in fp.unread and "is not on spark-1" in fp.unread["image"]
    fp = take(**{"spark-1": {"versions": {"packages": {}}}})
    assert fp.unread == {"versions": 'VERSIONS {"packages": {}}'}


# ------------------------------------------------------------------------------ the run folder

def test_ensure_writes_it_once_and_load_reads_it_back(tmp_path, capsys):
    params = lab_params()
    cluster = FakeCluster(params)
    ctx = SimpleNamespace(params=params, cluster=cluster, run_dir=tmp_path)
    assert load(tmp_path) is None
    fp = ensure(ctx)
    assert (tmp_path / "fingerprint.json").is_file() and load(tmp_path) == fp
    assert f"run fingerprint {fp.key()}" in capsys.readouterr().out
    asked = len(cluster.asked)
    assert ensure(ctx) == fp and len(cluster.asked) == asked  # kept: the nodes are not asked again
    # 05 started serving again since (a folder reused by notebooks run by hand): taken again
    serving = tmp_path / "serving.json"
    serving.write_text("{}")
    os.utime(serving, (os.path.getmtime(tmp_path / "fingerprint.json") + 5,) * 2)
    ensure(ctx)
    assert len(cluster.asked) == 2 * asked
    # other parameters: taken again
    ctx.params = lab_params(serving={"extra_args": []})
    ctx.cluster = FakeCluster(ctx.params)
    assert ensure(ctx).serving["flags"] != fp.serving["flags"] and ctx.cluster.asked


def test_an_unreadable_node_is_written_and_asked_again_next_time(tmp_path):
    params = lab_params()
    ctx = SimpleNamespace(params=params, cluster=FakeCluster(params, down={"spark-2"}), run_dir=tmp_path)
    assert "spark-2" in ensure(ctx).unread and "spark-2" in load(tmp_path).unread
    ctx.cluster = FakeCluster(params)
    assert ensure(ctx).unread == {} and load(tmp_path).unread == {}


def test_secrets_of_the_serving_environment_stay_out(tmp_path):
    secret = "pw-Fingerprint-9c1d5b8e"
    params = lab_params(serving={"env": {"VLLM_CPU_KVCACHE_SPACE": "1", "MY_SECRET": secret}})
    ensure(SimpleNamespace(params=params, cluster=FakeCluster(params), run_dir=tmp_path))
    text = (tmp_path / "fingerprint.json").read_text()
    assert secret not in text and json.loads(text)["serving"]["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_the_report_shows_the_fingerprint_below_the_index(tmp_path):
    out = run_folder(tmp_path, Verdict("t", [Check("x", "a", PASS)]))
    page = report.build(out).read_text()
    assert "sparkbook-fingerprint" not in page  # a run folder without one
    fp = take()
    fingerprint.save(fp, out)
    page = report.build(out).read_text()
    table = page.split("sparkbook-fingerprint")[1].split("</table>")[0]
    # below the index, above the notebooks
    assert page.index("sparkbook-summary") < page.index("sparkbook-fingerprint") < page.index("01 · Preflight")
    assert fp.key() in table and "sparkbook-lab/vllm-cpu:latest sha256:abababababab.." in table
    assert "vLLM 0.17.1" in table and "NCCL 2.27.7" in table
    assert "spark-2 (worker)" in table and "driver 580.95.05" in table and "TP 2 × PP 1" in table


# ------------------------------------------------------------------------------ fingerprint.sh

DOCKER = r"""case "$1 $2" in
  "image inspect") [ "$6" = img:1 ] && echo '{"Id":"sha256:0123"}' || exit 1;;
  "inspect --format") [ "$FAKE_RUNNING" = yes ] && echo true || { echo "no such container" >&2; exit 1; };;
  "exec -e") shift 4; "$@";;
  "run --rm") shift 13; python3 "$@";;
  *) echo "docker: $*" >&2; exit 1;;
esac
"""


def run_script(*args):
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_script_reads_the_kernel_and_on_the_head_the_image_and_the_runtime(tmp_path, monkeypatch):
    calls = fake_tools(tmp_path, monkeypatch, docker=DOCKER)
    versions = "print('VERSIONS {}')"
    assert run_script().splitlines() == ["@@ kernel", os.uname().release]
    args = ("img:1", "{{json .Id}}", "sb-ray", "sparkbook=t", "sparkbook.owner=me", versions)
    monkeypatch.setenv("FAKE_RUNNING", "yes")
    assert run_script(*args).splitlines()[2:] == ["@@ image identity", '{"Id":"sha256:0123"}',
                                                  "@@ runtime versions", "VERSIONS {}"]
    assert f"docker exec -e CUDA_VISIBLE_DEVICES= sb-ray python3 -c {versions} --light" in calls.read_text()
    # the serving container does not run: the image, without network, never pulled
    monkeypatch.setenv("FAKE_RUNNING", "no")
    assert run_script(*args).splitlines()[-1] == "VERSIONS {}"
    assert ("docker run --rm --pull never --network none --label sparkbook=t --label sparkbook.owner=me "
            f"--entrypoint python3 img:1 -c {versions} --light") in calls.read_text()
    # the image absent: said, nothing run in it
    assert run_script("img:2", *args[1:]).splitlines()[2:] == ["@@ image identity", "absent"]


# ------------------------------------------------------------------------------ image_versions.py

def image_versions(tmp_path, *args, package=None, nccl_version=None):
    """image_versions.py run by this python beside a fake torch that notes its import; ``package``:
    an installed nvidia-nccl-cu13 of that version, ``nccl_version``: NCCL_VERSION in the
    environment. Returns what it printed and whether torch was imported."""
    site = tmp_path / "site"
    site.mkdir(parents=True)
    (site / "torch.py").write_text(f"open({str(tmp_path / 'torch-imported')!r}, 'w').close()\n"
                                   "class version:\n    cuda = '13.0'\n"
                                   "class cuda:\n    class nccl:\n        version = staticmethod(lambda: (2, 28, 3))\n")
    if package:
        (site / f"nvidia_nccl_cu13-{package}.dist-info").mkdir()
        (site / f"nvidia_nccl_cu13-{package}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: {package}\n")
    env = {k: v for k, v in os.environ.items() if k != "NCCL_VERSION"}
    env.update(PYTHONPATH=str(site), **({"NCCL_VERSION": nccl_version} if nccl_version else {}))
    r = subprocess.run([sys.executable, str(fingerprint.VERSIONS_PY), *args], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("VERSIONS "), r.stderr
    return json.loads(r.stdout.removeprefix("VERSIONS ")), (tmp_path / "torch-imported").exists()


def test_the_fingerprint_reads_nccl_without_importing_torch_where_it_can(tmp_path):
    """--light (fingerprint.sh, maybe in the running serving container of a Spark whose memory vLLM
    holds): NCCL as the nvidia-nccl package names it, else NCCL_VERSION; torch only where neither does.
    Without it (sparkbook collect) torch is asked as before."""
    out, torch = image_versions(tmp_path / "package", "--light", package="2.27.7", nccl_version="2.26.2-1")
    assert (out["nccl"], out["nccl_from"], torch) == ("2.27.7", "nvidia-nccl-cu13", False)
    out, torch = image_versions(tmp_path / "env", "--light", nccl_version="2.26.2-1")
    assert (out["nccl"], out["nccl_from"], torch) == ("2.26.2-1", "NCCL_VERSION", False)
    out, torch = image_versions(tmp_path / "neither", "--light")
    assert (out["nccl"], out["torch_cuda"], torch) == ("2.28.3", "13.0", True) and "nccl_from" not in out
    out, torch = image_versions(tmp_path / "collect", package="2.27.7")
    assert (out["nccl"], torch) == ("2.28.3", True) and out["packages"]["nvidia-nccl-cu13"] == "2.27.7"
    # what the fingerprint makes of it
    light = {**VERSIONS, "nccl": "2.27.7", "nccl_from": "nvidia-nccl-cu13"}
    del light["torch_cuda"]
    assert take(**{"spark-1": {"versions": light}}).versions["nccl"] == "2.27.7"
