"""The parameters schema: valid files load; every bad field is reported by its path."""

import copy
from pathlib import Path

import pytest
import yaml

from sparkbook.lab import lab_params
from sparkbook.params import ParamsError, load, validate
from sparkbook.serving.commands import serve_args

ROOT = Path(__file__).resolve().parents[1]
PARAMS = sorted((ROOT / "parameters").glob("*.yaml"))


def pair() -> dict:
    return yaml.safe_load((ROOT / "parameters" / "dgx-spark-pair.yaml").read_text())


def problems(data) -> dict[str, str]:
    with pytest.raises(ParamsError) as e:
        validate(data, "test.yaml")
    return dict(e.value.problems)


@pytest.mark.parametrize("path", PARAMS, ids=lambda p: p.name)
def test_shipped_parameter_files_load(path):
    p = load(path)
    assert p.name == path.stem and sum(n.role == "head" for n in p.nodes) == 1


def test_reference_pair_describes_the_reference_deployment():
    p = load(ROOT / "parameters" / "dgx-spark-pair.yaml")
    assert [n.name for n in p.nodes] == ["spark-1", "spark-2"]
    assert p.model.name == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert p.runtime.image.startswith("hellohal2064/vllm-qwen3.5-gb10")
    assert (p.serving.tensor_parallel_size, p.serving.executor) == (2, "ray")
    assert p.serving.reasoning_parser == "qwen3" and p.serving.tool_call_parser
    for n in p.nodes:
        assert [(r.interface, r.hca) for r in n.rails] == [
            ("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")]


def test_quad_has_four_nodes_and_tp4():
    p = load(ROOT / "parameters" / "dgx-spark-quad.yaml")
    assert len(p.nodes) == 4 and len(p.workers) == 3 and p.serving.tensor_parallel_size == 4


def test_every_bad_field_is_listed_by_path_in_one_error():
    d = pair()
    d["nodes"][1]["rails"][0]["ip"] = "192.168.100.300"
    d["nodes"][0]["port"] = 70000
    d["serving"]["executor"] = "slurm"
    d["serving"]["engine"] = "sglang"  # planned, not built
    d["serving"]["gpu_memory_utilization"] = 1.5
    d["ports"]["api"] = "eighty"
    d["model"]["path"] = "relative/dir"
    d["nodes"][0]["rails"][1]["interface"] = "a-name-longer-than-15"
    got = problems(d)
    assert set(got) == {
        "nodes[1].rails[0].ip", "nodes[0].port", "serving.executor", "serving.engine",
        "serving.gpu_memory_utilization", "ports.api", "model.path", "nodes[0].rails[1].interface"}
    assert got["nodes[1].rails[0].ip"].startswith("not an IPv4 address")
    assert "'ray' or 'mp'" in got["serving.executor"] and "'vllm'" in got["serving.engine"]
    assert "absolute path" in got["model.path"]


def test_error_message_has_one_line_per_field_and_no_traceback():
    d = pair()
    del d["model"]
    d["nodes"][0]["typo_field"] = 1
    with pytest.raises(ParamsError) as e:
        validate(d, "x.yaml")
    text = str(e.value)
    assert text.splitlines() == [
        "x.yaml: 2 invalid fields",
        "  nodes[0].typo_field: unknown field (allowed here: see the schema in sparkbook/params.py)",
        "  model: required field is missing",
    ]
    rendered = e.value._render_traceback_()
    assert not any("Traceback" in line or "File " in line for line in rendered)


def test_cross_field_problems():
    d = pair()
    d["nodes"][1]["role"] = "head"
    d["nodes"][1]["rails"][1]["ip"] = "192.168.101.10"  # same as spark-1's second rail
    d["nodes"][1]["name"] = "spark-1"
    d["ports"]["ray"] = 8000
    d["serving"]["tensor_parallel_size"] = 4
    got = problems(d)
    assert "exactly one node must have role 'head' (found 2)" in got["nodes"]
    assert "also nodes[0].rails[1].ip" in got["nodes[1].rails[1].ip"]
    assert "duplicate" in got["nodes[1].name"]
    assert "ports.ray" in got["ports.api"]
    assert "serving.tensor_parallel_size" not in got  # the serving checks wait for one head
    d["nodes"][1]["role"] = "worker"
    assert "= 4 GPUs, but the 2 serving nodes" in problems(d)["serving.tensor_parallel_size"]


def test_rails_of_one_node_need_their_own_subnets():
    d = pair()
    d["nodes"][0]["rails"][1]["ip"] = "192.168.100.20"
    assert "same subnet 192.168.100.0/24" in problems(d)["nodes[0].rails[1].ip"]


@pytest.mark.parametrize("name", ["x; touch pwned", "$(id)", "../up", "a b", ""])
def test_node_names_that_could_reach_a_shell_or_a_path_are_refused(name):
    d = pair()
    d["nodes"][0]["name"] = name
    assert "nodes[0].name" in problems(d)


