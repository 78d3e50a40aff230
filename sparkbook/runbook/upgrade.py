"""Day two: a service moved to a new image only through a gate that rolls back by itself
(``sparkbook service upgrade``, notebooks/day_two.ipynb).

The service runs the image its basis run passed 05 and 06 on (the baseline). The upgrade keeps
that image on every serving node under ``REPO:sparkbook-previous`` (never deleted: it served
last), puts the candidate under the parameters' tag on the head, and runs 03 (the candidate onto
every node), 04, 05, 06 and 07 with the deployment's own parameters into a run folder of its own.
The gate then holds the candidate run against the baseline run (the compare code's numbers): no
failed step; the known answers the same, or each difference named (a WARN: a new vLLM's kernels may
change a token of a greedy answer); single-user decode and peak output throughput each at least
``min_ratio`` of the baseline's. No FAIL: the service is installed from the candidate run. A FAIL,
a promoted service that does not answer, or an upgrade that stops (an error, Ctrl-C): the tag goes
back to the previous image on every node, the service is installed again from the baseline run,
and 06 verifies it; the verdict says why.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..book.errors import CheckFailed
from ..book.verdict import FAIL, PASS, WARN, Check
from ..nodes.remote import Cluster
from ..params import Params, load
from ..record import folder
from ..record.compare import peak
from ..serving import service
from ..serving.state import node_states, service_states
from .runner import run

STEPS = "03,04,05,06,07"
KNOWN = "smoke/known_answers.json"
MIN_RATIO = 0.9  # the candidate's single-user decode and peak throughput, at least this of the baseline's


def keep_tag(params: Params) -> str:
    """The tag every node keeps the previous image under: the repository of ``runtime.image``."""
    image = params.runtime.image
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"{repo}:sparkbook-previous"


def known_answers(run_dir: Path) -> list[dict]:
    return (folder.read_json(run_dir, KNOWN) or {}).get("answers") or []


def gate(baseline: Path, candidate: Path, summary: dict, min_ratio: float = MIN_RATIO) -> list[Check]:
    """The candidate run against the baseline run."""
    failed = [f"{s['name']} {s['status']}" for s in summary.get("steps", []) if s["status"] != "passed"]
    rows = [Check("upgrade steps", "all", FAIL if failed else PASS,
                  ", ".join(failed) if failed else f"{STEPS} passed on the candidate", f"{STEPS} passed",
                  f"the verdicts in {candidate}" if failed else "")]
    then, now = known_answers(baseline), known_answers(candidate)
    if not now:
        rows.append(Check("upgrade known answers", "all", FAIL, "the candidate gave none (06 did not run)",
                          f"those of {baseline.name}"))
    else:
        by_prompt = {a["prompt"]: a.get("text") for a in then}
        differ = [a["prompt"] for a in now if a["prompt"] in by_prompt and a.get("text") != by_prompt[a["prompt"]]]
        rows.append(Check("upgrade known answers", "all", WARN if differ else PASS,
                          ("differ for: " + "; ".join(repr(p) for p in differ)) if differ else
                          f"{len(now)} answers the same as {baseline.name}",
                          f"the same tokens as {baseline.name}", "a candidate that answers otherwise is "
                          "another model to its users: compare the two runs (`sparkbook compare`)" if differ else ""))
    old, new = folder.results(baseline), folder.results(candidate)
    pairs = [("single-user decode", lambda b: (b.single_user() and b.single_user().decode_tok_s) or 0.0),
             ("peak output throughput", lambda b: (peak(b) and peak(b).output_tok_s) or 0.0)]
    for what, number in pairs:
        a, b = (number(old) if old else 0.0), (number(new) if new else 0.0)
        if not a:
            rows.append(Check(f"upgrade {what}", "all", FAIL, f"the baseline {baseline.name} has no 07 result",
                              "a baseline run with 07"))
            continue
        if not new:
            rows.append(Check(f"upgrade {what}", "all", FAIL, "none: 07 did not run on the candidate",
                              f"at least {min_ratio:g}x the baseline", f"the verdicts in {candidate}"))
            continue
        ratio = b / a
        rows.append(Check(f"upgrade {what}", "all", PASS if ratio >= min_ratio else FAIL,
                          f"{b:.1f} tok/s, {ratio:.2f}x the baseline's {a:.1f}", f"at least {min_ratio:g}x the baseline",
                          "" if ratio >= min_ratio else "the candidate is slower: its 07 levels beside the "
                          "baseline's (`sparkbook compare`)"))
    return rows


def upgrade(params_file: Path, cluster: Cluster, candidate: str, baseline: Path, outputs: Path,
            min_ratio: float = MIN_RATIO, say: Callable[[str], object] = print) -> list[Check]:
    """Try ``candidate`` in place of the image the service pins (as 05 and 06 passed on it in
    ``baseline``); promote it or roll back. The candidate's run and the rollback's 06 are run
    folders in ``outputs`` beside the deployment's others (a later install takes the newest that
    passed). The verdict's rows."""
    params = load(params_file)
    head, nodes = params.head, params.serving_nodes
    states = service_states(params, cluster)
    previous = states[head.name].pinned
    if not (previous and all(s.name for s in states.values())):
        raise CheckFailed("upgrade: no service of this deployment runs on every serving node: "
                          "`sparkbook service install -p FILE` first")
    found = cluster.run_on(head, ["docker", "image", "inspect", "--format", "{{.Id}}", candidate])
    if not found.ok:
        raise CheckFailed(f"upgrade: no image {candidate} on {head.name} ({found.summary()}): pull or build it there")
    tag, keep = params.runtime.image, keep_tag(params)
    say(f"upgrade: keeping {previous[:19]} as {keep} on every node; {candidate} under {tag} on {head.name}")
    cluster.run(["docker", "tag", previous, keep], nodes).check("keep the previous image on every node")
    service.uninstall(params, cluster)
    cluster.run(["docker", "tag", candidate, tag], [head]).check("tag the candidate")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    trial = outputs / f"{stamp}-{params.name}-upgrade-candidate"

    def roll_back(why: str) -> list[Check]:
        say(f"upgrade: {why}: rolling back to {previous[:19]}")
        cluster.run(["docker", "tag", previous, tag], nodes).check("put the tag back on the previous image")
        back = service.install(params, cluster, baseline, previous, say=say)
        verified = run(params_file, steps="06", out=outputs / f"{stamp}-{params.name}-upgrade-rollback", report=False)
        ok = back.ready and verified["status"] == "passed"
        return service.checks(params, back) + [
            Check("upgrade", "all", FAIL, f"rolled back to {previous[:19]} ({'06 passed on it' if ok else '06 FAILED on it'}): "
                  f"{why}", "promoted, or rolled back", f"the candidate's run: {trial}")]

    try:
        summary = run(params_file, steps=STEPS, out=trial, report=False)
        rows = gate(baseline, trial, summary, min_ratio)
        if not any(r.status == FAIL for r in rows):
            say("upgrade: the gate passed: promoting the candidate")
            image = node_states(params, cluster)[head.name].image
            installed = service.install(params, cluster, trial, image.id if image else None, say=say)
            if installed.ready:
                return rows + service.checks(params, installed) + [
                    Check("upgrade", "all", PASS, f"promoted: the service runs {candidate}; the previous image "
                          f"stays as {keep}", "promoted, or rolled back")]
            rows += service.checks(params, installed)
            why = "the promoted service did not answer"
        else:
            why = "the gate failed"
    except BaseException as e:  # an error or Ctrl-C: the service that served last comes back
        roll_back(f"the upgrade stopped ({type(e).__name__}: {e})")
        raise
    return rows + roll_back(f"{why} (" + "; ".join(f"{r.check}: {r.observed}" for r in rows if r.status == FAIL) + ")")
