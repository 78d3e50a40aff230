"""The serving nodes' health while they serve (sparkbook/serving/health.py): samples read from what
link_health.sh prints (published counters, a GB10's `nvidia-smi -q`, published Xid lines), the
changes from the first sample with their time and level, and the verdict's rows."""

import re
from pathlib import Path

import pytest

from sparkbook.book.verdict import FAIL, PASS, WARN
from sparkbook.facts import health
from sparkbook.params import load
from sparkbook.serving import health as watch_health

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return "".join((FIXTURES / name).read_text().splitlines(keepends=True)[2:])


GB10_Q = fixture("nvidia-smi-q-gb10-1.txt")  # ollama/ollama#13552: every reason Not Active
STATS = fixture("ethtool-S-mlx5-cx4-1.txt")  # isc-projects/ethq tests/mlx5_core
XID = fixture("xid-spark-1.txt")  # Start9Labs/start-technologies#3693: a DGX Spark's Xid 169


def output(pcs: int = 0, reason: str | None = None, xid: str = "") -> str:
    """link_health.sh's sections for one rail, the GPU and the kernel log."""
    stats = STATS.replace("rx_pcs_symbol_err_phy: 0", f"rx_pcs_symbol_err_phy: {pcs}")
    smi = re.sub(rf"({reason}\s*): Not Active", r"\1: Active", GB10_Q) if reason else GB10_Q
    return "\n".join(["@@ oper enp1s0f1np1", "up", "@@ stats enp1s0f1np1", stats, "@@ fec enp1s0f1np1",
                      "FEC parameters for enp1s0f1np1:", "Active FEC encoding: RS", "@@ smi-q", smi, "@@ xid", xid])


def test_a_sample_reads_counters_active_slowdowns_and_xid_lines():
    calm = watch_health.reading(output())
    assert calm["errors"]["enp1s0f1np1"]["rx_pcs_symbol_err_phy"] == 0 and calm["reasons"] == {} and calm["xid"] == []
    hot = watch_health.reading(output(pcs=12, reason="HW Power Brake Slowdown", xid=XID))
    assert hot["errors"]["enp1s0f1np1"]["rx_pcs_symbol_err_phy"] == 12
    assert list(hot["reasons"]) == ["HW Power Brake Slowdown"]
    assert len(hot["xid"]) >= 1 and all("Xid (PCI:000f:01:00): 169" in x for x in hot["xid"])
    rails = health.parse_link_health(output())["rails"]["enp1s0f1np1"]
    assert rails["oper"] == "up" and rails["fec_mode"] == "RS"


def watched(samples, t0=1000.0, calm=("spark-1", "spark-2")):
    """A Watch over the lab's serving nodes holding ``samples`` [(seconds, node, link_health output)];
    the nodes of ``calm`` without a sample of their own are calm at the same times."""
    params = load(ROOT / "parameters" / "lab.yaml")
    w = watch_health.Watch(params, cluster=None, label="benchmark")
    w.t0 = t0
    times = sorted({t for t, _, _ in samples})
    quiet = [(t, n, output()) for n in calm if n not in {node for _, node, _ in samples} for t in times]
    w.rows = [(t0 + t, node, watch_health.reading(text)) for t, node, text in [*samples, *quiet]]
    return w


def test_changes_are_timed_from_the_first_sample_and_placed_in_their_level():
    w = watched([(0, "spark-1", output()), (0, "spark-2", output(pcs=5, xid=XID)),  # old Xid: not a change
                 (5, "spark-1", output()), (5, "spark-2", output(pcs=5, xid=XID)),
                 (10, "spark-1", output(reason="HW Slowdown")), (10, "spark-2", output(pcs=45, xid=XID)),
                 (15, "spark-1", output(reason="HW Slowdown")), (15, "spark-2", output(pcs=405, xid=XID))])
    s = w.summary([("c=1", 1000.0, 8.0 + 1000), ("c=8", 1008.0, 1020.0)])
    assert s["samples"] == {"spark-1": 4, "spark-2": 4} and s["duration_s"] == 15
    link = [e for e in s["events"] if e["kind"] == "link"]
    assert [(e["node"], e["what"], e["t_s"], e["rise"], e["rise_by_end"], e["during"]) for e in link] == [
        ("spark-2", "enp1s0f1np1 rx_pcs_symbol_err_phy", 10, 40, 400, "c=8")]
    gpu = [e for e in s["events"] if e["kind"] == "gpu"]
    assert [(e["node"], e["what"], e["t_s"], e["status"]) for e in gpu] == [("spark-1", "HW Slowdown", 10, FAIL)]
    assert not [e for e in s["events"] if e["kind"] == "xid"]  # in the log before the run began

    rows = {(c.check, c.node): c for c in watch_health.checks(s, "07's levels")}
    assert set(rows) == {("link errors while serving", "spark-2"), ("gpu clocks while serving", "spark-1")}
    cable = rows[("link errors while serving", "spark-2")]
    assert cable.status == FAIL and "rose at 10 s (00:16:50 UTC), during c=8 (+40 then, +400 by the end)" in cable.observed
    assert "02_collectives" in cable.remedy
    assert "power-cycle" in rows[("gpu clocks while serving", "spark-1")].remedy


