"""Each cable, both ways: perftest's output parsed from published runs (tests/fixtures/perftest/, each
naming its source on its first line), the link health parsers on published counters and kernel
logs, the verdict that tells the faults apart, and the rounds that measure every link."""

from itertools import combinations
from pathlib import Path

import pytest

from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN
from sparkbook.collectives import pairs, rdma, rdma_judge as judge
from sparkbook.facts import health, perftest
from sparkbook.nodes.remote import Result
from sparkbook.params import load

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
PAIR = ROOT / "parameters" / "dgx-spark-pair.yaml"
QUAD = ROOT / "parameters" / "dgx-spark-quad.yaml"


def fixture(name: str) -> str:
    """A published output without its two header lines (source, note)."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    assert lines[0].startswith("# source:") and lines[1].startswith("# note:"), name
    return "".join(lines[2:])


def run(name: str) -> perftest.Perftest:
    return perftest.parse(fixture(f"perftest/{name}"))


# ------------------------------------------------------------------------------ perftest's output
@pytest.mark.parametrize("name, gbps", [
    ("spark-eugr-write-bw-gbits-q4-rdmacm-client.txt", 111.71),  # one twin, 4 QPs
    ("gb10-trevor-write-bw-gbits-q4-rdmacm-client.txt", 111.61),
    ("spark-nvidia-playbook-write-bw-run-infinitely-rail1-client.txt", 92.57),  # a row per 5 s
    ("spark-nvidia-playbook-write-bw-run-infinitely-rail2-client.txt", 97.28),
    ("spark-route179-two-rails-concurrent-interleaved-client.txt", 98.04),  # two runs interleaved
    ("nvidia-cloudnative-write-bw-all-sizes-gbits-roce-client.txt", 92.39),  # -a: the largest size
    ("rocm-write-bw-bidir-all-sizes-gbits-roce-client.txt", 204.59),  # -b: both directions summed
])
def test_bandwidth_in_gbits_is_the_largest_sizes_average(name, gbps):
    r = run(name)
    assert r["unit"] == "Gb/sec" and r["error"] is None
    assert perftest.gbps(r) == pytest.approx(gbps)


def test_mb_per_sec_columns_are_mebibytes_converted_to_gigabits():
    """elizabetht's Spark notebook read 11678.83 "MB/sec" and wrote 93.4 Gb/s (x8/1000); perftest's
    MB is 2^20 bytes, so it is 97.97 Gb/s, the rate of the NVIDIA playbook's rails."""
    r = run("spark-elizabetht-write-bw-mbsec-gid3-client.txt")
    assert r["unit"] == "MB/sec" and r["bw"][0]["average"] == pytest.approx(11678.83)
    assert perftest.gbps(r) == pytest.approx(97.97, abs=0.01)
    assert r["header"]["Device"] == "rocep1s0f0" and r["header"]["GID index"] == "3"
    mlx4 = run("mlx4-ib-write-bw-all-sizes-mbsec-client.txt")
    assert len(mlx4["bw"]) == 23 and perftest.gbps(mlx4) == pytest.approx(mlx4["bw"][-1]["average"] * perftest.MIB_TO_GBIT)


def test_header_fields_and_the_bidirectional_title():
    r = run("spark-eugr-write-bw-gbits-q4-rdmacm-client.txt")
    assert r["title"] == "RDMA_Write BW Test" and not perftest.bidirectional(r)
    assert r["header"]["Number of qps"] == "4" and r["header"]["rdma_cm QPs"] == "ON"
    assert r["bw"][0]["bytes"] == 65536 and r["bw"][0]["iterations"] == 20000
    assert perftest.bidirectional(run("rocm-write-bw-bidir-all-sizes-gbits-roce-client.txt"))
    interleaved = run("spark-route179-two-rails-concurrent-interleaved-client.txt")
    assert [row["average"] for row in interleaved["bw"]] == [98.04, 98.04] and interleaved["header"]["Device"] == "rocep1s0f1"


def test_latency_is_the_smallest_sizes_typical_one_way_time():
    spark = run("spark-eugr-write-lat-rdmacm-client.txt")
    assert spark["title"] == "RDMA_Write Latency Test" and len(spark["lat"]) == 1 and not spark["bw"]
    assert spark["lat"][0]["t_avg"] == pytest.approx(1.47) and perftest.latency_us(spark) == spark["lat"][0]["t_typical"]
    mlx4 = run("mlx4-ib-write-lat-all-sizes-client.txt")
    assert len(mlx4["lat"]) == 23 and mlx4["lat"][0]["bytes"] == 2
    assert perftest.latency_us(mlx4) == pytest.approx(0.98)


