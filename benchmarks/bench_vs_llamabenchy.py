"""sparkbook's leaderboard measurement (``benchmark.profile: spark-arena``, sparkbook/bench/board.py)
against llama-benchy 0.4.0, the tool behind the Spark Arena board's numbers, on the same lab
endpoint in one run: alternating pairs, and for every cell of llama-benchy's table the ratio
sparkbook / llama-benchy with its 95 % confidence interval over the pairs.

llama-benchy runs as the board runs it (spark-arena/recipe-registry benchmarking/spark-arena-v1.yaml:
``prefix_caching: true``; everything else its defaults: 3 runs after a warm-up run, the server's
sampling, no --exact-tg, latency mode ``api``), on a grid that fits the lab (the lab model's
max_model_len is 2048, which holds no spark-arena cell of a 2048-token prompt): ``--pp 256 --tg 32
--depth 0 1024 --concurrency 1 2 4`` by default. Lab-only differences, each for both tools:

- ``--skip-coherence``: its coherence test asks for the capital of France, which the lab's tiny
  model (trained on the smoke test's exchanges) does not know;
- its corpus: llama-benchy cuts prompts from a book it downloads (Project Gutenberg); this machine
  has no route there, so the script writes a text of sparkbook's prompt words (seeded) into
  llama-benchy's own cache (``~/.cache/llama-benchy/<md5 of --book-url>.txt``), and both tools
  prompt with the same words;
- its tokenizer: the lab model's ``tokenizer.json`` (``--tokenizer``).

Goals (the benchmark issue): decode figures (``tg`` rows' t/s, t/s (req), peak t/s) within 3 %,
prefill (``pp`` rows' t/s) and first-token times (ttfr, est_ppt, e2e_ttft) within 10 %.

Two targets (``--server``): ``lab`` (the default) is the lab's vLLM, whose speed on two shared
cores moves 15-20 % from one run to the next, so the interval says how many pairs a goal needs;
``paced`` is the tests' fake OpenAI server (tests/fake_openai.py) in a process of its own, with a
fixed TTFT and time per token, counting tokens with the lab model's tokenizer as llama-benchy
does, so that what is left is the tools' own measurement (their clocks, definitions, totals and
client overhead), not the server's noise.

``lab`` needs root and ``sparkbook lab up``; it brings up what serving needs and leaves the lab as
found (benchmarks/labserving.py). llama-benchy is installed on first use in a venv of its own under
``~/.cache/sparkbook/llama-benchy-0.4.0`` (pip, from the configured index).

    .venv/bin/python benchmarks/bench_vs_llamabenchy.py [--server lab|paced] [--pairs 5] [--pp 256] [--tg 32]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import random
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sparkbook.bench import load as bench_load
from sparkbook.bench.prompts import VOCAB
from sparkbook.bench.records import BOARD_METRICS
from sparkbook.book.samples import ratio_interval
from sparkbook.lab.image import model_dir
from sparkbook.params import endpoint as served_api
from sparkbook.serving.commands import api_key

VERSION = "0.4.0"
VENV = Path.home() / ".cache" / "sparkbook" / f"llama-benchy-{VERSION}"
BOOK_URL = "https://sparkbook.invalid/lab-corpus.txt"  # never fetched: its text is put in the cache
BOOK_WORDS = 200_000
GOAL = {"decode": 0.03, "prefill": 0.10, "ttft": 0.10}


def goal_of(test: str, metric: str) -> str:
    if metric in ("ttfr", "est_ppt", "e2e_ttft"):
        return "ttft"
    return "decode" if test.split()[0].startswith(("tg", "ctx_tg")) else "prefill"


def llama_benchy() -> Path:
    """llama-benchy's command, installed in its own venv on first use."""
    exe = VENV / "bin" / "llama-benchy"
    if not exe.exists():
        print(f"installing llama-benchy {VERSION} in {VENV}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"llama-benchy=={VERSION}"], check=True)
    return exe


def seed_corpus() -> None:
    """llama-benchy's cached book for BOOK_URL: sparkbook's prompt words, seeded."""
    cache = Path.home() / ".cache" / "llama-benchy"
    cache.mkdir(parents=True, exist_ok=True)
    rng = random.Random("llama-benchy corpus")
    path = cache / f"{hashlib.md5(BOOK_URL.encode()).hexdigest()}.txt"
    path.write_text(" ".join(rng.choice(VOCAB) for _ in range(BOOK_WORDS)) + "\n")


def theirs(exe: Path, url: str, model: str, args, out: Path) -> dict[str, dict]:
    """One llama-benchy run: its rows by test name (the means of its CSV)."""
    cmd = [str(exe), "--base-url", served_api.urls(url)[0], "--model", model,
           "--served-model-name", model, "--tokenizer", str(model_dir()),
           "--pp", str(args.pp), "--tg", str(args.tg), "--depth", *map(str, args.depths),
           "--concurrency", *map(str, args.concurrency), "--runs", str(args.runs),
           "--enable-prefix-caching", "--skip-coherence", "--book-url", BOOK_URL,
           "--format", "csv", "--save-result", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0 or not out.exists():
        raise SystemExit(f"llama-benchy failed ({r.returncode}): {(r.stdout + r.stderr)[-3000:]}")
    with out.open() as f:
        return {row["test_name"]: {k: float(row[f"{k}_mean"]) if row[f"{k}_mean"] else None
                                   for k in BOARD_METRICS} for row in csv.DictReader(f)}


def ours(url: str, model: str, args) -> tuple[dict[str, dict], list[dict]]:
    """One sparkbook run of the same grid: its rows by test name (means), and its levels."""
    levels = bench_load.run_board(url, model, depths=args.depths,
                                  concurrency=args.concurrency, prompt_tokens=args.pp, output_tokens=args.tg,
                                  runs=args.runs, progress=False, say=lambda *_: None)
    rows = {r["test_name"]: {k: (r[k] or {}).get("mean") for k in BOARD_METRICS}
            for lv in levels for r in lv.board["rows"]}
    return rows, [dataclasses.asdict(lv) | {"requests": None} for lv in levels]


@contextmanager
def target(args) -> Iterator[tuple[str, str, Path]]:
    """The endpoint both tools measure: (base URL, served model, run folder). ``lab``: the lab's
    vLLM (brought up as the runbook does, left as found); ``paced``: the tests' fake OpenAI server
    (tests/fake_openai.py) in a process of its own, answering after a fixed TTFT with tokens at a
    fixed pace, so that what differs is the two tools' measurement, not the server's speed."""
    from labserving import paced_server, serving  # beside this script
    if args.server == "lab":
        with serving("bench-vs-llamabenchy") as (lab, params, cluster, run_dir):
            if api_key(params):
                raise SystemExit("llama-benchy takes an API key only on its command line (--api-key), where "
                                 "sparkbook puts no secret: run this against a lab without serving.api_key_env")
            yield params.endpoint, params.served_model, run_dir
        return
    # the server counts tokens with the tokenizer llama-benchy is given (its toy count would read
    # llama-benchy's prompts 15-20 % longer than llama-benchy sized them, and its prefill t/s so)
    with paced_server("127.0.0.1", "fake-model", args.paced_ttft, args.paced_itl,
                      tokenizer=model_dir() / "tokenizer.json", python=VENV / "bin" / "python") as paced:
        yield paced.url, "fake-model", Path("outputs") / f"bench-vs-llamabenchy-paced-{time.strftime('%Y%m%dT%H%M%S')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", choices=("lab", "paced"), default="lab", help="what both tools measure")
    ap.add_argument("--pairs", type=int, default=5, help="alternating pairs (default: 5)")
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 1024])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--runs", type=int, default=3, help="measured runs per cell (llama-benchy's --runs)")
    ap.add_argument("--paced-ttft", type=float, default=0.05, help="the paced server's TTFT (s)")
    ap.add_argument("--paced-itl", type=float, default=0.02, help="the paced server's time per token (s)")
    args = ap.parse_args()
    exe = llama_benchy()
    seed_corpus()
    with target(args) as (url, model, run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        pairs = []
        for i in range(args.pairs):
            started = time.monotonic()
            if i % 2 == 0:
                mine, levels = ours(url, model, args)
            ref = theirs(exe, url, model, args, run_dir / f"llama-benchy-{i}.csv")
            if i % 2 == 1:
                mine, levels = ours(url, model, args)
            pairs.append({"ours": mine, "llama_benchy": ref, "levels": levels})
            print(f"pair {i + 1}/{args.pairs} in {time.monotonic() - started:.0f} s "
                  f"({'sparkbook first' if i % 2 == 0 else 'llama-benchy first'})", flush=True)
        report(args, pairs, run_dir)


def report(args, pairs: list[dict], run_dir: Path) -> None:
    """Every cell's ratio with its interval, against its goal; the JSON in the run folder."""
    tests = [t for t in pairs[0]["llama_benchy"] if t in pairs[0]["ours"]]
    missing = sorted(set(pairs[0]["llama_benchy"]) ^ set(pairs[0]["ours"]))
    cells, met, judged = [], 0, 0
    print(f"\nsparkbook / llama-benchy {VERSION}, geometric mean of {len(pairs)} alternating pairs "
          "[95 % interval]; goal: decode within 3 %, prefill and first-token times within 10 %")
    print(f"{'test':<24} " + " ".join(f"{m:>22}" for m in BOARD_METRICS))
    for t in tests:
        line = f"{t:<24} "
        for m in BOARD_METRICS:
            ratios = [p["ours"][t][m] / p["llama_benchy"][t][m] for p in pairs
                      if p["ours"].get(t, {}).get(m) and p["llama_benchy"][t].get(m)]
            ci = ratio_interval(ratios)
            if ci is None:
                line += f"{'-':>22} "
                continue
            g = GOAL[goal_of(t, m)]
            inside = 1 - g <= ci[1] and ci[2] <= 1 + g
            judged += 1
            met += inside
            cells.append({"test": t, "metric": m, "ratios": ratios, "mean": ci[0], "low": ci[1],
                          "high": ci[2], "goal": g, "met": inside})
            line += f"{ci[0]:>7.3f} [{ci[1]:.3f}-{ci[2]:.3f}]{'' if inside else '*'} "
        print(line)
    print(f"* the interval is not inside its goal; {met} of {judged} cells meet theirs")
    if missing:
        print(f"rows only one tool printed: {', '.join(missing)}")
    out = run_dir / "bench_vs_llamabenchy.json"
    out.write_text(json.dumps({"args": vars(args), "cells": cells, "pairs": pairs}, indent=1) + "\n")
    print(f"saved: {out}")


if __name__ == "__main__":
    main()
