"""The failure signatures (sparkbook.facts.signatures) on real log lines from public threads
(tests/fixtures/logs/, each naming its source), on real DGX Spark logs (../shared/field-samples),
02's and 05's use of the one table, and ``sparkbook diagnose``."""

import dataclasses
import io
import re
import textwrap
from pathlib import Path

import pytest
from conftest import field_sample

from sparkbook.collectives import sweep as collectives
from sparkbook.facts import known_failures, signatures
from sparkbook.cli import main
from sparkbook.params import load

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "fixtures" / "logs"
FIXTURES = sorted(p for p in LOGS.glob("*.txt") if not p.name.startswith("clean-"))
CLEAN = sorted(LOGS.glob("clean-*.txt"))
# Signatures for which no public log line was found (written from vLLM's and Ray's source).
NO_PUBLIC_LINE = {"nnodes-world-size", "cuda-graph-hang", "ray-unsupported-platform", "nccl-version-mismatch"}


def fixture(path: Path) -> str:
    """A fixture's log lines, without its two header lines (source, note)."""
    lines = path.read_text().splitlines(keepends=True)
    assert lines[0].startswith("# source: https://"), f"{path.name}: first line must name the source"
    assert lines[1].startswith("# note: "), f"{path.name}: second line must say what it shows"
    return "".join(lines[2:])


def signature_of(path: Path) -> str:
    return path.stem.rsplit("-", 1)[0]


def test_the_table_is_well_formed_and_every_signature_has_a_real_line_or_says_why_not():
    names = [s.name for s in signatures.SIGNATURES]
    assert len(names) == len(set(names))
    for s in signatures.SIGNATURES:
        assert s.phase in known_failures.PHASES and set(s.steps) <= set(known_failures.ALL_STEPS), s.name
        assert s.cause and s.remedy, s.name
    covered = {signature_of(p) for p in FIXTURES}
    assert covered <= set(names), covered - set(names)
    assert set(names) - covered == NO_PUBLIC_LINE


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_signature_matches_its_real_log_lines(path):
    hit = signatures.first(fixture(path))
    assert hit is not None and hit.name == signature_of(path), (hit, path.name)
    assert hit.evidence and hit.cause and hit.remedy and hit.line >= 1


def source_of(path: Path) -> str:
    """A fixture's source as the table's ``written_from`` names it: ``owner/repo#N`` for a GitHub
    issue or pull request, else the page's host and path."""
    url = path.read_text().split("\n", 1)[0].removeprefix("# source: https://").strip()
    if m := re.match(r"github\.com/([^/]+/[^/]+)/(?:issues|pull|discussions)/(\d+)", url):
        return f"{m[1]}#{m[2]}"
    return url.split("#")[0].rstrip("/")


MINED = [p for p in FIXTURES if signatures.BY_NAME[signature_of(p)].written_from]
# Public logs whose form of the message was found in that one thread only (a second was searched
# for): the leave-one-source-out test cannot hold them, so each is named here with why.
ONE_SOURCE = {
    "gloo-bad-ifname-1": "GLOO_SOCKET_IFNAME naming no interface: one public log",
    "pp-not-supported-1": "vLLM's refusal of pipeline parallel for a model: one log (others quote it in prose)",
    "parser-unknown-1": "the KeyError form for a tool-call parser: one log",
    "parser-unknown-2": "the KeyError form for a reasoning parser: one log",
    "parser-unknown-3": "argparse's refusal of a tool-call parser: one log",
    "nccl-peer-unreachable-4": "NCCL's socket creation refused by the address family: one log",
    "shm-too-small-7": "a semaphore that /dev/shm could not hold: one log",
}


def test_every_pattern_was_written_from_logs_it_matches():
    """A pattern that names a log it was written from matches a line of that log, filed under
    whichever signature names the log first (the record cannot drift from the fixtures)."""
    by_source = {}
    for path in FIXTURES + CLEAN:
        by_source.setdefault(source_of(path), []).append(fixture(path))
    for sig in signatures.SIGNATURES:
        for pattern, sources in zip(sig.patterns, sig.written_from):
            assert sources, f"{sig.name}: {pattern.pattern!r} names no log it was written from"
            for source in sources:
                assert source in by_source, f"{sig.name}: no fixture from {source}"
                lines = [signatures.clean(ln) for log in by_source[source] for ln in log.split("\n")]
                assert any(pattern.search(ln) for ln in lines), (sig.name, pattern.pattern, source)


