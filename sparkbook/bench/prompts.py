"""Prompts for the benchmark: random common words from a seeded RNG, each prompt sized to an exact
token count by the server's own tokenizer, so that a level's prompt length is what it says and no
two requests share a prefix (see :mod:`sparkbook.bench`)."""

from __future__ import annotations

import asyncio
import random
from typing import Awaitable, Callable

import aiohttp

from .client import ServerError

# (form, text) -> the server's token count: "messages" with the chat template, or a bare "prompt"
# (:meth:`sparkbook.bench.client.Session.tokenize`)
Count = Callable[[str, str], Awaitable[int]]

# Common words: about one token each in real tokenizers, so a prompt reads like text.
VOCAB = tuple("""time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot right study
book eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body information back
parent face others level office door health person art war history party result change morning
reason research girl guy moment air teacher force education river stone light green small
large early young important public bad same able""".split())
PADS = (" a", ".", ",", " I", "a")  # one token each in most tokenizers: closes the last gap


class Prompts:
    """Random-word prompts of an exact token count by the server's tokenizer (vLLM's
    ``POST /tokenize``, asked through ``count``; for the chat endpoint with the chat template
    applied, so the count is the prompt_tokens the server will report). Without /tokenize, one
    token per word: an estimate."""

    def __init__(self, count: Count, endpoint: str):
        self.tokenize, self.endpoint = count, endpoint
        self.form: str | None = None  # "messages" or "prompt": how /tokenize is asked
        self.sizing = ""
        self.ratio = 1.3  # tokens per word, learnt as prompts are fitted
        self.missed = 0  # prompts that could not be brought to the exact count

    async def probe(self) -> str:
        forms = ("messages", "prompt") if self.endpoint == "chat" else ("prompt",)
        why = ""
        for form in forms:
            self.form = form
            try:
                await self.count("hello")
            except (aiohttp.ClientError, asyncio.TimeoutError, ServerError, ValueError, KeyError) as e:
                why = str(e) or type(e).__name__
                continue
            self.sizing = ("exact: /tokenize" + (" with the chat template" if form == "messages" else "")
                           + (" (without the chat template: its tokens come on top)"
                              if self.endpoint == "chat" and form == "prompt" else ""))
            return self.sizing
        self.form = None
        self.sizing = f"estimated: one token per word (no /tokenize: {why})"
        return self.sizing

    async def count(self, text: str, form: str | None = None) -> int:
        return await self.tokenize(form or self.form or "prompt", text)

    async def make(self, tokens: int, key: str, form: str | None = None) -> str:
        """A prompt of ``tokens`` tokens as ``form`` counts them (default: as the endpoint sends
        it; ``"prompt"``: the bare text, e.g. a part of a message)."""
        rng, words = random.Random(key), []

        def text(k: int) -> str:
            while len(words) < k:
                words.append(rng.choice(VOCAB))
            return " ".join(words[:k])

        if self.form is None:
            return text(max(tokens, 1))
        # Secant steps on the number of words, then pad the last few tokens.
        k, best, tried = max(1, round(tokens / self.ratio)), (0, None), set()
        while k not in tried and len(tried) < 8:
            tried.add(k)
            c = await self.count(text(k), form)
            if c == tokens:
                return text(k)
            if c < tokens and (best[1] is None or c > best[1]):
                best = (k, c)
            self.ratio = max(c / k, 0.1)
            k = max(1, k + (round((tokens - c) / self.ratio) or (1 if c < tokens else -1)))
        if best[1] is None:  # even one word is too many (a tiny target under a chat template)
            self.missed += 1
            return text(1)
        out, c = text(best[0]), best[1]
        for _ in range(16):  # the gap is a token or two; a bigger one stays a miss
            if c >= tokens:
                break
            for pad in PADS:
                n = await self.count(out + pad, form)
                if c < n <= tokens:
                    out, c = out + pad, n
                    break
            else:
                break
        self.missed += c != tokens
        return out

    async def batch(self, n: int, tokens: int, key: str, form: str | None = None) -> list[str]:
        gate = asyncio.Semaphore(8)

        async def one(i: int) -> str:
            async with gate:
                return await self.make(tokens, f"{key}/{i}", form)

        return list(await asyncio.gather(*(one(i) for i in range(n))))
