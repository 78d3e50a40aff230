"""The signatures on the inputs that made their old patterns backtrack (issue 26: one 100 kB line
took 15-73 s, one of 1 MiB did not end in 600 s, while 02 and 05 held a failed deployment's GPUs),
``sparkbook diagnose`` on a 200 MiB file in bounded memory, and binary input read without a
traceback. Each runs in a child process with a timeout: a pattern that backtracks fails the test
instead of hanging the suite (the regex engine does not stop for a signal)."""

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkbook.facts import signatures

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20

# Each repeated to a 1 MiB line with no newline. The first ones are one token (no space); the
# others repeat the start of a pattern, so that each old pattern's repetition ran from every
# occurrence to the end of the line (found by timing every pattern on these strings).
WORST = {
    "one letter": "A",                       # \S+\.py before ": error:" (swallowed command)
    "dots": ".",                             # the same
    "NULs": "\0",                            # a binary file's run of zeros: \S too
    "argparse errors": "x.py: error: unrecognized arguments: '",  # .*? to the end, per message
    "quoted words": "vllm: error: unrecognized arguments: 'a",   # \S+\.py from every quote
    "architectures": "Model architecture ",  # [^\]]* to the end, per occurrence
    "architecture lists": "Model architectures [",
    "sm_ digits": "sm_1",                    # \d+\w*: every split of the digits
    "quoted sm_": "Value 'sm_1",
    "ibv_ words": "ibv_",                    # ibv_\w+ to the end of the word, per occurrence
    "NCCL calls": "Call to x ",              # the detail's .*failed
    "engine inits": "init engine ",          # PROGRESS's .* took (cleared_by)
    "missing tokenizers": "No such file or directory: 'tokenizer",
    "device drivers": "could not select device driver ",
    "exec stats": "exec: a: stat ",
    "process prefixes": "(RayWorkerWrapper pid=1) ",  # each prefix cut off a copy of the line
    "CSI": "\x1b[",
    "OSC 52": "\x1b]52;c;",
    "upper case": "TOKEN",
}
# Lines that claim the signatures a later line can void (cleared_by), so that their patterns run
# on the worst line too.
CLAIMS = ("Failed to connect to GCS at address 10.0.0.1:6379\n"
          "Waiting for creating a placement group of specs for 10 seconds\n"
          "Tensor parallel size (2) exceeds available GPUs (1)\n")
# Timed in the interpreter's CPU time (time.process_time): what a backtracking pattern burns, which
# other work on a loaded machine does not add to (wall time failed so under a nice 19 run).
LINE_S, TOTAL_S = 1.0, 4.0  # about 0.05 s a line, 1 s in all, on the 2-core development machines
WIDTH = 8192  # signatures.LINE_WIDTH: the most of a line that a pattern is matched on


