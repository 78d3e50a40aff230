"""Received run folders, fuzzed: a few hundred mutations of a whole run folder (files dropped,
JSON truncated, fields of another type, huge strings, bytes that are not UTF-8, links, FIFOs,
folders where files were, files over the size limit), each read as ``sparkbook report``,
``compare`` and ``status`` read one. None may raise anything but a one-line SparkbookError, nor
take long; seeded, so that a failure reruns alike (the seed and the mutations are in its message)."""

import functools
import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import nbformat
import pytest

from sparkbook.record import bugreport, compare, fingerprint, report, status
from sparkbook import params
from sparkbook.book import redact
from sparkbook.record import folder as runfolder
from sparkbook.cli import main
from sparkbook.book.errors import SparkbookError
from sparkbook.book.verdict import FAIL, PASS, Check, Verdict
from test_compare import fingerprint_of, make_run

SEED = 20261201
FOLDERS = 300
LIMIT = 64 * 1024  # runfolder.MAX_BYTES while fuzzing: "huge" files are cheap to make
BOUND_S = 3.0  # CPU seconds, one folder through every reader (CPU, not wall: the machine may be busy)
HANG_S = 300  # wall seconds for them all: a read that blocks (a FIFO) fails the test, not hangs it
ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "a\n\n[x](javascript:alert(1)) <script>alert(1)</script>\n\n<img src=x onerror=alert(1)>"


def valid_run(parent: Path, name: str = "run") -> Path:
    """A whole run folder: make_run's (summary, verdicts with key numbers, collectives.json,
    serving.json, benchmark/results.json), a fingerprint, a preflight verdict with checks on nodes
    and the commands they ran, its executed notebook, and 05's image inspection."""
    d = make_run(parent, name, started="2026-11-30T17:00:54+00:00")
    fingerprint.save(fingerprint_of("--enforce-eager"), d)
    v = Verdict("01 preflight", [Check("gpu", n, PASS, "1 x GB10", command="nvidia-smi -L") for n in ("spark-1", "spark-2")]
                + [Check("disk", "spark-2", FAIL, "1 GB free", "100 GB", "free some space", "df -h /")],
                key_numbers=[("nodes", "2")])
    v.save(d / "verdicts" / "01_preflight.json")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("ctx.conclude(outcome)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": v._repr_html_(),
                                                                 "text/plain": v.to_text()})]
    nb.cells = [nbformat.v4.new_markdown_cell("# 01 · Preflight"), cell]
    nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                       language_info={"name": "python"})
    nbformat.write(nb, d / "01_preflight.ipynb")
    summary = json.loads((d / "summary.json").read_text())
    summary["steps"].insert(0, {"step": "01", "name": "01_preflight", "notebook": "01_preflight.ipynb",
                                "status": "failed", "duration_s": 3.5, "error": "CheckFailed: 1 check(s) failed"})
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "image_inspection.json").write_text(json.dumps({"image": "sparkbook-lab/vllm-cpu:latest",
                                                         "vllm": "0.32.0+cpu", "torch": "2.13.0+cpu"}))
    return d


# ---- mutations --------------------------------------------------------------------------------

VALUES = [None, True, 0, -1, 2 ** 70, 10 ** 400, 1e308, -1e308, 1.5, "", "x", "9.5", HOSTILE, [], [1, "a"],
          {}, {"a": 1}, [[["deep"]]], "\ud800"]


