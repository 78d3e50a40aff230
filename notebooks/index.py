# %% [markdown]
# # sparkbook · front page
#
# sparkbook takes GPU nodes (DGX Sparks and others) from "reachable by SSH" to "a model served by vLLM
# across the nodes, verified and measured". Each step is a numbered notebook beside this one; each
# ends in a verdict that says what failed, on which node, what was seen and what to do. This page is
# not numbered, so `sparkbook run` never runs it.
#
# | step | notebook | what it does |
# |---|---|---|
# | day one | [day_one](day_one.ipynb) | before 00, once: the nodes read, the parameters file written, the CX-7 fabric planned and applied under a guard on each node |
# | 00 | [00_inventory](00_inventory.ipynb) | facts of every node; proves each is reachable by SSH |
# | 01 | [01_preflight](01_preflight.ipynb) | every known multi-node failure, before anything starts |
# | 02 | [02_collectives](02_collectives.ipynb) | an all-reduce across the nodes: latency, bandwidth, the transport really used |
# | 03 | [03_distribute_image](03_distribute_image.ipynb) | the same serving image and model files on every node, sending only what is missing |
# | 04 | [04_ray_cluster](04_ray_cluster.ipynb) | a Ray cluster over the fabric |
# | 05 | [05_serve](05_serve.ipynb) | vLLM across the nodes, waited for with every node's start-up phase |
# | 06 | [06_smoke_test](06_smoke_test.ipynb) | the endpoint through the OpenAI client, a burn-in and known answers |
# | 07 | [07_benchmark](07_benchmark.ipynb) | throughput and latency at several depths and concurrencies |
# | 08 | [08_teardown](08_teardown.ipynb) | logs kept, then every sparkbook container removed |
# | day two | [day_two](day_two.ipynb) | after 06 passed: the deployment kept serving as a service across crashes and reboots |
#
# **How to run them.** In order, 00 to 08; any step can be run again. Three ways:
#
# - here: choose the parameters file, pick a step, and *run this step* or *run from here to the end*
#   (`sparkbook run` in the background, its output below the buttons, into the run folder the
#   notebooks opened by hand use: `$SPARKBOOK_RUN_DIR`, else `outputs/interactive-<name>`);
# - open a step's notebook (the links) and run its cells: it reads `$SPARKBOOK_PARAMS`, else
#   `parameters/lab.yaml`;
# - in a terminal: `sparkbook run -p FILE` runs them all into a new run folder and writes its report;
#   `sparkbook status -p FILE` prints this page's table and what runs on the nodes now.
#

# %% [markdown]
# ## Where the deployment stands
#
# The table reads the run folder that the notebooks run by hand use (`$SPARKBOOK_RUN_DIR`, else
# the deployment's newest under `outputs/`: a `sparkbook run` folder, or `outputs/interactive-<name>`): each step passed, failed, interrupted or not run, when, and its last
# verdict. Run the cell again to read it again; *nodes now* asks every node which sparkbook
# containers run there and whether the endpoint answers.

# %% tags=["parameters"]
# Parameters: leave both as None to choose among parameters/*.yaml below (first shown:
# $SPARKBOOK_PARAMS, else parameters/lab.yaml) and read the deployment's newest run folder.
params_file = None
run_dir = None

# %%
from sparkbook.runbook.frontpage import FrontPage

FrontPage(params_file, run_dir).show()
