"""Memory fit (01 and 05): does vLLM fit each serving node's memory, before it starts?

On a DGX Spark the GPU's memory is the system's (GB10: 128 GB unified, about 121.7 GiB as vLLM
counts it): the OS, the page cache, Ray's object store and vLLM all come out of one pool. Per
serving node this adds up the node's share of the weights, the KV cache of one sequence of
``max_model_len`` tokens, the runtime's own memory and Ray's object store, and compares them with
what vLLM may use (``gpu_memory_utilization`` × total) and with what the node has free (vLLM refuses
to start when ``gpu_memory_utilization`` × total is not available at start):
FITS (PASS), TIGHT (WARN) or DOES NOT FIT (FAIL), each term in GiB, with the remedy.

The same function decides 01's rows (:func:`checks`, from preflight's bundle) and 05's gate
(:func:`gate`, read just before anything launches), from the output of ``scripts/memfit.sh``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, TypedDict

from packaging.version import InvalidVersion, Version

from ..book.verdict import FAIL, PASS, SKIP, WARN, Check
from ..nodes.remote import Cluster, Result
from ..nodes.shell import Script, script
from ..params import Node, Params
from .parsers import parse_key_values, parse_meminfo, parse_sections

GiB = 1024 ** 3
# The runtime's memory per rank besides the weights and the KV cache: CUDA context, NCCL buffers,
# peak activations of a batch, CUDA graphs (and a vision encoder's cache for multimodal models).
# Measured on two DGX Sparks serving Qwen3.5-122B-A10B-FP8 at TP 2 with vLLM 0.16
# (../shared/field-samples/vllm-ray-head-startup-1.txt, from https://github.com/tom-doerr/llm/blob/
# 162c6ec5ff829f37b0ceca7869cd30e54c35c89a/crash-logs/20260313_004209/spark2.log): 0.7 × 121.69 GiB
# = 85.18 GiB, of which "Model loading took 58.23 GiB" and "Available KV cache memory: 19.82 GiB"
# leave 7.1 GiB (max_num_batched_tokens 16384; CUDA graphs "took 0.48 GiB"). A GB10 boot line in
# https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks/issues/47 reads "3.6 GiB for peak
# activation, and 0.26 GiB for CUDAGraph memory" besides the non-torch memory.
RUNTIME_GIB = 7.0
# vLLM for CPU (the lab: runtime.gpus false) has no CUDA context or graphs and keeps its KV cache
# in VLLM_CPU_KVCACHE_SPACE GiB (serving.env) where it is set; its runtime is taken as 1 GiB a rank.
RUNTIME_CPU_GIB = 1.0
# Below this much room a fit is TIGHT: KV cache beyond one sequence, the host's memory left beside
# vLLM and Ray's store (a unified-memory host that runs out wedges rather than failing cleanly:
# https://github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks/issues/23).
MARGIN_GIB = 4.0
# What vLLM's start check reads as free (vllm/v1/worker/utils.py request_memory: free at start ≥
# gpu_memory_utilization × total). cudaMemGetInfo's free on GB10 is the kernel's MemFree, which
# counts the page cache as used (measured: https://github.com/unslothai/unsloth/pull/10704). vLLM's
# MemorySnapshot.measure() takes MemAvailable (psutil) instead on compute capability 12.1 (Spark),
# Thor and Orin (https://github.com/vllm-project/vllm/blob/a6d5c39009eb73797b276cc557ca9659c396ca14/
# vllm/utils/mem_utils.py), on every integrated GPU since https://github.com/vllm-project/vllm/pull/35356
# (merged 2026-02-26); https://github.com/vllm-project/vllm/issues/48140 blamed MemFree on vLLM 0.24
# and was withdrawn by its author (the check had read MemAvailable). vLLM before the workaround
# reads MemFree (jetson-containers patches older vLLM's vllm/utils/__init__.py to add it). The
# release that first carried it is not pinned down here: 0.17 (the reference image's) reads
# MemAvailable; an earlier or unknown version is taken to read MemFree (a start is not promised).
READS_AVAILABLE_FROM = (0, 17)
FITS, TIGHT, NO_FIT = "FITS", "TIGHT", "DOES NOT FIT"
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1}
FULL_ATTENTION = {"full_attention", "attention", "global", "full"}
COMMAND = "bash sparkbook/scripts/memfit.sh MODEL_DIR; see vLLM's start-up log for what it measured"


class MemReport(TypedDict):
    """What ``memfit.sh`` reported on one node. Bytes."""
    meminfo: dict[str, int]  # MemTotal, MemFree, MemAvailable, Cached
    gpus: list[tuple[int, int]]  # (total, free) of each GPU with memory of its own; [] on GB10
    weights: dict[str, int] | None  # index_total_size, safetensors_bytes; None: absent or not asked
    config: dict[str, Any] | None  # config.json; None: absent, unreadable or not asked
    model: str  # "present", "absent", "" (not asked: a node other than the head)


def node_script(params: Params, node: Node) -> Script:
    """``memfit.sh``: memory on every node, the model's size and config on the head."""
    return script("memfit.sh", params.model.path if node.role == "head" else "")


