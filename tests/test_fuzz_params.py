"""Issue 26: reading a parameters file from someone else is bounded. A few hundred seeded
mutations of parameters/lab.yaml (values of the wrong type, huge or endless numbers, deep nesting,
alias bombs, random bytes, unicode, missing and unknown fields, oversized files) each either load
or raise ParamsError, nothing else; each takes under a second of CPU, and reading them stays
within a few megabytes (tracemalloc's peak)."""

import functools
import random
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sparkbook.book import redact
from sparkbook.params.fields import MAX_BYTES
from sparkbook.params import Params, ParamsError, load

ROOT = Path(__file__).resolve().parents[1]
LAB = (ROOT / "parameters" / "lab.yaml").read_text()
SEED = 26
CASES = 300
CPU_S = 1.0       # per case: CPU time, so that a busy machine (the lab's tests beside) cannot fail it
WALL_S = 10.0     # per case: a hang (a read that blocks) would show here
PEAK_MB = 8       # tracemalloc's peak over the cases it watches
TRACED = 4        # cases of each kind of mutation tracemalloc watches

HOSTILE = [None, True, 0, -1, 2**63, 10**300, 1e308, -5e-324, float("inf"), float("nan"), "", " ",
           "-oProxyCommand=touch /tmp/x", "--api-key=sk-fuzz-0123456789", "$(id)", "a;b|c", "/dev/zero",
           "\u202e\u0000\ufeff\U0001f600", "ü" * 200, "x" * 5000, [], {}, [None, [1]], {"a": {"b": [1]}},
           ["--hf-token", "hf_fuzz_0123456789"], "AWS_SECRET_ACCESS_KEY", "http://127.0.0.1:9/v1"]


def leaves(obj, here=()):
    """Every path into the mapping, containers included."""
    yield here
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from leaves(v, here + (k,))


def nested(depth: int):
    return [nested(depth - 1)] if depth else 1


def set_at(data, path, value):
    for k in path[:-1]:
        data = data[k]
    data[path[-1]] = value


def mutate_data(rng: random.Random) -> tuple[str, bytes]:
    data = yaml.safe_load(LAB)
    kind = rng.choice(["value", "delete", "unknown", "wrap", "deep"])
    for _ in range(rng.randint(1, 3)):
        path = rng.choice([p for p in leaves(data) if p])
        if kind == "value":
            set_at(data, path, rng.choice(HOSTILE))
        elif kind == "delete":
            parent = data
            for k in path[:-1]:
                parent = parent[k]
            del parent[path[-1]]
        elif kind == "unknown":
            target = rng.choice([data] + [v for v in data.values() if isinstance(v, dict)])
            target[rng.choice(["Name", "nodes ", "extra", "ü", "__class__"])] = rng.choice(HOSTILE)
        elif kind == "wrap":
            parent = data
            for k in path[:-1]:
                parent = parent[k]
            parent[path[-1]] = rng.choice([[parent[path[-1]]], {"v": parent[path[-1]]}])
        else:
            set_at(data, path, nested(rng.randint(20, 60)))
    return kind, yaml.safe_dump(data, allow_unicode=rng.random() < 0.5).encode()


