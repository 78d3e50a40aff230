"""Issue 26, the parameters' side: a parameters file from someone else. It may not send a secret of
this machine to a listener of its choosing, put the Hugging Face token on a command line, give
rsync a path a worker's shell splits, or make reading it hang, crash or run out of memory."""

import os
import socket
import threading
import time

import pytest
import yaml

from sparkbook.runbook import frontpage
from sparkbook import notebook
from sparkbook.cli import main
from sparkbook.params.fields import MAX_BYTES, MAX_DEPTH, MAX_VALUES
from sparkbook.params import ParamsError, load, validate
from test_params import ROOT, pair, problems

KEY = "sk-operator-secret-0123456789"


def localhost(**serving) -> dict:
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data["serving"].update(serving)
    return data


def write(tmp_path, data, name="shared.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return path


class Listener:
    """A real listening socket on 127.0.0.1: records every connection's request, and answers as
    vLLM's /health and /v1/models would."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(4096)):
                    data += chunk
                self.received.append(data)
                body = b'{"data": [{"id": "m"}]}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             b"%d\r\nConnection: close\r\n\r\n%s" % (len(body), body))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()


# --- 1: where the API key goes, and which variable it may be ----------------------------------------

def test_a_file_pointing_the_key_elsewhere_sends_nothing_and_names_the_field_and_the_remedy(
        tmp_path, monkeypatch, capsys):
    """`sparkbook status -p FILE`, the front page and 05/06/07 (which read the file as notebooks
    do) all refuse the file before anything is sent; the listener sees no connection."""
    monkeypatch.setenv("SPARKBOOK_API_KEY", KEY)
    monkeypatch.delenv("SPARKBOOK_API_HOSTS", raising=False)
    with Listener() as spy:
        path = write(tmp_path, localhost(api_url=f"http://127.0.0.1:{spy.port}/v1",
                                         api_key_env="SPARKBOOK_API_KEY"))
        assert main(["status", "-p", str(path)]) == 2
        said = capsys.readouterr().err
        assert "1 invalid field" in said and said.count("serving.api_url:") == 1, said
        assert f"127.0.0.1:{spy.port} is not this deployment's API (localhost port 8000" in said
        assert "remove serving.api_url" in said and "list it in $SPARKBOOK_API_HOSTS" in said
        assert "serving.api_url" in frontpage.FrontPage(path).look().text
        with pytest.raises(ParamsError, match="serving.api_url"):
            notebook.resolve({"params_file": str(path)})
        time.sleep(0.2)
        assert spy.received == [] and KEY not in said


def test_the_operator_lets_the_key_go_to_a_host_listed_outside_the_file(tmp_path, monkeypatch):
    """The same file where $SPARKBOOK_API_HOSTS lists the listener: it validates and the key goes
    there (so the test above would have seen it)."""
    from sparkbook.serving.deploy import healthy
    monkeypatch.setenv("SPARKBOOK_API_KEY", KEY)
    with Listener() as spy:
        path = write(tmp_path, localhost(api_url=f"http://127.0.0.1:{spy.port}",
                                         api_key_env="SPARKBOOK_API_KEY"))
        monkeypatch.setenv("SPARKBOOK_API_HOSTS", f"gateway.lab, 127.0.0.1:{spy.port}")
        assert healthy(load(path)).ready
        assert any(f"Bearer {KEY}".encode() in r for r in spy.received), spy.received


@pytest.mark.parametrize("listed, ok", [
    ("", False), ("127.0.0.2", False), ("127.0.0.1:9", False), ("127.0.0.1:nope", False),
    ("127.0.0.1", True), ("127.0.0.1:18000", True), ("other  127.0.0.1:18000,x", True)])
def test_sparkbook_api_hosts_lists_a_host_or_a_host_and_port(monkeypatch, listed, ok):
    monkeypatch.setenv("SPARKBOOK_API_HOSTS", listed)
    d = localhost(api_url="http://127.0.0.1:18000", api_key_env="SPARKBOOK_API_KEY")
    if ok:
        validate(d)
    else:
        assert "SPARKBOOK_API_HOSTS" in problems(d)["serving.api_url"]


def test_the_deployments_own_api_needs_no_listing(monkeypatch):
    """The head at ports.api, however spelled, and any api_url without a key, stay as they were."""
    monkeypatch.delenv("SPARKBOOK_API_HOSTS", raising=False)
    assert validate(localhost(api_key_env="SPARKBOOK_API_KEY")).endpoint == "http://localhost:8000"
    validate(localhost(api_url="https://LOCALHOST.:8000/v1/", api_key_env="SPARKBOOK_API_KEY"))
    validate(localhost(api_url="http://elsewhere:9000"))  # no key: nothing secret goes there
    lab = yaml.safe_load((ROOT / "parameters" / "lab.yaml").read_text())
    lab["serving"]["api_key_env"] = "SPARKBOOK_E2E_API_KEY"  # as tests/test_e2e.py runs the lab
    validate(lab)
    # ... but another port of the head is not the API 05 starts
    assert "SPARKBOOK_API_HOSTS" in problems(localhost(api_url="http://localhost:8001",
                                                       api_key_env="VLLM_API_KEY"))["serving.api_url"]


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "HF_TOKEN",
                                  "GITHUB_TOKEN", "SPARKBOOK_", "sparkbook_key", "SPARKBOOK_A-B"])
def test_api_key_env_names_only_variables_the_operator_allows(monkeypatch, name):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-0123456789abcdef")
    msg = problems(localhost(api_key_env=name))["serving.api_key_env"]
    assert "must be VLLM_API_KEY or begin with SPARKBOOK_" in msg and "aws-secret" not in msg


def test_sparkbook_and_vllm_names_are_allowed():
    for name in ("SPARKBOOK_API_KEY", "SPARKBOOK_E2E_API_KEY", "VLLM_API_KEY"):
        assert validate(localhost(api_key_env=name)).serving.api_key_env == name


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HOME", "SPARKBOOK_"])
def test_hf_token_env_names_only_the_hubs_own_variables_or_a_sparkbook_one(name):
    """Its value goes to the head the file names (over SSH, for 03's hub download)."""
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data["model"]["hf_token_env"] = name
    assert "must be HF_TOKEN or HUGGING_FACE_HUB_TOKEN or begin with SPARKBOOK_" in problems(data)["model.hf_token_env"]
    for allowed in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SPARKBOOK_HUB_TOKEN"):
        data["model"]["hf_token_env"] = allowed
        assert validate(data).model.hf_token_env == allowed


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://h/", "http://", "http://user:pw@h:8000",
                                 "http://h:99999", "http://h:x", "http://[::1", "http://h /v1"])
