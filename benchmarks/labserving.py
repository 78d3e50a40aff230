"""A served model on the lab for the benchmark scripts (``bench_vs_*.py`` beside it): what the
parameters' path needs brought up as the runbook brings it up, and the lab left as it was found.

:func:`serving` runs 03's image and model copies (each keeps what is already right) and, with the
Ray executor, 04's Ray cluster, then 05's serve (kept if already up), under the runbook's lock so
that no run of the runbook goes on meanwhile. At the end, also when interrupted (Ctrl-C, SIGTERM):
the benchmark's own containers off the head, and what it started removed as 08 removes it; a
deployment that was already serving stays, and a Ray cluster that was already up stays with vLLM
stopped in it.

:func:`paced_server` is the other target: the tests' fake OpenAI server (tests/fake_openai.py) in a
process of its own, with a fixed TTFT and time per token, so that what differs between two clients
is their own measurement, not the server's speed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from sparkbook.book.verdict import FAIL, Verdict
from sparkbook.distribution.image import distribute_image, image_checks
from sparkbook.distribution.model import model_checks, sync_model
from sparkbook.lab import Lab
from sparkbook.nodes import lock
from sparkbook.nodes.remote import Cluster
from sparkbook.nodes.workdir import prepare
from sparkbook.notebook import default_run_dir
from sparkbook.params import Params
from sparkbook.serving.deploy import healthy, ray_running, remove_serving, serve
from sparkbook.serving.ray import form_ray_cluster
from sparkbook.serving.state import node_states
from sparkbook.serving.teardown import teardown
from sparkbook.steps import distribute as distribute_step, ray_cluster as ray_step, serve as serve_step


@contextmanager
def serving(name: str, containers: Sequence[str] = ()) -> Iterator[tuple[Lab, Params, Cluster, Path]]:
    """The lab serving its parameters' model: ``(lab, params, cluster, run_dir)``, the run folder
    ``outputs/<name>-<time>``. ``containers``: the benchmark's own containers on the head, removed
    at the end (an interruption leaves them running)."""
    lab = Lab()
    params = lab.params()
    cluster = Cluster.from_params(params)
    run_dir = default_run_dir(params).parent / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    with lab.as_found():
        prepare(params, cluster, [params.head])
        held = lock.acquire(params, cluster, str(run_dir))
        was_serving, dep = healthy(params).ready, None
        ray_was_up = params.serving.executor == "ray" and ray_running(params, node_states(params, cluster))
        try:
            if not was_serving:
                copied = image_checks(params, distribute_image(params, cluster)) + model_checks(
                    params, sync_model(params, cluster))
                if any(c.status == FAIL for c in copied):
                    raise SystemExit(Verdict(distribute_step.TITLE, copied).to_text())
                if params.serving.executor == "ray":
                    rc = form_ray_cluster(params, cluster, run_dir, say=print)
                    if rc.missing:
                        raise SystemExit(Verdict(ray_step.TITLE, ray_step.checks(params, rc)).to_text())
            dep = serve(params, cluster, run_dir, say=print)
            if not dep.ready:
                raise SystemExit(Verdict(serve_step.TITLE, serve_step.checks(params, dep)).to_text())
            yield lab, params, cluster, run_dir
        finally:
            leave_as_found(params, cluster, run_dir, containers,
                           kept=was_serving and (dep is None or dep.action == "kept"), ray_kept=ray_was_up)
            held.release()


def leave_as_found(params: Params, cluster: Cluster, run_dir: Path, containers: Sequence[str], kept: bool,
                   ray_kept: bool = False) -> None:
    """The benchmark's containers off the head; and, unless vLLM was already serving before the
    benchmark and still is the same, what the benchmark started: vLLM alone where the Ray cluster
    was up before, else everything, as 08 removes it (logs kept in the run folder first)."""
    if containers:
        cluster.run_on(params.head, ["docker", "rm", "-f", *containers], timeout=60)
    if kept:
        print("vLLM was serving before the benchmark: left serving")
        return
    if ray_kept:
        remove_serving(params, cluster)
        print("the Ray cluster was up before the benchmark: left up, with vLLM stopped in it")
        return
    out = teardown(params, cluster, run_dir)
    print("removed what the benchmark started: " + (", ".join(
        f"{n}: {' '.join(c)}" for n, c in out.removed.items()) or "nothing was left running"))
    if out.remaining or out.listeners or out.errors:
        print(f"still on the nodes: {out.remaining or ''} {out.listeners or ''} {out.errors or ''}")


# The paced server (argv: the tests' folder, address, model, TTFT s, time per token s, and a
# tokenizer.json or ""): for each line "served" on its standard input, a line of JSON: the
# (arrival, first token) times of the generations since the last; it ends when its input closes
PACED = """
import json, sys
sys.path.insert(0, sys.argv[1])
from fake_openai import FakeOpenAI
knobs = {}
if sys.argv[6]:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(sys.argv[6])
    knobs["count"] = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
with FakeOpenAI(model=sys.argv[3], host=sys.argv[2], eos_after=1 << 20, ttft=float(sys.argv[4]),
                token_delay=float(sys.argv[5]), **knobs) as fake:
    print(fake.url, flush=True)
    for line in sys.stdin:
        served, fake.served = fake.served, []
        print(json.dumps(served), flush=True)
"""


class Paced:
    """The paced server's process: its base URL, and what it served."""

    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url

    def served(self) -> list[tuple[float, float]]:
        """The (arrival, first token) times, ``time.perf_counter()`` seconds (one clock for every
        process of this machine, containers too), of the generations since the last call."""
        self.proc.stdin.write("served\n")
        self.proc.stdin.flush()
        return [tuple(x) for x in json.loads(self.proc.stdout.readline())]


@contextmanager
def paced_server(host: str, model: str, ttft: float, itl: float, tokenizer: Path | None = None,
                 python: Path | str = sys.executable) -> Iterator[Paced]:
    """The paced fake server on ``host`` serving ``model``, in a process of its own (``python``).
    ``tokenizer``: a ``tokenizer.json`` whose counts it reports (``/tokenize`` and usage;
    ``python`` must have the ``tokenizers`` package), so that a client that sizes prompts with that
    tokenizer reads the same counts back; else its toy count (a token per 4 letters). Stopped at
    the end (its standard input closed)."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    proc = subprocess.Popen([str(python), "-c", PACED, str(tests), host, model, str(ttft), str(itl),
                             str(tokenizer or "")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        if not url:
            raise SystemExit("the paced server did not start")
        yield Paced(proc, url)
    finally:
        proc.stdin.close()
        proc.wait(10)
