"""An image is the same on two nodes when its ID is, or, where the IDs differ because of Docker's
storage back-end, when its layers' diff IDs and runtime config are: one function decides it for
01 (preflight), 03 (the copy and its after-check), 04 and 05 (the image on every serving node,
the head's inspection kept per image).

Why IDs differ: the classic image store names an image by its config digest, the containerd image
store (the default on fresh installs of Docker 29) by its manifest or index digest.
- https://docs.docker.com/engine/storage/containerd/ (default for Docker Engine 29.0 fresh installs)
- https://github.com/moby/moby/issues/48401 (vvoland: the containerd image store "identifies the
  images with their manifest or index digest instead of the image config like the old graphdriver
  image store")
- https://github.com/docker/cli/issues/6670 (an image saved on v28 and loaded into a fresh v29 gets
  another ID), https://github.com/docker/cli/issues/5526, https://github.com/moby/moby/issues/47674
- https://github.com/moby/moby/pull/48894 (the containerd store's inspect: Id = the index digest)
The fixtures are the same image (hello-world) inspected on each store, as published (headers).
"""

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkbook.distribution import image
from sparkbook.facts.identity import INSPECT_FORMAT, SAME_CONTENT, ImageIdentity, parse, same_image
from sparkbook.distribution.image import ImageOutcome, NodeImage, Survey, Transfer, distribute_image, image_checks
from sparkbook.book.errors import CheckFailed
from sparkbook.lab.lab import docker
from sparkbook.params import load
from sparkbook.preflight import artifacts
from sparkbook.preflight.collect import Preflight
from sparkbook.serving import inspection, state
from sparkbook.nodes.shell import script

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return "".join(line for line in (FIXTURES / name).read_text().splitlines(keepends=True)
                   if not line.startswith("# "))


CLASSIC = fixture("docker-image-inspect-classic-1.txt")
CONTAINERD = fixture("docker-image-inspect-containerd-1.txt")


def line(inspect: str, **config) -> str:
    """What the node scripts print for an image (INSPECT_FORMAT): the fields of a full `docker
    image inspect`, one JSON object; ``config`` changes runtime fields, ``layers`` the diff IDs."""
    full = json.loads(inspect)[0]
    layers = config.pop("layers", full["RootFS"]["Layers"])
    cfg = {k: full["Config"][k] for k in ("Entrypoint", "Cmd", "Env", "User", "WorkingDir")}
    return json.dumps({"Id": config.pop("Id", full["Id"]), "Size": full["Size"], "RepoDigests": full["RepoDigests"],
                       "RootFS": {"Layers": layers}, "Config": {**cfg, **config}})


def ident(text: str) -> ImageIdentity:
    return ImageIdentity.of(parse(text))


# ------------------------------------------------------------------------------ the one function

def test_both_stores_outputs_parse_to_one_identity_but_their_ids_differ():
    classic, containerd = ident(CLASSIC), ident(CONTAINERD)
    assert classic.id == "sha256:d2c94e258dcb3c5ac2798d32e1249e42ef01cba4841c2234249495f87264ac5a"  # config digest
    assert containerd.id == "sha256:91fb4b041da273d5a3273b6d587d62d518300a6ad268b28628f74997b93171b2"  # index
    assert containerd.digests == ("hello-world@" + containerd.id,)
    assert classic.layers == containerd.layers == (
        "sha256:ac28800ec8bb38d5c35b49d45a6ac4777544941199075dff8c4eb63e093aa81e",)
    assert classic.config == containerd.config and classic.config["Cmd"] == ["/hello"]
    assert classic.config["Entrypoint"] == [] and classic.config["WorkingDir"] == "/"  # null read as none
    # the node scripts' compact line gives the same identity as the full output
    assert ident(line(CLASSIC)) == classic and ident(line(CONTAINERD)) == containerd
    # the environment is kept as digests of its values: identities are written into run folders
    assert "/usr/local/sbin" not in json.dumps(classic.config) and list(classic.config["Env"]) == ["PATH"]
    assert parse("absent") is None and parse("") is None and parse("Error: No such image") is None
    assert not ident('{"Id": "sha256:1", "RootFS": {"Layers": ["sha256:a"]}, "Config": null}').content_known