def test_api_url_is_an_http_url_with_a_host(url):
    assert "serving.api_url" in problems(localhost(api_url=url))


# --- 2: the Hugging Face token on vLLM's command line -----------------------------------------------

def test_an_hf_token_in_extra_args_is_refused_with_its_remedy_and_not_echoed():
    d = pair()
    for given in (["--hf-token", "hf_do_not_show_me_0123"], ["--hf_token=hf_do_not_show_me_0123"],
                  ["--hf-tok", "hf_do_not_show_me_0123"], ["--hf-token"]):  # as vLLM's parser reads them
        d["serving"]["extra_args"] = given
        msg = problems(d)["serving.extra_args"]
        assert "--hf-token would put a secret on a command line" in msg and "model.hf_token_env" in msg
        assert "hf_do_not_show" not in msg, given
    d["serving"]["extra_args"] = ["--api-key", "sk-x-0123456789", "--hf-token", "hf_x_0123456789"]
    msg = problems(d)["serving.extra_args"]
    assert "--api-key" in msg and "--hf-token" in msg  # both, in one error
    d["serving"]["extra_args"] = ["--hf-overrides", '{"a": 1}', "--hf-config-path", "/c"]  # not the token
    validate(d)


# --- 3: model.path through rsync --------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/models/a b", "/models/$(id)", "/models/a;b", "/models/`x`",
                                  "/models/a'b", "/models/a*", "/models/a|b", "/models/é"])
def test_a_model_path_a_workers_shell_would_split_or_run_is_refused(path):
    d = pair()
    d["model"]["path"] = path
    assert "reaches a worker's shell through rsync" in problems(d)["model.path"]


def test_model_paths_of_safe_characters_stay_accepted():
    d = pair()
    for path in ("/models/Qwen3.5-122B-A10B-FP8", "/data/org@rev+v2=x_y", "/m"):
        d["model"]["path"] = path
        assert validate(d).model.path == path


# --- 4: reading is bounded --------------------------------------------------------------------------

def one_problem(path) -> tuple[str, str]:
    with pytest.raises(ParamsError) as e:
        load(path)
    assert len(e.value.problems) == 1, e.value.problems
    return e.value.problems[0]


def test_files_that_are_not_parameters_files_are_refused_before_parsing(tmp_path):
    assert one_problem("/dev/zero") == ("(file)", "not a regular file (a folder, a device or a pipe)")
    assert one_problem(tmp_path) == ("(file)", "cannot read: Is a directory")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: opening it to read would wait for ever
    assert "not a regular file" in one_problem(fifo)[1]
    big = write(tmp_path, "description: " + "x" * MAX_BYTES + "\n", "big.yaml")
    assert "larger than 64 KiB" in one_problem(big)[1]
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert one_problem(latin) == ("(file)", "not UTF-8 text (byte 0xe9 at offset 9)")