@pytest.mark.parametrize("name, kind, words", [
    ("error-couldnt-connect-socket.txt", "connect", "Couldn't connect to 192.168.125.211:18515"),
    ("error-did-not-detect-devices.txt", "no-device", "Did not detect devices"),
    ("error-failed-modify-qp-rtr-zero-gid.txt", "qp", "Failed to modify QP"),
    ("error-couldnt-get-device-attributes-server-and-client.txt", "resources", "Couldn't get device attributes"),
])
def test_errors_that_end_a_run_are_named_by_kind(name, kind, words):
    r = run(name)
    assert r["error_kind"] == kind and words in r["error"]
    assert perftest.gbps(r) is None and perftest.latency_us(r) is None


@pytest.mark.parametrize("name", ["gb10-trevor-write-bw-server-waiting-banner.txt",
                                  "server-mlx5-roce-write-bw-mbsec-duration-header-partial.txt"])
def test_a_server_side_without_rows_has_no_number_and_no_error(name):
    r = run(name)
    assert perftest.gbps(r) is None and r["error"] is None


def test_every_fixture_parses_to_a_number_or_an_error_or_a_server_banner():
    for path in sorted((FIXTURES / "perftest").glob("*.txt")):
        r = perftest.parse(fixture(f"perftest/{path.name}"))
        banner = "Waiting for client" in path.read_text()
        assert perftest.gbps(r) or perftest.latency_us(r) or r["error"] or banner, path.name


# ------------------------------------------------------------------------ counters and kernel logs
def test_ethtool_counters_of_a_connectx_and_what_rose():
    stats = health.parse_ethtool_stats(fixture("ethtool-S-mlx5-cx4-1.txt"))
    assert stats["rx_packets"] == 845320277 and stats["tx_pci_signal_integrity"] == 34
    errors = health.link_errors(stats)
    assert set(errors) <= set(health.LINK_ERRORS) and errors["rx_pcs_symbol_err_phy"] == 0
    assert "rx_packets" not in errors and "rx_corrected_bits_phy" in health.corrected(stats)
    later = dict(errors, rx_pcs_symbol_err_phy=40, link_down_events_phy=2)
    assert health.grown(errors, later) == {"rx_pcs_symbol_err_phy": 40, "link_down_events_phy": 2}
    assert health.grown(later, dict(later, rx_pcs_symbol_err_phy=3)) == {"rx_pcs_symbol_err_phy": 3}  # reset
    assert health.grown(errors, errors) == {}


def test_fec_statistics_totals():
    text = ("FEC parameters for enp1s0f1np1:\nSupported/Configured FEC encodings: Auto RS\n"
            "Active FEC encoding: RS\nStatistics:\n  corrected_blocks: 123\n  uncorrectable_blocks: 4\n")
    fec = health.parse_fec_stats(text)
    assert fec == {"corrected_blocks": 123, "uncorrectable_blocks": 4}
    assert health.link_errors({}, fec) == {"uncorrectable_blocks": 4}


@pytest.mark.parametrize("name, codes", [
    ("xid-spark-1.txt", {169}),  # a DGX Spark's own GPU
    ("xid-nvsentinel-1.txt", {79}),
    ("xid-gpud-1.txt", {13, 109}),
])
def test_xid_lines_of_published_kernel_logs(name, codes):
    found = health.parse_xid(fixture(name))
    assert {x["code"] for x in found} == codes and all("NVRM: Xid" in x["line"] for x in found)
    if name == "xid-spark-1.txt":
        assert found[0]["pci"] == "000f:01:00"


def test_xid_meanings_fail_where_the_gpu_needs_a_reset():
    assert health.xid_meaning(79)[1] == FAIL and "fallen off the bus" in health.xid_meaning(79)[0]
    assert health.xid_meaning(13)[1] == WARN
    assert health.xid_meaning(4242)[1] == FAIL  # unknown: looked up, not passed


