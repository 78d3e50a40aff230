# %% [markdown]
# # 00 · Inventory
#
# What are we working with? This notebook asks every node, all at once, for the facts the later steps
# depend on: host name, OS, kernel, architecture, CPUs, memory, free disk where the model and the
# Docker images will live, the GPU and its driver (from `nvidia-smi`), and the Docker version and
# runtimes.
#
# It is also the first proof that every node is reachable over SSH with host-key checking on. A node
# that cannot be reached is named with the SSH error and the remedy, and the notebook fails: nothing
# later can work without it.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook.steps import inventory as step

ctx = sb.notebook.start(globals(), step)

# %% [markdown]
# ## Facts
#
# One script per node, one SSH round trip each, all nodes in parallel. On GB10 `nvidia-smi` reports
# GPU memory as *not supported*: the GPU shares the system's unified memory, so the memory column is
# what the model can use.

# %%
outcome = ctx.run()
step.table(outcome)

# %% [markdown]
# ## CX-7 ports
#
# Every HCA port of every node, as `sparkbook discover` reads it (one more round trip): cabled or
# not, speed, MTU, PCIe function, addresses and what persists them (an address nothing persists is
# gone at the next reboot). Below the table: where the parameters' rails differ from what is cabled.
# This is information; 01 judges the rails.

# %%
step.ports(ctx)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 1.3 s. One SSH round trip per node, all nodes at once, so it
# grows little with the node count.
#
# **A hang.** Nothing long runs here. A node that does not answer within `ssh.connect_timeout` (10 s
# by default, 5 s in the lab) is named unreachable with the SSH error; a node whose script hangs is
# cut after `ssh.command_timeout`, at most 60 s here.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/00_inventory.json` (every check); `inventory.json` (every node's facts),
# `inventory.csv` (the facts table) and `ports.csv` (the CX-7 ports table).

# %% [markdown]
# ## Verdict
#
# Every node must answer. GPU counts and names that differ from the parameters are warnings here
# (preflight checks them properly), and so are versions that differ between nodes.

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [01_preflight.ipynb](01_preflight.ipynb): every known multi-node failure, checked before anything is
# launched.
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/00_inventory.json` (every check), `inventory.json` (every node's
#   facts) and `inventory.csv` (the table above); with `sparkbook run`, the executed notebook
#   `00_inventory.ipynb` and `logs/kernel-00_inventory.log` beside it.
# - **The usual causes**: SSH (address, user, key, host key in `~/.ssh/known_hosts`): the unreachable
#   row's remedy says which. Run this notebook again once fixed.
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