@pytest.mark.parametrize("text, why", [
    ("name: " + "1" * 5000 + "\n", "cannot read this int: Exceeds the limit (4300 digits)"),
    ("name: !!int nope\n", "cannot read this int"),
    ("name: !!bool maybe\n", "cannot read this bool"),
    ("name: !!timestamp 2026-13-45\n", "cannot read this timestamp"),
    ("a: " + "[" * 10000 + "]" * 10000 + "\n", f"nested more than {MAX_DEPTH} levels deep"),
    ("a: [" + "1," * 10000 + "1]\n", f"more than {MAX_VALUES} values"),
])
def test_yaml_that_would_crash_or_recurse_is_one_error_with_its_line(tmp_path, text, why):
    where, msg = one_problem(write(tmp_path, text))
    assert where.startswith("line 1, column") and why in msg, msg


def test_aliases_that_expand_to_billions_of_values_are_refused(tmp_path):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    for text in ("\n".join(levels) + "\nnodes: *a8\n", "nodes: &n [*n]\n"):  # 10^9 values; a cycle
        t = time.perf_counter()
        assert one_problem(write(tmp_path, text)) == (
            "(top level)", f"more than {MAX_VALUES} values (an alias counts each time it is used): "
            "not a parameters file")
        assert time.perf_counter() - t < 2


def test_an_integer_of_thousands_of_digits_is_a_bound_error_naming_the_field():
    d = pair()
    d["ssh"]["parallel"] = int("9" * 4000)
    assert problems(d)["ssh.parallel"].startswith("Input should be less than or equal to 4096 (got 9999")
    d["ssh"]["parallel"] = 10 ** 5000  # validate() from Python: too long even for repr
    assert problems(d)["ssh.parallel"].endswith("(got an integer of 16610 bits)")


@pytest.mark.parametrize("where, value, why", [
    (("serving", "ray_object_store_gb"), float("inf"), "finite number"),
    (("serving", "ray_object_store_gb"), float("nan"), "finite number"),
    (("serving", "ray_object_store_gb"), 1e6, "less than or equal to 1024"),
    (("serving", "gpu_memory_utilization"), float("nan"), "finite number"),
    (("expectations", "busbw_gbps"), float("-inf"), "finite number"),
    (("collectives", "min_size_mb"), 1e-9, "must be at least one byte (1/1048576 MB)"),
    (("collectives", "max_size_mb"), 1e9, "less than or equal to 65536"),
    (("serving", "max_model_len"), 10**12, "less than or equal to 2147483647"),
    (("serving", "tensor_parallel_size"), 10**9, "less than or equal to 4096"),
    (("benchmark", "seed"), -1, "greater than or equal to 0"),
    (("benchmark", "request_rates"), [0.0], "above 0 and at most 10000"),
    (("benchmark", "concurrency"), [10**6], "at most 4096"),
    (("smoke", "prompt_tokens"), [1, 10**9], "at most 16777216"),
    (("runtime", "shm_size"), "9" * 40 + "g", "should match pattern"),
    (("nodes", 0, "gpus"), 10**6, "less than or equal to 64"),
])
def test_numbers_are_finite_and_bounded_each_naming_its_field(where, value, why):
    d = pair()
    d.setdefault(where[0], {})
    target = d[where[0]][where[1]] if len(where) == 3 else d[where[0]]
    target[where[-1]] = value
    field = ".".join(map(str, where)).replace(".0.", "[0].")
    assert why in problems(d)[field]


def test_the_yaml_infinities_are_refused_as_written(tmp_path):
    text = (ROOT / "parameters" / "lab.yaml").read_text().replace(
        "ray_object_store_gb: 0.5", "ray_object_store_gb: .inf")
    assert one_problem(write(tmp_path, text)) == ("serving.ray_object_store_gb",
                                                  "Input should be a finite number (got inf)")


def test_a_sweep_below_one_byte_or_upside_down_is_refused_and_sizes_end():
    d = pair()
    d["collectives"] = {"min_size_mb": 2**-20, "max_size_mb": 65536}
    assert validate(d).collectives.sizes()[:2] == [1, 2]  # the smallest sweep allowed: 37 sizes
    d["collectives"] = {"min_size_mb": 64, "max_size_mb": 32}
    assert "the sweep would be empty" in problems(d)["collectives"]


def test_a_file_of_many_bad_fields_is_one_readable_error(tmp_path):
    d = pair()
    d.update({f"junk{i}": i for i in range(200)})
    with pytest.raises(ParamsError) as e:
        validate(d, "many.yaml")
    lines = str(e.value).splitlines()
    assert lines[0] == "many.yaml: 200 invalid fields" and lines[-1] == "  (and 170 more)"
    assert len(lines) == 32 and len(e.value.problems) == 200
