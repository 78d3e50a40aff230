"""Memory fit (01 and 05): the arithmetic on Qwen3.5-122B-A10B-FP8 as two DGX Sparks served it,
FITS / TIGHT / DOES NOT FIT with the numbers and the remedy, an estimate from model.size_gb (or a
SKIP) without the model, vLLM's options read as vLLM reads them, the start check as the image's
vLLM makes it; the node scripts on this machine (memfit.sh with links; drop_page_cache.sh against a
proc folder of the test's own, as root and through a fake sudo); 05's gate failing before anything
launches, and dropping the cache after a vLLM that died but not under one that runs; and on the
lab: 01's rows FIT, and a max_model_len that cannot fit fails 05 before launch."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkbook.facts import memfit
from sparkbook import notebook, preflight
from sparkbook.book.errors import CheckFailed
from sparkbook.lab import lab_params
from sparkbook.params import load, validate
from sparkbook.facts.parsers import parse_meminfo, parse_sections
from sparkbook.nodes.remote import Cluster, Result, Results
from sparkbook.nodes.workdir import workdir
from sparkbook.serving.commands import serving_container
from sparkbook.serving.deploy import Deployment, serving_fingerprint, vllm_running, what_runs
from sparkbook.serving.state import NodeState, node_states
from sparkbook.serving.teardown import teardown
from sparkbook.nodes.shell import SCRIPTS
from sparkbook.steps import serve as serve_step
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
FIXTURES = Path(__file__).parent / "fixtures"
GiB = 1024 ** 3

# Qwen3.5-122B-A10B-FP8's config.json facts (the fixture's header names the sources).
QWEN35 = json.loads("".join((FIXTURES / "qwen3.5-122b-a10b-fp8-config.txt").read_text().splitlines(True)[2:]))
# Two DGX Sparks serving it at TP 2 with vLLM 0.16 (../shared/field-samples/vllm-ray-head-startup-1.txt,
# source: https://github.com/tom-doerr/llm/blob/162c6ec5ff829f37b0ceca7869cd30e54c35c89a/crash-logs/20260313_004209/spark2.log
# lines 39, 137, 143, 151-152, 282): gpu_memory_utilization 0.7, max_model_len 262144, "Model
# loading took 58.23 GiB" on each rank, "Available KV cache memory: 19.82 GiB", "Maximum concurrency
# for 262,144 tokens per request: 6.26x". The checkpoint's size is what the two ranks loaded.
FIELD_WEIGHTS = round(2 * 58.23 * GiB)
# What vLLM counts as a Spark's total: "Free memory on device (110.34/121.69 GiB) on startup"
# (source: https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks/issues/47).
SPARK_TOTAL, SPARK_FREE = 121.69, 110.34


def params(gpus=1, model=None, **serving):
    """Two Sparks (the lab's layout, real GPUs) serving the 122B model at TP 2 over Ray."""
    data = yaml.safe_load(LAB.read_text())
    data["runtime"].update(gpus=True, rdma=True)
    data["model"].update(model or {})
    data["expectations"]["gpus_per_node"] = gpus
    data["serving"] = {"tensor_parallel_size": 2, "executor": "ray", "gpu_memory_utilization": 0.7,
                       "max_model_len": 262144, **serving}
    return validate(data)


def mem(total=SPARK_TOTAL, available=SPARK_FREE, free=None, cached=1.0, gpus=()):
    gib = {"MemTotal": total, "MemAvailable": available, "MemFree": available - 1 if free is None else free,
           "Cached": cached}
    return {"meminfo": {k: round(v * GiB) for k, v in gib.items()}, "gpus": list(gpus), "weights": None,
            "config": None, "model": ""}


def head(memory=None, weights=FIELD_WEIGHTS, config=QWEN35):
    return {**(memory or mem()), "weights": {"index_total_size": weights}, "config": config, "model": "present"}


def fit(p, *nodes, running=False, start=None):
    reports = {"spark-1": nodes[0], **({"spark-2": nodes[1]} if len(nodes) > 1 else {})}
    return {c.node: c for c in memfit.checks(p, reports, running, start)}


# ------------------------------------------------------------------------------- the arithmetic

def test_the_kv_cache_of_a_hybrid_model_counts_its_full_attention_layers_only():
    p = params()
    assert memfit.kv_layers(memfit.text_config(QWEN35)) == 12
    # 12 layers x (K and V) x 1 KV head per rank (2 over TP 2) x 256 x 2 bytes (bfloat16)
    assert memfit.kv_bytes_per_token(p, QWEN35) == 12 * 2 * 1 * 256 * 2
    one = memfit.kv_bytes_per_token(p, QWEN35) * memfit.max_model_len(p, QWEN35)
    # vLLM's own figure for one 262,144-token request: 19.82 GiB of KV cache held 6.26 of them
    assert abs(one / GiB - 19.82 / 6.26) / (19.82 / 6.26) < 0.1
    # fp8 KV halves it; TP 4 replicates the 2 KV heads (vLLM keeps at least one per rank)
    assert memfit.kv_bytes_per_token(params(extra_args=["--kv-cache-dtype=fp8"]), QWEN35) == 12 * 2 * 256
    tp4 = params(gpus=2, tensor_parallel_size=4)
    assert memfit.kv_bytes_per_token(tp4, QWEN35) == 12 * 2 * 1 * 256 * 2
    pp2 = params(tensor_parallel_size=1, pipeline_parallel_size=2)
    assert memfit.kv_bytes_per_token(pp2, QWEN35) == 6 * 2 * 2 * 256 * 2  # half the layers per stage
    # a config without layer_types: every full_attention_interval-th layer (Qwen3-Next)
    assert memfit.kv_layers({"num_hidden_layers": 48, "full_attention_interval": 4}) == 12
    assert memfit.max_model_len(params(max_model_len=None), QWEN35) == 262144  # the model's own


def test_the_field_deployment_fits_with_its_numbers():
    """The settings two Sparks really served with (util 0.7, 262,144 tokens, TP 2, Ray): FITS,
    and what is left for the KV cache is what vLLM found."""
    rows = fit(params(), head(), mem())
    assert set(rows) == {"spark-1", "spark-2"}
    c = rows["spark-2"]
    assert c.status == PASS and c.observed.startswith("FITS: weights 58.2 + KV 3.0 (262144 tokens) + runtime 7.0"), c
    assert "Ray's object store 3.7 GiB" in c.observed and "MemTotal 121.7" in c.observed
    left = 0.7 * SPARK_TOTAL - 58.23 - memfit.RUNTIME_GIB  # vLLM: "Available KV cache memory: 19.82 GiB"
    assert abs(left - 19.82) < 0.5
    assert not c.remedy


def test_vllms_start_rule_does_not_fit_and_names_the_utilization_that_would():
    # the same pair at 0.9 where CUDA sees only ~102 of 121.69 GiB free (source: the title of
    # https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks/issues/47)
    c = fit(params(gpu_memory_utilization=0.9), head(mem(available=102.0)), mem(available=102.0))["spark-1"]
    assert c.status == FAIL and c.observed.startswith("DOES NOT FIT")
    assert "free 102.00/121.69 GiB is less than 0.9 × total = 109.52 GiB: vLLM refuses to start" in c.observed
    assert "serving.gpu_memory_utilization to 0.83" in c.remedy and "drop_page_cache: true" in c.remedy
    # while vLLM runs its memory is in use: the start rule is not judged, the model still fits
    c = fit(params(gpu_memory_utilization=0.9), head(mem(available=10.0)), running=True)["spark-1"]
    assert c.status != FAIL and "judged when it starts" in c.observed


def test_one_spark_cannot_hold_the_122b_model_and_is_told_to_use_more_nodes():
    p = params(tensor_parallel_size=1, gpu_memory_utilization=0.9, nodes=["spark-1"])
    rows = fit(p, head(), mem())
    assert list(rows) == ["spark-1"]  # only the serving nodes
    c = rows["spark-1"]
    assert c.status == FAIL and "weights 116.5" in c.observed and "> 109.5 GiB vLLM may use" in c.observed
    assert "more nodes" in c.remedy and "max_model_len" not in c.remedy  # no length makes it fit


def test_a_max_model_len_too_long_names_the_length_that_fits():
    p = params(max_model_len=10_000_000)
    c = fit(p, head(), mem())["spark-1"]
    assert c.status == FAIL and "KV 114.4 (10000000 tokens)" in c.observed
    fits = int(c.remedy.split("max_model_len to ")[1].split()[0])
    assert 1_500_000 < fits < 1_800_000
    assert fit(params(max_model_len=fits), head(), mem())["spark-1"].status != FAIL
    tight = fit(params(max_model_len=fits - 100_000), head(), mem())["spark-1"]
    assert tight.status == WARN and tight.observed.startswith("TIGHT") and "beyond one sequence" in tight.observed


def test_a_page_cache_full_of_the_copied_model_is_tight_until_dropped():
    # a GB10 after writing 60 GiB: MemAvailable 115.65, MemFree 41.52, Cached 72.64 GiB (source:
    # https://github.com/unslothai/unsloth/pull/10704, "cuda_free tracks MemFree")
    full = mem(available=115.65, free=41.52, cached=72.64)
    c = fit(params(), head(full), full)["spark-2"]  # 01, before 03 fills the cache: TIGHT
    assert c.status == WARN and c.observed.startswith("TIGHT")
    assert "the page cache (72.6 GiB) must give way while the weights load" in c.observed
    assert "serving.drop_page_cache: true" in c.remedy
    dropped = mem(available=115.87, free=103.30, cached=12.61)  # the same machine once the cache went
    assert fit(params(), head(dropped), dropped)["spark-2"].status == PASS
    # 01 with serving.drop_page_cache: 05 drops it, nothing to say
    assert fit(params(drop_page_cache=True), head(full), full)["spark-2"].status == PASS
    # 05, a vLLM that reads MemAvailable at start (0.17 and later on GB10): still only TIGHT
    c = fit(params(), head(full), full, start=memfit.start_reads("0.17.1"))["spark-2"]
    assert c.status == WARN and "must give way" in c.observed
    # 05, a vLLM that reads cudaMemGetInfo (MemFree on GB10), older or of unknown version: it refuses
    for version in ("0.16.0", None, "0.1.dev16260+g388fd5153"):
        c = fit(params(), head(full), full, start=memfit.start_reads(version))["spark-2"]
        assert c.status == FAIL and c.observed.startswith("DOES NOT FIT"), (version, c)
        assert "MemFree 41.5 GiB < 0.7 × total = 85.2 GiB" in c.observed and "refuses to start" in c.observed
        assert c.remedy == "drop the page cache before vLLM starts (serving.drop_page_cache: true)"
    # dropping was asked but did not happen (sudo refused): the page cache row says how to allow it
    c = fit(params(drop_page_cache=True), head(full), full, start="MemFree")["spark-2"]
    assert c.status == FAIL and "the page cache row says how" in c.remedy


def test_which_vllm_reads_memavailable_at_start(tmp_path):
    """vLLM's MemorySnapshot takes MemAvailable on compute capability 12.1 (the sources are at
    memfit.READS_AVAILABLE_FROM); the reference image's 0.17 has it, older or unknown: MemFree."""
    assert [memfit.start_reads(v) for v in ("0.17.0", "0.17.0rc1", "0.24.0", "1.0")] == ["MemAvailable"] * 4
    assert [memfit.start_reads(v) for v in ("0.16.1", "0.11.0", None, "", "not a version")] == ["MemFree"] * 5
    cache = tmp_path / "image_inspection.json"
    assert memfit.inspected_vllm(cache) is None  # not inspected
    cache.write_text(json.dumps({"image": "x", "vllm": "0.17.1", "ray": "2.49"}))
    assert memfit.inspected_vllm(cache) == "0.17.1"
    cache.write_text("[]")
    assert memfit.inspected_vllm(cache) is None


def test_extra_args_are_read_as_vllm_reads_them():
    """vLLM's human_readable_int: lowercase suffixes decimal, uppercase binary; the last of a flag
    wins (extra_args come after sparkbook's own flags); --flag_name is the same flag."""
    def length(*extra, **serving):
        return memfit.max_model_len(params(extra_args=list(extra), **serving), QWEN35)
    assert length("--max-model-len", "32k") == 32_000
    assert length("--max-model-len", "32K") == 32_768
    assert length("--max-model-len=25.6k") == 25_600
    assert length("--max-model-len", "1m") == 1_000_000 and length("--max-model-len", "2M") == 2 * 2 ** 20
    assert length("--max-model-len", "8192", "--max_model_len=16K") == 16_384  # the last, over serving's 262144
    assert length("--max-model-len", "auto") == 262_144  # vLLM chooses: judged at the model's own
    assert length("--max-model-len", "1.5K") == 262_144  # vLLM refuses decimals with binary suffixes
    assert length() == 262_144
    assert memfit.human_int("-1") is None and memfit.human_int("12") == 12
    # --gpu-memory-utilization in extra_args: the field pair at 0.9 where only 102 GiB are free
    p = params(extra_args=["--gpu-memory-utilization", "0.5", "--gpu-memory-utilization=0.9"])
    assert memfit.utilization(p) == 0.9
    c = fit(p, head(mem(available=102.0)), mem(available=102.0))["spark-1"]
    assert c.status == FAIL and "0.9 × total = 109.52 GiB: vLLM refuses to start" in c.observed
    assert "within 0.9 × total" in c.expected
    # --kv-cache-memory-bytes: the KV cache is what it says, and must hold one sequence
    c = fit(params(extra_args=["--kv-cache-memory-bytes", "20G"]), head(), mem())["spark-1"]
    assert c.status == PASS and "KV 20.0 (262144 tokens)" in c.observed, c
    c = fit(params(extra_args=["--kv-cache-memory-bytes=1G"]), head(), mem())["spark-1"]
    assert c.status == FAIL and "--kv-cache-memory-bytes 1.0 GiB holds less than one sequence of 262144" in c.observed
    assert "raise --kv-cache-memory-bytes" in c.remedy
    c = fit(params(extra_args=["--kv-cache-memory-bytes", "60G"]), head(), mem())["spark-1"]
    assert c.status == FAIL and "free beside Ray's store" in c.observed and "max_model_len to" not in c.remedy


def test_a_discrete_gpu_is_judged_on_its_own_memory():
    h200 = mem(total=2000.0, available=20.0, gpus=[(143771 * 2 ** 20, 143000 * 2 ** 20)])  # host RAM is not the pool
    p = params(tensor_parallel_size=1, gpu_memory_utilization=0.95, max_model_len=32768, nodes=["spark-1"])
    c = fit(p, head(h200))["spark-1"]
    assert c.status == PASS and "GPU 140.4 GiB, 139.6 free" in c.observed and "Ray" not in c.observed
    short = params(tensor_parallel_size=1, max_model_len=32768, nodes=["spark-1"])
    assert fit(short, head(h200))["spark-1"].status == FAIL  # 0.7 of 140.4 GiB: 98.3 for 116.5 of weights


def test_without_the_model_on_the_head_01_estimates_from_size_gb():
    """model.size_gb (GB) stands in for the checkpoint until 03 brings it; without config.json no
    KV cache is counted, and the row says so."""
    absent = {**mem(), "model": "absent"}
    rows = fit(params(model={"size_gb": 125}), absent, mem())
    assert [c.status for c in rows.values()] == [PASS, PASS]
    c = rows["spark-2"]
    assert c.observed.startswith("FITS: weights 58.2 + KV 0.0 (262144 tokens)")
    assert "an estimate: model.size_gb" in c.observed
    one = params(tensor_parallel_size=1, gpu_memory_utilization=0.9, nodes=["spark-1"],
                 model={"size_gb": 125})
    c = fit(one, absent)["spark-1"]
    assert c.status == FAIL and "weights 116.4" in c.observed and "estimate" in c.observed and "more nodes" in c.remedy


def test_without_the_model_on_the_head_the_fit_is_skipped_with_the_reason():
    absent = {**mem(), "model": "absent"}
    rows = memfit.checks(params(model={"size_gb": None}), {"spark-1": absent, "spark-2": mem()})
    assert [(c.node, c.status) for c in rows] == [("spark-1", SKIP)]
    assert "not on the head yet" in rows[0].observed and "05" in rows[0].observed
    no_weights = {**mem(), "model": "present", "weights": None, "config": QWEN35}
    assert "size is unknown" in memfit.checks(params(), {"spark-1": no_weights})[0].observed
    assert memfit.checks(params(), {"spark-2": mem()}) == []  # the head did not answer: said elsewhere
    unreachable = memfit.checks(params(), {"spark-1": head(), "spark-2": "ssh: connection refused"})
    assert [c.status for c in unreachable] == [PASS, FAIL] and "connection refused" in unreachable[1].observed


def test_vllm_for_cpu_fits_against_available_memory():
    """The lab: runtime.gpus false, the KV cache in VLLM_CPU_KVCACHE_SPACE."""
    data = yaml.safe_load(LAB.read_text())
    p = validate(data)
    tiny = {"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": "bfloat16"}
    c = fit(p, head(mem(total=23.5, available=15.0), 232_000, tiny), mem(total=23.5, available=15.0))["spark-2"]
    assert c.status == PASS and "KV 1.0 (2048 tokens) + runtime 1.0" in c.observed and "MemAvailable" in c.expected
    data["serving"]["max_model_len"] = 100_000_000
    c = fit(validate(data), head(mem(available=15.0), 232_000, tiny))["spark-1"]
    assert c.status == FAIL and "max_model_len" in c.remedy


# --------------------------------------------------------------------------- the node scripts

def memfit_sh(model):
    out = subprocess.run(["bash", str(SCRIPTS / "memfit.sh"), str(model)], capture_output=True, text=True,
                         check=True).stdout
    return memfit.parse(parse_sections(out))


def test_memfit_script_on_this_machine(tmp_path):
    model = tmp_path / "m"
    (model / ".cache").mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN35))
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 125_000_000_000}, "weight_map": {"a": "x.safetensors"}}, indent=2))
    (model / "x.safetensors").write_bytes(b"\0" * 1000)
    (model / ".cache" / "y.safetensors").write_bytes(b"\0" * 5)  # huggingface_hub's, not the model's
    rep = memfit_sh(model)
    assert rep["model"] == "present" and rep["weights"] == {"index_total_size": 125_000_000_000,
                                                             "safetensors_bytes": 1000}
    assert rep["config"] == QWEN35
    assert set(rep["meminfo"]) == {"MemTotal", "MemFree", "MemAvailable", "Cached"}
    assert 0 < rep["meminfo"]["MemAvailable"] <= rep["meminfo"]["MemTotal"]
    assert rep["gpus"] == []  # no nvidia-smi here (GB10's "[N/A], [N/A]" reads the same: below)
    # a worker is asked for its memory only; an absent model folder says so
    assert memfit.node_script(params(), params().nodes[1]).args == ("",)
    assert memfit.node_script(params(), params().head).args == ("/models/tiny-qwen3",)
    gone = memfit.parse(parse_sections("@@ memfit meminfo\nMemTotal: 10 kB\n@@ memfit gpus\n[N/A], [N/A]\n"
                                       "@@ memfit weights\nabsent\n@@ memfit config\nabsent\n"))
    assert gone == {"meminfo": {"MemTotal": 10240}, "gpus": [], "weights": None, "config": None, "model": "absent"}
    assert memfit.parse({"memfit gpus": "143771, 143000"})["gpus"] == [(143771 * 2 ** 20, 143000 * 2 ** 20)]


