# %% [markdown]
# # 05 · vLLM across the nodes
#
# Starts `vllm serve` over every node and waits until the OpenAI-compatible endpoint answers.
#
# - **Know the image first.** The vLLM version, Ray, the model's architecture and every configured
#   `vllm serve` option are read from the image on the head, with its GPU flags: an unknown option or
#   an unsupported architecture fails here in seconds, naming it, instead of minutes later on every
#   node.
# - **Memory, before anything launches:** every serving node's share of the weights, one sequence's
#   KV cache, the runtime and Ray's store against its free memory, as the image's vLLM checks it at
#   start (DOES NOT FIT ends the step with the numbers); with `serving.drop_page_cache: true` the
#   nodes' page cache (the model 03 copied) is dropped first and reported.
# - **Executor `ray`:** `vllm serve --distributed-executor-backend ray` inside the head's Ray
#   container (04). **Executor `mp`:** one `vllm serve` container per node, `--nnodes/--node-rank`,
#   the workers `--headless` and started first.
# - **Waiting** shows every node's latest log line. When vLLM does not come up (timeout, a container
#   that dies), every node's logs are saved in the run folder, known failure signatures are matched
#   (NCCL timeout, out of memory, port in use, model not found, unsupported attention, CUDA graph
#   capture), and the cell fails naming the cause, the node and the remedy; nothing is left running.
# - **Idempotent:** a healthy deployment started with the same parameters is kept; changed parameters
#   restart it cleanly. The Hugging Face token, when set, reaches the containers through a mode-600
#   file removed once they run; it never appears in a command, a log or this notebook.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook import serving
from sparkbook.record import expiry
from sparkbook.steps import serve as step

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
# ## The image

# %%
info = serving.inspect_image(ctx.params, ctx.cluster, ctx.run_dir)
ctx.gate(serving.image_checks(ctx.params, info), key="image")
serving.image_table(info)

# %% [markdown]
# ## The commands, to rerun by hand (secrets masked)

# %%
serving.commands_table(ctx.params)

# %% [markdown]
# ## Start and wait

# %%
outcome = ctx.run()
step.table(outcome)

# %% [markdown]
# ## Every address the containers listen on
#
# vLLM's API on `serving.bind` (by default the head's management address, which this machine
# reaches); with no `serving.api_key_env` and an address beyond loopback, the verdict warns that
# anyone who reaches it can use the model.

# %%
step.listeners_table(ctx.params, outcome)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 34 s; four nodes: 49 s. On two DGX Sparks, a public vLLM
# 0.16.1rc1 log of Qwen3.5-122B-A10B-FP8 at tensor parallel 2 with Ray (kept as
# `../shared/field-samples/vllm-ray-head-startup-1.txt`; source:
# https://github.com/tom-doerr/llm/blob/162c6ec5ff829f37b0ceca7869cd30e54c35c89a/crash-logs/20260313_004209/spark2.log):
# loading the weights took 69 s on each node, CUDA graph capture 69 s, the engine's whole
# initialisation 105 s, and about 4 min 20 s passed from vLLM's start to its API server listening.
#
# **A hang.** While vLLM starts, the table shows each node's phase (Ray placement, distributed init,
# weights, compile, KV cache, graph capture, API) and its latest log line. When no node logs a new
# line or uses CPU in vLLM's workers for `serving.stall_timeout` (600 s on the pair, 60 s in the lab),
# the step calls a stall, naming the phase, the node furthest behind and the likely cause; the whole
# start-up is limited to `serving.startup_timeout` (2400 s on the pair, 300 s in the lab). Then every
# node's logs are saved and what was started is stopped.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/05_serve.json` (every check); `serving.json` (what was started, the workers per node, the
# phase each reached), `image_inspection.json`, and on a stall, a timeout or a dead container every
# node's logs (`docker logs`, vLLM's log, `ray status`, processes) in `logs/<node>/`.

# %% [markdown]
# ## Verdict
#
# The endpoint answers `/health` and lists the served model; otherwise, the cause per node.

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [06_smoke_test.ipynb](06_smoke_test.ipynb): does the endpoint behave like the OpenAI API?
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/05_serve.json` (every check), `serving.json` (what was started, the
#   workers per node, the phase each reached), `image_inspection.json`, and on a stall, a timeout or a
#   dead container every node's logs (`docker logs`, vLLM's log, `ray status`, processes) in
#   `logs/<node>/`; with `sparkbook run`, the executed notebook `05_serve.ipynb` and
#   `logs/kernel-05_serve.log` beside it.
# - **The logs**: the verdict names the cause found in them; `sparkbook diagnose
#   outputs/<run>/logs/*/*.log` gives every known failure with its evidence line.
# - **The usual causes**: the Ray cluster not up ([04_ray_cluster.ipynb](04_ray_cluster.ipynb)), the
#   fabric ([02_collectives.ipynb](02_collectives.ipynb), [01_preflight.ipynb](01_preflight.ipynb)),
#   the model or image differing on a node ([03_distribute_image.ipynb](03_distribute_image.ipynb)),
#   memory held by an earlier deployment ([08_teardown.ipynb](08_teardown.ipynb)).
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
