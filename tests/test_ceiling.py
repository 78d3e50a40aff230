"""Plausibility: the memory-bandwidth ceiling of single-user decode, from a model's config.json, and
the verdict that holds a run against it (both directions, speculative decoding, no bandwidth)."""

import json
from pathlib import Path

import pytest

from sparkbook.facts import memfit
from sparkbook.bench import ceiling, records
from sparkbook.params import load, validate
from sparkbook.nodes.remote import Result
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN

ROOT = Path(__file__).parents[1]
QWEN35 = json.loads("".join((ROOT / "tests" / "fixtures" / "qwen3.5-122b-a10b-fp8-config-full.txt")
                            .read_text().splitlines(True)[2:]))
PAIR = load(ROOT / "parameters" / "dgx-spark-pair.yaml")


def with_serving(params, **serving):
    data = params.model_dump(mode="json")
    data["serving"].update(serving)
    return validate(data)


def results(decode: float, *, depth: int = 0, concurrency: int = 1, tok_s=None) -> records.Results:
    lv = records.LevelResult("depth", f"depth {depth}", "chat", depth + 512, 256, concurrency, None, 3, 0,
                             depth=depth, decode_tok_s=decode)
    lv.requests = [records.RequestRecord(i, ok=True, decode_tok_s=decode + d) for i, d in enumerate((-1, 0, 1))]
    return records.Results("m", "http://x", "chat", "", 0, {}, depths=[lv], ceiling=tok_s)


def test_the_reference_deployment_tops_out_near_55_tok_s():
    c = ceiling.estimate(PAIR, QWEN35)
    assert c["bandwidth_gbs"] == 273 and c["tensor_parallel_size"] == 2 and not c["speculative"]
    # 8.24 GB of FP8 weights (experts, attention, linear attention) + the bfloat16 LM head 1.53 GB
    assert c["weight_bytes"] == pytest.approx(9.769e9, rel=1e-3)
    assert c["kv_bytes_per_token"] == 2 * memfit.kv_bytes_per_token(PAIR, QWEN35)
    assert ceiling.tok_s(c, 640) == pytest.approx(55.8, abs=0.3)
    assert ceiling.tok_s(c, 100_000) < 46  # 2.5 GB of KV cache at 100k tokens
    quad = load(ROOT / "parameters" / "dgx-spark-quad.yaml")  # tensor parallel 4: twice the bandwidth
    assert ceiling.tok_s(ceiling.estimate(quad, QWEN35), 640) == pytest.approx(111.6, abs=0.6)


def test_dense_weights_and_a_quantization_that_keeps_attention():
    dense = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 1000, "torch_dtype": "bfloat16"}
    per_layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128  # q and o, k and v, gate up down
    assert ceiling.weight_bytes(dense) == 2 * (2 * per_layer + 1000 * 64)
    mx = {**dense, "num_local_experts": 8, "experts_per_token": 2,
          "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                     "lm_head"]}}
    attention, experts = 2 * (64 * 64 * 2 + 2 * 64 * 32), 2 * (3 * 64 * 128 * 2 + 8 * 64)
    assert ceiling.weight_bytes(mx) == attention * 2 + experts * 0.5 + 1000 * 64 * 2
    with pytest.raises(ValueError):
        ceiling.weight_bytes({"vocab_size": 10})


@pytest.mark.parametrize("decode, status, words", [
    (30.0, PASS, "54% of the ceiling"),
    (70.0, FAIL, "measurement bug"),
    (10.0, WARN, "eager mode"),
])
def test_verdict_in_both_directions(decode, status, words):
    (row,) = ceiling.checks(results(decode, tok_s=ceiling.estimate(PAIR, QWEN35)))
    assert row.check == "plausibility depth 0" and row.status == status
    assert words in row.observed + row.remedy, row
    assert "2 × 273 GB/s" in row.expected


def test_speculative_decoding_may_pass_the_ceiling_and_other_levels_are_not_judged():
    spec = ceiling.estimate(with_serving(PAIR, extra_args=["--speculative-config", '{"method": "mtp"}']), QWEN35)
    (row,) = ceiling.checks(results(70.0, tok_s=spec))
    assert row.status == WARN and "speculative" in row.remedy
    assert ceiling.checks(results(70.0, concurrency=2, tok_s=spec)) == []


class Head:
    """A cluster whose nodes answer memfit.sh with ``stdout`` (or fail with an SSH ``error``)."""

    def __init__(self, stdout="", error=None):
        self.stdout, self.error, self.asked = stdout, error, []

    def run_on(self, node, cmd, **kw):
        self.asked.append((node.name, cmd))
        return Result(node.name, "memfit.sh", None if self.error else 0, self.stdout, error=self.error)

    def run(self, cmd, nodes, **kw):
        return {n.name: self.run_on(n, cmd(n) if callable(cmd) else cmd) for n in nodes}


def test_without_a_bandwidth_or_a_config_it_is_skipped():
    (row,) = ceiling.checks(results(30.0))
    assert row.status == SKIP and "memory_bandwidth_gbs" in row.observed
    (row,) = ceiling.checks(results(30.0, tok_s=ceiling.fetch(PAIR, Head(error="ssh: connection refused"))))
    assert row.status == SKIP and "connection refused" in row.observed
    head = Head(f"@@ memfit meminfo\nMemTotal: 1 kB\n@@ memfit config\n{json.dumps(QWEN35)}\n")
    assert ceiling.fetch(PAIR, head)["weight_bytes"] == pytest.approx(9.769e9, rel=1e-3)
    # the head's config.json only: the workers' memory is not asked for
    assert len(PAIR.serving_nodes) == 2 and head.asked == [(PAIR.head.name, memfit.node_script(PAIR, PAIR.head))]


def test_the_lab_model_config_reads_from_the_head(params, cluster):
    """The lab's served model: its config.json read from the head gives a finite ceiling."""
    data = params.model_dump(mode="json")
    data["expectations"]["memory_bandwidth_gbs"] = 50
    c = ceiling.fetch(validate(data), cluster)
    assert not c.get("note"), c
    assert c["weight_bytes"] > 0 and 0 < ceiling.tok_s(c, 1024) < 1e6