# ------------------------------------------------------------------------------------ the verdict
def edited(path: Path, section: str, **values):
    """The parameters file with ``section``'s fields replaced (parameters are frozen)."""
    from sparkbook.params import read, validate
    data = read(path)
    node = data
    for key in section.split("."):
        node = node.setdefault(key, {})
    node.update(values)
    return validate(data, str(path))


def links(params, rail: int = 0) -> list[rdma.Link]:
    return [lk for lk in rdma.plan(params)[0] if lk.interface == params.nodes[0].rails[rail].interface]


def result(lk, fwd=95.0, rev=95.0, **kw) -> rdma.LinkResult:
    return rdma.LinkResult(lk, forward=fwd, reverse=rev, both=None if fwd is None or rev is None else fwd + rev,
                           latency_us=1.5, **kw)


def test_a_spark_pair_has_one_link_per_rail_and_a_bar_from_public_runs():
    p = load(PAIR)
    found, notes = rdma.plan(p)
    assert [(lk.a, lk.b, lk.interface, lk.rail_a.hca) for lk in found] == [
        ("spark-1", "spark-2", "enp1s0f1np1", "rocep1s0f1"), ("spark-1", "spark-2", "enP2p1s0f1np1", "roceP2p1s0f1")]
    assert notes == [] and p.expectations.rdma_gbps == 80 and p.expectations.rdma_source


def test_at_rate_both_ways_passes():
    p = load(PAIR)
    kind, seen, remedy = judge.classify(p, result(links(p)[0], 92.6, 97.3))
    assert kind == judge.OK and "92.6" in seen and remedy == ""


def test_slow_both_ways_with_clean_counters_is_the_degraded_init_rebooted_then_power_cycled():
    p = load(PAIR)
    lk = links(p)[0]
    kind, seen, remedy = judge.classify(p, result(lk, 13.0, 12.5))
    assert kind == judge.SLOW and "clean" in seen
    assert remedy == judge.REBOOT and "reboot both" in remedy and "AC power" in remedy
    rows = judge.checks(p, rdma.RdmaOutcome(results=[result(lk, 13.0, 12.5)]))
    assert [(c.check, c.node, c.status) for c in rows] == [("rdma", "spark-1, spark-2", FAIL)]


def test_slow_with_rising_counters_is_the_cable():
    p = load(PAIR)
    res = result(links(p)[0], 20.0, 21.0, counters={"spark-2 enp1s0f1np1": {"rx_pcs_symbol_err_phy": 400}})
    kind, seen, remedy = judge.classify(p, res)
    assert kind == judge.ERRORS and "rx_pcs_symbol_err_phy +400" in seen and remedy == judge.CABLE
    no_fec = result(links(p)[0], 20.0, 21.0, fec={"spark-1 enp1s0f1np1": "None"})
    assert judge.classify(p, no_fec)[0] == judge.ERRORS


def test_one_direction_slow_names_the_receiving_end():
    p = load(PAIR)
    kind, seen, remedy = judge.classify(p, result(links(p)[0], 95.0, 30.0))
    assert kind == judge.ONE_WAY and "from spark-2 to spark-1" in seen and "receiving end's port (spark-1)" in remedy
    kind, seen, _ = judge.classify(p, result(links(p)[0], 30.0, 95.0))
    assert "from spark-1 to spark-2" in seen


def test_without_a_bar_only_a_lopsided_link_is_slow():
    p = edited(PAIR, "expectations", rdma_gbps=None)
    assert judge.classify(p, result(links(p)[0], 13.0, 12.0))[0] == judge.OK
    assert judge.classify(p, result(links(p)[0], 90.0, 12.0))[0] == judge.ONE_WAY


def test_down_missing_and_perftest_errors_are_not_called_slow():
    p = load(PAIR)
    lk = links(p)[0]
    down = rdma.LinkResult(lk, down=["spark-2 enp1s0f1np1 (operstate down)"])
    assert judge.classify(p, down)[0] == judge.DOWN and "01_preflight" in judge.classify(p, down)[2]
    missing = rdma.LinkResult(lk, unavailable=["spark-1"])
    assert judge.classify(p, missing)[:2] == (judge.MISSING, "perftest not installed on spark-1")
    # not installed is a SKIP unless the parameters ask for the test
    assert [c.status for c in judge.checks(p, rdma.RdmaOutcome(results=[missing]))] == [SKIP]
    p = edited(PAIR, "collectives.rdma", run="on")
    assert [c.status for c in judge.checks(p, rdma.RdmaOutcome(results=[missing]))] == [FAIL]
    for kind, words in (("connect", "firewall"), ("qp", "GID index"), ("no-device", "ibv_devinfo")):
        broken = rdma.LinkResult(lk, errors={"forward": "spark-1: ..."}, error_kinds={"forward": kind})
        assert judge.classify(p, broken)[0] == judge.BROKEN and words in judge.classify(p, broken)[2], kind


