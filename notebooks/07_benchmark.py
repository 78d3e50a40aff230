# %% [markdown]
# # 07 · Benchmark
#
# The figures Spark owners compare, measured so that they compare:
#
# - **Single user** at several context depths (`benchmark.context_depths`): prefill and decode
#   tok/s (the reference deployment: about 27 tok/s for one request).
# - **Concurrency sweep**, closed loop (`benchmark.concurrency`): output tok/s, per-user tok/s, TTFT,
#   TPOT, ITL and end-to-end latency at p50/p90/p99, failures.
# - **Request-rate sweep**, open loop with Poisson arrivals, when `benchmark.request_rates` is set.
#
# Token counts come from the server's usage, output lengths are fixed (`ignore_eos`), prompts are
# sized with the server's tokenizer from a fixed seed, warm-up runs first, one connection pool serves
# every request. The client measures its own CPU use and how late it sent requests, and says so when
# it, not the server, was the bottleneck. Results, plots and the comparison with earlier runs of the
# same model (in `outputs/`) and with `benchmark.references` land in the run folder's `benchmark/`.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from IPython.display import display
from sparkbook.record import expiry
from sparkbook.steps import benchmark as step

ctx = sb.notebook.start(globals(), step)

# %% [markdown]
# ## Does 01's preflight still hold?
#
# This step builds on what 01 checked (GPUs, links, addresses, memory, stray processes), and a reboot
# changes all of it. 01's verdict, of this run or the deployment's latest, is refused when a node has
# booted since (its boot ID changed) or when it is older than `expectations.verdicts_hold_h`: run 01
# again. No preflight at all is a warning.

# %%
ctx.gate(expiry.preflight_holds(ctx), key="preflight")

# %% [markdown]
# ## Run
#
# While the levels run, every serving node's rail error counters, GPU clock-event reasons and Xid
# lines are sampled every 5 s (as in 06): a change is a row of the verdict with its time and the
# level it fell in, beside the numbers it may explain. Samples in `health/benchmark.csv`.

# %%
outcome = ctx.run()
step.table(outcome)

# %% [markdown]
# With `benchmark.profile: spark-arena`, the same cells as the leaderboard's own tool prints them
# (nothing without a profile): see **A standard profile** below.

# %%
step.board_table(outcome)

# %% [markdown]
# ## Plots
#
# This run against earlier runs of the same model (dashed) and the reference numbers (dotted).
#
# Last, **what the server saw** (`server.png`, data in `benchmark/server_metrics.csv`): vLLM's
# `/metrics`, sampled about every second during the run (KV cache use, requests running and waiting,
# preemptions), and each serving node's GPU power and SM clock from `nvidia-smi` every few seconds,
# on one time axis with the output throughput; dotted lines mark where each level starts. KV cache
# near 100 % with requests waiting or preemptions rising means the concurrency outgrew the KV cache;
# an SM clock that drops under load on one node points at that node throttling (01's gpu clocks
# check names the reason).

# %%
for fig in step.plots(ctx, outcome).values():
    display(fig)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 32 s; four nodes: 45 s. It grows with the levels asked for
# (`benchmark.context_depths`, `concurrency`, `request_rates`, `requests_per_level`).
#
# **A hang.** The progress shows the level running and its requests done. Each request is limited to
# 600 s; a level whose requests fail is a FAIL row with the server's errors. The server plot
# (`server.png`) shows whether requests were waiting or the KV cache was full.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/07_benchmark.json` (every check); `benchmark/results.json`, `benchmark/levels.csv` (a row
# per level), the plots `benchmark/*.png` and `benchmark/server_metrics.csv` (vLLM's `/metrics`, GPU
# power and clocks), `health/benchmark.csv` (the serving nodes' health samples).

# %% [markdown]
# ## Verdict
#
# Every level completed without failures; the client was not the bottleneck; single-user decode
# speed against the references (below a reference is a warning: a comparison, not a failure).
#
# **Plausibility** (a row per single-user level): decoding one token of one sequence reads every
# active weight and the KV cache so far from memory, so the speed cannot pass tensor-parallel size ×
# `expectations.memory_bandwidth_gbs` ÷ (bytes of the active weights + KV bytes at that context),
# from the model's `config.json` on the head (`sparkbook/bench/ceiling.py`; about 56 tok/s for
# Qwen3.5-122B-A10B-FP8 on two GB10 at 273 GB/s). Above the ceiling is a measurement bug (FAIL;
# with speculative decoding a WARN); below a quarter of it the deployment is held back (WARN: eager
# mode, a wrong parallel layout, throttling); else PASS with the fraction of the ceiling. Without a
# bandwidth in the parameters (the lab): SKIP.
#
# **A standard profile**: `benchmark.profile: spark-arena` runs the grid of the public DGX Spark
# leaderboard (every depth 0-100000 at concurrency 1, 2, 5 and 10, 2048 prompt and 128 output
# tokens) and measures it as the leaderboard does, with llama-benchy 0.4.0's procedure: at a depth
# the context is loaded into the prefix cache first, so only the new tokens are prefilled; the
# server's own sampling, a reply may end at EOS; c requests at once per run. The second table
# gives its figures under its names (`pp2048 @ d4096 (c2)`, `tg128 @ d4096 (c2)`, t/s (total),
# ttfr, est_ppt, e2e_ttft), also in `benchmark/llama-benchy.csv`; the first keeps sparkbook's own
# figures of the same requests (TTFT with nothing taken off, decode over E2E - TTFT). Measured
# against llama-benchy itself on the lab: `benchmarks/bench_vs_llamabenchy.py`.

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [08_teardown.ipynb](08_teardown.ipynb): logs kept, then every sparkbook container off the nodes.
# `sparkbook compare outputs/<run-a>/ outputs/<run-b>/` sets this run against another.
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/07_benchmark.json` (every check), `benchmark/results.json`,
#   `benchmark/levels.csv` (a row per level), the plots `benchmark/*.png` and
#   `benchmark/server_metrics.csv` (vLLM's `/metrics`, GPU power and clocks); with `sparkbook run`,
#   the executed notebook `07_benchmark.ipynb` and `logs/kernel-07_benchmark.log` beside it.
# - **The server's side**: the serving container's log on the head (`docker logs NAME 2>&1 | sparkbook
#   diagnose -` names known failures in it; `docker ps` gives the name).
# - **The usual causes**: the server not up ([05_serve.ipynb](05_serve.ipynb),
#   [06_smoke_test.ipynb](06_smoke_test.ipynb)), a level over `serving.max_model_len`, the client
#   machine too slow (the `load generator` row).
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
