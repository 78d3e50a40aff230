"""sparkbook's benchmark client against the field's reference, `vllm bench serve`, side by side on the
lab endpoint, on the same load: random prompts, fixed input and output lengths (ignore_eos), the
completions endpoint, max concurrency 1, 8 and 32.

Goals (the benchmark issue): output throughput within 3 %, mean TTFT within 10 %, and sparkbook's
client CPU seconds per output token no more than vllm bench serve's.

Client CPU is compared over the measured run only: vllm bench serve's process CPU between its
"Starting main benchmark run" and its result (read from /proc in the container; its start-up,
imports and local tokenization left out), against the CPU of sparkbook's client loop during the
level (its prompt sizing left out the same way), each divided by the output tokens. Both clients
run alike: in a container of the serving image on the head (`--network host`, the image's Python
and aiohttp, the head's Docker cgroup), reaching vLLM on the address it is bound to
(serving.bind); sparkbook's code is mounted read-only, with this interpreter's site-packages
after the image's for what the image lacks. On this machine the clients share two cores with the
server, whose speed drifts between runs: each level runs as several pairs, the two clients back
to back in alternating order, and the pairs' ratios are compared with the goals as a geometric
mean with its 95 % confidence interval (sparkbook.book.samples.ratio_interval): a goal is met
only when the whole interval lies inside it, which takes as many pairs as the spread demands.
Besides the ratios, each pair keeps what explains them (vllm bench serve with --save-detailed):
per-request E2E and ITL medians, the run's duration against its span (first send to last end),
the idle time between one request's end and the next one's send at concurrency 1, and the
output tokens each side counted.

`--server paced` measures both clients against a fake server of fixed pace instead (the tests'
fake OpenAI server, tests/fake_openai.py, on this machine's end of the lab's management bridge, in
a process of its own: a fixed TTFT and time per token), so that what differs between them is their
own clocks, connection handling and event loop, not the server's speed; the clients still run in
the serving image on the head, and nothing is served on the lab. The server keeps each request's
arrival and first token on the clock both clients read (time.perf_counter, one for the machine),
so each side's mean TTFT is also shown less the server's own: the milliseconds its clock adds.

Needs root and `sparkbook lab up`; brings up what the parameters' path needs, as the runbook
does: 03's image and model on every node (copied where they differ, and kept, as 08 keeps them),
with the Ray executor 04's Ray cluster, then vLLM with 05's serve (each kept if already up).
Leaves the lab as it found it, also when interrupted (Ctrl-C, SIGTERM): what it started (vLLM,
Ray, the reference client's container) is removed as 08 removes it; a deployment that was already
serving stays, and a Ray cluster that was already up stays with vLLM stopped in it.

    .venv/bin/python benchmarks/bench_vs_vllm.py [--input-len 128] [--output-len 128] [--repeat 5]

Where the client runs matters: on the host, sparkbook's client ran on this machine's pyenv-built
Python (0.27-0.32 ms of CPU per token at concurrency 1 against 0.21-0.24 in the image's Debian
Python) and outside the head's cgroup, where its CPU did not come out of the head's share.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sysconfig
import time
from contextlib import contextmanager
from pathlib import Path

from sparkbook.bench import load as bench_load
from sparkbook.book.samples import ratio_interval
from sparkbook.serving.commands import api_bind
from sparkbook.serving.containers import docker_run
from sparkbook.lab import Lab
from sparkbook.lab.nodes import MGMT_NET
from sparkbook.nodes.remote import Cluster
from sparkbook.nodes.workdir import prepare, workdir
from sparkbook.notebook import default_run_dir
from sparkbook.nodes.shell import command_line

LEVELS = ((1, 16), (8, 64), (32, 128))  # (max concurrency, requests)
RATIOS = ("output_tok_s", "mean_ttft_ms", "cpu_ms_per_token")
# What explains the ratios, per side: medians of E2E and ITL, idle between requests (concurrency 1)
DETAILS = ("e2e_p50_ms", "itl_p50_ms", "idle_p50_ms", "span_s", "duration_s", "output_tokens")
# sparkbook's client in the image's Python: the repository first, this interpreter's packages last
BOOT = ("import runpy, sys; f, site, job = sys.argv[1:]; sys.path[:1] = [f.rsplit('/', 2)[0]]; "
        "sys.path.append(site); sys.argv = [f, '--client', job]; runpy.run_path(f, run_name='__main__')")
# Runs vllm bench serve and prints the CPU seconds of its main run (utime + stime from /proc).
CPU = """
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True, bufsize=1)
def cpu():
    with open(f"/proc/{p.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
start = end = None
for line in p.stdout:
    sys.stdout.write(line)
    if start is None and "Starting main benchmark run" in line:
        start = cpu()
    if end is None and "Serving Benchmark Result" in line:
        end = cpu()
code = p.wait()
print("CPU_S", end - start if start is not None and end is not None else -1)
sys.exit(code)
"""


def reference_container(params) -> str:
    return f"sparkbook-{params.name}-bench"


def client_container(params) -> str:
    return f"sparkbook-{params.name}-bench-client"


def api_on_head(params) -> str:
    """vLLM's API as the clients on the head reach it: where it is bound (serving.bind)."""
    return f"http://{api_bind(params)}:{params.ports.api}"


def vllm_bench(params, cluster, url, concurrency, n, input_len, output_len):
    """One `vllm bench serve` run on the head: its result JSON and its CPU seconds."""
    name = f"c{concurrency}-n{n}.json"
    results = f"{workdir(params, params.head)}/bench"
    cmd = ["python3", "-c", CPU, "vllm", "bench", "serve", "--backend", "vllm",
           "--base-url", url, "--endpoint", "/v1/completions",
           "--model", params.model.path, "--tokenizer", params.model.path, "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--ignore-eos",
           "--num-prompts", str(n), "--max-concurrency", str(concurrency), "--request-rate", "inf",
           "--seed", "0", "--temperature", "0", "--disable-tqdm", "--save-result", "--save-detailed",
           "--result-dir", results, "--result-filename", name]
    run = docker_run(params, params.head, reference_container(params), cmd, detach=False, remove=True,
                     mounts=[f"{params.model.path}:{params.model.path}:ro", f"{results}:{results}"])
    r = cluster.run_on(params.head, command_line(["mkdir", "-p", results]) + " && " + command_line(run)
                       + " && " + command_line(["cat", f"{results}/{name}"]), timeout=900)
    if not r.ok:
        raise SystemExit(f"vllm bench serve failed: {r.summary(20)}")
    cpu = float(next(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("CPU_S")))
    return json.loads(r.stdout.strip().splitlines()[-1]), cpu


def ours(params, cluster, url, concurrency, n, input_len, output_len) -> dict:
    """One sparkbook run_load as vllm bench serve runs (this script again, as a client, in a
    container of the serving image on the head): the level as JSON; its client_cpu_s is its
    loop's CPU during the level."""
    here, site = str(Path(__file__).resolve()), sysconfig.get_paths()["purelib"]
    root = str(Path(here).parents[1])
    job = json.dumps({"url": url, "model": params.model.path,
                      "concurrency": concurrency, "n": n, "input_len": input_len, "output_len": output_len})
    run = docker_run(params, params.head, client_container(params), ["python3", "-c", BOOT, here, site, job],
                     detach=False, remove=True, mounts=[f"{root}:{root}:ro", f"{site}:{site}:ro"])
    r = cluster.run_on(params.head, run, timeout=900)
    found = [ln for ln in r.stdout.splitlines() if ln.startswith("LEVEL ")]
    if not r.ok or not found:
        raise SystemExit(f"sparkbook client failed: {r.summary(20)}")
    return json.loads(found[-1][6:])


def client(job: str) -> None:
    j = json.loads(job)
    lv = bench_load.run_load(j["url"], j["model"], prompt_tokens=j["input_len"], output_tokens=j["output_len"],
                        concurrency=j["concurrency"], num_requests=j["n"], seed=0, endpoint="completions",
                        warmup=1, prompt_salt="", progress=False, say=lambda *_: None)
    print("LEVEL " + json.dumps(dataclasses.asdict(lv)))


def details(c: int, starts: list[float], e2e_s: list[float], itl_s: list[float], duration: float,
            tokens: int) -> dict:
    """What explains a side's throughput: E2E and ITL medians (ms), the idle time between one
    request's end and the next send (ms; concurrency 1 only), the span from the first send to the
    last end against the duration the side divides by (s), and the output tokens it counted."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    idle = [(starts[b] - starts[a] - e2e_s[a]) * 1e3 for a, b in zip(order, order[1:])] if c == 1 else []
    return {"e2e_p50_ms": statistics.median(e2e_s) * 1e3, "itl_p50_ms": statistics.median(itl_s) * 1e3,
            "idle_p50_ms": statistics.median(idle) if idle else None,
            "span_s": max(s + e for s, e in zip(starts, e2e_s)) - min(starts), "duration_s": duration,
            "output_tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5, help="back-to-back pairs per level (default: 5)")
    ap.add_argument("--levels", default="1,8,32", help="concurrencies to measure (default: 1,8,32)")
    ap.add_argument("--server", choices=("lab", "paced"), default="lab",
                    help="lab: the lab's vLLM; paced: a fake server of fixed pace (see paced())")
    ap.add_argument("--paced-ttft", type=float, default=0.05, help="the paced server's TTFT (s)")
    ap.add_argument("--paced-itl", type=float, default=0.01, help="the paced server's time per token (s)")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        return client(args.client)
    params = Lab().params()
    mine = [reference_container(params), client_container(params)]
    from labserving import serving  # beside this script (not importable in the client's container)
    if args.server == "lab":
        with serving("bench-vs-vllm", mine) as (lab, params, cluster, run_dir):
            measure(args, params, cluster, run_dir, api_on_head(params))
        return
    with paced(args, params, mine) as (cluster, run_dir, server):
        measure(args, params, cluster, run_dir, server.url, server.served)


@contextmanager
def paced(args, params, containers):
    """The tests' fake OpenAI server (tests/fake_openai.py) on this machine's end of the lab's
    management bridge, in a process of its own: a fixed TTFT, tokens at a fixed pace, as the
    model the clients name. The clients run as against the lab's vLLM (in the serving image on
    the head), so what differs between them is their own measurement, not the server's speed."""
    from labserving import paced_server
    cluster = Cluster.from_params(params)
    run_dir = default_run_dir(params).parent / f"bench-vs-vllm-paced-{time.strftime('%Y%m%dT%H%M%S')}"
    with paced_server(f"{MGMT_NET}.1", params.model.path, args.paced_ttft, args.paced_itl) as server:
        try:
            prepare(params, cluster, [params.head])
            yield cluster, run_dir, server
        finally:
            cluster.run_on(params.head, ["docker", "rm", "-f", *containers], timeout=60)