def test_every_good_link_sums_up_in_one_row_per_rail_and_slow_latency_warns():
    p = load(PAIR)
    res = [result(lk, 95.0, 96.0) for lk in rdma.plan(p)[0]]
    res[1].latency_us = 9.0
    rows = judge.checks(p, rdma.RdmaOutcome(results=res))
    assert [(c.check, c.node, c.status) for c in rows] == [
        ("rdma", "all", PASS), ("rdma", "all", PASS), ("rdma latency", "spark-1, spark-2", WARN)]
    assert rows[0].observed.startswith("enp1s0f1np1: 1 link(s) at rate")
    assert judge.rail_gbps(rdma.RdmaOutcome(results=res)) == pytest.approx(190.0)


def test_one_nodes_cable_on_a_switch_is_named_among_four():
    """Every link through spark-3 slow, the other three at rate: spark-3's cable, not six rows."""
    p = load(QUAD)
    res = [result(lk, 12.0, 13.0) if "spark-3" in (lk.a, lk.b) else result(lk) for lk in links(p)]
    assert len(res) == 6
    rows = judge.checks(p, rdma.RdmaOutcome(results=res))
    fault = [c for c in rows if c.check == "link at fault"]
    assert [(c.node, c.status) for c in fault] == [("spark-3", FAIL)] and "3 of 3" in fault[0].observed
    assert sorted(c.node for c in rows if c.check == "rdma" and c.status == FAIL) == [
        "spark-1, spark-3", "spark-2, spark-3", "spark-3, spark-4"]
    # two faults at once: each link named, no node blamed
    res[0] = result(res[0].link, 12.0, 12.0)  # spark-1, spark-2 as well
    assert not [c for c in judge.checks(p, rdma.RdmaOutcome(results=res)) if c.check == "link at fault"]


def test_nccl_far_below_rdma_at_rate_is_nccl_not_the_cable():
    p = load(PAIR)
    res = rdma.RdmaOutcome(results=[result(lk, 95.0, 96.0) for lk in rdma.plan(p)[0]])
    rdma_on = {"spark-1": "rdma", "spark-2": "rdma"}
    low = judge.against_allreduce(p, res, 3.0, "nccl", rdma_on)
    assert [(c.check, c.status) for c in low] == [("rdma vs all-reduce", FAIL)]
    assert "NCCL_IB_HCA" in low[0].remedy and "AC removed" in low[0].remedy
    assert judge.against_allreduce(p, res, 20.0, "nccl", rdma_on)[0].status == PASS
    assert judge.against_allreduce(p, res, 3.0, "gloo", rdma_on) == []  # the lab: no NCCL to judge
    assert judge.against_allreduce(p, res, 3.0, "nccl", {"spark-1": "socket", "spark-2": "rdma"}) == []
    res.results[0].forward = 10.0  # a slow cable explains a slow all-reduce: its own row says so
    assert judge.against_allreduce(p, res, 3.0, "nccl", rdma_on) == []


def test_the_plot_has_a_matrix_per_rail(tmp_path):
    p = load(QUAD)
    res = [result(lk) for lk in rdma.plan(p)[0]]
    fig = judge.plot(p, rdma.RdmaOutcome(results=res), tmp_path / "rdma.png")
    assert (tmp_path / "rdma.png").stat().st_size > 0 and len(fig.axes) == 3  # two rails and the colour bar
    assert judge.plot(p, rdma.RdmaOutcome()) is None


def test_the_csv_has_every_direction_and_the_latency(tmp_path):
    p = load(PAIR)
    out = rdma.RdmaOutcome(results=[result(lk, 92.5, 97.25) for lk in rdma.plan(p)[0]])
    rows = (rdma.write_csv(out, tmp_path / "rdma.csv")).read_text().splitlines()
    assert rows[0] == ",".join(rdma.CSV_FIELDS) and len(rows) == 1 + 2 * 4
    assert "enp1s0f1np1,192.168.100.0/24,spark-2,spark-1,reverse,97.25," in rows


