"""The configuration that ran (05's "configuration that ran"): vLLM's start-up lines read back (its
non-default arguments, its engine's configuration) and held to the plan's vllm serve. The format
is tested on a real start-up log from a DGX Spark pair (../shared/field-samples, skipped visibly
where absent) and on lines written as the lab's vLLM 0.32 writes them."""

import json
from pathlib import Path

import pytest

from sparkbook.book.verdict import FAIL, PASS, WARN
from sparkbook.facts import pyrepr
from sparkbook.params import load
from sparkbook.serving.commands import api_bind
from sparkbook.serving.deploy import Deployment
from sparkbook.serving.plan import plan
from sparkbook.serving.ran import differences, parse, same
from sparkbook.serving.vllm import asked
from sparkbook.steps.serve import ran_checks

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT.parent / "shared" / "field-samples" / "vllm-ray-head-startup-1.txt"
# a command that gives the sample's "non-default args" line: each listed argument as the owner set it,
# and the port at its default (the sample's log does not show the command itself)
SAMPLE_COMMAND = ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8", "--chat-template", "unsloth.jinja",
                  "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--host", "0.0.0.0",
                  "--port", "8000", "--max-model-len", "262144", "--load-format", "fastsafetensors",
                  "--reasoning-parser", "qwen3", "--distributed-executor-backend", "ray",
                  "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.7", "--enable-prefix-caching",
                  "--max-num-batched-tokens", "16384", "--scheduling-policy", "priority"]


@pytest.fixture
def sample():
    if not SAMPLE.exists():
        pytest.skip(f"field sample absent: {SAMPLE}")
    text = SAMPLE.read_text()
    args = next(ln for ln in text.splitlines() if "non-default args: " in ln)
    engine = next(ln for ln in text.splitlines() if " with config: " in ln)
    return parse(f"@@ args\n{args}\n@@ engine\n{engine}\n")


def test_a_real_start_up_log_is_read_and_matches_the_command_that_made_it(sample):
    assert sample["version"] == "v0.16.1rc1.dev111+gafd089f23.d20260304"
    assert sample["args"]["tensor_parallel_size"] == 2 and sample["args"]["enable_prefix_caching"] is True
    assert sample["engine"]["quantization"] == "fp8" and sample["engine"]["max_seq_len"] == 262144
    assert sample["engine"]["dtype"] == "torch.bfloat16"  # no literal: kept as its text
    diffs, defaulted = differences(SAMPLE_COMMAND, sample)
    assert diffs == [] and defaulted == ["port"]
    # the same log against a command that asked for one rank per node less: the argument and the
    # engine both say otherwise, named once
    other = [("1" if a == "2" else a) for a in SAMPLE_COMMAND]
    assert [(d.name, d.asked, d.ran) for d in differences(other, sample)[0]] == [("tensor_parallel_size", "1", 2)]


def test_reprs_that_no_parser_reads_keep_their_fields_or_their_text():
    engine = pyrepr.key_values("model='/m', dtype=torch.bfloat16, served_model_name=Qwen/Qwen3.5-122B-A10B-FP8, "
                               "so=StructuredOutputsConfig(backend='xgrammar', reasoning_parser=''), "
                               "cc={'mode': <CompilationMode.VLLM_COMPILE: 3>, 'sizes': [1, 2]}, seed=0")
    assert engine == {"model": "/m", "dtype": "torch.bfloat16", "served_model_name": "Qwen/Qwen3.5-122B-A10B-FP8",
                      "so": {"backend": "xgrammar", "reasoning_parser": ""},
                      "cc": {"mode": "<CompilationMode.VLLM_COMPILE: 3>", "sizes": [1, 2]}, "seed": 0}
    assert pyrepr.mapping("{'a': 'x, y', 'b': {'c': (1, 2)}}") == {"a": "x, y", "b": {"c": (1, 2)}}
    with pytest.raises(ValueError):
        pyrepr.mapping("['not', 'a', 'dict']")


def test_asked_names_arguments_as_vllm_logs_them():
    assert asked(["vllm", "serve", "/models/m", "--tensor-parallel-size", "2", "--enforce-eager",
                  "--no-enable-prefix-caching", "--max-num-seqs=8"]) == {
        "model_tag": "/models/m", "model": "/models/m", "tensor_parallel_size": "2", "enforce_eager": True,
        "enable_prefix_caching": False, "max_num_seqs": "8"}
    assert same("0.5", 0.5) and same("2", 2) and not same("2", 3) and same(True, True) and not same(False, True)
    assert same('{"backend": "xgrammar", "disable_any_whitespace": true}',
                {"backend": "xgrammar", "disable_any_whitespace": True, "reasoning_parser": ""})
    assert not same('{"backend": "outlines"}', {"backend": "xgrammar"}) and not same("{oops", {"a": 1})
    assert same("a b", ["a", "b"]) and same("hermes", "hermes") and not same("hermes", "qwen3_coder")