@pytest.mark.parametrize("path", MINED, ids=lambda p: p.stem)
def test_leave_one_source_out(path):
    """Each public log is still named, by the right signature, when every pattern written only
    from its own source is taken away: what names it was written from other threads' logs."""
    name, source = signature_of(path), source_of(path)
    if path.stem in ONE_SOURCE:
        pytest.skip(f"{path.stem}: {ONE_SOURCE[path.stem]} ({source})")
    sig = signatures.BY_NAME[name]
    kept = [(p, w) for p, w in zip(sig.patterns, sig.written_from) if set(w) - {source}]
    assert kept, f"{name}: every pattern was written from {source} alone"
    held_out = dataclasses.replace(sig, patterns=tuple(p for p, _ in kept), written_from=tuple(w for _, w in kept))
    scan = signatures.Scan()
    scan.table = [held_out if s.name == name else s for s in scan.table]
    for line in fixture(path).split("\n"):
        scan.feed(line)
    found = scan.matches()
    assert found and found[0].name == name, (source, [(m.name, m.evidence) for m in found])


def test_each_mined_signature_was_written_from_two_sources_or_says_why_not():
    sources = {}
    for path in MINED:
        sources.setdefault(signature_of(path), set()).add(source_of(path))
    for name, found in sources.items():
        alone = {p.stem for p in MINED if signature_of(p) == name} <= set(ONE_SOURCE)
        assert len(found) >= 2 or alone, f"{name}: written from {found} only"
    assert {stem.rsplit("-", 1)[0] for stem in ONE_SOURCE} <= set(sources)


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.stem)
def test_lines_that_look_alike_but_are_not_failures_name_nothing(path):
    assert signatures.match(fixture(path)) == []


def test_a_failed_pull_is_the_registrys_refusal_and_ptxas_is_tritons_not_the_images():
    """Docker's "Unable to find image ... locally" comes before every first pull (it names nothing:
    clean-image-not-found-locally-1); where the pull then fails, the evidence is the registry's
    refusal. Triton's ptxas that does not know sm_121a is named with its own remedy, not as an
    image built for another GPU. (PyTorch's warning on every Spark that GB10's capability 12.1 is
    above its 12.0, and compose's pull Warning for an image it then builds, are clean-* logs.)"""
    found = signatures.match(fixture(LOGS / "image-not-available-1.txt"))
    assert [(m.name, m.count) for m in found] == [("image-not-available", 1)]
    assert "pull access denied" in found[0].evidence and "locally" not in found[0].evidence
    for n in (1, 2, 4):
        found = signatures.match(fixture(LOGS / f"triton-ptxas-arch-{n}.txt"))
        assert [m.name for m in found] == ["triton-ptxas-arch"] and "TRITON_PTXAS_PATH" in found[0].remedy


def test_real_dgx_spark_logs():
    hit = signatures.first(field_sample("vllm-error-ray-channel-timeout-1.txt"))
    assert hit.name == "nccl-timeout" and "RayChannelTimeoutError" in hit.evidence
    hit = signatures.first(field_sample("vllm-warning-tp-exceeds-gpus-1.txt"))
    assert hit.name == "tp-exceeds-gpus" and "Tensor parallel size (2)" in hit.evidence


@pytest.mark.parametrize("name", ["vllm-ray-head-startup-1.txt", "vllm-ray-worker-startup-1.txt"])
def test_a_clean_start_up_on_two_sparks_names_nothing(name):
    # the head's log holds "Tensor parallel size (2) exceeds available GPUs (1)" and "is bigger
    # than a reserved number of GPUs": warnings the start-up went past, and CUDA graph capture
    # that finished
    assert signatures.match(field_sample(name)) == []


def test_a_spark_start_up_that_stops_at_the_cross_node_all_reduce_is_the_init_hang():
    """The DGX Spark pair's clean vLLM start-up (its worker's line that custom all-reduce is off
    across nodes, then weights, KV cache and the API) cut where the reported hang stopped: named,
    in distributed init; the whole log names nothing (test_a_clean_start_up_on_two_sparks_...)."""
    lines = field_sample("vllm-ray-head-startup-1.txt").splitlines()
    cut = next(i for i, line in enumerate(lines) if "Custom allreduce is disabled" in line)
    hit = signatures.first("\n".join(lines[:cut + 1]))
    assert hit.name == "cross-node-init-hang" and hit.phase == "distributed init", hit
    assert (hit.reason, hit.fix, hit.catch_all) == ("fabric", "version", False)


