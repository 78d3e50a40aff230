# %% [markdown]
# # 03 · Image and model distribution
#
# Every node must run the **identical** image and load the **identical** model: a tensor-parallel
# group whose members differ in vLLM, NCCL or a config file fails in ways that are slow to diagnose.
# Serving images are 20-35 GB, so this step sends only what is missing:
#
# - **The image** streams from the head straight into each worker's `docker load` over SSH on the
#   fabric: no file on either side, one read of the image feeding every worker (the head feeds
#   `distribution.parallel` of them, each of those passes it on to as many more), which comes
#   straight from Docker's layer store (no `docker save` copying everything into a temporary folder
#   first). Each worker's stream leaves out the layers it already holds, so a new nightly that
#   shares its base layers costs only its new layers. zstd compresses the stream when it is faster
#   than the pipe (`distribution.compress`). With `distribution.source: registry` every node pulls
#   instead.
# - **The model from the hub** (`model.source: hf`): the head first downloads `model.name` at
#   `model.revision`, resumably, each file checked against the hub's hash, the token never shown.
# - **The model**: the manifest preflight uses (names, sizes, hashes) is compared with the head's;
#   rsync over the fabric copies only the differing files, resumably (`distribution.model_sync`
#   turns this off where the model lives on shared storage).

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook.steps import distribute as step

ctx = sb.notebook.start(globals(), step)

# %% [markdown]
# ## Survey, image, model
#
# One call does the whole step, showing each copy's progress while it runs: it surveys every node,
# streams the image where it differs from the head's, then copies the model files that differ.
# The sections below show what each part found and did.

# %%
outcome = ctx.run()

# %% [markdown]
# ## What every node holds
#
# The configured image's ID, the Docker version and image store (the classic store can load an
# archive without the layers it holds; the containerd store needs them all), how many of the head
# image's layers are already there, and whether zstd is available.

# %%
step.table(outcome)

# %% [markdown]
# ## The image
#
# Nothing is sent where the image ID already matches. Otherwise the table shows, per worker, the
# archive bytes streamed, the bytes on the wire (after zstd), what was left out, and the rate. An
# interrupted copy leaves no half-loaded image under the tag: `docker load` tags only a complete
# image, so running this step again starts over cleanly.

# %%
step.image_copies(outcome)

# %% [markdown]
# ## The model
#
# With `model.source: hf`, the verdict row "model from the hub" says which commit came and how
# much was fetched (nothing, when the head already holds it). Then the differences between each
# worker's model folder and the head's, the files copied, and the manifest compared again
# afterwards.

# %%
step.model_copies(outcome)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 1.6 s when nothing is missing. A copy of the lab's 4.26 GB image
# to a fresh worker: 42.9 s; a new 64 MiB layer: 1.2 s; nothing to send: 0.27 s
# (`benchmarks/results/image_distribution-lab-2026-11-29.txt`). To 3 workers at once on the 4-node
# lab: 129.4 s (`benchmarks/results/image_distribution-lab4-2026-11-30.txt`).
#
# **A hang.** Each copy shows its progress per worker (bytes, rate). A worker whose link or Docker
# hangs takes no data: after 120 s it fails by name, the workers it relays to are named as not
# reached, and the others finish. One copy is limited to `distribution.timeout_s` (3600 s). An
# interrupted image copy leaves no image under the tag; an interrupted model copy resumes where it
# stopped the next time.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/03_distribute_image.json` (every check); `distribution.json` (what each node held, what
# was sent, how long) and `image_transfers.csv` (the image table above).

# %% [markdown]
# ## Verdict
#
# The same image ID on every node, and every worker's model manifest identical to the head's.

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [04_ray_cluster.ipynb](04_ray_cluster.ipynb): a Ray cluster over the fabric (with `serving.executor:
# mp`, formed, checked and stopped).
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/03_distribute_image.json` (every check), `distribution.json` (what
#   each node held, what was sent, how long) and `image_transfers.csv` (the image table above); with
#   `sparkbook run`, the executed notebook `03_distribute_image.ipynb` and
#   `logs/kernel-03_distribute_image.log` beside it.
# - **The usual causes**: head-to-worker SSH over the fabric, a full disk at the Docker root or the
#   model folder, the hub (token, network): the row's remedy says which;
#   [01_preflight.ipynb](01_preflight.ipynb) checks SSH between the nodes and the disks. Run this
#   notebook again: only what is still missing is sent.
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
