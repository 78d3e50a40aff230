"""Fabric faults owners report that every state, rate and MTU check passes: a rail without forward
error correction, and a RoCE GID index that does not hold the rail's address. The parsers on real
outputs, the checks failing and passing, the lab's simulated tools read by the real parsers, and on
the lab the `fec` fault caught with its remedy.

Sources:
- FEC: a DGX Spark (spark-fb97) whose QSFP cable was moved came up at 200 Gb/s with "Active FEC
  encoding: None", and all_gather busbw fell from 21.4 to 2.8 GB/s:
  https://github.com/KoyoImai/dgx_spark_cluster2/blob/99bf3db4075825f5052066ef71c92d097e4e3e22/Step011/README.md
  (sections 1.1-1.4; tests/fixtures/ethtool-show-fec-spark-*.txt). The output's format: ethtool's
  netlink/fec.c (https://github.com/mkubecek/ethtool/blob/8b0193699efe21aa399c5e52adc6c54936ae1d92/netlink/fec.c:
  "None" is no active mode, "Off" is FEC disabled). Switches that default to FEC off (RouterOS on
  QSFP28: https://help.mikrotik.com/docs/spaces/ROS/pages/220233794/MikroTik+wired+interface+compatibility).
- GID index: on DGX Sparks whose cabled neighbour restarted, the fabric address came back at RoCE
  GID index 4 instead of 3 while NCCL_IB_GID_INDEX=3 stayed set:
  https://github.com/FujitsuPolycom/sparkring/blob/a6be63fa5db6df4381e80ffe20ac6f2d87c368a6/integrations/vllm/spark_roce_gid.py
  (docstring) and that repository's research note "RoCEnante GID index per port after a neighbor
  restart, 2026-10-01"; on a GX10 pair the pinned index moved from 3 to 4 within 30 minutes and NCCL
  failed on one HCA (ibv_modify_qp err 61):
  https://github.com/tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark/pull/40.
  show_gids' format (and the sysfs files it reads):
  https://github.com/Mellanox/mlnx-tools/blob/088fadb3db349bc0ee9b014f68dcab0a4b124cfd/sbin/show_gids;
  a real output: tests/fixtures/show_gids-mlx5-1.txt (source in its header).
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from sparkbook import preflight
from sparkbook.lab import faults, simhw
from sparkbook.params import validate
from sparkbook.facts.parsers import parse_ethtool_fec, parse_fec_sections, parse_sections, parse_show_gids
from sparkbook.preflight.collect import parse
from sparkbook.nodes.remote import Cluster
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).with_name("fixtures")
LAB = ROOT / "parameters" / "lab.yaml"
HARDWARE = ROOT / "sparkbook" / "scripts" / "hardware.sh"
RAILS = ("enp1s0f1np1", "enP2p1s0f1np1")


def fixture(name: str) -> str:
    """A real output (tests/fixtures), without its two header lines (source, note)."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    assert lines[0].startswith("# source: https://"), name
    return "".join(lines[2:])


def lab_params(**runtime):
    data = yaml.safe_load(LAB.read_text())
    data["runtime"].update(runtime)
    return validate(data)


def gid_rows(hca: str, netdev: str, *ipv4_at: tuple) -> str:
    """show_gids rows as mlnx-tools prints them: the link-local pair, then (index, IPv4[, version])
    rows, by default v1 at even and v2 at odd indices, as the kernel fills them."""
    rows = ["DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV",
            "---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---",
            f"{hca}\t1\t0\tfe80:0000:0000:0000:6eb3:11ff:fe88:55b5\t\t\tv1\t{netdev}",
            f"{hca}\t1\t1\tfe80:0000:0000:0000:6eb3:11ff:fe88:55b5\t\t\tv2\t{netdev}"]
    for index, ip, *ver in ipv4_at:
        a, b, c, d = (int(x) for x in ip.split("."))
        gid = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
        rows.append(f"{hca}\t1\t{index}\t{gid}\t{ip}  \t{ver[0] if ver else f'v{index % 2 + 1}'}\t{netdev}")
    return "\n".join(rows + [f"n_gids_found={len(rows) - 2}"])


