"""Each cable, both ways, on the lab: the simulated perftest streams over the rail as a cable
carries it (sparkbook/lab/simperf.py), so a rail shaped to a fraction of its rate with clean
counters (`slow-cable`) reads slow both ways and gets the reboot remedy, a rail that is down is named
down and not slow, and a cable whose error counters climb while it is measured is the cable's."""

from sparkbook.book.verdict import FAIL, PASS
from sparkbook.collectives import rdma, rdma_judge as judge
from sparkbook.lab import faults

NODE = "spark-2"


def measured(params, cluster):
    out = rdma.measure(params, cluster, say=lambda *_: None)
    by_rail = {res.link.interface: res for res in out.results}
    return out, by_rail, {i: judge.classify(params, res) for i, res in by_rail.items()}


def test_a_healthy_lab_reads_every_rail_both_ways_at_rate(lab, params, cluster):
    out, by_rail, kinds = measured(params, cluster)
    assert len(by_rail) == len(params.nodes[0].rails) == 2
    assert {k for k, _, _ in kinds.values()} == {judge.OK}, kinds
    for res in by_rail.values():
        assert res.forward > params.expectations.rdma_gbps and res.reverse > params.expectations.rdma_gbps
        assert res.both > params.expectations.rdma_gbps and 0 < res.latency_us < 1000  # CPU-bound: not a sum here
        assert "ib_write_bw" in res.commands["forward"] and "-b" in res.commands["both"].split()
    assert [c.status for c in judge.checks(params, out)] == [PASS, PASS]


def test_slow_cable_reads_slow_both_ways_with_clean_counters_and_rail_down_reads_down(lab, params, cluster):
    first, second = (r.interface for r in params.nodes[0].rails)
    try:
        faults.apply(lab, "slow-cable", NODE, rate="200mbit")
        _, by_rail, kinds = measured(params, cluster)
    finally:
        faults.heal(lab, "slow-cable")
    kind, seen, remedy = kinds[first]
    assert kind == judge.SLOW and "clean" in seen and remedy == judge.REBOOT, kinds[first]
    assert by_rail[first].forward < 0.5 and by_rail[first].reverse < 0.5  # 200 Mbit/s
    assert kinds[second][0] == judge.OK  # the other rail, unshaped

    try:
        faults.apply(lab, "rail-down", NODE)
        out, by_rail, kinds = measured(params, cluster)
    finally:
        faults.heal(lab, "rail-down")
    assert kinds[second][0] == judge.DOWN and f"{NODE} {second}" in kinds[second][1]
    assert by_rail[second].forward is None  # not measured: no perftest against a down link
    assert kinds[first][0] == judge.OK
    rows = [c for c in judge.checks(params, out) if c.status == FAIL]
    assert [(c.check, c.node) for c in rows] == [("rdma", "spark-1, spark-2")] and "down" in rows[0].observed


def test_error_counters_that_climb_while_measured_are_the_cables(lab, params, cluster):
    first = params.nodes[0].rails[0].interface
    try:
        faults.apply(lab, "slow-cable", NODE, rate="200mbit")
        faults.apply(lab, "link-errors", NODE)
        _, by_rail, kinds = measured(params, cluster)
    finally:
        faults.heal(lab, "link-errors")
        faults.heal(lab, "slow-cable")
    kind, seen, remedy = kinds[first]
    assert kind == judge.ERRORS and remedy == judge.CABLE, kinds[first]
    assert f"{NODE} {first}: rx_pcs_symbol_err_phy +" in seen
    assert list(by_rail[first].counters) == [f"{NODE} {first}"]
