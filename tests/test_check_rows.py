"""Issue 33: every check row of every step has a test that makes it FAIL or WARN for the reason it
names, or is stated as advisory, or is the passing form of rows that fail in its stead
(tests/check_rows.py). A new row without one fails here; so does an entry whose row is gone."""

import ast

from check_rows import (ROOT, ROWS, Advisory, FailsAs, Tests, expected_text, matches, record, rows_naming, scan,
                        scan_source, statuses, unproved)
from sparkbook.book.verdict import Check, Verdict


def test_every_row_in_the_source_has_an_entry_and_every_entry_a_row():
    rows, problems = scan()
    problems += [f"new check row {r.name!r} in {r.where}: add a test that makes it FAIL or WARN, or mark it "
                 "Advisory in tests/check_rows.py" for r in rows if r.name not in ROWS]
    found = {r.name for r in rows}
    problems += [f"{name!r} is in tests/check_rows.py but no longer in the source: remove it" for name in ROWS
                 if name not in found]
    assert not problems, "\n".join(problems)


def defined(path, names) -> bool:
    """Whether the file defines the function, or ``Class::method``."""
    body = ast.parse(path.read_text()).body
    for name in names[:-1]:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == name), [])
    return any(isinstance(n, ast.FunctionDef) and n.name == names[-1] for n in body)


def test_every_test_named_exists():
    missing = []
    for row, entry in ROWS.items():
        for test_id in entry if isinstance(entry, Tests) else ():
            file, *names = test_id.split("[")[0].split("::")
            if not names or not (ROOT / file).is_file() or not defined(ROOT / file, names):
                missing.append(f"{row!r}: {test_id} does not exist")
    assert not missing, "\n".join(missing)


def test_every_row_has_a_failing_test():
    """Tests named; an advisory row says so in its expected text and is never FAIL; a row that
    fails as others is only ever PASS or SKIP, and the others have tests."""
    rows, _ = scan()
    problems = []
    for name, entry in ROWS.items():
        calls = [r for r in rows if r.name == name]
        if isinstance(entry, Tests) and not entry:
            problems.append(f"{name!r}: no test makes it FAIL or WARN")
        for r in calls if isinstance(entry, Advisory) else ():
            if "advisory" not in expected_text(r.call):
                problems.append(f"{name!r} at {r.where}: advisory, but its expected text does not say so")
            if "FAIL" in statuses(r.call) or not statuses(r.call):
                problems.append(f"{name!r} at {r.where}: advisory, but it may FAIL")
        if isinstance(entry, FailsAs):
            problems += [f"{name!r}: fails as {other!r}, which has no tests" for other in entry
                         if not isinstance(ROWS.get(other), Tests) or not ROWS[other]]
            problems += [f"{name!r} at {r.where}: fails as {list(entry)}, so only ever PASS or SKIP, but its "
                         f"status is made of {sorted(statuses(r.call)) or 'what its function returns'}"
                         for r in calls if not statuses(r.call) or not statuses(r.call) <= {"PASS", "SKIP"}]
    assert not problems, "\n".join(problems)


def test_the_scanner_reads_literal_formatted_variable_and_smoke_rows():
    source = """
Check("image", node, FAIL, seen, "the head's image (advisory)")
Check(f"ssh {via}→worker", peer, PASS if ok else FAIL)
Check(what, node, WARN)
Check(nobody_listed, node, WARN)
Check(**saved)
verdict.Check("gpu", node, WARN)
s.check("stop", command, expected, stop)
result.check("not a row", 1)
"""
    rows, problems = scan_source(source, "preflight/host.py")
    assert [r.name for r in rows] == ["image", "ssh *→worker", "driver", "firmware", "gpu", "stop"]
    assert problems == ["sparkbook/preflight/host.py:5: a row named by nobody_listed: list the names it takes "
                        "in BY_VARIABLE (tests/check_rows.py)"]
    assert expected_text(rows[0].call) == "the head's image (advisory)" and statuses(rows[0].call) == {"FAIL"}
    assert statuses(rows[1].call) == {"PASS", "FAIL", "ok"} and statuses(rows[-1].call) == set()


def test_a_row_is_proved_only_by_a_fail_or_warn_of_its_own_name():
    assert matches("ssh head→worker", "ssh *→worker") and matches("load c=1", "load *")
    assert not matches("plausibility", "plausibility *") and not matches("image ID", "image")
    checks = [Check("image", "spark-2", "PASS"), Check("load c=1", "api", "WARN"), Check("swap", "n", "SKIP")]
    assert unproved(["image", "load *", "swap"], checks) == ["image", "swap"]
    assert "swap" in rows_naming("tests/test_host_health.py::test_swap_in_use_before_the_launch_warns", "")
    assert "plausibility *" in rows_naming("tests/test_ceiling.py::test_verdict_in_both_directions",
                                           "70.0-FAIL-measurement bug")
    assert rows_naming("tests/test_ceiling.py::test_verdict_in_both_directions", "30.0-PASS-54% of the ceiling") == []


def test_the_recorder_keeps_the_checks_the_package_makes_not_the_tests_own(monkeypatch):
    seen = record(monkeypatch)
    Check("swap", "spark-1", "WARN")
    Verdict.from_json({"checks": [{"check": "swap", "node": "spark-2", "status": "WARN"}]})  # a saved verdict
    assert [c.node for c in seen] == ["spark-2"]
