"""A small OpenAI-compatible server in a thread, shaped like vLLM's, for the smoke and benchmark
tests: /v1/models, /v1/chat/completions, /v1/completions (streamed as SSE, with the usage chunk
of stream_options.include_usage) and vLLM's /tokenize.

The "model" writes a fixed cycle of short words, one token each; prompts are counted by a toy
tokenizer: a word is one token per started four characters, and the chat template adds
CHAT_OVERHEAD tokens. Attributes of the instance change its behaviour between requests.
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


def chat_tokens(messages: list[dict]) -> int:
    return sum(count_tokens(m.get("content") or "") for m in messages) + CHAT_OVERHEAD


class FakeOpenAI:
    def __init__(self, model: str = "fake-model", **knobs: Any):
        self.model = model
        self.ttft = 0.0  # seconds from the response headers to the first token
        self.token_delay: float | Callable[[int], float] = 0.0  # between chunks; or f(request number)
        self.tokens_per_chunk = 1
        self.eos_after = 20  # natural answer length, unless ignore_eos or min_tokens
        self.usage = True  # False: usage is never sent
        self.tool_args = "valid"  # "invalid-json" or "schema-mismatch"
        self.reasoning_field: str | None = None  # "reasoning_content"/"reasoning": split reasoning off
        self.leak_think = False  # <think>...</think> left in the content
        self.tokenize = True  # False: no /tokenize (404)
        self.max_model_len = 4096
        self.fail_every = 0  # every k-th generation request answers HTTP 500
        self.hang_unknown_model = 0.0  # seconds to sit on a request for an unknown model
        self.extra_tokens = 0  # generated past every limit
        self.honour_stop = True
        # a request on a connection idle for longer than this is dropped unanswered: what a client
        # sees when a server (uvicorn) closes an idle connection just as the client reuses it
        self.keep_alive: float | None = None
        for k, v in knobs.items():
            if not hasattr(self, k):
                raise TypeError(f"no knob {k!r}")
            setattr(self, k, v)
        self.requests: list[dict] = []  # generation request bodies, in arrival order
        self.connections = 0  # accepted
        self.dropped = 0  # requests dropped by keep_alive
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- what the "model" answers ---

    def generate(self, body: dict, n: int) -> tuple[list[str], str, str | None]:
        """(token texts, finish_reason, stop_reason), honouring max_tokens, min_tokens,
        ignore_eos and stop."""
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        k = limit if body.get("ignore_eos") else min(limit, max(self.eos_after, body.get("min_tokens") or 0))
        k += self.extra_tokens
        stops = (body.get("stop") or []) if self.honour_stop else []
        stops = [stops] if isinstance(stops, str) else stops
        text, out = "", []
        for i in range(k):
            piece = " " + WORDS[(n + i) % len(WORDS)]
            found = [((text + piece).find(s), s) for s in stops if s in text + piece]
            if found:
                at, stop = min(found)
                out.append((text + piece)[len(text):at])
                return out, "stop", stop
            text += piece
            out.append(piece)
        return out, "length" if k == limit else "stop", None

    def tool_call(self, body: dict) -> dict:
        name = body["tool_choice"]["function"]["name"]
        schema = next(t["function"]["parameters"] for t in body["tools"] if t["function"]["name"] == name)
        args = {k: p["enum"][0] if "enum" in p else {"string": "x", "integer": 1, "number": 1.5}[p["type"]]
                for k, p in schema["properties"].items()}
        text = {"valid": json.dumps(args), "invalid-json": json.dumps(args)[:-3],
                "schema-mismatch": json.dumps({k: 5 for k in args})}[self.tool_args]
        return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": text}}

    def delay(self, n: int) -> float:
        return self.token_delay(n) if callable(self.token_delay) else self.token_delay


class _Server(ThreadingHTTPServer):
    daemon_threads = True

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

        def do_GET(self) -> None:
            if self.stale():
                return
            if self.path != "/v1/models":
                return self.error(404, "not found")
            self.send_json(200, {"object": "list", "data": [
                {"id": fake.model, "object": "model", "owned_by": "vllm", "max_model_len": fake.max_model_len}]})

        def do_POST(self) -> None:
            if self.stale():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize" and fake.tokenize:
                n = chat_tokens(body["messages"]) if "messages" in body else count_tokens(body["prompt"])
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
            if fake.fail_every and n % fake.fail_every == 0:
                return self.error(500, "injected failure")
            self.generation(body, n, chat=self.path.endswith("chat/completions"))

        def generation(self, body: dict, n: int, chat: bool) -> None:
            pieces, finish, stop_reason = fake.generate(body, n)
            prompt = chat_tokens(body["messages"]) if chat else count_tokens(body["prompt"])
            usage = {"prompt_tokens": prompt, "completion_tokens": len(pieces),
                     "total_tokens": prompt + len(pieces)}
            tool = fake.tool_call(body) if chat and isinstance(body.get("tool_choice"), dict) else None
            half = len(pieces) // 2 if fake.reasoning_field else 0
            kind = "chat.completion" if chat else "text_completion"
            if not body.get("stream"):
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "stop_reason": stop_reason}
                if not chat:
                    choice["text"] = "".join(pieces)
                else:
                    thought, answer = "".join(pieces[:half]), "".join(pieces[half:])
                    if fake.leak_think:
                        answer = f"<think>{answer}</think>{answer}"
                    msg = {"role": "assistant", "content": None if tool else answer,
                           "tool_calls": [tool] if tool else []}
                    if fake.reasoning_field:
                        msg[fake.reasoning_field] = thought
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
            step = fake.tokens_per_chunk
            for i in range(0, len(pieces), step):
                if i:
                    time.sleep(fake.delay(n))
                text = "".join(pieces[i:i + step])
                field = fake.reasoning_field if i < half else "content"
                part = {"delta": {field: text}} if chat else {"text": text}
                self.event({**base, "choices": [{"index": 0, **part, "finish_reason": None}]})
            end = {"delta": {}} if chat else {"text": ""}
            self.event({**base, "choices": [{"index": 0, **end, "finish_reason": finish,
                                             "stop_reason": stop_reason}]})
            if fake.usage and (body.get("stream_options") or {}).get("include_usage"):
                self.event({**base, "choices": [], "usage": usage})
            self.event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    return Handler
