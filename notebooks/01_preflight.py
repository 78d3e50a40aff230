# %% [markdown]
# # 01 · Preflight
#
# Every multi-node failure we know of, checked on every node at once, before anything is launched.
# A vLLM deployment across Sparks that starts with a wrong MTU, a rail down, a stale engine holding
# memory or a worker with another image does not fail at once: it hangs in NCCL initialisation or
# fails minutes later on one node. Here each of those is a row with what was seen, what was expected
# and the remedy.
#
# What is checked is the table below the setup cell, in the verdict's order. `sparkbook preflight`
# runs the same checks from a terminal.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook.steps import preflight as step

ctx = sb.notebook.start(globals(), step)
step.what_is_checked()

# %% [markdown]
# ## Gather
#
# One script per node, one SSH round trip each, all nodes in parallel; then one short round trip
# for the clocks, and one in which every node listens briefly on its fabric address and connects to
# every other node's serving ports.

# %%
outcome = ctx.run()
step.table(outcome)

# %% [markdown]
# ## Parity across nodes
#
# What must match on every node, side by side: a difference is marked, with what such a mismatch
# does (and where owners reported it). The verdict below judges each of these facts in its own row.

# %%
step.parity(ctx, outcome)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 2.1 s for the notebook. The checks alone took 0.9 s on 2 lab
# nodes and 2.3 s on 8 (first run, `benchmarks/results/preflight_scale-lab-2026-11-30.txt`).
#
# **A hang.** One script per node (cut after at most 60 s), one round trip for the clocks (10 s), one
# for the TCP probes between the nodes. A node that stops answering is named unreachable; a port a
# firewall drops shows as a `tcp ports` row, not as a hang.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/01_preflight.json` (every check); `preflight.json` (each node's raw report: every tool's
# output as parsed).

# %% [markdown]
# ## Verdict
#
# FAIL rows stop the runbook here, each with its remedy. WARN rows are worth a look but do not stop
# it: an image that is only on the head is what the next step, image distribution, is for.

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [02_collectives.ipynb](02_collectives.ipynb): an all-reduce across every node inside the serving
# image.
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/01_preflight.json` (every check), `preflight.json` (each node's raw
#   report: every tool's output as parsed); with `sparkbook run`, the executed notebook
#   `01_preflight.ipynb` and `logs/kernel-01_preflight.log` beside it.
# - **The usual causes**: a rail down or at the wrong MTU (the `rail *` and `path mtu` rows name the
#   interface and the command), a stale vLLM or container ([08_teardown.ipynb](08_teardown.ipynb)
#   removes sparkbook's own), an image or model only on the head (a WARN:
#   [03_distribute_image.ipynb](03_distribute_image.ipynb) copies them). `sparkbook preflight -p FILE`
#   runs the same checks in a terminal.
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