# ------------------------------------------------------------------------------------- scheduling
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_round_robin_covers_every_pair_once_with_no_node_twice_in_a_round(n):
    names = [f"n{i}" for i in range(n)]
    schedule = rdma.round_robin(names)
    seen = [frozenset(p) for r in schedule for p in r]
    assert sorted(map(sorted, seen)) == sorted(map(sorted, map(frozenset, combinations(names, 2))))
    assert len(seen) == len(set(seen))
    for r in schedule:
        ends = [x for p in r for x in p]
        assert len(ends) == len(set(ends))
    assert len(schedule) == (n - 1 if n % 2 == 0 else n)


def test_rounds_keep_each_rail_apart():
    p = load(QUAD)
    schedule = rdma.rounds(rdma.plan(p)[0])
    assert len(schedule) == 6 and all(len({lk.interface for lk in r}) == 1 for r in schedule)
    assert sum(len(r) for r in schedule) == 12


def test_the_scripts_arguments_carry_the_rail_addresses_as_values():
    p = load(PAIR)
    lk = links(p)[0]
    client = rdma.test_script(p, lk, "bw", "client", "a")
    server = rdma.test_script(p, lk, "bw", "server", "b")
    assert client.args[-2:] == ("192.168.100.10", "192.168.100.11") and server.args[-1] == "192.168.100.11"
    assert client.args[:3] == ("client", "bw", "rocep1s0f1")


# ------------------------------------------------------------------------------------------ pairs
def pair_outcome(params, slow: set[frozenset], value=0.2) -> pairs.PairsOutcome:
    names = [n.name for n in params.nodes]
    out = pairs.PairsOutcome()
    for a, b in combinations(names, 2):
        v = value if frozenset((a, b)) in slow else 2 * params.expectations.busbw_gbps
        out.results.append(pairs.GroupResult([a, b], v, f"{v:.2f} GB/s"))
    return out


def test_pairs_name_the_node_in_every_slow_pair():
    p = load(QUAD)
    slow = {frozenset(("spark-4", x)) for x in ("spark-1", "spark-2", "spark-3")}
    rows = pairs.checks(p, pair_outcome(p, slow))
    assert [(c.node, c.status) for c in rows if c.check == "link at fault"] == [("spark-4", FAIL)]
    assert len([c for c in rows if c.check == "pair all-reduce" and c.status == FAIL]) == 3


def test_pairs_name_the_one_slow_pair_and_own_up_to_no_culprit():
    p = load(QUAD)
    one = pairs.checks(p, pair_outcome(p, {frozenset(("spark-1", "spark-2"))}))
    assert [c.node for c in one if c.check == "link at fault"] == ["spark-1, spark-2"]
    none = pairs.checks(p, pair_outcome(p, set()))
    assert [(c.node, c.status) for c in none if c.check == "link at fault"] == [("all", FAIL)]
    assert "not one link" in next(c.remedy for c in none if c.check == "link at fault")


def test_pairs_are_needed_only_past_two_nodes_below_the_bar():
    from types import SimpleNamespace
    p, quad = load(PAIR), load(QUAD)
    slow = SimpleNamespace(result={"rows": []})
    assert not pairs.needed(p, slow) and pairs.needed(quad, slow)
    assert not pairs.needed(edited(QUAD, "collectives", pairs="off"), slow)


# ------------------------------------------------------------------------- the lab's simulated tool
def test_the_labs_simulated_perftest_prints_what_the_parser_reads():
    """simperf's rows in perftest's layout: 1 GB in 0.5 s is 16 Gb/s whichever unit is asked for."""
    from sparkbook.lab import simperf
    nic, link = {"hca": "rocep1s0f1"}, {"mtu": 9000}
    for gbits in (True, False):
        o = simperf.options("ib_write_bw", ["-d", "rocep1s0f1", "-D", "1", *(["--report_gbits"] if gbits else [])])
        text = simperf.header("RDMA_Write BW Test", o, nic, link) + "\n" + simperf.report_bw(o, 10**9, 0.5)
        r = perftest.parse(text)
        assert r["header"]["Device"] == "rocep1s0f1" and r["unit"] == ("Gb/sec" if gbits else "MB/sec")
        assert perftest.gbps(r) == pytest.approx(16.0, rel=1e-3)
    o = simperf.options("ib_write_lat", ["-n", "5"])
    r = perftest.parse(simperf.report_lat(o, [3.0, 1.0, 2.0, 2.0, 9.0]))
    assert perftest.latency_us(r) == 2.0 and r["lat"][0]["t_max"] == 9.0