def test_a_log_that_ends_in_graph_capture_is_a_hang_and_shutdown_lines_do_not_hide_it():
    head = field_sample("vllm-ray-head-startup-1.txt").split("\n")
    cut = next(i for i, ln in enumerate(head) if "Capturing CUDA graphs" in ln and "2/51" in ln)
    stopped = "\n".join(head[:cut + 1])
    hit = signatures.first(stopped)
    assert hit.name == "cuda-graph-hang" and hit.line == cut + 1 and hit.phase == "graph capture"
    shutdown = field_sample("vllm-error-ray-channel-timeout-1.txt").rstrip().split("\n")[-1]
    assert "Shutting down" in shutdown
    assert signatures.first(stopped + "\n" + shutdown).name == "cuda-graph-hang"
    went_on = next(j for j in range(cut, len(head)) if "Available KV cache memory" in head[j])
    assert signatures.match("\n".join(head[:went_on + 1])) == []  # the log went on: not a hang


def test_a_warning_is_void_once_the_start_up_goes_on():
    warning = fixture(LOGS / "ray-placement-group-2.txt")
    assert signatures.first(warning).name == "ray-placement-group"
    head = field_sample("vllm-ray-head-startup-1.txt")
    progress = next(ln for ln in head.split("\n") if "world_size=2 rank=0" in ln)
    assert signatures.match(warning + progress + "\n") == []


def test_the_engines_wait_for_its_workers_is_a_hang_only_as_the_logs_last_word():
    """vLLM repeats "No available shared memory broadcast block found" while a worker compiles
    (vllm-project/vllm-ascend#9287: a warning, then it served) and while one hangs: named only
    where the log ends on it, and not once the start-up went on."""
    waiting = fixture(LOGS / "shm-broadcast-stall-3.txt")
    assert signatures.first(waiting).name == "shm-broadcast-stall"
    head = field_sample("vllm-ray-head-startup-1.txt")
    progress = next(ln for ln in head.split("\n") if "Available KV cache memory" in ln)
    assert signatures.match(waiting + progress + "\n") == []
    # an RDMA failure before it is the cause (eugr/spark-vllm-docker#150, two DGX Sparks)
    found = signatures.match(fixture(LOGS / "ib-completion-error-5.txt"))
    assert [h.name for h in found] == ["ib-completion-error", "shm-broadcast-stall"]


def test_colour_codes_prefixes_and_hard_wrapped_lines_are_read_through():
    hit = signatures.first(fixture(LOGS / "ray-oom-killer-2.txt"))  # syslog's #033[..m, wrapped
    assert "#033" not in hit.evidence and hit.line == 2
    text = fixture(LOGS / "kv-cache-too-small-1.txt")
    wrapped = "\n".join(textwrap.wrap(text.split("\n")[-2], 80))  # as pasted from a terminal
    hit = signatures.first(wrapped)
    assert hit.name == "kv-cache-too-small" and "KV cache is needed" in hit.evidence


def test_each_line_belongs_to_the_most_specific_signature():
    found = signatures.match(fixture(LOGS / "nccl-no-interface-1.txt"))
    assert [h.name for h in found] == ["nccl-no-interface", "nccl-error"]
    assert found[0].detail.endswith("Bootstrap : no socket interface found")
    found = signatures.match(fixture(LOGS / "ray-placement-group-1.txt"))
    assert [(h.name, h.count) for h in found] == [("ray-placement-group", 2), ("tp-exceeds-gpus", 1)]
    hit = signatures.first(fixture(LOGS / "nccl-error-2.txt"))
    assert hit.detail.startswith("socketProgressOpt: Call to recv") and "remote process" in hit.evidence


def test_a_step_keeps_the_signatures_its_logs_can_hold():
    refused = fixture(LOGS / "unrecognized-arguments-1.txt")
    assert signatures.first(refused).name == "unrecognized-arguments"
    assert signatures.match(refused, step="02") == []  # torchrun's script is sparkbook's own
    swallowed = fixture(LOGS / "entrypoint-swallowed-command-1.txt")
    assert signatures.first(swallowed, step="02").name == "entrypoint-swallowed-command"


def test_the_last_error_line_is_kept_for_failures_no_signature_names():
    assert signatures.last_error("INFO fine\n(Worker pid=3) ERROR: boom happened\nINFO after\n") == \
        "ERROR: boom happened"
    assert signatures.last_error("INFO all good\n") == ""


def _sweep(logs, phases):
    return collectives.Sweep("nccl", phases=phases, logs=logs)


