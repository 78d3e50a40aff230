"""Issue 15, points 10, 11 and 5 (the parameters' side): values that would become options or break
a mount, values accepted but wrong, and secrets too short to mask or written in the file."""

import pytest
import yaml

from sparkbook.book import redact
from sparkbook.params.fields import UniqueKeyLoader
from sparkbook.params import ParamsError, load, validate
from test_params import ROOT, pair, problems


# --- 10: values that become options ---------------------------------------------------------------

@pytest.mark.parametrize("user", ["-oProxyCommand=touch /tmp/pwned", "-l", "a b", "root@evil", "a:b", ""])
def test_a_user_that_ssh_would_read_as_an_option_or_a_target_is_refused(user):
    d = pair()
    d["nodes"][1]["user"] = user
    assert "login name" in problems(d)["nodes[1].user"]


def test_a_host_beginning_with_a_dash_is_refused():
    d = pair()
    d["nodes"][1]["host"] = "-oProxyCommand"
    assert "not a host name" in problems(d)["nodes[1].host"]


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "vllm:latest --privileged", "img\nx"])
def test_an_image_that_docker_run_would_read_as_a_flag_is_refused(image):
    d = pair()
    d["runtime"]["image"] = image
    assert "Docker image reference" in problems(d)["runtime.image"]


@pytest.mark.parametrize("path, why", [
    ("/models/a:b", "':' or ','"), ("/models/a,b", "':' or ','"), ("models/q", "absolute path"),
    ("/", "below '/'"), ("/models/../etc", "'..'")])
def test_a_model_path_that_breaks_the_mount_is_refused(path, why):
    d = pair()
    d["model"]["path"] = path
    assert why in problems(d)["model.path"]


@pytest.mark.parametrize("cache, why", [("hf-cache", "absolute path"), ("/data/hf:rw", "':' or ','")])
def test_a_relative_or_colon_hf_cache_is_refused(cache, why):
    """A relative ``-v hf-cache:/root/.cache/huggingface`` is a named volume, not a folder."""
    d = pair()
    d["runtime"]["hf_cache"] = cache
    assert why in problems(d)["runtime.hf_cache"]


@pytest.mark.parametrize("where, value", [
    (("runtime", "docker_root"), "var/lib/docker"),
    (("ssh", "known_hosts"), ["-oUserKnownHostsFile=/dev/null"]),
    (("serving", "served_model_name"), "--trust-remote-code"),
    (("serving", "reasoning_parser"), "-x"),
    (("serving", "tool_call_parser"), "qwen3 coder"),
    (("serving", "bind"), "-0.0.0.0"),
    (("serving", "bind"), "0.0.0.0; id"),
    (("model", "name"), "--help"),
    (("model", "revision"), "-x"),
])
def test_other_values_that_reach_a_command_line_are_checked(where, value):
    d = pair()
    d[where[0]][where[1]] = value
    got = problems(d)
    assert any(k.startswith(".".join(where)) for k in got), got


def test_a_key_file_or_rail_beginning_with_a_dash_is_refused():
    d = pair()
    d["nodes"][0]["key"] = "-i/etc/shadow"
    d["nodes"][0]["rails"][0]["interface"] = "-eth0"
    got = problems(d)
    assert "begin with '-'" in got["nodes[0].key"] and "nodes[0].rails[0].interface" in got


def test_values_that_are_fine_stay_accepted():
    d = pair()
    d["serving"]["bind"] = "10.0.0.1"
    d["runtime"]["hf_cache"] = "/data/hf cache"  # a blank is one argument: quoted, never split
    d["runtime"]["image"] = "registry.local:5000/team/vllm@sha256:" + "a" * 64
    d["serving"]["extra_args"] = ["--enable-auto-tool-choice", "-O3"]  # options by design
    d["nodes"][0]["user"] = "first.last"
    p = validate(d)
    assert p.serving.bind == "10.0.0.1"
    for bind in ("spark-1.local", "::1", "0.0.0.0"):
        d["serving"]["bind"] = bind
        assert validate(d).serving.bind == bind


# --- 11: accepted but wrong -----------------------------------------------------------------------

def test_a_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path):
    lines = (ROOT / "parameters" / "dgx-spark-pair.yaml").read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("  path: /models")) + 1
    second = first + 2
    lines.insert(second - 1, "  path: /elsewhere")  # model.path again, two lines further down
    bad = tmp_path / "dup.yaml"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ParamsError) as e:
        load(bad)
    msg = str(e.value)
    assert "'path' is given twice" in msg and f"lines {first} and {second}" in msg