def test_a_new_xid_is_judged_by_its_code():
    spark = "NVRM: Xid (PCI:000f:01:00): 119, pid=4242, name=python3, Timeout after 45s of waiting for RPC response"
    app = "NVRM: Xid (PCI:000f:01:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"
    w = watched([(0, "spark-1", output()), (5, "spark-1", output(xid=app)), (9, "spark-1", output(xid=app + "\n" + spark))])
    rows = watch_health.checks(w.summary(), "06's burn-in")
    assert [(c.check, c.node, c.status) for c in rows] == [("xid while serving", "spark-1", FAIL)]
    assert "Xid 13" in rows[0].observed and "Xid 119" in rows[0].observed and "at 9 s" in rows[0].observed
    w = watched([(0, "spark-1", output()), (5, "spark-1", output(xid=app))])
    assert [c.status for c in watch_health.checks(w.summary(), "06's burn-in")] == [WARN]  # the program's own fault


def test_nothing_changed_is_one_pass_and_a_silent_node_a_warning():
    w = watched([(0, "spark-1", output()), (5, "spark-1", output())], calm=())
    w.silent = {"spark-2": "ssh: connect timed out"}
    rows = watch_health.checks(w.summary(), "06's burn-in")
    assert [(c.check, c.node, c.status) for c in rows] == [("serving health", "spark-2", WARN),
                                                           ("serving health", "all", PASS)]
    assert "connect timed out" in rows[0].observed and "2 samples of 1 node(s)" in rows[1].observed
    assert watch_health.checks(None, "x") == []


def test_the_samples_are_kept_as_rows(tmp_path):
    w = watched([(0, "spark-1", output()), (5, "spark-1", output(pcs=3, reason="SW Power Cap"))])
    rows = w.save(tmp_path).read_text().splitlines()
    assert rows[0] == "t_s,node,what,value" and "5.0,spark-1,enp1s0f1np1 rx_pcs_symbol_err_phy,3" in rows
    assert any(r.startswith("5.0,spark-1,gpu SW Power Cap") for r in rows)


@pytest.mark.parametrize("code, status", [(79, FAIL), (13, WARN), (31, WARN), (48, FAIL)])
def test_xid_codes_that_need_a_reset_fail(code, status):
    assert health.xid_meaning(code)[1] == status


def test_a_rail_missing_from_the_first_sample_is_judged_from_its_first_reading():
    """A first sample without the rail's statistics (ethtool failed that once) is no baseline of
    zeros: the counters' later values are not a rise."""
    no_stats = "\n".join(["@@ oper enp1s0f1np1", "up", "@@ smi-q", GB10_Q, "@@ xid", ""])
    w = watched([(0, "spark-1", no_stats), (5, "spark-1", output(pcs=7)), (10, "spark-1", output(pcs=7)),
                 (15, "spark-1", output(pcs=9))])
    link = [e for e in w.summary()["events"] if e["kind"] == "link"]
    assert [(e["t_s"], e["rise"], e["rise_by_end"]) for e in link] == [(15, 2, 2)]


def test_the_power_cap_of_a_gpu_at_work_is_not_a_change():
    w = watched([(0, "spark-1", output()), (5, "spark-1", output(reason="SW Power Cap"))])
    assert [c.check for c in watch_health.checks(w.summary(), "07's levels")] == ["serving health"]
    w = watched([(0, "spark-1", output()), (5, "spark-1", output(reason="SW Thermal Slowdown"))])
    assert [c.check for c in watch_health.checks(w.summary(), "07's levels")] == ["gpu clocks while serving"]


def test_a_watch_left_by_an_error_takes_no_last_sample():
    params = load(ROOT / "parameters" / "lab.yaml")
    calls = []

    class Nodes:
        def run(self, *a, **kw):
            calls.append(1)
            return {}
    w = watch_health.Watch(params, Nodes(), "burn-in", interval=60)
    with pytest.raises(RuntimeError):
        with w:
            raise RuntimeError("the soak failed")
    assert len(calls) == 1  # the baseline only
    with w:
        pass
    assert len(calls) == 3