def parse(s: dict[str, str]) -> MemReport:
    """The report from a node's sections (:func:`~sparkbook.facts.parsers.parse_sections` of its output;
    preflight's bundle holds them among its own)."""
    gpus = []
    for line in s.get("memfit gpus", "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and all(c.isdigit() for c in cells):
            gpus.append((int(cells[0]) * 2 ** 20, int(cells[1]) * 2 ** 20))
    weights_text = s.get("memfit weights")
    kv = parse_key_values(weights_text or "")
    weights = {k: int(v) for k, v in kv.items() if v.isdigit()} or None
    try:
        config = json.loads(s["memfit config"]) if "memfit config" in s else None
    except json.JSONDecodeError:
        config = None
    model = "" if weights_text is None else "absent" if weights_text.strip() == "absent" else "present"
    return {"meminfo": parse_meminfo(s.get("memfit meminfo", "")), "gpus": gpus, "weights": weights,
            "config": config if isinstance(config, dict) else None, "model": model}


def gather(params: Params, cluster: Cluster, nodes: list[Node] | None = None) -> dict[str, MemReport | str]:
    """Every serving node's report, or only ``nodes``'s (one round trip), or the error that kept a
    node from answering."""
    res = cluster.run(lambda n: node_script(params, n), nodes or params.serving_nodes, timeout=60,
                      env={"LC_ALL": "C"})
    return {name: parse(parse_sections(r.stdout)) if r.ok else r.summary() for name, r in res.items()}


# --- the model's side -------------------------------------------------------------------------

def _option(params: Params, flag: str) -> str | None:
    """The value of a ``vllm serve`` option in ``serving.extra_args`` (``--flag V`` or ``--flag=V``,
    ``--flag_name`` too): the last one, as vLLM's argument parser keeps it. extra_args come after
    sparkbook's own options (:func:`sparkbook.serving.commands.serve_args`), so they win."""
    args, found = params.serving.extra_args, None
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name.replace("_", "-") == flag and (eq or i + 1 < len(args)):
            found = value if eq else args[i + 1]
    return found


DECIMAL = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}
BINARY = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def human_int(value: str) -> int | None:
    """An integer as vLLM reads ``--max-model-len`` and ``--kv-cache-memory-bytes``
    (``human_readable_int`` in vllm/engine/arg_utils.py, https://github.com/vllm-project/vllm/blob/
    99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b/vllm/engine/arg_utils.py): a lowercase suffix is
    decimal (``32k`` = 32,000; ``25.6k``), an uppercase one binary (``32K`` = 32,768; integers only).
    None for ``auto`` or -1 (vLLM chooses) and for what vLLM would refuse."""
    v = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", v)
    if not m or v.lower() == "auto":
        return None
    number, suffix = m.groups()
    if suffix in DECIMAL:
        return int(float(number) * DECIMAL[suffix])
    return None if "." in number else int(number) * BINARY.get(suffix, 1)