def test_a_notebook_opened_by_hand_reads_its_file_as_load_does(tmp_path):
    """The notebooks' own reading (JupyterLab, papermill without sparkbook run) refuses a key given
    twice as load() does, instead of keeping the last one."""
    from sparkbook.notebook import resolve
    text = (ROOT / "parameters" / "lab.yaml").read_text()
    bad = tmp_path / "dup.yaml"
    bad.write_text(text + "name: other\n")
    with pytest.raises(ParamsError, match="'name' is given twice"):
        resolve({"params_file": str(bad)})


def test_yaml_merge_keys_are_not_duplicates():
    text = "a: &d {x: 1, y: 2}\nb:\n  <<: *d\n  x: 3\n"
    assert yaml.load(text, Loader=UniqueKeyLoader) == {"a": {"x": 1, "y": 2}, "b": {"x": 3, "y": 2}}


@pytest.mark.parametrize("where, value, limit", [
    (("ssh", "connect_timeout"), 3000, "at most 300 s"),
    (("ssh", "command_timeout"), 300000, "at most 86400 s"),
    (("serving", "startup_timeout"), 1800000, "at most 86400 s"),
    (("distribution", "timeout_s"), 3600000, "at most 86400 s"),
    (("collectives", "timeout_s"), 600000, "at most 86400 s"),
])
def test_absurd_timeouts_are_refused_with_their_limit(where, value, limit):
    d = pair()
    d.setdefault(where[0], {})[where[1]] = value
    msg = problems(d)[".".join(where)]
    assert limit in msg and "seconds, not milliseconds" in msg


def test_a_stall_timeout_longer_than_the_startup_limit_is_refused():
    d = pair()
    d["serving"]["stall_timeout"] = 3000
    assert "could never fire" in problems(d)["serving.stall_timeout"]


def test_the_same_host_under_two_names_is_refused_naming_both():
    d = pair()
    d["nodes"][1]["host"] = "SPARK-1.local."
    msg = problems(d)["nodes[1].host"]
    assert "'spark-2' is the same host as node 'spark-1'" in msg
    d["nodes"][1]["port"] = 2222  # another sshd on the same machine is another node
    validate(d)
    d["nodes"][0]["port"] = 2222
    assert "nodes[1].host" in problems(d)


# --- 5: secrets too short to mask, secrets written in the file ------------------------------------

def test_a_short_token_in_this_machines_environment_is_refused_and_never_shown(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    monkeypatch.setenv("SPARKBOOK_TEST_VLLM_KEY", "k3y")
    d = pair()
    d["serving"]["api_key_env"] = "SPARKBOOK_TEST_VLLM_KEY"
    got = problems(d)
    for field in ("model.hf_token_env", "serving.api_key_env"):
        assert "refuse secrets shorter than 8 characters" in got[field]
    assert "hf_abc" not in str(got) and "k3y" not in str(got)
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefgh")
    monkeypatch.setenv("SPARKBOOK_TEST_VLLM_KEY", "k3y-long-enough")
    validate(d)


def test_secrets_written_in_the_parameters_are_masked_and_short_ones_refused(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    d = pair()
    d["serving"]["env"] = {"HF_TOKEN": "hf_shrt", "VLLM_CPU_KVCACHE_SPACE": "1"}
    got = problems(d)
    assert "refuse secrets shorter than 8 characters" in got["serving.env.HF_TOKEN"]
    assert "hf_shrt" not in str(got)
    d["serving"]["env"] = {"MY_API_KEY": "sk-written-in-the-file-42", "VLLM_CPU_KVCACHE_SPACE": "1"}
    validate(d)
    assert redact.mask("key sk-written-in-the-file-42 here, 1 GB") == f"key {redact.MASK} here, 1 GB"


def test_an_api_key_in_extra_args_is_refused_without_echoing_it():
    d = pair()
    for given in (["--api-key", "sk-do-not-show-me"], ["--api_key=sk-do-not-show-me"],
                  ["--api-k", "sk-do-not-show-me"]):  # as vLLM's parser reads them
        d["serving"]["extra_args"] = given
        msg = problems(d)["serving.extra_args"]
        assert "serving.api_key_env" in msg and "sk-do-not-show-me" not in msg, given
    d["serving"]["extra_args"] = ["--api-server-count", "2"]  # not the key
    assert validate(d).serving.extra_args == ["--api-server-count", "2"]