def test_the_same_id_is_the_same_image():
    assert same_image(ident(CLASSIC), ident(CLASSIC)) == (True, "same ID")
    assert same_image(ImageIdentity("sha256:1"), ImageIdentity("sha256:1")) == (True, "same ID")


def test_other_ids_with_the_same_layers_and_runtime_config_are_the_same_image():
    """hello-world on the classic store and on the containerd store (published outputs)."""
    assert same_image(ident(CONTAINERD), ident(CLASSIC)) == (True, SAME_CONTENT)
    assert SAME_CONTENT == "same layers and runtime config under another ID (e.g. another storage back-end)"


def test_a_different_layer_is_a_different_image():
    other = ident(line(CONTAINERD, layers=[*ident(CLASSIC).layers, "sha256:" + "9" * 64]))
    same, why = same_image(other, ident(CLASSIC))
    assert not same and why == "different layers (2 vs 1, from layer 2)"
    same, why = same_image(ident(line(CONTAINERD, layers=["sha256:" + "9" * 64])), ident(CLASSIC))
    assert not same and why == "different layers (1 vs 1, from layer 1)"


@pytest.mark.parametrize("change, named", [
    ({"Entrypoint": ["/bin/sh", "-c"]}, "entrypoint"),
    ({"Cmd": ["/hello", "--loud"]}, "command"),
    ({"User": "1000"}, "user"),
    ({"WorkingDir": "/srv"}, "working directory"),
    ({"Env": ["PATH=/usr/bin", "HF_TOKEN=hf_canarySECRETvalue42"]}, "environment (HF_TOKEN, PATH)"),
])
def test_the_same_layers_with_another_runtime_config_are_a_different_image(change, named):
    same, why = same_image(ident(line(CONTAINERD, **change)), ident(CLASSIC))
    assert not same and why == f"same layers, different {named}"
    assert "hf_canary" not in why  # the environment is named, never shown


def test_other_ids_whose_content_was_not_read_differ_unless_a_registry_digest_is_shared():
    found = ident(CONTAINERD)
    assert same_image(ImageIdentity("sha256:1"), found) == (False, "a different ID (its layers and config not read)")
    pulled = ImageIdentity("sha256:2", digests=found.digests)
    assert same_image(pulled, found) == (True, "same registry digest under another ID (its layers and config not read)")
    assert same_image(None, found) == (False, "absent")


@pytest.mark.parametrize("name, args", [("image_survey.sh", ["img"]), ("runtime_state.sh", ["img"]),
                                        ("serving_state.sh", ["sparkbook=lab", "fp", "img"])])
