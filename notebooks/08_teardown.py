# %% [markdown]
# # 08 · Teardown
#
# Stops vLLM, Ray and every sparkbook container on every node, after saving their logs into the run
# folder (`logs/<node>/`). Then it checks that no sparkbook container is left and nothing listens on
# the configured ports, and says what it removed. Safe to run at any time, and twice.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook.steps import teardown as step

ctx = sb.notebook.start(globals(), step)

# %%
outcome = ctx.run()
step.table(outcome)

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 3.5 s.
#
# **A hang.** Every node's logs are saved first (60 s at most), then the containers are removed (120 s
# at most per node), then the ports are given up to 30 s to close. A node that does not answer is
# named unreachable.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/08_teardown.json` (every check); `teardown.json` (what was removed and what is left, by
# node) and every container's log in `logs/<node>/`.

# %% [markdown]
# ## Verdict

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# The whole run in one page: `report.html` in the run folder (`sparkbook report outputs/<run>/`
# rebuilds it); `sparkbook compare outputs/<run-a>/ outputs/<run-b>/` sets two runs side by side; the
# front page [index.ipynb](index.ipynb) shows every step's state and runs one step or the rest.
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/08_teardown.json` (every check), `teardown.json` (what was removed
#   and what is left, by node) and every container's log in `logs/<node>/`; with `sparkbook run`, the
#   executed notebook `08_teardown.ipynb` and `logs/kernel-08_teardown.log` beside it.
# - **The usual causes**: a container left (its row gives the `docker rm -f` command), a process of
#   something else on a configured port (`ss -ltnp` on the node names it), an unreachable node
#   ([01_preflight.ipynb](01_preflight.ipynb)). Running this notebook again is safe.
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
