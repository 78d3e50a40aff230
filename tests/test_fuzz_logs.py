"""Generated log input, seeded: real log lines (tests/fixtures/logs/, the field samples) mutated,
long lines, binary and unicode, through the signatures, masking and ``sparkbook diagnose``. For
each: no exception, a bounded time, the same findings whether read from a string or line by line
from a file, a secret put anywhere in it still masked, and nothing printed that drives a
terminal. A watchdog ends the run with every thread's traceback if one input hangs (the regex
engine does not stop for a signal); the file takes 4-35 s (a quiet machine, or one running the
lab's tests)."""

import faulthandler
import random
import sys
import time
from pathlib import Path

import pytest
from conftest import FIELD_SAMPLES

from sparkbook.facts import logread, signatures
from sparkbook.book import redact
from sparkbook.cli import parser
from sparkbook.book.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
SEED, INPUTS = 26, 300
EACH_S = 2.0  # the slowest input (a line of 1 MiB, masked) takes about 0.3 s
SECRET = "hf_fuzzSECRETvalue0123456789"
# Pieces that each signature's patterns start or end with, and what makes a terminal act.
PIECES = ["vllm: error: unrecognized arguments: ", "x.py", " serve", "'", '"', "Model architectures [",
          "]", " are not supported", "sm_121", "ibv_reg_mr", " failed", "Call to ", "NCCL WARN ",
          "(RayWorkerWrapper pid=451, ip=10.0.0.2) ", "No such file or directory: '", "tokenizer",
          "init engine ", " took ", "TOKEN", "HF_TOKEN=", "=", "Last error:", "\x1b[31m", "\x1b[0m",
          "\x1b]52;c;aGk=\x07", "\x1b]0;title", "\x1bP", "\x9b", "\r", "\t", "\0", "\x7f", "…",
          "é", "漢", "\U0001f600", "\ufffd", "#033[1m", "# size count type", "1024 256 float"]


def corpus() -> list[str]:
    files = sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.txt")) + sorted(FIELD_SAMPLES.glob("*.txt"))
    lines = [ln for p in files for ln in p.read_text().split("\n")[2:] if ln.strip()]
    assert len(lines) > 100
    return lines


def mutated(rnd: random.Random, line: str) -> str:
    chars = list(line)
    for _ in range(rnd.randint(1, 8)):
        at = rnd.randrange(len(chars) + 1)
        what = rnd.random()
        if what < 0.3 and chars:
            del chars[min(at, len(chars) - 1):at + rnd.randint(1, 10)]
        elif what < 0.7:
            chars[at:at] = rnd.choice(PIECES)
        elif what < 0.85:
            chars[at:at] = chr(rnd.choice([rnd.randrange(32), rnd.randrange(0x80, 0xa0), rnd.randrange(0x110000)]))
        else:
            start = rnd.randrange(len(chars) + 1)
            chars[at:at] = chars[start:start + rnd.randint(1, 40)] * rnd.randint(1, 50)
    return "".join(chars)


def generated(rnd: random.Random, lines: list[str]) -> list[tuple[str, str | bytes]]:
    """INPUTS inputs, each a kind and a text (or bytes, for binary)."""
    out: list[tuple[str, str | bytes]] = []
    for i in range(INPUTS):
        kind = ["mutated", "mutated", "mutated", "long", "binary", "unicode"][i % 6]
        if kind == "mutated":
            text = "\n".join(mutated(rnd, rnd.choice(lines)) for _ in range(rnd.randint(1, 12)))
        elif kind == "long":  # a real line holding one piece repeated, up to 1 MiB for a few
            size = 2**20 if i % 60 == 3 else rnd.choice([5_000, 20_000, 100_000])
            unit = rnd.choice(PIECES + [rnd.choice(lines)[:30]])
            line = rnd.choice(lines)
            at = rnd.randrange(len(line) + 1)
            text = line[:at] + (unit * (size // len(unit) + 1))[:size] + line[at:]
        elif kind == "binary":
            data = rnd.randbytes(rnd.randint(0, 8_000))
            text = data + b"\0" * rnd.choice([0, 1, 70_000]) + rnd.choice(lines).encode()
        else:
            text = "".join(chr(rnd.randrange(0x110000)) if rnd.random() < 0.7 else rnd.choice(PIECES)
                           for _ in range(rnd.randint(0, 3000)))
        out.append((kind, text))
    return out


@pytest.fixture
def watchdog():
    faulthandler.dump_traceback_later(120, exit=True, file=sys.__stderr__)  # pytest holds sys.stderr
    yield
    faulthandler.cancel_dump_traceback_later()


def no_controls(text: str) -> bool:
    return not any((ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0 for c in text)


def test_generated_logs_through_signatures_masking_and_diagnose(tmp_path, capsys, monkeypatch, watchdog):
    monkeypatch.setattr(redact, "_named", set())
    monkeypatch.setattr(redact, "_values", set())
    monkeypatch.setenv("HF_TOKEN", SECRET)
    rnd, cli = random.Random(SEED), parser()  # the parser once: argparse takes 0.07 s to build it
    slow, compared = {}, 0
    for n, (kind, given) in enumerate(generated(rnd, corpus())):
        start = time.perf_counter()
        data = given if isinstance(given, bytes) else given.encode("utf-8", "surrogatepass")
        text = given if isinstance(given, str) else given.decode("utf-8", "replace")
        found = signatures.match(text.removesuffix("\n"), source="f")
        signatures.last_error(text), signatures.ray_address(text[:10_000])
        assert all(no_controls(h.evidence + h.detail) for h in found), (n, kind, found)
        log = tmp_path / f"{n}.log"
        log.write_bytes(data)
        short = all(len(ln) <= signatures.LINE_WIDTH for ln in data.split(b"\n"))
        if n % 2 and short and text.encode("utf-8", "replace") == data:
            # read line by line from the file, it finds what the whole text holds
            assert signatures.match(logread.file_lines(log), source="f") == found, (n, kind)
            compared += 1
        at = rnd.randrange(len(text) + 1)
        assert SECRET not in redact.mask(text[:at] + SECRET + text[at:]), (n, kind)
        args = cli.parse_args(["diagnose", str(log)])
        assert args.func(args) in (0, 1)
        out, err = capsys.readouterr()
        assert err == "" and no_controls(out), (n, kind, err[-2000:], out[-500:])
        if (took := time.perf_counter() - start) > EACH_S:
            slow[f"{n} ({kind})"] = round(took, 2)
    assert not slow, slow
    assert compared > INPUTS // 5


def test_node_text_reaches_the_terminal_without_control_sequences(capsys):
    """Progress prints what nodes say (vLLM's log lines, rsync's progress): a node's output must not
    write the operator's clipboard (OSC 52), clear the screen, move the cursor or set a title."""
    rnd = random.Random(SEED)
    lines = ["INFO Loading weights took 12.5 s \x1b]52;c;ZWNobyBvd25lZA==\x07",
             "\x1b[2J\x1b[1;1HLoading safetensors", "\x1b]0;pwned\x07ready", "\x9b31mred\x1bP+q\x1b\\",
             "50%\r60%\n70%\x07"] + [mutated(rnd, "INFO Loading safetensors checkpoint shards") for _ in range(200)]
    with Progress("start-up", interval=0) as p:
        for line in lines:
            p.update("spark-1", line, force=True)
    out = capsys.readouterr().out
    assert no_controls(out) and "ZWNo" not in out and "pwned" not in out
    assert "spark-1: INFO Loading weights took 12.5 s" in out and "spark-1: Loading safetensors" in out
    assert "spark-1: 50% 60% 70%" in out