# ------------------------------------------------------------------------ what stops a link's tests
def test_a_node_whose_rail_state_was_not_read_is_measured_and_said_not_judged_down():
    p = load(PAIR)
    lk = links(p)[0]
    res = rdma.LinkResult(lk)
    rdma._state(res, {"spark-1": {"enp1s0f1np1": {"oper": "up"}}})  # spark-2's sample failed
    assert res.unread == ["spark-2"] and res.down == []
    res = result(lk, unread=["spark-2"])
    rows = judge.checks(p, rdma.RdmaOutcome(results=[res]))
    assert [(c.check, c.node, c.status) for c in rows] == [("rdma", "all", PASS), ("rdma", "spark-2", WARN)]
    down = rdma.LinkResult(lk)
    rdma._state(down, {"spark-1": {"enp1s0f1np1": {"oper": "down"}}, "spark-2": {}})
    assert down.down == ["spark-1 enp1s0f1np1 (operstate down)", "spark-2 enp1s0f1np1 (operstate ?)"]


def test_a_perftest_that_cannot_bind_the_rail_is_not_run_and_stops_the_links_tests(tmp_path):
    """An ib_write_bw without --bind_source_ip would open its port on every interface: the script
    says so and runs nothing; the link is 'no perftest' with the upgrade, not slow or broken."""
    import os
    import subprocess
    ran = tmp_path / "ran"
    tool = tmp_path / "ib_write_bw"
    tool.write_text(f"#!/bin/sh\n[ \"$1\" = --help ] && {{ echo ' -d, --ib-dev=<dev>'; exit 1; }}\ntouch {ran}\n")
    tool.chmod(0o755)
    p = load(PAIR)
    lk = links(p)[0]
    cmd = rdma.test_script(p, lk, "bw", "server", "b")
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    out = subprocess.run(cmd.argv(), env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "RDMA-BIND all" and not ran.exists()
    res = rdma.LinkResult(lk)
    rdma._record(res, "forward", Result("spark-1", "", 0, out.stdout), Result("spark-2", str(cmd), 0, out.stdout),
                 "spark-1", "spark-2")
    assert res.bind_all == ["spark-1", "spark-2"] and res.forward is None and rdma.stopped(res)
    kind, seen, remedy = judge.classify(p, res)
    assert kind == judge.MISSING and "--bind_source_ip" in seen and "perftest 4.5" in remedy


@pytest.mark.parametrize("kind, stops", [("connect", True), ("no-device", True), ("qp", True), ("other", False)])
def test_errors_that_are_not_the_traffics_stop_the_remaining_tests(kind, stops):
    res = rdma.LinkResult(links(load(PAIR))[0], errors={"forward": "spark-1: x"}, error_kinds={"forward": kind})
    assert rdma.stopped(res) is stops


def test_the_client_waits_as_long_as_the_measurement_allows():
    p = load(PAIR)
    client = rdma.test_script(p, links(p)[0], "bw", "client", "a")
    assert client.args[9] == str(rdma.WAIT_S) and "deadline=$((SECONDS + wait_s))" in client.text


def test_rails_are_told_apart_by_subnet_even_where_interfaces_share_a_name():
    """Two rails may carry the same interface name on different nodes' layouts; the subnet is the rail."""
    p = load(PAIR)
    lk0, lk1 = links(p, 0)[0], links(p, 1)[0]
    same = rdma.Link(lk1.a, lk1.b, lk1.rail_a.model_copy(update={"interface": lk0.interface}), lk1.rail_b)
    out = rdma.RdmaOutcome(results=[result(lk0, 95.0, 96.0), result(same, 90.0, 91.0)])
    rows = judge.checks(p, out)
    assert [(c.check, c.status) for c in rows] == [("rdma", PASS), ("rdma", PASS)]
    assert judge.rail_gbps(out) == pytest.approx(95.0 + 90.0)