def lab_log(params, extra: str = "", tp: int = 2, max_len: int = 2048) -> str:
    """The two lines as the lab's vLLM 0.32 logs them for its parameters (with ``extra`` items)."""
    m = params.model.path
    args = (f"{{'model_tag': '{m}', 'enable_auto_tool_choice': True, 'tool_call_parser': 'hermes', "
            f"'host': '{api_bind(params)}', 'model': '{m}', 'max_model_len': {params.serving.max_model_len}, "
            "'enforce_eager': True, 'reasoning_parser': 'qwen3', 'distributed_executor_backend': 'ray', "
            f"'tensor_parallel_size': {tp}, 'gpu_memory_utilization': {params.serving.gpu_memory_utilization}, "
            "'structured_outputs_config': StructuredOutputsConfig(backend='xgrammar', disable_any_whitespace=True, "
            f"reasoning_parser=''){extra}}}")
    engine = (f"model='{m}', dtype=torch.bfloat16, max_seq_len={max_len}, tensor_parallel_size={tp}, "
              "pipeline_parallel_size=1, quantization=None, enforce_eager=True, device_config=cpu")
    return (f"@@ args\n(APIServer pid=1) INFO 12-06 02:32:30 [utils.py:261] non-default args: {args}\n"
            f"@@ engine\n(EngineCore pid=2) INFO 12-06 02:32:40 [core.py:105] Initializing a V1 LLM engine "
            f"(v0.32.0) with config: {engine}\n")


@pytest.fixture
def lab_yaml():
    """parameters/lab.yaml, read only (named so: the fixture ``params`` is the live lab's)."""
    return load(ROOT / "parameters" / "lab.yaml")


def rows(params, ran):
    return [(c.node, c.status, c.observed) for c in ran_checks(params, Deployment(ready=True, ran=ran))]


def test_what_the_lab_asks_is_what_it_runs_and_a_wrapper_or_another_value_fails_05(lab_yaml):
    params = lab_yaml
    head = params.head.name
    assert params.serving.executor == "ray" and params.serving.max_model_len == 2048
    [(node, status, seen)] = rows(params, {head: parse(lab_log(params))})
    assert (node, status) == (head, PASS) and "vLLM v0.32.0: 12 non-default arguments, as asked" in seen, seen
    assert "at vLLM's default: pipeline_parallel_size, port" in seen, seen
    # a wrapper in the image adds an argument; another changes one; the engine runs another length
    [(_, status, seen)] = rows(params, {head: parse(lab_log(params, ", 'max_num_seqs': 7"))})
    assert status == FAIL and seen == "vLLM v0.32.0: max_num_seqs=7, not asked", seen
    [(_, status, seen)] = rows(params, {head: parse(lab_log(params, tp=1))})
    assert status == FAIL and "tensor_parallel_size: asked 2, ran 1" in seen, seen
    [(_, status, seen)] = rows(params, {head: parse(lab_log(params, max_len=1024))})
    assert status == FAIL and "max_seq_len (engine): asked 2048, ran 1024" in seen, seen
    # the row's command reads what it read, on the node: vllm serve's log in the head's logs folder
    [row] = ran_checks(params, Deployment(ready=True, ran={head: parse(lab_log(params))}))
    assert row.command.startswith("bash sparkbook/scripts/serve_config.sh ray-head sparkbook-lab-ray /"), row.command
    # the plan's arguments are what the check holds the log to
    assert "--max-model-len" in plan(params).nodes[head].serve_args


def test_a_log_without_the_line_warns_on_the_head_only(lab_yaml):
    params = lab_yaml
    worker = params.nodes[1].name
    found = rows(params, {params.head.name: parse("@@ args\n@@ engine\n"), worker: parse("@@ args\n@@ engine\n")})
    assert [(n, s) for n, s, _ in found] == [(params.head.name, WARN)]
    assert "no 'non-default args' line" in found[0][2]
    unreadable = rows(params, {params.head.name: {"args": None, "error": "ssh: timed out"}})
    assert unreadable == [(params.head.name, WARN, "ssh: timed out")]


def test_what_ran_and_the_start_up_timeline_are_recorded_in_the_fingerprint_beside_what_decides(lab_yaml, tmp_path):
    from sparkbook.record import fingerprint as fp
    head = lab_yaml.head.name
    timeline = {"api": {"port open": 41.2, "ready": 44.9, "first token": 45.3}, head: {"weights": 20.1}}
    (tmp_path / "serving.json").write_text(json.dumps({"ran": {head: parse(lab_log(lab_yaml))}, "timeline": timeline}))
    started = fp.started(lab_yaml, tmp_path)
    assert started["ran"]["version"] == "v0.32.0" and started["ran"]["args"]["tensor_parallel_size"] == 2
    assert started["timeline"] == timeline
    assert fp.started(lab_yaml, tmp_path / "elsewhere") == {}  # no 05 in that run folder
    plain = fp.Fingerprint(serving={"flags": ["--enforce-eager"], "env": {}})
    recorded = fp.Fingerprint(serving={**plain.serving, **started})
    shown = dict(recorded.rows())["ran (vLLM's log)"]
    assert shown.startswith("vLLM v0.32.0: model_tag=/models/") and "tensor_parallel_size=2" in shown
    assert dict(recorded.rows())["start-up"] == "port open 41 s, ready 45 s, first token 45 s"
    assert "ran (vLLM's log)" not in dict(plain.rows()) and "start-up" not in dict(plain.rows())
    assert recorded.key() == plain.key()  # shown, not deciding: 05 fails where it differs from the plan
