# %% [markdown]
# # Day two · the deployment kept serving across crashes and reboots
#
# After [08_teardown.ipynb](08_teardown.ipynb), or instead of it. From a run whose 05 and 06 passed
# (the newest of the deployment's, or `run`), `install` starts every serving node's Ray container
# again as a service: the same arguments, the image pinned by ID (the one 05 and 06 passed on),
# under Docker's restart policy, which brings a container back when it ends and whenever the node's
# Docker daemon starts, at boot. The container's program is a supervisor that orders the start
# across nodes that each come back on their own: a worker joins once the head's Ray answers; the
# head starts `vllm serve` once every node is in Ray, starts it again when it ends or a node
# leaves, and backs off (5 s, doubling up to 60 s). `status` shows the service on every node and
# whether vLLM answers; `remove` takes away this user's service containers of the deployment and
# nothing else. 08 removes them too.
#
# `upgrade` moves the service to the candidate `image` only through a gate: every node keeps the
# image that serves now (`REPO:sparkbook-previous`), the candidate goes under the parameters' tag
# and through 03-07 in a run folder of its own, and is held against the run the service came from:
# no failed step, the same known answers (each difference named), single-user decode and peak
# output throughput at least `min_ratio` of the baseline's. It passes: the service runs the
# candidate. It fails: the tag goes back to the previous image on every node, the service is
# installed again from its run, and 06 verifies it; the verdict says why.
#
# The same as `sparkbook service install|status|remove|upgrade -p FILE`.

# %% tags=["parameters"]
# Parameters: params_file None uses $SPARKBOOK_PARAMS or parameters/lab.yaml.
params_file = None
command = "status"  # install, status, remove or upgrade
run = None  # install, upgrade: the run folder whose 05 and 06 passed (default: the deployment's newest)
image = None  # upgrade: the candidate image, present on the head
min_ratio = 0.9  # upgrade: the candidate's single-user decode and peak throughput, at least this of the baseline's

# %% tags=["hide-input"]
from sparkbook.params import default_params_file
from sparkbook.steps import day_two as step

# %% [markdown]
# ## The service
#
# Installing replaces the deployment's running Ray containers and vllm serve (head first, then the
# workers) and waits until vLLM answers with its model; a service that does not answer within
# `serving.startup_timeout` is removed again. Per node: the container, its state, how often Docker
# restarted it, how often the supervisor started `vllm serve` (the head), and the image it pins.

# %%
service, verdict = step.service_step(params_file or default_params_file(), command, run=run, image=image,
                                     min_ratio=min_ratio)
step.table(service)

# %% [markdown]
# ## Verdict

# %% tags=["hide-input"]
step.conclude(verdict)

# %% [markdown]
# ## Next
#
# [06_smoke_test.ipynb](06_smoke_test.ipynb) and [07_benchmark.ipynb](07_benchmark.ipynb) run on the
# service as on any deployment (05 keeps it: it is what 05 would have started).
#
# ## When it failed
#
# - **Refused before anything changed**: 05 and 06 have not both passed with these parameters, the
#   image's tag names another image than the one they passed on, or another user's service runs.
# - **Not ready**: `docker logs sparkbook-DEPLOYMENT-ray` on the head; the supervisor's lines start
#   with `sparkbook-service:` and say what it waits for (the head's Ray, the nodes in Ray, the
#   engine's restarts).
