# %% [markdown]
# # 06 · Smoke test
#
# Before measuring anything, the endpoint must behave like the OpenAI API that clients expect. Each
# check is one request through the `openai` client and one row of the verdict:
#
# - the model is listed; a chat completion, plain and streamed, with token usage;
# - with a reasoning parser configured, the reasoning arrives apart from the answer. The request asks
#   for thinking and leaves room to finish (`max_tokens` 2048; `ctx.run(reasoning_budget=...)` for a
#   model that thinks at length): reasoning left in the answer, no reasoning, or nothing but reasoning
#   fails; a reasoning that never closed within the budget is a warning, since it proves nothing;
# - tool calling with `tool_choice` `"auto"` and a prompt that needs the tool: the model's call must
#   come back through the configured tool-call parser (`tool_calls`, finish reason `tool_calls`) with
#   arguments valid against the tool's JSON schema. Only `auto` proves that the parser matches the
#   model: a call left in the text fails and names the parser;
# - tool calling with `tool_choice` `"required"`, reported apart: vLLM answers it by guided decoding,
#   and may write and read the call itself, so it can pass with a parser that is not the model's;
# - `max_tokens` and `stop` are honoured; an unknown model gives a clean error, not a hang.
#
# The checks look at the structure of the answers, never their wording: they hold for any model. The
# lab's tiny model is trained on these very prompts (`sparkbook/lab/make_model.py`, prompts in
# `sparkbook/smoke/prompts.py`), so in the lab the tool call and the reasoning are proven for real.

# %% tags=["parameters"]
# Parameters: leave both as None to use $SPARKBOOK_PARAMS or parameters/lab.yaml.
# `sparkbook run` sets them; `papermill NB OUT -f parameters/X.yaml` injects the fields instead.
params_file = None
run_dir = None

# %% tags=["hide-input"]
import sparkbook as sb
from sparkbook.steps import smoke as step

ctx = sb.notebook.start(globals(), step)
print(f"endpoint {ctx.params.endpoint}, model {ctx.params.served_model}")

# %% [markdown]
# ## Requests
#
# One request per check: what was sent, and what came back.

# %%
outcome = ctx.run()
step.table(outcome)

# %% [markdown]
# ## Burn-in
#
# One good answer does not prove the next twenty. First `smoke.requests` requests one after another,
# their prompt and output lengths drawn from a seeded RNG over `smoke.prompt_tokens` and
# `smoke.output_tokens`: each must come back with exactly the output length asked for (`max_tokens`
# with `ignore_eos`, as the server's usage counts it), text that is valid UTF-8 and a finish reason; a
# failure names the request and its lengths. Then a soak: `smoke.soak_concurrency` requests in flight
# for `smoke.soak_s` seconds, with no failure, and no drift: the p99 end-to-end latency of the last
# third of the requests at most `smoke.drift_limit` times the first third's (a server that slows as it
# runs: throttling, memory pressure, a leak). Every request is kept in `smoke/burn_in.csv`.
#
# Meanwhile every serving node's health is sampled every 5 s: its rails' error and FEC counters, its
# GPU's clock-event reasons and the Xid lines of its kernel log. What changes from the first sample
# is a row of its own with the time it began (a counter that climbs while the cable carries the
# soak, a GPU that starts throttling, a driver fault): faults no static check sees. Samples in
# `health/burn-in.csv`.

# %%
from sparkbook.smoke import burnin, known_answers

burnin.table(step.burn_in(ctx, outcome))

# %% [markdown]
# ## Known answers
#
# A few fixed prompts answered by greedy decoding (temperature 0, `smoke.known_answer_tokens` tokens,
# one at a time) are kept with the run's fingerprint in `smoke/known_answers.json`. The same image,
# model, flags, drivers and firmware answer them token for token the same: a later run of the same
# fingerprint that answers differently fails here, naming the prompt, the earlier run and where the
# answers part (silent numerical corruption, a broken GPU, driver or firmware, or a nondeterministic
# kernel: rerun to confirm). Runs of another fingerprint are not compared.

# %%
known_answers.table(step.known_answers(ctx, outcome))

# %% [markdown]
# ## Troubleshooting
#
# **How long.** Measured in the lab (two simulated nodes on a 2-core machine, `sparkbook run` of
# `parameters/lab.yaml`, 2026-12-01): 49 s; four nodes: 59 s. Most of it is the burn-in and the soak
# (`smoke.soak_s`, 60 s by default).
#
# **A hang.** Every request is limited to `smoke.timeout_s` (120 s): a request without an answer by
# then is a FAIL row ("no answer within 120 s"); when the server cannot be reached at all, the
# remaining checks are skipped, not waited for. The soak runs for `smoke.soak_s` whatever happens.
#
# **Logs and outputs**, in the run folder (printed by the setup cell: `outputs/<time>-<deployment>/`
# with `sparkbook run`, `outputs/interactive-<deployment>/` or `$SPARKBOOK_RUN_DIR` by hand):
# `verdicts/06_smoke_test.json` (every check); `smoke/burn_in.json` and `smoke/burn_in.csv` (every
# burn-in and soak request), `health/burn-in.csv` (the serving nodes' health samples),
# `smoke/known_answers.json` and `fingerprint.json`.

# %% [markdown]
# ## Verdict

# %% tags=["hide-input"]
ctx.conclude(outcome)

# %% [markdown]
# ## Next
#
# [07_benchmark.ipynb](07_benchmark.ipynb): the figures Spark owners compare.
#
# ## When it failed
#
# - **The verdict above**: each FAIL row names the node, what was seen, what was expected and the
#   remedy; the cell's error repeats the failures with their remedies.
# - **The run folder**: `verdicts/06_smoke_test.json` (every check), `smoke/burn_in.json` and
#   `smoke/burn_in.csv` (every burn-in and soak request), `smoke/known_answers.json` and
#   `fingerprint.json`; with `sparkbook run`, the executed notebook `06_smoke_test.ipynb` and
#   `logs/kernel-06_smoke_test.log` beside it.
# - **The server's side**: the serving container's log on the head (`docker logs NAME 2>&1 | sparkbook
#   diagnose -` names known failures in it; `docker ps` gives the name).
# - **The usual causes**: vLLM not up or restarted ([05_serve.ipynb](05_serve.ipynb)), the API key
#   (`serving.api_key_env`), a parser (`serving.reasoning_parser`, `serving.tool_call_parser`) that
#   does not fit the model.
# - **How long and what a hang looks like**: Troubleshooting, above.
# - **A bug report**: `sparkbook collect outputs/<run>/` asks every node for its versions and logs and
#   packs them with the run folder into one archive (secrets masked).