def utilization(params: Params) -> float:
    """``--gpu-memory-utilization`` of ``serving.extra_args`` (the last), else the parameters'."""
    given = _option(params, "--gpu-memory-utilization")
    try:
        return float(given) if given else params.serving.gpu_memory_utilization
    except ValueError:
        return params.serving.gpu_memory_utilization


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (Qwen3.5 and other multimodal models nest it)."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def kv_layers(tc: dict[str, Any]) -> int:
    """The layers that keep a KV cache of the whole sequence: in hybrid models (Qwen3.5,
    Qwen3-Next) only the full-attention ones (``layer_types``, else every
    ``full_attention_interval``-th layer); linear-attention layers hold a small state of fixed
    size, and sliding-window ones a window's worth, both left out here."""
    types = tc.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if t in FULL_ATTENTION)
    layers = int(tc.get("num_hidden_layers") or 0)
    interval = tc.get("full_attention_interval")
    return layers // int(interval) if interval else layers


def kv_bytes_per_token(params: Params, config: dict[str, Any]) -> float:
    """One rank's KV cache per token of one sequence. The KV heads are split over the tensor
    parallel ranks, and replicated where there are fewer of them than ranks (vLLM's
    ``ModelConfig.get_num_kv_heads``: max(1, heads // TP)); the layers over the pipeline stages."""
    tc = text_config(config)
    s = params.serving
    kind = _option(params, "--kv-cache-dtype") or "auto"
    dtype = str(tc.get("torch_dtype") or tc.get("dtype") or config.get("torch_dtype") or "bfloat16")
    size = DTYPE_BYTES.get(kind if kind != "auto" else dtype.replace("torch.", ""), 2)
    full = kv_layers(tc)
    if tc.get("kv_lora_rank"):  # MLA (DeepSeek): one latent per token and layer, on every rank
        per_layer = int(tc["kv_lora_rank"]) + int(tc.get("qk_rope_head_dim") or 0)
    else:
        q_heads = int(tc.get("num_attention_heads") or 1)
        heads = int(tc.get("num_key_value_heads") or q_heads)
        head_dim = int(tc.get("head_dim") or int(tc.get("hidden_size") or 0) // q_heads)
        per_layer = 2 * max(1, heads // s.tensor_parallel_size) * head_dim
    return math.ceil(full / s.pipeline_parallel_size) * per_layer * size


def max_model_len(params: Params, config: dict[str, Any]) -> int:
    """``--max-model-len`` of ``serving.extra_args`` (the last), else ``serving.max_model_len``,
    else the model's own (vLLM's default, and what ``auto`` is judged at)."""
    given = _option(params, "--max-model-len")
    length = human_int(given) if given is not None else params.serving.max_model_len
    return int(length or text_config(config).get("max_position_embeddings") or 0)


def ranks_on(params: Params, node: Node) -> int:
    """vLLM's ranks on a serving node: all of them on a single node, else one per GPU."""
    world = params.serving.tensor_parallel_size * params.serving.pipeline_parallel_size
    return world if len(params.serving_nodes) == 1 else max(1, min(params.gpus_of(node), world))


# --- the verdict --------------------------------------------------------------------------------

def judge(params: Params, node: Node, mem: MemReport, weights_bytes: float, config: dict[str, Any],
          running: bool = False, start: str | None = None, note: str = "") -> Check:
    """One serving node's fit. ``running``: vLLM serves now, so its memory is in use and vLLM's
    start rule (free ≥ utilization × total) cannot be judged. ``start``: at 05, what the image's
    vLLM reads as free at start on unified memory ("MemFree" or "MemAvailable"); None in 01."""
    s, gib, util = params.serving, (lambda b: b / GiB), utilization(params)
    world, ranks = s.tensor_parallel_size * s.pipeline_parallel_size, ranks_on(params, node)
    length, per_token = max_model_len(params, config), kv_bytes_per_token(params, config)
    fixed = human_int(_option(params, "--kv-cache-memory-bytes") or "")  # vLLM sizes no KV cache itself
    m = mem["meminfo"]
    discrete = bool(mem["gpus"]) and params.runtime.gpus
    if discrete:  # a GPU with memory of its own: one rank per GPU, judged on the fullest
        total, avail = min(mem["gpus"], key=lambda g: g[1])
        free, pool_ranks, store = avail, 1, 0.0
    else:
        total, avail, free = m.get("MemTotal", 0), m.get("MemAvailable", 0), m.get("MemFree", 0)
        pool_ranks = ranks
        store = s.ray_object_store_gb * 1e9 if s.executor == "ray" else 0.0
    weights = weights_bytes * pool_ranks / world
    one_sequence = per_token * length * pool_ranks
    kv = fixed * pool_ranks if fixed else one_sequence
    runtime = (RUNTIME_GIB if params.runtime.gpus else RUNTIME_CPU_GIB) * GiB * pool_ranks
    cpu_space = s.env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if not params.runtime.gpus and cpu_space.replace(".", "", 1).isdigit():
        kv = max(kv, float(cpu_space) * GiB * pool_ranks)
    need = weights + kv + runtime
    # vLLM on a GPU may use utilization × total (its start rule); vLLM for CPU (the lab) has no such
    # rule; with --kv-cache-memory-bytes the KV cache is what it says, held within what is free
    budget = util * total if params.runtime.gpus else avail - store
    held = bool(fixed) and params.runtime.gpus
    cap = avail - store if held else budget
    problems, tight, remedies = [], [], []
    if fixed and kv < one_sequence:
        problems.append(f"--kv-cache-memory-bytes {gib(fixed):.1f} GiB holds less than one sequence of "
                        f"{length} tokens ({gib(one_sequence / pool_ranks):.1f} GiB): vLLM refuses to start")
        remedies.append("raise --kv-cache-memory-bytes or lower serving.max_model_len")
    if need > cap:
        problems.append(f"weights + KV + runtime {gib(need):.1f} GiB > {gib(cap):.1f} GiB "
                        + ("free beside Ray's store" if held else "vLLM may use"))
        room = cap - weights - runtime
        fits_len = int(room / (per_token * pool_ranks)) if room > 0 and per_token else 0
        if fits_len >= 16 and not fixed:
            remedies.append(f"lower serving.max_model_len to {fits_len} or less")
        if params.runtime.gpus and total and need / total <= 0.95 and not fixed:
            remedies.append(f"raise serving.gpu_memory_utilization to {math.ceil(need / total * 100) / 100:.2f}")
        remedies.append("serve on more nodes (tensor or pipeline parallel) or a smaller quantization")
    elif cap - need < MARGIN_GIB * GiB:
        tight.append(f"{gib(cap - need):.1f} GiB "
                     + ("left beside vLLM" if held else "of KV cache beyond one sequence"))
        remedies.append("lower serving.max_model_len or raise serving.gpu_memory_utilization for more KV cache")
    if params.runtime.gpus and not running:
        if avail < budget:
            problems.append(f"free {gib(avail):.2f}/{gib(total):.2f} GiB is less than "
                            f"{util} × total = {gib(budget):.2f} GiB: vLLM refuses to start "
                            "(\"Free memory on device ... on startup is less than desired GPU memory utilization\")")
            remedies.append(f"lower serving.gpu_memory_utilization to {math.floor(avail / total * 100) / 100:.2f}, "
                            "stop what holds memory, or drop the page cache (serving.drop_page_cache: true)")
        elif avail - budget < store:
            problems.append(f"Ray's object store ({gib(store):.1f} GiB) has no room beside vLLM's "
                            f"{gib(budget):.1f} GiB in {gib(avail):.1f} GiB free: the host runs out of memory")
            remedies.append("lower serving.gpu_memory_utilization or serving.ray_object_store_gb")
        elif avail - budget - store < MARGIN_GIB * GiB:
            tight.append(f"{gib(avail - budget - store):.1f} GiB left to the OS beside vLLM and Ray's store")
            remedies.append("lower serving.gpu_memory_utilization to leave the OS more")
        cached = f"the page cache ({gib(m.get('Cached', 0)):.1f} GiB)"
        drop = ("let this user drop the page cache: the page cache row says how" if s.drop_page_cache else
                "drop the page cache before vLLM starts (serving.drop_page_cache: true)")
        # the page cache in the way (in 01, one that 05 drops is no matter)
        if not (discrete or problems or free >= budget + store or (start is None and s.drop_page_cache)):
            if start == "MemFree" and free < budget:
                problems.append(f"MemFree {gib(free):.1f} GiB < {util} × total = {gib(budget):.1f} GiB: this "
                                "image's vLLM (before 0.17, or of unknown version) reads free memory from "
                                f"cudaMemGetInfo, which on GB10 is MemFree and counts {cached} as used: it "
                                "refuses to start")
            else:
                tight.append(f"MemFree {gib(free):.1f} GiB < {gib(budget + store):.1f} GiB: {cached} "
                             "must give way while the weights load")
            remedies.append(drop)
    verdict = NO_FIT if problems else TIGHT if tight else FITS
    terms = (f"weights {gib(weights):.1f} + KV {gib(kv):.1f} ({length} tokens) + runtime {gib(runtime):.1f}"
             f" = {gib(need):.1f} GiB" + (f"; Ray's object store {gib(store):.1f} GiB" if store else ""))
    seen = (f"GPU {gib(total):.1f} GiB, {gib(avail):.1f} free" if discrete else
            f"MemTotal {gib(total):.1f}, MemAvailable {gib(avail):.1f}, MemFree {gib(free):.1f}, "
            f"Cached {gib(m.get('Cached', 0)):.1f} GiB")
    why = "; ".join(problems + tight + ([note] if note else []))
    if running and params.runtime.gpus:
        why += ("; " if why else "") + "vLLM runs now: its start rule is judged when it starts"
    expected = (f"the share of the weights, one sequence's KV cache and the runtime within {util}"
                f" × total, that much free at start{' beside Ray' if store else ''}" if params.runtime.gpus else
                f"all of it{', with Ray,' if store else ''} within MemAvailable") + f", {MARGIN_GIB:.0f} GiB to spare"
    return Check("memory fit", node.name, {FITS: PASS, TIGHT: WARN, NO_FIT: FAIL}[verdict],
                 f"{verdict}: {terms}; {seen}" + (f" ({why})" if why else ""), expected,
                 "; ".join(dict.fromkeys(remedies)), COMMAND)


def checks(params: Params, reports: dict[str, MemReport | str], running: bool = False,
           start: str | None = None) -> list[Check]:
    """Every serving node's fit from the reports of ``memfit.sh`` (the head's holds the model's
    size and config). Without the model on the head yet: an estimate from ``model.size_gb`` where
    the parameters give it, else a SKIP with the reason."""
    head = reports.get(params.head.name)
    if not isinstance(head, dict) or not head["model"]:
        return []  # the head did not answer (its reachability check says so), or was not asked
    size: float = 0
    config: dict[str, Any] = {}
    note = why = ""
    if head["model"] == "absent" and params.model.size_gb:
        size = params.model.size_gb * 1e9
        note = ("an estimate: model.size_gb, as the model is not on the head yet, and no KV cache without "
                "its config.json; judged again at the start of 05")
    elif head["model"] == "absent":
        why = "the model is not on the head yet (03 fetches or copies it): judged again at the start of 05"
    elif not head["weights"]:
        why = "no model.safetensors.index.json and no *.safetensors on the head: the weights' size is unknown"
    elif head["config"] is None:
        why = "config.json is absent or unreadable on the head"
    else:
        size = head["weights"].get("index_total_size") or head["weights"].get("safetensors_bytes") or 0
        config = head["config"]
    if why:
        return [Check("memory fit", params.head.name, SKIP, why, "the model on the head")]
    out = []
    for node in params.serving_nodes:
        mem = reports.get(node.name)
        if isinstance(mem, str):
            out.append(Check("memory fit", node.name, FAIL, f"its memory could not be read: {mem}",
                             "an answer", "see the SSH error", COMMAND))
        elif mem is not None and mem["meminfo"]:
            out.append(judge(params, node, mem, size, config, running, start, note))
    return out


# --- 05: just before anything launches ----------------------------------------------------------

def inspected_vllm(path: Path) -> str | None:
    """The vLLM version in 05's image inspection (``image_inspection.json`` in the run folder), if
    the image was inspected."""
    try:
        found = json.loads(path.read_text()).get("vllm")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def start_reads(vllm: str | None) -> str:
    """What vLLM ``vllm`` (a version) reads as free at start on GB10: see READS_AVAILABLE_FROM."""
    try:
        return "MemAvailable" if vllm and Version(vllm).release >= READS_AVAILABLE_FROM else "MemFree"
    except InvalidVersion:
        return "MemFree"


def gate(params: Params, cluster: Cluster, running: bool, vllm: str | None) -> list[Check]:
    """05's gate: the page cache dropped where ``serving.drop_page_cache`` asks (never under a vLLM
    that runs: ``running``), then every serving node's fit, with vLLM's start rule as the image's
    vLLM (version ``vllm``, None when unknown) applies it."""
    dropped: list[Check] = []
    if params.serving.drop_page_cache:
        dropped = ([Check("page cache", params.head.name, SKIP, "vLLM runs now: not dropped under it")]
                   if running else drop_page_cache(params, cluster))
    return dropped + checks(params, gather(params, cluster), running, start_reads(vllm))


# --- the page cache -----------------------------------------------------------------------------

DROP_BY_HAND = "sync; echo 1 | sudo tee /proc/sys/vm/drop_caches"
SUDOERS = "USER ALL=(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches"


def drop_page_cache(params: Params, cluster: Cluster) -> list[Check]:
    """``serving.drop_page_cache``: the serving nodes' page cache dropped (``drop_page_cache.sh``),
    with the memory before and after; a WARN where it could not be (sudo refused)."""
    res = cluster.run(script("drop_page_cache.sh"), params.serving_nodes, timeout=300, env={"LC_ALL": "C"})
    return [dropped(name, r) for name, r in res.items()]


def parse_drop(stdout: str) -> tuple[dict[str, dict[str, int]], str, str]:
    """``drop_page_cache.sh``'s output: the meminfo {"before"|"after": key -> bytes}, its status
    ("dropped" or "refused: WHY") and the sudoers line that would allow it ("" when not refused)."""
    s = parse_sections(stdout)
    seen = {w: parse_meminfo(s[w]) for w in ("before", "after") if w in s}
    return seen, s.get("status", "").strip(), s.get("sudoers", "").strip()


def dropped(node: str, r: Result) -> Check:
    seen, status, sudoers = parse_drop(r.stdout)
    shown = "; ".join(f"{w}: MemAvailable {m.get('MemAvailable', 0) / GiB:.1f} GiB, MemFree "
                      f"{m.get('MemFree', 0) / GiB:.1f} GiB, Cached {m.get('Cached', 0) / GiB:.1f} GiB"
                      for w, m in seen.items())
    ok = r.ok and status == "dropped"
    observed = (f"dropped ({shown})" if ok else
                f"not dropped: {status or r.summary()}" + (f" ({shown})" if shown else ""))
    return Check("page cache", node, PASS if ok else WARN, observed,
                 "dropped before vLLM starts (serving.drop_page_cache)",
                 "" if ok else "let this user run `sudo -n tee /proc/sys/vm/drop_caches` without a password: "
                 f"`{sudoers or SUDOERS}` in a file of /etc/sudoers.d (`sudo visudo -f /etc/sudoers.d/"
                 f"drop-caches`), or drop it by hand before 05_serve.ipynb: `{DROP_BY_HAND}`",
                 "bash sparkbook/scripts/drop_page_cache.sh")