def test_meminfo_lines_in_bytes():
    text = "MemTotal:       127601131 kB\nHugePages_Total:       0\nMemAvailable: 121475891 kB\nnot meminfo\n"
    assert parse_meminfo(text) == {"MemTotal": 127601131 * 1024, "HugePages_Total": 0,
                                   "MemAvailable": 121475891 * 1024}


def test_memfit_script_follows_links_and_survives_find_errors(tmp_path):
    """A model folder that is a link, the Hugging Face cache's snapshot files (links to its blobs)
    and a link loop (find reports it and exits 1: the script goes on, under pipefail)."""
    cache = tmp_path / "hub" / "models--Qwen--q"
    (cache / "blobs").mkdir(parents=True)
    (cache / "blobs" / "abc").write_bytes(b"\0" * 700)
    snapshot = cache / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "model-00001.safetensors").symlink_to("../../blobs/abc")
    (snapshot / "config.json").write_text(json.dumps(QWEN35))
    (snapshot / "loop").symlink_to(".")
    (snapshot / "dangling.safetensors").symlink_to("../../blobs/gone")
    assert memfit_sh(snapshot)["weights"] == {"safetensors_bytes": 700}
    linked = tmp_path / "models" / "q"
    linked.parent.mkdir()
    linked.symlink_to(snapshot)
    rep = memfit_sh(linked)
    assert rep["weights"] == {"safetensors_bytes": 700} and rep["config"] == QWEN35