def test_02_names_a_command_swallowed_by_the_entrypoint_instead_of_guessing_the_network():
    p = load(ROOT / "parameters" / "lab.yaml")
    logs = {"spark-1": fixture(LOGS / "entrypoint-swallowed-command-1.txt"), "spark-2": ""}
    phase, cause = collectives.diagnose(p, _sweep(logs, {"spark-1": "rendezvous", "spark-2": "rendezvous"}))
    assert phase == "rendezvous" and "ENTRYPOINT" in cause and "spark-1" in cause
    assert "firewall" not in cause and "unrecognized arguments: serve" in cause
    logs = {"spark-1": "", "spark-2": fixture(LOGS / "nccl-error-3.txt")}
    phase, cause = collectives.diagnose(p, _sweep(logs, {"spark-1": "started", "spark-2": "started"}))
    assert phase == "communicator init" and "NCCL failed" in cause and "NCCL WARN Net" in cause
    logs = {"spark-1": "x RuntimeError: something else\n", "spark-2": ""}
    phase, cause = collectives.diagnose(p, _sweep(logs, {"spark-1": "init-done", "spark-2": "done"}))
    assert phase == "first collective" and "MTU" in cause and "something else" in cause


def test_diagnose_names_each_failure_with_its_file_and_line(capsys):
    path = LOGS / "port-in-use-1.txt"
    assert main(["diagnose", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"port-in-use at {path}:7, start-up phase: container" in out  # two header lines, then the fifth log line
    assert "a port is already in use" in out and "address already in use" in out and "ss -ltnp" in out


def test_every_signature_has_a_class_of_cause_and_of_remedy_and_the_catch_alls_come_after_the_causes():
    """The catch-alls (NCCL's error, an engine's "see the root cause above") say so, and a cause
    named in the same log comes first: the engine-core wrapper after a worker's NCCL failure."""
    for sig in known_failures.SIGNATURES:
        assert sig.reason in known_failures.REASONS and sig.fix in known_failures.FIXES, sig.name
    assert [s.name for s in known_failures.SIGNATURES if s.catch_all] == ["nccl-error", "engine-failed-see-above"]
    assert known_failures.SIGNATURES[-1].name == "engine-failed-see-above"
    found = signatures.match(fixture(LOGS / "nccl-cuda-unsupported-op-1.txt"))
    assert [h.name for h in found] == ["nccl-cuda-unsupported-op", "engine-failed-see-above"]


def test_diagnose_json_gives_each_finding_with_its_classes_for_tools(capsys):
    """`diagnose --json`: one entry per log, each finding with its evidence, its classes and
    whether only a catch-all matched (the text says so too); the exit code as without --json."""
    import json
    specific, catch_all, clean = LOGS / "ray-node-dead-1.txt", LOGS / "nccl-error-1.txt", CLEAN[0]
    assert main(["diagnose", "--json", str(specific), str(catch_all), str(clean)]) == 1
    reports = json.loads(capsys.readouterr().out)
    assert [r["log"] for r in reports] == [str(specific), str(catch_all), str(clean)]
    assert reports[2]["findings"] == [] and reports[2]["lines"] > 0
    dead = {f["name"]: f for f in reports[0]["findings"]}["ray-node-dead"]
    assert (dead["reason"], dead["fix"], dead["catch_all"]) == ("transient", "restart", False)
    assert dead["evidence"] and dead["line"] > 2 and dead["source"] == str(specific)
    nccl = {f["name"]: f for f in reports[1]["findings"]}["nccl-error"]
    assert (nccl["reason"], nccl["fix"], nccl["catch_all"]) == ("fabric", "setting", True)
    assert main(["diagnose", "--json", str(clean)]) == 0 and json.loads(capsys.readouterr().out)[0]["findings"] == []
    assert main(["diagnose", str(catch_all)]) == 1
    assert "nccl-error at" in (out := capsys.readouterr().out) and "(a catch-all: its cause lists" in out


def test_diagnose_exits_0_on_a_clean_log_and_reads_several_files(capsys):
    clean = CLEAN[0]
    assert main(["diagnose", str(clean)]) == 0
    assert "no known failure" in capsys.readouterr().out
    assert main(["diagnose", str(clean), str(LOGS / "nccl-timeout-1.txt")]) == 1
    out = capsys.readouterr().out
    assert "no known failure" in out and "nccl-timeout at" in out and "(2 lines)" in out


def test_diagnose_reads_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(fixture(LOGS / "free-memory-at-startup-1.txt")))
    assert main(["diagnose", "-"]) == 1
    out = capsys.readouterr().out
    assert "free-memory-at-startup at <stdin>:1" in out and "gpu_memory_utilization" in out
    monkeypatch.setattr("sys.stdin", io.StringIO("INFO nothing wrong here\n"))
    assert main(["diagnose", "-"]) == 0


def test_diagnose_on_a_clean_dgx_spark_start_up_exits_0(tmp_path, capsys):
    log = tmp_path / "head.log"
    log.write_text(field_sample("vllm-ray-head-startup-1.txt"))
    assert main(["diagnose", str(log)]) == 0


def test_diagnose_says_which_file_it_cannot_read(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "missing.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
