"""What the benchmark's verdict says about a run: every level completed with the fixed output
length, the client was not the bottleneck, and single-user speed against the references."""

from __future__ import annotations

from typing import Sequence

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..params.settings import Reference
from .records import CLIENT_CPU_LIMIT, LATE_LIMIT_MS, Results


def checks(results: Results, references: Sequence[Reference] = (), node: str = "api") -> list[Check]:
    """Each level completed without failures (FAIL), with the fixed output length (WARN); the
    client was not the bottleneck (WARN); single-user decode against each reference (WARN when
    below: informational, the hardware and model decide, not the deployment)."""
    v: list[Check] = []
    for lv in results.levels:
        expected = f"{lv.num_requests} requests complete, {lv.output_tokens} output tokens each"
        if lv.failures:
            v.append(Check(f"load {lv.label}", node, FAIL, f"{lv.failures}/{lv.num_requests} failed: "
                           + "; ".join(lv.errors[:3]), expected,
                           "see the server's log (docker logs on the head): a prompt over max_model_len, "
                           "KV cache exhausted, a crashed worker, or a request timeout (timeout=)",
                           lv.describe()))
        elif lv.output_tokens_mean != lv.output_tokens:
            v.append(Check(f"load {lv.label}", node, WARN, f"{lv.output_tokens_mean:g} output tokens on "
                           "average", expected, "the server ignored ignore_eos: the levels "
                           "are not comparable (is it vLLM?)", lv.describe()))
        else:
            v.append(Check(f"load {lv.label}", node, PASS, f"{lv.completed}/{lv.num_requests} ok, "
                           f"{lv.output_tok_s:.1f} output tok/s", expected, command=lv.describe()))
    for s in results.skipped:
        label, why = s.split(": ", 1)
        v.append(Check(f"load {label}", node, SKIP, why, "fits the model's context",
                       "raise serving.max_model_len or lower benchmark.context_depths"))
    if not results.levels:
        v.append(Check("benchmark", node, FAIL, "no level was measured", "at least one level",
                       "check benchmark.context_depths, concurrency and max_model_len"))
    if results.prompt_sizing.startswith("estimated"):
        v.append(Check("prompt sizing", node, WARN, results.prompt_sizing, "exact token counts",
                       "the server has no /tokenize (not vLLM?): prompt lengths are estimates; the "
                       "server's counts are in prompt_tokens_mean"))
    bound = [lv for lv in results.levels if lv.client_bound]
    v.append(Check("load generator", "client", WARN if bound else PASS,
                   "; ".join(f"{lv.label}: {lv.client_note}" for lv in bound) or
                   f"at most {max((lv.client_cpu_frac for lv in results.levels), default=0):.0%} of a core",
                   f"client CPU under {CLIENT_CPU_LIMIT:.0%} of a core, lateness p99 under {LATE_LIMIT_MS:g} ms "
                   "(at most the second-latest sample: one stall is no bottleneck); advisory",
                   "the client, not the server, limited these levels: run the benchmark from a less "
                   "loaded machine or with fewer levels at once" if bound else ""))
    one = results.single_user()
    for ref in references:
        if ref.single_user_tok_s is None:
            continue
        name = f"single user vs {ref.label}"
        if one is None:
            v.append(Check(name, node, SKIP, "no single-user level measured", f"≥ {ref.single_user_tok_s:g} tok/s"))
            continue
        ok = one.decode_tok_s >= ref.single_user_tok_s
        v.append(Check(name, node, PASS if ok else WARN, f"{one.decode_tok_s:.1f} decode tok/s ({one.label})",
                       f"≥ {ref.single_user_tok_s:g} tok/s (benchmark.references)",
                       "" if ok else "informational: below the reference; compare the model, "
                       "quantization, versions and settings the reference used", one.describe()))
    return v
