# %% [markdown]
# # 02 · Collective communication
#
# Tensor parallelism across nodes is an all-reduce after every layer: if the fabric cannot carry one
# fast, nothing else matters. First each cable is measured on its own, both ways, with perftest;
# then this notebook runs an all-reduce bandwidth sweep across all nodes
# **inside the serving image**, so it tests the very torch and NCCL that vLLM will use: one process
# per GPU, started by torchrun on every node, meeting at the head's fabric address. On GPUs it uses
# NCCL (and reads NCCL's own log to tell whether it really runs over RoCE or fell back to sockets,
# about 8x slower on Sparks); on the lab's CPU nodes it uses gloo over the fabric rails.
#
# A hang is the classic multi-node failure, so the sweep has a hard time limit. If it runs out, every
# node's log is collected, the phase where it stopped is named (rendezvous, communicator init, first
# collective) with its likely cause, and no container or process is left behind.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook.steps import collectives as step

ctx = sb.notebook.start(globals(), step)

# %% [markdown]
# ## The serving image on every node
#
# The sweep runs in the serving image, so every node needs it. Where a worker lacks it, it is
# streamed from the head now (03 verifies the image and the model in full).

# %%
image = step.copy_image(ctx)

# %% [markdown]
# ## Each cable, both ways
#
# A cable can read 200 Gb/s in `ethtool`, its FEC and error counters clean, and carry a tenth of
# that: NVIDIA documents a Spark's ConnectX-7 that initialised degraded at 8-25 Gb/s per rail, and
# an endpoint slow in one direction only. Only traffic shows it. So every pair of nodes on every
# rail is measured with perftest on the hosts (no image needed): `ib_write_bw` from each end to the
# other, then both ways at once (`-b`, the sum), and `ib_write_lat`; disjoint pairs at the same
# time, each rail on its own (a Spark's two rails are the two halves of one port). Each rail's error
# counters (`ethtool -S`, `ethtool -I --show-fec`) are read before and after.
#
# Each link is held to `expectations.rdma_gbps` each way (a Spark's rail: 80 Gb/s, NVIDIA's bar).
# The verdict tells the faults apart: a rail down; slow both ways with clean counters (reboot both
# ends, then a full power removal); slow with counters that rose (the cable or transceiver); one
# direction only (the receiving end's port); and, on a switch, one node whose every link is slow (its
# own cable). The plot shows, per rail, what each node sent to each other node.

# %%
cables = step.measure_cables(ctx)
step.cables_table(ctx, cables)

# %%
step.cables_plot(ctx, cables)

# %% [markdown]
# ## Sweep
#
# Two sweeps in one run of the same ranks (one rendezvous): small messages first, then message sizes
# from `collectives.min_size_mb` to `collectives.max_size_mb`, doubling. Each size is timed as
# nccl-tests times it (the all-reduces issued back to back, one sync, the time divided), so the
# numbers compare with the tables NVIDIA's playbooks and owners publish. For each size: the time of
# one all-reduce, the algorithm bandwidth (bytes / time), the bus bandwidth (algbw × 2(n−1)/n,
# comparable across node counts) and whether every element holds the expected sum.
#
# Bandwidth keeps climbing with the size until the link is full: a Spark pair reaches its plateau
# from 4 GiB, so its parameters sweep that far, and the verdict reads the best of the top three sizes
# (marked in the table and the plot), not the last row alone.

# %%
outcome = ctx.run(image=image, cables=cables)
step.table(outcome)

# %%
step.plot(ctx, outcome)

# %% [markdown]
# ## Small messages
#
# Decode at tensor parallel 2 waits on a small all-reduce after every layer, so its time, not the
# bandwidth, sets the pace of a single stream: tens of microseconds between two Sparks over the
# cable with NCCL. The sweep from `collectives.latency_min_bytes` to `collectives.latency_max_bytes`
# gives the time of one all-reduce per size (`collectives.latency_iters` of them timed together);
# the verdict judges the median up to 8 KiB against `expectations.allreduce_latency_us`, or only
# reports it when that is not set.

# %%
step.latency_table(outcome)

# %%
step.latency_plot(ctx, outcome)

# %% [markdown]
# ## One bad link among many
#
# When the all-reduce across more than two nodes fails or stays below its bar, the same sweep (its
# three largest sizes) runs on every pair of nodes, disjoint pairs at once (beyond eight nodes, the
# nodes are halved first). A node whose every pair is slow while the other pairs are at the bar is
# named: its cable or its switch port. With two nodes, or an all-reduce at its bar, nothing runs here.

# %%
step.pairs_table(ctx, outcome)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 60 s with the image already on both nodes; four nodes: 133 s.
# Each cable's measurement adds about 10 s on two lab nodes (1 s a test) and, on Sparks at 3 s a
# test, about 4 x 5 s per round of disjoint pairs per rail: 40 s for a pair, about 5 min for 8 nodes. A
# worker without the image first gets it streamed (in the lab a 4.26 GB image to a fresh worker took
# 42.9 s, `benchmarks/results/image_distribution-lab-2026-11-29.txt`).
#
# **A hang.** The image copy shows each worker's progress; a worker that takes no data for 120 s fails
# by name and the others finish. The sweep runs under a hard time limit, `collectives.timeout_s` (600
# s by default, 180 s in the lab): when it is reached, the verdict names the phase each rank stopped
# in (rendezvous, started, init done, first collective) and the likely cause of a hang there. Below
# the limit, nothing moves on the page while the ranks work.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/02_collectives.json` (every check); `collectives.json`, `collectives.csv` and
# `collectives_latency.csv` (the sweeps), `rdma.csv` and `rdma.png` (each cable), `collectives.png`,
# `collectives_latency.png`, and every node's log `logs/<node>/collectives.log` (a pair's:
# `collectives-A-B.log`).

# %% [markdown]
# ## Verdict
#
# Each cable against `expectations.rdma_gbps`, with the fault it shows; the bus bandwidth at the
# plateau against `expectations.busbw_gbps` (for a DGX Spark pair, NVIDIA's
# pass bar of 21.875 GB/s over the 200 Gb/s cable), and against what the cables carry (far below it
# with the cables at rate: NCCL uses part of the link); the pairs and the link at fault, where they
# ran; the small-message time against
# `expectations.allreduce_latency_us`, the correctness of the reduced values, and the transport NCCL
# chose on each node. A table from nccl-tests run by hand is judged the same way by
# `sparkbook diagnose FILE`.

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [03_distribute_image.ipynb](03_distribute_image.ipynb): the same image and model files on every
# node.
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/02_collectives.json` (every check), `collectives.json`,
#   `collectives.csv` and `collectives_latency.csv` (the sweeps), `collectives.png`,
#   `collectives_latency.png`, and every node's log `logs/<node>/collectives.log`; with `sparkbook
#   run`, the executed notebook `02_collectives.ipynb` and `logs/kernel-02_collectives.log` beside it.
# - **The logs**: `sparkbook diagnose outputs/<run>/logs/*/collectives.log` names the known NCCL, gloo
#   and torch failures in them with their remedies.
# - **The usual causes**: the rails (MTU, FEC, a firewall on the ports, the wrong
#   `NCCL_SOCKET_IFNAME`): [01_preflight.ipynb](01_preflight.ipynb) checks each; the image missing or
#   different on a node: [03_distribute_image.ipynb](03_distribute_image.ipynb).
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
