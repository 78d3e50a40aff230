"""Verdicts that expire (issue 29): each verdict records when it was taken, until when it holds and
the boot ID of each node it read; 05 and 07 refuse a preflight that expired or that a node's reboot
ended, and the report shows each verdict's age."""

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sparkbook.book.verdict import FAIL, PASS, WARN, Check, Verdict
from sparkbook.facts import inventory
from sparkbook.nodes.remote import Result, Results
from sparkbook.lab import lab_params
from sparkbook.params import validate
from sparkbook.record import expiry, folder, report

TAKEN = datetime(2026, 12, 5, 9, 0, 0, tzinfo=timezone.utc)
BOOT = {"a": "11111111-aaaa", "b": "22222222-bbbb"}


def _params(**expectations):
    data = lab_params(2)
    data["name"] = "expiry"
    for node, name in zip(data["nodes"], "ab"):
        node["name"] = name
    data.setdefault("expectations", {}).update(expectations)
    return validate(data)


def _preflight(run: Path, taken=TAKEN, hold_h=24.0, boots=BOOT, checks=None, deployment="expiry"):
    run.mkdir(parents=True, exist_ok=True)
    (run / "summary.json").write_text(json.dumps({"deployment": deployment, "steps": []}))
    v = Verdict("01 preflight", checks or [Check("reachable", "a", PASS)],
                taken=taken.isoformat(timespec="seconds"),
                holds_until=(taken + timedelta(hours=hold_h)).isoformat(timespec="seconds"), boots=dict(boots))
    v.save(run / "verdicts" / "01_preflight.json")


class FakeCluster:
    """Answers the boot ID read with ``now`` (node -> ID, or None for a node that does not answer)."""

    def __init__(self, now: dict[str, str | None]):
        self.now, self.asked = now, []

    def run(self, cmd, nodes, timeout=None):
        self.asked.append([n.name for n in nodes])
        return Results({n.name: Result(n.name, cmd, 0, self.now[n.name] + "\n") if self.now[n.name]
                        else Result(n.name, cmd, None, error="no answer within 20 s") for n in nodes})


def _rows(checks):
    return {(c.check, c.node): c for c in checks}


def test_the_inventory_reads_the_boot_id_and_the_outcome_keeps_it():
    out = "@@ facts\nhostname=spark-1\nkernel=6.11.0-1016-nvidia\nboot_id=3f1c-77\n@@ gpu\nnvidia-smi absent: x\n"
    facts = inventory.parse(out)
    assert facts["boot_id"] == "3f1c-77"
    assert inventory.parse(out.replace("boot_id=3f1c-77\n", "boot_id=\n"))["boot_id"] is None
    inv = inventory.Inventory([{"node": "a", "boot_id": "3f1c-77"}, {"node": "b", "boot_id": None}], {}, "")
    assert inv.boots() == {"a": "3f1c-77"}


def test_a_verdict_keeps_when_it_was_taken_and_an_older_file_reads_without_it(tmp_path):
    _preflight(tmp_path / "run")
    v = folder.verdict(tmp_path / "run", "01_preflight")
    assert (v.taken, v.boots) == (TAKEN.isoformat(timespec="seconds"), BOOT)
    assert expiry.when(v.holds_until) == TAKEN + timedelta(hours=24)
    old = json.loads((tmp_path / "run" / "verdicts" / "01_preflight.json").read_text())
    for key in ("taken", "holds_until", "boots"):
        del old[key]
    (tmp_path / "run" / "verdicts" / "01_preflight.json").write_text(json.dumps(old))
    v = folder.verdict(tmp_path / "run", "01_preflight")
    assert (v.taken, v.holds_until, v.boots) == ("", "", {})


def test_the_same_boot_within_the_age_holds_and_asks_each_node_once(tmp_path):
    params, run = _params(), tmp_path / "outputs" / "run"
    _preflight(run)
    cluster = FakeCluster(dict(BOOT))
    rows = _rows(expiry.holds(params, lambda: cluster, run, now=TAKEN + timedelta(hours=2)))
    assert rows["01_preflight holds", "all"].status == PASS
    assert "2.0 h ago" in rows["01_preflight holds", "all"].observed
    assert [rows["booted since", n].status for n in "ab"] == [PASS, PASS]
    assert cluster.asked == [["a", "b"]]