def report(fec: dict[str, str] | None = None, speed: str = "200000Mb/s", gids: str | None = None,
           ethtool: bool = True):
    """spark-1's report from its bundle's output: both rails at ``speed``, FEC from the real
    samples (interface -> fixture), the GID table ``gids`` (None: no show_gids, no sysfs)."""
    parts = ["@@ smi", "nvidia-smi unavailable"]
    for rail in RAILS:
        parts += [f"@@ ethtool {rail}", f"Settings for {rail}:", f"\tSpeed: {speed}", "\tLink detected: yes",
                  f"@@ fec {rail}"]
        if not ethtool:
            parts.append("ethtool unavailable")
        elif fec and rail in fec:
            parts.append(fixture(fec[rail]).replace("enp1s0f0np0", rail).replace("enp1s0f1np1", rail))
    parts += ["@@ gids", gids if gids is not None else "show_gids unavailable"]
    return parse("\n".join(parts))


def rows(params, d, check: str):
    pf = preflight.Preflight({"spark-1": d}, {}, {"spark-1": "head"})
    return [c for c in preflight.checks(params, pf) if c.check == check and c.node == "spark-1"]


# ------------------------------------------------------------------------------------- parsers

def test_show_fec_parsed_from_real_spark_outputs():
    assert parse_ethtool_fec(fixture("ethtool-show-fec-spark-rs-1.txt")) == {
        "enp1s0f1np1": {"configured": ["Auto"], "active": "RS", "error": None}}
    assert parse_ethtool_fec(fixture("ethtool-show-fec-spark-none-1.txt")) == {
        "enp1s0f0np0": {"configured": ["Auto"], "active": "None", "error": None}}
    assert parse_ethtool_fec(fixture("ethtool-show-fec-spark-rs-set-1.txt"))["enp1s0f0np0"]["configured"] == ["RS"]


def test_show_fec_older_format_statistics_and_errors():
    # the ioctl path's "Configured FEC encodings" and -I statistics (format: ethtool's fec code)
    old = "FEC parameters for eth0:\nConfigured FEC encodings: Auto RS\nActive FEC encoding: Off\n" \
          "Statistics:\n  corrected_blocks: 256\n  uncorrectable_blocks: 0\n"
    assert parse_ethtool_fec(old) == {"eth0": {"configured": ["Auto", "RS"], "active": "Off", "error": None}}
    # a driver without FEC (veth, lo): ethtool's error, on the section of the interface asked
    sections = parse_sections("@@ fec lo\nnetlink error: Operation not supported\n@@ fec eth0\n" + old)
    fec = parse_fec_sections(sections)
    assert fec["lo"] == {"configured": [], "active": None, "error": "netlink error: Operation not supported"}
    assert fec["eth0"]["active"] == "Off"
    assert parse_fec_sections(parse_sections("@@ fec lo\nethtool unavailable")) is None


def test_a_real_show_gids_output_parsed():
    """show_gids on a Mellanox RoCE host, as published (fixture header): the address is RoCE v2 at 3."""
    [(hca, table)] = parse_show_gids(fixture("show_gids-mlx5-1.txt")).items()
    assert hca == "mlx5_0" and [(g["port"], g["index"], g["ipv4"], g["version"], g["netdev"]) for g in table] == [
        (1, 0, None, "v1", "rdma0"), (1, 1, None, "v2", "rdma0"),
        (1, 2, "192.168.211.242", "v1", "rdma0"), (1, 3, "192.168.211.242", "v2", "rdma0")]
    assert table[3]["gid"] == "0000:0000:0000:0000:0000:ffff:c0a8:d3f2"


def test_show_gids_rows_parsed():
    gids = parse_show_gids(gid_rows("rocep1s0f1", "enp1s0f1np1", (2, "10.77.1.11"), (3, "10.77.1.11")))
    table = gids["rocep1s0f1"]
    assert [(g["index"], g["ipv4"], g["version"]) for g in table] == [
        (0, None, "v1"), (1, None, "v2"), (2, "10.77.1.11", "v1"), (3, "10.77.1.11", "v2")]
    assert table[3] == {"port": 1, "index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a4d:010b",
                        "ipv4": "10.77.1.11", "version": "v2", "netdev": "enp1s0f1np1"}
    # an older kernel without gid_attrs/ndevs: no interface column
    assert parse_show_gids("mlx5_0\t1\t3\t0000:0000:0000:0000:0000:ffff:c0a8:0101\t192.168.1.1  \tv2\t")[
        "mlx5_0"][0]["netdev"] is None