def mutate_text(rng: random.Random) -> tuple[str, bytes]:
    text = LAB
    kind = rng.choice(["bytes", "unicode", "truncate", "digits", "brackets", "aliases", "size",
                       "duplicate", "indent", "tag"])
    at = rng.randrange(len(text))
    if kind == "bytes":
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 20)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return kind, bytes(raw)
    if kind == "unicode":
        chars = "".join(chr(rng.choice([rng.randrange(32), 0x7f, 0x85, 0xa0, 0x2028, 0xfeff, 0xfffe,
                                        rng.randrange(0x80, 0x30000)])) for _ in range(rng.randint(1, 8)))
        return kind, (text[:at] + chars + text[at:]).encode("utf-8", "surrogatepass")
    if kind == "truncate":
        return kind, text[:at].encode()
    if kind == "digits":  # a number of thousands of digits where one stands
        lines = text.splitlines()
        i = rng.choice([i for i, ln in enumerate(lines) if ln.rstrip().endswith(tuple("0123456789"))])
        lines[i] = lines[i].rstrip().rstrip("0123456789.") + rng.choice(["9", "-9", "0x9", "."]) + \
            "9" * rng.choice([20, 400, 4299, 4400, 20000])
        return kind, "\n".join(lines).encode()
    if kind == "brackets":
        n = rng.choice([33, 1000, 30000])
        return kind, (text + f"\ndescription: {'[' * n}{']' * n}\n").encode()
    if kind == "aliases":  # ten of ten of ten...: few nodes, billions of values
        levels = [f"x0: &x0 [{rng.choice(['a', '{k: 1}', '[1, 2]'])}]"]
        levels += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]" for i in range(1, rng.randint(2, 9))]
        where = rng.choice(["nodes", "benchmark", "description", "collectives"])
        return kind, (text.replace(f"\n{where}:", f"\n{where}_was:") + "\n" + "\n".join(levels)
                      + f"\n{where}: *x{len(levels) - 1}\n").encode()
    if kind == "size":
        pad = rng.choice([MAX_BYTES - len(text) - 10, MAX_BYTES, 10 * MAX_BYTES])  # under, at, far over
        return kind, (text + "#" + "x" * pad).encode()
    if kind == "duplicate":
        lines = text.splitlines()
        i = rng.randrange(len(lines))
        return kind, "\n".join(lines[:i + 1] + lines[i:]).encode()
    if kind == "indent":
        lines = text.splitlines()
        for _ in range(rng.randint(1, 5)):
            i = rng.randrange(len(lines))
            lines[i] = rng.choice([" ", "\t", "- ", "? "]) + lines[i]
        return kind, "\n".join(lines).encode()
    tag = rng.choice(["!!int", "!!float", "!!bool", "!!timestamp", "!!binary", "!!set",
                      "!!python/object:os.system", "!x"])
    return kind, (text[:at] + f" {tag} " + text[at:]).encode()


@functools.cache
def cases() -> list[tuple[str, bytes]]:
    rng = random.Random(SEED)
    return [(mutate_data if rng.random() < 0.5 else mutate_text)(rng) for _ in range(CASES)]


@pytest.fixture(autouse=True)
def no_lasting_masks(monkeypatch):
    """validate() registers the variables a file names for masking: a fuzzed file names any."""
    monkeypatch.setattr(redact, "_named", set(redact._named))
    monkeypatch.setattr(redact, "_values", set(redact._values))


def outcome(path: Path, i: int, kind: str, data: bytes) -> bool:
    """Whether the case loads (False: ParamsError); anything else fails the test, naming the case."""
    path.write_bytes(data)
    try:
        return isinstance(load(path), Params)
    except ParamsError:
        return False
    except Exception as e:
        pytest.fail(f"case {i} ({kind}): {type(e).__name__}: {e}\n{data[:400]!r}")


def test_mutated_parameters_files_load_or_raise_params_error_quickly(tmp_path):
    kinds: dict[str, list[int]] = {}  # [loaded, refused] per mutation
    slowest = (0.0, 0.0, "")  # CPU s, wall s, kind
    for i, (kind, data) in enumerate(cases()):
        wall, cpu = time.perf_counter(), time.process_time()
        loaded = outcome(tmp_path / "fuzzed.yaml", i, kind, data)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert cpu < CPU_S and wall < WALL_S, f"case {i} ({kind}): {cpu:.2f} s CPU, {wall:.2f} s"
        slowest = max(slowest, (cpu, wall, kind))
        kinds.setdefault(kind, [0, 0])[0 if loaded else 1] += 1
    print(f"\n{CASES} cases (seed {SEED}): slowest {slowest[0]:.3f} s CPU ({slowest[1]:.3f} s wall, "
          f"{slowest[2]}); [loaded, refused] per kind: {kinds}")
    assert sum(v[0] for v in kinds.values()) and sum(v[1] for v in kinds.values())  # both outcomes met


def test_mutated_parameters_files_stay_within_a_few_megabytes(tmp_path):
    """tracemalloc slows Python several times over: it watches the first cases of every kind."""
    traced, per_kind = [], Counter()
    for i, (kind, data) in enumerate(cases()):
        if per_kind[kind] < TRACED:
            per_kind[kind] += 1
            traced.append((i, (kind, data)))
    tracemalloc.start()
    try:
        for i, (kind, data) in traced:
            outcome(tmp_path / "fuzzed.yaml", i, kind, data)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    print(f"\n{len(traced)} of {CASES} cases traced: tracemalloc peak {peak:.1f} MiB")
    assert peak < PEAK_MB