def server_ttft_ms(served, n: int) -> float | None:
    """The paced server's own mean TTFT (arrival to first token, ms) over the last ``n``
    generations it served since the last call: a client's measured requests, after its warm-up;
    None without a paced server."""
    got = served()[-n:] if served is not None else []
    return statistics.mean(b - a for a, b in got) * 1e3 if got else None


def measure(args, params, cluster, run_dir: Path, url: str, served=None) -> None:
    """The levels, each as --repeat back-to-back pairs; the table, saved in the run folder.
    ``served``: the paced server's record (labserving.Paced.served), so that each side's mean
    TTFT is also shown less the server's own: what the client's clock adds."""
    print("both clients run in a container of the serving image on the head")
    rows = []
    wanted = {int(c) for c in args.levels.split(",")}
    for concurrency, n in [lv for lv in LEVELS if lv[0] in wanted]:
        runs = []
        for i in range(args.repeat):
            # a pair, back to back, in alternating order: slow drift of the server cancels out
            if i % 2 == 0:
                lv = ours(params, cluster, url, concurrency, n, args.input_len, args.output_len)
                ours_server = server_ttft_ms(served, n)
            ref, ref_cpu = vllm_bench(params, cluster, url, concurrency, n, args.input_len, args.output_len)
            ref_server = server_ttft_ms(served, n)
            if i % 2 == 1:
                lv = ours(params, cluster, url, concurrency, n, args.input_len, args.output_len)
                ours_server = server_ttft_ms(served, n)
            pair = {"ours_output_tok_s": lv["output_tok_s"], "vllm_output_tok_s": ref["output_throughput"],
                    "ours_mean_ttft_ms": lv["ttft_ms"]["mean"], "vllm_mean_ttft_ms": ref["mean_ttft_ms"],
                    "ours_cpu_ms_per_token": lv["client_cpu_s"] * 1e3
                    / max((lv["output_tokens_mean"] or 0) * lv["completed"], 1),
                    "vllm_cpu_ms_per_token": ref_cpu * 1e3 / max(ref.get("total_output_tokens")
                                                             or ref["output_throughput"] * ref["duration"], 1),
                    "ours_failures": lv["failures"], "ours_errors": lv["errors"],
                    "vllm_failed": ref.get("failed", 0)}
            for side, server in (("ours", ours_server), ("vllm", ref_server)):
                pair[f"{side}_client_ttft_ms"] = None if server is None else pair[f"{side}_mean_ttft_ms"] - server
            ok = [q for q in lv.pop("requests") if q["ok"]]
            pair.update({f"ours_{k}": v for k, v in details(
                concurrency, [q["sent_s"] for q in ok], [q["e2e_ms"] / 1e3 for q in ok],
                [x / 1e3 for q in ok for x in q["itl_ms"]], lv["duration_s"],
                sum(q["output_tokens"] for q in ok)).items()})
            done = [i for i, e in enumerate(ref["errors"]) if not e]
            pair.update({f"vllm_{k}": v for k, v in details(
                concurrency, [ref["start_times"][i] for i in done], [ref["latencies"][i] for i in done],
                [x for i in done for x in ref["itls"][i]], ref["duration"], ref["total_output_tokens"]).items()})
            for k in RATIOS:
                pair[f"{k}_ratio"] = pair[f"ours_{k}"] / pair[f"vllm_{k}"]
            runs.append(pair)
            print(json.dumps(pair), flush=True)
        row = {"concurrency": concurrency, "requests": n, "runs": runs}
        for k in runs[0]:
            if k.endswith(("tok_s", "ttft_ms", "per_token", "_ratio", *DETAILS)):
                got = [r[k] for r in runs if r[k] is not None]
                row[k] = statistics.median(got) if got else None
        rows.append(row)

    print(f"\nmedians of {args.repeat} back-to-back pairs; ratio = sparkbook / vllm bench serve, the pairs' "
          "ratios' geometric mean [its 95 % confidence interval; '-' below 2 pairs]")
    print(f"{'c':>3}  {'tok/s ours':>10} {'vllm':>7} {'ratio':>18}  {'TTFT ms ours':>12} {'vllm':>7} {'ratio':>18}"
          f"  {'CPU ms/tok ours':>15} {'vllm':>6} {'ratio':>18}")
    for r in rows:
        line = f"{r['concurrency']:>3}"
        for k, width, fmt in zip(RATIOS, (10, 12, 15), (".1f", ".1f", ".3f")):
            ci = ratio_interval([p[f"{k}_ratio"] for p in r["runs"]])
            r[f"{k}_ratio_ci"] = ci
            line += (f"  {r[f'ours_{k}']:>{width}{fmt}} {r[f'vllm_{k}']:>{6 if width == 15 else 7}{fmt}}"
                     + (f" {ci[0]:>6.3f} [{ci[1]:.2f}-{ci[2]:.2f}]" if ci else f" {r[f'{k}_ratio']:>6.3f} [-]"))
        print(line)
    print("goals: throughput ratio within 0.97-1.03, TTFT ratio within 0.90-1.10, CPU ratio <= 1.00; "
          "a goal is shown met only when the whole interval is inside it")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "bench_vs_vllm.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\nwhat explains them (medians of the pairs): per-request E2E and ITL p50 (ms), idle between "
          "requests p50 (ms, c=1), span first send-last end / duration divided by (s), output tokens"
          + ("; TTFT-server: the mean TTFT less the server's own (its arrival to first token), the ms the "
             "client's clock adds" if served is not None else ""))
    f = lambda v, fmt: "-" if v is None else format(v, fmt)
    for r in rows:
        print(f"{r['concurrency']:>3}  " + "   ".join(
            f"{side}: E2E {f(r[f'{side}_e2e_p50_ms'], '.0f')} ITL {f(r[f'{side}_itl_p50_ms'], '.2f')} "
            f"idle {f(r[f'{side}_idle_p50_ms'], '.2f')} span/dur {f(r[f'{side}_span_s'], '.2f')}/"
            f"{f(r[f'{side}_duration_s'], '.2f')} tokens {f(r[f'{side}_output_tokens'], '.0f')}"
            + (f" TTFT-server {f(r[f'{side}_client_ttft_ms'], '.1f')}" if served is not None else "")
            for side in ("ours", "vllm")))
    print(f"saved: {run_dir / 'bench_vs_vllm.json'}")


if __name__ == "__main__":
    main()