def _nodes(value, path=()):
    """Every (container, key) in a JSON value, the top level's as (None, None)."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, (*path, i))


def _set(value, path, new):
    if not path:
        return new
    target = value
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = new
    return value


def _drop(value, path):
    target = value
    for p in path[:-1]:
        target = target[p]
    del target[path[-1]]
    return value


def mutate_json(rng, data):
    paths = list(_nodes(data))
    path = rng.choice(paths)
    kind = rng.random()
    if kind < 0.15 and path:
        return _drop(data, path), f"drop {path}"
    if kind < 0.3:
        huge = rng.choice([HOSTILE * 2000, "x" * 300_000, "é\n" * 50_000])
        return _set(data, path, huge), f"huge string at {path}"
    new = rng.choice(VALUES)
    return _set(data, path, new), f"{path} = {str(new)[:30]!r}"


def mutate(rng, d: Path, outside: Path) -> list[str]:
    """One mutation of a file of ``d`` (or of the folder's shape); what was done."""
    files = sorted(p for p in d.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        return ["nothing left"]
    f = rng.choice(files)
    name = f.relative_to(d).as_posix()
    kind = rng.choice(["json"] * 8 + ["truncate", "truncate", "bytes", "garbage", "drop", "folder",
                                     "fifo", "link", "large", "deep", "top", "bom", "name"])
    if kind == "json" and f.suffix in (".json", ".ipynb"):
        try:
            data = json.loads(f.read_text())
        except (ValueError, RecursionError):  # mutated already
            kind = "truncate"
        else:
            data, what = mutate_json(rng, data)
            f.write_text(json.dumps(data))
            return [f"{name}: {what}"]
    raw = f.read_bytes()
    if kind in ("json", "truncate"):
        f.write_bytes(raw[: rng.randrange(max(len(raw), 1))])
    elif kind == "bytes":
        at = rng.randrange(max(len(raw), 1))
        f.write_bytes(raw[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]) + raw[at:])
    elif kind == "garbage":
        f.write_bytes(rng.randbytes(rng.randrange(1, 4096)))
    elif kind == "drop":
        f.unlink()
    elif kind == "folder":
        f.unlink()
        f.mkdir()
    elif kind == "fifo":
        f.unlink()
        os.mkfifo(f)
    elif kind == "link":
        f.unlink()
        f.symlink_to(rng.choice([outside / "secret.json", Path("/dev/zero"), outside, Path("nowhere")]))
    elif kind == "large":
        f.write_bytes(b'{"a": "' + b"x" * (LIMIT * 5) + b'"}')
    elif kind == "deep":
        f.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "top":
        f.write_text(rng.choice(["[1, 2]", '"text"', "null", "3", "true"]))
    elif kind == "bom":
        f.write_bytes(b"\xef\xbb\xbf" + raw)
    elif kind == "name":  # a verdict whose file name is not UTF-8
        (d / "verdicts").mkdir(exist_ok=True)
        with open(os.fsencode(d / "verdicts") + b"/\xff\xfe.json", "wb") as out:
            out.write(raw)
    return [f"{name}: {kind}"]


# ---- what each reader may do ------------------------------------------------------------------

def hung(*_):
    raise TimeoutError(f"the readers took over {HANG_S} s: one blocks (a FIFO opened for reading?)")


def one_line_or_nothing(call, *args):
    """``call(*args)``: returns, or raises a SparkbookError of one line."""
    try:
        return call(*args)
    except SparkbookError as e:
        assert "\n" not in str(e) and str(e), repr(str(e))
        return None


class Nothing:
    """A figure or axes that draws nothing (any attribute, any call: itself): the plotting code runs
    over every value, matplotlib does not (tests/test_compare.py draws the extremes a shape lets
    through)."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kw):
        return self

    def __getitem__(self, key):
        return ()


def no_figure(panels=1):
    return Nothing(), [Nothing() for _ in range(panels)]


@functools.cache
def lab_params():
    return params.load(ROOT / "parameters" / "lab.yaml")  # deployment "lab", make_run's


def read_as_status_does(d: Path) -> None:
    """``sparkbook status``'s picture of a run folder (its summary, each verdict, the fingerprint
    and the image inspection): a one-line SparkbookError, or a page whose unreadable pieces are
    named in one line each."""
    pic = one_line_or_nothing(status.picture, lab_params(), "lab.yaml", d, ROOT / "notebooks")
    if pic is not None:
        assert all("\n" not in why for why in pic.unreadable.values())
        assert "OUTSIDE-SECRET" not in pic.to_text()


@pytest.fixture
def small_limits(monkeypatch):
    monkeypatch.setattr(runfolder, "MAX_BYTES", LIMIT)
    monkeypatch.setattr(runfolder, "MAX_NOTEBOOK_BYTES", LIMIT * 4)
    monkeypatch.setattr(compare, "_figure", no_figure)
    found = redact.secrets()  # the same secrets, not read from the environment at every value
    monkeypatch.setattr(redact, "secrets", lambda: found)


def test_hundreds_of_mutated_run_folders_read_without_a_traceback(tmp_path, small_limits):
    rng = random.Random(SEED)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({"steps": [], "deployment": "OUTSIDE-SECRET"}))
    signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    cpu = time.process_time()
    base = compare.load_run(valid_run(tmp_path / "base"))
    template = valid_run(tmp_path / "template")
    slowest, failures, seen = (0.0, ""), [], {"report pages": 0, "report errors": 0, "compared": 0,
                                              "compare errors": 0, "unreadable pieces": 0, "rendered": 0}
    for i in range(FOLDERS):
        d = tmp_path / f"runs-{i // 4}" / f"r{i:03d}"  # four to a parent: compare's history reads the others
        d.parent.mkdir(exist_ok=True)
        shutil.copytree(template, d, symlinks=True)
        done = [m for _ in range(rng.choice([1, 1, 2, 3])) for m in mutate(rng, d, outside)]
        start = time.process_time()
        try:
            merged = one_line_or_nothing(report.merged, d)
            seen["report pages" if merged else "report errors"] += 1
            if merged and i % 50 == 0:  # the whole page, nbconvert's rendering too: once in 50 (a second)
                page = report.build(d).read_text()
                assert "OUTSIDE-SECRET" not in page and "<script" not in page
                seen["rendered"] += 1
            run = one_line_or_nothing(compare.load_run, d)
            seen["compared" if run else "compare errors"] += 1
            if run is not None:
                seen["unreadable pieces"] += len(run.unreadable)
                page = compare.page([base, run], compare.history([base, run]), tmp_path)
                assert "OUTSIDE-SECRET" not in page and "<script" not in page
            read_as_status_does(d)
            bugreport.failures(d)  # the bug report's summary.md: what it can read, no traceback
        except Exception as e:  # noqa: BLE001: the report is the seed, the mutations and the error
            failures.append(f"r{i:03d} {done}: {type(e).__name__}: {str(e)[:300]}")
        took = time.process_time() - start
        slowest = max(slowest, (took, f"r{i:03d} {done}"))
        if len(failures) >= 5:
            break
    signal.alarm(0)
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures)
    assert slowest[0] < BOUND_S, f"slowest folder: {slowest[0]:.1f} s: {slowest[1]}"
    # the mutations bite, and most folders still give a page that names what it could not read
    assert seen["report errors"] > 20 and seen["report pages"] > FOLDERS / 2 and seen["unreadable pieces"] > 50, seen
    print(f"{FOLDERS} folders in {time.process_time() - cpu:.1f} CPU s, the slowest {slowest[0]:.2f} s "
          f"({slowest[1]}): {seen}")


def test_the_command_line_says_one_line_for_a_bad_folder_and_no_traceback(tmp_path, small_limits, capsys):
    rng = random.Random(SEED + 1)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    good = valid_run(tmp_path / "good")
    for i in range(12):
        d = valid_run(tmp_path / "bad", f"r{i}")
        (d / "summary.json").write_bytes(rng.choice([b"{", b"\xff{}", b"[]", b'{"steps": [1]}',
                                                     b'{"steps": [{"name": 3}]}']))
        for _ in range(3):
            mutate(rng, d, outside)
        for argv in (["report", str(d)], ["compare", str(good), str(d), "--out", str(tmp_path / "cmp")],
                     ["status", "-p", str(ROOT / "parameters" / "lab.yaml"), "--run", str(d), "--no-nodes"]):
            code = main(argv)
            err = capsys.readouterr().err
            assert code in (0, 2) and "Traceback" not in err, (argv, err)
            assert code == 0 or (err.count("\n") == 1 and err.startswith("sparkbook: ")), err


def test_the_bug_reports_choice_of_run_folder_reads_summaries_that_cannot_be_read(tmp_path):
    """`sparkbook collect` picks the newest run folder of the deployment: one whose summary.json
    is nested too deep, not UTF-8 or a list is passed over, not a traceback."""
    outputs = tmp_path / "outputs"
    for name, text in (("deep", "[" * 100_000 + "]" * 100_000), ("bytes", b"\xff\xfe"), ("list", "[1]")):
        (outputs / name).mkdir(parents=True)
        path = outputs / name / "summary.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    good = valid_run(outputs, "good")
    assert bugreport.latest_run("lab", tmp_path) == good
    for name in ("deep", "bytes", "list"):
        assert bugreport.failures(outputs / name) == ([], [], 0)
