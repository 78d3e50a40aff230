"""Plausibility: single-user decode speed held against what the memory can deliver.

Decoding one token of one sequence reads every active weight once, and the KV cache of the
sequence so far, from memory; at batch 1 nothing else bounds it as hard. So no deployment decodes
faster than::

    ceiling tok/s = tensor-parallel size × each node's bandwidth
                    ÷ (bytes of the active weights + KV cache bytes read at that context)

(the ranks split the weights and read them at once; pipeline stages take turns, adding nothing).
The active weights come from the model's ``config.json`` (:func:`weight_bytes`): attention
(linear-attention layers too), the dense MLP or, for a mixture of experts, the routed top-k, the
shared expert and the router of each layer, and the LM head (read whole for every token; the
embedding's one row is left out), at the width its ``quantization_config`` or ``torch_dtype``
says. Scales, norms and a linear-attention layer's recurrent state are left out, so the estimate
errs high, the safe side for calling a measurement impossible. The KV bytes per token are
:func:`sparkbook.facts.memfit.kv_bytes_per_token`'s (one rank's), times the ranks.

The verdict (:func:`checks`), per single-user level (concurrency 1): above the ceiling is a
measurement bug (FAIL), unless speculative decoding runs (several tokens per read of the weights:
WARN); below a quarter of it something holds the deployment back (WARN, with the usual causes);
else PASS with the fraction. Without ``expectations.memory_bandwidth_gbs`` (the lab): SKIP.

Reference: Qwen3.5-122B-A10B-FP8 at tensor parallel 2 on two GB10 (273 GB/s each) reads about
9.8 GB a token (8.2 GB of FP8 weights, a 1.5 GB bfloat16 LM head): about 56 tok/s.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..facts import memfit
from ..nodes.remote import Cluster
from ..params import Params
from .records import LevelResult, Results

LOW = 0.25  # below this fraction of the ceiling: held back
CAUSES = ("eager mode (--enforce-eager: no CUDA graphs), a wrong parallel layout (the model not split "
          "by tensor parallel across the nodes, or pipeline parallel where tensor parallel was meant), "
          "throttling (GPU clocks or power: nvidia-smi -q -d PERFORMANCE), or a slow link between the nodes")
# bytes per weight of a quantization method (scales left out); methods with "bits" read those
QUANT_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "mxfp4": 0.5, "modelopt_fp4": 0.5, "nvfp4": 0.5}
WHOLE_ATTENTION = re.compile(r"(^|[.*])(self_attn|attn|attention|linear_attn)(\.\*)?$")


def _num(tc: dict[str, Any], *keys: str) -> int:
    return next((int(tc[k]) for k in keys if tc.get(k)), 0)


def widths(config: dict[str, Any]) -> tuple[float, float, bool]:
    """(bytes per quantized weight, bytes per unquantized weight, attention quantized too).
    Quantized checkpoints keep the LM head unquantized; attention too where
    ``modules_to_not_convert`` (or ``ignore``) names it whole (gpt-oss's MXFP4)."""
    tc = memfit.text_config(config)
    base = memfit.DTYPE_BYTES.get(str(tc.get("torch_dtype") or tc.get("dtype") or "bfloat16")
                                  .replace("torch.", ""), 2)
    q = tc.get("quantization_config") or {}
    if not isinstance(q, dict) or not q:
        return base, base, True
    method = str(q.get("quant_method", "")).lower()
    algo = str(q.get("quant_algo", "")).lower()
    groups = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
    bits = q.get("bits") or q.get("weight_bits") or next((w.get("num_bits") for w in groups if w.get("num_bits")), None)
    if "fp8" in algo:
        quant = 1.0
    elif "fp4" in algo:
        quant = 0.5
    elif method in QUANT_BYTES:
        quant = QUANT_BYTES[method]
    elif bits:
        quant = int(bits) / 8
    elif q.get("load_in_4bit") or q.get("load_in_8bit"):
        quant = 0.5 if q.get("load_in_4bit") else 1.0
    else:
        quant = base  # a method not known here: counted as unquantized (the ceiling errs low)
    kept = [str(p) for p in (q.get("modules_to_not_convert") or q.get("ignore") or [])]
    return quant, base, not any(WHOLE_ATTENTION.search(p) for p in kept)


def _layer_kinds(tc: dict[str, Any], layers: int) -> list[str]:
    kinds = tc.get("layer_types")
    if isinstance(kinds, list) and len(kinds) == layers:
        return [str(k) for k in kinds]
    interval = int(tc.get("full_attention_interval") or 0)
    if interval and tc.get("linear_num_value_heads"):
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    return ["full_attention"] * layers


def _attention(tc: dict[str, Any], h: int, kind: str) -> int:
    """One layer's attention weights."""
    if kind == "linear_attention":  # Gated DeltaNet (Qwen3-Next, Qwen3.5): q, k, v, z, b, a, out
        key = _num(tc, "linear_num_key_heads") * _num(tc, "linear_key_head_dim")
        vheads = _num(tc, "linear_num_value_heads")
        value = vheads * _num(tc, "linear_value_head_dim")
        return h * (2 * key + 2 * value + 2 * vheads) + value * h
    heads = _num(tc, "num_attention_heads") or 1
    if tc.get("kv_lora_rank"):  # MLA (DeepSeek)
        qk = _num(tc, "qk_nope_head_dim") + _num(tc, "qk_rope_head_dim")
        ql, kvl = _num(tc, "q_lora_rank"), _num(tc, "kv_lora_rank")
        q = h * ql + ql * heads * qk if ql else h * heads * qk
        return (q + h * (kvl + _num(tc, "qk_rope_head_dim")) + kvl * heads * (_num(tc, "qk_nope_head_dim")
                + _num(tc, "v_head_dim")) + heads * _num(tc, "v_head_dim") * h)
    dim = _num(tc, "head_dim") or h // heads
    kv = _num(tc, "num_key_value_heads") or heads
    gate = 2 if tc.get("attn_output_gate") else 1  # Qwen3.5's gated attention doubles q_proj
    return h * heads * dim * (gate + 1) + 2 * h * kv * dim


def _mlp(tc: dict[str, Any], h: int, i: int) -> int:
    """One layer's MLP weights read per token: the routed top-k, the shared expert and the router
    of a mixture of experts, else the dense MLP (gate, up, down)."""
    experts = _num(tc, "num_experts", "n_routed_experts", "num_local_experts")
    sparse = (experts and i not in (tc.get("mlp_only_layers") or []) and i >= _num(tc, "first_k_dense_replace")
              and (i + 1) % (_num(tc, "decoder_sparse_step") or 1) == 0)
    if not sparse:
        return 3 * h * _num(tc, "intermediate_size")
    inner = _num(tc, "moe_intermediate_size", "intermediate_size")
    top_k = _num(tc, "num_experts_per_tok", "experts_per_token", "moe_topk")
    shared = _num(tc, "shared_expert_intermediate_size") or _num(tc, "n_shared_experts") * inner
    return 3 * h * (top_k * inner + shared) + experts * h


def weight_bytes(config: dict[str, Any]) -> float:
    """Bytes of the weights read to decode one token (all ranks together)."""
    tc = memfit.text_config(config)
    h, layers = _num(tc, "hidden_size"), _num(tc, "num_hidden_layers")
    if not h or not layers:
        raise ValueError("config.json has no hidden_size or num_hidden_layers")
    quant, base, attention_quantized = widths(config)
    kinds = _layer_kinds(tc, layers)
    mlp = sum(_mlp(tc, h, i) for i in range(layers))
    attention = sum(_attention(tc, h, k) for k in kinds)
    head = _num(tc, "vocab_size") * h
    return mlp * quant + attention * (quant if attention_quantized else base) + head * base


def estimate(params: Params, config: dict[str, Any]) -> dict[str, Any]:
    """What :func:`checks` holds the run against, from the model's config (kept in the results)."""
    s = params.serving
    args = {a.split("=", 1)[0].replace("_", "-") for a in s.extra_args}
    return {"bandwidth_gbs": params.expectations.memory_bandwidth_gbs, "tensor_parallel_size": s.tensor_parallel_size,
            "weight_bytes": weight_bytes(config),
            "kv_bytes_per_token": memfit.kv_bytes_per_token(params, config) * s.tensor_parallel_size
            * s.pipeline_parallel_size,
            "speculative": bool(args & {"--speculative-config", "-sc"}), "note": ""}


def fetch(params: Params, cluster: Cluster) -> dict[str, Any] | None:
    """The estimate from the head's ``config.json`` (read by ``memfit.sh`` on the head alone, one
    round trip: the other nodes' memory is not needed), or a ``note`` saying why there is none;
    None without a bandwidth to judge by."""
    bandwidth = params.expectations.memory_bandwidth_gbs
    if bandwidth is None:
        return None
    head = memfit.gather(params, cluster, [params.head])[params.head.name]
    config = head.get("config") if isinstance(head, dict) else None
    if config is None:
        why = head if isinstance(head, str) else f"no readable config.json in {params.model.path} on the head"
        return {"bandwidth_gbs": bandwidth, "note": why}
    try:
        return estimate(params, config)
    except (ValueError, TypeError) as e:
        return {"bandwidth_gbs": bandwidth, "note": f"config.json not understood: {e}"}


def tok_s(ceiling: dict[str, Any], context: float) -> float:
    """The ceiling at ``context`` tokens of the sequence."""
    read = ceiling["weight_bytes"] + ceiling["kv_bytes_per_token"] * context
    return ceiling["tensor_parallel_size"] * ceiling["bandwidth_gbs"] * 1e9 / read


def context(lv: LevelResult) -> float:
    """The mean length of the sequence while the level decoded: its prompt and half its output."""
    return (lv.prompt_tokens_mean or lv.prompt_tokens) + lv.output_tokens / 2


def checks(results: Results, node: str = "api") -> list[Check]:
    """A "plausibility" row per single-user level (see the module's text)."""
    c = results.ceiling
    if c is None:
        return [Check("plausibility", node, SKIP, "no expectations.memory_bandwidth_gbs",
                      "single-user decode within the memory-bandwidth ceiling",
                      "set expectations.memory_bandwidth_gbs (GB10: 273) to judge it")]
    if c.get("note"):
        return [Check("plausibility", node, SKIP, c["note"], "the model's config.json on the head")]
    ones = [lv for lv in results.levels if lv.concurrency == 1 and lv.request_rate is None and lv.decode_tok_s]
    return [_judge(c, lv, node) for lv in ones]


def _judge(c: dict[str, Any], lv: LevelResult, node: str) -> Check:
    ctx = context(lv)
    top, got = tok_s(c, ctx), float(lv.decode_tok_s or 0)
    spread = [r.decode_tok_s for r in lv.requests if r.ok and r.decode_tok_s]
    p90 = f", p90 {np.percentile(spread, 90):.1f}" if len(spread) > 1 else ""
    observed = (f"{got:.1f} decode tok/s (median of {len(spread)} request(s){p90}) = {got / top:.0%} of "
                f"the ceiling {top:.1f} tok/s")
    expected = (f"≤ {c['tensor_parallel_size']} × {c['bandwidth_gbs']:g} GB/s ÷ ({c['weight_bytes'] / 1e9:.2f} GB "
                f"weights + {c['kv_bytes_per_token'] * ctx / 1e9:.2f} GB KV at {ctx:.0f} tokens), ≥ {LOW:.0%} of it")
    name = f"plausibility {lv.label}"
    if got > top and c.get("speculative"):
        return Check(name, node, WARN, observed, expected, "speculative decoding emits several tokens per read "
                     "of the weights: the ceiling does not bind; compare without it", lv.describe())
    if got > top:
        return Check(name, node, FAIL, observed, expected, "faster than the memory can deliver: a measurement "
                     "bug (tokens counted from chunks, not usage? a cached answer? the wrong model?), or "
                     "expectations.memory_bandwidth_gbs or the model's config.json is wrong", lv.describe())
    if got < LOW * top:
        return Check(name, node, WARN, observed, expected, f"held back; likely causes: {CAUSES}", lv.describe())
    return Check(name, node, PASS, observed, expected, command=lv.describe())