def run(code: str, timeout: float, *args: str) -> tuple[dict, str]:
    """Run ``code`` in a fresh interpreter (this checkout's sparkbook): what its last line says as
    JSON, and all it printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not end within {timeout:g} s: a pattern backtracks")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1]), out.stdout


def test_a_line_of_1_mib_is_matched_in_bounded_time_whatever_it_repeats():
    took, _ = run("""
        import json, sys, time
        from sparkbook.facts import signatures
        worst, claims = json.loads(sys.argv[1]), sys.argv[2]
        took = {}
        for name, unit in worst.items():
            line = (unit * (2**20 // len(unit) + 1))[:2**20]
            start = time.process_time()
            found = signatures.match(claims + line + "\\n" + line)  # alone, then wrapped onto another
            signatures.last_error(line), signatures.ray_address(line)
            took[name] = time.process_time() - start
            assert found, name  # the claims still stand
        print(json.dumps(took))
    """, 120, json.dumps(WORST), CLAIMS)
    slow = {name: round(s, 2) for name, s in took.items() if s > LINE_S}
    assert not slow and sum(took.values()) < TOTAL_S, (slow, round(sum(took.values()), 2))


def test_every_pattern_is_quick_on_every_worst_line_at_the_width_it_is_matched_on():
    """Each pattern alone (the table's, what voids or details them, the noise and error lines) on
    each worst line cut to WIDTH, the most of a line any pattern sees."""
    took, _ = run("""
        import json, sys, time
        from sparkbook.facts import signatures as s
        patterns = {f"{sig.name}[{i}]": p for sig in s.SIGNATURES for i, p in enumerate(sig.patterns)}
        patterns |= {f"{sig.name} {what}": p for sig in s.SIGNATURES
                     for what, p in (("cleared_by", sig.cleared_by), ("detail", sig.detail)) if p}
        patterns |= {"noise": s._NOISE, "error line": s.ERROR_LINE, "all": s._ANY}
        worst, width = {}, int(sys.argv[2])
        for name, unit in json.loads(sys.argv[1]).items():
            line = (unit * (width // len(unit) + 1))[:width]
            for pname, p in patterns.items():
                start = time.process_time()
                p.search(line)
                worst[f"{pname} on {name}"] = time.process_time() - start
        print(json.dumps(worst))
    """, 120, json.dumps(WORST), str(WIDTH))
    slow = {k: round(v, 3) for k, v in took.items() if v > 0.1}  # the slowest: about 0.03 s
    assert not slow, slow


def test_a_line_is_matched_on_its_first_width_characters_and_its_evidence_says_where_it_was_cut():
    line = "ERROR " + "x" * 100 + " Address already in use " + "y" * 3 * WIDTH
    hit = signatures.first(line)
    assert hit.name == "port-in-use" and hit.evidence.endswith("…") and len(hit.evidence) < 400
    assert signatures.first("y" * WIDTH + " Address already in use") is None
    assert signatures.first("y" * (WIDTH - 30) + " Address already in use").name == "port-in-use"


SEGMENT_LINES = [  # real lines, one a segment; the 150th segment holds a failure
    "(APIServer pid=835) INFO 12-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0",
    "(RayWorkerWrapper pid=451, ip=192.168.100.11) INFO Loading safetensors checkpoint shards",
]
FAILURE = "(APIServer pid=835) ERROR [Errno 98] error while attempting to bind on address: address already in use"


def sparse_log(path: Path, size: int = 200 * MiB, failure_at: int | None = 150) -> int:
    """A log of ``size`` bytes made in an instant: a real line at the start of every MiB, then a
    run of zeros to the MiB's end (a hole: what a log holds after a crash). The line number of
    the failure line, where one is written."""
    with path.open("wb") as f:
        for i in range(size // MiB):
            f.seek(i * MiB)
            f.write(((FAILURE if i == failure_at else SEGMENT_LINES[i % 2]) + "\n").encode())
            f.seek((i + 1) * MiB - 1)
            f.write(b"\n")
        f.truncate(size)
    return 2 * failure_at + 1 if failure_at is not None else 0


DIAGNOSE = """
    import json, resource, sys, time
    from sparkbook.cli import main
    start = time.perf_counter()
    rc = main(["diagnose", *sys.argv[1:]])
    print(json.dumps({"rc": rc, "s": time.perf_counter() - start,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def test_diagnose_reads_a_200_mib_log_in_bounded_memory(tmp_path):
    big, small = tmp_path / "big.log", tmp_path / "small.log"
    line = sparse_log(big)
    small.write_text(SEGMENT_LINES[0] + "\n" + FAILURE + "\n")
    two_lines, _ = run(DIAGNOSE, 60, str(small))
    got, shown = run(DIAGNOSE, 120, str(big))
    # the old reading held the whole file, its text and its lines (1.77 GB for 200 MiB); now the
    # peak is 1-3 MiB above that of reading a log of two lines
    assert got["peak_rss_mib"] - two_lines["peak_rss_mib"] < 32, (got, two_lines)
    assert got["rc"] == 1 and f"port-in-use at {big}:{line}" in shown and got["s"] < 60, (got, shown)


def test_binary_input_is_read_without_a_traceback_and_prints_no_control_sequence(tmp_path):
    rnd = random.Random(26)
    noise = rnd.randbytes(MiB)
    clip = b"\x1b]52;c;ZWNobyBwd25lZA==\x07"  # an OSC 52 clipboard write
    log = tmp_path / "binary.log"
    log.write_bytes(noise + b"\0" * MiB + b"\n\xff\xfe " + clip + b"\x1b[31mAddress already in use\x1b[0m\r\n"
                    + noise[:4096])
    got, shown = run(DIAGNOSE, 60, str(log))
    assert got["rc"] == 1 and "port-in-use at" in shown and "Address already in use" in shown
    controls = [c for c in shown if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0]
    assert not controls and "ZWNo" not in shown, shown[-500:]
