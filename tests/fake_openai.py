"""A small OpenAI-compatible server in a thread, shaped like vLLM's, for the smoke and benchmark
tests: /v1/models, /v1/chat/completions, /v1/completions (streamed as SSE, with the usage chunk
of stream_options.include_usage) and vLLM's /tokenize.

The "model" writes a fixed cycle of short words, one token each (its ID: the word's index in WORDS,
streamed as vLLM's ``token_ids`` when the request has ``return_token_ids``); prompts are counted by a toy
tokenizer: a word is one token per started four characters, and the chat template adds
CHAT_OVERHEAD tokens. Attributes of the instance change its behaviour between requests.

Reasoning and tool calls as vLLM (0.32) answers them: a thinking model (``thinks``) writes that many
tokens of reasoning, closes it and answers; with a reasoning parser (``reasoning_field``) the
reasoning comes back apart, cut reasoning (never closed) all as reasoning, and without a parser the
``<think>`` markup stays in the content. Given tools, the model calls one in its own format
(``tool_format``): a tool-call parser that knows it (``tool_parser``) takes the call out of the text
(``tool_calls``, finish_reason ``tool_calls``); otherwise it stays in the content. ``required`` and
named tool choices are answered by guided decoding, whatever the model's format.
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "ate", "red", "fish")
CHAT_OVERHEAD = 5


def count_tokens(text: str) -> int:
    return sum(-(-len(w) // 4) for w in text.split())


def chat_tokens(messages: list[dict], count: Callable[[str], int] = count_tokens) -> int:
    return sum(count(m.get("content") or "") for m in messages) + CHAT_OVERHEAD


class FakeOpenAI:
    def __init__(self, model: str = "fake-model", host: str = "127.0.0.1", **knobs: Any):
        self.model = model
        self.ttft = 0.0  # seconds from the response headers to the first token
        self.token_delay: float | Callable[[int], float] = 0.0  # between chunks; or f(request number)
        self.tokens_per_chunk = 1
        self.eos_after = 20  # natural answer length, unless ignore_eos or min_tokens
        self.usage = True  # False: usage is never sent
        self.tool_args = "valid"  # "invalid-json" or "schema-mismatch"
        self.tool_parser = True  # the server has a tool-call parser (vLLM answers tool_choice only then)
        self.tool_format = "hermes"  # how the model calls: "hermes" (the parser's), "other", "none" (never)
        self.tool_finish: str | None = None  # overrides finish_reason of a parsed call
        self.thinks = 0  # tokens of reasoning a thinking model writes before its answer
        self.closes_thinking = True  # False: its reasoning never ends (an answer the parser takes for it)
        self.reasoning_field: str | None = None  # the reasoning parser's field: "reasoning_content"/"reasoning"
        self.tokenize = True  # False: no /tokenize (404)
        self.max_model_len = 4096
        self.fail_every = 0  # every k-th generation request answers HTTP 500
        self.fail_requests: set[int] = set()  # these generation requests (from 1, as they arrive) too
        self.hang_unknown_model = 0.0  # seconds to sit on a request for an unknown model
        self.extra_tokens = 0  # generated past every limit
        self.honour_stop = True
        # a proxy that deletes the stop strings from the text instead of stopping at them
        self.strip_stop = False
        self.words = WORDS  # the cycle the "model" writes (token IDs stay the indexes in WORDS)
        self.count = count_tokens  # a text's tokens, for /tokenize and usage (e.g. a real tokenizer's)
        # a request on a connection idle for longer than this is dropped unanswered: what a client
        # sees when a server (uvicorn) closes an idle connection just as the client reuses it
        self.keep_alive: float | None = None
        # vLLM with VLLM_API_KEY (or --api-key): every /v1 request needs "Authorization: Bearer KEY",
        # else 401 (its AuthenticationMiddleware guards the /v1 paths only: /health stays open)
        self.api_key: str | None = None
        self.refused = 0  # requests answered 401
        self.metrics: Callable[[], str] | None = None  # the text of /metrics (vLLM's Prometheus page); None: 404
        for k, v in knobs.items():
            if not hasattr(self, k):
                raise TypeError(f"no knob {k!r}")
            setattr(self, k, v)
        self.requests: list[dict] = []  # generation request bodies, in arrival order
        # each streamed generation's (arrival, its first token's chunk about to be written), in
        # time.perf_counter() seconds: the server's own TTFT, for a benchmark to set a client's against
        self.served: list[tuple[float, float]] = []
        self.connections = 0  # accepted
        self.dropped = 0  # requests dropped by keep_alive
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        self.server = _Server((host, 0), _handler(self))
        self.url = f"http://{host}:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- what the "model" answers ---

    def generate(self, body: dict, n: int, thinks: int = 0) -> tuple[list[str], str, str | None]:
        """(token texts, finish_reason, stop_reason), honouring max_tokens, min_tokens,
        ignore_eos and stop; ``thinks`` tokens of reasoning come before the natural answer."""
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        natural = thinks + self.eos_after
        k = limit if body.get("ignore_eos") else min(limit, max(natural, body.get("min_tokens") or 0))
        k += self.extra_tokens
        stops = (body.get("stop") or []) if self.honour_stop else []
        stops = [stops] if isinstance(stops, str) else stops
        if self.strip_stop:
            stops, strip = [], stops
        else:
            strip = []
        text, out = "", []
        for i in range(k):
            piece = " " + self.words[(n + i) % len(self.words)]
            for gone in strip:
                piece = piece.replace(gone, "")
            found = [((text + piece).find(s), s) for s in stops if s in text + piece]
            if found:
                at, stop = min(found)
                out.append((text + piece)[len(text):at])
                return out, "stop", stop
            text += piece
            out.append(piece)
        return out, "length" if k == limit else "stop", None

    def tool_call(self, body: dict, name: str) -> dict:
        schema = next(t["function"]["parameters"] for t in body["tools"] if t["function"]["name"] == name)
        args = {k: p["enum"][0] if "enum" in p else {"string": "x", "integer": 1, "number": 1.5}[p["type"]]
                for k, p in schema["properties"].items()}
        text = {"valid": json.dumps(args), "invalid-json": json.dumps(args)[:-3],
                "schema-mismatch": json.dumps({k: 5 for k in args})}[self.tool_args]
        return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": text}}

    def reply(self, body: dict, n: int, chat: bool) -> dict:
        """What the server answers: token texts tagged with their field ("reasoning", "content"),
        tool calls, finish and stop reasons."""
        thinking = chat and self.thinks > 0 and \
            (body.get("chat_template_kwargs") or {}).get("enable_thinking", True) is not False
        think = self.thinks if thinking else 0
        pieces, finish, stop_reason = self.generate(body, n, think if self.closes_thinking else 0)
        parts = [("reasoning" if i < think or (thinking and not self.closes_thinking) else "content", p)
                 for i, p in enumerate(pieces)]
        closed = thinking and self.closes_thinking and len(pieces) > think
        calls: list[dict] = []
        choice = body.get("tool_choice", "auto") if chat and body.get("tools") else "none"
        if choice == "required" or isinstance(choice, dict):  # guided decoding writes the call
            name = choice["function"]["name"] if isinstance(choice, dict) else body["tools"][0]["function"]["name"]
            calls = [self.tool_call(body, name)]
            parts = [p for p in parts if p[0] == "reasoning"]
            finish = "tool_calls" if choice == "required" else "stop"
        elif choice == "auto" and self.tool_format != "none" and (closed or not thinking):
            call = self.tool_call(body, body["tools"][0]["function"]["name"])
            parts = [p for p in parts if p[0] == "reasoning"]
            if finish == "length":  # cut while writing the call: it stays in the text, unparsed
                parts.append(("content", '<tool_call>\n{"name": "get_'))
            elif self.tool_format == "hermes" and self.tool_parser:
                calls, finish = [call], self.tool_finish or "tool_calls"
            else:  # the parser does not know the model's format: the call stays in the text
                f = call["function"]
                parts.append(("content", f"[TOOL_CALLS]{f['name']}{f['arguments']}"))
        if thinking and not self.reasoning_field:  # no reasoning parser: the markup stays in the answer
            parts = [("content", "<think>" * (i == 0) + t + "</think>" * (closed and i == think - 1))
                     for i, (_, t) in enumerate(parts)]
        return {"parts": parts, "tool_calls": calls, "finish": finish, "stop_reason": stop_reason,
                "tokens": len(pieces)}

    def delay(self, n: int) -> float:
        return self.token_delay(n) if callable(self.token_delay) else self.token_delay


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's listen backlog is 5: a client opening 32 connections at once had the rest of
    # its SYNs dropped and sent again a second later (first tokens of 1-1.5 s in the first wave)
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client closing its pool
            super().handle_error(request, client_address)


def _handler(fake: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.idle_since: float | None = None
            with fake._lock:
                fake.connections += 1

        def handle_one_request(self) -> None:
            super().handle_one_request()
            self.idle_since = time.monotonic()

        def stale(self) -> bool:
            """Drops the request (closes the connection, answers nothing) per ``keep_alive``."""
            if (fake.keep_alive is None or self.idle_since is None
                    or time.monotonic() - self.idle_since <= fake.keep_alive):
                return False
            self.close_connection = True
            with fake._lock:
                fake.dropped += 1
            return True

        def log_message(self, *args) -> None:
            pass

        def send_json(self, code: int, data: dict) -> None:
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def error(self, code: int, message: str) -> None:
            self.send_json(code, {"error": {"message": message, "type": "Error", "code": code}})

        def event(self, data: dict | str) -> None:
            raw = b"data: " + (data if isinstance(data, str) else json.dumps(data)).encode() + b"\n\n"
            self.wfile.write(b"%X\r\n%s\r\n" % (len(raw), raw))  # one chunk of the chunked body
            self.wfile.flush()

        def unauthorized(self) -> bool:
            """Answers 401 to a /v1 request without the server's key (as vLLM does)."""
            if fake.api_key is None or not self.path.startswith("/v1"):
                return False
            if self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                return False
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with fake._lock:
                fake.refused += 1
            self.send_json(401, {"error": "Unauthorized"})
            return True

        def do_GET(self) -> None:
            if self.stale() or self.unauthorized():
                return
            if self.path == "/health":
                return self.send_json(200, {})
            if self.path == "/metrics" and fake.metrics is not None:
                raw = fake.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return
            if self.path != "/v1/models":
                return self.error(404, "not found")
            self.send_json(200, {"object": "list", "data": [
                {"id": fake.model, "object": "model", "owned_by": "vllm", "max_model_len": fake.max_model_len}]})

        def do_POST(self) -> None:
            arrived = time.perf_counter()
            if self.stale() or self.unauthorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize" and fake.tokenize:
                n = chat_tokens(body["messages"], fake.count) if "messages" in body else fake.count(body["prompt"])
                return self.send_json(200, {"count": n, "max_model_len": fake.max_model_len,
                                            "tokens": list(range(n))})
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self.error(404, "not found")
            if body.get("model") != fake.model:
                time.sleep(fake.hang_unknown_model)
                return self.error(404, f"The model `{body.get('model')}` does not exist.")
            with fake._lock:
                n = next(fake._count)
                fake.requests.append(body)
            if (fake.fail_every and n % fake.fail_every == 0) or n in fake.fail_requests:
                return self.error(500, "injected failure")
            choice = body.get("tool_choice", "auto")
            if body.get("tools") and choice != "none" and not fake.tool_parser:  # vLLM 0.32's refusals
                return self.error(400, '"auto" tool choice requires --enable-auto-tool-choice and '
                                  "--tool-call-parser to be set" if choice == "auto" else
                                  f"tool_choice={json.dumps(choice)} requires --tool-call-parser to be set")
            self.generation(body, n, arrived, chat=self.path.endswith("chat/completions"))

        def generation(self, body: dict, n: int, arrived: float, chat: bool) -> None:
            r = fake.reply(body, n, chat)
            prompt = chat_tokens(body["messages"], fake.count) if chat else fake.count(body["prompt"])
            usage = {"prompt_tokens": prompt, "completion_tokens": r["tokens"],
                     "total_tokens": prompt + r["tokens"]}
            kind = "chat.completion" if chat else "text_completion"
            field = {"reasoning": fake.reasoning_field, "content": "content"}
            if not body.get("stream"):
                choice: dict[str, Any] = {"index": 0, "finish_reason": r["finish"], "stop_reason": r["stop_reason"]}
                said = "".join(t for f, t in r["parts"] if f == "content")
                if not chat:
                    choice["text"] = said
                else:
                    msg = {"role": "assistant", "content": said or None, "tool_calls": r["tool_calls"]}
                    if fake.reasoning_field:
                        msg[fake.reasoning_field] = "".join(t for f, t in r["parts"] if f == "reasoning") or None
                    choice["message"] = msg
                data = {"id": f"x-{n}", "object": kind, "model": fake.model, "created": 0, "choices": [choice]}
                if fake.usage:
                    data["usage"] = usage
                return self.send_json(200, data)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            time.sleep(fake.ttft)
            base = {"id": f"x-{n}", "object": kind + ".chunk", "model": fake.model, "created": 0}
            if chat:
                self.event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            fake.served.append((arrived, time.perf_counter()))
            step, parts = fake.tokens_per_chunk, r["parts"]
            for i in range(0, len(parts), step):
                if i:
                    time.sleep(fake.delay(n))
                delta: dict[str, str] = {}
                for f, t in parts[i:i + step]:
                    delta[field[f]] = delta.get(field[f], "") + t
                part = {"delta": delta} if chat else {"text": "".join(delta.values())}
                if body.get("return_token_ids"):  # vLLM 0.10.2 on: the IDs of the chunk's tokens
                    part["token_ids"] = [(n + j) % len(WORDS) for j in range(i, min(i + step, len(parts)))]
                self.event({**base, "choices": [{"index": 0, **part, "finish_reason": None}]})
            if r["tool_calls"]:
                calls = [{"index": i, **c} for i, c in enumerate(r["tool_calls"])]
                delta = {"delta": {"tool_calls": calls}, "finish_reason": None}
                self.event({**base, "choices": [{"index": 0, **delta}]})
            end = {"delta": {}} if chat else {"text": ""}
            self.event({**base, "choices": [{"index": 0, **end, "finish_reason": r["finish"],
                                             "stop_reason": r["stop_reason"]}]})
            if fake.usage and (body.get("stream_options") or {}).get("include_usage"):
                self.event({**base, "choices": [], "usage": usage})
            self.event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    return Handler