def test_the_preflight_bundle_carries_the_memory_section():
    p = params()
    parts = [dict(preflight.collect.node_bundle(p, n).parts) for n in p.nodes]
    assert parts[0]["memfit"].args == (p.model.path,) and parts[1]["memfit"].args == ("",)
    report = preflight.collect.parse("@@ smi\nnvidia-smi unavailable\n@@ memfit\n@@ memfit meminfo\nMemTotal: 1024 kB\n")
    assert report["memory"]["meminfo"] == {"MemTotal": 1024 ** 2}


MEMINFO = "MemTotal: 127601131 kB\nMemFree: 43536384 kB\nMemAvailable: 121475891 kB\nCached: 76167168 kB\n"


def fake_proc(tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "sys" / "vm" / "drop_caches").write_text("")
    (proc / "meminfo").write_text(MEMINFO)
    return proc


def drop_sh(proc, path=None):
    env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}"} if path else None
    return subprocess.run(["bash", str(SCRIPTS / "drop_page_cache.sh"), str(proc)], capture_output=True,
                          text=True, env=env)


def fake_tools(tmp_path, sudo_body):
    """`id` saying uid 1000 (alice), so the script takes its sudo path, and a `sudo` that records
    its arguments, then does SUDO_BODY."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "id").write_text('#!/bin/sh\ncase "$1" in -u) echo 1000 ;; -un) echo alice ;; esac\n')
    (bin_ / "sudo").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > "{tmp_path}/sudo-args"\n{sudo_body}\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    return bin_


@pytest.mark.skipif(os.geteuid() != 0, reason="writes the proc folder's drop_caches as root")
def test_drop_page_cache_script_as_root_against_a_proc_folder_of_its_own(tmp_path):
    proc = fake_proc(tmp_path)
    r = drop_sh(proc)
    assert r.returncode == 0, r.stderr
    assert (proc / "sys" / "vm" / "drop_caches").read_text() == "1\n"
    seen, status, sudoers = memfit.parse_drop(r.stdout)
    assert status == "dropped" and not sudoers
    assert seen["before"] == {"MemTotal": 127601131 * 1024, "MemFree": 43536384 * 1024,
                              "MemAvailable": 121475891 * 1024, "Cached": 76167168 * 1024}
    c = memfit.dropped("spark-1", Result("spark-1", "drop", 0, r.stdout))
    assert c.status == PASS and "before: MemAvailable 115.8 GiB, MemFree 41.5 GiB, Cached 72.6 GiB" in c.observed


def test_drop_page_cache_through_sudo_runs_the_command_the_sudoers_line_allows(tmp_path):
    """sudoers matches arguments exactly: the script runs `sudo -n tee PROC/sys/vm/drop_caches`,
    nothing more (no `--`), which with /proc is the command of the sudoers line it recommends."""
    proc = fake_proc(tmp_path)
    bin_ = fake_tools(tmp_path, 'shift; exec "$@"')  # past -n: this user runs tee itself
    r = drop_sh(proc, bin_)
    assert r.returncode == 0, r.stderr
    args = (tmp_path / "sudo-args").read_text().splitlines()
    assert args == ["-n", "tee", f"{proc}/sys/vm/drop_caches"]
    allowed = memfit.SUDOERS.split("NOPASSWD: ")[1].split()
    assert allowed == ["/usr/bin/tee", "/proc/sys/vm/drop_caches"]
    assert [Path(allowed[0]).name, allowed[1].replace("/proc", str(proc), 1)] == args[1:]
    assert (proc / "sys" / "vm" / "drop_caches").read_text() == "1\n"
    assert memfit.parse_drop(r.stdout)[1:] == ("dropped", "")


def test_a_refused_drop_is_a_warning_with_the_exact_sudoers_line(tmp_path):
    proc = fake_proc(tmp_path)
    bin_ = fake_tools(tmp_path, 'echo "sudo: a password is required" >&2; exit 1')
    r = drop_sh(proc, bin_)
    assert r.returncode == 0, r.stderr
    assert (proc / "sys" / "vm" / "drop_caches").read_text() == ""
    seen, status, sudoers = memfit.parse_drop(r.stdout)
    assert status == "refused: sudo: a password is required"
    assert sudoers == "alice ALL=(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches"
    c = memfit.dropped("spark-2", Result("spark-2", "drop", 0, r.stdout))
    assert c.status == WARN and c.observed.startswith("not dropped: refused: sudo: a password is required")
    assert "Cached 72.6 GiB" in c.observed
    assert "`alice ALL=(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches` in a file of /etc/sudoers.d" in c.remedy
    lost = memfit.dropped("spark-2", Result("spark-2", "drop", None, error="ssh: timed out"))
    assert lost.status == WARN and "ssh: timed out" in lost.observed and memfit.SUDOERS in lost.remedy


def test_the_drop_script_takes_only_an_absolute_proc_folder(tmp_path):
    for bad in ("proc", "-rf"):
        r = subprocess.run(["bash", str(SCRIPTS / "drop_page_cache.sh"), bad], capture_output=True, text=True,
                           cwd=tmp_path)
        assert r.returncode == 2 and memfit.parse_drop(r.stdout)[1] == "refused: PROC must be an absolute path"


# ------------------------------------------------- 05's gate: is vLLM running, and the drop before it

class FakeCluster:
    """The serving nodes answer the drop (dropped) and memfit.sh (MEMFIT by node)."""

    def __init__(self, memfit_out):
        self.memfit_out, self.ran = memfit_out, []

    def run(self, cmd, nodes, **kw):
        what = "memfit" if callable(cmd) else "drop"
        self.ran.append(what)
        out = {n.name: self.memfit_out[n.name] if what == "memfit" else
               "@@ before\n" + MEMINFO + "@@ after\n" + MEMINFO + "@@ status\ndropped\n" for n in nodes}
        return Results({name: Result(name, what, 0, o) for name, o in out.items()})


def memfit_output(path=None):
    meminfo = "@@ memfit meminfo\nMemTotal: 127601131 kB\nMemFree: 115000000 kB\nMemAvailable: 120000000 kB\n"
    if path is None:
        return meminfo
    return (meminfo + "@@ memfit weights\nindex_total_size=125000000000\n@@ memfit config\n"
            + json.dumps(QWEN35) + "\n")


@pytest.mark.parametrize("status", ["exited", "running"])
def test_05_drops_the_cache_after_a_vllm_that_died_but_not_under_one_that_runs(tmp_path, monkeypatch, status):
    """mp: a serving container the OOM killer ended is listed by `docker ps -a` but holds no
    memory: the cache is dropped and vLLM's start rule judged; a running one keeps both from it.
    The node states are read once, by the gate, and handed to serve()."""
    p = params(executor="mp", drop_page_cache=True, max_model_len=32768)
    states = {n.name: NodeState(containers={serving_container(p): (status, "fp")}) for n in p.nodes}
    assert what_runs(p, None, states, {n.name: "fp" for n in p.nodes})[0]  # serve() replaces either
    assert vllm_running(p, None, states) == (status == "running")
    monkeypatch.setattr(serve_step, "node_states", lambda *a: states)
    launched = []
    monkeypatch.setattr(serve_step, "serve", lambda *a, **k: launched.append(k) or Deployment())
    cluster = FakeCluster({"spark-1": memfit_output(p.model.path), "spark-2": memfit_output()})
    ctx = notebook.Context(p, "test", tmp_path / "run", serve_step)
    ctx.__dict__["cluster"] = cluster  # cached_property: this fake instead of SSH
    ctx.hold = lambda: None  # no deployment lock on nodes that do not exist
    ctx.run()
    rows = [(c.check, c.node, c.status) for c in ctx.gated["memory"]]
    fits = [c for c in ctx.gated["memory"] if c.check == "memory fit"]
    assert launched and launched[0]["states"] is states
    if status == "exited":
        assert cluster.ran == ["drop", "memfit"]
        assert rows[:2] == [("page cache", "spark-1", PASS), ("page cache", "spark-2", PASS)]
        assert all(c.status == PASS and "judged when it starts" not in c.observed for c in fits), fits
    else:
        assert cluster.ran == ["memfit"] and rows[0] == ("page cache", "spark-1", SKIP)
        assert all("vLLM runs now: its start rule is judged when it starts" in c.observed for c in fits), fits


# ------------------------------------------------------------------ 05's gate, on this machine

def test_05_fails_before_anything_launches_when_the_model_does_not_fit(tmp_path, monkeypatch):
    """This machine as the one serving node, a model of 10 TB: the gate fails 05 with the numbers
    and serve() is never called."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN35))
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 10 ** 13}}))
    data = yaml.safe_load((ROOT / "parameters" / "localhost.yaml").read_text())
    data["name"] = f"memfit-{os.getpid()}"
    data["model"]["path"] = str(model)
    data["serving"].update(drop_page_cache=False, max_model_len=4096)
    data["expectations"]["gpus_per_node"] = 1
    p = validate(data)
    launched = []
    monkeypatch.setattr(serve_step, "serve", lambda *a, **k: launched.append(a) or Deployment())
    ctx = notebook.Context(p, "test", tmp_path / "run", serve_step)
    with pytest.raises(CheckFailed):
        ctx.run()
    assert launched == []
    saved = json.loads((tmp_path / "run" / "verdicts" / "05_serve.json").read_text())["checks"]
    row = next(c for c in saved if c["check"] == "memory fit")
    assert row["status"] == "FAIL" and row["observed"].startswith("DOES NOT FIT: weights 9313.2")
    assert "more nodes" in row["remedy"]
    # a model that fits goes on to serve()
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1000}}))
    data["runtime"]["gpus"] = False
    ctx = notebook.Context(validate(data), "test", tmp_path / "run2", serve_step)
    try:
        ctx.run()
    finally:
        ctx.release()
        shutil.rmtree(workdir(p, p.head), ignore_errors=True)
    assert len(launched) == 1
    assert [(c.check, c.status) for c in ctx.gated["memory"]] == [("memory fit", PASS)], ctx.gated