def test_a_node_booted_since_fails_by_name_and_one_that_does_not_answer_warns(tmp_path):
    params, run = _params(), tmp_path / "outputs" / "run"
    _preflight(run)
    cluster = FakeCluster({"a": "99999999-new", "b": None})
    rows = _rows(expiry.holds(params, lambda: cluster, run, now=TAKEN + timedelta(minutes=5)))
    a, b = rows["booted since", "a"], rows["booted since", "b"]
    assert a.status == FAIL and "11111111 then, 99999999 now" in a.observed
    assert "01_preflight.ipynb" in a.remedy and a.command == expiry.BOOT_ID
    assert b.status == WARN and "no answer within 20 s" in b.observed


def test_an_expired_preflight_fails_and_one_that_failed_warns(tmp_path):
    params, run = _params(verdicts_hold_h=1), tmp_path / "outputs" / "run"
    _preflight(run, hold_h=params.expectations.verdicts_hold_h)
    cluster = FakeCluster(dict(BOOT))
    late = _rows(expiry.holds(params, lambda: cluster, run, now=TAKEN + timedelta(hours=3)))
    assert late["01_preflight holds", "all"].status == FAIL
    assert "held until 2026-12-05 10:00 UTC" in late["01_preflight holds", "all"].observed
    _preflight(run, checks=[Check("reachable", "a", FAIL)])
    failed = _rows(expiry.holds(params, lambda: cluster, run, now=TAKEN))
    assert failed["01_preflight holds", "all"].status == WARN and "it failed" in failed["01_preflight holds", "all"].observed


def test_no_preflight_warns_and_asks_no_node(tmp_path):
    params, run = _params(), tmp_path / "outputs" / "run"
    run.mkdir(parents=True)
    cluster = FakeCluster(dict(BOOT))
    rows = expiry.holds(params, lambda: cluster, run, now=TAKEN)
    assert [(c.check, c.status) for c in rows] == [("01_preflight holds", WARN)]
    assert cluster.asked == []


def test_an_older_verdict_without_boot_ids_warns_for_each_node(tmp_path):
    params, run = _params(), tmp_path / "outputs" / "run"
    _preflight(run, boots={})
    rows = _rows(expiry.holds(params, lambda: FakeCluster(dict(BOOT)), run, now=TAKEN))
    assert rows["booted since", "a"].status == WARN and "did not read" in rows["booted since", "a"].observed


def test_a_run_without_its_own_preflight_builds_on_the_deployments_newest(tmp_path):
    """`sparkbook run --steps 05,06` after 01 ran alone: the newest 01 of this deployment counts,
    by when it was taken, whatever the folders' times; another deployment's never does."""
    params, outputs = _params(), tmp_path / "outputs"
    _preflight(outputs / "20261205T090000Z-expiry", taken=TAKEN, boots={"a": "old-a", "b": "old-b"})
    _preflight(outputs / "20261205T080000Z-expiry", taken=TAKEN + timedelta(hours=1))
    _preflight(outputs / "20261205T110000Z-other", taken=TAKEN + timedelta(hours=2), deployment="other",
               boots={"a": "x", "b": "y"})
    run = outputs / "20261205T120000Z-expiry"
    run.mkdir()
    rows = _rows(expiry.holds(params, lambda: FakeCluster(dict(BOOT)), run, now=TAKEN + timedelta(hours=3)))
    assert "(in 20261205T080000Z-expiry)" in rows["01_preflight holds", "all"].observed
    assert [rows["booted since", n].status for n in "ab"] == [PASS, PASS]


def test_the_report_shows_each_verdicts_time_and_age(tmp_path):
    run = tmp_path / "run"
    _preflight(run)
    summary = {"deployment": "expiry", "steps": [
        {"step": "01", "name": "01_preflight", "notebook": "01_preflight.ipynb", "status": "passed",
         "duration_s": 3.0, "error": None},
        {"step": "02", "name": "02_collectives", "notebook": "02_collectives.ipynb", "status": "skipped",
         "duration_s": 0.0, "error": None}]}
    page = report._index(summary, folder.verdicts(run), TAKEN + timedelta(minutes=30))
    assert "2026-12-05 09:00 UTC (30 min ago), holds until 2026-12-06 09:00 UTC" in page
    assert "age as of 2026-12-05 09:30 UTC" in page
    assert page.count("ago") == 1  # 02 has no verdict
