# %% [markdown]
# # 04 · Ray cluster
#
# With the Ray executor, vLLM places one worker per GPU across the nodes through a Ray cluster: a Ray
# head on the head node, every other node joining it **on the fabric address**, so that Ray, vLLM
# and NCCL all bind the fast rails and not the management network. Each node runs one container of
# the serving image with what multi-node serving needs (host network and IPC, GPUs, RDMA devices,
# the fabric interfaces in `NCCL_SOCKET_IFNAME` and friends, Ray's memory monitor off and its object
# store capped: on GB10 that memory is the model's).
#
# The cluster is checked, not assumed: every node must appear in Ray with its GPUs (CPUs in the lab),
# and a missing node is named. With `serving.executor: mp` (the lab, whose vLLM for CPU refuses Ray)
# the cluster is still formed and checked, then stopped, since serving does not use it.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook import serving
from sparkbook.steps import ray_cluster as step

ctx = sb.notebook.start(globals(), step)

# %% [markdown]
# ## The image
#
# Ray must be in the serving image (NVIDIA's NGC vLLM image lacks it): read from the image itself,
# in seconds, before anything starts.

# %%
info = serving.inspect_image(ctx.params, ctx.cluster, ctx.run_dir)
ctx.gate(serving.image_checks(ctx.params, info, need_ray=True), key="image")
serving.image_table(info)

# %% [markdown]
# ## Start and check
#
# The exact commands, to rerun by hand; then the cluster as Ray reports it. A cluster that is already
# up, complete and started with the same parameters is kept as it is.

# %%
serving.commands_table(ctx.params, ray_only=True)

# %%
outcome = ctx.run()
print(outcome.status_text)
step.table(outcome)

# %% [markdown]
# ## Every address the containers listen on
#
# The dashboard and its Jobs API on the head's loopback only (an SSH tunnel reaches them:
# `ssh -L 8265:127.0.0.1:8265 HEAD`), Ray's GCS on the head's fabric address, and whatever Ray binds
# besides. The verdict names a socket on every interface: a FAIL where sparkbook chose the address,
# a WARN where Ray offers no choice.

# %%
step.listeners_table(ctx.params, outcome)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 24 s.
#
# **A hang.** The Ray containers start on every node, then the step waits up to 180 s for every node
# to join; a node still missing then is named, every node's Ray log is saved and the containers are
# stopped, so nothing half-formed stays up.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/04_ray_cluster.json` (every check); `image_inspection.json` (what the image holds), and on
# a failure every node's container logs and `ray status` in `logs/<node>/`.

# %% [markdown]
# ## Verdict
#
# Every node in the Ray cluster, with its GPUs.

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [05_serve.ipynb](05_serve.ipynb): vLLM across the nodes.
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/04_ray_cluster.json` (every check), `image_inspection.json` (what
#   the image holds), and on a failure every node's container logs and `ray status` in `logs/<node>/`;
#   with `sparkbook run`, the executed notebook `04_ray_cluster.ipynb` and
#   `logs/kernel-04_ray_cluster.log` beside it.
# - **The logs**: `sparkbook diagnose outputs/<run>/logs/*/*.log` names known Ray failures (a node
#   marked dead, versions that differ, an unreachable head).
# - **The usual causes**: the worker cannot reach the head's fabric address on the Ray port (a
#   firewall, the rail's address): [01_preflight.ipynb](01_preflight.ipynb); different images on the
#   nodes: [03_distribute_image.ipynb](03_distribute_image.ipynb); leftovers of an earlier deployment:
#   [08_teardown.ipynb](08_teardown.ipynb).
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