# ------------------------------------------------------------------------------------ on the lab

def test_the_lab_model_fits_in_01(lab, params):
    pf = preflight.gather(params, Cluster.from_params(params))
    rows = [c for c in preflight.checks(params, pf) if c.check == "memory fit"]
    assert [(c.node, c.status) for c in rows] == [("spark-1", PASS), ("spark-2", PASS)], rows
    assert all(c.observed.startswith("FITS: weights 0.0 + KV 1.0 (2048 tokens)") for c in rows), rows


def test_a_max_model_len_that_cannot_fit_fails_05_before_launch(lab, params, cluster, tmp_path):
    teardown(params, cluster, tmp_path)  # nothing serving that would be kept
    data = lab_params(2)
    data["serving"]["max_model_len"] = 100_000_000  # 2 layers x 1 KV head x 64 x 2 x 2 bytes: 48 GiB a rank
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(data))
    huge = load(path)
    ctx = notebook.Context(huge, "test", tmp_path / "run", serve_step)
    with pytest.raises(CheckFailed):
        ctx.run()
    saved = json.loads((tmp_path / "run" / "verdicts" / "05_serve.json").read_text())["checks"]
    rows = {c["node"]: c for c in saved if c["check"] == "memory fit"}
    assert set(rows) == {"spark-1", "spark-2"} and all(c["status"] == "FAIL" for c in rows.values()), rows
    assert all("KV 47.7 (100000000 tokens)" in c["observed"] and "max_model_len" in c["remedy"]
               for c in rows.values()), rows
    assert serving_fingerprint(huge, cluster) is None  # no vllm serve in the head's Ray container
    assert not [n for n, s in node_states(huge, cluster).items() if serving_container(huge) in s.containers]
