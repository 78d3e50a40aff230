"""The served OpenAI-compatible API (``params.endpoint``) as its clients, the smoke test and the
benchmark, reach it: its two URLs, how long an idle connection may be reused, and where the API key
may be sent."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

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


# Where the operator lets the API key go besides the deployment's own API (the head at ports.api):
# this machine's environment, never the parameters file, which also names the key's variable.
# Entries `host` (any port) or `host:port` (`[::1]:8000`), separated by commas or blanks.
API_HOSTS = "SPARKBOOK_API_HOSTS"


def destination(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL, as two spellings of one place compare: case, a final dot,
    IPv6 brackets, the scheme's default port."""
    u = urlsplit(url)
    return (u.hostname or "").rstrip("."), u.port or (443 if u.scheme == "https" else 80)


def operator_hosts() -> list[tuple[str, int | None]]:
    """The destinations ``$SPARKBOOK_API_HOSTS`` lists (port None: any port); an entry that is not
    ``host`` or ``host:port`` matches nothing."""
    out = []
    for entry in re.split(r"[\s,]+", os.environ.get(API_HOSTS, "")):
        u = urlsplit(f"//{entry}")
        try:
            if u.hostname:
                out.append((u.hostname.rstrip("."), u.port))
        except ValueError:  # not a port
            continue
    return out


def key_may_go(url: str, head: str, api_port: int) -> bool:
    """Whether the API key may be sent to ``url``: the deployment's own API (the head's host at the
    port 05 starts it on), or a destination the operator lists in ``$SPARKBOOK_API_HOSTS``."""
    host, port = destination(url)
    own = (head.strip("[]").lower().rstrip("."), api_port)
    return (host, port) == own or any(h == host and p in (None, port) for h, p in operator_hosts())
