"""The served OpenAI-compatible API (``params.endpoint``) as its clients, the smoke test and the
benchmark, reach it: its two URLs and how long an idle connection may be reused."""

from __future__ import annotations

# Idle pooled connections are reused for at most this long. vLLM's server (uvicorn) closes a
# connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default (vllm/envs.py); a request sent on
# one just as the server closes it fails with "Server disconnected". aiohttp hands out idle
# connections oldest first, so a benchmark at concurrency 1 after a
# wider pool was used meets that moment. Both clients here retire them sooner.
KEEPALIVE_S = 2.0


def urls(base_url: str) -> tuple[str, str]:
    """(the OpenAI API URL ending in /v1, the server root) from either form of the address."""
    api = base_url.rstrip("/")
    api = api if api.endswith("/v1") else api + "/v1"
    return api, api[: -len("/v1")]