def test_hardware_script_reads_the_gid_table_from_sysfs_without_show_gids(tmp_path):
    """hardware.sh on this machine with no show_gids: the rows it prints from a sysfs tree parse
    as show_gids' do (empty entries skipped, the type's last word as the version)."""
    port = tmp_path / "ib" / "rocep1s0f1" / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    entries = {0: ("fe80:0000:0000:0000:6eb3:11ff:fe88:55b5", "IB/RoCE v1"),
               3: ("0000:0000:0000:0000:0000:ffff:0a4d:010b", "RoCE v2"),
               4: ("0000:0000:0000:0000:0000:0000:0000:0000", "")}
    for index, (gid, kind) in entries.items():
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
        (port / "gid_attrs" / "ndevs" / str(index)).write_text("enp1s0f1np1\n")
    path = ":".join(d for d in ("/usr/bin", "/bin") if os.path.isdir(d))
    assert not shutil.which("show_gids", path=path), "a real show_gids would be used instead"
    out = subprocess.run(["bash", str(HARDWARE)], capture_output=True, text=True, timeout=60,
                         env={"PATH": path, "SPARKBOOK_IB_SYSFS": str(tmp_path / "ib")}).stdout
    gids = parse(out)["gids"]
    assert [(g["index"], g["ipv4"], g["version"], g["netdev"]) for g in gids["rocep1s0f1"]] == [
        (0, None, "v1", "enp1s0f1np1"), (3, "10.77.1.11", "v2", "enp1s0f1np1")]


# ---------------------------------------------------------------------------------------- FEC

def test_a_200g_rail_without_fec_fails_with_the_remedy():
    params = lab_params()
    d = report({RAILS[0]: "ethtool-show-fec-spark-none-1.txt", RAILS[1]: "ethtool-show-fec-spark-rs-1.txt"})
    bad, good = rows(params, d, "rail fec")
    assert bad.status == FAIL and bad.observed.startswith("enp1s0f1np1: active None at 200000Mb/s")
    assert "`sudo ethtool --set-fec enp1s0f1np1 encoding rs`" in bad.remedy and "other end" in bad.remedy
    assert "`ethtool --show-fec enp1s0f1np1`" in bad.remedy and bad.command == "ethtool --show-fec enp1s0f1np1"
    assert good.status == PASS and good.observed == "enP2p1s0f1np1: active RS at 200000Mb/s (configured: Auto)"
    # "Off" (FEC disabled) is no FEC either
    off = report({RAILS[0]: "ethtool-show-fec-spark-rs-1.txt"})
    off["fec"][RAILS[0]]["active"] = "Off"
    assert rows(params, off, "rail fec")[0].status == FAIL


def test_fec_is_judged_from_200g_and_on_a_link_that_is_up():
    params = lab_params()
    none = {r: "ethtool-show-fec-spark-none-1.txt" for r in RAILS}
    at_100g = rows(params, report(none, speed="100000Mb/s"), "rail fec")
    assert [c.status for c in at_100g] == [PASS, PASS] and "judged from 200 Gb/s" in at_100g[0].observed
    down = rows(params, report(none, speed="Unknown!"), "rail fec")
    assert [c.status for c in down] == [SKIP, SKIP] and "no link speed" in down[0].observed


def test_fec_unreadable_says_so():
    params = lab_params()
    missing = rows(params, report(ethtool=False), "rail fec")
    assert [c.status for c in missing] == [WARN, WARN] and missing[0].observed == "ethtool unavailable"
    assert "install ethtool" in missing[0].remedy
    d = report()
    d["fec"] = {RAILS[0]: {"configured": [], "active": None, "error": "netlink error: Operation not supported"}}
    unsupported, absent = rows(params, d, "rail fec")
    # not read is not judged good: a WARN with the way to read it by hand
    assert unsupported.status == WARN and unsupported.observed == \
        "enp1s0f1np1: netlink error: Operation not supported: FEC not read, so not judged"
    assert absent.status == WARN and absent.observed == "enP2p1s0f1np1: no FEC mode reported: FEC not read, so not judged"
    assert "`sudo ethtool --show-fec enp1s0f1np1`" in unsupported.remedy