def test_host_with_shell_characters_is_refused():
    d = pair()
    d["nodes"][1]["host"] = "spark-2; rm -rf /"
    assert "not a host name" in problems(d)["nodes[1].host"]


def test_secret_looking_values_are_not_echoed():
    d = pair()
    d["model"]["hf_token"] = "hf_supersecretvalue"
    got = problems(d)
    assert "model.hf_token" in got and "hf_supersecret" not in str(got)


def test_docker_runtime_needs_an_image_and_venv_is_refused_until_implemented():
    d = pair()
    d["runtime"] = {"kind": "docker"}
    assert "runtime.image" in problems(d)
    d["runtime"] = {"kind": "venv", "venv": "/opt/vllm"}
    got = problems(d)
    assert got["runtime.kind"].startswith("not implemented yet; use docker")
    assert "not implemented yet" in got["runtime.venv"]


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ParamsError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n  - name: a\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ParamsError, match="must be a mapping"):
        load(bad)


def test_nothing_is_mutated_by_validation():
    d = pair()
    before = copy.deepcopy(d)
    validate(d)
    assert d == before


def test_four_nodes_serving_a_world_of_two_is_refused_naming_the_fields_and_the_fix():
    """What a new user met: a 4-node lab with TP 2 passed --nnodes 4 for a world size of 2."""
    d = lab_params(4)
    d["serving"]["pipeline_parallel_size"] = 1
    msg = problems(d)["serving.tensor_parallel_size"]
    assert "tensor_parallel_size 2 x pipeline_parallel_size 1 = 2 GPUs" in msg
    assert "the 4 serving nodes (serving.nodes: all by default) have 4 GPUs" in msg
    assert "name 2 node(s) in serving.nodes" in msg


def test_serving_nodes_must_exist_once_and_include_the_head():
    d = lab_params(4)
    d["serving"]["nodes"] = ["spark-2", "spark-9", "spark-2"]
    got = problems(d)
    assert "no node named 'spark-9'" in got["serving.nodes[1]"]
    assert "named twice" in got["serving.nodes[2]"]
    assert "must include the head 'spark-1'" in got["serving.nodes"]


def test_a_subset_serves_and_only_it_counts_for_the_parallel_sizes():
    d = lab_params(8)
    d["serving"]["nodes"] = ["spark-1", "spark-5"]
    d["serving"]["pipeline_parallel_size"] = 1
    p = validate(d)
    assert [n.name for n in p.serving_nodes] == ["spark-1", "spark-5"] and len(p.nodes) == 8
    d["serving"]["nodes"].append("spark-6")
    assert "the 3 serving nodes have 3 GPUs" in problems(d)["serving.tensor_parallel_size"]


def test_mp_needs_as_many_gpus_on_every_serving_node():
    d = lab_params(2)
    d["serving"]["executor"] = "mp"
    d["serving"]["tensor_parallel_size"] = 3
    d["nodes"][1]["gpus"] = 2
    got = problems(d)
    assert "spark-1 1, spark-2 2" in got["serving.executor"]
    d["serving"]["executor"] = "ray"
    validate(d)  # Ray places ranks by the GPUs each node advertises


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_every_lab_size_gets_parameters_that_validate_and_fill_its_serving_nodes(n):
    p = validate(lab_params(n))
    s = p.serving
    assert s.tensor_parallel_size * s.pipeline_parallel_size == len(p.serving_nodes) <= 4
    assert p.serving_nodes == p.nodes[:len(p.serving_nodes)] and p.head in p.serving_nodes


def test_mp_ranks_count_only_the_serving_nodes():
    d = lab_params(8)
    d["serving"]["executor"] = "mp"
    p = validate(d)
    args = [serve_args(p, n) for n in p.serving_nodes]
    ranks = [a[a.index("--node-rank") + 1] for a in args]
    assert ranks == ["0", "1", "2", "3"] and all(a[a.index("--nnodes") + 1] == "4" for a in args)
    assert ["--headless" in a for a in args] == [False, True, True, True]


def test_with_mp_the_head_is_rank_0_wherever_the_file_lists_it():
    """vLLM's API runs on rank 0 and --master-addr is the head's: a head listed second must still be
    rank 0, not a headless worker."""
    d = lab_params(2)
    d["nodes"].reverse()
    d["serving"]["executor"] = "mp"
    p = validate(d)
    assert [n.name for n in p.serving_nodes] == ["spark-1", "spark-2"]
    head = serve_args(p, p.head)
    assert head[head.index("--node-rank") + 1] == "0" and "--headless" not in head


def test_no_head_is_one_named_error_even_with_serving_nodes():
    d = lab_params(2)
    d["nodes"][0]["role"] = "worker"
    d["serving"]["nodes"] = ["spark-1"]
    assert list(problems(d)) == ["nodes"]
