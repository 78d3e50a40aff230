"""06's known answers: a few fixed prompts answered by greedy decoding, kept with the run's
fingerprint (:mod:`sparkbook.record.fingerprint`), so that a later run of the same fingerprint that
answers differently is flagged.

Greedy decoding (temperature 0; no seed needed, nothing is sampled) with the same image, model,
flags, drivers and firmware repeats itself token for token: an answer that changed although nothing
that decides it did points to silent numerical corruption (a failing GPU or its memory, a broken
driver or firmware) or to a kernel that is not deterministic. The answers are asked one at a time,
each alone on the server, so that no batch of other requests changes the arithmetic; each is
exactly ``smoke.known_answer_tokens`` long (``ignore_eos``), so a short answer cannot hide a
difference. The token IDs come from vLLM's ``return_token_ids`` where the server returns them, else
the texts are compared. Each request has a ``cache_salt`` of its own (vLLM 0.9 on): a prompt asked
before, by an earlier run against the same server, is not answered from the prefix cache, whose
shorter prefill takes other kernels whose rounding can flip a greedy token
(source: https://docs.vllm.ai/en/latest/design/prefix_caching/, "cache isolation").

Earlier runs are the run folders beside this one (``RUN_DIR/../*/smoke/known_answers.json``, this
folder's earlier record included), newest first; the newest of the same fingerprint that answered
any of the same prompts is the one compared with. A fingerprint with something unread (its key is
its own) compares with none: the row says so (SKIP). Kept in ``RUN_DIR/smoke/known_answers.json``:
``fingerprint``, ``run``, ``recorded`` (UTC, ISO 8601), ``model``, ``max_tokens``, ``answers``
(``prompt``, ``text``, ``token_ids`` (null when the server returned none), ``output_tokens``,
``finish_reason``, ``error``), ``compared_with`` (the earlier run folder, or null), ``compared``
(the prompts compared with it), ``differences``, ``other_fingerprints`` (earlier run folders not
compared: another fingerprint) and ``not_compared`` (why nothing was compared, or empty).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from ..bench.client import Answer, Session
from ..bench.load import run_async
from ..book.step import Outcome
from ..book.tables import Table
from ..book.verdict import FAIL, PASS, SKIP, Check

# Short prompts whose answers are lists a model writes the same way each time (in the smoke
# prompts' style, sparkbook/smoke/prompts.py); greedy decoding makes any answer repeatable anyway.
PROMPTS = (
    "Count from one to ten in words.",
    "Name the planets of the solar system in order.",
    "Write the alphabet in capital letters.",
    "Repeat the word spark five times.",
)
CHECK = "known answers"
EXPECTED = "the same tokens as the newest earlier run of the same fingerprint"


@dataclass
class KnownAnswers(Outcome):
    FILE: ClassVar[str] = "smoke/known_answers.json"

    fingerprint: str
    run: str
    model: str
    max_tokens: int
    answers: list[dict]
    recorded: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    compared_with: str | None = None
    compared: int = 0  # prompts compared with compared_with
    differences: list[str] = field(default_factory=list)
    other_fingerprints: list[str] = field(default_factory=list)
    not_compared: str = ""  # why nothing was compared (the fingerprint is incomplete)


def ask(base_url: str, model: str, *, max_tokens: int, api_key: str = "EMPTY",
        timeout: float = 120.0) -> list[dict]:
    """Each of :data:`PROMPTS`, one at a time, greedy, ``max_tokens`` long, each with a cache salt
    of its own (nothing answered from the prefix cache)."""
    async def main() -> list[dict]:
        out = []
        async with Session(base_url, model, endpoint="chat", connections=1, timeout=timeout,
                           api_key=api_key, temperature=0.0) as session:
            for i, prompt in enumerate(PROMPTS, 1):
                answer = Answer()
                rec = await session.request(prompt, max_tokens, i, time.perf_counter(), answer,
                                            cache_salt=f"sparkbook-known-{time.time_ns()}-{i}")
                out.append({"prompt": prompt, "text": "".join(answer.text), "token_ids": answer.token_ids or None,
                            "output_tokens": rec.output_tokens, "finish_reason": rec.finish_reason,
                            "error": rec.error})
        return out

    return run_async(main)


def earlier(run_dir: Path) -> list[tuple[Path, dict]]:
    """The known answers kept in the run folders beside ``run_dir`` (and in it), newest first;
    unreadable ones are passed over."""
    found = []
    for path in run_dir.parent.glob(f"*/{KnownAnswers.FILE}"):
        try:
            data = json.loads(path.read_text())
            found.append((str(data.get("recorded") or ""), path.stat().st_mtime, path.parents[1], data))
        except (OSError, ValueError, AttributeError):
            continue
    found.sort(key=lambda f: f[:2], reverse=True)
    return [(folder, data) for _, _, folder, data in found]


def first_difference(now: dict, then: dict, prefix: bool = False) -> str:
    """Where the answer ``now`` first departs from ``then`` (empty when they are the same): the
    token (when both have token IDs) and the texts from there. ``prefix``: answers of different
    lengths (max_tokens) are compared as far as the shorter goes."""
    a, b = now.get("text") or "", then.get("text") or ""
    ta, tb = now.get("token_ids"), then.get("token_ids")
    if prefix:
        a, b = a[:len(b)], b[:len(a)]
        ta, tb = ta and tb and ta[:len(tb)], ta and tb and tb[:len(ta)]
    i = _departs(a, b)
    if ta and tb:
        t = _departs(ta, tb)
        if t is None:
            return ""
        where = f"token {t + 1} ({_at(ta, t)} now, {_at(tb, t)} then)"
    elif i is None:
        return ""
    else:
        where = f"character {i + 1}"
    i = i or 0
    return f"at {where}: now {a[i:i + 24]!r}, then {b[i:i + 24]!r}"


def _departs(a: Any, b: Any) -> int | None:
    """The first index where the sequences differ (a length counts), None when equal."""
    if a == b:
        return None
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _at(ids: list[int], i: int) -> str:
    return f"ID {ids[i]}" if i < len(ids) else "the end"


def compare(answers: list[dict], key: str, run_dir: Path,
            max_tokens: int) -> tuple[str | None, int, list[str], list[str]]:
    """(the earlier run folder compared with, or None; how many prompts were compared; each prompt
    that answers differently and where; the earlier run folders of other fingerprints, not
    compared). An earlier run of fingerprint ``key`` with no answer to compare (all failed, or to
    other prompts) is passed over for the next earlier one."""
    others = []
    for folder, data in earlier(run_dir):
        if data.get("fingerprint") != key:
            others.append(str(folder))
            continue
        then = {a.get("prompt"): a for a in data.get("answers") or () if not a.get("error")}
        both = [a for a in answers if not a["error"] and a["prompt"] in then]
        if not both:
            continue
        prefix = data.get("max_tokens") != max_tokens
        diffs = [f"{a['prompt']!r} {where}" for a in both if (where := first_difference(a, then[a["prompt"]], prefix))]
        return str(folder), len(both), diffs, others
    return None, 0, [], others


def run(base_url: str, model: str, key: str, run_dir: Path, *, max_tokens: int = 32,
        api_key: str = "EMPTY", timeout: float = 120.0, unread: dict[str, str] | None = None) -> KnownAnswers:
    """Ask the known answers and compare them with the newest earlier run of fingerprint ``key``
    beside ``run_dir`` (before this run's answers are kept: :meth:`KnownAnswers.save`). ``unread``:
    what the fingerprint could not read; when anything, the answers are kept but not compared."""
    answers = ask(base_url, model, max_tokens=max_tokens, api_key=api_key, timeout=timeout)
    if unread:
        why = "; ".join(f"{k}: {v}" for k, v in unread.items())
        return KnownAnswers(key, run_dir.name, model, max_tokens, answers,
                            not_compared=f"fingerprint incomplete ({why})")
    folder, n, diffs, others = compare(answers, key, run_dir, max_tokens)
    return KnownAnswers(key, run_dir.name, model, max_tokens, answers, compared_with=folder, compared=n,
                        differences=diffs, other_fingerprints=others)


def checks(k: KnownAnswers) -> list[Check]:
    """One row: FAIL when a prompt could not be asked or answers differently from the newest
    earlier run of the same fingerprint; SKIP when the fingerprint is incomplete; else PASS (the
    same, or recorded as the first)."""
    asked = f"POST /v1/chat/completions x{len(k.answers)}: temperature 0, max_tokens {k.max_tokens} " \
            "with ignore_eos, return_token_ids, a cache_salt each, one at a time"
    failed = [a for a in k.answers if a["error"]]
    if failed:
        return [Check(CHECK, "api", FAIL, "; ".join(f"{a['prompt']!r}: {a['error']}" for a in failed),
                      EXPECTED, "see the smoke checks above and the server's log", asked)]
    n, key = len(k.answers), k.fingerprint
    if k.not_compared:
        return [Check(CHECK, "api", SKIP, f"not compared: {k.not_compared}; {n} answers recorded", EXPECTED,
                      "the fingerprint (fingerprint.json) could not read everything that decides the answers: "
                      "once it can (the nodes answer, the image can be inspected), a run records and compares",
                      asked)]
    if k.differences:
        return [Check(CHECK, "api", FAIL, f"{len(k.differences)} of {k.compared} differ from {k.compared_with}, "
                      f"the same fingerprint {key}: " + "; ".join(k.differences), EXPECTED,
                      "greedy answers of the same software and hardware repeat token for token: silent "
                      "numerical corruption, a broken GPU, driver or firmware, or a nondeterministic "
                      "kernel. Rerun 06 to confirm; compare the nodes' preflight (01_preflight.ipynb) of "
                      "both runs", asked)]
    if k.compared_with:
        seen = f"{k.compared} answers the same as {k.compared_with} (fingerprint {key})"
        if k.compared < n:
            seen += f"; {n - k.compared} not compared (not answered there)"
    else:
        seen = f"recorded, first run of this fingerprint ({key})"
    if k.other_fingerprints:
        seen += f"; not compared with {len(k.other_fingerprints)} earlier run(s) of other fingerprints " \
                f"(newest {Path(k.other_fingerprints[0]).name})"
    return [Check(CHECK, "api", PASS, seen, EXPECTED, command=asked)]


def table(k: KnownAnswers) -> Table:
    """Each prompt, the start of its answer and its length."""
    return Table(["prompt", "answer", "tokens", "finish"],
                 [[a["prompt"], a["error"] or a["text"], a["output_tokens"], a["finish_reason"]] for a in k.answers],
                 title=f"known answers of {k.model}, fingerprint {k.fingerprint}")