# --------------------------------------------------------------------------------- GID index

def both_rails(*at_first: tuple[int, str], at_second=((2, "10.77.2.11"), (3, "10.77.2.11"))) -> str:
    first = gid_rows("rocep1s0f1", "enp1s0f1np1", *at_first)
    second = gid_rows("roceP2p1s0f1", "enP2p1s0f1np1", *at_second)
    return first + "\n" + "\n".join(second.splitlines()[2:])


def test_the_gid_index_holds_the_rails_address_as_roce_v2():
    params = lab_params()
    ok = rows(params, report(gids=both_rails((2, "10.77.1.11"), (3, "10.77.1.11"))), "rail gid")
    assert [c.status for c in ok] == [PASS, PASS]
    assert ok[0].observed == "rocep1s0f1 GID 3: 10.77.1.11 (v2, enp1s0f1np1)" and ok[0].command == "show_gids rocep1s0f1"


def test_a_moved_gid_index_fails_naming_the_right_one():
    """The address came back at 4/5 (after a neighbour's restart): index 3 holds the v2 GID of
    nothing; the remedy names runtime.nccl_ib_gid_index: 5, and with it set the rail passes."""
    moved = report(gids=both_rails((4, "10.77.1.11"), (5, "10.77.1.11")))
    bad, good = rows(lab_params(), moved, "rail gid")
    assert bad.status == FAIL and bad.observed == "rocep1s0f1 GID 3: empty" and good.status == PASS
    assert "`runtime.nccl_ib_gid_index: 5`" in bad.remedy
    assert rows(lab_params(nccl_ib_gid_index=5), moved, "rail gid")[0].status == PASS
    # index 3 holding the address as RoCE v1 is wrong too
    v1 = report(gids=both_rails((3, "10.77.1.11", "v1"), (4, "10.77.1.11", "v2")))
    wrong = rows(lab_params(), v1, "rail gid")[0]
    assert wrong.status == FAIL and wrong.observed == "rocep1s0f1 GID 3: 10.77.1.11 (v1, enp1s0f1np1)"
    assert "`runtime.nccl_ib_gid_index: 4`" in wrong.remedy


def with_env(params, **env):
    return params.model_copy(update={"serving": params.serving.model_copy(
        update={"env": {**params.serving.env, **env}})})


def test_the_gid_index_judged_is_the_one_nccl_gets():
    """serving.env's NCCL_IB_GID_INDEX goes after the fabric binding in the serving containers'
    environment, so NCCL uses it, not runtime.nccl_ib_gid_index: that index is judged, every
    container gets it, and the remedy names the setting to change. Owners pin it in their env
    files and see it go stale (github.com/tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark/pull/40:
    the GID moved from 3 to 4, NCCL failed on one HCA with ibv_modify_qp err 61; an empty value reads as 0)."""
    from sparkbook.serving.commands import container_env
    from sparkbook.serving.containers import fabric_env
    moved = report(gids=both_rails((4, "10.77.1.11"), (5, "10.77.1.11"),
                                   at_second=((4, "10.77.2.11"), (5, "10.77.2.11"))))
    stale = with_env(lab_params(nccl_ib_gid_index=5), NCCL_IB_GID_INDEX="3")  # runtime right, env wins
    node = stale.nodes[0]
    assert container_env(stale, node)["NCCL_IB_GID_INDEX"] == fabric_env(stale, node)["NCCL_IB_GID_INDEX"] == "3"
    bad = rows(stale, moved, "rail gid")[0]
    assert bad.status == FAIL and bad.observed == "rocep1s0f1 GID 3: empty"
    assert bad.expected == "rocep1s0f1 GID 3: 10.77.1.11 (v2), from serving.env.NCCL_IB_GID_INDEX"
    assert '`serving.env.NCCL_IB_GID_INDEX: "5"`' in bad.remedy
    fixed = with_env(lab_params(), NCCL_IB_GID_INDEX="5")  # runtime says 3, NCCL gets 5
    assert [c.status for c in rows(fixed, moved, "rail gid")] == [PASS, PASS]
    assert fabric_env(fixed, fixed.nodes[0])["NCCL_IB_GID_INDEX"] == "5"
    empty = rows(with_env(lab_params(), NCCL_IB_GID_INDEX=""), moved, "rail gid")[0]
    assert empty.status == FAIL and empty.observed == "NCCL_IB_GID_INDEX='' (serving.env.NCCL_IB_GID_INDEX)"
    assert "set `serving.env.NCCL_IB_GID_INDEX` to that index" in empty.remedy