def test_every_node_script_reads_the_image_with_the_format_it_is_given(tmp_path, name, args):
    """One `docker image inspect` of the image, with the format passed as the last argument (a
    stand-in docker records what it gets; sparkbook passes identity.INSPECT_FORMAT: next test)."""
    import subprocess
    (tmp_path / "docker").write_text('#!/bin/sh\n[ "$1 $2" = "image inspect" ] && printf "%s %s\\n" "$6" "$4" '
                                     '>> "$(dirname "$0")/formats"\nexit 0\n')
    (tmp_path / "docker").chmod(0o755)
    (tmp_path / "ss").write_text("#!/bin/sh\n")
    (tmp_path / "ss").chmod(0o755)
    for fmt in (INSPECT_FORMAT, '{"Id":{{json .Id}}}'):
        (tmp_path / "formats").unlink(missing_ok=True)
        r = subprocess.run(["bash", "-c", script(name, *args, fmt).program()], capture_output=True, text=True,
                           env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr
        assert [line for line in (tmp_path / "formats").read_text().splitlines() if line.startswith("img ")] == [
            f"img {fmt}"]


def test_sparkbook_passes_the_one_format_to_every_node_script():
    """01's runtime_state.sh, 03's image_survey.sh and 04/05's serving_state.sh get
    identity.INSPECT_FORMAT as an argument: one definition, no copy in the scripts."""
    from sparkbook.preflight.collect import node_bundle
    params = load(LAB)
    assert image.survey_script("img").args == ("img", INSPECT_FORMAT)
    assert dict(node_bundle(params, params.head).parts)["runtime"].args == (params.runtime.image, INSPECT_FORMAT)
    sent = []
    state.node_states(params, SimpleNamespace(run=lambda s, *a, **k: sent.append(s) or {}))
    assert [s.name for s in sent] == ["serving_state.sh"] and sent[0].args[-2:] == (params.runtime.image, INSPECT_FORMAT)
    for name in ("image_survey.sh", "runtime_state.sh", "serving_state.sh"):
        assert '{"Id"' not in (Path(image.__file__).parents[1] / "scripts" / name).read_text()


def test_03s_survey_reads_the_image_id_and_size_from_the_one_inspect():
    found = image.parse_survey("w", "@@ image\n" + line(CONTAINERD) + "\n@@ zstd\nabsent")
    assert (found.id, found.size) == (ident(CONTAINERD).id, 15288)
    assert (found.layers, found.config) == (list(ident(CONTAINERD).layers), ident(CONTAINERD).config)
    assert image.parse_survey("w", "@@ image\n@@ zstd\nabsent").id is None


# ------------------------------------------------------------------------- 01: preflight's image

def preflight_of(params, **lines):
    return Preflight({n: {"image": parse(text)} for n, text in lines.items()}, {},
                     {n.name: n.role for n in params.nodes})


def test_01_passes_a_worker_holding_the_heads_image_under_another_stores_id_and_fails_another():
    params = load(LAB)
    head, worker = params.head.name, params.workers[0].name
    checks = {c.node: c for c in artifacts.image(params, preflight_of(params, **{
        head: line(CLASSIC), worker: line(CONTAINERD)}))}
    assert checks[worker].status == "PASS" and checks[worker].observed == f"91fb4b041da2: {SAME_CONTENT}"
    checks = {c.node: c for c in artifacts.image(params, preflight_of(params, **{
        head: line(CLASSIC), worker: line(CONTAINERD, Entrypoint=["/bin/sh"])}))}
    assert checks[worker].status == "FAIL" and checks[worker].observed.endswith("same layers, different entrypoint")
    assert "03_distribute_image.ipynb (`sparkbook run -p FILE --steps 03`): it replaces it" in checks[worker].remedy
    same = {c.node: c for c in artifacts.image(params, preflight_of(params, **{head: line(CLASSIC),
                                                                                worker: line(CLASSIC)}))}
    assert same[worker].status == "PASS" and same[worker].observed == "d2c94e258dcb"


# ------------------------------------------------------------------------------- 03: the copy

class Nodes:
    """A stand-in cluster for 03: ``docker image inspect`` answers with each node's line."""

    def __init__(self, lines: dict[str, str]):
        self.lines = lines

    def run(self, cmd, *a, **k):
        assert cmd[:4] == ["docker", "image", "inspect", "--format"] and cmd[4] == INSPECT_FORMAT
        return {n: SimpleNamespace(ok=True, stdout=text + "\n") for n, text in self.lines.items()}


def survey_of(params, containerd=(), **lines) -> Survey:
    """Each node's survey from its inspect line; the nodes named in ``containerd`` on that store."""
    nodes = {}
    for name, text in lines.items():
        found = ident(text)
        nodes[name] = NodeImage(name, found.id, 1234, "29.1.0", "overlayfs", layers=list(found.layers),
                                config=found.config, containerd_store=name in containerd)
    return Survey(params.runtime.image, params.head.name, nodes)


def copy(params, monkeypatch, before: dict[str, str], after: dict[str, str] | None = None, containerd=()):
    """distribute_image on a survey of ``before``; the stream stubbed: what it was asked to send."""
    sent = []

    def stream(params, cluster, todo, nodes, compress, show, plan):
        sent.extend(w.name for w in todo)
        return [Transfer(w.name, "full stream", wire=5, seconds=1.0) for w in todo], 5

    monkeypatch.setattr(image, "place_streamers", lambda params, cluster, todo, say: {params.head.name: []})
    monkeypatch.setattr(image, "choose_compression", lambda *a: (False, {"decision": "off (parameter)"}))
    monkeypatch.setattr(image, "stream_from_head", stream)
    said = []
    out = distribute_image(params, Nodes(after or before), survey_of(params, containerd, **before),
                           say=said.append, show=False)
    return out, sent, said


def test_03_sends_nothing_to_a_worker_holding_the_same_content_under_another_id(monkeypatch):
    params = load(LAB)
    head, worker = params.head.name, params.workers[0].name
    out, sent, said = copy(params, monkeypatch, {head: line(CLASSIC), worker: line(CONTAINERD)})
    assert sent == [] and out.transfers == [] and out.complete
    assert f"{worker}: holds 91fb4b041da2, {SAME_CONTENT}: nothing to send" in said
    checks = {c.node: c for c in image_checks(params, out)}
    assert checks[worker].status == "PASS" and checks[worker].observed == f"91fb4b041da2 ({SAME_CONTENT})"
    assert image.survey_table(survey_of(params, **{head: line(CLASSIC), worker: line(CONTAINERD)})).rows[1][2] \
        == f"yes ({SAME_CONTENT})"
    assert image.transfers_summary(out) == "already on every node"
    # the back-ends are named only where the survey knows they differ
    _, _, said = copy(params, monkeypatch, {head: line(CLASSIC), worker: line(CONTAINERD)}, containerd=[worker])
    assert (f"{worker}: holds 91fb4b041da2, {SAME_CONTENT}; image stores: containerd here, classic (overlayfs) "
            f"on {head}: nothing to send") in said


@pytest.mark.parametrize("change", [{"layers": ["sha256:" + "9" * 64]}, {"Entrypoint": ["/bin/sh"]}])
def test_03_still_copies_an_image_whose_layers_or_entrypoint_differ(monkeypatch, change):
    params = load(LAB)
    head, worker = params.head.name, params.workers[0].name
    before = {head: line(CLASSIC), worker: line(CONTAINERD, **change)}
    out, sent, _ = copy(params, monkeypatch, before, after={head: line(CLASSIC), worker: line(CONTAINERD)})
    assert sent == [worker]
    # after the copy the worker's Docker (containerd store) names the loaded image by another ID: PASS
    assert out.complete and not [c for c in image_checks(params, out) if c.status == "FAIL"]
    # a copy that left the worker's different image in place fails, saying what differs
    out, _, _ = copy(params, monkeypatch, before)
    bad = [c for c in image_checks(params, out) if c.status == "FAIL"]
    assert [c.node for c in bad] == [worker] and "after the copy: " in bad[0].observed
    assert bad[0].observed.endswith(("different layers (1 vs 1, from layer 1)", "different entrypoint"))
    assert not out.complete


def test_03s_outcome_records_each_identity_and_accepts_ids_alone():
    out = ImageOutcome("img", "head", "h", "sha256:1", before={"h": "sha256:1", "w": None},
                       after={"h": "sha256:1", "w": "sha256:1"})
    assert out.reference == ImageIdentity("sha256:1") and out.complete
    assert out.to_json()["before"]["h"] == {"id": "sha256:1", "layers": (), "config": None, "digests": ()}
    assert ImageIdentity.of(out.to_json()["before"]["h"]) == ImageIdentity("sha256:1")


# ----------------------------------------------------------------- 04 and 05: before anything starts

def node_state(text: str) -> state.NodeState:
    return state.parse_state("@@ containers\n@@ runs\n@@ image\n" + text + "\n@@ listeners\n")


def test_04_05_accept_the_heads_content_under_another_id_and_refuse_another_entrypoint():
    params = load(LAB)
    head, worker = params.head.name, params.workers[0].name
    state.require_image(params, {head: node_state(line(CLASSIC)), worker: node_state(line(CONTAINERD))})
    with pytest.raises(CheckFailed) as e:
        state.require_image(params, {head: node_state(line(CLASSIC)),
                                     worker: node_state(line(CONTAINERD, Entrypoint=["/bin/sh"]))})
    assert (f"- {worker}: holds 91fb4b041da2 under the tag, the head d2c94e258dcb: same layers, different "
            "entrypoint") in str(e.value)
    assert node_state("").image is None


def test_the_heads_inspection_is_kept_for_the_same_content_under_another_id(tmp_path):
    """05 inspects the image on the head once per image: an ID that changed with the storage
    back-end reuses it; another image is inspected again."""
    params = load(LAB)

    def head_holds(text):
        def again(*a, **k):
            raise LookupError("inspected again")
        return SimpleNamespace(run_on=lambda node, cmd, **k: SimpleNamespace(ok=True, stdout=text, summary=str),
                               run=again, put=again)

    kept = inspection.ImageInfo(params.runtime.image, ident(CLASSIC).id, vllm="0.17.0", options=["--port"])
    (tmp_path / inspection.CACHE).write_text(json.dumps(
        {**kept.__dict__, "model": params.model.path,
         "identity": asdict(ident(CLASSIC))}))
    info = inspection.inspect_image(params, head_holds(line(CONTAINERD)), tmp_path)
    assert info.vllm == "0.17.0" and info.image_id == ident(CONTAINERD).id
    with pytest.raises(LookupError, match="inspected again"):
        inspection.inspect_image(params, head_holds(line(CONTAINERD, Cmd=["serve"])), tmp_path)


def test_a_fresh_inspection_is_written_with_the_images_identity_and_read_back(tmp_path):
    """The first inspection runs in the image and is kept with the image's identity; the next
    one, for the same image, reads it back without running anything."""
    params = load(LAB)
    calls = []
    done = SimpleNamespace(ok=True, stdout="", summary=str, check=lambda *a, **k: None)

    def run_on(node, cmd, **k):
        calls.append(cmd)
        first = isinstance(cmd, list) and cmd[:3] == ["docker", "image", "inspect"]
        return SimpleNamespace(ok=True, summary=str, stdout=line(CLASSIC) if first else
                               'INSPECT {"vllm": "0.17.0", "options": ["--port"]}')

    cluster = SimpleNamespace(run_on=run_on, put=lambda *a, **k: done,
                              run=lambda *a, **k: SimpleNamespace(values=lambda: [], check=lambda *a, **k: None))
    info = inspection.inspect_image(params, cluster, tmp_path)
    assert info.vllm == "0.17.0" and len(calls) == 2
    kept = json.loads((tmp_path / inspection.CACHE).read_text())
    assert kept["identity"]["id"] == ident(CLASSIC).id and kept["model"] == params.model.path
    again = inspection.inspect_image(params, cluster, tmp_path)
    assert again.vllm == "0.17.0" and len(calls) == 3  # only the image's identity read again


class Head:
    """A head node for the inspection: its image's identity line, the inspection script's output
    and the model's config.json; what was run on it, by kind."""

    def __init__(self, inspect_line: str, config: str | None = '{"architectures": ["Qwen3ForCausalLM"]}',
                 printed: str = 'INSPECT {"vllm": "0.17.0", "options": ["--port"], "architectures": '
                                '["Qwen3ForCausalLM"], "model_architectures": ["Qwen3ForCausalLM"]}'):
        self.inspect_line, self.config, self.printed, self.ran = inspect_line, config, printed, []
        done = SimpleNamespace(ok=True, stdout="", summary=str, check=lambda *a, **k: None)
        self.put = lambda *a, **k: done
        self.run = lambda *a, **k: SimpleNamespace(values=lambda: [], check=lambda *a, **k: None)

    def run_on(self, node, cmd, **k):
        argv = cmd if isinstance(cmd, list) else [str(cmd)]
        if argv[:3] == ["docker", "image", "inspect"]:
            self.ran.append("identity")
            return SimpleNamespace(ok=True, summary=str, stdout=self.inspect_line, stderr="")
        if argv[0] == "head":
            self.ran.append("config")
            if self.config is None:
                return SimpleNamespace(ok=False, summary=lambda: "exit 1", stdout="", stderr=(
                    f"head: cannot open '{argv[-1]}' for reading: No such file or directory\n"))
            return SimpleNamespace(ok=True, summary=str, stdout=self.config, stderr="")
        self.ran.append("image")
        return SimpleNamespace(ok=True, summary=str, stdout=self.printed, stderr="")


def test_what_the_image_holds_is_read_once_per_image_id_and_the_model_every_time(tmp_path):
    """The image half of an inspection (versions, options, architectures) is kept in the user's
    cache by image ID: a run in another folder reads only the model's config.json, and sees a
    changed model; another image, another runtime or a partial read starts the image again."""
    params = load(LAB)
    first = Head(line(CLASSIC))
    info = inspection.inspect_image(params, first, tmp_path / "run-1")
    assert first.ran == ["identity", "image"] and info.vllm == "0.17.0" and not info.reused

    other_model = Head(line(CLASSIC), config='{"architectures": ["LlamaForCausalLM"]}')
    again = inspection.inspect_image(params, other_model, tmp_path / "run-2")
    assert other_model.ran == ["identity", "config"], other_model.ran
    assert again.vllm == "0.17.0" and again.options == ["--port"] and "kept by image ID" in again.reused
    assert again.model_architectures == ["LlamaForCausalLM"]  # read now, not from the cache
    arch = {c.check: c for c in inspection.image_checks(params, again)}["model architecture"]
    assert arch.status == "FAIL", arch  # the new model's architecture, judged against the kept list
    assert "kept by image ID" in dict(inspection.image_table(again).rows)["read"]

    no_model = Head(line(CLASSIC), config=None)
    gone = inspection.inspect_image(params, no_model, tmp_path / "run-3")
    assert gone.errors["model"].endswith("config.json: No such file or directory"), gone.errors
    assert {c.check: c for c in inspection.image_checks(params, gone)}["model architecture"].status == "FAIL"

    for head, p in [(Head(line(CONTAINERD)), params),  # the same content under another ID: inspected
                    (Head(line(CLASSIC)), params.model_copy(update={"runtime": params.runtime.model_copy(
                        update={"gpus": not params.runtime.gpus})}))]:
        inspection.inspect_image(p, head, tmp_path / "run-4")
        assert head.ran == ["identity", "image"], head.ran
        (tmp_path / "run-4" / inspection.CACHE).unlink()

    # a read that failed in part is not kept: the next run tries again
    part = Head(line(CLASSIC, Id="sha256:" + "2" * 64),
                printed='INSPECT {"vllm": "0.17.0", "options_error": "Timeout"}')
    inspection.inspect_image(params, part, tmp_path / "run-5")
    retry = Head(line(CLASSIC, Id="sha256:" + "2" * 64))
    inspection.inspect_image(params, retry, tmp_path / "run-6")
    assert retry.ran == ["identity", "image"]


def test_a_cache_that_cannot_be_made_only_costs_a_new_inspection(tmp_path, monkeypatch):
    """A home that cannot be written (the cache's folder would be under a file): 05 inspects the
    image every time, as before there was a cache, and fails nothing for it."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPARKBOOK_CACHE", str(tmp_path / "file" / "cache"))
    params = load(LAB)
    for run in ("run-1", "run-2"):
        head = Head(line(CLASSIC))
        info = inspection.inspect_image(params, head, tmp_path / run)
        assert head.ran == ["identity", "image"] and info.vllm == "0.17.0" and not info.reused


# ------------------------------------------------------------------------------------ on the lab

def test_03_on_the_lab_keeps_a_worker_image_of_the_same_content_and_copies_a_changed_one(lab, params, cluster):
    """On the worker, the configured tag moved to an image with the head's layers and runtime
    config under another ID (a label changes the ID, as the containerd store's naming does): 03
    sends nothing and passes, saying why. With another environment under the tag, 03 copies."""
    from sparkbook.distribution.image import ensure_image, identities
    ensure_image(params, cluster, say=lambda *_: None)
    worker, name = lab.nodes()[1], params.runtime.image
    docker(worker, "tag", name, "sbk-test-keep:latest")
    try:
        docker(worker, "build", "-q", "-t", name, "-", input="FROM sbk-test-keep:latest\nLABEL x=1\n")
        out = distribute_image(params, cluster, show=False, say=lambda *_: None)
        assert out.transfers == [] and out.before[worker.name].id != out.head_image.id
        [check] = [c for c in image_checks(params, out) if c.node == worker.name]
        assert check.status == "PASS" and SAME_CONTENT in check.observed
        docker(worker, "build", "-q", "-t", name, "-", input="FROM sbk-test-keep:latest\nENV SBK_TEST=1\n")
        out = distribute_image(params, cluster, show=False, say=lambda *_: None)
        assert [t.node for t in out.transfers] == [worker.name]
        assert not [c for c in image_checks(params, out) if c.status == "FAIL"]
        assert identities(params, cluster)[worker.name].id == out.head_image.id
    finally:
        docker(worker, "tag", "sbk-test-keep:latest", name)
        docker(worker, "rmi", "sbk-test-keep:latest", check=False)
        docker(worker, "image", "prune", "-f", check=False)
