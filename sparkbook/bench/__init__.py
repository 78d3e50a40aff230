"""The benchmark client: single-user speed at several context depths, a closed-loop concurrency
sweep and an optional open-loop request-rate sweep against an OpenAI-compatible server (vLLM).

Split by job, as vLLM's own benchmark code is (``vllm/benchmarks/``):

- :mod:`.records`: what is measured (a request, a level, a run), its statistics and its files;
- :mod:`.prompts`: prompts sized to an exact token count by the server's tokenizer;
- :mod:`.client`: the connection pool and one timed, streamed request;
- :mod:`.load`: the load patterns (closed loop, Poisson arrivals), one level standalone
  (``load.run_load``) and the whole benchmark (``load.run``);
- :mod:`.profiles`: standard grids by name (a public leaderboard's), ``benchmark.profile``, and
  :mod:`.board`: their cells measured as that leaderboard measures (llama-benchy's way);
- :mod:`.server`: what the server saw meanwhile (vLLM's ``/metrics``, GPU power and clocks);
- :mod:`.plots`: the figures; :mod:`.checks`: what the verdict says about a run;
  :mod:`.ceiling`: single-user decode held against the memory-bandwidth ceiling (plausibility).

Hygiene, so that numbers compare between runs and with ``vllm bench serve`` on the same load:

- token counts come from the server's usage (streamed with ``stream_options.include_usage``),
  never from counting chunks (one chunk may carry several tokens);
- the output length is fixed: ``max_tokens = output_tokens`` with ``ignore_eos`` (as ``vllm bench
  serve`` sends it: ``min_tokens`` would add a logits processor to every decoding step);
- prompts are random words from a seeded RNG, sized to the exact token count by the server's own
  tokenizer (vLLM's ``POST /tokenize``, with the chat template for the chat endpoint); every
  request has its own prompt, so no level profits from the prefix cache of another, and a salt
  (by default the run's start time) keeps a rerun against the same server from hitting the prompts
  of the last run: pass ``prompt_salt=""`` for byte-identical prompts;
- warm-up requests run before anything is measured; one HTTP connection pool serves every level,
  sized for the highest concurrency;
- the client measures itself: the CPU time of its event-loop thread, how late it sent each
  scheduled request and how late its event loop woke up. A level where the client, not the server,
  was the bottleneck is flagged ``client_bound``.

Definitions (``vllm bench serve`` uses the same): TTFT is from sending a request to the first chunk
that carries a generated token, with text or without (a token can be part of a character or a
special token; a chat role's announcement and an empty chunk that only gives the finish reason are
not tokens); ITL is the time between successive such chunks;
E2E is from sending to the end of the stream; TPOT = (E2E - TTFT) / (output tokens - 1). Per
request, decode tok/s = (output tokens - 1) / (E2E - TTFT) and prefill tok/s = prompt tokens / TTFT.
A context depth D is a prompt of D + ``benchmark.prompt_tokens`` tokens, all prefilled (a
profile's cells excepted: :mod:`.board`).

What lands in ``RUN_DIR/benchmark/`` is described in :mod:`.records`.
"""