def test_no_gid_for_the_address_or_no_table():
    params = lab_params()
    other = rows(params, report(gids=both_rails((2, "10.9.9.9"), (3, "10.9.9.9"))), "rail gid")[0]
    assert other.status == FAIL and "no RoCE v2 GID of rocep1s0f1 holds 10.77.1.11" in other.remedy
    assert "assign 10.77.1.11/24 to enp1s0f1np1" in other.remedy
    absent = rows(params, report(gids=gid_rows("mlx5_0", "eth0", (3, "10.77.1.11"))), "rail gid")[0]
    assert absent.status == FAIL and absent.observed == "no GID table for rocep1s0f1"
    unavailable = rows(params, report(), "rail gid")
    assert [c.status for c in unavailable] == [WARN, WARN] and "mlnx-tools" in unavailable[0].remedy
    # rails without an HCA have no GID row
    data = yaml.safe_load(LAB.read_text())
    for node in data["nodes"]:
        for rail in node["rails"]:
            rail.pop("hca")
    assert rows(validate(data), report(), "rail gid") == []


def test_an_address_on_one_twin_only_is_named_with_the_fabric_remedy():
    params = lab_params()
    first, second = params.nodes[0].rails
    d = report()

    def addressed(*rails):  # `ip -j addr` as the bundle reads it: the twins up at MTU 9000, these addressed
        d["links"] = {r: {"ifname": r, "mtu": 9000, "addr_info": [
            {"family": "inet", "local": str(x.ip), "prefixlen": x.prefix} for x in rails if x.interface == r]}
            for r in RAILS}
        return {c.observed.split(":")[0]: c for c in rows(params, d, "rail address")}

    one = addressed(first)
    assert one[first.interface].status == PASS
    half = one[second.interface]
    assert half.status == FAIL and f"an address on one twin only ({first.interface} has its own)" in half.observed
    assert "sparkbook fabric apply" in half.remedy and f"{second.ip}/{second.prefix}" in half.remedy
    neither = addressed()[second.interface]  # nothing anywhere: a plain missing address, not a half fabric
    assert neither.status == FAIL and "twin" not in neither.observed and "(netplan)" in neither.remedy
    assert {c.status for c in addressed(first, second).values()} == {PASS}


# -------------------------------------------------------------- the lab's tools, real parsers

def simulated(tool, args, state, monkeypatch, links=None, addrs=None) -> str:
    monkeypatch.setattr(simhw, "links", lambda: links or {})
    monkeypatch.setattr(simhw, "addresses", lambda: addrs or {})
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = tool(args, state)
    assert rc == 0
    return out.getvalue()


def lab_state() -> dict:
    nics = [("rocep1s0f0", "enp1s0f0np0"), ("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f0", "enP2p1s0f0np0"),
            ("roceP2p1s0f1", "enP2p1s0f1np1")]
    return {"node": "spark-1", "firmware": "28.45.4028", "speed_mbps": 200000,
            "nics": [{"hca": h, "netdev": n, "bus": "0000:01:00.0", "guid": f"30c5:9903:0001:6a1{k}"}
                     for k, (h, n) in enumerate(nics)]}


UP = {"flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "mtu": 9000, "address": "6c:b3:11:88:55:b5"}


def test_simulated_show_fec_is_what_the_parser_reads(monkeypatch):
    state, links = lab_state(), {r: UP for r in RAILS}
    healthy = parse_ethtool_fec(simulated(simhw.ethtool, ["--show-fec", RAILS[0]], state, monkeypatch, links))
    assert healthy == {RAILS[0]: {"configured": ["Auto"], "active": "RS", "error": None}}
    state["fec"] = {RAILS[0]: "None"}  # what the lab's `fec` fault writes
    faulty = parse_ethtool_fec(simulated(simhw.ethtool, ["--show-fec", RAILS[0]], state, monkeypatch, links))
    assert faulty[RAILS[0]]["active"] == "None"
    # the same lines as the real Spark's, but for the interface's name
    assert simulated(simhw.ethtool, ["--show-fec", "enp1s0f0np0"], state, monkeypatch,
                     {"enp1s0f0np0": UP}) == fixture("ethtool-show-fec-spark-rs-set-1.txt").replace(
                         "encodings: RS", "encodings: Auto")


def test_simulated_show_gids_puts_the_rails_address_at_index_3(monkeypatch):
    addrs = {"enp1s0f1np1": ["10.77.1.11"], "enP2p1s0f1np1": ["10.77.2.11"]}
    out = simulated(simhw.show_gids, [], lab_state(), monkeypatch, {r: UP for r in RAILS}, addrs)
    assert out.splitlines()[0] == "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV"
    gids = parse_show_gids(out)
    assert [(g["index"], g["ipv4"], g["version"]) for g in gids["rocep1s0f1"]] == [
        (0, None, "v1"), (1, None, "v2"), (2, "10.77.1.11", "v1"), (3, "10.77.1.11", "v2")]
    assert gids["rocep1s0f1"][0]["gid"] == "fe80:0000:0000:0000:6eb3:11ff:fe88:55b5"  # EUI-64 of the MAC
    assert len(gids["rocep1s0f0"]) == 2 and out.rstrip().endswith("n_gids_found=12")
    one = parse_show_gids(simulated(simhw.show_gids, ["roceP2p1s0f1"], lab_state(), monkeypatch, addrs=addrs))
    assert list(one) == ["roceP2p1s0f1"] and one["roceP2p1s0f1"][3]["ipv4"] == "10.77.2.11"
    d = report(gids=out)
    assert [c.status for c in rows(lab_params(), d, "rail gid")] == [PASS, PASS]


# ---------------------------------------------------------------------------------- on the lab

FABRIC = {"fabric layout", "rail map", "rail port", "rail rate", "rail fec", "rail mtu", "rail address",
          "rail gid", "path mtu"}


def fabric_rows(params):
    """The fabric's rows of 01 on the lab, and any other row that fails."""
    pf = preflight.gather(params, Cluster.from_params(params))
    return [c for c in preflight.checks(params, pf) if c.check in FABRIC or c.status == FAIL]


def test_fec_fault_caught_with_the_remedy_then_healed(lab, params):
    """`sparkbook lab fault fec` on spark-2: its rails' simulated FEC None and the rails slowed;
    01 fails `rail fec` on spark-2 (both rails, the remedy rendered) and nothing else; healed, the
    rows pass naming RS."""
    for node in lab.nodes():  # a lab brought up before simhw.py learnt --show-fec: its copy refreshed
        fresh = node.dir / "bin" / ".simhw.py.test"
        shutil.copyfile(simhw.__file__, fresh)
        fresh.chmod(0o755)
        fresh.replace(node.dir / "bin" / "simhw.py")
    before = {(c.check, c.node, c.observed.split(":")[0]): c.status for c in fabric_rows(params)}
    assert not [k for k, s in before.items() if s == FAIL], before
    faults.apply(lab, "fec", "spark-2")
    try:
        state = json.loads((lab.nodes()[1].dir / "state.json").read_text())
        assert state["fec"] == {r: "None" for r in RAILS}
        during = fabric_rows(params)
    finally:
        faults.heal(lab, "fec")
    failed = [c for c in during if c.status == FAIL]
    assert sorted((c.check, c.node, c.observed.split(":")[0]) for c in failed) == [
        ("rail fec", "spark-2", r) for r in sorted(RAILS)], failed
    for c in failed:
        where = c.observed.split(":")[0]
        assert f"`sudo ethtool --set-fec {where} encoding rs`" in c.remedy and "{" not in c.remedy
    # everything else on the fabric as before
    same = {(c.check, c.node, c.observed.split(":")[0]): c.status for c in during if c not in failed}
    assert {k: s for k, s in same.items() if k in before} == {k: before[k] for k in same if k in before}
    after = [c for c in fabric_rows(params) if c.check == "rail fec"]
    assert [(c.node, c.status) for c in after] == [("spark-1", PASS)] * 2 + [("spark-2", PASS)] * 2
    assert all("active RS" in c.observed for c in after)
    assert "fec" not in json.loads((lab.nodes()[1].dir / "state.json").read_text())
